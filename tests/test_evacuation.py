"""The one evacuation rule (slurmk8s.evacuation), without I/O: drain, signal,
grace period, requeue or cancel, start again at once, DOWN for a lost slurmd."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from slurmk8s.evacuation import (
    CANCEL,
    Cancel,
    Drain,
    Policy,
    Record,
    Requeue,
    SetDown,
    Signal,
    StartNow,
    evacuate,
    held,
)
from slurmk8s.slurm.model import Job, Node
from slurmk8s.times import format_time, from_epoch, parse_time

T0 = datetime(2026, 5, 4, 10, 0, tzinfo=UTC)
N = "demo-gpu-1"
POLICY = Policy(purpose="scale-in", drain_reason="scale-in", signal="USR1", grace_seconds=60)


def node(state: str = "mixed", *, drain: str | None = None, flags: tuple = ()) -> Node:
    fl = {"DYNAMIC_NORM", *flags}
    if drain is not None:
        fl.add("DRAIN")
    return Node(name=N, state=state, flags=frozenset(fl), reason=drain or "", features=(), partitions=("gpu",),
                cpus=2, alloc_cpus=0, gres="", address="10.0.0.1")


DRAINED = node(drain="slurmk8s: scale-in")


def job(job_id: int, state: str = "RUNNING", *, requeue: bool = True, reason: str = "None",
        nodes: str = N, eligible: datetime | None = None) -> Job:
    return Job(job_id=job_id, name="train", user="researcher", state=state, partition="gpu", nodes=nodes,
               requeue=requeue, restart_count=0, reason=reason,
               eligible_time=None if eligible is None else int(eligible.timestamp()))


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def started(**kw) -> Record:
    return Record(purpose="scale-in", started=T0, **kw)


def test_a_busy_node_is_drained_and_its_jobs_signalled_in_one_round():
    e = evacuate(N, node(), [job(1), job(2, "COMPLETING")], Record(), POLICY, T0)
    assert e.actions == (Drain(N, "scale-in"), Signal(N, (1,), "USR1"))
    assert e.record == Record(purpose="scale-in", started=T0, signalled=T0, jobs=(1,))
    assert not e.released and not e.empty and "60s to checkpoint" in e.waiting


def test_the_grace_period_runs_from_the_signal_then_jobs_are_requeued_or_cancelled():
    rec = started(signalled=at(5), jobs=(1, 2))
    jobs = [job(1), job(2, requeue=False), job(3, "COMPLETING")]
    e = evacuate(N, DRAINED, jobs, rec, POLICY, at(64))
    assert e.actions == () and e.waiting == "jobs 1,2,3 may run 1s more before they are requeued"
    e = evacuate(N, DRAINED, jobs, rec, POLICY, at(65))
    assert e.actions == (Requeue(N, (1,)), Cancel(N, (2,)))   # --no-requeue: cancelled
    assert e.record == replace(rec, forced=at(65))
    assert e.released and not e.empty   # 3 is completing, and was never signalled


def test_without_a_signal_the_grace_period_runs_from_the_start():
    quiet = replace(POLICY, signal=None, grace_seconds=100)
    assert evacuate(N, DRAINED, [job(1)], started(), quiet, at(99)).actions == ()
    e = evacuate(N, DRAINED, [job(1)], started(), quiet, at(100))
    assert e.actions == (Requeue(N, (1,)),) and e.record.signalled is None


def test_job_action_cancel_cancels_even_requeueable_jobs():
    e = evacuate(N, DRAINED, [job(1)], started(signalled=T0), replace(POLICY, job_action=CANCEL), at(60))
    assert e.actions == (Cancel(N, (1,)),)


def test_a_grace_period_of_zero_signals_and_requeues_in_one_round():
    e = evacuate(N, DRAINED, [job(1)], Record(), replace(POLICY, grace_seconds=0), T0)
    assert e.actions == (Signal(N, (1,), "USR1"), Requeue(N, (1,)))


def test_a_job_that_requeued_itself_is_started_at_once_and_holds_the_node_until_then():
    rec = started(signalled=T0, jobs=(1,))
    # Requeued by its own checkpoint handler: completing on the node first.
    e = evacuate(N, DRAINED, [job(1, "COMPLETING")], rec, POLICY, at(3), recorded=[job(1, "COMPLETING")])
    assert e.actions == () and not e.released
    # Then pending and held for its requeue delay, first seen only in its eligible
    # time, later as reason BeginTime: made eligible now, each time it is seen held.
    for pending in (job(1, "PENDING", nodes="", eligible=at(4 + 31)), job(1, "PENDING", reason="BeginTime", nodes="")):
        e = evacuate(N, DRAINED, [], rec, POLICY, at(4), recorded=[pending])
        assert e.actions == (StartNow(N, (1,)),) and e.empty and not e.released
    # Seen eligible (another reason), or running elsewhere: the node may go.
    for later in (job(1, "PENDING", reason="Resources", nodes="", eligible=at(4)), job(1, nodes="demo-gpu-0")):
        e = evacuate(N, DRAINED, [], rec, POLICY, at(5), recorded=[later])
        assert e.actions == () and e.released


def test_the_node_is_kept_while_slurm_completes_the_last_run_of_a_signalled_job():
    """Requeued by itself, the job shows PENDING (no hold yet) while the node
    still completes its last run; Slurm sets the requeue's hold only then."""
    rec = started(signalled=T0, jobs=(1,))
    pending = job(1, "PENDING", nodes="")
    e = evacuate(N, node(drain="slurmk8s: scale-in", flags=("COMPLETING",)), [], rec, POLICY, at(3),
                 recorded=[pending])
    assert e.actions == () and not e.released and "completing" in e.waiting
    assert evacuate(N, DRAINED, [], rec, POLICY, at(4), recorded=[pending]).released


def test_jobs_that_survive_their_requeue_get_it_again_after_the_retry_interval():
    rec = started(signalled=T0, forced=at(60))
    assert evacuate(N, DRAINED, [job(1)], rec, POLICY, at(89)).actions == ()
    assert evacuate(N, DRAINED, [job(1)], rec, POLICY, at(90)).actions == (Requeue(N, (1,)),)


def test_unknown_jobs_mean_wait():
    e = evacuate(N, node(), None, Record(), POLICY, T0)
    assert e.actions == (Drain(N, "scale-in"),) and not e.released and "could not be listed" in e.waiting
    e = evacuate(N, DRAINED, None, started(signalled=T0), POLICY, at(10_000))
    assert e.actions == () and not e.released


def test_an_empty_node_is_released_only_once_it_was_seen_drained():
    e = evacuate(N, node("idle"), [], Record(), POLICY, T0)
    assert e.actions == (Drain(N, "scale-in"),) and e.empty and not e.released
    e = evacuate(N, node("idle", drain="slurmk8s: scale-in"), [], e.record, POLICY, at(1))
    assert e.actions == () and e.empty and e.released


def test_someone_elses_drain_is_kept_and_the_node_emptied_all_the_same():
    admin = node(drain="bad DIMM")
    e = evacuate(N, admin, [job(1)], Record(), POLICY, T0)
    assert e.actions == (Signal(N, (1,), "USR1"),)


def test_a_node_slurm_does_not_know():
    assert evacuate(N, None, None, Record(), POLICY, T0).released
    assert evacuate(N, None, [], Record(), POLICY, T0).released
    # A job whose node list still names it is dealt with as on any node, without a drain.
    e = evacuate(N, None, [job(1)], started(signalled=T0), POLICY, at(60))
    assert e.actions == (Requeue(N, (1,)),)


def test_a_lost_slurmd_sets_the_node_down_and_its_jobs_are_started_again_at_once():
    e = evacuate(N, node(), [job(1), job(2)], Record(), POLICY, T0, slurmd_gone=True)
    assert e.actions == (Drain(N, "scale-in"), SetDown(N, "scale-in"))
    assert e.record.jobs == (1, 2) and e.record.signalled == T0
    down = node("down", drain="slurmk8s: scale-in")
    pending = [job(1, "PENDING", reason="BeginTime", nodes=""), job(2, "PENDING", reason="BeginTime", nodes="")]
    e = evacuate(N, down, [], e.record, POLICY, at(2), recorded=pending, slurmd_gone=True)
    assert e.actions == (StartNow(N, (1, 2)),) and e.empty


def test_a_record_for_another_purpose_starts_over():
    old = Record(purpose="rolling update", started=T0, signalled=T0, jobs=(1,), forced=T0)
    e = evacuate(N, DRAINED, [job(1)], old, POLICY, at(500))
    assert e.record == Record(purpose="scale-in", started=at(500), signalled=at(500), jobs=(1,))
    assert e.actions == (Signal(N, (1,), "USR1"),)


def test_times_are_one_rfc3339_form():
    assert format_time(T0) == "2026-05-04T10:00:00Z" == format_time(T0.timestamp())
    assert parse_time(format_time(at(0.7))) == T0 and parse_time("soon") is None and parse_time(None) is None
    assert parse_time("2026-05-04T10:00:00") == T0 and from_epoch(T0.timestamp()) == T0


# Invariants over random nodes, jobs and records.

STATES = st.sampled_from(["RUNNING", "RUNNING", "COMPLETING", "PENDING", "COMPLETED", "SUSPENDED"])


@st.composite
def cases(draw):
    drain = draw(st.sampled_from([None, None, "slurmk8s: scale-in", "bad DIMM"]))
    n = draw(st.one_of(st.none(), st.builds(node, st.sampled_from(["idle", "mixed", "allocated", "down"]),
                                            drain=st.just(drain),
                                            flags=st.sampled_from([(), ("COMPLETING",), ("NOT_RESPONDING",)]))))
    jobs = draw(st.one_of(st.none(), st.lists(st.builds(
        job, st.integers(1, 9), STATES, requeue=st.booleans()), max_size=4, unique_by=lambda j: j.job_id)))
    times = st.one_of(st.none(), st.integers(0, 400).map(lambda s: at(-s)))
    rec = Record(purpose=draw(st.sampled_from([None, "scale-in", "rolling update"])), started=draw(times),
                 signalled=draw(times), jobs=tuple(sorted(set(draw(st.lists(st.integers(1, 9), max_size=3))))),
                 forced=draw(times))
    recorded = [job(i, draw(STATES), reason=draw(st.sampled_from(["BeginTime", "Resources"])), nodes="",
                    eligible=draw(st.one_of(st.none(), st.integers(-60, 60).map(at))))
                for i in rec.jobs if draw(st.booleans())]
    policy = Policy(purpose="scale-in", drain_reason="scale-in", signal=draw(st.sampled_from([None, "USR1"])),
                    grace_seconds=draw(st.sampled_from([0, 30, 300])), job_action=draw(st.sampled_from(
                        ["requeue", "cancel"])))
    return n, jobs, rec, recorded, policy, draw(st.booleans())


@settings(max_examples=1000, deadline=None)
@given(cases())
def test_invariants(case):
    n, jobs, rec, recorded, policy, gone = case
    e = evacuate(N, n, jobs, rec, policy, T0, recorded=recorded, slurmd_gone=gone)
    kinds = [type(a) for a in e.actions]
    by_id = {j.job_id: j for j in jobs or []}
    fresh = rec.purpose != policy.purpose or rec.started is None
    if Drain in kinds:
        assert n is not None and not n.drain_set, "never overwrite a drain"
    if jobs is None and n is not None:
        assert set(kinds) <= {Drain} and not e.released, "unknown jobs: wait"
    if e.released:
        assert n is None or n.drain_set, "released only once seen drained"
        forced = {i for a in e.actions if isinstance(a, (Requeue, Cancel)) for i in a.job_ids}
        for j in jobs or []:
            if j.active and j.job_id not in forced:
                assert j.state == "COMPLETING" and j.job_id not in e.record.jobs
        assert not any(held(j, T0) for j in recorded if j.job_id in e.record.jobs), "a held job keeps its record"
    if e.empty:
        assert not any(j.active for j in jobs or []) and (n is None or "COMPLETING" not in n.flags)
    for a in e.actions:
        if isinstance(a, Signal):
            assert policy.signal and (fresh or rec.signalled is None), "one signal per evacuation"
            assert all(by_id[i].state not in ("COMPLETING", "PENDING", "COMPLETED") for i in a.job_ids)
        if isinstance(a, (Requeue, Cancel)):
            assert all(by_id[i].active and by_id[i].state != "COMPLETING" for i in a.job_ids)
            since = e.record.signalled or e.record.started
            assert T0 >= since + timedelta(seconds=policy.grace_seconds), "never before the grace period"
        if isinstance(a, Requeue):
            assert policy.job_action == "requeue" and all(by_id[i].requeue for i in a.job_ids)
        if isinstance(a, Cancel):
            assert policy.job_action == "cancel" or not any(by_id[i].requeue for i in a.job_ids)
        if isinstance(a, StartNow):
            assert set(a.job_ids) <= {j.job_id for j in recorded if held(j, T0)} & set(e.record.jobs)
        if isinstance(a, SetDown):
            assert gone and n is not None and n.state != "down"
    assert e.record.purpose == policy.purpose
    assert e.record.started == (T0 if fresh else rec.started)
    # Stored and decided again at the same instant: no second signal, requeue or cancel.
    drained = n if n is None or Drain not in kinds else replace(n, flags=n.flags | {"DRAIN"})
    again = evacuate(N, drained, jobs, e.record, policy, T0, recorded=recorded, slurmd_gone=gone)
    assert not [a for a in again.actions if isinstance(a, (Drain, Signal, Requeue, Cancel))]
