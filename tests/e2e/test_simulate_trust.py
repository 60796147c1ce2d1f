"""The simulator against the real thing: short traces, replayed in the sandbox and in `slurmk8s simulate`.

The sandbox's two lendable GPU nodes (4 GPUs each; the `gpu` partition has
no node of its own), the real bridge (a round every second and at every
watched change) and real Slurm run a synthetic trace: training jobs
(`sleep`, 2 GPUs each, requeued when their node is taken back) and bursts
of serving pods that need whole nodes. The times at which the test
actually submitted each job and created and deleted each pod are then
replayed in the simulator, on the same shape, with the same policy, and the
bridge's decide() at every round:

- the lends and reclaims must be as many (the bridge's metrics: lends
  registered, reclaims completed);
- the same jobs must start, and their queueing delays agree: their mean
  (the figure the simulator reports) within MEAN_TOLERANCE, each job within
  JOB_TOLERANCE. Real Slurm starts a job at a scheduling pass (the main one
  at job events, the backfill pass every bf_interval, 30 s by default) where
  the simulator starts it the instant it fits: up to 30 s for one job, about
  half that on average, hence 15 s for the mean. One job whose slot frees
  within a pass of a burst's start may start before the burst in one and
  after it in the other; that costs it the burst (40 s at most here) and the
  lend after it (idle 2 s, registration about 1 s, a round), hence 60 s for
  any one job.

Two traces, one sandbox:

- **plain**: the policy without a forecast; three bursts, of one node, two
  nodes, one node, each taking busy lent nodes back.
- **forecast**: the same policy lending with foresight, the forecast's
  defaults. Both worlds start from the one demand record (seven days
  without serving demand, written into the policy's status as the bridge
  keeps it) and read it by the same clock: the simulator's epoch is the
  moment the sandbox's trace began. Each lent node is reserved from the
  forecast's reach (three days) on; the first burst takes a busy node back,
  after which the forecast keeps that node for Kubernetes (the recent peak
  is its headroom), so the later bursts find it free and nothing else is
  reclaimed. The jobs give time limits (3 minutes); one more asks for four
  days and must start in neither world, although a lent node is idle.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest

from slurmk8s.api import load_policy
from slurmk8s.api.lending import ForecastSpec
from slurmk8s.bridge import forecast
from slurmk8s.simulate.engine import Latencies, Run, Shape, bridge_setup, simulate
from slurmk8s.simulate.traces import ServingPod, TrainingJob

from .conftest import default_release_only
from .lending import LEND, SERVE_IMAGE, Lending, lending_sandbox, policy, wait_for

pytestmark = pytest.mark.slurm
SUBNET = "10.253.92.0/24"
MEAN_TOLERANCE = 15.0
JOB_TOLERANCE = 60.0


@dataclass(frozen=True)
class Trace:
    #: (second, gpus, duration): the training jobs, as submitted. One size, so that every way Slurm may
    #: order its queue (priority, backfill with or without time limits) starts the same job in a free slot:
    #: what is compared is lending, not Slurm's scheduling policy.
    jobs: list[tuple[float, int, float]]
    #: (second created, second deleted, how many pods of a whole node's 4 GPUs)
    bursts: list[tuple[float, float, int]]
    #: the policy's spec.forecast (None: none)
    forecast: dict | None = None
    #: each job's time limit (--time, minutes; None: none)
    minutes: int | None = None
    #: (second, time limit in minutes) of a job that asks for more than any lent node is lent for
    too_long: tuple[float, int] | None = None
    #: the demand record both worlds start from, one peak per 15-minute bucket
    record: list[int] = field(default_factory=list)


TRACES = {
    "plain": Trace(
        jobs=[(5, 2, 60), (5, 2, 40), (6, 2, 80), (8, 2, 50), (12, 2, 30), (20, 2, 45),
              (60, 2, 30), (62, 2, 40), (95, 2, 20), (100, 2, 50), (130, 2, 30), (140, 2, 30)],
        bursts=[(30, 70, 1), (110, 150, 2), (185, 215, 1)]),
    "forecast": Trace(
        jobs=[(5, 2, 50), (5, 2, 40), (6, 2, 60), (8, 2, 45), (12, 2, 30), (20, 2, 40), (60, 2, 30), (62, 2, 30)],
        bursts=[(30, 70, 1), (110, 150, 1), (160, 190, 1)],
        forecast={}, minutes=3, too_long=(150, 4 * 24 * 60), record=[0] * (7 * 86400 // forecast.STEP)),
}

JOB = """#!/bin/bash
#SBATCH -p gpu -N 1 --requeue --open-mode=append
#SBATCH -o /shared/researcher/trust-%j.out
date +%s.%N >> /shared/researcher/trust-$SLURM_JOB_NAME.start
sleep "$TRUST_SECONDS"
"""


def _policy(trace: Trace, **extra) -> dict:
    spec = {"idleAfterSeconds": 2, "reclaim": {"gracePeriodSeconds": 0, "signal": "USR1"}, **extra}
    if trace.forecast is not None:
        spec["forecast"] = trace.forecast
    return policy(**spec)


@pytest.fixture(scope="module")
def world(tmp_path_factory, release) -> Lending:
    with lending_sandbox(tmp_path_factory.mktemp("simulate-trust"), SUBNET, release) as w:
        yield w


def _counts(world: Lending) -> tuple[float, float]:
    m = world.metrics()
    lends = m.get(("slurmk8s_bridge_lend_seconds_count", ()), 0.0)
    reclaims = sum(v for (name, _), v in m.items() if name == "slurmk8s_bridge_reclaim_seconds_count")
    return lends, reclaims


def _serving_pod(world: Lending, name: str) -> None:
    world.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default",
                                                                "labels": {"app": "serve"}},
                 "spec": {"terminationGracePeriodSeconds": 0,  # gone when deleted, as in the trace
                          "containers": [{"name": "serve", "image": SERVE_IMAGE, "command": ["sleep", "3600"],
                                          "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}})


def _demand(world: Lending) -> dict | None:
    return (world.policy().get("status") or {}).get("demand")


def _seed(world: Lending, trace: Trace) -> None:
    """The policy with nothing lent (maxLentNodes 0) until its status holds the
    trace's record, and the bridge's rounds keep it (two seconds of rounds)."""
    world.apply(_policy(trace, maxLentNodes=0))
    wait_for("both nodes back", lambda: all(world.returned(n) for n in LEND), timeout=60, show=world.states)

    def kept(written: dict) -> dict | None:
        for _ in range(2):
            if (_demand(world) or {}).get("start") != written["start"]:
                return None
            time.sleep(2)
        return written

    world.seeded(trace.record, kept)


def _settled(world: Lending) -> bool:
    """No node on its way to Slurm or back."""
    return all(s in (None, "lent") for s in world.states().values())


@default_release_only
@pytest.mark.timeout(1200)  # each trace is three or four minutes, then its jobs finish
@pytest.mark.parametrize("name", list(TRACES))
def test_the_simulator_agrees_with_the_sandbox(world, name):
    trace = TRACES[name]
    r = world.researcher
    r.put(JOB, "/shared/researcher/trust.sh")
    jobs = list(trace.jobs) + ([(trace.too_long[0], 2, 60)] if trace.too_long else [])
    long = len(trace.jobs) if trace.too_long else None
    if trace.forecast is not None:
        _seed(world, trace)
    assert world.states() == {LEND[0]: None, LEND[1]: None}
    before = _counts(world)
    demand = _demand(world) if trace.forecast is not None else None

    # The trace, in the sandbox: every step at its second, the actual time kept.
    steps = sorted([(s, "job", k) for k, (s, _, _) in enumerate(jobs)]
                   + [(a, "create", k) for k, (a, _, _) in enumerate(trace.bursts)]
                   + [(b, "delete", k) for k, (_, b, _) in enumerate(trace.bursts)])
    tag = f"{name}-"
    t0 = time.time()
    world.apply(_policy(trace))
    submitted: dict[int, float] = {}
    ids: dict[int, int] = {}
    pods: dict[tuple[int, int], list[float]] = {}
    try:
        for second, what, k in steps:
            time.sleep(max(0.0, t0 + second - time.time()))
            if what == "job":
                _, gpus, duration = jobs[k]
                minutes = trace.too_long[1] if k == long else trace.minutes
                at = time.time()
                out = r.sbatch("/shared/researcher/trust.sh", f"--gpus={gpus}", f"--job-name=trust{tag}{k}",
                               f"--export=ALL,TRUST_SECONDS={duration}",
                               *([f"--time={minutes}"] if minutes else []), cwd="/shared/researcher")
                submitted[k], ids[k] = at, int(out)
            else:
                for i in range(trace.bursts[k][2]):
                    at = time.time()
                    if what == "create":
                        _serving_pod(world, f"trust-{tag}{k}-{i}")
                        pods[(k, i)] = [at]
                    else:
                        world.kubectl("delete", "pod", f"trust-{tag}{k}-{i}", "--wait=false")
                        pods[(k, i)].append(at)

        short = [k for k in range(len(jobs)) if k != long]

        def starts() -> dict[int, float] | None:
            found = {}
            for k in short:
                path = f"/shared/researcher/trust-trust{tag}{k}.start"
                if not r.exists(path):
                    return None
                found[k] = float(r.read(path).split()[0])
            return found

        started = wait_for("every job to start", starts, timeout=600, every=2)
        wait_for("every job to end", lambda: r.check("squeue -h -o %i").split() == [str(ids[k]) for k in ids
                                                                                     if k == long],
                 timeout=600, every=2)
        if trace.forecast is None:
            wait_for("both nodes lent again", world.all_lent, show=world.states, timeout=120)
        else:
            wait_for("the nodes settled", lambda: _settled(world), show=world.states, timeout=120)
        if long is not None:
            # Idle GPUs on a lent node, and still it waits: every lent node is reserved before its limit ends.
            assert any(world.lent(n) for n in LEND), world.states()
            job = wait_for("the long job held back by the reservations",
                           lambda: (j := r.job(ids[long])).get("Reason", "").startswith("ReqNodeNotAvail") and j,
                           timeout=60, every=2, show=lambda: (r.job(ids[long]), world.reservations()))
            assert job["JobState"] == "PENDING", job
            assert not r.exists(f"/shared/researcher/trust-trust{tag}{long}.start")
            reach = ForecastSpec().reserve_seconds  # the default
            assert all(t0 < start <= time.time() + reach for start in world.reservations().values()), \
                world.reservations()
        time.sleep(3)
        after = _counts(world)
    finally:
        if ids:
            r.check(f"scancel {' '.join(map(str, ids.values()))}")
    real_lends, real_reclaims = after[0] - before[0], after[1] - before[1]

    # The same trace in the simulator, at the times it actually happened, from the same record.
    doc = _policy(trace)
    if demand is not None:
        doc["status"] = {"demand": demand}
    pol = load_policy(doc)
    cluster, labels = bridge_setup(pol)
    limit = {k: (trace.too_long[1] if k == long else trace.minutes) for k in range(len(jobs))}
    order = sorted(range(len(jobs)), key=lambda k: submitted[k])
    result = simulate(Shape(2, 4, 0),
                      [TrainingJob(i, submitted[k] - t0, jobs[k][2], jobs[k][1],
                                   limit=60.0 * limit[k] if limit[k] else None) for i, k in enumerate(order)],
                      [ServingPod(a - t0, b - t0, 4) for a, b in pods.values()], time.time() - t0,
                      Run(pol.name, "policy", pol), cluster, labels, Latencies(interval=1.0),
                      epoch=datetime.fromtimestamp(t0, UTC))

    real = {k: started[k] - submitted[k] for k in short}
    sim = {order[i]: d for i, d in result.delay_of.items()}
    table = "\n".join(f"job {k}: sandbox {real[k]:6.1f} s  simulator {sim.get(k, float('nan')):6.1f} s"
                      for k in short)
    print(f"{name}: lends {real_lends:.0f} / {result.lends}, reclaims {real_reclaims:.0f} / {result.reclaims}\n"
          f"{table}")
    assert (real_lends, real_reclaims) == (result.lends, result.reclaims), table
    assert set(sim) == set(real), table  # the same jobs started: none too long for its node in either
    mean_real, mean_sim = sum(real.values()) / len(real), sum(sim.values()) / len(sim)
    assert abs(mean_real - mean_sim) <= MEAN_TOLERANCE, f"mean {mean_real:.1f} s / {mean_sim:.1f} s\n{table}"
    worst = max(abs(real[k] - sim[k]) for k in real)
    assert worst <= JOB_TOLERANCE, f"worst difference {worst:.1f} s\n{table}"
    if trace.forecast is not None:
        world.kubectl("delete", "nodelendingpolicy", "lend-gpus")
        wait_for("both nodes back", lambda: all(world.returned(n) for n in LEND), timeout=90, show=world.states)
        wait_for("no reservation left", lambda: not world.reservations(), timeout=30, show=world.reservations)
