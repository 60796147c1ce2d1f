"""Rounds of the operator (slurmk8s.operator.round) against real Slurm through the real agent.

Over 500 lines because every case shares one real Slurm and agent per module, which is
slow to start.

Kubernetes is an in-memory stand-in (tests/fakekube.py) that plays the API
server and the StatefulSet controller; Slurm is Debian's slurmctld and a
dynamic slurmd in private namespaces, reached only through the agent and
RemoteSlurm, as in a cluster. Every round uses a new Operator: nothing is
carried in memory from one round to the next.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import threading
import time
from dataclasses import replace
from datetime import UTC, datetime
from http.server import ThreadingHTTPServer
from itertools import pairwise

import kopf
import pytest
import structlog

from slurmk8s import log, versions
from slurmk8s.api import load_cluster
from slurmk8s.api.secrets import SECRET_USE_LABEL
from slurmk8s.evacuation import held
from slurmk8s.events import Event
from slurmk8s.kube import ApiError
from slurmk8s.operator.handlers import HURRY_SECONDS, ROUND_BACKOFF_CAP, Handlers
from slurmk8s.operator.permissions import OPERATOR
from slurmk8s.operator.round import Operator, Outcome, RoundFailed
from slurmk8s.operator.teardown import PATIENCE as TEARDOWN_PATIENCE
from slurmk8s.permissions import grants
from slurmk8s.render import ClusterKeys, config_files, names, node_conf
from slurmk8s.slurm import RemoteSlurm, SlurmClient
from slurmk8s.slurm.agent import AgentServer
from slurmk8s.slurm.model import Job, Node, node_to_dict

from .conftest import labelled_user_secrets
from .fakekube import FakeKube, claim_name
from .jsonhttp import JsonHandler
from .realslurm import SlurmNamespace, missing_tools
from .tiers import needs


@pytest.fixture(scope="session")
def example_doc(host_example_doc):
    """This module's Slurm daemons are this host's packages (realslurm.py): the example on their release."""
    return host_example_doc


NODE = "demo-cpu-0"
T0 = 1_800_000_000.0


#: The StorageClass the site names for shared volumes (one that provisions ReadWriteMany).
SITE_CLASS = "nfs"


def cpu_only(example_doc) -> dict:
    doc = copy.deepcopy(example_doc)
    doc["metadata"].update(uid="c0ffee00-0000-4000-8000-000000000001", generation=1)
    for v in doc["spec"]["sharedStorage"]["volumes"]:
        v["storageClassName"] = SITE_CLASS
    doc["spec"]["nodeSets"] = [ns for ns in doc["spec"]["nodeSets"] if ns["name"] == "cpu"]
    doc["spec"]["partitions"] = [p for p in doc["spec"]["partitions"] if p["name"] == "cpu"]
    return doc


class World:
    """A SlurmCluster in the fake API server, the real Slurm behind its agent, and a clock."""

    def __init__(self, doc: dict, keys, agent_url: str | None, work=None):
        # The operator may do only what it declares, in the cluster's namespace (what the chart grants).
        self.kube = FakeKube(granted=grants(OPERATOR, [doc["metadata"]["namespace"]]))
        self.keys = keys
        self.agent_url = agent_url or "http://127.0.0.1:9"
        self.work = work
        self.now = T0
        self.events: list = []
        self.kube.add({**copy.deepcopy(doc), "status": {}})
        for secret in labelled_user_secrets(doc):  # the site's, for spec.login.users[].sshPublicKeysFrom
            self.kube.add(secret)

    @property
    def body(self) -> dict:
        return copy.deepcopy(self.kube.of_kind("SlurmCluster")["demo"])

    def spec(self, change) -> None:
        obj = self.kube.of_kind("SlurmCluster")["demo"]
        change(obj["spec"])
        obj["metadata"]["generation"] += 1

    def round(self, advance: float = 1.0) -> Outcome:
        """One round by a freshly started operator."""
        self.now += advance
        op = Operator(self.kube, agent=lambda c, token, pod: RemoteSlurm(self.agent_url, token, timeout=10),
                      clock=lambda: self.now, fresh_keys=lambda: self.keys)
        out = op.reconcile(self.body)
        self.events += out.events
        return out

    def kubelet_syncs_config(self) -> None:
        """What the kubelet does in the controller pod: the ConfigMap's files appear in /etc/slurm."""
        data = self.kube.of_kind("ConfigMap")["demo-slurm-config"]["data"]
        for name, text in data.items():
            (self.work / "conf" / name).write_text(text)

    def pod(self, name: str) -> dict | None:
        return self.kube.of_kind("Pod").get(name)

    def reasons(self) -> list[str]:
        return [e.reason for e in self.events]


# Without Slurm: the agent does not answer.


@pytest.fixture
def offline(example_doc, keys):
    return World(cpu_only(example_doc), keys, None)


def test_the_first_round_creates_everything_and_later_rounds_write_nothing(offline):
    w = offline
    out = w.round()
    created = {(k, n) for verb, k, n in w.kube.writes if verb in ("create", "apply")}
    assert ("StatefulSet", "demo-controller") in created and ("Secret", "demo-agent-token") in created
    assert out.status.phase == "Pending" and not out.problems
    w.kube.run_controllers()
    w.kube.writes.clear()
    out = w.round()
    assert [x for x in w.kube.writes if x[0] != "patch/status"] == []
    assert out.status.phase == "Provisioning"
    conds = {c.type: c.reason for c in out.status.conditions}
    assert conds["ControllerReady"] == "AgentUnreachable"
    w.kube.writes.clear()
    w.round()
    assert w.kube.writes == []  # nothing changed, not even the status


def test_the_leading_replica_names_itself_in_status(offline):
    w = offline
    for identity in ("slurmk8s-a_1", "slurmk8s-a_1", "slurmk8s-b_2"):
        w.kube.writes.clear()
        Operator(w.kube, agent=lambda c, t, p: RemoteSlurm(w.agent_url, t, timeout=2), clock=lambda: w.now,
                 fresh_keys=lambda: w.keys, identity=identity).reconcile(w.body)
        assert w.body["status"]["leader"] == identity
    # Without an election (one replica) the last leader's name stays.
    w.round()
    assert w.body["status"]["leader"] == "slurmk8s-b_2"


def test_rounds_read_key_secrets_by_name_and_never_list_secrets(offline, keys):
    w = offline
    w.round()
    w.kube.run_controllers()
    w.kube.requests.clear()
    out = w.round()
    assert not out.problems
    secrets = [r for r in w.kube.requests if r[2] == "secrets"]
    assert {r[0] for r in secrets} == {"get"}
    assert sorted(r for r in secrets) == sorted(
        ("get", "", "secrets", "default")
        for _ in ("munge", "jwt", "ssh host", "agent token", "db password", "researcher-ssh's label"))
    # And RBAC as the chart grants it would refuse a list, saying what to do.
    with pytest.raises(ApiError) as refused:
        w.kube.list("Secret", "default")
    assert refused.value.status == 403
    assert "list this one there" in str(refused.value) and "watchNamespaces" in str(refused.value)


def test_a_missing_key_secret_is_created_and_the_others_are_kept(offline, keys):
    w = offline
    w.round()
    before = {n: o["data"] for n, o in w.kube.of_kind("Secret").items()}
    del w.kube.objects[("Secret", "default", "demo-munge-key")]
    w.keys = type(keys).generate()
    w.kube.writes.clear()
    w.round()
    after = {n: o["data"] for n, o in w.kube.of_kind("Secret").items()}
    assert [x for x in w.kube.writes if x[1] == "Secret"] == [("create", "Secret", "demo-munge-key")]
    assert after["demo-munge-key"] != before["demo-munge-key"]
    assert {n: d for n, d in after.items() if n != "demo-munge-key"} == {
        n: d for n, d in before.items() if n != "demo-munge-key"}


def test_a_pre_planted_key_secret_is_refused_never_mounted_nor_overwritten(offline):
    """Issue 13, item 9: someone who may create Secrets in the namespace
    plants <cluster>-munge-key before the operator's first round. The
    operator does not adopt it: nothing is created that would mount it, the
    status and an Event say what to do, and the Secret is left as it is."""
    w = offline
    planted = {"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": "demo-munge-key", "namespace": "default",
                            "labels": {names.CLUSTER_LABEL: "demo",
                                       "app.kubernetes.io/managed-by": "slurmk8s-operator"}},
               "data": {"munge.key": base64.b64encode(b"k" * 1024).decode()}}
    w.kube.add(copy.deepcopy(planted))
    out = w.round()
    assert not [x for x in w.kube.writes if x[0] in ("create", "apply")], w.kube.writes
    assert w.kube.of_kind("Secret")["demo-munge-key"]["data"] == planted["data"]
    ready = next(c for c in out.status.conditions if c.type == "Ready")
    assert (ready.status, ready.reason) == ("False", "ForeignKeySecret")
    assert "kubectl -n default delete secret demo-munge-key" in ready.message
    assert "ForeignKeySecret" in w.reasons()
    # Deleted by a person who checked: the next round makes the cluster's own.
    del w.kube.objects[("Secret", "default", "demo-munge-key")]
    out = w.round()
    assert not out.problems
    assert w.kube.of_kind("Secret")["demo-munge-key"]["data"] != planted["data"]
    assert ("StatefulSet", "default", "demo-controller") in w.kube.objects


@pytest.mark.parametrize("change,why", [
    (lambda s: s["metadata"]["labels"].clear(), "is not labelled slurmk8s.dev/secret-use=ssh-keys"),
    (lambda s: s["metadata"]["labels"].update({SECRET_USE_LABEL: "database-password"}), "is not labelled"),
    (lambda s: s["metadata"]["labels"].update({names.CLUSTER_LABEL: "other"}), "was made by slurmk8s"),
    (lambda s: s.update(type="kubernetes.io/service-account-token"), "only Opaque"),
    (lambda s: s.update(data={"other": "eA=="}), "has no key"),
    (None, "does not exist"),
])
def test_a_secret_not_labelled_for_login_keys_is_refused_and_nothing_mounts_it(offline, change, why):
    """Issue 24, item 1: sshPublicKeysFrom named any Secret of the namespace
    (demo-munge-key included) and every login pod mounted it 0444. Only a
    Secret its owner labelled slurmk8s.dev/secret-use=ssh-keys is used now;
    any other refuses the round with a status and a Warning Event naming the
    field, and nothing is written."""
    w = offline
    key = ("Secret", "default", "researcher-ssh")
    if change is None:
        del w.kube.objects[key]
    else:
        change(w.kube.objects[key])
    out = w.round()
    assert not [x for x in w.kube.writes if x[1] != "SlurmCluster"], w.kube.writes  # its status alone
    assert ("Deployment", "default", "demo-login") not in w.kube.objects
    ready = next(c for c in out.status.conditions if c.type == "Ready")
    assert (ready.status, ready.reason) == ("False", "UnusableSecret")
    assert ready.message.startswith("spec.login.users[0].sshPublicKeysFrom") and why in ready.message
    assert [e for e in out.events if e.type == "Warning" and e.reason == "UnusableSecret"
            and "spec.login.users[0].sshPublicKeysFrom" in e.message]
    # Labelled by its owner: the next round mounts it, readable by root only.
    for secret in labelled_user_secrets(w.body):
        w.kube.objects[key] = secret
    out = w.round()
    assert not out.problems, out.problems
    login = w.kube.of_kind("Deployment")["demo-login"]["spec"]["template"]["spec"]
    volume = next(v for v in login["volumes"] if v["name"] == "user-keys")
    assert volume["projected"]["defaultMode"] == 0o400


def test_site_checks_run_only_from_a_configmap_labelled_for_them(offline):
    """Issue 41: spec.healthCheck.siteChecks mounted any ConfigMap of that name,
    optional, into every slurmd pod, lent ones included: whoever made it ran
    code there. The operator now reads it first: missing, or not labelled
    slurmk8s.dev/configmap-use=health-checks, the round is refused, naming the
    field, the ConfigMap and the label to add, and nothing is written; labelled,
    the workers mount it (not optional) and status.siteChecks tells the bridge."""
    w = offline
    w.spec(lambda spec: spec.setdefault("healthCheck", {}).update(siteChecks="site-health"))
    cm = {"apiVersion": "v1", "kind": "ConfigMap",
          "metadata": {"name": "site-health", "namespace": "default", "labels": {}},
          "data": {"10-nfs.sh": "exit 0"}}
    for present in (False, True):
        if present:
            w.kube.add(copy.deepcopy(cm))
        out = w.round()
        assert not [x for x in w.kube.writes if x[1] != "SlurmCluster"], w.kube.writes  # its status alone
        ready = next(c for c in out.status.conditions if c.type == "Ready")
        assert (ready.status, ready.reason) == ("False", "UnusableSecret")
        assert ready.message.startswith('spec.healthCheck.siteChecks: ConfigMap "site-health" ')
        assert "slurmk8s.dev/configmap-use=health-checks" in ready.message
        assert out.status.site_checks is None
        assert [e for e in out.events if e.reason == "UnusableSecret" and "site-health" in e.message]
    w.kube.objects[("ConfigMap", "default", "site-health")]["metadata"]["labels"] = {
        "slurmk8s.dev/configmap-use": "health-checks"}
    out = w.round()
    assert not out.problems, out.problems
    assert out.status.site_checks == "site-health"
    worker = w.kube.of_kind("StatefulSet")["demo-cpu"]["spec"]["template"]["spec"]
    assert {"name": "site-checks", "configMap": {"name": "site-health", "defaultMode": 0o444}} in worker["volumes"]


def test_a_key_secret_that_appears_between_reading_and_creating_stops_the_round(offline):
    """The 409 on creating a key Secret was swallowed, and the pods created in
    the same round mounted whatever was there. Now it is a problem of the
    round, and nothing after it is created."""
    w = offline
    real_get = w.kube.get
    w.kube.get = lambda kind, ns, name: None if (kind, name) == ("Secret", "demo-munge-key") else real_get(kind, ns, name)
    w.kube.add({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "demo-munge-key", "namespace": "default"},
                "data": {"munge.key": base64.b64encode(b"k" * 1024).decode()}})
    out = w.round()
    assert any("demo-munge-key" in p and "already exists" in p for p in out.problems), out.problems
    assert ("StatefulSet", "default", "demo-controller") not in w.kube.objects
    assert not [x for x in w.kube.writes if x[1] in ("StatefulSet", "Deployment")]


def test_a_workload_whose_pods_the_namespace_refuses_says_why_in_ready(offline):
    """A StatefulSet short of pods: its controller's FailedCreate Event (Pod
    Security, a quota) is read and named in Ready, in the API's words."""
    w = offline
    w.round()  # creates the workloads; no controller makes their pods
    why = ('create Pod demo-controller-0 in StatefulSet demo-controller failed error: pods "demo-controller-0" is '
           'forbidden: exceeded quota: team, requested: limits.cpu=2, used: limits.cpu=63, limited: limits.cpu=64')
    w.kube.add({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "demo-controller.1", "namespace": "default"},
                "reason": "FailedCreate", "type": "Warning", "message": why, "lastTimestamp": "2026-11-21T10:00:00Z",
                "involvedObject": {"kind": "StatefulSet", "name": "demo-controller", "namespace": "default"}})
    out = w.round()
    ready = next(c for c in out.status.conditions if c.type == "Ready")
    assert (ready.status, ready.reason) == ("False", "PodsRefused")
    assert ready.message.startswith(f"StatefulSet demo-controller cannot create its pods: {why}")
    assert ("list", "", "events") in {(v, g, r) for v, g, r, _ in w.kube.requests}


def test_every_request_of_a_round_and_a_teardown_is_declared(offline):
    w = offline
    w.spec(lambda s: s.update(restApi={"enabled": True}, deletionPolicy="Delete"))
    w.round()
    w.kube.run_controllers()
    w.spec(lambda s: s.update(restApi={"enabled": False}))
    w.round()
    op = Operator(w.kube, agent=lambda c, t, p: RemoteSlurm(w.agent_url, t, timeout=2), fresh_keys=lambda: w.keys)
    assert op.teardown(w.body, attempt=TEARDOWN_PATIENCE)[0]
    made = {(verb, group, resource) for verb, group, resource, _ in w.kube.requests}
    # FakeKube refuses anything undeclared; this checks the rounds got that far.
    assert {("list", "", "pods"), ("get", "", "secrets"), ("create", "", "secrets"), ("patch", "apps", "statefulsets"),
            ("delete", "apps", "deployments"), ("delete", "", "secrets"), ("delete", "", "persistentvolumeclaims"),
            ("patch", "slurmk8s.dev", "slurmclusters/status")} <= made


def test_keys_are_generated_once_and_read_back(offline, keys):
    w = offline
    w.round()
    secrets = {n: o["data"] for n, o in w.kube.of_kind("Secret").items()}
    w.keys = type(keys).generate()  # a restarted operator would generate different keys...
    w.kube.writes.clear()
    w.round()
    assert {n: o["data"] for n, o in w.kube.of_kind("Secret").items()} == secrets  # ...and not use them
    assert not [x for x in w.kube.writes if x[1] == "Secret"]


def test_an_invalid_spec_fails_the_status_and_changes_nothing_else(offline):
    w = offline
    w.round()
    w.kube.writes.clear()
    w.spec(lambda s: s["partitions"][0].update(name="cpu\nProlog=/x"))
    out = w.round()
    assert out.status.phase == "Failed"
    assert w.kube.writes == [("patch/status", "SlurmCluster", "demo")]
    assert "spec.partitions[0].name" in w.body["status"]["conditions"][0]["message"]
    assert w.reasons()[-1] == "InvalidSpec"


def test_a_shared_volume_that_names_no_class_is_refused_naming_it_unless_the_operator_has_a_default(offline):
    """Issue 43: a ReadWriteMany claim without a class stays Pending on a managed cluster
    (its default class is block storage). The operator refuses such a spec, naming the
    field, as its webhook does, unless it was given the site's class, which the claim gets."""
    from slurmk8s.operator.webhook import refusal

    w = offline
    w.spec(lambda s: s["sharedStorage"]["volumes"][0].pop("storageClassName"))
    out = w.round()
    assert out.status.phase == "Failed" and w.reasons()[-1] == "InvalidSpec"
    message = w.body["status"]["conditions"][0]["message"]
    assert "spec.sharedStorage.volumes[0].storageClassName: required for a claim the operator creates" in message
    assert "sharedStorage.storageClassName" in message
    assert not w.kube.of_kind("PersistentVolumeClaim")
    assert refusal("SlurmCluster", "CREATE", w.body, None) == message  # the webhook's words are the round's
    op = Operator(w.kube, agent=lambda c, token, pod: RemoteSlurm(w.agent_url, token, timeout=2),
                  clock=lambda: w.now + 1, fresh_keys=lambda: w.keys, shared_storage_class="efs-sc")
    out = op.reconcile(w.body)
    assert out.status.phase == "Pending" and not out.problems, out.problems
    assert w.kube.of_kind("PersistentVolumeClaim")["demo-shared"]["spec"]["storageClassName"] == "efs-sc"
    assert refusal("SlurmCluster", "CREATE", w.body, None, shared_storage_class="efs-sc") is None


def test_a_claim_that_stays_pending_is_named_in_ready_with_its_provisioners_words(offline):
    """Issue 43: the shared claim is Pending (its class is block storage, which refuses
    ReadWriteMany): StorageReady and Ready say so, with the provisioner's Event, until a
    claim that binds replaces it."""
    w = offline
    w.kube.pending.add("demo-shared")
    w.round()
    w.kube.run_controllers()
    claim = w.kube.of_kind("PersistentVolumeClaim")["demo-shared"]
    refused = ('failed to provision volume with StorageClass "nfs": rpc error: code = InvalidArgument desc = '
               "Volume capabilities MULTI_NODE_MULTI_WRITER not supported. Only AccessModes[ReadWriteOnce] supported.")
    for type_, reason, message, at in (
            ("Normal", "ExternalProvisioning", "Waiting for a volume to be created", "2026-01-01T00:00:02Z"),
            ("Warning", "ProvisioningFailed", refused, "2026-01-01T00:00:01Z"),
            ("Warning", "ProvisioningFailed", "an older claim of this name", "2026-01-01T00:00:09Z")):
        w.kube.add({"apiVersion": "v1", "kind": "Event", "metadata": {"name": f"e-{at}", "namespace": "default"},
                    "involvedObject": {"kind": "PersistentVolumeClaim", "name": "demo-shared",
                                       "uid": claim["metadata"]["uid"] if "older" not in message else "gone"},
                    "type": type_, "reason": reason, "message": message, "lastTimestamp": at})
    out = w.round()
    conds = {c.type: c for c in out.status.conditions}
    said = f"claim demo-shared is Pending: ProvisioningFailed: {refused}"
    assert (conds["StorageReady"].status, conds["StorageReady"].reason) == ("False", "ProvisioningFailed")
    assert said in conds["StorageReady"].message and "older" not in conds["StorageReady"].message
    assert conds["Ready"].reason == "StorageNotReady" and conds["Ready"].message.startswith(f"StorageReady: {said}")
    w.kube.pending.clear()
    w.kube.run_controllers()
    conds = {c.type: c for c in w.round().status.conditions}
    assert (conds["StorageReady"].status, conds["StorageReady"].message) == ("True", "2 claims bound")


def test_a_release_slurm_cannot_upgrade_to_in_place_is_refused_and_nothing_changes(offline):
    w = offline
    w.round()
    w.kube.run_controllers()
    running = w.body["spec"]["slurm"]["version"]
    newer = [v for v in versions.SUPPORTED if versions.upgrade_problem(running, v)]
    assert newer, "every supported release upgrades from this one"
    w.kube.writes.clear()
    w.spec(lambda s: s["slurm"].update(version=newer[-1]))
    out = w.round()
    w.round()
    assert out.status.phase == "Failed"
    assert w.kube.writes == [("patch/status", "SlurmCluster", "demo")]  # no workload, ConfigMap or Slurm change
    ready = w.body["status"]["conditions"][0]
    assert (ready["reason"], ready["message"].split(":")[0]) == ("UnsupportedUpgrade", "spec.slurm.version")
    assert f"Set it back to {running}" in ready["message"]
    assert w.reasons().count("UnsupportedUpgrade") == 1  # announced once
    # Set back: the cluster is reconciled again.
    w.spec(lambda s: s["slurm"].update(version=running))
    assert w.round().status.phase != "Failed"


def test_a_failed_lookup_stops_the_round_before_any_write(offline):
    w = offline
    w.round()
    w.kube.run_controllers()
    w.kube.fail[("list", "Pod")] = ApiError("GET", "/api/v1/pods", 500, "InternalError", "etcd timeout")
    w.spec(lambda s: s.update(nodeSets=[], partitions=[]))
    w.kube.writes.clear()
    with pytest.raises(RoundFailed) as failed:
        w.round()
    assert isinstance(failed.value.__cause__, ApiError) and failed.value.step == "observe"
    assert w.kube.writes == []


def test_nothing_is_deleted_in_a_round_where_a_write_failed_and_failures_are_announced_once(offline):
    w = offline
    w.spec(lambda s: s.update(restApi={"enabled": True}))
    w.round()
    w.kube.run_controllers()
    w.spec(lambda s: s.update(restApi={"enabled": False}))
    w.kube.fail[("apply", "StatefulSet")] = ApiError(
        "PATCH", "/apis/apps/v1/namespaces/default/statefulsets/demo-controller", 422, "Invalid",
        "spec: Forbidden: updates to statefulset spec for fields other than ... are forbidden")
    out = w.round()
    assert "demo-restapi" in w.kube.of_kind("Deployment")  # no deletes after a failed write
    assert out.status.phase != "Ready"
    ready = next(c for c in out.status.conditions if c.type == "Ready")
    assert ready.reason == "ReconcileFailed" and "Forbidden" in ready.message
    assert [e.reason for e in out.events].count("ActionFailed") == 2  # controller and workers

    def posted() -> list[str]:
        return sorted(e["message"] for e in w.kube.of_kind("Event").values() if e["reason"] == "ActionFailed")

    Operator(w.kube).announce(w.body, out.events)
    first = posted()
    assert len(first) == 2 and all(e["source"]["component"] == "slurmk8s-operator"
                                   for e in w.kube.of_kind("Event").values())
    # The same failures again, worded differently: one Event per reason and object, already posted.
    out = w.round()
    Operator(w.kube).announce(w.body, [replace(e, message=e.message + " (again)") for e in out.events])
    assert posted() == first
    del w.kube.fail[("apply", "StatefulSet")]
    out = w.round()
    assert not out.problems and "demo-restapi" not in w.kube.of_kind("Deployment")


def test_a_round_generates_keys_only_when_a_key_secret_is_missing(offline, monkeypatch):
    w = offline
    made: list[str] = []
    new_key = ClusterKeys.new_key
    monkeypatch.setattr(ClusterKeys, "new_key", staticmethod(lambda name: made.append(name) or new_key(name)))

    def round_() -> None:
        Operator(w.kube, clock=lambda: w.now).reconcile(w.body)

    round_()
    # A new cluster: the keys of the Secrets it creates (no JWT key without slurmrestd).
    assert sorted(made) == ["agent_token", "munge_key", "ssh_host_key"]
    made.clear()
    round_()
    round_()
    assert made == []  # every Secret exists: nothing generated and thrown away
    del w.kube.objects[("Secret", "default", "demo-munge-key")]
    round_()
    assert made == ["munge_key"] and "demo-munge-key" in w.kube.of_kind("Secret")


def test_the_daemon_runs_a_round_every_interval_and_hurries_while_a_round_asks():
    class Op:
        def __init__(self):
            self.rounds: list[float] = []

        def reconcile(self, body):
            self.rounds.append(time.monotonic())
            return Outcome(hurry=len(self.rounds) <= 3)

        def announce(self, body, events):
            pass

    class Stopped:
        def __init__(self, seconds: float):
            self.until = time.monotonic() + seconds

        def __bool__(self) -> bool:
            return time.monotonic() >= self.until

        def wait(self, seconds: float) -> None:
            time.sleep(seconds)

    op = Op()
    h = Handlers(op, interval=2.0)
    body = {"metadata": {"name": "demo", "namespace": "hpc", "uid": "u1"}}
    h.reconcile(body)  # what kopf's create or resume handler runs first
    h.rounds(Stopped(4.0), body)
    gaps = [b - a for a, b in pairwise(op.rounds)]
    # Three hurried rounds, HURRY_SECONDS apart; then the interval.
    assert len(op.rounds) == 5 and all(g < HURRY_SECONDS + 0.3 for g in gaps[:3]) and gaps[3] >= 2.0


class _Failing:
    """An Operator whose rounds fail ``times`` times (at the status step, with the Events found), then succeed."""

    def __init__(self, times: int):
        self.times, self.rounds, self.announced = times, 0, []

    def reconcile(self, body):
        self.rounds += 1
        if self.rounds <= self.times:
            try:
                raise ApiError("PATCH", "/apis/slurmk8s.dev/v1alpha1/.../status", 503, "ServiceUnavailable", "etcd")
            except ApiError as exc:
                raise RoundFailed("status", Outcome(events=[Event("Normal", "Provisioning", "x")])) from exc
        return Outcome()

    def announce(self, body, events):
        self.announced.append([e.reason for e in events])


def test_failed_rounds_back_off_per_cluster_and_a_good_round_resets_it():
    """Issue 41, item 9: a failed round was retried every 10 s for ever."""
    op = _Failing(times=4)
    h = Handlers(op, interval=2.0)
    a = {"metadata": {"name": "a", "namespace": "hpc", "uid": "ua"}}
    b = {"metadata": {"name": "b", "namespace": "hpc", "uid": "ub"}}
    waits = []
    for _ in range(4):
        with pytest.raises(kopf.TemporaryError) as caught:
            h.reconcile(a)
        waits.append(h._due["ua"] - time.monotonic())
        assert abs(caught.value.delay - waits[-1]) < 0.5  # kopf retries its handler after the same backoff
    # Doubling from the interval, with up to one interval of jitter.
    assert all(2.0 * 2 ** k - 0.2 <= w <= 2.0 * 2 ** k + 2.0 for k, w in enumerate(waits)), waits
    h.reconcile(b)  # another cluster's rounds are not held back
    assert h._due["ub"] - time.monotonic() <= 2.0 and "ub" not in h.failures
    h.reconcile(a)  # a round that went through: the interval again
    assert h._due["ua"] - time.monotonic() <= 2.0 and "ua" not in h.failures


def test_a_round_failing_for_ever_waits_at_most_the_cap():
    op = _Failing(times=10**6)
    h = Handlers(op, interval=10.0)
    body = {"metadata": {"name": "a", "namespace": "hpc", "uid": "ua"}}
    for _ in range(12):
        with pytest.raises(kopf.TemporaryError):
            h.reconcile(body)
    assert ROUND_BACKOFF_CAP - 1 <= h._due["ua"] - time.monotonic() <= ROUND_BACKOFF_CAP


def test_a_failed_round_is_logged_with_its_context_and_its_events_are_posted(capsys):
    op = _Failing(times=1)
    h = Handlers(op, interval=2.0)
    before = structlog.get_config()
    log.configure("info", "json")
    try:
        with pytest.raises(kopf.TemporaryError):
            h.reconcile({"metadata": {"name": "a", "namespace": "hpc", "uid": "ua"}})
    finally:
        structlog.configure(**before)
    line = next(json.loads(s) for s in capsys.readouterr().err.splitlines() if "round failed" in s)
    assert line["cluster"] == "hpc/a" and line["step"] == "status" and line["error_type"] == "ApiError"
    assert "Traceback" in line["exception"] and "ServiceUnavailable" in line["exception"]
    # The Events the round had found, and one saying it failed.
    assert op.announced == [["Provisioning", "RoundFailed"]]


def test_the_rounds_events_are_posted_even_when_its_status_patch_fails(offline):
    w = offline
    w.round()
    w.kube.run_controllers()  # the pods run: the next round changes the phase, and says so in an Event
    w.kube.fail[("patch", "SlurmCluster")] = ApiError("PATCH", "/apis/.../status", 500, "InternalError", "etcd")
    op = Operator(w.kube, clock=lambda: w.now, fresh_keys=lambda: w.keys)
    h = Handlers(op, interval=2.0)
    with pytest.raises(kopf.TemporaryError, match="at status"):
        h.reconcile(w.body)
    posted = {e["reason"] for e in w.kube.of_kind("Event").values()}
    del w.kube.fail[("patch", "SlurmCluster")]
    phase = w.round().status.phase  # what the failed round found too
    assert phase != "Pending" and {phase, "RoundFailed"} <= posted, posted


class _Refusing(JsonHandler):
    """A Slurm agent that knows one node, whose pod is gone, and answers 400 to deleting it."""

    def do_GET(self):
        if self.path == "/v1/nodes":
            gone = Node("demo-cpu-5", "down", frozenset({"NOT_RESPONDING"}), "", (), ("cpu",), 2, 0, "", "")
            return self._answer(200, {"nodes": [node_to_dict(gone)]})
        if self.path.startswith("/v1/jobs"):
            return self._answer(200, {"jobs": []})
        if self.path == "/v1/config-hash":
            return self._answer(200, {"hash": "old"})
        return self._answer(404, {"error": "no such thing", "kind": "not-found"})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        return self._answer(200, {"applied": []})

    def do_DELETE(self):
        return self._answer(400, {"error": "'demo-cpu-5' is not a Slurm node name"})


def test_an_agent_refusing_a_request_is_a_problem_of_the_round_which_goes_on(offline):
    """Issue 41, item 9: the agent client's ValueError for a 400 was missing
    from the operator's list of failures and aborted the round midway."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        w = offline
        w.agent_url = f"http://127.0.0.1:{httpd.server_address[1]}"
        w.round()
        w.kube.run_controllers()
        out = w.round()
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert any(p.startswith("delete Slurm node demo-cpu-5") and "not a Slurm node name" in p for p in out.problems)
    assert "ActionFailed" in [e.reason for e in out.events]
    # The round went on to its last step: the status says what failed.
    assert out.step == "status" and w.kube.objects[("SlurmCluster", "default", "demo")]["status"]["phase"]


class _Slurm:
    """Slurm with the cluster's workers idle and a node whose pod is gone (down);
    ``drain_fails``: every drain is refused; ``delete_fails``: the agent does not answer a deletion."""

    def __init__(self, workers, drain_fails: bool = False, delete_fails: bool = False):
        idle = [Node(n, "idle", frozenset(), "", ("cpu",), ("cpu",), 2, 0, "", "") for n in workers]
        self.known = [*idle, Node("demo-cpu-5", "down", frozenset({"NOT_RESPONDING"}), "", (), ("cpu",), 2, 0, "", "")]
        self.drain_fails, self.delete_fails, self.drained, self.deleted = drain_fails, delete_fails, [], []

    def nodes(self):
        return list(self.known)

    def config_hash(self):
        return "old"

    def jobs(self, *args, **kwargs):
        return []

    def drain(self, name, reason):
        if self.drain_fails:
            raise RuntimeError(f"slurmctld refused to drain {name}")
        self.drained.append(name)

    def delete_node(self, name):
        if self.delete_fails:
            raise OSError(f"the agent did not answer deleting {name}")
        self.deleted.append(name)


@pytest.mark.parametrize("drain_fails", [False, True], ids=["drained", "drain refused"])
def test_a_round_whose_slurm_action_failed_restarts_nothing_and_removes_no_record(offline, drain_fails):
    """A refused drain is a value the round passes on (may_restart): the node sets stay
    at their size, no Slurm record goes, nothing is deleted; the same round with the
    drain done removes the gone pod's record."""
    w = offline
    w.spec(lambda s: s["nodeSets"][0].update(replicas=2))
    w.round()
    w.kube.run_controllers()
    w.spec(lambda s: s["nodeSets"][0].update(replicas=1))
    slurm = _Slurm(["demo-cpu-0", "demo-cpu-1"], drain_fails)
    out = Operator(w.kube, agent=lambda c, t, p: slurm, clock=lambda: w.now + 1, fresh_keys=lambda: w.keys) \
        .reconcile(w.body)
    if not drain_fails:
        assert slurm.drained == ["demo-cpu-1"] and slurm.deleted == ["demo-cpu-5"]
        return
    assert any("refused to drain demo-cpu-1" in p for p in out.problems)
    assert "SlurmActionFailed" in [e.reason for e in out.events]
    assert slurm.deleted == [] and not any(a.startswith("delete") for a in out.applied)
    assert w.kube.of_kind("StatefulSet")["demo-cpu"]["spec"]["replicas"] == 2


@pytest.mark.parametrize("delete_fails", [False, True], ids=["record removed", "record removal failed"])
def test_a_round_whose_slurm_record_removal_failed_deletes_no_object(offline, delete_fails):
    """Deletes come last, only after every step before them went through: a Slurm
    record that could not be removed (step 3) keeps a Deployment the spec dropped."""
    w = offline
    w.spec(lambda s: s.update(restApi={"enabled": True}))
    w.round()
    w.kube.run_controllers()
    w.spec(lambda s: s.update(restApi={"enabled": False}))
    slurm = _Slurm(["demo-cpu-0"], delete_fails=delete_fails)
    out = Operator(w.kube, agent=lambda c, t, p: slurm, clock=lambda: w.now + 1, fresh_keys=lambda: w.keys) \
        .reconcile(w.body)
    if not delete_fails:
        assert slurm.deleted == ["demo-cpu-5"] and "demo-restapi" not in w.kube.of_kind("Deployment")
        return
    assert any(p.startswith("delete Slurm node demo-cpu-5") for p in out.problems)
    assert "demo-restapi" in w.kube.of_kind("Deployment") and out.step == "status"


def test_scale_in_and_removal_wait_while_slurm_cannot_be_asked(offline):
    w = offline
    w.round()
    w.kube.run_controllers()
    w.spec(lambda s: s.update(nodeSets=[], partitions=[]))
    out = w.round()
    sts = w.kube.of_kind("StatefulSet")["demo-cpu"]
    assert sts["spec"]["replicas"] == 1 and w.pod(NODE) is not None
    assert "PodDisruptionBudget" in {k for k, _, _ in w.kube.objects}
    assert any("waits for the Slurm agent" in m for m in out.waiting)


def test_teardown_removes_the_cluster_but_keeps_its_data(offline):
    w = offline
    w.round()
    w.kube.run_controllers()
    controller = w.kube.of_kind("StatefulSet")["demo-controller"]
    state_claim = claim_name(controller["spec"]["volumeClaimTemplates"][0], "demo-controller-0")
    op = Operator(w.kube, agent=lambda c, t, p: RemoteSlurm(w.agent_url, t, timeout=2), fresh_keys=lambda: w.keys)
    done, why = op.teardown(w.body, attempt=0)
    assert not done and "waiting to drain the Slurm nodes" in why
    assert "demo-cpu" in w.kube.of_kind("StatefulSet")  # nothing deleted while it waits
    done, _ = op.teardown(w.body, attempt=TEARDOWN_PATIENCE)
    assert done
    left = sorted((k, n) for k, _, n in w.kube.objects if k not in ("SlurmCluster", "Pod"))
    assert left == [("PersistentVolumeClaim", "demo-shared"),
                    ("PersistentVolumeClaim", state_claim),
                    ("Secret", "researcher-ssh")]  # the site's, which the cluster only named


def test_teardown_of_a_spec_that_no_longer_loads_finds_the_key_secrets_by_name(offline):
    w = offline
    w.round()
    w.kube.run_controllers()
    w.kube.add({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "demo-jwt-key", "namespace": "default"},
                "data": {"jwt_hs256.key": "c2VjcmV0"}})  # someone else's, by a name the operator would use
    w.spec(lambda s: s["partitions"][0].update(name="cpu\nProlog=/x"))
    op = Operator(w.kube, agent=lambda c, t, p: RemoteSlurm(w.agent_url, t, timeout=2), fresh_keys=lambda: w.keys)
    done, _ = op.teardown(w.body, attempt=TEARDOWN_PATIENCE)
    assert done
    assert sorted(w.kube.of_kind("Secret")) == ["demo-jwt-key", "researcher-ssh"]  # ours deleted, theirs kept
    assert ("list", "", "secrets", "default") not in w.kube.requests


def test_teardown_with_deletion_policy_delete_removes_the_claims(offline):
    w = offline
    w.spec(lambda s: s.update(deletionPolicy="Delete"))
    w.round()
    w.kube.run_controllers()
    op = Operator(w.kube, agent=lambda c, t, p: RemoteSlurm(w.agent_url, t, timeout=2), fresh_keys=lambda: w.keys)
    done, _ = op.teardown(w.body, attempt=TEARDOWN_PATIENCE)
    assert done
    assert [(k, n) for k, _, n in w.kube.objects if k not in ("SlurmCluster", "Pod")] == [
        ("Secret", "researcher-ssh")]  # the site's, which the cluster only named


# With real Slurm behind the real agent.


@pytest.fixture(scope="module")
@needs("root", "slurm")
def slurm(tmp_path_factory, example_doc, keys):
    assert os.geteuid() == 0 and not missing_tools(), "run hack/test.sh: it installs Slurm and runs as root"
    c = load_cluster(cpu_only(example_doc))
    work = tmp_path_factory.mktemp("round")
    with SlurmNamespace(config_files(c), keys, work, nodes=[(NODE, node_conf(c, c.spec.node_sets[0]))]) as ns:
        local = SlurmClient(lambda argv, stdin: ns.run(argv, input=stdin, check=False), config_dir=work / "conf")
        server = AgentServer(("127.0.0.1", 0), local, keys.agent_token)
        server.start()
        yield ns, local, server
        server.stop()


@pytest.fixture
def world(slurm, example_doc, keys):
    ns, local, server = slurm
    doc = cpu_only(example_doc)
    w = World(doc, keys, server.url, ns.work)
    for name, text in config_files(load_cluster(doc)).items():  # the files slurmctld was started with
        (ns.work / "conf" / name).write_text(text)
    w.ns, w.local = ns, local
    return w


def settle(w: World) -> Outcome:
    """Create the cluster and let the controllers and the first reconfigure happen."""
    w.round()
    w.kube.run_controllers()
    out = w.round()
    w.kube.run_controllers()
    return out


def config_value(w: World, key: str) -> str:
    for line in w.ns.run(["scontrol", "show", "config"]).stdout.splitlines():
        if line.split("=", 1)[0].strip() == key:
            return line.split("=", 1)[1].strip()
    raise AssertionError(f"{key} not in scontrol show config")


def test_a_config_change_is_reconfigured_once_the_pod_sees_it_without_a_restart(world):
    w = world
    out = settle(w)
    assert "scontrol reconfigure" in out.applied  # the first round adopts the running config
    rendered = w.kube.of_kind("ConfigMap")["demo-slurm-config"]["metadata"]["annotations"][names.CONFIG_HASH]
    assert w.body["status"]["configHash"] == rendered and out.status.phase == "Ready"
    boot = config_value(w, "BOOT_TIME")
    pods = {n: p["metadata"]["uid"] for n, p in w.kube.of_kind("Pod").items()}
    grace = lambda: w.kube.of_kind("StatefulSet")["demo-cpu"]["spec"]["template"]["spec"][  # noqa: E731 - a one-line accessor
        "terminationGracePeriodSeconds"]
    grace_before = grace()

    w.spec(lambda s: s["slurmConfig"].update(killWait=45))
    out = w.round()
    assert ("apply", "ConfigMap", "demo-slurm-config") in w.kube.writes
    assert "scontrol reconfigure" not in out.applied
    assert any("kubelet" in m for m in out.waiting)
    ready = next(c for c in out.status.conditions if c.type == "Ready")
    assert (ready.status, ready.reason) == ("False", "ConfigPending")
    assert config_value(w, "KillWait") == "30 sec"

    w.kubelet_syncs_config()
    out = w.round()
    assert "scontrol reconfigure" in out.applied and "Reconfigured" in w.reasons()
    assert config_value(w, "KillWait") == "45 sec"
    assert config_value(w, "BOOT_TIME") == boot  # slurmctld was not restarted
    assert w.body["status"]["configHash"] != rendered and out.status.phase == "Ready"
    # killWait also sets the workers' termination grace period, which the
    # restart hash leaves out: a config change restarts no pod, round after round.
    assert grace() - grace_before == 45 - 30
    for _ in range(3):
        w.kube.run_controllers()
        out = w.round()
    assert {n: p["metadata"]["uid"] for n, p in w.kube.of_kind("Pod").items()} == pods
    assert not {"Draining", "Restarting"} & set(w.reasons()) and out.status.phase == "Ready"


def test_an_image_update_restarts_each_worker_drained_first(world):
    w = world
    settle(w)
    old = w.pod(NODE)["metadata"]["uid"]
    w.spec(lambda s: s["slurm"].update(image={"tag": "22.05-2"}))
    w.round()
    w.kube.run_controllers()  # OnDelete: the worker keeps its old pod
    assert w.pod(NODE)["metadata"]["uid"] == old

    w.round()
    node = w.local.node(NODE)
    assert node.drain_set and node.reason == "slurmk8s: rolling update"
    assert w.pod(NODE)["metadata"]["annotations"][names.DRAIN_PURPOSE] == "rolling update"
    w.round()  # empty: the pod is deleted
    assert w.pod(NODE) is None and "Restarting" in w.reasons()
    w.kube.run_controllers()
    new = w.pod(NODE)
    assert new["metadata"]["uid"] != old and "22.05-2" in new["spec"]["containers"][0]["image"]
    out = w.round()  # the restarted node's old record is still drained: ours, so cleared
    assert not w.local.node(NODE).drain_set and "Undrained" in w.reasons()
    assert out.status.phase == "Ready"


def test_a_foreign_drain_is_left_alone(world):
    w = world
    settle(w)
    w.ns.run(["scontrol", "update", f"nodename={NODE}", "state=drain", "reason=bad DIMM"])
    try:
        out = w.round()
        w.round()
        assert w.local.node(NODE).reason == "bad DIMM"
        assert out.status.node_counts.drain == 1
    finally:
        w.ns.run(["scontrol", "update", f"nodename={NODE}", "state=resume"])


def test_scale_in_drains_signals_waits_requeues_then_removes_the_node(world, tmp_path):
    w = world
    w.spec(lambda s: s["nodeSets"][0].update(drain={"gracePeriod": 60, "signal": "USR1"}))
    settle(w)
    marks = tmp_path / "marks"
    job = w.local.submit(
        "#!/bin/bash\n"
        f"trap 'echo USR1 >> {marks}' USR1\n"
        f"echo start >> {marks}\n"
        "for i in $(seq 1200); do sleep 0.1; done\n",
        ["--job-name=ckpt", "--requeue", f"--output={tmp_path}/out.txt"])
    deadline = time.monotonic() + 30
    while not any(j.job_id == job and j.state == "RUNNING" for j in w.local.jobs()):
        assert time.monotonic() < deadline, "the job did not start"
        time.sleep(0.2)

    w.spec(lambda s: s["nodeSets"][0].update(replicas=0))
    w.round()
    assert w.pod(NODE)["metadata"]["labels"][names.BUSY_LABEL] == "true"  # no eviction while it runs jobs
    node = w.local.node(NODE)
    assert node.drain_set and node.reason == "slurmk8s: scale-in"
    assert w.kube.of_kind("StatefulSet")["demo-cpu"]["spec"]["replicas"] == 1

    w.round()
    assert w.pod(NODE)["metadata"]["annotations"][names.JOBS_SIGNALLED]
    deadline = time.monotonic() + 30
    while not (marks.exists() and "USR1" in marks.read_text()):
        assert time.monotonic() < deadline, "the job did not get USR1"
        time.sleep(0.2)

    w.round(advance=30)  # within the grace period: nothing goes
    assert w.kube.of_kind("StatefulSet")["demo-cpu"]["spec"]["replicas"] == 1
    assert any(j.job_id == job and j.state == "RUNNING" for j in w.local.jobs())

    out = w.round(advance=30)  # grace over: requeued, eligible at once, the pod may go
    assert w.kube.of_kind("StatefulSet")["demo-cpu"]["spec"]["replicas"] == 0
    queued = json.loads(w.ns.run(["squeue", "--json", "--jobs", str(job)]).stdout)["jobs"][0]
    assert queued["restart_cnt"] == 1 and queued["job_state"] == "PENDING"
    assert queued["eligible_time"] <= time.time()
    assert {"JobsSignalled", "JobsRequeued", "ScaledIn"} <= set(w.reasons())

    w.kube.run_controllers()  # the StatefulSet controller removes the pod
    assert w.pod(NODE) is None
    out = w.round()
    assert w.local.node(NODE) is None and "NodeRemoved" in w.reasons()
    out = w.round()
    assert out.status.node_counts.total == 0 and not out.problems
    w.local.cancel(job)


# Two nodes: a checkpointing job evacuated by scale-in runs again on the node that stays.


def held_back(j: Job, at: float) -> bool:
    return held(j, datetime.fromtimestamp(at, tz=UTC))

NODES = ("demo-cpu-0", "demo-cpu-1")


@pytest.fixture(scope="module")
@needs("root", "slurm")
def two_nodes(tmp_path_factory, example_doc, keys):
    assert os.geteuid() == 0 and not missing_tools(), "run hack/test.sh: it installs Slurm and runs as root"
    doc = cpu_only(example_doc)
    doc["spec"]["nodeSets"][0]["replicas"] = 2
    c = load_cluster(doc)
    work = tmp_path_factory.mktemp("round2")
    with SlurmNamespace(config_files(c), keys, work, nodes=[(n, node_conf(c, c.spec.node_sets[0]))
                                                           for n in NODES]) as ns:
        local = SlurmClient(lambda argv, stdin: ns.run(argv, input=stdin, check=False), config_dir=work / "conf")
        server = AgentServer(("127.0.0.1", 0), local, keys.agent_token)
        server.start()
        yield doc, ns, local, server
        server.stop()


def test_a_checkpointing_job_evacuated_by_scale_in_runs_again_at_once(two_nodes, keys, tmp_path):
    """train.sh's pattern: on USR1 it checkpoints and requeues itself. Slurm
    holds such a job for its requeue delay (credentialLifetime + 1 s, 31 s
    here); the operator makes it eligible at once, so it runs again as soon
    as Slurm has finished its last run, instead of half a minute later."""
    doc, ns, local, server = two_nodes
    doc = copy.deepcopy(doc)
    doc["spec"]["nodeSets"][0]["drain"] = {"gracePeriod": 120, "signal": "USR1"}
    w = World(doc, keys, server.url, ns.work)
    w.ns, w.local = ns, local
    settle(w)
    marks = tmp_path / "marks"
    ns.run(["scontrol", "update", f"nodename={NODES[0]}", "state=drain", "reason=test: start on the other node"])
    job = local.submit(
        "#!/bin/bash\n"
        f"trap 'date +%s.%N > {tmp_path}/requeued; scontrol requeue $SLURM_JOB_ID; exit 0' USR1\n"
        f"echo \"$(date +%s.%N) ${{SLURM_RESTART_COUNT:-0}}\" >> {marks}\n"
        "for i in $(seq 1200); do sleep 0.1; done\n",
        ["--job-name=ckpt", "--requeue", f"--output={tmp_path}/out.txt"])
    seen: list[tuple[float, Job | None]] = []
    stop = threading.Event()

    def watch() -> None:  # Slurm's view of the job, every 50 ms
        while not stop.is_set():
            seen.append((time.time(), next((j for j in local.jobs() if j.job_id == job), None)))
            time.sleep(0.05)

    try:
        deadline = time.monotonic() + 30
        while not (marks.exists() and marks.read_text().strip()):
            assert time.monotonic() < deadline, "the job did not start"
            time.sleep(0.2)
        assert next(j for j in local.jobs() if j.job_id == job).nodes == NODES[1]
        ns.run(["scontrol", "update", f"nodename={NODES[0]}", "state=resume"])
        threading.Thread(target=watch, daemon=True).start()

        # Scale-in: the node goes; the job gets USR1 and requeues itself. Rounds
        # come as the operator's daemon runs them: every HURRY_SECONDS while it may.
        w.spec(lambda s: s["nodeSets"][0].update(replicas=1))
        hurried = False
        deadline = time.monotonic() + 60
        while len(marks.read_text().splitlines()) < 2:
            assert time.monotonic() < deadline, f"the job did not run again: {w.reasons()}"
            w.now = time.time()  # Slurm's hold is a time of its clock: the operator's must be the same
            out = w.round(advance=0)
            w.kube.run_controllers()
            hurried |= out.hurry
            time.sleep(HURRY_SECONDS if out.hurry else 0.2)
        stop.set()
        requeued = float((tmp_path / "requeued").read_text())
        started, restarts = marks.read_text().splitlines()[1].split()
        eligible = max([t for t, j in seen if j is not None and held_back(j, t)], default=requeued)
        print(f"\nrequeue -> eligible again {eligible - requeued:.2f}s, running again "
              f"{float(started) - requeued:.2f}s (Slurm finishes its last run first)")
        assert restarts == "1" and next(j for j in local.jobs() if j.job_id == job).nodes == NODES[0]
        assert eligible - requeued < 2.0, "Slurm's hold was not lifted at once"
        assert float(started) - requeued < 10, "it waited out Slurm's requeue delay"
        assert hurried and {"Draining", "JobsSignalled", "JobsStarted"} <= set(w.reasons())
        # The pod went once the job was seen eligible, and its node record after it.
        for _ in range(3):
            w.round()
            w.kube.run_controllers()
        assert w.kube.of_kind("StatefulSet")["demo-cpu"]["spec"]["replicas"] == 1 and w.pod(NODES[1]) is None
        assert w.local.node(NODES[1]) is None
    finally:
        stop.set()
        local.cancel(job)
