"""The bridge's loop against the Kubernetes stand-in: what each action becomes
through the API, and the chain rule. Slurm is an in-memory SlurmControl here
(the sandbox tests, tests/e2e/test_bridge_e2e.py, run the loop with real Slurm).

Over 500 lines because each rule of the loop is one short case against the
stand-in, and what it cannot load is run by every cause and every owner's change."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta

import pytest

from slurmk8s.api.lending import LENDABLE_TO_LABEL
from slurmk8s.bridge.loop import Bridge
from slurmk8s.bridge.nodestate import IDLE_SINCE_ANNOTATION, STATE_LABEL, TAINT_KEY, format_time
from slurmk8s.kube import Kube
from slurmk8s.slurm import AgentUnreachable, SlurmError
from slurmk8s.slurm.model import Job, Node

from .apiserver.conftest import CRDS, start_server

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
GPU = {"nvidia.com/gpu": "4"}


class MemorySlurm:
    """Slurm as the agent would show it; records what was asked of it."""

    def __init__(self):
        self.nodes: dict[str, Node] = {}
        self.jobs: list[Job] = []
        self.calls: list[tuple] = []
        #: Nodes Slurm refuses to delete (as it does while a job runs there).
        self.busy: set[str] = set()
        #: Calls the agent does not answer: (operation, argument).
        self.unanswered: set[tuple] = set()
        #: Jobs Slurm refuses to requeue (they ended meanwhile).
        self.ended: set[int] = set()

    def _do(self, op: str, *args) -> None:
        self.calls.append((op, *args))
        if (op, *args) in self.unanswered:
            raise AgentUnreachable(f"the agent did not answer {op}")

    def register(self, name: str, state: str = "idle") -> None:
        self.nodes[name] = Node(name=name, state=state, flags=frozenset(), reason="", features=("lent_gpu",),
                                partitions=("gpu",), cpus=8, alloc_cpus=0, gres="gpu:h100:4", address="")

    # SlurmControl, as far as the loop uses it.
    def nodes_(self):
        return list(self.nodes.values())

    def drain(self, name, reason):
        self._do("drain", name)

    def set_down(self, name, reason):
        self._do("down", name)

    def signal_node_jobs(self, name, signal):
        self._do("signal", name, signal)
        return [j.job_id for j in self.jobs if name in j.nodes]

    def requeue(self, job):
        self._do("requeue", job)
        if job in self.ended:
            raise SlurmError(["scontrol", "requeue", str(job)], 1, "Job has already finished")

    def start_now(self, job):
        self._do("start-now", job)

    def cancel(self, job):
        self._do("cancel", job)

    def delete_node(self, name):
        self._do("delete", name)
        if name in self.busy:
            raise RuntimeError("scontrol: error: Requested nodes are busy")
        self.nodes.pop(name, None)

    def reservations(self):
        return []

    def unreserve(self, name):
        self._do("unreserve", name)


class Facade:
    def __init__(self, memory: MemorySlurm):
        self.m = memory

    def __getattr__(self, name):
        return getattr(self.m, name)

    def nodes(self):
        return self.m.nodes_()

    def jobs(self, nodes=(), checkpoints=False):
        return list(self.m.jobs)


@pytest.fixture()
def world(tmp_path):
    cluster = start_server(tmp_path, crds=sorted(CRDS.glob("*.yaml")))
    core, custom = cluster.core, cluster.custom
    custom.create_namespaced_custom_object("slurmk8s.dev", "v1alpha1", "default", "slurmclusters", {
        "apiVersion": "slurmk8s.dev/v1alpha1", "kind": "SlurmCluster", "metadata": {"name": "demo"},
        "spec": {"partitions": [{"name": "gpu", "acceptLentNodes": True}]}})
    core.create_namespaced_secret("default", {"metadata": {"name": "demo-agent-token"},
                                              "data": {"token": base64.b64encode(b"t" * 32).decode()}})
    custom.create_namespaced_custom_object("slurmk8s.dev", "v1alpha1", "default", "nodelendingpolicies", {
        "apiVersion": "slurmk8s.dev/v1alpha1", "kind": "NodeLendingPolicy", "metadata": {"name": "lend"},
        "spec": {"clusterRef": {"name": "demo"}, "partition": "gpu", "idleAfterSeconds": 60,
                 "nodeSelector": {"matchLabels": {"lendable": "true"}}}})
    memory = MemorySlurm()
    bridge = Bridge(Kube.from_kubeconfig(str(cluster.kubeconfig), field_manager="slurmk8s-bridge"),
                    agent=lambda c, token, pod: Facade(memory), clock=lambda: NOW)
    yield cluster, bridge, memory
    cluster.api_client.close()
    cluster.srv.stop()


def idle_node(cluster, name: str, namespace: str = "default") -> None:
    # Its owner lets the policies of ``namespace`` lend it (decision record 15).
    cluster.node(name, cpu="8", memory="64Gi", labels={"lendable": "true", LENDABLE_TO_LABEL: namespace},
                 extra=GPU, ready=True)
    cluster.core.patch_node(name, {"metadata": {"annotations": {
        IDLE_SINCE_ANNOTATION: format_time(NOW - timedelta(minutes=5))}}})


def test_lending_becomes_a_label_a_taint_a_pinned_slurmd_pod_and_events(world):
    cluster, bridge, memory = world
    idle_node(cluster, "gpu-a")
    report = bridge.round()
    assert not report.errors and not report.failed, report
    node = cluster.core.read_node("gpu-a")
    assert node.metadata.labels[STATE_LABEL] == "lending"
    assert [(t.key, t.value, t.effect) for t in node.spec.taints] == [(TAINT_KEY, "demo", "NoSchedule")]
    pod = cluster.core.read_namespaced_pod("demo-lent.gpu-a", "default")
    assert pod.spec.node_name == "gpu-a" and pod.metadata.labels["app.kubernetes.io/managed-by"] == "slurmk8s-bridge"
    assert {e.reason for e in cluster.core.list_namespaced_event("default").items
            if e.involved_object.name == "gpu-a"} >= {"Lending"}
    # The pod runs and slurmd registers: lent, with the policy's status saying so.
    cluster.report_running("default", "demo-lent.gpu-a")
    memory.register("gpu-a")
    assert not bridge.round().failed
    assert cluster.core.read_node("gpu-a").metadata.labels[STATE_LABEL] == "lent"
    status = cluster.custom.get_namespaced_custom_object("slurmk8s.dev", "v1alpha1", "default",
                                                         "nodelendingpolicies", "lend")["status"]
    assert status["lentNodes"] == ["gpu-a"]


def test_the_lent_pod_is_shaped_by_the_policys_pod_template(world):
    """The policy's podTemplate passes the CRD (nothing of it pruned), reaches the decision,
    and the pod the loop creates has it."""
    cluster, bridge, memory = world
    cluster.custom.patch_namespaced_custom_object("slurmk8s.dev", "v1alpha1", "default", "nodelendingpolicies",
                                                  "lend", {"spec": {"podTemplate": {
                                                      "runtimeClassName": "nvidia", "resources": {"rdma/hca": "1"},
                                                      "capabilities": ["IPC_LOCK"],
                                                      "labels": {"example.com/team": "ml"}}}})
    idle_node(cluster, "gpu-a")
    report = bridge.round()
    assert not report.errors and not report.failed, report
    pod = cluster.core.read_namespaced_pod("demo-lent.gpu-a", "default")
    assert pod.spec.runtime_class_name == "nvidia" and pod.metadata.labels["example.com/team"] == "ml"
    (slurmd,) = [c for c in pod.spec.containers if c.name == "slurmd"]
    assert slurmd.resources.limits["rdma/hca"] == "1" and slurmd.resources.requests["rdma/hca"] == "1"
    assert "IPC_LOCK" in slurmd.security_context.capabilities.add


def lend_two(cluster, bridge, memory) -> None:
    for name in ("gpu-a", "gpu-b"):
        idle_node(cluster, name)
    bridge.round()
    for name in ("gpu-a", "gpu-b"):
        cluster.report_running("default", f"demo-lent.{name}")
        memory.register(name)
    bridge.round()


def test_a_failed_action_stops_its_nodes_chain_and_no_other(world):
    cluster, bridge, memory = world
    lend_two(cluster, bridge, memory)
    # Take both back (maxLentNodes 0); Slurm refuses to delete gpu-a's node.
    cluster.custom.patch_namespaced_custom_object("slurmk8s.dev", "v1alpha1", "default", "nodelendingpolicies",
                                                  "lend", {"spec": {"maxLentNodes": 0}})
    memory.busy.add("gpu-a")
    report = bridge.round()
    failed = [(type(a).__name__, a.node) for a, _ in report.failed]
    assert failed == [("DeleteNode", "gpu-a")]
    assert {type(a).__name__ for a in report.skipped} >= {"DeleteSlurmdPod", "Untaint", "ClearLending"}
    assert all(getattr(a, "node", getattr(a, "name", None)) == "gpu-a" for a in report.skipped)
    a, b = cluster.core.read_node("gpu-a"), cluster.core.read_node("gpu-b")
    assert a.metadata.labels[STATE_LABEL] == "reclaiming" and any(t.key == TAINT_KEY for t in a.spec.taints)
    assert STATE_LABEL not in (b.metadata.labels or {}) and not any(t.key == TAINT_KEY for t in b.spec.taints or [])
    returned = {e.involved_object.name for e in cluster.core.list_namespaced_event("default").items
                if e.reason == "Returned"}
    assert returned == {"gpu-b"}  # no Event claims gpu-a came back


def test_an_unreachable_agent_stops_every_later_slurm_step_of_the_round(world):
    cluster, bridge, memory = world
    lend_two(cluster, bridge, memory)
    cluster.custom.patch_namespaced_custom_object("slurmk8s.dev", "v1alpha1", "default", "nodelendingpolicies",
                                                  "lend", {"spec": {"maxLentNodes": 0}})
    memory.unanswered.add(("drain", "gpu-a"))
    memory.calls.clear()
    report = bridge.round()
    assert [c for c in memory.calls if c[0] == "drain"] == [("drain", "gpu-a")]  # gpu-b's drain was not tried
    assert sorted((type(a).__name__, a.node) for a, _ in report.failed) == [("Drain", "gpu-a"), ("Drain", "gpu-b")]
    # The Kubernetes actions before them ran: both nodes are reclaiming, and say so next round.
    assert {cluster.core.read_node(n).metadata.labels[STATE_LABEL] for n in ("gpu-a", "gpu-b")} == {"reclaiming"}


def test_a_job_slurm_refuses_to_requeue_is_a_warning_and_the_reclaim_goes_on(world):
    cluster, bridge, memory = world
    lend_two(cluster, bridge, memory)
    memory.jobs = [Job(job_id=j, name="train", user="u", state="RUNNING", partition="gpu", nodes="gpu-a",
                       requeue=True, restart_count=0, reason="") for j in (1, 2)]
    memory.ended.add(1)
    # Cordoned with its grace period 0: the running jobs are requeued at once.
    cluster.custom.patch_namespaced_custom_object("slurmk8s.dev", "v1alpha1", "default", "nodelendingpolicies",
                                                  "lend", {"spec": {"reclaim": {"gracePeriodSeconds": 0}}})
    cluster.core.patch_node("gpu-a", {"spec": {"unschedulable": True}})
    report = bridge.round()
    assert not report.failed and not report.skipped, report
    assert ("requeue", 1) in memory.calls and ("requeue", 2) in memory.calls
    assert any(type(a).__name__ == "RecordForced" and a.node == "gpu-a" for a in report.applied)
    refused = [e for e in cluster.core.list_namespaced_event("default").items if e.reason == "RequeueRefused"]
    assert [(e.type, e.involved_object.kind, e.involved_object.name) for e in refused] == [("Warning", "Node", "gpu-a")]
    assert "job 1 on gpu-a" in refused[0].message


def test_a_watching_bridge_acts_on_a_change_without_waiting_for_its_interval(world):
    import threading
    import time

    from slurmk8s.bridge.main import watching_bridge

    cluster, listing, memory = world
    cluster.node("gpu-a", cpu="8", memory="64Gi", labels={LENDABLE_TO_LABEL: "default"}, extra=GPU, ready=True)
    cluster.core.patch_node("gpu-a", {"metadata": {"annotations": {
        IDLE_SINCE_ANNOTATION: format_time(datetime.now(UTC) - timedelta(minutes=5))}}})
    bridge = watching_bridge(listing.kube, ["default"], agent=lambda c, token, pod: Facade(memory))
    stop = threading.Event()
    thread = threading.Thread(target=bridge.run_forever, args=(600,), kwargs={"stop": stop.is_set}, daemon=True)
    thread.start()
    try:
        # Not selected (no lendable=true): rounds run and change nothing.
        wait_until = time.monotonic() + 10
        while bridge.view.not_synced() and time.monotonic() < wait_until:
            time.sleep(0.05)
        time.sleep(0.5)
        assert STATE_LABEL not in (cluster.core.read_node("gpu-a").metadata.labels or {})
        # The owner selects it: the Node's event starts a round at once, not in 600 s.
        started = time.monotonic()
        cluster.core.patch_node("gpu-a", {"metadata": {"labels": {"lendable": "true"}}})
        while time.monotonic() - started < 5:
            if (cluster.core.read_node("gpu-a").metadata.labels or {}).get(STATE_LABEL) == "lending":
                break
            time.sleep(0.05)
        assert (cluster.core.read_node("gpu-a").metadata.labels or {}).get(STATE_LABEL) == "lending"
        assert time.monotonic() - started < 5
    finally:
        stop.set()
        thread.join(timeout=5)
        bridge.view.close()


def test_with_idle_after_zero_a_node_first_seen_idle_is_lent_by_the_follow_up_round(world):
    """The round that records a node's idle time is followed by another at
    once: with idleAfterSeconds 0 that one lends it, not a whole second or
    an interval later."""
    import threading
    import time

    from slurmk8s.bridge.main import watching_bridge

    cluster, listing, memory = world
    cluster.custom.patch_namespaced_custom_object("slurmk8s.dev", "v1alpha1", "default", "nodelendingpolicies",
                                                  "lend", {"spec": {"idleAfterSeconds": 0}})
    bridge = watching_bridge(listing.kube, ["default"], agent=lambda c, token, pod: Facade(memory))
    stop = threading.Event()
    thread = threading.Thread(target=bridge.run_forever, args=(600,), kwargs={"stop": stop.is_set}, daemon=True)
    thread.start()
    try:
        wait_until = time.monotonic() + 10
        while bridge.view.not_synced() and time.monotonic() < wait_until:
            time.sleep(0.05)
        time.sleep(0.5)
        started = time.monotonic()
        cluster.node("gpu-a", cpu="8", memory="64Gi", labels={"lendable": "true", LENDABLE_TO_LABEL: "default"},
                     extra=GPU, ready=True)
        states = []
        while time.monotonic() - started < 5:
            node = cluster.core.read_node("gpu-a")
            states.append(((node.metadata.labels or {}).get(STATE_LABEL),
                           (node.metadata.annotations or {}).get(IDLE_SINCE_ANNOTATION) is not None))
            if states[-1][0] == "lending":
                break
            time.sleep(0.02)
        took = time.monotonic() - started
        assert states[-1][0] == "lending", states
        # Seen idle first (recorded on the Node), lent by the next round.
        assert took < 0.9, (took, states)
    finally:
        stop.set()
        thread.join(timeout=5)
        bridge.view.close()


def test_a_cluster_whose_agent_hangs_does_not_delay_another_policys_lending_and_reclaiming(world):
    """Issue 24, item 2: one policy's broken Slurm must not hold up the
    others. Policy a-slow (decided first, by name) lends to a cluster whose
    agent never answers; policy lend's lend and reclaim still happen at once."""
    import threading
    import time

    cluster, listing, memory = world
    custom = cluster.custom
    custom.create_namespaced_custom_object("slurmk8s.dev", "v1alpha1", "default", "slurmclusters", {
        "apiVersion": "slurmk8s.dev/v1alpha1", "kind": "SlurmCluster", "metadata": {"name": "slow"},
        "spec": {"partitions": [{"name": "gpu", "acceptLentNodes": True}]}})
    cluster.core.create_namespaced_secret("default", {"metadata": {"name": "slow-agent-token"},
                                                      "data": {"token": base64.b64encode(b"s" * 32).decode()}})
    custom.create_namespaced_custom_object("slurmk8s.dev", "v1alpha1", "default", "nodelendingpolicies", {
        "apiVersion": "slurmk8s.dev/v1alpha1", "kind": "NodeLendingPolicy", "metadata": {"name": "a-slow"},
        "spec": {"clusterRef": {"name": "slow"}, "partition": "gpu", "nodeSelector": {"matchLabels": {"pool": "slow"}}}})
    released = threading.Event()

    class Hanging(Facade):
        def nodes(self):
            released.wait(20)  # an agent that accepts and never answers
            raise RuntimeError("no answer")

    def agent(c, token, pod):
        return Hanging(memory) if c.name == "slow" else Facade(memory)

    kube = listing.kube
    bridge = Bridge(kube, agent=agent, clock=lambda: NOW, slurm_timeout=2)
    patched: list[tuple[float, str]] = []
    patch = kube.patch

    def recording(kind, namespace, name, body, **kw):
        patched.append((time.monotonic(), name))
        return patch(kind, namespace, name, body, **kw)

    kube.patch = recording
    try:
        idle_node(cluster, "gpu-a")
        started = time.monotonic()
        report = bridge.round()
        assert not report.failed, report
        first = min(t for t, name in patched if name == "gpu-a")
        assert first - started < 1.0, first - started  # lent at once, not after the hanging agent
        assert cluster.core.read_node("gpu-a").metadata.labels[STATE_LABEL] == "lending"
        # The next rounds do not wait for the agent still hanging at all.
        cluster.report_running("default", "demo-lent.gpu-a")
        memory.register("gpu-a")
        started = time.monotonic()
        bridge.round()
        assert time.monotonic() - started < 1.0
        assert cluster.core.read_node("gpu-a").metadata.labels[STATE_LABEL] == "lent"
        custom.patch_namespaced_custom_object("slurmk8s.dev", "v1alpha1", "default", "nodelendingpolicies",
                                              "lend", {"spec": {"maxLentNodes": 0}})
        started = time.monotonic()
        bridge.round()
        assert time.monotonic() - started < 1.0
        assert STATE_LABEL not in (cluster.core.read_node("gpu-a").metadata.labels or {})
    finally:
        released.set()
        kube.patch = patch
        bridge.close()


# -- a SlurmCluster the bridge cannot load (issue 41, item 1) ---------------------------------

GRACE_PLUS_DEADLINE = 60 + 600  # the policy's defaults: gracePeriodSeconds + reclaim.deadlineSeconds


def _policy_patch(cluster, patch: dict) -> None:
    cluster.custom.patch_namespaced_custom_object("slurmk8s.dev", "v1alpha1", "default", "nodelendingpolicies",
                                                  "lend", patch)


def _invalid(cluster, bridge) -> None:
    # Valid for the schema and its CEL rules, not for the rule the operator and the bridge
    # share (a slurm.conf key outside the extraLines allowlist: a parse no CEL rule states).
    cluster.custom.patch_namespaced_custom_object("slurmk8s.dev", "v1alpha1", "default", "slurmclusters", "demo",
                                                  {"spec": {"slurmConfig": {"extraLines": ["SlurmUser=root"]}}})


def _deleted(cluster, bridge) -> None:
    cluster.custom.delete_namespaced_custom_object("slurmk8s.dev", "v1alpha1", "default", "slurmclusters", "demo")


def _newer_status(cluster, bridge) -> None:
    # A field a newer operator writes in status, which this version does not know.
    read = bridge.view.cluster

    def cluster_with_a_new_field(namespace, name):
        obj = read(namespace, name)
        return obj and {**obj, "status": {**(obj.get("status") or {}), "shardCount": 3}}
    bridge.view.cluster = cluster_with_a_new_field


OWNER_CHANGES = {
    "nothing": lambda cluster: None,
    "withdrawn": lambda cluster: cluster.core.patch_node("gpu-a", {"metadata": {"labels": {LENDABLE_TO_LABEL: None}}}),
    "cordoned": lambda cluster: cluster.core.patch_node("gpu-a", {"spec": {"unschedulable": True}}),
    "policy-deleted": lambda cluster: cluster.custom.delete_namespaced_custom_object(
        "slurmk8s.dev", "v1alpha1", "default", "nodelendingpolicies", "lend"),
    "max-lent-0": lambda cluster: _policy_patch(cluster, {"spec": {"maxLentNodes": 0}}),
}


def _held(cluster, name: str) -> bool:
    node = cluster.core.read_node(name)
    return STATE_LABEL in (node.metadata.labels or {}) or any(t.key == TAINT_KEY for t in node.spec.taints or [])


@pytest.mark.parametrize("change", sorted(OWNER_CHANGES))
@pytest.mark.parametrize("lose", [_invalid, _deleted, _newer_status], ids=["invalid", "deleted", "newer-status"])
def test_a_cluster_the_bridge_cannot_load_gives_its_lent_nodes_back_within_grace_plus_the_deadline(
        world, lose, change):
    """No policy is skipped: whatever makes the SlurmCluster unreadable to
    the bridge, and whatever the owner does meanwhile, the nodes lent to it
    start their reclaim in the first round and are Kubernetes' again by
    gracePeriodSeconds + deadlineSeconds later, on a simulated clock."""
    cluster, bridge, memory = world
    lend_two(cluster, bridge, memory)
    assert _held(cluster, "gpu-a") and _held(cluster, "gpu-b")
    memory.jobs = [Job(job_id=1, name="train", user="u", state="RUNNING", partition="gpu", nodes="gpu-a",
                       requeue=True, restart_count=0, reason="")]
    idle_node(cluster, "gpu-c")  # idle and lendable: nothing may be lent to that cluster now
    lose(cluster, bridge)
    OWNER_CHANGES[change](cluster)
    now = [NOW + timedelta(seconds=1)]
    bridge.clock = lambda: now[0]
    report = bridge.round()
    assert not report.errors, report.errors
    states = {n: (cluster.core.read_node(n).metadata.labels or {}).get(STATE_LABEL) for n in ("gpu-a", "gpu-b")}
    assert all(s in ("reclaiming", None) for s in states.values()), states
    now[0] += timedelta(seconds=GRACE_PLUS_DEADLINE - 1)
    bridge.round()
    now[0] += timedelta(seconds=1)
    report = bridge.round()
    assert not report.errors, report.errors
    assert not _held(cluster, "gpu-a") and not _held(cluster, "gpu-b")
    assert not _held(cluster, "gpu-c")
    assert {p.metadata.name for p in cluster.core.list_namespaced_pod("default").items
            if p.metadata.deletion_timestamp is None} & {"demo-lent.gpu-a", "demo-lent.gpu-b", "demo-lent.gpu-c"} == set()


@pytest.mark.parametrize("status,lasting", [(403, True), (400, True), (503, False), (429, False)])
def test_a_cluster_the_api_server_will_not_show_is_decided_not_skipped(world, status, lasting):
    """A refused read (403) is as good as an invalid cluster: the nodes go
    back. One that may pass (503, 429) is Slurm unknown: the nodes stay, but
    not from their owner, and nothing is lent."""
    from slurmk8s.kube import ApiError

    cluster, bridge, memory = world
    lend_two(cluster, bridge, memory)
    get = bridge.kube.get

    def refusing(kind, namespace, name):
        if kind == "SlurmCluster":
            raise ApiError("GET", f"/slurmclusters/{name}", status, "Refused", "no")
        return get(kind, namespace, name)
    bridge.kube.get = refusing
    idle_node(cluster, "gpu-c")
    cluster.core.patch_node("gpu-b", {"spec": {"unschedulable": True}})
    report = bridge.round()
    assert not report.errors, report.errors
    states = {n: (cluster.core.read_node(n).metadata.labels or {}).get(STATE_LABEL) for n in ("gpu-a", "gpu-b")}
    assert states == {"gpu-a": "reclaiming" if lasting else "lent", "gpu-b": "reclaiming"}
    assert not _held(cluster, "gpu-c")
    condition = cluster.custom.get_namespaced_custom_object(
        "slurmk8s.dev", "v1alpha1", "default", "nodelendingpolicies", "lend")["status"]["conditions"][0]
    assert condition["reason"] == "ClusterUnreadable" and str(status) in condition["message"]


def test_the_bridge_loads_a_cluster_by_the_operators_rule_with_the_operators_trusted_repositories(world):
    """The issue's case: with cgroups and the site's own registry the
    operator (and its webhook) accept the cluster; the bridge, given the same
    trusted repositories, reads it too. Without them it finds the cluster
    invalid, says so, and takes the nodes back rather than keep them."""
    from slurmk8s.api import load_cluster
    from slurmk8s.api.cluster import PROJECT_REPOSITORY
    from slurmk8s.operator.webhook import refusal

    cluster, bridge, memory = world
    lend_two(cluster, bridge, memory)
    mirror = "registry.example.org/hpc"
    cluster.custom.patch_namespaced_custom_object("slurmk8s.dev", "v1alpha1", "default", "slurmclusters", "demo", {
        "spec": {"slurmConfig": {"cgroups": True}, "slurm": {"image": {"repository": mirror}},
                 "partitions": [{"name": "gpu", "acceptLentNodes": False}]}})
    obj = cluster.custom.get_namespaced_custom_object("slurmk8s.dev", "v1alpha1", "default", "slurmclusters", "demo")
    trusted = (PROJECT_REPOSITORY, mirror)
    assert load_cluster(obj, trusted_repositories=trusted)  # the operator runs it
    assert refusal("SlurmCluster", "CREATE", obj, None, trusted_repositories=trusted) is None  # its webhook too
    one_rule = Bridge(bridge.kube, agent=bridge.agent, clock=lambda: NOW, trusted_repositories=trusted)
    report = one_rule.round()
    assert not report.errors, report.errors
    condition = cluster.custom.get_namespaced_custom_object(
        "slurmk8s.dev", "v1alpha1", "default", "nodelendingpolicies", "lend")["status"]["conditions"][0]
    assert condition["reason"] == "PartitionNotLendable", condition
    # A bridge told less than the operator: the cluster is invalid to it, and its nodes go back.
    report = bridge.round()
    assert not report.errors, report.errors
    condition = cluster.custom.get_namespaced_custom_object(
        "slurmk8s.dev", "v1alpha1", "default", "nodelendingpolicies", "lend")["status"]["conditions"][0]
    assert condition["reason"] == "ClusterUnreadable" and "spec.slurm.image.repository" in condition["message"]
    assert {(cluster.core.read_node(n).metadata.labels or {}).get(STATE_LABEL) for n in ("gpu-a", "gpu-b")} == {
        "reclaiming"}


def test_a_policy_the_bridge_cannot_load_gives_its_nodes_back_as_a_deleted_one(world):
    """The sibling on the policy's side: a NodeLendingPolicy that no longer
    loads (a field of a newer version, a rule an upgrade tightened) says so
    in its status, and its nodes go back as a deleted policy's would."""
    cluster, bridge, memory = world
    lend_two(cluster, bridge, memory)
    listed = bridge.view.policies

    def with_a_new_field():
        return [{**p, "spec": {**p["spec"], "preemptible": True}} for p in listed()]
    bridge.view.policies = with_a_new_field
    report = bridge.round()
    assert not report.errors, report.errors
    assert [(a.node, a.reason) for a in report.applied if type(a).__name__ == "SetLendingState"] == [
        ("gpu-a", "policy-gone"), ("gpu-b", "policy-gone")]
    assert not _held(cluster, "gpu-a") and not _held(cluster, "gpu-b")  # idle in Slurm: back at once
    condition = cluster.custom.get_namespaced_custom_object(
        "slurmk8s.dev", "v1alpha1", "default", "nodelendingpolicies", "lend")["status"]["conditions"][0]
    assert condition["reason"] == "InvalidPolicy" and "spec.preemptible" in condition["message"]


SPOILED_RECORDS = {
    # the policy cannot be told, its SlurmCluster can: that Slurm is asked
    "policy-not-a-key": {"metadata": {"annotations": {"slurmk8s.dev/lending-policy": "lend"}}},
    # neither can be told: no Slurm, the lent pod found by its name on the node
    "no-cluster": {"metadata": {"annotations": {"slurmk8s.dev/lending-cluster": None}}},
    # only the taint is left
    "taint-only": {"metadata": {"labels": {STATE_LABEL: None}, "annotations": {
        "slurmk8s.dev/lending-policy": None, "slurmk8s.dev/lending-cluster": None}}},
    # a state this version does not know: the policy takes it back
    "unknown-state": {"metadata": {"labels": {STATE_LABEL: "borrowed"}}},
}


@pytest.mark.parametrize("namespaces", [(), ("default",)], ids=["all-namespaces", "one-namespace"])
@pytest.mark.parametrize("spoil", sorted(SPOILED_RECORDS))
def test_a_lent_node_whose_record_no_policy_can_read_goes_back_within_grace_plus_the_deadline(
        world, spoil, namespaces):
    """Issue 41: anyone with patch on a Node can make its lending record name
    no policy or SlurmCluster (or a state this version does not know); the
    node is taken back all the same, untainted and its lent slurmd pod
    deleted, by gracePeriodSeconds + deadlineSeconds (the defaults), while
    the policy keeps its other node."""
    cluster, bridge, memory = world
    bridge = Bridge(bridge.kube, agent=bridge.agent, clock=bridge.clock, namespaces=namespaces)
    lend_two(cluster, bridge, memory)
    memory.jobs = [Job(job_id=1, name="train", user="u", state="RUNNING", partition="gpu", nodes="gpu-a",
                       requeue=True, restart_count=0, reason="")]
    cluster.core.patch_node("gpu-a", SPOILED_RECORDS[spoil])
    now = [NOW + timedelta(seconds=1)]
    bridge.clock = lambda: now[0]
    report = bridge.round()
    assert not report.errors and not report.failed, report
    assert [(a.node, a.reason) for a in report.applied if type(a).__name__ == "SetLendingState"] == [
        ("gpu-a", "record-unreadable")]
    now[0] += timedelta(seconds=GRACE_PLUS_DEADLINE)
    report = bridge.round()
    assert not report.errors and not report.failed, report
    assert not _held(cluster, "gpu-a")
    assert "demo-lent.gpu-a" not in {p.metadata.name for p in cluster.core.list_namespaced_pod("default").items
                                     if p.metadata.deletion_timestamp is None}
    assert (cluster.core.read_node("gpu-b").metadata.labels or {}).get(STATE_LABEL) == "lent"
    asked = {c[0] for c in memory.calls if c[1:2] == ("gpu-a",)}
    assert ("drain" in asked) == (spoil in ("policy-not-a-key", "unknown-state")), memory.calls


def test_a_lent_pod_running_a_job_has_a_budget_that_refuses_its_eviction_until_the_job_is_gone(world):
    """Issue 44, item 4 (decision record 49): the round creates the lent pod's
    PodDisruptionBudget (owned by the pod, selecting it alone) once Slurm runs a job
    there; an eviction (what kubectl drain sends) is refused with 429; once the job is
    gone the budget goes and the eviction passes."""
    from kubernetes.client.rest import ApiException

    from .apiserver.conftest import wait_for

    cluster, bridge, memory = world
    lend_two(cluster, bridge, memory)
    pod = cluster.core.read_namespaced_pod("demo-lent.gpu-a", "default")
    bridge.round()
    assert not cluster.policy.list_namespaced_pod_disruption_budget("default").items  # idle: none
    memory.jobs = [Job(job_id=1, name="train", user="u", state="RUNNING", partition="gpu", nodes="gpu-a",
                       requeue=True, restart_count=0, reason="")]
    report = bridge.round()
    assert not report.failed, report
    budgets = cluster.policy.list_namespaced_pod_disruption_budget("default").items
    assert [b.metadata.name for b in budgets] == ["demo-lent.gpu-a"]  # gpu-b runs no job: none
    budget = budgets[0]
    assert [(o.kind, o.name, o.uid) for o in budget.metadata.owner_references] == [("Pod", pod.metadata.name,
                                                                                     pod.metadata.uid)]
    assert budget.spec.max_unavailable == 0
    selected = [p.metadata.name for p in cluster.core.list_namespaced_pod(
        "default", label_selector=",".join(f"{k}={v}" for k, v in budget.spec.selector.match_labels.items())).items]
    assert selected == ["demo-lent.gpu-a"]
    assert not bridge.round().applied  # kept, not made again
    wait_for("the budget's status", lambda: (s := cluster.policy.read_namespaced_pod_disruption_budget(
        "demo-lent.gpu-a", "default").status).observed_generation == 1 and s.expected_pods == 1)
    eviction = {"metadata": {"name": "demo-lent.gpu-a", "namespace": "default"}}
    with pytest.raises(ApiException) as refused:
        cluster.core.create_namespaced_pod_eviction("demo-lent.gpu-a", "default", eviction)
    assert refused.value.status == 429
    memory.jobs = []
    report = bridge.round()
    assert [type(a).__name__ for a in report.applied] == ["DeleteBudget"], report
    assert not cluster.policy.list_namespaced_pod_disruption_budget("default").items
    cluster.core.create_namespaced_pod_eviction("demo-lent.gpu-a", "default", eviction)
    assert cluster.core.read_namespaced_pod("demo-lent.gpu-a", "default").metadata.deletion_timestamp
