"""slurmk8s simulate: trace readers, the simulated Slurm and Kubernetes, the bridge's rounds, the command."""

from __future__ import annotations

import json
import math
from datetime import UTC
from itertools import pairwise

import pytest
from click.testing import CliRunner

from slurmk8s.api import load_policy
from slurmk8s.cli import main
from slurmk8s.simulate import engine
from slurmk8s.simulate.engine import Latencies, Run, Shape, bridge_setup, simulate
from slurmk8s.simulate.report import percentile, summary, table
from slurmk8s.simulate.traces import (
    RequestModel,
    ServingPod,
    TraceError,
    TrainingJob,
    read_jobs,
    read_rates,
    read_requests,
    read_serving_pods,
    replicas_from_rates,
    replicas_from_requests,
    window,
)

JSON_KEYS = {"name", "queueing_delay_mean_s", "queueing_delay_p95_s", "jct_mean_s", "gpu_hours_used",
             "gpu_hours_available", "serving_pending_p99_s", "serving_pending_max_s", "reclaims", "lost_gpu_hours"}


def _policy(**spec):
    base = {"clusterRef": {"name": "research"}, "partition": "gpu",
            "nodeSelector": {"matchLabels": {"slurmk8s.dev/lendable": "true"}}, "idleAfterSeconds": 30}
    return load_policy({"apiVersion": "slurmk8s.dev/v1alpha1", "kind": "NodeLendingPolicy",
                        "metadata": {"name": spec.pop("name", "lend"), "namespace": "hpc"},
                        "spec": {**base, **spec}})


def _run(shape, jobs, pods, span, pol=None, mode=None, lat=Latencies(), time_limits=True):
    if pol is None:
        return simulate(shape, jobs, pods, span, Run(mode or "static", mode or "static"), latencies=lat,
                        time_limits=time_limits)
    cluster, labels = bridge_setup(pol)
    return simulate(shape, jobs, pods, span, Run(pol.name, "policy", pol), cluster, labels, lat)


# -- traces ---------------------------------------------------------------


def test_jobs_read_timestamps_or_seconds_sorted_and_errors_name_the_line(tmp_path):
    f = tmp_path / "jobs.csv"
    f.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,66.0,1,66,a\n"
                 "2017-10-09 06:13:03,2951.0,2,5902,b\n")
    jobs = read_jobs(f)
    assert [(j.duration, j.gpus) for j in jobs] == [(2951.0, 2), (66.0, 1)]
    assert jobs[1].submit - jobs[0].submit == (7 * 3600 + 60 + 55) - (6 * 3600 + 13 * 60 + 3)
    kept, t0, span = window(jobs, None, 1)
    assert kept[0].submit == 0 and t0 == jobs[0].submit and span == 86400
    f.write_text("submit_time,duration,num_gpus\n0,10,1\n5,ten,1\n")
    with pytest.raises(TraceError, match=r"jobs.csv:3: duration 'ten' is not a number"):
        read_jobs(f)
    f.write_text("when,duration,num_gpus\n")
    with pytest.raises(TraceError, match="no column submit_time or timestamp"):
        read_jobs(f)


def test_serving_pods_must_end_after_they_start(tmp_path):
    f = tmp_path / "pods.csv"
    f.write_text("start,end,gpus\n10,20,2\n0,5,1\n")
    assert read_serving_pods(f) == [ServingPod(0, 5, 1), ServingPod(10, 20, 2)]
    f.write_text("start,end,gpus\n10,5,2\n")
    with pytest.raises(TraceError, match=":2: end '5' is before start '10'"):
        read_serving_pods(f)


def test_requests_become_replicas_sized_to_the_peak_and_stretched(tmp_path):
    f = tmp_path / "req.csv"
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    # 60 s of light load, then 60 s three times as heavy
    rows += [f"2023-11-16 18:00:{s:02d}.0,90,10" for s in range(60)]
    rows += [f"2023-11-16 18:01:{s:02d}.0,290,10" for s in range(60)]
    f.write_text("\n".join(rows) + "\n")
    requests = read_requests(f)
    model = RequestModel(tokens_per_gpu_second=100, target_utilisation=0.5, bucket_seconds=60, peak_gpus=12)
    pods, stretch, scale = replicas_from_requests(requests, 1200.0, model)
    assert stretch == pytest.approx(1200.0 / 120)
    in_use = lambda t: sum(p.gpus for p in pods if p.start <= t < p.end)  # noqa: E731 - a one-line accessor
    assert in_use(900) == model.peak_gpus  # the busiest window needs the peak
    assert in_use(100) == math.ceil(model.peak_gpus * 100 / 300)  # the light one, in proportion
    # when demand falls, the newest pods end first
    assert all(p.end == 1200.0 for p in pods if p.start == 0)


def test_with_a_daily_cycle_the_hour_repeats_times_the_profile_of_the_day(tmp_path):
    from slurmk8s.simulate.traces import DAILY_PROFILE

    f = tmp_path / "req.csv"
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    # An hour of even load, heavier in its first half.
    rows += [f"2023-11-16 18:{m:02d}:{sec:02d}.0,{190 if m < 30 else 90},10" for m in range(60) for sec in (0, 30)]
    f.write_text("\n".join(rows) + "\n")
    model = RequestModel(tokens_per_gpu_second=100, target_utilisation=0.5, bucket_seconds=60, peak_gpus=100,
                         daily=True)
    pods, stretch, _ = replicas_from_requests(read_requests(f), 2 * 86400.0, model)
    assert stretch == 1.0
    in_use = lambda t: sum(p.gpus for p in pods if p.start <= t < p.end)  # noqa: E731 - a one-line accessor
    peak_hour = DAILY_PROFILE.index(max(DAILY_PROFILE))
    trough_hour = DAILY_PROFILE.index(min(DAILY_PROFILE))
    # The busiest window (the heavy half of the hour, at the day's peak) needs the peak.
    assert in_use(86400 + peak_hour * 3600) == model.peak_gpus
    # The same minute of the hour at the trough: the profile's share of it.
    assert in_use(86400 + trough_hour * 3600) == math.ceil(model.peak_gpus * min(DAILY_PROFILE) - 1e-9)
    # And within the hour, the trace's own variation: the light half is half as heavy.
    assert in_use(peak_hour * 3600 + 30 * 60) == math.ceil(model.peak_gpus / 2 - 1e-9)


def test_a_rate_series_is_replayed_at_its_own_clock_sized_to_the_peak_and_its_gaps_hold(tmp_path):
    f = tmp_path / "rate.csv"
    # Five 10-minute windows: 100 rps, a gap ending in a sliver (one client reporting again), 300 rps, 150 rps.
    f.write_text("t_s,rate_rps\n0,100\n600,0\n1200,0.9\n1800,300\n2400,150\n")
    series = read_rates(f)
    assert series.step == 600 and series.gaps == 2 and series.end == 3000
    assert series.rates == (100, 100, 100, 300, 150)
    model = RequestModel(requests_per_gpu_second=10, target_utilisation=0.5, peak_gpus=12)
    pods, scale = replicas_from_rates(series, 3000.0, model)
    in_use = lambda t: sum(p.gpus for p in pods if p.start <= t < p.end)  # noqa: E731 - a one-line accessor
    assert scale == pytest.approx(12 * 5 / 300)
    # Not stretched: each window at its own time, the busiest needing the peak.
    assert [in_use(t) for t in (300, 900, 1500, 2100, 2700)] == [4, 4, 4, 12, 6]  # the gap keeps the window before
    assert max(p.end for p in pods) == 3000
    # A window longer than the series is refused, not invented.
    with pytest.raises(ValueError, match="covers 0.03 days, the window 0.04"):
        replicas_from_rates(series, 3600.0, model)


def test_rate_timestamps_keep_their_time_of_day_and_bad_rows_are_named(tmp_path):
    f = tmp_path / "rate.csv"
    f.write_text("timestamp,rate\n2024-05-01 10:00:00,0\n2024-05-01 10:10:00,8\n2024-05-01 10:20:00,4\n")
    series = read_rates(f)
    assert series.starts == (36000.0, 36600.0, 37200.0)
    assert series.rates == (8, 8, 4)  # a leading gap takes the first rate after it
    pods, _ = replicas_from_rates(series, 37800.0, RequestModel(requests_per_gpu_second=1, target_utilisation=1,
                                                                peak_gpus=8))
    assert sum(p.gpus for p in pods if p.start <= 100 < p.end) == 8  # before the first row: its rate
    f.write_text("t_s,rate_rps\n0,1\n600,-2\n")
    with pytest.raises(TraceError, match=r"rate.csv:3: rate '-2' must be a number >= 0"):
        read_rates(f)
    f.write_text("t_s,rate_rps\n0,0\n600,0\n")
    with pytest.raises(TraceError, match="every window's rate is 0"):
        read_rates(f)
    f.write_text("t_s,rate_rps\n0,1\n0,2\n")
    with pytest.raises(TraceError, match=r":3: a second row for time 0"):
        read_rates(f)


# -- the simulated Slurm ------------------------------------------------------


def test_static_slurm_is_fifo_with_easy_backfill_and_gang_allocation_when_runtimes_are_limits():
    shape = Shape(nodes=2, gpus_per_node=4, slurm_nodes=2)
    jobs = [TrainingJob(0, 0, 100, 8),   # both nodes, 100 s
            TrainingJob(1, 1, 100, 8),   # waits for the first: reserved at 100
            TrainingJob(2, 2, 50, 4),    # would delay the reservation: waits
            TrainingJob(3, 3, 10, 1)]    # also waits: nothing is free before 100
    r = _run(shape, jobs, [], 1000, time_limits=True)
    assert r.delay_of == {0: 0, 1: 99, 2: 198, 3: 197}
    jobs = [TrainingJob(0, 0, 100, 6),   # a node and a half
            TrainingJob(1, 1, 100, 4),   # needs a whole node: waits for the first
            TrainingJob(2, 2, 50, 2)]    # ends before the reservation, fits in the half: backfilled now
    r = _run(shape, jobs, [], 1000, time_limits=True)
    assert r.delay_of == {0: 0, 1: 99, 2: 0}
    one = Shape(nodes=1, gpus_per_node=4, slurm_nodes=1)
    jobs = [TrainingJob(0, 0, 100, 2),
            TrainingJob(1, 1, 100, 4),   # reserved at 100
            TrainingJob(2, 2, 500, 2)]   # fits now, but would delay the reservation: waits for it
    r = _run(one, jobs, [], 2000, time_limits=True)
    assert r.delay_of == {0: 0, 1: 99, 2: 198}


def test_without_time_limits_every_job_that_fits_starts_in_order():
    one = Shape(nodes=1, gpus_per_node=4, slurm_nodes=1)
    jobs = [TrainingJob(0, 0, 100, 2), TrainingJob(1, 1, 100, 4), TrainingJob(2, 2, 500, 2)]
    r = _run(one, jobs, [], 2000, time_limits=False)
    assert r.delay_of == {0: 0, 2: 0, 1: 2 + 500 - 1}  # no reservation: the big job waits for both


def test_the_scheduler_plans_with_time_limits_where_jobs_give_them():
    one = Shape(nodes=1, gpus_per_node=4, slurm_nodes=1)

    def delays(first_limit):
        return _run(one, [TrainingJob(0, 0, 100, 2, limit=first_limit),
                          TrainingJob(1, 1, 100, 4),               # reserved when the first one's limit ends
                          TrainingJob(2, 2, 50, 2, limit=500)], [], 2000).delay_of

    # The first job's limit ends at 1000: the second job waits for it, and the third (its limit at 502) fits before.
    assert delays(1000) == {0: 0, 1: 99, 2: 0}
    # Its limit is its runtime: the reservation is at 100, which the third job's limit would pass, so it waits.
    assert delays(None) == {0: 0, 1: 99, 2: 198}
    with pytest.raises(ValueError, match=r"training job 0: its time limit \(50 s\) is shorter than its duration"):
        _run(one, [TrainingJob(0, 0, 100, 2, limit=50)], [], 200)


def test_the_bridges_rounds_read_the_clock_from_the_epoch_given(monkeypatch):
    from datetime import datetime, timedelta

    calls = []
    real = engine.decide
    monkeypatch.setattr(engine, "decide", lambda *a: calls.append(a[2]) or real(*a))
    pol = _policy()
    cluster, labels = bridge_setup(pol)
    epoch = datetime(2026, 11, 27, 21, 7, 3, tzinfo=UTC)
    simulate(Shape(2, 4, 1), [], [], 30, Run(pol.name, "policy", pol), cluster, labels, Latencies(interval=5),
             epoch=epoch)
    assert calls[0] == epoch and calls[-1] <= epoch + timedelta(seconds=30)
    assert all(b > a for a, b in pairwise(calls))


def test_serving_pods_wait_for_free_gpus_and_their_pending_time_is_measured():
    lat = Latencies()
    shape = Shape(nodes=2, gpus_per_node=4, slurm_nodes=1)
    pods = [ServingPod(0, 100, 4), ServingPod(10, 200, 2)]
    r = _run(shape, [], pods, 300, lat=lat)
    assert sorted(r.serving_pending) == [lat.pod_start, 100 - 10 + lat.pod_start]
    assert r.gpu_seconds_serving == pytest.approx(4 * 100 + 2 * (200 - 100) - 4 * lat.pod_start - 2 * lat.pod_start)


# -- the bridge's rounds --------------------------------------------------------


def test_decide_is_called_every_round_and_an_idle_node_is_lent_after_idle_after_seconds(monkeypatch):
    calls = []
    real = engine.decide
    monkeypatch.setattr(engine, "decide", lambda *a: calls.append(a[2]) or real(*a))
    pol = _policy(idleAfterSeconds=30)
    lat = Latencies(interval=5)
    shape = Shape(nodes=2, gpus_per_node=4, slurm_nodes=1)
    jobs = [TrainingJob(0, 0, 500, 4), TrainingJob(1, 0, 100, 4)]
    r = _run(shape, jobs, [], 400, pol, lat=lat)
    assert len(calls) == r.rounds >= 400 / lat.interval
    assert r.lends == 1 and r.reclaims == 0
    # the second job ran on the lent node: it waited for idleAfterSeconds, a tick, the lend latency
    assert pol.spec.idle_after_seconds + lat.lend <= r.delay_of[1] <= (pol.spec.idle_after_seconds + lat.lend
                                                                         + 2 * lat.interval)
    assert r.gpu_seconds_lent == pytest.approx(4 * 100)


def test_a_pod_takes_a_busy_lent_node_back_and_the_job_loses_its_work():
    pol = _policy(idleAfterSeconds=0, reclaim={"gracePeriodSeconds": 0})
    lat = Latencies(interval=5)
    shape = Shape(nodes=2, gpus_per_node=4, slurm_nodes=1)
    jobs = [TrainingJob(0, 0, 1000, 4), TrainingJob(1, 0, 300, 4)]
    pods = [ServingPod(100, 200, 4)]
    r = _run(shape, jobs, pods, 2000, pol, lat=lat)
    assert r.reclaims == 1 and r.reclaim_reasons == {"demand": 1} and r.requeued == 1
    assert r.lends == 2  # lent again once the pod ended
    # the pod waited for the round after it appeared, the job's requeue, the hand-back and its own start
    least = lat.round_delay + lat.requeue + lat.reclaim + lat.pod_start
    assert len(r.serving_pending) == 1 and least - 1e-9 <= r.serving_pending[0] <= least + 2 * lat.round_delay + 1e-9
    # no checkpoint: everything the job did on the lent node is lost
    ran = 100 + lat.round_delay - r.delay_of[1]
    assert r.lost_gpu_seconds == pytest.approx(4 * ran, abs=4 * 0.2)
    # Without a forecast no lent node is ever reserved: the job started on one that had no reservation.
    assert r.lost_gpu_seconds_unreserved == r.lost_gpu_seconds
    assert summary(r)["lost_gpu_hours_started_unreserved"] == pytest.approx(r.lost_gpu_seconds / 3600)


def test_a_checkpointing_job_keeps_its_work_when_the_grace_period_covers_the_checkpoint():
    lat = Latencies(interval=5, checkpoint=20)
    shape = Shape(nodes=2, gpus_per_node=4, slurm_nodes=1)
    jobs = [TrainingJob(0, 0, 1000, 4), TrainingJob(1, 0, 300, 4)]
    pods = [ServingPod(100, 200, 4)]
    r = _run(shape, jobs, pods, 2000, _policy(idleAfterSeconds=0, reclaim={"gracePeriodSeconds": 30}), lat=lat)
    assert r.requeued == 1
    # it loses only the grace period it ran after the signal (and its restart)
    assert 4 * 30 <= r.lost_gpu_seconds <= 4 * (30 + lat.interval + 1)
    assert max(r.serving_pending) >= 30


def test_the_rounds_steps_reach_the_simulated_slurm_through_the_one_executor_and_its_refusals():
    from slurmk8s.slurm import steps

    shape = Shape(nodes=2, gpus_per_node=4, slurm_nodes=2)
    sim = engine._Sim(shape, [TrainingJob(0, 0, 1000, 4), TrainingJob(1, 0, 1000, 4)], [], 2000, Latencies(),
                      Run("static", "static"), None, {}, 100, 10, None)
    sim.queue.extend([0, 1])
    sim.schedule()
    a, b = sorted(sim.snodes)
    sim.jobs[1].requeue = False  # submitted with --no-requeue
    on_b = next(iter(sim.snodes[b].jobs)) + 1
    out = steps.execute(sim.slurm_control, [
        steps.Drain(a, "reclaimed"), steps.DeleteNode(a), steps.Drain(a, "never"),  # busy: the chain stops
        steps.Signal(b, (on_b,), "USR1"), steps.Requeue(b, (on_b,)), steps.Drain("nowhere", "x"),
    ])
    assert [type(x).__name__ for x, _ in out.failed] == ["DeleteNode", "Drain"]
    assert "Requested nodes are busy" in out.failed[0][1] and out.skipped == [steps.Drain(a, "never")]
    assert sim.snodes[a].drain and sim.snodes[a].reason == "slurmk8s: reclaimed"
    # Slurm refuses to requeue a --no-requeue job: reported, and the step counts as done
    assert [e.reason for e in out.refusals] == ["RequeueRefused"] and out.jobs["signalled"] == 1
    assert sim.jobs[on_b - 1].state == "running" and sim.jobs[on_b - 1].signalled == 0
    steps.execute(sim.slurm_control, [steps.Cancel(b, (on_b,))])
    assert sim.jobs[on_b - 1].state == "cancelling" and sim.res.cancelled == 1
    # an undrain clears slurmk8s's own drain only
    sim.snodes[b].drain, sim.snodes[b].reason = True, "maintenance"
    out = steps.execute(sim.slurm_control, [steps.Undrain(a), steps.Undrain(b)])
    assert not sim.snodes[a].drain and sim.snodes[b].drain and [e.reason for e in out.refusals] == ["UndrainRefused"]


def test_the_oracle_never_reclaims_and_bounds_the_policies():
    shape = Shape(nodes=4, gpus_per_node=4, slurm_nodes=2)
    jobs = [TrainingJob(i, 20 * i, 200 + 37 * (i % 5), 1 + i % 4) for i in range(40)]
    pods = [ServingPod(100 * k, 100 * k + 60, 4) for k in range(8)]
    static = summary(_run(shape, jobs, pods, 1200))
    oracle = summary(_run(shape, jobs, pods, 1200, mode="oracle"))
    policy = summary(_run(shape, jobs, pods, 1200, _policy(idleAfterSeconds=0, reclaim={"gracePeriodSeconds": 0})))
    assert oracle["reclaims"] == 0 and oracle["lost_gpu_hours"] == 0 and oracle["serving_pending_max_s"] == 0
    assert oracle["gpu_hours_used"] >= static["gpu_hours_used"]
    assert policy["reclaims"] > 0
    assert oracle["queueing_delay_mean_s"] <= static["queueing_delay_mean_s"]
    text = table([static, policy, oracle])
    assert text.splitlines()[1].startswith("static") and "of oracle" in text.splitlines()[0]


def test_a_selector_that_matches_no_simulated_node_is_refused():
    pol = _policy(nodeSelector={"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}],
                                "matchLabels": {"pool": "x"}})
    assert bridge_setup(pol)[1]["pool"] == "x"
    with pytest.raises(ValueError, match="--node-label"):
        bridge_setup(pol, {"pool": "y"})


def test_a_policy_that_lends_parts_of_nodes_is_refused_not_simulated_as_whole_nodes():
    with pytest.raises(ValueError, match="spec.minFreeGpus is not simulated"):
        bridge_setup(_policy(minFreeGpus=2))


def test_percentile_is_nearest_rank():
    assert percentile([3, 1, 2, 4], 50) == 2 and percentile([3, 1, 2, 4], 99) == 4 and percentile([], 99) == 0


# -- the command ------------------------------------------------------------------


def test_help_explains_every_input():
    out = CliRunner().invoke(main, ["simulate", "--help"]).output
    for flag in ("--nodes", "--gpus-per-node", "--slurm-nodes", "--jobs", "--serving-pods", "--serving-requests",
                 "--serving-rate", "--requests-per-gpu-second", "seasonalDays", "seasonalWeeks", "--policy", "--compare", "--json", "--plot", "--days", "--start", "--lend-seconds",
                 "--reclaim-seconds", "--interval", "bench_lending"):
        assert flag in out


def test_the_command_compares_and_writes_json_and_plots(tmp_path):
    (tmp_path / "jobs.csv").write_text("submit_time,duration,num_gpus\n" + "".join(
        f"{30 * i},{300 + 50 * (i % 3)},{1 + i % 4}\n" for i in range(30)))
    (tmp_path / "pods.csv").write_text("start,end,gpus\n100,200,4\n400,600,8\n")
    pol = tmp_path / "p.yaml"
    pol.write_text("apiVersion: slurmk8s.dev/v1alpha1\nkind: NodeLendingPolicy\nmetadata: {name: p, namespace: hpc}\n"
                   "spec:\n  clusterRef: {name: research}\n  partition: gpu\n"
                   "  nodeSelector: {matchLabels: {slurmk8s.dev/lendable: 'true'}}\n  idleAfterSeconds: 10\n")
    res = CliRunner().invoke(main, ["simulate", "--nodes", "4", "--gpus-per-node", "4", "--jobs",
                                    str(tmp_path / "jobs.csv"), "--serving-pods", str(tmp_path / "pods.csv"),
                                    "--policy", str(pol), "--compare", "--days", "0.02", "--no-progress",
                                    "--json", str(tmp_path / "out.json"), "--plot", str(tmp_path / "plots")])
    assert res.exit_code == 0, res.output
    runs = json.loads((tmp_path / "out.json").read_text())["runs"]
    assert [r["name"] for r in runs] == ["static", "p", "oracle"]
    assert all(JSON_KEYS <= set(r) for r in runs)
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["lent_nodes.png", "queueing_cdf.png",
                                                                       "utilisation.png"]
    bad = CliRunner().invoke(main, ["simulate", "--jobs", str(tmp_path / "jobs.csv")])
    assert bad.exit_code != 0 and "--serving-pods FILE, --serving-requests FILE or --serving-rate FILE" in bad.output


def test_the_command_replays_a_rate_series_and_refuses_a_window_it_does_not_cover(tmp_path):
    (tmp_path / "jobs.csv").write_text("submit_time,duration,num_gpus\n" + "".join(
        f"{30 * i},{300 + 50 * (i % 3)},{1 + i % 4}\n" for i in range(30)))
    (tmp_path / "rate.csv").write_text("t_s,rate_rps\n" + "".join(f"{600 * i},{[3, 0, 9, 6][i % 4]}\n"
                                                                  for i in range(6)))
    args = ["simulate", "--nodes", "4", "--gpus-per-node", "4", "--jobs", str(tmp_path / "jobs.csv"),
            "--serving-rate", str(tmp_path / "rate.csv"), "--no-progress"]
    res = CliRunner().invoke(main, [*args, "--days", "0.04", "--json", str(tmp_path / "out.json")])
    assert res.exit_code == 0, res.output
    inputs = json.loads((tmp_path / "out.json").read_text())["inputs"]
    assert inputs["serving_rate_gaps"] == 2 and inputs["serving_rate_window_s"] == 600
    assert inputs["serving_peak_gpus"] == 8  # the Kubernetes nodes' GPUs
    bad = CliRunner().invoke(main, [*args, "--days", "1"])
    assert bad.exit_code == 1 and "covers 0.04 days, the window 1.00: give --days 0.04 or less" in bad.output
