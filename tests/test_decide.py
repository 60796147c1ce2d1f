"""The lending decision, transition by transition and guard by guard.

Over 500 lines because it goes through every transition and guard of the lending
decision, one short case each.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from slurmk8s.bridge import actions as A
from slurmk8s.bridge.decide import (
    DEFAULT_RECLAIM,
    FORCE_RETRY_SECONDS,
    REASONS,
    decide,
    lending_metrics,
    orphaned_policies,
)
from slurmk8s.bridge.nodestate import (
    CLUSTER_ANNOTATION,
    COMPONENT_LABEL,
    FORCED_ANNOTATION,
    HEALTH_FAILED_ANNOTATION,
    IDLE_SINCE_ANNOTATION,
    LENDING,
    LENT,
    PARTITION_ANNOTATION,
    POLICY_ANNOTATION,
    REASON_ANNOTATION,
    RECLAIMING,
    SIGNALLED_ANNOTATION,
    SINCE_ANNOTATION,
    SLURMD_COMPONENT,
    STATE_LABEL,
    TAINT_EFFECT,
    TAINT_KEY,
    format_time,
    parse_time,
)
from slurmk8s.bridge.observed import (
    InvalidPolicy,
    KubeNode,
    KubePod,
    NodeTaint,
    PolicyGone,
    Unattributed,
    UnreadableCluster,
    pod_from_api,
)
from slurmk8s.render.lent import lent_node
from slurmk8s.render.manifests import lent_slurmd_pod
from slurmk8s.render.names import lent_slurmd

from .lending_sim import (
    ALLOCATABLE,
    GPU_LABELS,
    T0,
    World,
    cluster,
    gpu_node,
    gpu_pod,
    job,
    policy,
    settle,
    slurm_node,
)

POLICY = policy()
IDLE = {IDLE_SINCE_ANNOTATION: format_time(T0 - timedelta(seconds=600))}


def kinds(actions) -> list[str]:
    """Action names in order, reports left out."""
    return [type(a).__name__ for a in actions if not isinstance(a, (A.Event, A.PolicyStatus))]


def of(actions, kind):
    return [a for a in actions if isinstance(a, kind)]


def only(actions, kind):
    found = of(actions, kind)
    assert len(found) == 1, (kind.__name__, actions)
    return found[0]


def events(actions) -> list[tuple[str, str]]:
    return [(e.name, e.reason) for e in of(actions, A.Event)]


def status(actions):
    return only(actions, A.PolicyStatus).status


def held_node(name: str, state: str, *, since=T0 - timedelta(seconds=300), taint=True, key=POLICY.key,
              labels=GPU_LABELS, **annotations) -> KubeNode:
    ann = {POLICY_ANNOTATION: key, CLUSTER_ANNOTATION: "hpc/demo", PARTITION_ANNOTATION: "gpu",
           SINCE_ANNOTATION: format_time(since), **annotations}
    return gpu_node(name, labels={**labels, STATE_LABEL: state}, annotations=ann,
                    taints=(NodeTaint(TAINT_KEY, "demo", TAINT_EFFECT),) if taint else ())


def slurmd(node: str, phase: str = "Running", **kw) -> KubePod:
    return KubePod("hpc", lent_slurmd("demo", node), node=node, phase=phase, gpus=8,
                   labels={COMPONENT_LABEL: SLURMD_COMPONENT}, **kw)


def lent_world(*names: str, jobs=(), pods=(), **kw) -> World:
    """Nodes lent and registered, with their slurmd pods running."""
    return World.of(nodes=[held_node(n, LENT) for n in names],
                    pods=[*(slurmd(n) for n in names), *pods],
                    snodes=[slurm_node(n, state="mixed" if any(n in j.nodes for j in jobs) else "idle")
                            for n in names],
                    jobs=jobs, **kw)


def reclaiming_node(name: str, reason: str = "demand", signalled=None, forced=None) -> KubeNode:
    ann = {REASON_ANNOTATION: reason}
    if signalled is not None:
        ann[SIGNALLED_ANNOTATION] = format_time(signalled)
    if forced is not None:
        ann[FORCED_ANNOTATION] = format_time(forced)
    return held_node(name, RECLAIMING, **ann)


def drained(s):
    return replace(s, flags=s.flags | {"DRAIN"}, reason="slurmk8s: reclaimed by Kubernetes (demand)")


# -- Kubernetes: idle bookkeeping ---------------------------------------------------------


def test_a_node_first_seen_idle_gets_idle_since_and_is_not_lent_yet():
    w = World.of(nodes=[gpu_node("n1")])
    acts = w.decide(policy(idleAfterSeconds=0), T0)
    assert kinds(acts) == ["RecordIdleSince"]
    assert only(acts, A.RecordIdleSince) == A.RecordIdleSince("n1", T0)


@pytest.mark.parametrize("pod,idle", [
    (gpu_pod("train", "n1"), False),
    (gpu_pod("plugin", "n1", owner_kind="DaemonSet"), True),    # DaemonSets do not count
    (gpu_pod("done", "n1", phase="Succeeded"), True),            # finished pods hold nothing
    (gpu_pod("web", "n1", gpus=0), True),                        # CPU-only pods do not count
    (gpu_pod("ending", "n1", deleting=True), False),             # still there until gone
])
def test_what_makes_a_node_busy(pod, idle):
    w = World.of(nodes=[gpu_node("n1")], pods=[pod])
    assert (kinds(w.decide(POLICY, T0)) == ["RecordIdleSince"]) is idle


def forged(name: str, node: str | None, namespace: str = "tenant", **kw) -> KubePod:
    """A pod a tenant labels as if it were the bridge's lent slurmd."""
    return gpu_pod(name, node, namespace=namespace, labels={COMPONENT_LABEL: SLURMD_COMPONENT}, **kw)


@pytest.mark.parametrize("pod", [
    forged("fake", "n1", gpus=0),                                     # another namespace, no GPU
    forged(lent_slurmd("demo", "n1"), "n1", gpus=0),                  # the exact name, elsewhere
    forged("fake", "n1", namespace="hpc", gpus=0),                    # the policy's namespace, another name
    forged(lent_slurmd("other", "n1"), "n1", namespace="hpc", gpus=0),  # another cluster's name
    forged(lent_slurmd("demo", "n2"), "n1", namespace="hpc", gpus=0),   # another node's name
])
def test_a_pod_labelled_lent_slurmd_by_a_tenant_does_not_keep_a_node_from_being_lent(pod):
    w = World.of(nodes=[gpu_node("n1", annotations=IDLE)], pods=[pod])
    assert kinds(w.decide(POLICY, T0)) == ["SetLendingState", "Taint", "CreateSlurmdPod"]


def test_the_bridges_own_slurmd_pod_keeps_its_node_from_being_lent_again():
    w = World.of(nodes=[gpu_node("n1", annotations=IDLE)], pods=[slurmd("n1", phase="Failed")])
    assert kinds(w.decide(POLICY, T0)) == []


@pytest.mark.parametrize("namespace", ["tenant", "hpc"])
def test_a_pending_gpu_pod_labelled_lent_slurmd_still_takes_a_node_back(namespace):
    w = lent_world("n1", pods=[forged(lent_slurmd("demo", "n2"), None, namespace=namespace, gpus=8)])
    acts = w.decide(POLICY, T0)
    assert [(a.node, a.reason) for a in of(acts, A.SetLendingState)] == [("n1", "demand")]


def test_a_running_gpu_pod_labelled_lent_slurmd_holds_its_gpus():
    """Its GPUs are not free for a pending pod: a lent node is taken back for it."""
    k = gpu_node("k1", annotations=IDLE)
    w = lent_world("n1", pods=[forged("fake", "k1", gpus=8), gpu_pod("want", None, gpus=8)])
    w.nodes["k1"] = k
    acts = w.decide(POLICY, T0)
    assert [(a.node, a.reason) for a in of(acts, A.SetLendingState)] == [("n1", "demand")]


def test_a_gpu_pod_clears_idle_since():
    w = World.of(nodes=[gpu_node("n1", annotations=IDLE)], pods=[gpu_pod("train", "n1")])
    assert kinds(w.decide(POLICY, T0)) == ["ClearIdleSince"]


# -- Kubernetes -> lending -----------------------------------------------------------------


def test_an_idle_node_is_lent_after_idle_after_seconds_and_not_before():
    since = T0
    w = World.of(nodes=[gpu_node("n1", annotations={IDLE_SINCE_ANNOTATION: format_time(since)})])
    idle_after = POLICY.spec.idle_after_seconds
    assert kinds(w.decide(POLICY, since + timedelta(seconds=idle_after - 1))) == []
    assert kinds(w.decide(POLICY, since + timedelta(seconds=idle_after))) == []
    now = since + timedelta(seconds=idle_after, milliseconds=1)
    acts = w.decide(POLICY, now)
    assert kinds(acts) == ["SetLendingState", "Taint", "CreateSlurmdPod"]
    assert only(acts, A.SetLendingState) == A.SetLendingState("n1", LENDING, "hpc/lend", "hpc/demo", "gpu", now)
    assert only(acts, A.Taint) == A.Taint("n1", TAINT_KEY, "demo", TAINT_EFFECT)
    create = only(acts, A.CreateSlurmdPod)
    # No pod on the node: all of its allocatable is lent.
    assert create == A.CreateSlurmdPod("hpc/demo", "n1", "gpu", POLICY.spec.shm_size, resources=(
        ("cpu", "32000m"), ("memory", str(256 * 2**30)), ("nvidia.com/gpu", "8")))
    # The renderer makes the pod from the action and the Node; the bridge finds what it makes.
    obj = lent_slurmd_pod(cluster(), "", node=create.node, resources=dict(create.resources), labels=GPU_LABELS,
                          partition=create.partition, shm_size=create.shm_size, taint_key=TAINT_KEY)
    pod = pod_from_api(obj)
    desc = lent_node("demo", "n1", ALLOCATABLE, GPU_LABELS, "gpu")
    assert (pod.namespace, pod.name, pod.node, pod.gpus) == ("hpc", lent_slurmd("demo", "n1"), "n1", desc.gpus)
    env = {e["name"]: e["value"] for e in obj["spec"]["containers"][0]["env"]}
    assert (env["SLURMK8S_NODE_NAME"], env["SLURMK8S_NODE_CONF"], env["SLURMK8S_GRES_CONF"]) == (
        "n1", desc.conf, desc.gres_conf)
    assert pod.labels[COMPONENT_LABEL] == SLURMD_COMPONENT
    assert events(acts) == [("n1", "Lending")]


def test_idle_after_zero_lends_one_round_after_the_node_is_first_seen_idle():
    pol = policy(idleAfterSeconds=0)
    w = World.of(nodes=[gpu_node("n1")])
    first = w.decide(pol, T0)
    assert "RecordIdleSince" in kinds(first) and "SetLendingState" not in kinds(first)
    w.apply(first)
    # The next round lends, however soon it comes: the idle time is on the Node.
    assert "SetLendingState" in kinds(w.decide(pol, T0 + timedelta(milliseconds=50)))


def test_idle_time_counts_to_the_millisecond():
    pol = policy(idleAfterSeconds=30)
    w = World.of(nodes=[gpu_node("n1")])
    since = T0 + timedelta(milliseconds=900)
    w.apply(w.decide(pol, since))
    assert kinds(w.decide(pol, since + timedelta(seconds=29, milliseconds=950))) == []
    assert kinds(w.decide(pol, since + timedelta(seconds=30))) == []
    assert "SetLendingState" in kinds(w.decide(pol, since + timedelta(seconds=30, milliseconds=1)))


def test_the_longest_idle_node_is_lent_first():
    w = World.of(nodes=[
        gpu_node("a", annotations={IDLE_SINCE_ANNOTATION: format_time(T0 - timedelta(seconds=200))}),
        gpu_node("b", annotations={IDLE_SINCE_ANNOTATION: format_time(T0 - timedelta(seconds=900))}),
    ])
    acts = w.decide(policy(maxLentNodes=1), T0)
    assert [a.node for a in of(acts, A.SetLendingState)] == ["b"]


@pytest.mark.parametrize("change,reason", [
    (dict(ready=False), "not Ready"),
    (dict(unschedulable=True), "cordoned"),
    (dict(labels={"other": "x"}), "not selected"),
    (dict(allocatable={"cpu": "8", "memory": "8Gi"}), "no GPUs"),
    (dict(taints=(NodeTaint(TAINT_KEY, "other", TAINT_EFFECT),)), "carries the lending taint: no policy holds it"),
])
def test_nodes_that_are_not_lent(change, reason):
    w = World.of(nodes=[replace(gpu_node("n1", annotations=IDLE), **change)])
    assert "SetLendingState" not in kinds(w.decide(POLICY, T0)), reason


def test_a_lent_node_that_fails_a_health_check_is_taken_back_gracefully_and_not_lent_again():
    """The health check drained it ('slurmk8s: health: gpus'): the bridge takes
    it back with the policy's signal and grace period, marks the Node with the
    check it failed, and lends it no more until someone removes the mark."""
    w = lent_world("n1", jobs=[job(1, "n1")])
    w.snodes["n1"] = replace(w.snodes["n1"], flags=w.snodes["n1"].flags | {"DRAIN"},
                             reason="slurmk8s: health: gpus")
    acts = w.decide(POLICY, T0)
    assert [a.reason for a in of(acts, A.SetLendingState)] == ["unhealthy"]
    assert only(acts, A.RecordHealthFailed) == A.RecordHealthFailed("n1", "gpus")
    assert of(acts, A.Signal), "a graceful reclaim: the jobs get their signal"
    w = World.of(nodes=[gpu_node("n1", annotations={**IDLE, HEALTH_FAILED_ANNOTATION: "gpus"})])
    acts = w.decide(policy(idleAfterSeconds=0), T0)
    assert "SetLendingState" not in kinds(acts)
    ready = next(c for c in status(acts).conditions if c.type == "Ready")
    assert "cannot be lent: n1 (failed its gpus health check while lent" in ready.message, ready.message
    w = World.of(nodes=[gpu_node("n1", annotations=IDLE)])
    assert "SetLendingState" in kinds(w.decide(policy(idleAfterSeconds=0), T0))  # the mark removed: lent again


# -- who may lend which nodes (decision record 15) ---------------------------------------


def _unlabelled(**labels) -> dict:
    return {k: v for k, v in {**GPU_LABELS, **labels}.items() if v is not None}


@pytest.mark.parametrize("lendable_to", [None, "other", "", "hpc-x"])
def test_a_node_not_lendable_to_the_policys_namespace_is_never_lent(lendable_to):
    """The policy's selector matches, but the node's owner did not name this
    namespace in slurmk8s.dev/lendable-to: a namespace admin cannot take it."""
    w = World.of(nodes=[gpu_node("mine", annotations=IDLE),
                        gpu_node("theirs", annotations=IDLE,
                                 labels=_unlabelled(**{"slurmk8s.dev/lendable-to": lendable_to}))])
    acts = w.decide(policy(idleAfterSeconds=0), T0)
    assert [a.node for a in of(acts, A.SetLendingState)] == ["mine"]
    assert [a.node for a in of(acts, A.CreateSlurmdPod)] == ["mine"]
    assert status(acts).counts.selected == 1


def test_a_selector_that_matches_every_node_still_lends_only_the_nodes_lendable_to_the_namespace():
    """Defence in depth: the validator refuses a selector of DoesNotExist
    alone, and a policy that got past it would still lend no other node."""
    from slurmk8s.api.lending import NodeLendingPolicy
    doc = policy().model_dump(by_alias=True, exclude_none=True)
    doc["spec"]["nodeSelector"] = {"matchExpressions": [{"key": "no.such/label", "operator": "DoesNotExist"}]}
    everything = NodeLendingPolicy.model_validate(doc)
    w = World.of(nodes=[gpu_node("mine", annotations=IDLE),
                        gpu_node("theirs", annotations=IDLE, labels={"nvidia.com/gpu.product": "NVIDIA-H100-80GB"}),
                        gpu_node("team-b", annotations=IDLE,
                                 labels=_unlabelled(**{"slurmk8s.dev/lendable-to": "team-b"}))])
    assert [a.node for a in of(w.decide(everything, T0), A.SetLendingState)] == ["mine"]


def test_a_policy_in_another_namespace_lends_only_the_nodes_labelled_for_it():
    pol = policy(namespace="team-b")
    w = World.of(nodes=[gpu_node("hpc-node", annotations=IDLE),
                        gpu_node("b-node", annotations=IDLE,
                                 labels=_unlabelled(**{"slurmk8s.dev/lendable-to": "team-b"}))],
                 cluster=cluster(namespace="team-b"))
    assert [a.node for a in of(w.decide(pol, T0), A.SetLendingState)] == ["b-node"]


@pytest.mark.parametrize("lendable_to", [None, "other"])
def test_a_lent_node_whose_owner_withdraws_it_is_taken_back_gracefully(lendable_to):
    """Removing or changing the label takes the node back with the policy's
    signal and grace period, even while the policy has a problem (here it
    then selects nothing): the owner's word is not the policy's to hold."""
    w = lent_world("n1", jobs=[job(1, "n1")])
    w.nodes["n1"] = replace(w.nodes["n1"], labels={**_unlabelled(**{"slurmk8s.dev/lendable-to": lendable_to}),
                                                   STATE_LABEL: LENT})
    acts = w.decide(POLICY, T0)
    assert only(acts, A.SetLendingState).reason == "withdrawn"
    assert only(acts, A.Signal).job_ids == (1,)
    assert not of(acts, A.SetDown) and not of(acts, A.Requeue)
    assert "slurmk8s.dev/lendable-to" in REASONS["withdrawn"]
    cond = status(acts).conditions[0]
    assert (cond.status, cond.reason) == ("False", "NoMatchingNodes")


def test_no_matching_nodes_says_which_label_the_nodes_lack():
    w = World.of(nodes=[gpu_node("n1", labels=_unlabelled(**{"slurmk8s.dev/lendable-to": None}))])
    cond = status(w.decide(POLICY, T0)).conditions[0]
    assert (cond.status, cond.reason) == ("False", "NoMatchingNodes")
    assert "slurmk8s.dev/lendable-to=hpc" in cond.message and "1 GPU node" in cond.message


def test_a_node_held_by_another_policy_is_left_alone():
    w = World.of(nodes=[held_node("n1", LENT, key="hpc/other")], pods=[gpu_pod("want", None, gpus=8)])
    acts = w.decide(POLICY, T0)
    assert kinds(acts) == []
    assert status(acts).counts.selected == 1 and status(acts).counts.kubernetes == 0


def test_min_kubernetes_nodes_are_kept():
    nodes = [gpu_node(f"n{i}", annotations=IDLE) for i in range(4)]
    acts = World.of(nodes=nodes).decide(policy(minKubernetesNodes=3), T0)
    assert len(of(acts, A.SetLendingState)) == 1
    assert status(acts).counts.kubernetes == 3 and status(acts).counts.lending == 1


def test_max_lent_nodes_counts_the_nodes_already_lent():
    nodes = [gpu_node(f"n{i}", annotations=IDLE) for i in range(4)]
    w = lent_world("lent1")
    for n in nodes:
        w.nodes[n.name] = n
    acts = w.decide(policy(maxLentNodes=2), T0)
    assert len(of(acts, A.SetLendingState)) == 1
    assert status(acts).counts.lent == 1 and status(acts).counts.lending == 1


def test_nothing_is_lent_outside_the_windows():
    pol = policy(windows=[{"days": ["Mon"], "start": "18:00", "end": "06:00"}], timeZone="Europe/Berlin")
    w = World.of(nodes=[gpu_node("n1", annotations=IDLE)])
    assert kinds(w.decide(pol, T0)) == []               # Monday 13:00 in Berlin
    assert "SetLendingState" in kinds(w.decide(pol, T0.replace(hour=20)))   # 21:00 in Berlin
    assert "outside the lending windows" in status(w.decide(pol, T0)).conditions[0].message


def test_a_node_slurm_already_knows_is_not_lent():
    foreign = replace(slurm_node("n1"), features=("gpu",))  # a node set's node, not a lent one
    w = World.of(nodes=[gpu_node("n1", annotations=IDLE)], snodes=[foreign])
    acts = w.decide(POLICY, T0)
    assert kinds(acts) == []
    assert "n1 (Slurm already has a node of that name)" in status(acts).conditions[0].message


def test_a_node_that_cannot_be_described_to_slurm_is_not_lent_and_is_reported():
    w = World.of(nodes=[gpu_node("n1", annotations=IDLE, allocatable={**ALLOCATABLE, "cpu": "100m"})])
    acts = w.decide(POLICY, T0)
    assert kinds(acts) == []
    assert "cannot be lent: n1" in status(acts).conditions[0].message


def test_a_node_that_cannot_be_described_is_reported_whether_or_not_maxlentnodes_is_reached():
    """A DaemonSet pod holds all of n1's GPUs (n1 counts as idle, and idle longer than n0):
    with maxLentNodes 1, n0 is lent. n1 is reported as it cannot be lent, both in the round
    that lends n0 and in the next one, which must then have nothing to write."""
    later = {IDLE_SINCE_ANNOTATION: format_time(T0 - timedelta(seconds=300))}
    w = World.of(nodes=[gpu_node("n0", annotations=later), gpu_node("n1", annotations=IDLE)],
                 pods=[gpu_pod("plugin", "n1", gpus=8, owner_kind="DaemonSet")])
    pol = policy(maxLentNodes=1)
    first = w.decide(pol, T0)
    assert [a.node for a in first if isinstance(a, A.SetLendingState)] == ["n0"]
    assert "cannot be lent: n1 (" in status(first).conditions[0].message
    w.apply(first)
    assert w.decide(pol, T0) == []


def test_a_node_a_pending_pod_can_take_is_not_lent():
    w = World.of(nodes=[gpu_node("n1", annotations=IDLE)], pods=[gpu_pod("want", None, gpus=8)])
    assert "SetLendingState" not in kinds(w.decide(POLICY, T0))


def test_a_leftover_lent_slurm_node_is_removed_before_the_node_is_lent_again():
    w = World.of(nodes=[gpu_node("n1", annotations=IDLE)], snodes=[slurm_node("n1", state="down")])
    assert kinds(w.decide(POLICY, T0)) == ["DeleteNode", "SetLendingState", "Taint", "CreateSlurmdPod"]


# -- lending -> lent ---------------------------------------------------------------------------


def test_a_lending_node_becomes_lent_when_slurm_has_it_in_the_partition():
    w = World.of(nodes=[held_node("n1", LENDING)], pods=[slurmd("n1")], snodes=[slurm_node("n1")])
    acts = w.decide(POLICY, T0)
    assert kinds(acts) == ["SetLendingState"]
    assert only(acts, A.SetLendingState).state == LENT
    assert events(acts) == [("n1", "Lent")]


@pytest.mark.parametrize("pod,snode", [
    (slurmd("n1", phase="Pending"), None),
    (slurmd("n1"), None),
    (slurmd("n1"), slurm_node("n1", partition="cpu")),
    (slurmd("n1"), slurm_node("n1", flags={"NOT_RESPONDING"})),
    (slurmd("n1"), slurm_node("n1", state="unknown")),
])
def test_a_lending_node_waits_until_registered(pod, snode):
    w = World.of(nodes=[held_node("n1", LENDING)], pods=[pod], snodes=[snode] if snode else [])
    assert kinds(w.decide(POLICY, T0)) == []


def test_a_lending_node_gets_its_taint_and_pod_back_after_a_crash():
    w = World.of(nodes=[held_node("n1", LENDING, taint=False)])
    assert kinds(w.decide(POLICY, T0)) == ["Taint", "CreateSlurmdPod"]


@pytest.mark.parametrize("pods,snodes,since,reason", [
    ([slurmd("n1", phase="Failed")], [], T0, "slurmd-lost"),
    ([slurmd("n1", deleting=True)], [], T0, "slurmd-lost"),
    ([], [slurm_node("n1")], T0, "slurmd-lost"),
    ([slurmd("n1")], [], T0 - timedelta(seconds=601), "registration-timeout"),
])
def test_a_lending_node_that_fails_goes_back_to_kubernetes(pods, snodes, since, reason):
    w = World.of(nodes=[held_node("n1", LENDING, since=since)], pods=pods, snodes=snodes)
    acts = w.decide(POLICY, T0)
    assert only(acts, A.SetLendingState).reason == reason
    assert ("n1", "Reclaiming") in events(acts) and ("n1", "Returned") in events(acts)
    done = kinds(acts)
    assert done.index("Untaint") + 1 == done.index("ClearLending")
    assert not of(acts, A.Signal)


# -- lent -> reclaiming: triggers ---------------------------------------------------------------


def test_a_pending_gpu_pod_takes_back_the_idle_node_before_busy_ones():
    jobs = [job(1, "busy1"), job(2, "busy2"), job(3, "busy2")]
    w = lent_world("busy1", "busy2", "idle", jobs=jobs, pods=[gpu_pod("want", None, gpus=8)])
    acts = w.decide(POLICY, T0)
    assert [(a.node, a.reason) for a in of(acts, A.SetLendingState)] == [("idle", "demand")]


def test_then_the_node_with_the_fewest_jobs():
    jobs = [job(1, "one"), job(2, "two"), job(3, "two")]
    w = lent_world("one", "two", jobs=jobs, pods=[gpu_pod("want", None, gpus=8)])
    assert [a.node for a in of(w.decide(POLICY, T0), A.SetLendingState)] == ["one"]


def test_as_few_nodes_as_cover_the_demand():
    pods = [gpu_pod(f"want{i}", None, gpus=4) for i in range(3)]   # 12 GPUs: two 8-GPU nodes
    w = lent_world("a", "b", "c", "d", pods=pods)
    assert len(of(w.decide(POLICY, T0), A.SetLendingState)) == 2


def test_a_pending_pod_that_a_free_kubernetes_node_can_take_reclaims_nothing():
    w = lent_world("lent1", pods=[gpu_pod("want", None, gpus=4)])
    w.nodes["free"] = gpu_node("free")
    assert "SetLendingState" not in kinds(w.decide(POLICY, T0))


def test_nodes_already_on_their_way_back_count_towards_the_demand():
    w = lent_world("lent1", pods=[gpu_pod("want", None, gpus=8)])
    w.nodes["back"] = reclaiming_node("back", signalled=T0)
    w.snodes["back"] = drained(slurm_node("back", state="mixed"))
    w.jobs[7] = job(7, "back")
    w.pods[("hpc", lent_slurmd("demo", "back"))] = slurmd("back")
    assert of(w.decide(POLICY, T0), A.SetLendingState) == []


@pytest.mark.parametrize("pod,triggers", [
    (gpu_pod("want", None, gpus=8), True),
    (gpu_pod("want", None, gpus=8, unschedulable=False), False),       # the scheduler has not given up
    (gpu_pod("want", None, gpus=0), False),                            # no GPU
    (gpu_pod("want", None, gpus=8, owner_kind="DaemonSet"), False),
    (gpu_pod("want", None, gpus=8, deleting=True), False),
    (gpu_pod("want", None, gpus=8, node_selector={"zone": "b"}), False),  # wants other nodes
    (gpu_pod("want", None, gpus=16), False),                           # no lent node is big enough
])
def test_which_pending_pods_trigger_a_reclaim(pod, triggers):
    w = lent_world("n1", pods=[pod])
    assert bool(of(w.decide(POLICY, T0), A.SetLendingState)) is triggers


@pytest.mark.parametrize("reclaim,labels,priority,triggers", [
    ({"podSelector": {"matchLabels": {"team": "inference"}}}, {"team": "inference"}, 0, True),
    ({"podSelector": {"matchLabels": {"team": "inference"}}}, {"team": "research"}, 0, False),
    ({"minPriority": 1000}, {}, 1000, True),
    ({"minPriority": 1000}, {}, 999, False),
    ({"podSelector": {"matchLabels": {"team": "inference"}}, "minPriority": 1000}, {}, 2000, True),
    ({"podSelector": {"matchLabels": {"team": "inference"}}, "minPriority": 1000}, {"team": "x"}, 0, False),
])
def test_pod_selector_or_min_priority_pick_the_pods_that_trigger(reclaim, labels, priority, triggers):
    w = lent_world("n1", pods=[gpu_pod("want", None, gpus=8, labels=labels, priority=priority)])
    assert bool(of(w.decide(policy(reclaim=reclaim), T0), A.SetLendingState)) is triggers


@pytest.mark.parametrize("change,pol,reason", [
    (dict(labels={"other": "x", "slurmk8s.dev/lendable-to": "hpc"}), POLICY, "unselected"),
    (dict(unschedulable=True), POLICY, "cordoned"),
    ({}, policy(windows=[{"start": "00:00", "end": "06:00"}]), "window"),
    ({}, policy(maxLentNodes=0), "limits"),
    ({}, policy(minKubernetesNodes=2), "limits"),
    ({}, policy(partition="other"), "partition"),
])
def test_graceful_reclaim_reasons(change, pol, reason):
    w = lent_world("n1", jobs=[job(1, "n1")], pods=[gpu_pod("svc", "k", gpus=8)])
    w.nodes["k"] = gpu_node("k")  # busy, but selected: the selector still matches something
    node = w.nodes["n1"]
    w.nodes["n1"] = replace(node, labels={**change.get("labels", node.labels), STATE_LABEL: LENT},
                            unschedulable=change.get("unschedulable", False))
    if pol.spec.partition == "other":
        w.cluster = cluster().model_copy(deep=True)
        w.cluster.spec.partitions.append(w.cluster.spec.partitions[1].model_copy(update={"name": "other"}))
    acts = w.decide(pol, T0)
    assert only(acts, A.SetLendingState).reason == reason
    assert only(acts, A.Signal).job_ids == (1,)


def test_lowering_max_lent_nodes_gives_back_the_idle_nodes_first():
    w = lent_world("busy", "idle1", "idle2", jobs=[job(1, "busy")])
    acts = w.decide(policy(maxLentNodes=1), T0)
    assert sorted(a.node for a in of(acts, A.SetLendingState)) == ["idle1", "idle2"]


def test_raising_min_kubernetes_nodes_takes_back_what_is_missing():
    w = lent_world("a", "b", "c")
    w.nodes["k"] = gpu_node("k")
    w.pods[("apps", "train")] = gpu_pod("train", "k", gpus=8)
    acts = w.decide(policy(minKubernetesNodes=3), T0)
    assert len(of(acts, A.SetLendingState)) == 2


# -- reclaiming ----------------------------------------------------------------------------


def test_a_reclaim_drains_signals_and_records_the_time():
    w = lent_world("n1", jobs=[job(1, "n1"), job(2, "n1,n2")], pods=[gpu_pod("want", None, gpus=8)])
    acts = w.decide(policy(reclaim={"signal": "USR2"}), T0)
    assert kinds(acts) == ["SetLendingState", "Drain", "Signal", "RecordSignalled"]
    assert only(acts, A.Drain) == A.Drain("n1", "reclaimed by Kubernetes (demand)")
    assert only(acts, A.Signal) == A.Signal("n1", (1, 2), "USR2")
    assert only(acts, A.RecordSignalled) == A.RecordSignalled("n1", T0, (1, 2))
    message = dict(((e.name, e.reason), e.message) for e in of(acts, A.Event))[("n1", "Reclaiming")]
    assert REASONS["demand"] in message and "SIGUSR2" in message and message.endswith("then are requeued")
    acts = lent_world("n1", jobs=[job(1, "n1")], pods=[gpu_pod("want", None, gpus=8)]).decide(
        policy(reclaim={"jobAction": "cancel"}), T0)
    message = dict(((e.name, e.reason), e.message) for e in of(acts, A.Event))[("n1", "Reclaiming")]
    assert message.endswith("then are cancelled")


def test_a_job_that_requeued_itself_on_the_signal_may_start_again_at_once():
    """train.sh's pattern: trap USR1, checkpoint, `scontrol requeue $SLURM_JOB_ID`.
    Slurm then holds the job ~2 minutes (reason BeginTime) unless told otherwise."""
    w = lent_world("n1", jobs=[job(1, "n1"), job(2, "n1")], pods=[gpu_pod("want", None, gpus=8)])
    pol = policy(reclaim={"gracePeriodSeconds": 300})
    w.apply(w.decide(pol, T0))
    assert w.nodes["n1"].record.signalled_jobs == (1, 2)
    # Job 1 requeued itself and waits for its begin time; job 2 still runs.
    w.jobs[1] = replace(w.jobs[1], state="PENDING", nodes="", reason="BeginTime", restart_count=1)
    acts = w.decide(pol, T0 + timedelta(seconds=5))
    assert kinds(acts) == ["StartNow"]
    assert only(acts, A.StartNow) == A.StartNow("n1", (1,))
    # Job 2 does the same: it is started, and the empty node handed back, in one round.
    w.jobs[1] = replace(w.jobs[1], reason="Resources")
    w.jobs[2] = replace(w.jobs[2], state="PENDING", nodes="", reason="BeginTime", restart_count=1)
    w.snodes["n1"] = replace(w.snodes["n1"], state="idle")
    acts = w.decide(pol, T0 + timedelta(seconds=10))
    assert kinds(acts)[:2] == ["StartNow", "DeleteNode"] and "ClearLending" in kinds(acts)
    assert only(acts, A.StartNow).job_ids == (2,)


def test_jobs_get_the_grace_period_then_are_requeued_or_cancelled():
    grace = 60
    w = World.of(nodes=[reclaiming_node("n1", signalled=T0)], pods=[slurmd("n1")],
                 snodes=[drained(slurm_node("n1", state="mixed"))],
                 jobs=[job(1, "n1"), job(2, "n1", requeue=False), job(3, "n1", state="COMPLETING")])
    assert kinds(w.decide(POLICY, T0 + timedelta(seconds=grace - 1))) == []
    acts = w.decide(POLICY, T0 + timedelta(seconds=grace))
    assert kinds(acts) == ["Requeue", "Cancel", "RecordForced"]
    assert only(acts, A.Requeue).job_ids == (1,)
    assert only(acts, A.Cancel).job_ids == (2,)   # submitted with --no-requeue


def test_job_action_cancel_cancels_every_job():
    w = World.of(nodes=[reclaiming_node("n1", signalled=T0)], pods=[slurmd("n1")],
                 snodes=[drained(slurm_node("n1", state="mixed"))], jobs=[job(1, "n1"), job(2, "n1")])
    acts = w.decide(policy(reclaim={"jobAction": "cancel"}), T0 + timedelta(seconds=60))
    assert kinds(acts) == ["Cancel", "RecordForced"]


def test_jobs_that_survive_their_requeue_get_it_again_later():
    forced = T0 + timedelta(seconds=60)
    w = World.of(nodes=[reclaiming_node("n1", signalled=T0, forced=forced)], pods=[slurmd("n1")],
                 snodes=[drained(slurm_node("n1", state="mixed"))], jobs=[job(1, "n1")])
    assert kinds(w.decide(POLICY, forced + timedelta(seconds=FORCE_RETRY_SECONDS - 1))) == []
    assert kinds(w.decide(POLICY, forced + timedelta(seconds=FORCE_RETRY_SECONDS))) == ["Requeue", "RecordForced"]


def test_ending_jobs_are_waited_for():
    w = World.of(nodes=[reclaiming_node("n1", signalled=T0)], pods=[slurmd("n1")],
                 snodes=[drained(slurm_node("n1", state="mixed", flags={"COMPLETING"}))],
                 jobs=[job(1, "n1", state="COMPLETING")])
    # (until the reclaim deadline: tests below)
    assert kinds(w.decide(POLICY, T0 + timedelta(minutes=5))) == []


def test_once_its_jobs_are_gone_the_node_goes_back_to_kubernetes():
    w = World.of(nodes=[reclaiming_node("n1", signalled=T0)], pods=[slurmd("n1")],
                 snodes=[drained(slurm_node("n1"))], jobs=[job(1, "", state="PENDING")])
    acts = w.decide(POLICY, T0 + timedelta(seconds=5))
    assert kinds(acts) == ["DeleteNode", "DeleteSlurmdPod", "Untaint", "ClearLending"]
    assert only(acts, A.DeleteSlurmdPod) == A.DeleteSlurmdPod("hpc", lent_slurmd("demo", "n1"), "n1")
    assert only(acts, A.Untaint) == A.Untaint("n1", TAINT_KEY)
    assert events(acts) == [("n1", "Returned")]


def test_an_idle_lent_node_goes_back_in_one_round():
    w = lent_world("n1", pods=[gpu_pod("want", None, gpus=8)])
    acts = w.decide(POLICY, T0)
    assert kinds(acts) == ["SetLendingState", "Drain", "RecordSignalled", "DeleteNode",
                           "DeleteSlurmdPod", "Untaint", "ClearLending"]


def test_a_job_that_slips_in_stops_the_chain_before_the_node_is_handed_back():
    w = lent_world("n1", pods=[gpu_pod("want", None, gpus=8)])
    acts = w.decide(POLICY, T0)
    w.jobs[9] = job(9, "n1")   # scheduled between observing and draining
    w.apply(acts)
    n1 = w.nodes["n1"]
    assert n1.labels[STATE_LABEL] == RECLAIMING and n1.taints  # still Slurm's
    assert "n1" in w.snodes and not w.pods[("hpc", lent_slurmd("demo", "n1"))].deleting
    acts = w.decide(POLICY, T0 + timedelta(seconds=5))
    assert kinds(acts) == []   # job 9 gets its grace period from the recorded signal time
    acts = w.decide(POLICY, T0 + timedelta(seconds=60))
    assert only(acts, A.Requeue).job_ids == (9,)


# -- failures while lent ----------------------------------------------------------------------


@pytest.mark.parametrize("mutate,reason", [
    (lambda w: w.pods.pop(("hpc", lent_slurmd("demo", "n1"))), "slurmd-lost"),
    (lambda w: w.pods.update({("hpc", lent_slurmd("demo", "n1")): slurmd("n1", phase="Failed")}), "slurmd-lost"),
    (lambda w: w.snodes.update({"n1": slurm_node("n1", state="down")}), "slurm-node-down"),
    (lambda w: w.snodes.update({"n1": slurm_node("n1", state="mixed", flags={"NOT_RESPONDING"})}),
     "slurm-node-down"),
    (lambda w: w.snodes.pop("n1"), "slurm-node-lost"),
])
def test_a_failed_lent_node_requeues_its_jobs_at_once(mutate, reason):
    w = lent_world("n1", jobs=[job(1, "n1")])
    mutate(w)
    acts = w.decide(POLICY, T0)
    assert only(acts, A.SetLendingState).reason == reason
    assert not of(acts, A.Signal)
    assert [e for e in of(acts, A.Event) if e.reason == "Reclaiming"][0].type == "Warning"
    if reason == "slurmd-lost":
        # No slurmd answers for the job: Slurm is told the node is DOWN, which
        # ends (and requeues) it now instead of after SlurmdTimeout.
        assert only(acts, A.SetDown) == A.SetDown("n1", f"reclaimed by Kubernetes ({reason})")
        assert not of(acts, A.Requeue) and kinds(acts)[1:3] == ["Drain", "SetDown"]
        w.apply(acts)
        assert w.decide(POLICY, T0) == []  # the job is ending
        w.step()
        assert w.jobs[1].state == "PENDING"
        assert "ClearLending" in kinds(w.decide(POLICY, T0 + timedelta(seconds=1)))
        return
    assert only(acts, A.Requeue).job_ids == (1,)
    assert of(acts, A.Drain) == ([] if "n1" not in w.snodes else
                                         [A.Drain("n1", f"reclaimed by Kubernetes ({reason})")])


# -- a node Kubernetes reports not Ready --------------------------------------------------------

NOT_READY_TIMEOUT = POLICY.spec.reclaim.not_ready_timeout_seconds


def not_ready(w: World, since, name: str = "n1") -> None:
    w.nodes[name] = replace(w.nodes[name], ready=False, not_ready_since=since)


@pytest.mark.parametrize("since,slurm_flags", [
    (T0, ()),                                                         # a blip: Slurm still hears slurmd
    (T0, ("NOT_RESPONDING",)),                                        # both, but only just
    (T0 - timedelta(seconds=NOT_READY_TIMEOUT + 1), ()),              # long, but Slurm still hears slurmd
    (None, ("NOT_RESPONDING",)),                                      # not Ready since when: unknown
])
def test_a_not_ready_lent_node_is_reclaimed_gracefully(since, slurm_flags):
    w = lent_world("n1", jobs=[job(1, "n1")])
    not_ready(w, since)
    w.snodes["n1"] = replace(w.snodes["n1"], flags=frozenset(slurm_flags))
    acts = w.decide(POLICY, T0)
    assert only(acts, A.SetLendingState).reason == "node-not-ready"
    assert only(acts, A.Signal).job_ids == (1,)
    assert not of(acts, A.SetDown) and not of(acts, A.Requeue) and not of(acts, A.Cancel)
    assert [e for e in of(acts, A.Event) if e.reason == "Reclaiming"][0].type == "Warning"
    w.apply(acts)
    w.step()
    # The grace period runs as for any graceful reclaim; the node is never set DOWN.
    later = T0 + timedelta(seconds=POLICY.spec.reclaim.grace_period_seconds - 1)
    assert not of(w.decide(POLICY, later), A.SetDown)
    assert w.jobs[1].state == "RUNNING"


def test_a_lent_node_not_ready_past_the_timeout_and_not_responding_to_slurm_is_set_down():
    w = lent_world("n1", jobs=[job(1, "n1")])
    not_ready(w, T0 - timedelta(seconds=NOT_READY_TIMEOUT))
    w.snodes["n1"] = replace(w.snodes["n1"], flags=frozenset({"NOT_RESPONDING"}))
    acts = w.decide(POLICY, T0)
    assert only(acts, A.SetLendingState).reason == "node-not-ready"
    assert only(acts, A.SetDown) == A.SetDown("n1", "reclaimed by Kubernetes (node-not-ready)")
    assert not of(acts, A.Signal)


def test_a_graceful_not_ready_reclaim_turns_into_down_once_the_node_is_lost():
    w = lent_world("n1", jobs=[job(1, "n1")])
    not_ready(w, T0)
    w.apply(w.decide(POLICY, T0))
    w.step()
    w.snodes["n1"] = replace(w.snodes["n1"], flags=w.snodes["n1"].flags | {"NOT_RESPONDING"})
    assert not of(w.decide(POLICY, T0 + timedelta(seconds=NOT_READY_TIMEOUT - 1)), A.SetDown)
    acts = w.decide(POLICY, T0 + timedelta(seconds=NOT_READY_TIMEOUT))
    assert of(acts, A.SetDown)


def test_the_not_ready_timeout_is_the_policys():
    pol = policy(reclaim={"notReadyTimeoutSeconds": 30})
    assert pol.spec.reclaim.not_ready_timeout_seconds == 30
    w = lent_world("n1", jobs=[job(1, "n1")])
    not_ready(w, T0 - timedelta(seconds=30))
    w.snodes["n1"] = replace(w.snodes["n1"], flags=frozenset({"NOT_RESPONDING"}))
    assert of(w.decide(pol, T0), A.SetDown)


def test_not_ready_since_is_read_from_the_ready_condition():
    from slurmk8s.bridge.observed import node_from_api
    obj = {"metadata": {"name": "n1"}, "status": {"conditions": [
        {"type": "Ready", "status": "Unknown", "lastTransitionTime": "2026-01-05T10:00:00Z"}]}}
    n = node_from_api(obj)
    assert not n.ready and n.not_ready_since == parse_time("2026-01-05T10:00:00Z")
    obj["status"]["conditions"][0]["lastTransitionTime"] = "garbage"
    assert node_from_api(obj).not_ready_since is None
    obj["status"]["conditions"][0]["status"] = "True"
    assert node_from_api(obj).not_ready_since is None


def test_a_slurm_node_in_unknown_state_is_not_a_failure():
    w = lent_world("n1", jobs=[job(1, "n1")])
    w.snodes["n1"] = slurm_node("n1", state="unknown")
    assert kinds(w.decide(POLICY, T0)) == []


# -- safety --------------------------------------------------------------------------------


def test_when_slurm_cannot_be_read_nothing_that_depends_on_it_changes():
    w = lent_world("n1", jobs=[job(1, "n1")], pods=[gpu_pod("want", None, gpus=8)])
    w.nodes["n2"] = reclaiming_node("n2", signalled=T0 - timedelta(hours=1))
    w.nodes["idle"] = gpu_node("idle", annotations=IDLE)
    w.slurm_known = False
    acts = w.decide(POLICY, T0)
    assert kinds(acts) == []
    cond = status(acts).conditions[0]
    assert (cond.status, cond.reason) == ("False", "SlurmUnreachable")


def test_an_unreadable_job_node_list_counts_as_unknown_slurm():
    w = lent_world("n1", jobs=[job(1, "n[1-")], pods=[gpu_pod("want", None, gpus=8)])
    acts = w.decide(POLICY, T0)
    # The pending pod's claim starts the reclaim (on the record only); nothing else moves.
    assert kinds(acts) == ["SetLendingState"]
    assert only(acts, A.SetLendingState).reason == "demand"
    assert "job 1's node list could not be read" in status(acts).conditions[0].message


# -- the owner always gets its nodes back: the reclaim deadline ------------------------------

DEADLINE = POLICY.spec.reclaim.grace_period_seconds + POLICY.spec.reclaim.deadline_seconds
HAND_BACK = ["RecordDownOwed", "DeleteSlurmdPod", "Untaint", "ClearLending"]


def test_the_deadline_has_a_safe_default_and_bounds():
    assert POLICY.spec.reclaim.deadline_seconds == 600
    assert DEFAULT_RECLAIM.deadline_seconds == 600


def owner_claims():
    """Each way the node's owner asks for it back, as a change to a lent world."""
    def withdraw(w):
        w.nodes["n1"] = replace(w.nodes["n1"], labels={**w.nodes["n1"].labels, "slurmk8s.dev/lendable-to": "other"})

    def cordon(w):
        w.nodes["n1"] = replace(w.nodes["n1"], unschedulable=True)

    def demand(w):
        w.pods[("apps", "want")] = gpu_pod("want", None, gpus=8)
    return [("withdrawn", withdraw, POLICY), ("cordoned", cordon, POLICY), ("demand", demand, POLICY),
            ("policy-gone", lambda w: None, PolicyGone("hpc", "lend", "hpc/demo"))]


@pytest.mark.parametrize("reason,claim,pol", owner_claims(), ids=[c[0] for c in owner_claims()])
@pytest.mark.parametrize("borrower", ["unreachable", "lying"])
def test_a_borrower_whose_slurm_is_unreachable_or_lying_loses_the_node_within_grace_plus_the_deadline(
        reason, claim, pol, borrower):
    """Issue 24, item 2: the owner's claim wins after a bounded time. A job
    that never ends (Slurm lies) or no answer at all keeps the node only
    until gracePeriodSeconds + deadlineSeconds after the reclaim began."""
    w = lent_world("n1", jobs=[job(1, "n1")])
    claim(w)
    if borrower == "unreachable":
        w.slurm_known = False
    now, began, returned = T0, None, None
    while now <= T0 + timedelta(seconds=DEADLINE + 120):
        acts = w.decide(pol, now)
        for a in of(acts, A.SetLendingState):
            assert a.state == RECLAIMING and a.reason == reason
            began = began or a.since
        w.apply([a for a in acts if not isinstance(a, (A.Event, A.PolicyStatus))])
        if borrower == "lying":  # the job never ends, whatever it is told
            w.jobs[1] = job(1, "n1")
        if STATE_LABEL not in w.nodes["n1"].labels:
            returned = now
            break
        now += timedelta(seconds=10)
    assert began == T0, "the claim starts the reclaim at once, Slurm or not"
    assert returned is not None and returned - began <= timedelta(seconds=DEADLINE + 10), returned
    node = w.nodes["n1"]
    assert not node.taints and w.pods[("hpc", lent_slurmd("demo", "n1"))].deleting
    assert ("warning", "ReclaimDeadline") in {(e.type.lower(), e.reason) for e in of(acts, A.Event)}
    if borrower == "lying":
        # Slurm answers: the node is set DOWN at once (which ends the job), nothing is owed.
        assert only(acts, A.SetDown).node == "n1"
        assert node.record.down_owed is None
    else:
        assert not of(acts, A.SetDown)
        assert node.record.down_owed == "hpc/demo"
        if isinstance(pol, PolicyGone):
            return
        assert status(acts).down_owed == ["n1"]
        # Slurm answers again, maybe after a restart of the bridge: the DOWN is set, once.
        w.slurm_known = True
        later = w.decide(pol, now + timedelta(hours=1))
        assert kinds(later)[:2] == ["SetDown", "ClearDownOwed"]
        assert only(later, A.SetDown).reason.startswith("taken back by Kubernetes")
        w.apply(later)
        assert w.nodes["n1"].record.down_owed is None
        assert not of(w.decide(pol, now + timedelta(hours=1)), A.SetDown)


def test_before_the_deadline_an_unknown_slurm_still_means_wait():
    w = World.of(nodes=[reclaiming_node("n1", signalled=T0 - timedelta(seconds=290))], pods=[slurmd("n1")],
                 snodes=[drained(slurm_node("n1", state="mixed"))], jobs=[job(1, "n1")])
    w.slurm_known = False
    since = w.nodes["n1"].record.since
    assert kinds(w.decide(POLICY, since + timedelta(seconds=DEADLINE - 1))) == []
    assert kinds(w.decide(POLICY, since + timedelta(seconds=DEADLINE)))[:4] == HAND_BACK


def test_without_a_claim_an_unreadable_slurm_keeps_its_nodes():
    w = lent_world("n1", jobs=[job(1, "n1")])
    w.slurm_known = False
    assert kinds(w.decide(POLICY, T0 + timedelta(days=2))) == []


def test_the_deadline_is_the_policys():
    pol = policy(reclaim={"gracePeriodSeconds": 30, "deadlineSeconds": 60})
    w = World.of(nodes=[reclaiming_node("n1")], pods=[slurmd("n1")], snodes=[slurm_node("n1", state="mixed")],
                 jobs=[job(1, "n1")])
    since = w.nodes["n1"].record.since
    assert "RecordDownOwed" not in kinds(w.decide(pol, since + timedelta(seconds=89)))
    assert kinds(w.decide(pol, since + timedelta(seconds=90)))[:4] == HAND_BACK


def test_a_node_lent_to_a_cluster_the_policy_no_longer_names_is_still_taken_back():
    """A borrower that points clusterRef elsewhere stops its old cluster's
    Slurm from being read; its owner still gets the node back."""
    pol = policy(clusterRef={"name": "other"})
    w = lent_world("n1", jobs=[job(1, "n1")])
    w.nodes["n1"] = replace(w.nodes["n1"], unschedulable=True)
    acts = w.decide(pol, T0)
    assert [(a.reason, a.cluster) for a in of(acts, A.SetLendingState)] == [("cordoned", "hpc/demo")]
    w.apply(acts)
    acts = w.decide(pol, T0 + timedelta(seconds=DEADLINE))
    assert kinds(acts)[:4] == HAND_BACK
    assert only(acts, A.RecordDownOwed).cluster == "hpc/demo"


def test_a_missing_cluster_does_not_keep_nodes_from_their_owner():
    pol = policy(clusterRef={"name": "typo"})
    w = lent_world("n1", pods=[gpu_pod("want", None, gpus=8)], cluster=None)
    acts = w.decide(pol, T0)
    assert [a.reason for a in of(acts, A.SetLendingState)] == ["demand"]


def test_an_admin_drain_is_left_alone_and_reported():
    w = lent_world("n1")
    w.snodes["n1"] = replace(w.snodes["n1"], flags=frozenset({"DRAIN"}), reason="admin: flaky GPU 3")
    acts = w.decide(POLICY, T0)
    assert kinds(acts) == []
    assert "drained by an administrator, left drained: n1 (admin: flaky GPU 3)" in status(acts).conditions[0].message
    # Reclaimed anyway when Kubernetes needs it, without touching the drain.
    w.pods[("apps", "want")] = gpu_pod("want", None, gpus=8)
    acts = w.decide(POLICY, T0)
    assert not of(acts, A.Drain)
    assert ("n1", "AdminDrain") in events(acts)


def test_a_lost_taint_is_put_back():
    w = lent_world("n1")
    w.nodes["n1"] = replace(w.nodes["n1"], taints=())
    assert kinds(w.decide(POLICY, T0)) == ["Taint"]


@pytest.mark.parametrize("slurm_known", [True, False])
def test_a_node_with_an_unknown_state_value_is_taken_back_by_its_policy(slurm_known):
    """Issue 41: a state label this version does not know is a lent node in
    an unknown state, taken back (through Slurm when it answers), never left
    alone for ever."""
    w = lent_world("n1", jobs=[job(1, "n1")])
    w.nodes["n1"] = held_node("n1", "borrowed")
    w.slurm_known = slurm_known
    acts = w.decide(POLICY, T0)
    entered = only(acts, A.SetLendingState)
    assert (entered.state, entered.reason, entered.policy, entered.cluster) == (
        RECLAIMING, "record-unreadable", POLICY.key, "hpc/demo")
    assert bool(of(acts, A.Signal)) == slurm_known
    spec = POLICY.spec.reclaim
    assert back_by(w, POLICY, "n1", T0 + timedelta(seconds=spec.grace_period_seconds + spec.deadline_seconds + 10))


def back_by(w: World, pol, node: str, end, lying: bool = False) -> bool:
    """Rounds every 10 s from T0 until ``node`` serves Kubernetes again
    (unlabelled, untainted, its lent slurmd pod gone), at the latest ``end``;
    ``lying``: every job stays RUNNING, whatever it is told."""
    t = T0
    while t <= end:
        w.apply(w.decide(pol, t))
        n = w.nodes[node]
        if STATE_LABEL not in n.labels and n.taints == () and ("hpc", lent_slurmd("demo", node)) not in w.pods:
            return True
        if lying:
            w.jobs = {k: replace(j, state="RUNNING") for k, j in w.jobs.items()}
        w.step()
        t += timedelta(seconds=10)
    return False


#: Records of held nodes that name no policy and SlurmCluster as <namespace>/<name>:
#: (label, annotations over held_node's, taint), and the SlurmCluster that can still be told.
UNATTRIBUTED = {
    "no-policy": (LENT, {POLICY_ANNOTATION: None}, True, "hpc/demo"),
    "policy-without-namespace": (LENT, {POLICY_ANNOTATION: "lend"}, True, "hpc/demo"),
    "policy-not-a-name": (RECLAIMING, {POLICY_ANNOTATION: "hpc/Lend!"}, True, "hpc/demo"),
    "no-cluster": (LENT, {CLUSTER_ANNOTATION: None}, True, None),
    "cluster-without-namespace": (LENDING, {CLUSTER_ANNOTATION: "demo"}, True, None),
    "unknown-state-no-policy": ("borrowed", {POLICY_ANNOTATION: ""}, True, "hpc/demo"),
    "label-only": (LENT, {POLICY_ANNOTATION: None, CLUSTER_ANNOTATION: None}, False, None),
    "taint-only": (None, {POLICY_ANNOTATION: None, CLUSTER_ANNOTATION: None, PARTITION_ANNOTATION: None,
                          SINCE_ANNOTATION: None}, True, None),
}


def unattributed_node(name: str, case: str) -> KubeNode:
    state, changed, taint, _ = UNATTRIBUTED[case]
    node = held_node(name, state or LENT, taint=taint)
    labels = {k: v for k, v in node.labels.items() if state is not None or k != STATE_LABEL}
    annotations = {k: v for k, v in {**node.annotations, **changed}.items() if v is not None}
    return replace(node, labels=labels, annotations=annotations)


@pytest.mark.parametrize("slurm", ["answers", "down", "lying"])
@pytest.mark.parametrize("case", sorted(UNATTRIBUTED))
def test_a_held_node_that_no_policy_holds_goes_back_within_grace_plus_the_deadline(case, slurm):
    """Issue 41: a node with the lending label or taint whose record names no
    policy or SlurmCluster that can be read (anyone with patch on the Node can
    make it so) is taken back by an unattributed holder that orphaned_policies
    yields, with the default settings: untainted, its record and lent slurmd
    pod gone, within gracePeriodSeconds + deadlineSeconds, whatever Slurm does."""
    w = lent_world("n1", "n2", jobs=[job(1, "n1")])
    w.nodes["n1"] = unattributed_node("n1", case)
    w.slurm_known = slurm != "down"
    holders = orphaned_policies(w.nodes.values(), existing=[POLICY.key])
    assert holders == [Unattributed(UNATTRIBUTED[case][3])]
    [holder] = holders
    # The policy leaves it alone (it is not its node), and so does every other.
    assert not [a for a in w.decide(POLICY, T0) if getattr(a, "node", None) == "n1"]
    acts = w.decide(holder, T0)
    assert not of(acts, A.PolicyStatus) and not [a for a in acts if getattr(a, "node", "n1") != "n1"]
    end = T0 + timedelta(seconds=DEFAULT_RECLAIM.grace_period_seconds + DEFAULT_RECLAIM.deadline_seconds + 10)
    assert back_by(w, holder, "n1", end, lying=slurm == "lying"), w.summary()
    assert w.nodes["n2"].record.holder == POLICY.key  # the policy's own node is left to it
    left = orphaned_policies(w.nodes.values(), existing=[POLICY.key])
    if left:  # taken back past the deadline while Slurm did not answer: it owes the cluster a DOWN
        assert left == [holder] and w.nodes["n1"].record.down_owed == holder.cluster
        w.slurm_known = True
        w.apply(w.decide(holder, end))
        assert w.nodes["n1"].record.down_owed is None
    assert w.decide(holder, end) == [] and orphaned_policies(w.nodes.values(), existing=[POLICY.key]) == []


def test_a_node_no_policy_holds_counts_its_reclaim_from_now_when_its_time_is_in_the_future():
    """Decision record 45 for such nodes too: a lending-since far ahead
    (or unreadable) is read as now, so the deadline still comes."""
    node = unattributed_node("n1", "no-cluster")
    node = replace(node, labels={**node.labels, STATE_LABEL: RECLAIMING},
                   annotations={**node.annotations, SINCE_ANNOTATION: "9999-12-31T23:59:59Z"})
    w = World.of(nodes=[node], pods=[slurmd("n1")], snodes=[slurm_node("n1", state="mixed")], jobs=[job(1, "n1")])
    [holder] = orphaned_policies(w.nodes.values(), existing=[POLICY.key])
    assert kinds(w.decide(holder, T0))[0] == "ClampTimes"
    end = T0 + timedelta(seconds=DEFAULT_RECLAIM.grace_period_seconds + DEFAULT_RECLAIM.deadline_seconds + 10)
    assert back_by(w, holder, "n1", end, lying=True), w.summary()


def test_an_unattributed_node_whose_cluster_can_be_read_is_reclaimed_through_its_slurm():
    """The policy cannot be told but the SlurmCluster can: its jobs get the
    default signal and grace period, then are requeued, as a deleted policy's."""
    w = lent_world("n1", jobs=[job(1, "n1")])
    w.nodes["n1"] = unattributed_node("n1", "no-policy")
    [holder] = orphaned_policies(w.nodes.values(), existing=[POLICY.key])
    acts = w.decide(holder, T0)
    entered = only(acts, A.SetLendingState)
    assert (entered.reason, entered.cluster) == ("record-unreadable", "hpc/demo")
    assert kinds(acts) == ["SetLendingState", "Drain", "Signal", "RecordSignalled"]
    assert only(acts, A.Signal).signal == DEFAULT_RECLAIM.signal
    settle(w, holder, T0, rounds=DEFAULT_RECLAIM.grace_period_seconds // 10 + 5)
    assert [e[0] for e in w.log] == ["signal", "requeue"] and "n1" not in w.snodes
    assert STATE_LABEL not in w.nodes["n1"].labels and w.nodes["n1"].taints == ()


def test_an_unattributed_nodes_lent_pod_is_found_by_its_name_on_the_node_in_the_bridges_namespaces():
    """No SlurmCluster can be told: the lent slurmd pod is the pod on the node
    that is some cluster's lent pod by name (in a namespace the bridge serves);
    a pod that only carries the label is not, and one the bridge may not
    delete does not hold the node."""
    w = lent_world("n1")
    w.nodes["n1"] = unattributed_node("n1", "no-cluster")
    w.pods[("tenant", "mine")] = KubePod("tenant", "mine", node="n1", phase="Running", gpus=0,
                                         labels={COMPONENT_LABEL: SLURMD_COMPONENT})
    w.snodes.clear()
    past = T0 + timedelta(seconds=DEFAULT_RECLAIM.grace_period_seconds + DEFAULT_RECLAIM.deadline_seconds + 1)
    for namespaces, deleted in (((), [("hpc", lent_slurmd("demo", "n1"))]), (("hpc",), [("hpc", lent_slurmd("demo", "n1"))]),
                                (("other",), [])):
        world = w.copy()
        holder = Unattributed(None, namespaces)
        world.apply(world.decide(holder, T0))
        acts = world.decide(holder, past)
        assert [(a.namespace, a.name) for a in of(acts, A.DeleteSlurmdPod)] == deleted
        assert "Untaint" in kinds(acts) and "ClearLending" in kinds(acts) and not of(acts, A.RecordDownOwed)


def test_nodes_lent_to_another_cluster_are_left_alone():
    w = lent_world("n1", pods=[gpu_pod("want", None, gpus=8)])
    w.nodes["n1"] = replace(w.nodes["n1"], annotations={**w.nodes["n1"].annotations,
                                                       CLUSTER_ANNOTATION: "hpc/old"})
    acts = w.decide(POLICY, T0)
    assert kinds(acts) == []
    assert "still lent to another SlurmCluster" in status(acts).conditions[0].message


# -- policy problems ------------------------------------------------------------------------


def test_a_missing_cluster_is_reported_and_the_nodes_lent_to_it_go_back():
    """The policy names a SlurmCluster that is gone, the one its nodes are
    lent to: nothing is lent, and those nodes start their reclaim (decision
    record 46); nodes lent to another cluster (clusterRef changed, maybe a
    typo) stay until their owner claims them."""
    w = lent_world("n1", jobs=[job(1, "n1")])
    w.nodes["n2"] = held_node("n2", LENT, **{CLUSTER_ANNOTATION: "hpc/old"})
    w.cluster = None
    w.slurm_known = False   # no cluster, no Slurm to read
    w.nodes["idle"] = gpu_node("idle", annotations=IDLE)
    acts = w.decide(POLICY, T0)
    assert [(a.node, a.reason) for a in of(acts, A.SetLendingState)] == [("n1", "cluster-gone")]
    assert kinds(acts) == ["SetLendingState"]
    cond = status(acts).conditions[0]
    assert (cond.status, cond.reason) == ("False", "ClusterNotFound")
    assert "fix spec.clusterRef.name" in cond.message and "the 1 node(s) lent to it go back" in cond.message
    assert "still lent to another SlurmCluster" in cond.message and "n2" in cond.message


# -- a SlurmCluster the bridge cannot load: decided toward Kubernetes (issue 41, item 1) ----

INVALID = UnreadableCluster("hpc/demo", "spec.partitions[1].acceptLentNodes: cannot be true with "
                            "slurmConfig.cgroups")
NEWER = UnreadableCluster("hpc/demo", "status.shardCount: Extra inputs are not permitted")


def unreadable_ways():
    """Each way the bridge loses the policy's SlurmCluster, as a change to a lent world."""
    def invalid(w):
        w.unreadable = INVALID

    def newer(w):
        w.unreadable = NEWER

    def deleted(w):
        w.cluster = None
    return [("invalid", invalid, "cluster-unreadable"), ("newer-status", newer, "cluster-unreadable"),
            ("deleted", deleted, "cluster-gone")]


def owner_changes():
    """Each thing the owner may do meanwhile (or nothing), and the policy it leaves."""
    def withdraw(w):
        w.nodes["n1"] = replace(w.nodes["n1"], labels={**w.nodes["n1"].labels, "slurmk8s.dev/lendable-to": "other"})

    def cordon(w):
        w.nodes["n1"] = replace(w.nodes["n1"], unschedulable=True)
    return [("nothing", lambda w: None, POLICY, None), ("withdrawn", withdraw, POLICY, "withdrawn"),
            ("cordoned", cordon, POLICY, "cordoned"),
            ("policy-gone", lambda w: None, PolicyGone("hpc", "lend", "hpc/demo"), "policy-gone"),
            ("max-lent-0", lambda w: None, policy(maxLentNodes=0), None)]


@pytest.mark.parametrize("change,claim,pol,reason", owner_changes(), ids=[c[0] for c in owner_changes()])
@pytest.mark.parametrize("way,lose,lost_reason", unreadable_ways(), ids=[u[0] for u in unreadable_ways()])
def test_a_cluster_the_bridge_cannot_load_loses_its_nodes_within_grace_plus_the_deadline(
        way, lose, lost_reason, change, claim, pol, reason):
    """Whatever makes the cluster unreadable (invalid by the operator's rule,
    a status field of a newer operator, deleted), and whatever its owner does
    meanwhile, every node lent to it is Kubernetes' again within
    gracePeriodSeconds + deadlineSeconds, and nothing is lent to it."""
    w = lent_world("n1", jobs=[job(1, "n1")])
    w.nodes["idle"] = gpu_node("idle", annotations=IDLE)
    lose(w)
    claim(w)
    now, began, returned = T0, None, None
    while now <= T0 + timedelta(seconds=DEADLINE + 120):
        acts = w.decide(pol, now)
        assert not of(acts, A.CreateSlurmdPod) and not of(acts, A.Taint), acts
        for a in of(acts, A.SetLendingState):
            assert a.state == RECLAIMING and a.reason in (reason, lost_reason), a
            began = began or now
        w.apply([a for a in acts if not isinstance(a, (A.Event, A.PolicyStatus))])
        if STATE_LABEL not in w.nodes["n1"].labels:
            returned = now
            began = began or now
            break
        now += timedelta(seconds=10)
    assert began == T0, "the reclaim starts the first round the cluster cannot be loaded"
    assert returned is not None and returned - began <= timedelta(seconds=DEADLINE), (returned, w.summary())
    assert not w.nodes["n1"].taints and w.pods[("hpc", lent_slurmd("demo", "n1"))].deleting
    assert STATE_LABEL not in w.nodes["idle"].labels


def test_an_unloadable_cluster_is_reported_with_why_and_what_happens_to_the_nodes():
    w = lent_world("n1")
    w.unreadable = INVALID
    cond = status(w.decide(POLICY, T0)).conditions[0]
    assert (cond.status, cond.reason) == ("False", "ClusterUnreadable")
    assert INVALID.problem in cond.message and "the 1 node(s) lent to it go back" in cond.message
    assert f"{DEADLINE}s after its reclaim began whatever Slurm says" in cond.message


def test_a_cluster_that_could_not_be_read_for_a_moment_keeps_its_nodes_but_not_from_their_owner():
    """A read that may pass by itself (the API server busy) is Slurm unknown:
    nothing is lent, the nodes stay, and the owner's claims and the deadline
    still run."""
    w = lent_world("n1", "n2", jobs=[job(1, "n1")])
    w.nodes["idle"] = gpu_node("idle", annotations=IDLE)
    w.unreadable = UnreadableCluster("hpc/demo", "GET ...: 503 ServiceUnavailable", transient=True)
    acts = w.decide(POLICY, T0)
    assert kinds(acts) == []
    assert status(acts).conditions[0].reason == "ClusterUnreadable"
    w.nodes["n2"] = replace(w.nodes["n2"], unschedulable=True)
    acts = w.decide(POLICY, T0)
    assert [(a.node, a.reason) for a in of(acts, A.SetLendingState)] == [("n2", "cordoned")]
    w.apply(acts)
    assert kinds(w.decide(POLICY, T0 + timedelta(seconds=DEADLINE)))[:4] == HAND_BACK


def test_max_lent_nodes_takes_nodes_back_while_slurm_cannot_be_read():
    """maxLentNodes is a rule of Kubernetes' side: it needs no Slurm to start a
    reclaim (the deadline ends it)."""
    w = lent_world("n1", "n2", jobs=[job(1, "n1")])
    w.slurm_known = False
    acts = w.decide(policy(maxLentNodes=1), T0)
    assert [a.reason for a in of(acts, A.SetLendingState)] == ["limits"]
    acts = w.decide(policy(maxLentNodes=0), T0)
    assert sorted((a.node, a.reason) for a in of(acts, A.SetLendingState)) == [("n1", "limits"), ("n2", "limits")]


def test_when_policy_and_cluster_are_gone_the_nodes_are_handed_back_without_slurm():
    w = lent_world("n1", jobs=[job(1, "n1")])
    w.nodes["n2"] = held_node("n2", LENDING)
    w.cluster = None
    acts = decide(w.observed(), PolicyGone("hpc", "lend", "hpc/demo"), T0)
    assert kinds(acts) == ["SetLendingState", "DeleteSlurmdPod", "Untaint", "ClearLending",
                           "SetLendingState", "Untaint", "ClearLending"]
    assert {a.reason for a in of(acts, A.SetLendingState)} == {"cluster-gone"}


@pytest.mark.parametrize("accept,partition,reason,hint", [
    (False, "gpu", "PartitionNotLendable", "set spec.partitions[1].acceptLentNodes: true"),
    (True, "nope", "PartitionNotFound", "partitions: cpu, gpu"),
])
def test_a_partition_problem_is_reported_and_stops_lending_but_not_what_keeps_nodes_safe(
        accept, partition, reason, hint):
    w = lent_world("n1", "n2", jobs=[job(1, "n1")], cluster=cluster(accept=accept))
    w.nodes["idle"] = gpu_node("idle", annotations=IDLE)
    pol = policy(partition=partition)
    acts = w.decide(pol, T0)
    assert kinds(acts) == []   # a typo does not take every lent node back
    cond = status(acts).conditions[0]
    assert (cond.status, cond.reason) == ("False", reason) and hint in cond.message
    # Failures and pending pods are still handled; maxLentNodes still holds.
    w.nodes.pop("idle")
    w.pods[("apps", "want")] = gpu_pod("want", None, gpus=8)
    w.pods[("apps", "want2")] = gpu_pod("want2", None, gpus=8)
    w.pods.pop(("hpc", lent_slurmd("demo", "n1")))
    assert [(a.node, a.reason) for a in of(w.decide(pol, T0), A.SetLendingState)] == [
        ("n1", "slurmd-lost"), ("n2", "demand")]   # n1, coming back, takes one pod
    w.pods.pop(("apps", "want"))
    w.pods.pop(("apps", "want2"))
    pol = policy(partition=partition, maxLentNodes=0)
    assert [(a.node, a.reason) for a in of(w.decide(pol, T0), A.SetLendingState)] == [
        ("n1", "slurmd-lost"), ("n2", "limits")]


def test_a_selector_matching_no_gpu_node_is_reported_and_lent_nodes_stay():
    w = lent_world("n1", jobs=[job(1, "n1")])
    acts = w.decide(policy(nodeSelector={"matchLabels": {"slurmk8s.dev/lendabel": "true"}}), T0)
    assert kinds(acts) == []
    cond = status(acts).conditions[0]
    assert (cond.status, cond.reason) == ("False", "NoMatchingNodes")
    assert "slurmk8s.dev/lendabel=true" in cond.message


def test_an_invalid_policy_gets_a_status_and_no_node_action():
    w = lent_world("n1", pods=[gpu_pod("want", None, gpus=8)])
    bad = InvalidPolicy("hpc", "lend", ("spec.reclaim.signal: \"KILL\" is not a signal a reclaim sends",), 3)
    acts = decide(w.observed(), bad, T0)
    assert kinds(acts) == []
    st = status(acts)
    assert st.observed_generation == 3
    cond = st.conditions[0]
    assert (cond.status, cond.reason) == ("False", "InvalidPolicy") and "spec.reclaim.signal" in cond.message


def test_a_deleted_policy_gets_its_nodes_back_with_the_default_settings():
    w = lent_world("n1", jobs=[job(1, "n1")])
    w.nodes["idle"] = gpu_node("idle", annotations=IDLE)
    [gone] = orphaned_policies(w.nodes.values(), existing=["hpc/another"])
    assert gone == PolicyGone("hpc", "lend", "hpc/demo")
    acts = decide(w.observed(), gone, T0)
    assert only(acts, A.SetLendingState).reason == "policy-gone"
    assert only(acts, A.Signal).signal == DEFAULT_RECLAIM.signal
    assert not of(acts, A.PolicyStatus)
    assert orphaned_policies(w.nodes.values(), existing=["hpc/lend"]) == []


# -- status --------------------------------------------------------------------------------


def test_status_counts_and_names_the_nodes_and_is_written_only_when_it_changes():
    w = lent_world("a", "b")
    w.nodes["k"] = gpu_node("k")
    w.pods[("apps", "train")] = gpu_pod("train", "k", gpus=8)
    first = w.decide(POLICY, T0)
    st = status(first)
    assert st.lent_nodes == ["a", "b"]
    assert st.counts.model_dump() == {"selected": 3, "kubernetes": 1, "lending": 0, "lent": 2, "reclaiming": 0}
    assert st.observed_generation == POLICY.metadata.generation
    cond = st.conditions[0]
    assert (cond.type, cond.status, cond.reason) == ("Ready", "True", "Lending")
    assert cond.message.startswith("2 of 3 selected nodes lent to partition gpu of SlurmCluster hpc/demo")
    w.apply(first)
    assert w.decide(POLICY, T0 + timedelta(minutes=5)) == []
    # A change keeps the condition's transition time while Ready stays True.
    w.nodes["b"] = replace(w.nodes["b"], labels={"other": "x", STATE_LABEL: LENT})
    later = status(w.decide(POLICY, T0 + timedelta(minutes=10)))
    assert later.conditions[0].last_transition_time == cond.last_transition_time == format_time(T0)
    assert later.counts.lent == 1


def test_metrics_count_nodes_by_state_and_policy():
    w = lent_world("a", "b")
    w.nodes["c"] = reclaiming_node("c")
    w.nodes["d"] = held_node("d", LENDING, key="hpc/other")
    w.nodes["k"] = gpu_node("k")
    w.nodes["cpu"] = gpu_node("cpu", allocatable={"cpu": "8"})
    m = lending_metrics(w.observed())
    assert m.by_state == {"kubernetes": 1, LENDING: 1, LENT: 2, RECLAIMING: 1}
    assert m.by_policy == {"hpc/lend": {LENDING: 0, LENT: 2, RECLAIMING: 1},
                           "hpc/other": {LENDING: 1, LENT: 0, RECLAIMING: 0}}
    assert m.pending_gpu_pods == 0
    w.pods[("apps", "waiting")] = gpu_pod("waiting", None, gpus=2)
    w.pods[("apps", "placed")] = gpu_pod("placed", "k", gpus=2)
    assert lending_metrics(w.observed()).pending_gpu_pods == 1


def test_metrics_count_a_node_no_policy_holds_under_its_holder():
    w = World.of(nodes=[unattributed_node("n1", "no-policy")])
    assert lending_metrics(w.observed()).by_policy == {
        Unattributed("hpc/demo").key: {LENDING: 0, LENT: 1, RECLAIMING: 0}}


# -- whole cycles ----------------------------------------------------------------------------


def test_a_full_cycle_lend_run_a_job_reclaim_checkpoint_requeue_return():
    w = World.of(nodes=[gpu_node("n1"), gpu_node("busy")], pods=[gpu_pod("svc", "busy", gpus=8)])
    now = settle(w, POLICY, T0, rounds=20, step=timedelta(seconds=30))
    assert w.nodes["n1"].labels[STATE_LABEL] == LENT and "n1" in w.snodes
    w.jobs[1] = job(1, "n1")
    w.pods[("apps", "burst")] = gpu_pod("burst", None, gpus=8)
    now = settle(w, POLICY, now, rounds=10, step=timedelta(seconds=30))
    assert STATE_LABEL not in w.nodes["n1"].labels and w.nodes["n1"].taints == ()
    assert "n1" not in w.snodes and not any(p.labels.get(COMPONENT_LABEL) for p in w.pods.values())
    assert [e[0] for e in w.log] == ["signal", "requeue"]
    assert w.jobs[1].state == "PENDING"   # eligible to run again, elsewhere
    # Held for the pending pod (not lent again) until the scheduler places it.
    assert set(w.nodes["n1"].annotations) == {IDLE_SINCE_ANNOTATION}
    w.pods[("apps", "burst")] = gpu_pod("burst", "n1", gpus=8)
    settle(w, POLICY, now, rounds=3)
    assert w.nodes["n1"].annotations == {}


def test_a_down_owed_by_a_deleted_policy_is_still_settled():
    """The policy that took the node back is gone: a round for it still sets
    the DOWN (its cluster exists) or drops the obligation (it does not)."""
    owed = gpu_node("n1", annotations={"slurmk8s.dev/down-owed": "hpc/demo", "slurmk8s.dev/down-owed-policy": "hpc/lend"})
    [gone] = orphaned_policies([owed], existing=[])
    assert gone == PolicyGone("hpc", "lend", "hpc/demo")
    w = World.of(nodes=[owed], snodes=[slurm_node("n1", state="mixed")], jobs=[job(1, "n1")])
    assert kinds(w.decide(gone, T0)) == ["SetDown", "ClearDownOwed"]
    w.cluster = None
    assert kinds(w.decide(gone, T0)) == ["ClearDownOwed"]


@pytest.mark.parametrize("busy", [False, True])
def test_a_settled_down_leaves_a_result_that_deciding_again_does_not_change(busy):
    """Found by hypothesis (test_decide_property): a node that owed a DOWN
    and kept an idle-since. Its idle time starts again when the DOWN is
    settled, so it is lent a later round at the earliest; a node that runs a
    GPU pod has its idle time cleared, not started again."""
    owed = {"slurmk8s.dev/down-owed": "hpc/demo", "slurmk8s.dev/down-owed-policy": "hpc/lend",
            IDLE_SINCE_ANNOTATION: format_time(T0 - timedelta(seconds=600))}
    w = World.of(nodes=[gpu_node("n0", annotations=owed)], snodes=[slurm_node("n0")],
                 pods=[gpu_pod("app", "n0")] if busy else [])
    pol = policy(idleAfterSeconds=0)
    w.apply([a for a in w.decide(pol, T0) if not isinstance(a, A.Event)])
    assert w.nodes["n0"].record.down_owed is None and "n0" not in w.snodes
    assert kinds(w.decide(pol, T0)) == []
    assert (IDLE_SINCE_ANNOTATION in w.nodes["n0"].annotations) == (not busy)
