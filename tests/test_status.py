"""SlurmCluster status from observed state (slurmk8s.operator.status), without I/O."""

from __future__ import annotations

import copy

import jsonschema
import pytest
import yaml

from slurmk8s.api import load_cluster
from slurmk8s.api.cluster import SlurmClusterStatus
from slurmk8s.operator.status import COMPONENTS, compute, invalid, node_counts, refused_pods, short_of_pods
from slurmk8s.slurm.model import Node

from .conftest import ROOT

NOW, LATER = "2026-11-21T10:00:00Z", "2026-11-21T10:05:00Z"


def node(name, state="idle", flags=(), reason=""):
    return Node(name=name, state=state, flags=frozenset({"DYNAMIC_NORM", *flags}), reason=reason, features=(),
                partitions=(), cpus=2, alloc_cpus=0, gres="", address="")


def workload(kind, name, replicas, ready=None):
    ready = replicas if ready is None else ready
    field = "readyReplicas" if kind == "StatefulSet" else "availableReplicas"
    return {"kind": kind, "metadata": {"name": name}, "spec": {"replicas": replicas}, "status": {field: ready}}


@pytest.fixture
def cluster(doc):
    doc = copy.deepcopy(doc)
    doc["metadata"]["generation"] = 4
    # The Slurm daemons' conditions; AccountingReady has its tests in tests/test_accounting.py.
    doc["spec"].pop("accounting")
    return load_cluster(doc)


def healthy():
    return [workload("StatefulSet", "demo-controller", 1), workload("StatefulSet", "demo-cpu", 1),
            workload("StatefulSet", "demo-gpu", 2), workload("Deployment", "demo-login", 1)]


NODES = [node("demo-cpu-0"), node("demo-gpu-0", "mixed"), node("demo-gpu-1", "allocated")]


def conds(st: SlurmClusterStatus) -> dict:
    return {c.type: (c.status, c.reason) for c in st.conditions}


def test_a_healthy_cluster_is_ready_with_counts_and_the_applied_hash(cluster):
    st = compute(cluster, None, observed=healthy(), nodes=NODES, applied_hash="abc", rendered_hash="abc", now=NOW)
    assert st.phase == "Ready"
    assert conds(st) == {"Ready": ("True", "Ready"), "ControllerReady": ("True", "Running"),
                         "WorkersReady": ("True", "Running"), "LoginReady": ("True", "Running"),
                         "RestApiReady": ("True", "Disabled"), "AccountingReady": ("True", "Disabled")}
    assert [c.type for c in st.conditions] == ["Ready", *COMPONENTS]
    assert all(c.observed_generation == 4 and c.last_transition_time == NOW for c in st.conditions)
    assert st.observed_generation == 4 and st.config_hash == "abc"
    assert st.node_counts.model_dump() == {"total": 3, "idle": 1, "mixed": 1, "allocated": 1, "drain": 0,
                                           "down": 0, "other": 0}


def test_phases_follow_the_cluster_through_its_life(cluster):
    args = dict(nodes=NODES, applied_hash="h", rendered_hash="h")
    pending = compute(cluster, None, observed=[], now=NOW, **args)
    assert pending.phase == "Pending" and conds(pending)["ControllerReady"] == ("False", "NotCreated")
    starting = [workload("StatefulSet", "demo-controller", 1, ready=0)]
    prov = compute(cluster, pending, observed=starting, now=NOW, **args)
    assert prov.phase == "Provisioning" and conds(prov)["Ready"] == ("False", "ControllerNotReady")
    ready = compute(cluster, prov, observed=healthy(), now=LATER, **args)
    assert ready.phase == "Ready"
    broken = healthy()
    broken[2]["status"]["readyReplicas"] = 1
    degraded = compute(cluster, ready, observed=broken, now=LATER, **args)
    assert degraded.phase == "Degraded"
    assert conds(degraded)["WorkersReady"] == ("False", "NodesNotReady")
    assert "node set gpu: 1/2 pods ready" in next(c.message for c in degraded.conditions if c.type == "WorkersReady")
    assert compute(cluster, degraded, observed=broken, now=LATER, **args).phase == "Degraded"
    deleting = compute(cluster, ready, observed=healthy(), now=LATER, deleting=True, **args)
    assert deleting.phase == "Deleting" and conds(deleting)["Ready"] == ("False", "Deleting")


def test_transition_times_move_only_when_a_status_changes(cluster):
    args = dict(nodes=NODES, applied_hash="h", rendered_hash="h")
    first = compute(cluster, None, observed=healthy(), now=NOW, **args)
    same = compute(cluster, first, observed=healthy(), now=LATER, **args)
    assert [c.last_transition_time for c in same.conditions] == [NOW] * 6
    broken = healthy()[:-1]  # the login Deployment is gone
    changed = compute(cluster, same, observed=broken, now=LATER, **args)
    times = {c.type: c.last_transition_time for c in changed.conditions}
    assert times == {"Ready": LATER, "LoginReady": LATER, "ControllerReady": NOW, "WorkersReady": NOW,
                     "RestApiReady": NOW, "AccountingReady": NOW}
    assert {c.type for c in changed.conditions if c.status != {s.type: s.status for s in same.conditions}[c.type]} \
        == {"Ready", "LoginReady"}


def test_slurm_nodes_must_register_not_just_pods_run(cluster):
    st = compute(cluster, None, observed=healthy(), nodes=NODES[:2], applied_hash="h", rendered_hash="h", now=NOW)
    workers = next(c for c in st.conditions if c.type == "WorkersReady")
    assert (workers.status, workers.reason) == ("False", "NodesNotReady")
    assert "node set gpu: 1/2 Slurm nodes registered and responding" in workers.message
    down = [NODES[0], NODES[1], node("demo-gpu-1", "down", ("NOT_RESPONDING",))]
    st = compute(cluster, None, observed=healthy(), nodes=down, applied_hash="h", rendered_hash="h", now=NOW)
    assert conds(st)["WorkersReady"][0] == "False" and st.node_counts.down == 1


def test_an_unreachable_agent_keeps_the_last_counts_and_says_so(cluster):
    ready = compute(cluster, None, observed=healthy(), nodes=NODES, applied_hash="h", rendered_hash="h", now=NOW)
    st = compute(cluster, ready, observed=healthy(), nodes=None, applied_hash="h", rendered_hash="h", now=LATER)
    assert conds(st)["ControllerReady"] == ("False", "AgentUnreachable")
    assert conds(st)["WorkersReady"] == ("Unknown", "SlurmUnknown")
    assert st.node_counts == ready.node_counts and st.phase == "Degraded"


def test_a_pending_config_and_failures_keep_the_cluster_from_ready(cluster):
    st = compute(cluster, None, observed=healthy(), nodes=NODES, applied_hash="old", rendered_hash="new",
                 waiting=["the config changed; waiting for the kubelet"], now=NOW)
    ready = next(c for c in st.conditions if c.type == "Ready")
    assert (ready.status, ready.reason) == ("False", "ConfigPending") and "kubelet" in ready.message
    assert st.config_hash == "old"
    st = compute(cluster, None, observed=healthy(), nodes=NODES, applied_hash="h", rendered_hash="h",
                 problems=["StatefulSet demo-controller: spec.volumeClaimTemplates is immutable"], now=NOW)
    assert conds(st)["Ready"] == ("False", "ReconcileFailed")


def test_scale_in_in_progress_is_noted_but_not_a_failure(cluster):
    observed = healthy()
    observed[2]["spec"]["replicas"] = 3
    st = compute(cluster, None, observed=observed, nodes=NODES, applied_hash="h", rendered_hash="h", now=NOW)
    workers = next(c for c in st.conditions if c.type == "WorkersReady")
    assert workers.status == "True" and "scaling in from 3 to 2" in workers.message


def test_optional_components(doc):
    doc = copy.deepcopy(doc)
    doc["spec"]["login"]["replicas"] = 0
    doc["spec"]["restApi"] = {"enabled": True, "replicas": 2}
    doc["spec"]["nodeSets"], doc["spec"]["partitions"] = [], []
    c = load_cluster(doc)
    observed = [workload("StatefulSet", "demo-controller", 1), workload("Deployment", "demo-restapi", 2, ready=1)]
    st = compute(c, None, observed=observed, nodes=[], applied_hash="h", rendered_hash="h", now=NOW)
    assert conds(st)["LoginReady"] == ("True", "NoReplicas")
    assert conds(st)["WorkersReady"] == ("True", "NoNodeSets")
    assert conds(st)["RestApiReady"] == ("False", "NotReady")
    assert conds(st)["Ready"] == ("False", "RestApiNotReady")


def test_an_invalid_spec_fails_without_forgetting_the_rest(cluster):
    ready = compute(cluster, None, observed=healthy(), nodes=NODES, applied_hash="h", rendered_hash="h", now=NOW)
    st = invalid(ready, "SlurmCluster 'demo' is invalid (1 problem):\n  spec.x: bad", 5, LATER)
    assert st.phase == "Failed" and st.observed_generation == 5 and st.config_hash == "h"
    assert conds(st)["Ready"] == ("False", "InvalidSpec")
    assert conds(st)["ControllerReady"] == ("True", "Running")
    assert st.node_counts == ready.node_counts


def test_node_counts_by_bucket():
    nodes = [node("a"), node("b", "idle", ("DRAIN",)), node("c", "down"), node("d", "future"),
             node("e", "mixed", ("NOT_RESPONDING",))]
    assert node_counts(nodes).model_dump() == {"total": 5, "idle": 1, "mixed": 0, "allocated": 0, "drain": 1,
                                               "down": 2, "other": 1}


def test_the_status_validates_against_the_generated_crd(cluster):
    crd = yaml.safe_load((ROOT / "charts/slurmk8s/files/crds/slurmclusters.slurmk8s.dev.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    st = compute(cluster, None, observed=healthy(), nodes=NODES, applied_hash="h", rendered_hash="h", now=NOW)
    jsonschema.validate(st.dump(), schema)
    jsonschema.validate(invalid(st, "x", 1, NOW).dump(), schema)


def _pod(name, image, reason, message):
    return {"kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "slurmd", "image": image}]},
            "status": {"containerStatuses": [{"name": "slurmd", "image": image,
                                              "state": {"waiting": {"reason": reason, "message": message}}}]}}


def test_ready_names_the_image_a_pod_cannot_pull_with_the_registrys_answer(cluster):
    image = "registry.example.org:5000/slurmk8s/slurmd:26.05"
    answer = f'Failed to pull image "{image}": 401 Unauthorized: UNAUTHORIZED: authentication required'
    pods = [_pod("demo-gpu-1", image, "ImagePullBackOff", answer),
            _pod("demo-gpu-0", image, "ContainerCreating", "")]  # merely starting: not a failure
    workloads = [*healthy()[:2], workload("StatefulSet", "demo-gpu", 2, ready=1), healthy()[3]]
    st = compute(cluster, None, observed=workloads, nodes=NODES, applied_hash="abc", rendered_hash="abc",
                 now=NOW, pods=pods)
    ready = next(c for c in st.conditions if c.type == "Ready")
    assert (ready.status, ready.reason) == ("False", "ImagePullFailed")
    assert ready.message.startswith(f"pod demo-gpu-1 cannot pull image {image} (ImagePullBackOff): {answer}")
    assert "demo-gpu-0" not in ready.message.split(";")[0]
    assert "WorkersReady: node set gpu: 1/2 pods ready" in ready.message
    # Once it pulls, the reason is gone.
    fine = compute(cluster, None, observed=healthy(), nodes=NODES, applied_hash="abc", rendered_hash="abc",
                   now=NOW, pods=[_pod("demo-gpu-1", image, "ContainerCreating", "")])
    assert fine.phase == "Ready"


def _owned(name, kind, owner):
    return {"kind": "Pod", "metadata": {"name": name, "ownerReferences": [{"kind": kind, "name": owner}]}}


def _failed_create(kind, name, message, at):
    return {"kind": "Event", "reason": "FailedCreate", "type": "Warning", "message": message, "lastTimestamp": at,
            "involvedObject": {"kind": kind, "name": name}}


def test_ready_says_why_a_workload_cannot_create_its_pods_in_the_apis_words(cluster):
    pods = [_owned("demo-controller-0", "StatefulSet", "demo-controller"), _owned("demo-cpu-0", "StatefulSet", "demo-cpu"),
            _owned("demo-gpu-0", "StatefulSet", "demo-gpu")]
    short = short_of_pods(healthy(), pods)
    assert short == [("ReplicaSet", "demo-login-"), ("StatefulSet", "demo-gpu")]
    psa = 'pods "demo-gpu-1" is forbidden: violates PodSecurity "baseline:latest": privileged (...)'
    quota = 'pods "demo-login-7d-x2k" is forbidden: exceeded quota: team, requested: limits.cpu=2, ...'
    events = [_failed_create("StatefulSet", "demo-gpu", "create Pod demo-gpu-1 in StatefulSet demo-gpu failed "
                             f"error: {psa}", LATER),
              _failed_create("StatefulSet", "demo-gpu", "an older refusal", NOW),
              _failed_create("ReplicaSet", "demo-login-7d", f"Error creating: {quota}", NOW),
              _failed_create("StatefulSet", "demo-cpu", "demo-cpu has its pod: not reported", NOW)]
    refused = refused_pods(short, events)
    assert refused == [f"Deployment demo-login cannot create its pods: Error creating: {quota}",
                       f"StatefulSet demo-gpu cannot create its pods: create Pod demo-gpu-1 in StatefulSet demo-gpu "
                       f"failed error: {psa}"]
    workloads = [*healthy()[:2], workload("StatefulSet", "demo-gpu", 2, ready=1), workload("Deployment", "demo-login", 1, 0)]
    st = compute(cluster, None, observed=workloads, nodes=NODES, applied_hash="abc", rendered_hash="abc", now=NOW,
                 refused=refused)
    ready = next(c for c in st.conditions if c.type == "Ready")
    assert (ready.status, ready.reason) == ("False", "PodsRefused")
    assert ready.message.startswith(refused[0]) and psa in ready.message
    assert short_of_pods(healthy(), [*pods, _owned("demo-gpu-1", "StatefulSet", "demo-gpu"),
                                     _owned("demo-login-7d-a", "ReplicaSet", "demo-login-7d")]) == []
