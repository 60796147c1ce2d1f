"""Node lifecycle decisions (slurmk8s.operator.workers): scale-in, rolling updates,
undrains, leftover records and reconfigure, without I/O.

Over 500 lines because it covers every rule of one pure module, each case a few lines of
observed state.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmk8s.bridge.nodestate import TAINT_EFFECT, TAINT_KEY
from slurmk8s.evacuation import Record
from slurmk8s.operator.maintenance import CORDONED, maintenance
from slurmk8s.operator.podrecord import read_record, record_annotations
from slurmk8s.operator.reconfigure import decide_reconfigure
from slurmk8s.operator.workers import (
    OPERATOR_DRAINS,
    POD_TERMINATING,
    ROLLING_UPDATE,
    SCALE_IN,
    AnnotatePod,
    Cancel,
    DeleteNodeRecord,
    DeletePod,
    Drain,
    LabelBusy,
    NodeSetState,
    Pod,
    Requeue,
    Signal,
    StartNow,
    Undrain,
    decide,
)
from slurmk8s.render import names
from slurmk8s.slurm.model import Job, Node, SlurmState
from slurmk8s.times import format_time as timestamp
from slurmk8s.times import from_epoch

T0 = 1_800_000_000.0
STS = "demo-gpu"
STARTED, PURPOSE, SIGNALLED = names.DRAIN_STARTED, names.DRAIN_PURPOSE, names.JOBS_SIGNALLED
SIGNALLED_JOBS, FORCED = names.SIGNALLED_JOBS, names.JOBS_FORCED


def node(name: str, state: str = "idle", *, drain: str | None = None, flags: tuple = ()) -> Node:
    fl = {"DYNAMIC_NORM", *flags}
    if drain is not None:
        fl.add("DRAIN")
    return Node(name=name, state=state, flags=frozenset(fl), reason=drain or "", features=("gpu",),
                partitions=("gpu",), cpus=2, alloc_cpus=0, gres="", address="10.0.0.1")


def job(job_id: int, state: str = "RUNNING", requeue: bool = True, reason: str = "None") -> Job:
    return Job(job_id=job_id, name="train", user="researcher", state=state, partition="gpu", nodes="",
               requeue=requeue, restart_count=0, reason=reason)


def pod(o: int, *, ready: bool = True, deleting: bool = False, revision: str | None = "r1", **ann: str) -> Pod:
    return Pod(name=f"{STS}-{o}", uid=f"uid-{o}", ordinal=o, ready=ready, deleting=deleting, revision=revision,
               annotations=dict(ann))


def nodeset(current: int | None, desired: int, *, pods=None, revision="r1", grace=300, signal=None) -> NodeSetState:
    if pods is None:
        pods = tuple(pod(o) for o in range(current or 0))
    return NodeSetState(name="gpu", statefulset=STS, desired=desired, current=current, update_revision=revision,
                        pods=tuple(pods), grace_period=grace, signal=signal)


def slurm(*nodes: Node) -> SlurmState:
    """Slurm's nodes, read this round; its jobs not asked for yet."""
    return SlurmState.nodes_only(nodes)


def jobs_on(jobs: dict | None) -> tuple[Job, ...]:
    """Slurm's job list from {node: jobs there}; a job with no node is listed as it is."""
    return tuple(replace(j, nodes=n) if j.active else j for n, js in (jobs or {}).items() for j in js)


def drained(o: int, reason: str = SCALE_IN) -> Node:
    return node(f"{STS}-{o}", drain=f"slurmk8s: {reason}")


def decide_fully(sets, state: SlurmState, now: float, jobs: dict | None = None):
    """Decide; when it asks for Slurm's jobs, answer from ``jobs`` ({node: jobs there}) and decide again."""
    first = decide(sets, state, now)
    if not first.needs_jobs or state.nodes is None:
        return first
    second = decide(sets, state.with_jobs(jobs_on(jobs)), now)
    assert not second.needs_jobs
    return second


def annotations_of(d, pod_name: str) -> dict:
    out = {}
    for a in d.slurm_actions:
        if isinstance(a, AnnotatePod) and a.pod == pod_name:
            out.update(dict(a.annotations))
    return out


# Steady state and scale-out.


def test_nothing_to_do_when_replicas_match_and_nodes_are_idle():
    d = decide_fully([nodeset(2, 2)], slurm(node(f"{STS}-0"), node(f"{STS}-1")), T0)
    assert d.replicas == {STS: 2}
    assert d.slurm_actions == d.pod_deletions == d.record_deletions == d.events == ()


def test_scale_out_needs_no_slurm_at_all():
    assert decide([nodeset(1, 3)], SlurmState.unknown(), T0).replicas == {STS: 3}
    assert decide([nodeset(None, 2)], SlurmState.unknown(), T0).replicas == {STS: 2}


# Scale-in, step by step.


def test_scale_in_drains_the_highest_ordinals_first_and_keeps_the_pods():
    state = slurm(*(node(f"{STS}-{o}") for o in range(4)))
    d = decide_fully([nodeset(4, 2)], state, T0)
    assert d.replicas == {STS: 4}
    drains = [a for a in d.slurm_actions if isinstance(a, Drain)]
    assert drains == [Drain(f"{STS}-3", SCALE_IN), Drain(f"{STS}-2", SCALE_IN)]
    for o in (2, 3):
        assert annotations_of(d, f"{STS}-{o}") == {STARTED: timestamp(T0), PURPOSE: SCALE_IN}
    assert not annotations_of(d, f"{STS}-1")
    assert [e.reason for e in d.events] == ["Draining", "Draining"]
    assert "gpu" in d.keep


def test_drained_empty_nodes_let_the_statefulset_shrink():
    sets = [nodeset(4, 2, pods=[pod(0), pod(1), pod(2, **{STARTED: timestamp(T0), PURPOSE: SCALE_IN}),
                                pod(3, **{STARTED: timestamp(T0), PURPOSE: SCALE_IN})])]
    state = slurm(node(f"{STS}-0"), node(f"{STS}-1"), drained(2), drained(3))
    first = decide(sets, state, T0 + 1)
    assert first.needs_jobs and first.replicas == {STS: 4}  # Slurm's jobs are read once, then decided again
    d = decide_fully(sets, state, T0 + 1)
    assert d.replicas == {STS: 2}
    assert not [a for a in d.slurm_actions if isinstance(a, (Drain, Undrain, Requeue))]
    assert [e.reason for e in d.events] == ["ScaledIn"]


def test_busy_nodes_get_the_signal_then_the_grace_period_then_a_requeue():
    base = {STARTED: timestamp(T0), PURPOSE: SCALE_IN}
    state = slurm(node(f"{STS}-0"), drained(1))
    busy = {f"{STS}-1": [job(7), job(8, state="COMPLETING"), job(9, requeue=False), job(3, state="COMPLETED")]}

    # The drain is set: the running jobs get the node set's signal once.
    d = decide_fully([nodeset(2, 1, pods=[pod(0), pod(1, **base)], signal="USR1")], state, T0 + 5, busy)
    assert [a for a in d.slurm_actions if isinstance(a, Signal)] == [Signal(f"{STS}-1", (7, 9), "USR1")]
    assert annotations_of(d, f"{STS}-1") == {SIGNALLED: timestamp(T0 + 5), SIGNALLED_JOBS: "7,9"}
    assert d.replicas == {STS: 2} and d.hurry  # jobs 7 and 9 may requeue themselves any moment

    # Within the grace period (from the signal): wait, and say why.
    signalled = {**base, SIGNALLED: timestamp(T0 + 5), SIGNALLED_JOBS: "7,9"}
    sets = [nodeset(2, 1, pods=[pod(0), pod(1, **signalled)], signal="USR1", grace=60)]
    d = decide_fully(sets, state, T0 + 64, busy)
    assert d.replicas == {STS: 2} and not d.slurm_actions
    assert d.waiting == (f"{STS}-1: jobs 7,8,9 may run 1s more before they are requeued (scale-in)",)

    # Grace over: running, requeueable jobs are requeued, the others cancelled; then the pod may go.
    d = decide_fully(sets, state, T0 + 65, busy)
    assert [a for a in d.slurm_actions if isinstance(a, (Requeue, Cancel))] == [Requeue(f"{STS}-1", (7,)),
                                                                                 Cancel(f"{STS}-1", (9,))]
    assert annotations_of(d, f"{STS}-1") == {FORCED: timestamp(T0 + 65)}
    assert d.replicas == {STS: 1}
    assert {e.reason for e in d.events} == {"JobsRequeued", "JobsCancelled", "ScaledIn"}
    assert any("9" in e.message and e.type == "Warning" for e in d.events)


def test_without_a_signal_the_grace_period_runs_from_the_drain():
    ann = {STARTED: timestamp(T0), PURPOSE: SCALE_IN}
    sets = [nodeset(1, 0, pods=[pod(0, **ann)], grace=100)]
    busy = {f"{STS}-0": [job(1)]}
    state = slurm(drained(0))
    d = decide_fully(sets, state, T0 + 99, busy)
    assert d.replicas == {STS: 1} and not d.slurm_actions
    d = decide_fully(sets, state, T0 + 100, busy)
    assert d.slurm_actions[0] == Requeue(f"{STS}-0", (1,)) and d.replicas == {STS: 0}


def test_the_grace_period_lives_on_the_pod_not_in_the_operator():
    """A restarted operator decides from the annotations alone: same answers."""
    ann = {STARTED: timestamp(T0), PURPOSE: SCALE_IN, SIGNALLED: timestamp(T0 + 10)}
    sets = [nodeset(1, 0, pods=[pod(0, **ann)], grace=30, signal="USR1")]
    busy = {f"{STS}-0": [job(1)]}
    for now, requeued in ((T0 + 39, False), (T0 + 40, True), (T0 + 4000, True)):
        d = decide_fully(sets, slurm(drained(0)), now, busy)
        assert (Requeue(f"{STS}-0", (1,)) in d.slurm_actions) is requeued
        assert not any(isinstance(a, Signal) for a in d.slurm_actions)  # never signalled twice


def test_a_job_that_requeued_itself_on_the_signal_starts_again_at_once_before_the_pod_goes():
    """train.sh's pattern under scale-in: trap USR1, checkpoint, `scontrol requeue $SLURM_JOB_ID`.
    Slurm would hold the job for its requeue delay (reason BeginTime); the rule starts it now."""
    ann = {STARTED: timestamp(T0), PURPOSE: SCALE_IN, SIGNALLED: timestamp(T0), SIGNALLED_JOBS: "7"}
    sets = [nodeset(2, 1, pods=[pod(0), pod(1, **ann)], signal="USR1", grace=300)]
    state = slurm(node(f"{STS}-0"), drained(1))
    # Requeued by itself: still completing on the node, so the pod (and the record on it) stays.
    d = decide_fully(sets, state, T0 + 3, {f"{STS}-1": [job(7, "COMPLETING")]})
    assert d.replicas == {STS: 2} and not d.slurm_actions and d.hurry
    # Pending for its begin time: made eligible now; the pod goes once a round sees it eligible.
    d = decide_fully(sets, state, T0 + 4, {"": [job(7, "PENDING", reason="BeginTime")]})
    assert d.slurm_actions[0] == StartNow(f"{STS}-1", (7,)) and d.replicas == {STS: 2} and d.hurry
    assert "JobsStarted" in [e.reason for e in d.events]
    d = decide_fully(sets, state, T0 + 5, {"": [job(7, "PENDING", reason="Priority")]})
    assert not d.slurm_actions and d.replicas == {STS: 1}


def test_a_worker_pod_someone_deletes_is_emptied_by_the_same_rule():
    state = slurm(node(f"{STS}-0", "allocated"), node(f"{STS}-1", "allocated", drain="slurmk8s: pod terminating"))
    pods = [pod(0), pod(1, deleting=True)]
    busy = {f"{STS}-1": [job(4)]}
    d = decide_fully([nodeset(2, 2, pods=pods, signal="USR1", grace=60)], state, T0, busy)
    assert [a for a in d.slurm_actions if not isinstance(a, AnnotatePod)] == [Signal(f"{STS}-1", (4,), "USR1")]
    assert annotations_of(d, f"{STS}-1")[PURPOSE] == POD_TERMINATING
    ann = record_annotations(Record(purpose=POD_TERMINATING, started=from_epoch(T0), signalled=from_epoch(T0),
                                    jobs=(4,)))
    pods = [pod(0), pod(1, deleting=True, **ann)]
    d = decide_fully([nodeset(2, 2, pods=pods, signal="USR1", grace=60)], state, T0 + 60, busy)
    assert Requeue(f"{STS}-1", (4,)) in d.slurm_actions and d.replicas == {STS: 2}
    # A terminating pod with nothing on its node is left to its entrypoint.
    idle = slurm(node(f"{STS}-0"), drained(1, ROLLING_UPDATE))
    d = decide_fully([nodeset(2, 2, pods=[pod(0), pod(1, deleting=True)])], idle, T0)
    assert not d.slurm_actions and not d.needs_jobs


def test_only_the_empty_top_of_the_statefulset_goes():
    ann = {STARTED: timestamp(T0), PURPOSE: SCALE_IN}
    pods = [pod(0), pod(1, **ann), pod(2, **ann)]
    state = slurm(node(f"{STS}-0"), drained(1), drained(2))
    # The top node is busy: nothing can go yet, whatever the lower one does.
    d = decide_fully([nodeset(3, 1, pods=pods)], state, T0 + 1, {f"{STS}-2": [job(5)]})
    assert d.replicas == {STS: 3}
    # The top node is empty, the one below busy: one pod goes.
    d = decide_fully([nodeset(3, 1, pods=pods)], state, T0 + 1, {f"{STS}-1": [job(5)]})
    assert d.replicas == {STS: 2}


def test_an_unknown_slurm_state_holds_everything():
    sets = [nodeset(3, 1)]
    d = decide(sets, SlurmState.unknown(), T0)
    assert d.replicas == {STS: 3} and not d.slurm_actions and not d.pod_deletions and not d.record_deletions
    assert d.keep == {"gpu"} and "waits for the Slurm agent" in d.waiting[0]
    # A failed job read holds every node that needs it.
    ann = {STARTED: timestamp(T0), PURPOSE: SCALE_IN}
    state = SlurmState((node(f"{STS}-0"), drained(1), drained(2)), None)
    d = decide([nodeset(3, 1, pods=[pod(0), pod(1, **ann), pod(2, **ann)])], state, T0 + 1)
    assert d.replicas == {STS: 3} and not d.slurm_actions
    assert d.waiting == (f"{STS}-2: the jobs on it could not be listed; waiting (scale-in)",
                         f"{STS}-1: the jobs on it could not be listed; waiting (scale-in)")


def test_nodes_unknown_to_slurm_or_without_a_pod_go_at_once():
    d = decide_fully([nodeset(3, 1, pods=[pod(0), pod(1)])], slurm(node(f"{STS}-0"), node(f"{STS}-2")), T0)
    # -2 has no pod; -1 has a pod but never registered with Slurm.
    assert d.replicas == {STS: 1} and not d.slurm_actions


def test_a_foreign_drain_is_kept_as_it_is_on_scale_in():
    admin = node(f"{STS}-1", drain="bad DIMM")
    d = decide_fully([nodeset(2, 1)], slurm(node(f"{STS}-0"), admin), T0)
    assert not any(isinstance(a, (Drain, Undrain)) for a in d.slurm_actions)
    assert d.replicas == {STS: 1}  # drained and empty: it may go


def test_a_called_off_scale_in_clears_only_its_own_drains():
    ann = {STARTED: timestamp(T0), PURPOSE: SCALE_IN}
    pods = [pod(0), pod(1, **ann), pod(2, **ann), pod(3)]
    state = slurm(node(f"{STS}-0"), drained(1), drained(2), node(f"{STS}-3", drain="slurmk8s: reclaimed for a pod"))
    d = decide_fully([nodeset(4, 4, pods=pods)], state, T0 + 1)
    assert [a for a in d.slurm_actions if isinstance(a, Undrain)] == [Undrain(f"{STS}-1"), Undrain(f"{STS}-2")]
    for o in (1, 2):
        assert annotations_of(d, f"{STS}-{o}") == {a: None for a in record_annotations(Record())}
    assert d.replicas == {STS: 4}


def test_drains_of_others_are_never_cleared():
    for reason in ("bad DIMM", "slurmk8s: reclaimed for a pod", "slurmk8s:scale-in", "SLURMK8S: scale-in", ""):
        n = node(f"{STS}-0", drain=reason)
        d = decide_fully([nodeset(1, 1)], slurm(n), T0)
        assert not any(isinstance(a, Undrain) for a in d.slurm_actions), reason
    for reason in sorted(OPERATOR_DRAINS):
        n = node(f"{STS}-0", drain=reason)
        d = decide_fully([nodeset(1, 1)], slurm(n), T0)
        assert d.slurm_actions == (Undrain(f"{STS}-0"),), reason


def test_an_unready_pod_keeps_its_drain_until_it_is_ready():
    d = decide_fully([nodeset(1, 1, pods=[pod(0, ready=False)])], slurm(drained(0)), T0)
    assert not d.slurm_actions


def test_busy_workers_carry_the_label_their_disruption_budget_selects():
    pods = [pod(0), replace(pod(1), busy_label=True), replace(pod(2), busy_label=True), pod(3, deleting=True)]
    state = slurm(node(f"{STS}-0", "allocated"), node(f"{STS}-1", "idle", flags=("COMPLETING",)),
                  node(f"{STS}-2", "idle"), node(f"{STS}-3", "mixed"))
    d = decide_fully([nodeset(4, 4, pods=pods)], state, T0)
    assert d.busy_labels == (LabelBusy(f"{STS}-0", "uid-0", True), LabelBusy(f"{STS}-2", "uid-2", False))
    assert decide([nodeset(4, 4, pods=pods)], SlurmState.unknown(), T0).busy_labels == ()  # unknown: leave them


# Kubernetes node maintenance.


def kube_node(unschedulable: bool = False, *taints: dict) -> dict:
    return {"metadata": {"name": "n1"}, "spec": {"unschedulable": unschedulable, "taints": list(taints)}}


@pytest.mark.parametrize("node,tolerations,why", [
    (kube_node(), [], None),
    (kube_node(True), [], CORDONED),
    (kube_node(False, {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}), [], CORDONED),
    (kube_node(False, {"key": "example.com/maintenance", "value": "bios", "effect": "NoExecute"}), [],
     "k8s: tainted example.com/maintenance"),
    (kube_node(False, {"key": "example.com/maintenance", "effect": "NoSchedule"}),
     [{"key": "example.com/maintenance", "operator": "Exists"}], None),
    (kube_node(False, {"key": "example.com/maintenance", "value": "bios", "effect": "NoSchedule"}),
     [{"key": "example.com/maintenance", "operator": "Equal", "value": "other"}],
     "k8s: tainted example.com/maintenance"),
    (kube_node(False, {"key": "example.com/anything", "effect": "NoExecute"}), [{"operator": "Exists"}], None),
    (kube_node(False, {"key": "example.com/soft", "effect": "PreferNoSchedule"}), [], None),
    # A node condition's taint comes and goes with a blip: not maintenance.
    (kube_node(False, {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"},
               {"key": "node.kubernetes.io/disk-pressure", "effect": "NoSchedule"}), [], None),
    (None, [], None),  # unknown: nothing is drained for it
    # The bridge lent the node (issue 44): its taint keeps new pods off and asks nothing
    # of a worker already there, of this cluster or another; a cordon still counts.
    (kube_node(False, {"key": TAINT_KEY, "value": "demo", "effect": TAINT_EFFECT}), [], None),
    (kube_node(False, {"key": TAINT_KEY, "value": "other", "effect": TAINT_EFFECT}), [], None),
    (kube_node(True, {"key": TAINT_KEY, "value": "demo", "effect": TAINT_EFFECT}), [], CORDONED),
    # Not the taint the bridge writes: NoExecute under that key evicts, it is maintenance.
    (kube_node(False, {"key": TAINT_KEY, "value": "demo", "effect": "NoExecute"}), [],
     f"k8s: tainted {TAINT_KEY}"),
])
def test_maintenance_is_a_cordon_or_a_taint_the_pod_does_not_tolerate(node, tolerations, why):
    assert maintenance(node, tolerations) == why


def test_a_cordoned_node_is_emptied_by_the_rule_and_its_pod_left_to_the_eviction():
    cordoned = replace(pod(1), maintenance=CORDONED, busy_label=True)
    state = slurm(node(f"{STS}-0"), node(f"{STS}-1", "allocated"))
    busy = {f"{STS}-1": [job(7)]}
    d = decide_fully([nodeset(2, 2, pods=[pod(0), cordoned], signal="USR1", grace=60)], state, T0, busy)
    assert d.slurm_actions[0] == Drain(f"{STS}-1", CORDONED)
    assert annotations_of(d, f"{STS}-1")[PURPOSE] == CORDONED

    # Drained and signalled: the grace period runs, the busy label stays (the budget holds the pod).
    record = {STARTED: timestamp(T0), PURPOSE: CORDONED, SIGNALLED: timestamp(T0), SIGNALLED_JOBS: "7"}
    state = slurm(node(f"{STS}-0"), node(f"{STS}-1", "allocated", drain=f"slurmk8s: {CORDONED}"))
    sets = [nodeset(2, 2, pods=[pod(0), replace(cordoned, annotations=record)], signal="USR1", grace=60)]
    d = decide_fully(sets, state, T0 + 30, busy)
    assert not d.slurm_actions and not d.busy_labels
    assert d.waiting == (f"{STS}-1: jobs 7 may run 30s more before they are requeued ({CORDONED})",)

    # Grace over: requeued; the operator deletes nothing, the replicas stay.
    d = decide_fully(sets, state, T0 + 60, busy)
    assert [a for a in d.slurm_actions if isinstance(a, Requeue)] == [Requeue(f"{STS}-1", (7,))]
    assert d.replicas == {STS: 2} and not d.pod_deletions

    # Once Slurm shows it idle, the busy label goes: kubectl drain's eviction passes.
    done = {**record, FORCED: timestamp(T0 + 60)}
    state = slurm(node(f"{STS}-0"), node(f"{STS}-1", drain=f"slurmk8s: {CORDONED}"))
    sets = [nodeset(2, 2, pods=[pod(0), replace(cordoned, annotations=done)], signal="USR1", grace=60)]
    d = decide_fully(sets, state, T0 + 62, {})
    assert d.busy_labels == (LabelBusy(f"{STS}-1", "uid-1", False),)
    assert not any(isinstance(a, Undrain) for a in d.slurm_actions) and not d.pod_deletions
    assert d.waiting == (f"{STS}-1: its Slurm node is empty ({CORDONED}); the pod may be evicted",)


def test_uncordoned_the_node_takes_jobs_again_but_other_drains_stay():
    record = {STARTED: timestamp(T0), PURPOSE: CORDONED}
    state = slurm(node(f"{STS}-0", drain=f"slurmk8s: {CORDONED}"), node(f"{STS}-1", drain="bad DIMM"),
                  node(f"{STS}-2", drain="slurmk8s: health: gpu"))
    pods = [pod(0, **record), replace(pod(1), maintenance=None), pod(2)]
    d = decide_fully([nodeset(3, 3, pods=pods)], state, T0 + 5)
    assert [a for a in d.slurm_actions if isinstance(a, Undrain)] == [Undrain(f"{STS}-0")]
    cleared = annotations_of(d, f"{STS}-0")
    assert set(record) <= set(cleared) and set(cleared.values()) == {None}
    # An administrator's drain on a cordoned node is kept as it is, and the node emptied all the same.
    d = decide_fully([nodeset(3, 3, pods=[pod(0), replace(pod(1), maintenance=CORDONED), pod(2)])], state, T0, {})
    assert not [a for a in d.slurm_actions if isinstance(a, (Drain, Undrain)) and a.node == f"{STS}-1"]


def test_a_rolling_update_leaves_a_pod_under_maintenance_to_its_eviction():
    pods = [pod(0, revision="r1"), replace(pod(1, revision="r1"), maintenance=CORDONED)]
    d = decide_fully([nodeset(2, 2, pods=pods, revision="r2")], slurm(node(f"{STS}-0"), node(f"{STS}-1")), T0, {})
    assert Drain(f"{STS}-0", ROLLING_UPDATE) in d.slurm_actions and Drain(f"{STS}-1", CORDONED) in d.slurm_actions


# Leftover records and removed node sets.


def test_records_of_gone_pods_are_deleted_once_slurm_has_let_go():
    gone = node(f"{STS}-2", state="down", flags=("NOT_RESPONDING",))
    d = decide_fully([nodeset(2, 2)], slurm(node(f"{STS}-0"), node(f"{STS}-1"), gone), T0)
    assert d.record_deletions == (DeleteNodeRecord(f"{STS}-2"),)
    assert [e.reason for e in d.events] == ["NodeRemoved"]
    # Jobs still listed on it: wait for Slurm to end them.
    d = decide_fully([nodeset(2, 2)], slurm(gone), T0, {f"{STS}-2": [job(4)]})
    assert d.record_deletions == ()
    # slurmd still answers (a pod we cannot see yet): wait.
    d = decide_fully([nodeset(2, 2)], slurm(node(f"{STS}-2")), T0)
    assert d.record_deletions == () and d.waiting
    # A terminating pod still holds its record; other node sets' names never match.
    d = decide_fully([nodeset(2, 2, pods=[pod(0), pod(1), pod(2, deleting=True)])],
                     slurm(gone, node("demo-gpu-big-0", state="down"), node("demo-gpu-x", state="down")), T0)
    assert d.record_deletions == ()


def test_a_removed_node_set_is_kept_until_its_pods_and_records_are_gone():
    removed = [NodeSetState(name="gpu", statefulset=STS, desired=0, current=1, pods=(pod(0),))]
    d = decide_fully(removed, slurm(node(f"{STS}-0")), T0)
    assert d.keep == {"gpu"} and d.replicas == {STS: 1} and Drain(f"{STS}-0", SCALE_IN) in d.slurm_actions
    empty = [replace(removed[0], current=0, pods=())]
    d = decide_fully(empty, slurm(node(f"{STS}-0", state="down", drain="slurmk8s: pod terminating")), T0)
    assert d.keep == {"gpu"} and d.record_deletions == (DeleteNodeRecord(f"{STS}-0"),)
    assert decide_fully(empty, slurm(), T0).keep == frozenset()


# Rolling updates.


def test_a_rolling_update_restarts_one_drained_pod_at_a_time_from_the_top():
    pods = [pod(o, revision="old") for o in range(3)]
    state = slurm(*(node(f"{STS}-{o}") for o in range(3)))
    d = decide_fully([nodeset(3, 3, pods=pods, revision="new")], state, T0)
    assert [a for a in d.slurm_actions if isinstance(a, Drain)] == [Drain(f"{STS}-2", ROLLING_UPDATE)]
    assert d.pod_deletions == ()
    pods[2] = pod(2, revision="old", **{STARTED: timestamp(T0), PURPOSE: ROLLING_UPDATE})
    state = slurm(node(f"{STS}-0"), node(f"{STS}-1"), drained(2, ROLLING_UPDATE))
    d = decide_fully([nodeset(3, 3, pods=pods, revision="new")], state, T0 + 1, {f"{STS}-2": [job(1)]})
    assert d.pod_deletions == () and d.replicas == {STS: 3}
    d = decide_fully([nodeset(3, 3, pods=pods, revision="new")], state, T0 + 1)
    assert d.pod_deletions == (DeletePod(f"{STS}-2", "uid-2"),)
    assert not any(isinstance(a, Undrain) for a in d.slurm_actions)  # its drain stays until the pod is gone


def test_a_rolling_update_waits_for_terminating_and_starting_pods():
    state = slurm(*(node(f"{STS}-{o}") for o in range(3)))
    terminating = [pod(0, revision="old"), pod(1, revision="old"), pod(2, revision="old", deleting=True)]
    d = decide_fully([nodeset(3, 3, pods=terminating, revision="new")], state, T0)
    assert not d.slurm_actions and not d.pod_deletions
    starting = [pod(0, revision="old"), pod(1, revision="old"), pod(2, revision="new", ready=False)]
    d = decide_fully([nodeset(3, 3, pods=starting, revision="new")], state, T0)
    assert not d.slurm_actions and "waits for demo-gpu-2 to be ready" in d.waiting[0]
    # Without revisions (an API server that sets none) nothing is restarted.
    d = decide_fully([nodeset(3, 3, pods=[pod(o, revision=None) for o in range(3)], revision=None)], state, T0)
    assert not d.slurm_actions


def test_the_restart_hash_decides_over_the_revision():
    """A new revision whose template differs only in terminationGracePeriodSeconds
    (a killWait change, applied by reconfigure) keeps the restart hash: no restart."""
    state = slurm(*(node(f"{STS}-{o}") for o in range(2)))
    same = [replace(pod(o, revision="old"), restart_hash="h1") for o in range(2)]
    s = replace(nodeset(2, 2, pods=same, revision="new"), restart_hash="h1")
    d = decide_fully([s], state, T0)
    assert not d.slurm_actions and not d.pod_deletions and not d.events
    # A real template change: the highest ordinal drains first, as any rolling update.
    d = decide_fully([replace(s, restart_hash="h2")], state, T0)
    assert [a for a in d.slurm_actions if isinstance(a, Drain)] == [Drain(f"{STS}-1", ROLLING_UPDATE)]
    # A pod from before restart hashes existed: the revision decides.
    d = decide_fully([replace(s, pods=(same[0], pod(1, revision="old")))], state, T0)
    assert [a for a in d.slurm_actions if isinstance(a, Drain)] == [Drain(f"{STS}-1", ROLLING_UPDATE)]


def test_a_rolling_update_mends_broken_pods_first_and_passes_by_foreign_drains():
    pods = [pod(0, revision="old"), pod(1, revision="old", ready=False), pod(2, revision="old")]
    state = slurm(node(f"{STS}-0"), node(f"{STS}-1", state="down"), node(f"{STS}-2", drain="bad DIMM"))
    d = decide_fully([nodeset(3, 3, pods=pods, revision="new")], state, T0)
    assert [a for a in d.slurm_actions if isinstance(a, Drain)] == [Drain(f"{STS}-1", ROLLING_UPDATE)]
    assert any("demo-gpu-2 keeps its old pod template" in w for w in d.waiting)


def test_a_restart_in_progress_keeps_its_drain_while_a_scale_in_goes_first():
    restarting = pod(1, revision="old", **{STARTED: timestamp(T0), PURPOSE: ROLLING_UPDATE})
    pods = [pod(0, revision="old"), restarting, pod(2, revision="old")]
    state = slurm(node(f"{STS}-0"), drained(1, ROLLING_UPDATE), node(f"{STS}-2"))
    d = decide_fully([nodeset(3, 2, pods=pods, revision="new")], state, T0 + 1)
    assert Drain(f"{STS}-2", SCALE_IN) in d.slurm_actions
    assert not any(isinstance(a, (Undrain, DeletePod)) for a in d.slurm_actions)


def test_hold_keeps_every_statefulset_at_least_at_its_current_size():
    sets = [nodeset(3, 1), replace(nodeset(1, 4), name="cpu", statefulset="demo-cpu"),
            replace(nodeset(None, 2), name="new", statefulset="demo-new")]
    d = decide_fully(sets, slurm(*(node(f"{STS}-{o}") for o in range(3))), T0)
    assert d.slurm_actions  # drains for the scale-in
    held = d.hold(sets)
    assert held.replicas == {STS: 3, "demo-cpu": 4, "demo-new": 2}
    assert held.slurm_actions == held.pod_deletions == held.record_deletions == ()
    assert held.keep == {"gpu", "cpu", "new"} and held.events == d.events


# Invariants over random states.

ORDINALS = st.integers(0, 4)
MOSTLY = st.sampled_from([True, True, True, False])
RARELY = st.sampled_from([True] + [False] * 7)


@st.composite
def worlds(draw):
    current = draw(st.one_of(st.none(), ORDINALS))
    desired = draw(ORDINALS)
    revision = draw(st.sampled_from([None, "r1", "r2"]))
    reasons = st.sampled_from([None, "slurmk8s: scale-in", "slurmk8s: rolling update", "slurmk8s: pod terminating",
                               "bad DIMM", "slurmk8s: reclaimed", f"slurmk8s: {CORDONED}", "slurmk8s: health: gpu"])
    pods, nodes, jobs = [], [], {}
    for o in range(5):
        name = f"{STS}-{o}"
        if draw(MOSTLY):
            ann = {}
            if draw(st.booleans()):
                ann = {STARTED: timestamp(T0 - draw(st.integers(0, 600))),
                       PURPOSE: draw(st.sampled_from([SCALE_IN, ROLLING_UPDATE]))}
                if draw(st.booleans()):
                    ann[SIGNALLED] = timestamp(T0 - draw(st.integers(0, 600)))
            pods.append(replace(pod(o, ready=draw(MOSTLY), deleting=draw(RARELY),
                                    revision=draw(st.sampled_from([None, "r1", "r2"])), **ann),
                                maintenance=draw(st.sampled_from([None, None, CORDONED]))))
        if draw(MOSTLY):
            nodes.append(node(name, state=draw(st.sampled_from(["idle", "mixed", "allocated", "down"])),
                              drain=draw(reasons), flags=draw(st.sampled_from([(), (), ("NOT_RESPONDING",)]))))
        if draw(MOSTLY):
            jobs[name] = draw(st.lists(st.builds(
                job, st.integers(10 * o + 1, 10 * o + 9),
                st.sampled_from(["RUNNING", "COMPLETING", "PENDING", "COMPLETED"]), st.booleans(),
                st.sampled_from(["None", "BeginTime"])), max_size=3, unique_by=lambda j: j.job_id))
    s = nodeset(current, desired, pods=pods, revision=revision, grace=draw(st.sampled_from([0, 0, 60, 300])),
                signal=draw(st.sampled_from([None, "USR1"])))
    known = draw(MOSTLY)
    listed = draw(MOSTLY)  # the job read succeeds
    state = SlurmState(tuple(nodes), jobs_on(jobs) if listed else None)
    return s, (state if known else SlurmState.unknown()), jobs if listed else None


@settings(max_examples=1000, deadline=None)
@given(worlds())
def test_invariants(world):
    s, state, by_node = world
    if state.nodes is not None:
        first = decide([s], SlurmState.nodes_only(state.nodes), T0)  # before the jobs are read: nothing done to a job
        assert not any(isinstance(a, (Signal, Requeue, Cancel, StartNow)) for a in first.slurm_actions)
    d = decide([s], state, T0)
    assert not d.needs_jobs
    new = d.replicas[STS]
    assert new >= s.desired
    if s.current is None:
        assert new == s.desired
        return
    assert new <= max(s.current, s.desired)
    if state.nodes is None:
        assert new >= s.current and not d.slurm_actions and not d.pod_deletions and not d.record_deletions
        assert not d.busy_labels
        return
    nodes = state.nodes_by_name
    maintained = {f"{STS}-{p.ordinal}" for p in s.pods if p.maintenance}
    for a in d.slurm_actions:
        if isinstance(a, Undrain):
            # Never someone else's drain, nor a node still under maintenance.
            assert nodes[a.node].reason in OPERATOR_DRAINS | {f"slurmk8s: {CORDONED}"}
            assert a.node not in maintained
        if isinstance(a, Drain):
            assert not nodes[a.node].drain_set  # never overwrite a drain
    pods = {p.ordinal: p for p in s.pods}
    ended = {i for a in d.slurm_actions if isinstance(a, (Requeue, Cancel)) for i in a.job_ids}
    for o in range(new, s.current):  # pods that go now
        name = f"{STS}-{o}"
        n, p = nodes.get(name), pods.get(o)
        if n is None or p is None:
            continue
        assert n.drain_set, "a pod goes only once its node is drained"
        assert by_node is not None, "a pod never goes on a failed job read"
        running = [j for j in by_node.get(name, ()) if j.active and j.state != "COMPLETING"]
        assert all(j.job_id in ended for j in running), "nothing runs on a node whose pod goes"
    assert len(d.pod_deletions) <= 1
    for dp in d.pod_deletions:
        p = next(p for p in s.pods if p.name == dp.pod)
        assert dp.uid == p.uid and not p.deleting and p.revision != s.update_revision
        assert dp.pod not in nodes or by_node is not None
    for rec in d.record_deletions:
        o = int(rec.node.rsplit("-", 1)[1])
        assert o >= s.current and o not in pods
        assert by_node is not None and not any(j.active for j in by_node.get(rec.node, ()))
        assert not (nodes[rec.node].responding and not nodes[rec.node].drain_set)


# Timestamps and reconfigure.


def test_the_record_round_trips_through_annotations_and_bad_times_read_as_none():
    rec = Record(purpose=SCALE_IN, started=from_epoch(T0), signalled=from_epoch(T0 + 5), jobs=(3, 7),
                 forced=from_epoch(T0 + 65))
    assert read_record(record_annotations(rec)) == rec
    assert read_record({STARTED: "yesterday", PURPOSE: SCALE_IN}) == Record(purpose=SCALE_IN)
    # A hand-edited annotation restarts the drain clock instead of failing.
    d = decide_fully([nodeset(1, 0, pods=[pod(0, **{STARTED: "yesterday", PURPOSE: SCALE_IN})])],
                     slurm(drained(0)), T0, {f"{STS}-0": [job(1)]})
    assert annotations_of(d, f"{STS}-0")[STARTED] == timestamp(T0) and d.replicas == {STS: 1}


def test_reconfigure_waits_until_the_agent_sees_the_rendered_files():
    assert decide_reconfigure("new", "new", "old") == (False, None)
    go, why = decide_reconfigure("new", "old", None)
    assert not go and "agent" in why
    go, why = decide_reconfigure("new", "old", "old")
    assert not go and "kubelet" in why
    assert decide_reconfigure("new", "old", "new") == (True, None)
    assert decide_reconfigure("new", None, "new") == (True, None)
