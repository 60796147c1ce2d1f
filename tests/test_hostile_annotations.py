"""Issue 41, items 2 and 4: strings on Nodes and Pods that anyone with patch
may write. Reading them never raises (one strict reader, slurmk8s/strict.py),
no error stops the bridge's round, and a time on a Node can never make a
grace period or a deadline longer than the policy allows from the first
round that saw it."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from slurmk8s import strict
from slurmk8s.api import load_cluster
from slurmk8s.bridge import actions as A
from slurmk8s.bridge.decide import DEFAULT_RECLAIM, orphaned_policies
from slurmk8s.bridge.nodestate import (
    FORCED_ANNOTATION,
    FREE_GPUS_ANNOTATION,
    FREE_SINCE_ANNOTATION,
    IDLE_SINCE_ANNOTATION,
    JOBS_ANNOTATION,
    LENDING,
    LENDING_ANNOTATIONS,
    RECLAIMING,
    SIGNALLED_ANNOTATION,
    SINCE_ANNOTATION,
    STATE_LABEL,
    TAINT_EFFECT,
    TAINT_KEY,
    UNATTRIBUTED,
    LendingRecord,
    format_time,
)
from slurmk8s.bridge.observed import NodeTaint, node_from_api, pod_from_api
from slurmk8s.evacuation import parse_job_ids
from slurmk8s.operator import podrecord
from slurmk8s.operator.observe import observe_nodesets
from slurmk8s.operator.workers import decide as workers_decide
from slurmk8s.render import names
from slurmk8s.slurm.model import Job, Node, SlurmState
from slurmk8s.slurm.steps import Requeue

from .lending_sim import T0, World, job, slurm_node
from .test_decide import POLICY, held_node, kinds, lent_world, of, slurmd

DEADLINE = POLICY.spec.reclaim.grace_period_seconds + POLICY.spec.reclaim.deadline_seconds
GRACE = POLICY.spec.reclaim.grace_period_seconds

#: Digits of other scripts that str.isdigit() takes (and some that int() takes).
ODD_DIGITS = ["²", "³", "¹", "٣", "۷", "०", "１", "𝟘", "⁴", "①"]
#: Times at the edges of what a datetime holds, and of RFC 3339.
EDGE_TIMES = ["9999-12-31T23:59:59Z", "0001-01-01T00:00:00Z", "0001-01-01T00:00:00+01:00",
              "9999-12-31T23:59:59-01:00", "9999-12-31T23:59:59.999999999Z", "2026-02-30T00:00:00Z",
              "2026-01-01T24:00:00Z", "２０２６-01-01T00:00:00Z", "2026-01-01T00:00:00+99:99", "2026-01-01t00:00:00z",
              "2026-01-01T00:00:00", "2026-01-01"]


def numberish() -> st.SearchStrategy[str]:
    """Strings that look like numbers, or nearly: ASCII and other scripts' digits, huge ones, signs, lists."""
    digit = st.sampled_from([*"0123456789", *ODD_DIGITS])
    return st.one_of(
        st.text(digit, min_size=1, max_size=6),
        st.integers(0, 2**70).map(str),
        st.integers(-10, 10).map(lambda n: f"{n:+d}"),
        st.sampled_from(["", " 7", "7 ", "1_000", "0x10", "1e3", "inf", "NaN", "9" * 5000, "-0"]),
        st.lists(st.one_of(st.integers(0, 2**40).map(str), st.text(digit, min_size=1, max_size=3),
                           st.sampled_from(["x", "", " 3 ", "-1"])), max_size=6).map(",".join),
    )


def timeish() -> st.SearchStrategy[str]:
    """RFC 3339 times, well and badly formed, at the edges of the calendar and far in the future."""
    fine = st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30),
                        timezones=st.just(UTC)).map(format_time)
    offset = st.tuples(st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31)),
                       st.integers(-23, 23), st.integers(0, 59)).map(
        lambda t: t[0].strftime("%Y-%m-%dT%H:%M:%S").rjust(19, "0") + f"{'+' if t[1] >= 0 else '-'}"
                                                                      f"{abs(t[1]):02d}:{t[2]:02d}")
    return st.one_of(fine, offset, st.sampled_from(EDGE_TIMES), st.text(max_size=30),
                     st.text(st.sampled_from([*"0123456789-:TZ.+", *ODD_DIGITS]), max_size=30))


KEYS = [*LENDING_ANNOTATIONS, names.DRAIN_STARTED, names.JOBS_SIGNALLED, names.SIGNALLED_JOBS, names.JOBS_FORCED,
        names.DRAIN_PURPOSE]
TIME_KEYS = {SINCE_ANNOTATION, SIGNALLED_ANNOTATION, FORCED_ANNOTATION, IDLE_SINCE_ANNOTATION, FREE_SINCE_ANNOTATION,
             names.DRAIN_STARTED, names.JOBS_SIGNALLED, names.JOBS_FORCED}


@st.composite
def annotations(draw) -> dict[str, str]:
    """Our own keys with numbers, times and junk, and keys of anyone's."""
    out = {}
    for key in draw(st.lists(st.sampled_from(KEYS), unique=True, max_size=len(KEYS))):
        if key in TIME_KEYS:
            value = timeish()
        elif key == FREE_GPUS_ANNOTATION:  # often a count, so that a free-since record reads often enough
            value = st.one_of(st.integers(0, 9999).map(str), numberish())
        elif key in (JOBS_ANNOTATION, names.SIGNALLED_JOBS):  # lists of ids, some in other scripts' digits
            value = st.one_of(numberish(), st.lists(st.one_of(st.integers(0, 2**33).map(str),
                                                              st.sampled_from(ODD_DIGITS)), max_size=5).map(",".join))
        else:
            value = st.one_of(numberish(), st.text(max_size=20))
        out[key] = draw(value)
    if draw(st.booleans()):  # a free-GPU record, often one that reads
        out[FREE_SINCE_ANNOTATION] = draw(st.one_of(st.just(format_time(T0)), timeish()))
        out[FREE_GPUS_ANNOTATION] = draw(st.one_of(st.integers(0, 9999).map(str), numberish()))
    out.update(draw(st.dictionaries(st.text(max_size=20), st.text(max_size=20), max_size=3)))
    return out


labels = st.dictionaries(st.one_of(st.just(STATE_LABEL), st.text(max_size=20)),
                         st.one_of(st.sampled_from([LENDING, "lent", RECLAIMING, "", "²"]), st.text(max_size=10)),
                         max_size=3)
taints = st.lists(st.builds(dict, key=st.one_of(st.just(TAINT_KEY), st.text(max_size=10)),
                            value=st.one_of(st.text(max_size=10), st.just("demo")),
                            effect=st.one_of(st.just(TAINT_EFFECT), st.text(max_size=10))), max_size=3)


def test_reading_any_annotations_labels_and_taints_never_raises():
    """Every reader of Node and Pod strings (the bridge's Node record and Node
    and Pod parsers, the operator's pod record and worker pods, the strict
    readers themselves) on any strings; the examples reach each case."""
    seen: Counter = Counter()

    @settings(max_examples=300, derandomize=True, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(ann=annotations(), lab=labels, tnt=taints, transition=timeish(), gpus=numberish())
    def check(ann, lab, tnt, transition, gpus):
        obj = {"metadata": {"name": "n1", "labels": lab, "annotations": ann},
               "spec": {"taints": tnt},
               "status": {"allocatable": {"nvidia.com/gpu": gpus, "cpu": gpus, "memory": gpus},
                          "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": transition}]}}
        node = node_from_api(obj)
        rec = node.record
        assert rec == LendingRecord.read(lab, ann, tuple(NodeTaint(**t) for t in tnt))
        assert node.gpus >= 0
        pod = pod_from_api({"metadata": {"name": "p", "namespace": "x", "labels": lab, "annotations": ann},
                            "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": gpus}}}],
                                     "priority": gpus}})
        assert pod.gpus >= 0
        record = podrecord.read_record(ann)
        observe_nodesets_of(ann, gpus, obj)
        for t in (rec.since, rec.signalled, rec.forced, rec.idle_since, record.started, record.signalled,
                  record.forced, node.not_ready_since):
            assert t is None or (t.tzinfo is UTC and format_time(t))  # readable, and writable back
        # A node held (our label, any value, or our taint) is someone's: a policy's, or a holder's
        # that orphaned_policies yields when no policy exists; never nobody's (issue 41).
        assert (rec.holder is not None) == (rec.state is not None or rec.taint is not None)
        if rec.holder is not None:
            assert rec.holder in {h.key for h in orphaned_policies([node], existing=[])}, rec
        # What the examples reach: the interesting branches, counted.
        raw_free = ann.get(FREE_GPUS_ANNOTATION)
        branches = {
            "free-gpus with other digits": raw_free is not None and any(d in raw_free for d in ODD_DIGITS),
            "free-since read": rec.free_since is not None,
            "job ids with other digits": any(d in ann.get(JOBS_ANNOTATION, "") + ann.get(names.SIGNALLED_JOBS, "")
                                             for d in ODD_DIGITS),
            "job ids read": bool(rec.signalled_jobs or record.jobs),
            "time read": any(t is not None for t in (rec.since, rec.signalled, record.signalled)),
            "time unreadable": any(ann.get(k) and parse is None for k, parse in (
                (SINCE_ANNOTATION, rec.since), (SIGNALLED_ANNOTATION, rec.signalled),
                (names.JOBS_SIGNALLED, record.signalled))),
            "year 9999 or 0001": any(t is not None and t.year in (1, 9999) for t in (
                rec.since, rec.signalled, rec.forced, rec.idle_since, node.not_ready_since)),
            "lending state": rec.state in (LENDING, "lent", RECLAIMING),
            "our taint": rec.taint is not None,
            "held, no policy can be told": rec.holder is not None and rec.holder.startswith(UNATTRIBUTED),
        }
        seen["examples"] += 1
        for name, hit in branches.items():
            if hit:
                event(name)
                seen[name] += 1

    check()
    shares = {name: seen[name] / seen["examples"] for name in seen if name != "examples"}
    low = {name: share for name, share in shares.items() if share < 0.05}
    assert len(shares) == 10 and not low, shares


def observe_nodesets_of(ann: dict[str, str], suffix: str, node: dict) -> None:
    """The operator reads its worker pods (names with any ordinal, any annotations, on ``node``) and decides on them."""
    cluster = WORKERS
    sts = names.nodeset(cluster, "gpu")
    pods = [{"metadata": {"name": f"{sts}-{s}", "labels": {names.NODESET_LABEL: "gpu"}, "annotations": ann},
             "spec": {"nodeName": "n1"}} for s in (suffix, "0")]
    sets = observe_nodesets(cluster, [{"metadata": {"name": sts, "labels": {names.NODESET_LABEL: "gpu"}},
                                       "spec": {"replicas": 2}}], pods, {"n1": node})
    assert all(0 <= p.ordinal <= 99999 for s in sets for p in s.pods)
    state = SlurmState.nodes_only([worker(f"{sts}-0")])
    first = workers_decide(sets, state, T0.timestamp())
    workers_decide(sets, state.with_jobs(()), T0.timestamp()) if first.needs_jobs else None


WORKERS = load_cluster({"apiVersion": "slurmk8s.dev/v1alpha1", "kind": "SlurmCluster",
                        "metadata": {"name": "demo", "namespace": "hpc"},
                        "spec": {"nodeSets": [{"name": "gpu", "replicas": 0}]}})


def worker(name: str, drained: bool = True) -> Node:
    return Node(name=name, state="idle", flags=frozenset({"DYNAMIC_NORM", *(["DRAIN"] if drained else [])}),
                reason="slurmk8s: scale-in" if drained else "",
                features=("gpu",), partitions=("gpu",), cpus=2, alloc_cpus=0, gres="", address="10.0.0.1")


@pytest.mark.parametrize("value,expected", [
    ("²", None), ("٣", None), ("１", None), (" 7", None), ("1_000", None), ("+1", None), ("", None),
    ("7", 7), ("0009", 9), ("9999", 9999), ("10000", None), ("9" * 5000, None)])
def test_a_count_is_ascii_digits_within_its_bound(value, expected):
    """Before: free-gpus "²" passed isdigit() and failed int(); "٣" read as 3."""
    assert strict.count(value, 9999) == expected


def test_job_ids_keep_only_what_reads_as_a_slurm_job_id():
    """Before: "²" in reclaim-jobs or signalled-jobs raised ValueError."""
    assert parse_job_ids("²,x, 12 ,٣,4294967295,4294967296,-1,7") == (12, 4294967295, 7)


@pytest.mark.parametrize("value", EDGE_TIMES[1:])
def test_a_time_is_rfc_3339_in_utc_or_nothing(value):
    t = strict.parse_time(value)
    assert t is None or (t.tzinfo is UTC and strict.parse_time(format_time(t, millis=True)) is not None)


def test_the_year_one_is_written_so_that_it_reads_back():
    """strftime wrote the year 1 as "1", which no reader takes."""
    t = datetime(1, 1, 1, 1, tzinfo=UTC)
    assert format_time(t) == "0001-01-01T01:00:00Z" and strict.parse_time(format_time(t)) == t


# -- the bridge's loop: an unrelated Node's garbage stops nothing -------------------------------

from .test_bridge_loop import idle_node, lend_two, world  # noqa: E402,F401 (world: the bridge tests' fixture)


def test_an_unrelated_node_with_unreadable_annotations_stops_no_lending_or_reclaim(world):  # noqa: F811 - the fixture imported above
    """Issue 41, item 2: "²" in free-gpus or reclaim-jobs on any Node left
    Bridge.round() with a ValueError, so nothing was lent or reclaimed anywhere."""
    cluster, bridge, memory = world
    lend_two(cluster, bridge, memory)
    cluster.node("other", cpu="8", memory="64Gi", labels={"pool": "web"}, extra={"nvidia.com/gpu": "²"}, ready=True)
    cluster.core.patch_node("other", {"metadata": {
        "labels": {STATE_LABEL: RECLAIMING},
        "annotations": {FREE_GPUS_ANNOTATION: "²", FREE_SINCE_ANNOTATION: format_time(T0),
                        JOBS_ANNOTATION: "²,x,٣", SINCE_ANNOTATION: "9999-12-31T23:59:59-01:00",
                        SIGNALLED_ANNOTATION: "0001-01-01T00:00:00+01:00", IDLE_SINCE_ANNOTATION: "٢٠٢٦"}}})
    # Lend one more, and take one back (maxLentNodes 1): both happen in the same rounds.
    idle_node(cluster, "gpu-c")
    cluster.custom.patch_namespaced_custom_object("slurmk8s.dev", "v1alpha1", "default", "nodelendingpolicies",
                                                  "lend", {"spec": {"maxLentNodes": 1}})
    report = bridge.round()
    assert not report.errors, report.errors
    states = {n: (cluster.core.read_node(n).metadata.labels or {}).get(STATE_LABEL) for n in ("gpu-a", "gpu-b")}
    assert sorted(states.values(), key=str) == [None, "lent"], states  # one handed back, one kept
    assert STATE_LABEL not in (cluster.core.read_node("gpu-c").metadata.labels or {})  # the cap holds
    # No policy holds the unrelated node: its reclaim is counted from this round (its time read as
    # now) and it goes back by the defaults' deadline, its record cleared (decision record 46).
    other = cluster.core.read_node("other").metadata
    assert other.labels[STATE_LABEL] == RECLAIMING and other.annotations[JOBS_ANNOTATION] == "²,x,٣"
    assert other.annotations[SINCE_ANNOTATION] == format_time(bridge.clock())
    later = bridge.clock() + timedelta(seconds=DEFAULT_RECLAIM.grace_period_seconds + DEFAULT_RECLAIM.deadline_seconds)
    bridge.clock = lambda: later
    assert not bridge.round().errors
    other = cluster.core.read_node("other").metadata
    assert STATE_LABEL not in (other.labels or {}) and JOBS_ANNOTATION not in (other.annotations or {})


def test_an_error_outside_every_policy_is_reported_and_the_next_round_runs(world, monkeypatch):  # noqa: F811 - the fixture imported above
    """No round-level error leaves Bridge.round(): the loop (run_forever) would die with it."""
    from slurmk8s.bridge import loop

    cluster, bridge, _ = world
    idle_node(cluster, "gpu-a")

    def broken(*args, **kw):
        raise ValueError("invalid literal for int() with base 10: '²'")

    monkeypatch.setattr(loop, "orphaned_policies", broken)
    report = bridge.round()
    assert report.errors and "ValueError" in report.errors[0] and "²" in report.errors[0]
    monkeypatch.undo()
    assert not bridge.round().errors
    assert cluster.core.read_node("gpu-a").metadata.labels[STATE_LABEL] == "lending"


# -- item 4: times on Nodes count from the first round that saw them ------------------------------

FAR = T0 + timedelta(days=3650)
YEAR_9999 = "9999-12-31T23:59:59Z"


def run_until_returned(w: World, pol, start: datetime, limit: timedelta, *, lying: bool = True):
    """Rounds every 10 s from ``start``: (when the node n1 was handed back or None, every action)."""
    now, seen = start, []
    while now <= start + limit:
        acts = w.decide(pol, now)
        seen += acts
        w.apply([a for a in acts if not isinstance(a, (A.Event, A.PolicyStatus))])
        if lying:  # the job never ends, whatever it is told
            w.jobs[1] = job(1, "n1")
        if STATE_LABEL not in w.nodes["n1"].labels:
            return now, seen
        now += timedelta(seconds=10)
    return None, seen


@pytest.mark.parametrize("annotation", [SINCE_ANNOTATION, SIGNALLED_ANNOTATION, FORCED_ANNOTATION])
@pytest.mark.parametrize("value", [format_time(FAR), YEAR_9999, "²", "soon"], ids=["far", "9999", "digit", "junk"])
def test_a_reclaiming_node_goes_back_within_grace_plus_deadline_of_the_first_round_whatever_its_times(
        annotation, value):
    """A far-future lending-since, reclaim-signalled or reclaim-forced kept the
    node reclaiming for ever (year 9999: OverflowError, the policy's round
    failed each time); an unreadable lending-since stopped the deadline."""
    recent = format_time(T0 - timedelta(seconds=5))
    ann = {"slurmk8s.dev/reclaim-reason": "demand", SIGNALLED_ANNOTATION: recent, JOBS_ANNOTATION: "1",
           FORCED_ANNOTATION: recent, annotation: value}
    node = held_node("n1", RECLAIMING, since=T0 - timedelta(seconds=5), **ann)
    if annotation == SINCE_ANNOTATION:
        node = held_node("n1", RECLAIMING, **{**ann, SINCE_ANNOTATION: value})
    w = World.of(nodes=[node], pods=[slurmd("n1")], snodes=[slurm_node("n1", state="mixed")], jobs=[job(1, "n1")])
    returned, acts = run_until_returned(w, POLICY, T0, timedelta(seconds=DEADLINE + 120))
    assert returned is not None and returned - T0 <= timedelta(seconds=DEADLINE + 10), returned
    clamped = of(acts, A.ClampTimes)
    if annotation == SINCE_ANNOTATION or value in (format_time(FAR), YEAR_9999):
        assert clamped and clamped[0].at == T0, acts  # written as the first round's time
        assert ("n1", "TimeCorrected") in {(e.name, e.reason) for e in of(acts, A.Event)}


@pytest.mark.parametrize("value", [format_time(FAR), YEAR_9999])
def test_a_future_signal_time_gives_the_jobs_the_grace_period_from_the_first_round_then_a_requeue(value):
    """Not the deadline's forced hand-back: the ordinary graceful reclaim, on time."""
    node = held_node("n1", RECLAIMING, **{"slurmk8s.dev/reclaim-reason": "demand", SIGNALLED_ANNOTATION: value,
                                          JOBS_ANNOTATION: "1"})
    w = World.of(nodes=[node], pods=[slurmd("n1")], snodes=[slurm_node("n1", state="mixed")], jobs=[job(1, "n1")])
    now = T0
    while not of(acts := w.decide(POLICY, now), Requeue):
        w.apply([a for a in acts if not isinstance(a, (A.Event, A.PolicyStatus))])
        now += timedelta(seconds=10)
        assert now - T0 <= timedelta(seconds=GRACE + 10), "no requeue within the grace period"
    assert now - T0 >= timedelta(seconds=GRACE)
    assert not of(acts, A.RecordDownOwed)


@pytest.mark.parametrize("value", [format_time(FAR), YEAR_9999, "", "٢٠٢٦-01-01T00:00:00Z"])
def test_a_lending_node_with_a_future_or_unreadable_since_meets_its_registration_timeout(value):
    """A lending-since in the future kept a node that never registers lending for ever."""
    node = held_node("n1", LENDING, **{SINCE_ANNOTATION: value})
    w = World.of(nodes=[node], pods=[slurmd("n1", phase="Pending")])
    timeout = POLICY.spec.registration_timeout_seconds
    now = T0
    while True:
        acts = w.decide(POLICY, now)
        if any(isinstance(a, A.SetLendingState) and a.reason == "registration-timeout" for a in acts):
            break
        w.apply([a for a in acts if not isinstance(a, (A.Event, A.PolicyStatus))])
        now += timedelta(seconds=10)
        assert now - T0 <= timedelta(seconds=timeout + 20), "the registration timeout never came"


def test_times_in_the_past_or_now_are_taken_as_they_are():
    """Nothing to correct: no patch, and a round decides as before."""
    w = lent_world("n1", jobs=[job(1, "n1")])
    assert not of(w.decide(POLICY, T0), A.ClampTimes)
    w.nodes["n1"] = held_node("n1", "lent", since=T0)
    assert not of(w.decide(POLICY, T0), A.ClampTimes)
    assert kinds(w.decide(POLICY, T0)) == []


# -- the operator: a worker pod's record ------------------------------------------------------------

STS = "demo-gpu"


def worker_set(ann: dict[str, str], grace: int = 60):
    from slurmk8s.operator.workers import NodeSetState, Pod

    pods = (Pod(name=f"{STS}-0", uid="u0", ordinal=0, ready=True, deleting=False, revision="r1", annotations={}),
            Pod(name=f"{STS}-1", uid="u1", ordinal=1, ready=True, deleting=False, revision="r1",
                annotations=ann))
    return [NodeSetState(name="gpu", statefulset=STS, desired=1, current=2, update_revision="r1", pods=pods,
                         grace_period=grace, signal="USR1")]


def busy_slurm() -> SlurmState:
    """Worker 0 stays; worker 1 is drained for the scale-in and runs job 7."""
    running = Job(job_id=7, name="train", user="u", state="RUNNING", partition="gpu", nodes=f"{STS}-1",
                  requeue=True, restart_count=0, reason="None")
    return SlurmState.nodes_only([worker(f"{STS}-0", drained=False), worker(f"{STS}-1")]).with_jobs((running,))


def test_the_operator_reads_signalled_jobs_it_cannot_parse_as_none():
    """Issue 41, item 2: "²" in signalled-jobs failed every round of the cluster."""
    ann = {names.DRAIN_STARTED: format_time(T0), names.DRAIN_PURPOSE: "scale-in",
           names.JOBS_SIGNALLED: format_time(T0), names.SIGNALLED_JOBS: "²,x,7"}
    assert podrecord.read_record(ann).jobs == (7,)
    d = workers_decide(worker_set(ann), busy_slurm(), T0.timestamp() + 1)
    assert d.waiting and "may run" in d.waiting[0]


@pytest.mark.parametrize("value", [format_time(FAR), YEAR_9999])
def test_a_future_signal_time_on_a_worker_pod_counts_from_the_first_round(value):
    """The grace period of a scale-in runs from the round that saw the time, and that time is stored."""
    ann = {names.DRAIN_STARTED: format_time(T0), names.DRAIN_PURPOSE: "scale-in",
           names.JOBS_SIGNALLED: value, names.SIGNALLED_JOBS: "7"}
    first = workers_decide(worker_set(ann), busy_slurm(), T0.timestamp())
    stored = {k: v for a in first.slurm_actions if type(a).__name__ == "AnnotatePod" for k, v in a.annotations}
    assert stored.get(names.JOBS_SIGNALLED) == format_time(T0), first.slurm_actions
    ann = {**ann, **stored}
    later = workers_decide(worker_set(ann), busy_slurm(), T0.timestamp() + 60)
    assert Requeue(f"{STS}-1", (7,)) in later.slurm_actions, later.waiting
