"""Lending the free part of a node that runs GPU pods (a policy's minFreeGpus).

The serving pods stay; Slurm gets what they leave (the GPUs no pod holds,
and cpu and memory less what the pods request); the clock of the free GPUs
is a fact of the node, on the Node; a pending pod that needs the lent GPUs
takes the node back as for a whole node.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from slurmk8s.bridge import actions as A
from slurmk8s.bridge.nodestate import (
    COMPONENT_LABEL,
    FREE_GPUS_ANNOTATION,
    FREE_SINCE_ANNOTATION,
    LENT,
    SLURMD_COMPONENT,
    format_time,
)
from slurmk8s.bridge.observed import KubePod, pod_from_api, requested
from slurmk8s.bridge.patches import node_patch
from slurmk8s.render.lent import lent_node
from slurmk8s.render.manifests import lent_slurmd_pod
from slurmk8s.render.names import lent_slurmd

from .lending_sim import ALLOCATABLE, GPU_LABELS, T0, World, cluster, gpu_node, gpu_pod, policy, slurm_node
from .test_decide import held_node, kinds, of, only

SHARED = policy(minFreeGpus=4)
WHOLE = policy()
GiB = 2**30


def serving(name: str, node: str, gpus: int, cpu_millis: int = 4000, memory: int = 32 * GiB) -> KubePod:
    return gpu_pod(name, node, gpus=gpus, cpu_millis=cpu_millis, memory=memory, owner_kind="ReplicaSet")


def free_since(at, gpus: int) -> dict:
    return {FREE_SINCE_ANNOTATION: format_time(at, millis=True), FREE_GPUS_ANNOTATION: str(gpus)}


def test_a_policy_without_min_free_gpus_neither_lends_a_node_with_a_gpu_pod_nor_records_its_free_gpus():
    w = World.of(nodes=[gpu_node("n1")], pods=[serving("serve", "n1", gpus=2)])
    for minutes in (0, 10, 60):
        assert kinds(w.decide(WHOLE, T0 + timedelta(minutes=minutes))) == []


def test_the_free_gpus_of_a_serving_node_are_lent_with_what_its_pods_leave_and_its_pods_stay():
    pods = [serving("serve", "n1", gpus=2, cpu_millis=4500, memory=40 * GiB)]
    w = World.of(nodes=[gpu_node("n1")], pods=pods)
    # First seen: the clock starts (6 free), nothing is lent yet.
    first = w.decide(SHARED, T0)
    assert only(first, A.RecordFreeSince) == A.RecordFreeSince("n1", T0, 6)
    assert of(first, A.CreateSlurmdPod) == []
    w.apply([only(first, A.RecordFreeSince)])
    assert kinds(w.decide(SHARED, T0 + timedelta(seconds=SHARED.spec.idle_after_seconds))) == []
    now = T0 + timedelta(seconds=SHARED.spec.idle_after_seconds, milliseconds=1)
    acts = w.decide(SHARED, now)
    assert kinds(acts) == ["SetLendingState", "Taint", "CreateSlurmdPod"]
    create = only(acts, A.CreateSlurmdPod)
    lent = dict(create.resources)
    # allocatable less the serving pod's requests, in the units the renderer reads
    assert lent == {"cpu": f"{32000 - 4500}m", "memory": str(256 * GiB - 40 * GiB), "nvidia.com/gpu": "6"}
    desc = lent_node("demo", "n1", lent, GPU_LABELS, "gpu")
    assert (desc.cpus, desc.memory_mib, desc.gpus) == (27, (256 - 40) * 1024, 6)
    pod = lent_slurmd_pod(cluster(), "", node="n1", resources=lent, labels=GPU_LABELS, partition="gpu",
                          shm_size="1Gi", taint_key="t")
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert (limits["nvidia.com/gpu"], limits["memory"]) == ("6", f"{(256 - 40) * 1024}Mi")
    assert "6 NVIDIA-H100-80GB GPU(s)" in next(e.message for e in of(acts, A.Event) if e.reason == "Lending")
    # Nothing touches the serving pod: no action names it.
    assert not any(getattr(a, "name", None) == "serve" for a in acts)


def test_a_node_with_fewer_free_gpus_than_the_policy_wants_is_not_lent_until_enough_are_free():
    w = World.of(nodes=[gpu_node("n1", annotations=free_since(T0 - timedelta(hours=1), 2))],
                 pods=[serving("a", "n1", gpus=4), serving("b", "n1", gpus=2)])
    assert kinds(w.decide(SHARED, T0)) == []  # 2 free for an hour: too few
    del w.pods[("apps", "b")]
    # 4 free now, but only 2 were free all along: the clock of 4 starts now.
    assert only(w.decide(SHARED, T0), A.RecordFreeSince) == A.RecordFreeSince("n1", T0, 4)


def test_fewer_free_gpus_restart_the_clock_and_none_clear_it_whichever_policy_decides():
    w = World.of(nodes=[gpu_node("n1", annotations=free_since(T0 - timedelta(hours=1), 6))],
                 pods=[serving("a", "n1", gpus=2), serving("b", "n1", gpus=3)])
    for pol in (SHARED, WHOLE):
        assert only(w.decide(pol, T0), A.RecordFreeSince) == A.RecordFreeSince("n1", T0, 3)
    w.pods[("apps", "c")] = serving("c", "n1", gpus=3)
    assert only(w.decide(WHOLE, T0), A.ClearFreeSince) == A.ClearFreeSince("n1")
    patch = node_patch(A.ClearFreeSince("n1"), w.nodes["n1"])
    assert patch == {"metadata": {"annotations": {FREE_SINCE_ANNOTATION: None, FREE_GPUS_ANNOTATION: None}}}


def test_more_free_gpus_keep_the_clock_of_the_fewer():
    since = T0 - timedelta(hours=1)
    w = World.of(nodes=[gpu_node("n1", annotations=free_since(since, 4))], pods=[serving("a", "n1", gpus=2)])
    acts = w.decide(SHARED, T0)
    assert of(acts, A.RecordFreeSince) == [] and of(acts, A.ClearFreeSince) == []
    assert dict(only(acts, A.CreateSlurmdPod).resources)["nvidia.com/gpu"] == "6"  # all that is free


def partly_lent(pending: KubePod | None = None) -> World:
    """n1 runs a 2-GPU serving pod and lends its other 6 GPUs."""
    pods = [serving("serve", "n1", gpus=2),
            KubePod("hpc", lent_slurmd("demo", "n1"), node="n1", phase="Running", gpus=6, memory=256 * 2**20,
                    labels={COMPONENT_LABEL: SLURMD_COMPONENT})]
    if pending is not None:
        pods.append(pending)
    return World.of(nodes=[held_node("n1", LENT)], pods=pods, snodes=[slurm_node("n1")])


def test_a_partly_lent_node_stays_lent_beside_its_serving_pod():
    assert of(partly_lent().decide(SHARED, T0), A.SetLendingState) == []


@pytest.mark.parametrize("gpus,reclaimed", [(6, True), (7, False)])
def test_a_pending_pod_takes_a_partly_lent_node_back_only_if_it_fits_in_what_the_lent_pod_frees(gpus, reclaimed):
    w = partly_lent(gpu_pod("want", None, gpus=gpus))
    states = [(a.node, a.reason) for a in of(w.decide(SHARED, T0), A.SetLendingState)]
    assert states == ([("n1", "demand")] if reclaimed else [])


def test_a_whole_node_lends_its_cpu_and_memory_less_what_its_cpu_pods_request():
    w = World.of(nodes=[gpu_node("n1", annotations={"slurmk8s.dev/idle-since": format_time(T0 - timedelta(hours=1))})],
                 pods=[KubePod("apps", "web", node="n1", phase="Running", cpu_millis=1500, memory=GiB),
                       KubePod("kube-system", "exporter", node="n1", phase="Running", cpu_millis=100,
                               memory=GiB // 8, owner_kind="DaemonSet"),
                       KubePod("apps", "done", node="n1", phase="Succeeded", cpu_millis=16000)])
    lent = dict(only(w.decide(WHOLE, T0), A.CreateSlurmdPod).resources)
    assert lent == {"cpu": f"{32000 - 1600}m", "memory": str(256 * GiB - GiB - GiB // 8), "nvidia.com/gpu": "8"}
    assert lent_node("demo", "n1", lent, GPU_LABELS, "gpu").cpus == 30


def test_a_node_whose_pods_leave_less_than_a_cpu_is_not_lent_and_says_why():
    w = World.of(nodes=[gpu_node("n1", annotations=free_since(T0 - timedelta(hours=1), 6))],
                 pods=[serving("serve", "n1", gpus=2, cpu_millis=31500)])
    acts = w.decide(SHARED, T0)
    assert of(acts, A.CreateSlurmdPod) == []
    status = only(acts, A.PolicyStatus).status
    ready = next(c for c in status.conditions if c.type == "Ready")
    assert "cpu '500m' left for Slurm" in ready.message and "less than one whole unit" in ready.message, ready


def test_what_a_pod_requests_is_counted_as_the_scheduler_counts_it():
    spec = {"containers": [{"resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
                           {"resources": {"limits": {"cpu": "2", "memory": "2Gi"}}},   # limits stand for requests
                           {}],
            "initContainers": [{"resources": {"requests": {"cpu": "4"}}}],          # the larger of the two
            "overhead": {"cpu": "250m", "memory": "128Mi"}}
    assert requested(spec, "cpu", 1000) == 4000 + 250
    assert requested(spec, "memory") == 3 * GiB + 128 * 2**20
    pod = pod_from_api({"metadata": {"name": "p"}, "spec": {"nodeName": "n1", **spec}})
    assert (pod.cpu_millis, pod.memory) == (4250, 3 * GiB + 128 * 2**20)
    assert requested({"containers": [{"resources": {"requests": {"cpu": "lots"}}}]}, "cpu", 1000) == 0


def test_allocatable_is_what_an_empty_node_lends():
    w = World.of(nodes=[gpu_node("n1", annotations=free_since(T0 - timedelta(hours=1), 8))])
    assert dict(only(w.decide(SHARED, T0), A.CreateSlurmdPod).resources) == {
        "cpu": "32000m", "memory": str(256 * GiB), "nvidia.com/gpu": ALLOCATABLE["nvidia.com/gpu"]}
