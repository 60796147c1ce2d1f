"""Lending with foresight (slurmk8s/bridge/foresight.py) through the bridge's own decide."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from slurmk8s.api.lending import NodeLendingPolicyStatus
from slurmk8s.bridge import actions as A
from slurmk8s.bridge import forecast as F
from slurmk8s.bridge.choose import at_risk
from slurmk8s.bridge.foresight import Foresight, demand_status
from slurmk8s.bridge.nodestate import LENT, POLICY_ANNOTATION
from slurmk8s.slurm.steps import DeleteNode, Reserve, Unreserve

from .lending_sim import T0, World, gpu_node, gpu_pod, job, policy, settle, slurm_node
from .test_decide import IDLE, held_node, kinds, lent_world, of, reclaiming_node, status

FORECAST = {"quantilePercent": 95, "headroomSeconds": 600, "reserveSeconds": 86400}


def history(world: World, values, end=T0):
    """The policy's status holds ``values``, one per bucket, ending just before ``end``."""
    start = end - timedelta(seconds=F.STEP * len(values))
    rec = None
    for i, v in enumerate(values):
        rec = F.record(rec, start + timedelta(seconds=i * F.STEP), v)
    fs = Foresight(rec, 0, 0, (), ())
    world.status = NodeLendingPolicyStatus(demand=demand_status(fs))


def saw(rise: int, every: int, days: float = 2):
    """Demand that rises by ``rise`` nodes once in ``every`` buckets, for a
    bucket, halfway through each period (so the record ends low)."""
    return [rise if i % every == every // 2 else 0 for i in range(int(days * 86400 / F.STEP))]


def test_the_demand_seen_is_recorded_in_the_status_and_read_back():
    w = World.of(nodes=[gpu_node("n1"), gpu_node("n2")], pods=[gpu_pod("p", node="n1")])
    pol = policy(forecast=FORECAST)
    acts = w.decide(pol, T0)
    rec = status(acts).demand
    assert F.decode(rec.start, rec.peaks).peaks == (1,)
    w.apply(acts)
    w.pods[("apps", "q")] = gpu_pod("q", node="n2")
    again = status(w.decide(pol, T0 + timedelta(seconds=60))).demand
    assert F.decode(again.start, again.peaks).peaks == (2,)
    # Without spec.forecast nothing is recorded.
    assert status(World.of(nodes=[gpu_node("n1")]).decide(policy(), T0)).demand is None


def test_a_node_handed_back_is_not_demand_while_its_slurmd_pod_ends():
    """A reclaim deletes the lent slurmd pod and clears the node's record in
    one round; until the pod is gone the node is busy (not lent again) but
    Kubernetes does not want it: counting it would make every reclaim a
    rise the forecast then keeps nodes for."""
    w = lent_world("n1", "n2")
    pol = policy(forecast=FORECAST, maxLentNodes=0)
    now = T0
    for _ in range(4):  # until both are handed back, their pods still ending
        w.apply([a for a in w.decide(pol, now) if not isinstance(a, A.Event)])
        now += timedelta(seconds=1)
        if all(n.record.state is None for n in w.nodes.values()):
            break
    assert all(n.record.state is None for n in w.nodes.values())
    assert sum(p.deleting for p in w.pods.values()) == 2
    acts = w.decide(pol, now)
    assert not of(acts, A.SetLendingState)  # busy: not lent again yet
    w.apply(acts)
    rec = w.status.demand
    assert set(F.decode(rec.start, rec.peaks).peaks) == {0}
    # A serving pod beside the ending one is demand.
    w.pods[("apps", "serve")] = gpu_pod("serve", node="n1")
    rec = status(w.decide(pol, now)).demand
    assert F.decode(rec.start, rec.peaks).peaks[-1] == 1


def test_headroom_keeps_the_nodes_the_forecast_wants_unlent():
    nodes = [gpu_node(f"n{i}", annotations=IDLE) for i in range(5)]
    w = World.of(nodes=nodes)
    history(w, saw(3, every=4))  # +3 nodes within the next bucket, a quarter of the time
    acts = w.decide(policy(forecast=FORECAST), T0)
    assert len(of(acts, A.SetLendingState)) == 2
    assert status(acts).counts.kubernetes == 3 and status(acts).demand.forecast_nodes == 3
    # No headroom asked for: every idle node is lent.
    acts = w.decide(policy(forecast={**FORECAST, "headroomSeconds": 0}), T0)
    assert len(of(acts, A.SetLendingState)) == 5


def test_a_rising_forecast_takes_idle_lent_nodes_back_and_reserves_the_cheapest_busy_one_from_now():
    now = int(T0.timestamp())
    jobs = [replace(job(1, "a"), end_time=now + 7200), replace(job(2, "b"), end_time=now + 600)]
    w = lent_world("a", "b", "c", jobs=jobs)
    history(w, saw(2, every=4))
    acts = w.decide(policy(forecast=FORECAST), T0)
    # Idle c goes back at once; no job is hurried for a forecast: b, whose job
    # ends sooner than a's, takes no new job from now on.
    assert {a.node: a.reason for a in of(acts, A.SetLendingState)} == {"c": "forecast"}
    assert "Signal" not in kinds(acts) and "Requeue" not in kinds(acts)
    # a, whose job runs longer, is not lent past the policy's reach (a day).
    assert sorted((r.node, r.start) for r in of(acts, Reserve)) == [("a", now + 86400), ("b", now)]


def test_the_reclaim_order_is_the_policys():
    now = int(T0.timestamp())
    jobs = [replace(job(1, "a"), end_time=now + 600), replace(job(2, "a"), end_time=now + 900),
            replace(job(3, "b"), end_time=now + 86400)]
    w = lent_world("a", "b", jobs=jobs)
    history(w, saw(1, every=4))
    cheapest = policy(forecast=FORECAST)
    fewest = policy(forecast=FORECAST, reclaim={"order": "FewestJobs"})

    def first_reserved(pol):
        return min(of(w.decide(pol, T0), Reserve), key=lambda r: r.start).node

    assert first_reserved(cheapest) == "a"
    assert first_reserved(fewest) == "b"
    # A pending pod takes the first in that order back, as without a forecast.
    w.pods[("apps", "p")] = gpu_pod("p", gpus=8)
    assert [a.node for a in of(w.decide(cheapest, T0), A.SetLendingState)] == ["a"]
    assert [a.node for a in of(w.decide(fewest, T0), A.SetLendingState)] == ["b"]


def test_the_cheapest_busy_node_is_the_one_whose_jobs_lose_fewest_gpu_seconds():
    now = int(T0.timestamp())
    # a: one 8-GPU job 10 h in, ending in 10 min; b: one 8-GPU job 20 min in, ending in a day;
    # c: a job 10 h in whose checkpoint is 5 min old; d: a job whose start is not reported.
    jobs = [replace(job(1, "a"), gpus=8, start_time=now - 36000, end_time=now + 600),
            replace(job(2, "b"), gpus=8, start_time=now - 1200, end_time=now + 86400),
            replace(job(3, "c"), gpus=8, start_time=now - 36000, checkpoint_time=now - 300, end_time=now + 86400),
            replace(job(4, "d"), gpus=8, end_time=now + 60)]

    def first_back(*nodes: str) -> str:  # the node a pending 8-GPU pod takes back
        w = lent_world(*nodes, jobs=[j for j in jobs if j.nodes in nodes], pods=[gpu_pod("p", gpus=8)])
        [back] = of(w.decide(policy(), T0), A.SetLendingState)
        return back.node

    assert [first_back("a", "b", "c", "d"), first_back("a", "b", "d"), first_back("a", "d")] == ["c", "b", "a"]
    # In whole GPU-hours: 2 GPUs for 1 h are 2; jobs minutes apart tie, and their time limits decide.
    assert at_risk(replace(job(5, "e"), gpus=2, start_time=now - 3600), now) == 2
    assert at_risk(replace(job(6, "e"), gpus=1, start_time=now - 600), now) == 0


def test_lent_nodes_get_reservations_when_the_forecast_wants_them_back():
    w = lent_world("a", "b", "c")
    # +1 node now and then (two days: the time of day is not read yet): within
    # half an hour the forecast wants one node, never two.
    history(w, saw(1, every=32))
    pol = policy(forecast={**FORECAST, "headroomSeconds": 0})
    acts = w.decide(pol, T0)
    reserve = {r.node: r.start for r in of(acts, Reserve)}
    now = int(T0.timestamp())
    # The first to go back is wanted within a bucket; the others are not lent
    # past the policy's reach: a day.
    assert reserve == {"a": now + 900, "b": now + 86400, "c": now + 86400}
    w.apply(acts)
    assert w.reserved == reserve
    # Deciding again a little later changes nothing; much later it moves them along.
    assert of(w.decide(pol, T0 + timedelta(seconds=60)), Reserve) == []
    later = {r.node: r.start for r in of(w.decide(pol, T0 + timedelta(hours=7)), Reserve)}
    assert set(later) == {"a", "b", "c"} and all(later[n] > reserve[n] for n in later)


def test_a_reservation_moves_to_what_the_record_can_tell_and_goes_when_nothing_is_known():
    w = lent_world("a", "b")
    now = int(T0.timestamp())
    w.reserved = {"a": now + 3600}
    history(w, [0] * 200)  # a flat demand: nothing is wanted back within the policy's reach (a day)
    acts = w.decide(policy(forecast=FORECAST), T0)
    assert {r.node: r.start for r in of(acts, Reserve)} == {"a": now + 86400, "b": now + 86400}
    assert of(acts, Unreserve) == []
    # Three days asked for (the default), two days recorded: rises are known
    # over 32 hours (the longest horizon with enough of the record after it), not beyond.
    acts = w.decide(policy(forecast={"quantilePercent": 95}), T0)
    horizon = max(h for h in F.reserve_horizons(F.STEP, 3 * 86400) if h <= 2 * 86400 - F.MIN_SAMPLES * F.STEP)
    assert horizon == 32 * 3600
    assert {r.node: r.start for r in of(acts, Reserve)} == {"a": now + horizon, "b": now + horizon}
    # A record too short to tell any horizon: nothing is reserved (as without a forecast).
    history(w, [0] * 4)
    acts = w.decide(policy(forecast=FORECAST), T0)
    assert [u.node for u in of(acts, Unreserve)] == ["a"] and of(acts, Reserve) == []
    # Without spec.forecast, too.
    history(w, [0] * 200)
    assert [u.node for u in of(w.decide(policy(), T0), Unreserve)] == ["a"]


def test_a_reclaim_removes_the_reservation_before_the_node_leaves_slurm():
    w = lent_world("a", pods=[gpu_pod("p", gpus=8)])  # a pending pod takes it back
    w.reserved = {"a": int(T0.timestamp()) + 3600}
    now = settle(w, policy(forecast=FORECAST), T0, rounds=6)
    steps = [(k, n) for k, _, n in w.log if k in ("unreserve", "reserve")]
    assert ("unreserve", "a") in steps and w.reserved == {}
    assert "a" not in w.snodes and w.nodes["a"].record.state is None
    assert now > T0


def test_the_unreserve_comes_first_in_the_reclaims_last_chain():
    w = World.of(nodes=[reclaiming_node("a")], snodes=[], jobs=[])
    w.reserved = {"a": int(T0.timestamp())}
    acts = [a for a in w.decide(policy(), T0) if isinstance(a, (Unreserve, DeleteNode, A.Untaint))]
    assert [type(a).__name__ for a in acts][:2] == ["Unreserve", "Untaint"]
    # Slurm's reservations unknown: the reclaim still asks Slurm to remove one, whatever it has.
    w.reservations_known = False
    assert of(w.decide(policy(), T0), Unreserve)


def test_a_reservation_on_a_node_no_policy_holds_is_removed_and_another_policys_is_kept():
    w = World.of(nodes=[gpu_node("free"), held_node("theirs", LENT, **{POLICY_ANNOTATION: "hpc/other"})])
    w.reserved = {"free": 1, "theirs": 2, "gone": 3}
    acts = w.decide(policy(), T0)
    assert sorted(u.node for u in of(acts, Unreserve)) == ["free", "gone"]


def test_nothing_is_reserved_while_slurms_reservations_are_unknown():
    w = lent_world("a", "b")
    w.reservations_known = False
    history(w, saw(1, every=32, days=4))
    assert of(w.decide(policy(forecast={**FORECAST, "headroomSeconds": 0}), T0), Reserve) == []


def test_a_ghost_slurm_node_loses_its_reservation_before_it_is_deleted():
    w = World.of(nodes=[gpu_node("g")], snodes=[slurm_node("g")])
    w.reserved = {"g": int(T0.timestamp())}
    acts = [a for a in w.decide(policy(), T0) if isinstance(a, (Unreserve, DeleteNode))]
    assert acts == [Unreserve("g"), DeleteNode("g")]


def test_the_same_time_of_day_reserves_the_evenings_nodes_while_today_is_quieter():
    """Five days of 1 node by day and 3 from 19:00 to 21:00; today the day
    has been at 0. From the recent peak the evening is a rise of 2; the
    same time of day on past days says 3, and 1 now: the daily answer keeps
    one node and reserves the three lent ones before the evening."""
    def at(i: int) -> int:  # bucket i of the record, which ends at T0 (12:00)
        hour = (i // 4 + 12) % 24
        return 3 if 19 <= hour < 21 else (0 if i >= 5 * 96 - 48 else 1)
    now = int(T0.timestamp())
    jobs = [replace(job(i, n), end_time=now + 3 * 86400) for i, n in enumerate("abc", 1)]

    def decided(days: int):
        w = lent_world("a", "b", "c", jobs=jobs)
        history(w, [at(i) for i in range(5 * 96)])
        acts = w.decide(policy(forecast={**FORECAST, "seasonalDays": days}), T0)
        return status(acts).demand, {r.node: (r.start - now) // 3600 for r in of(acts, Reserve)}

    demand, reserved = decided(0)
    assert (demand.forecast_nodes, demand.forecast_basis) == (None, None)
    assert reserved == {"a": 4, "b": 4, "c": 24}  # c: not wanted within the reach (a day)
    demand, reserved = decided(7)
    assert (demand.forecast_nodes, demand.forecast_basis) == (1, "daily")
    assert reserved == {"a": 0, "b": 4, "c": 4}  # a: the headroom's, from now (its job is not hurried)
