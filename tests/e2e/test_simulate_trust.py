"""The simulator against the real thing: one short trace, replayed in the sandbox and in `slurmk8s simulate`.

The sandbox's two lendable GPU nodes (4 GPUs each; the `gpu` partition has
no node of its own), the real bridge (a round every second and at every
watched change) and real Slurm run a synthetic trace: a dozen training jobs
(`sleep`, 2 GPUs each, requeued when their node is taken back) and three
bursts of serving pods that need whole nodes. The times at which the test
actually submitted each job and created and deleted each pod are then
replayed in the simulator, on the same shape, with the same policy, and the
bridge's decide() at every round:

- the lends and reclaims must be as many (the bridge's metrics: lends
  registered, reclaims completed);
- the training queueing delays must agree: their mean (the figure the
  simulator reports) within MEAN_TOLERANCE, each job within JOB_TOLERANCE.
  Real Slurm starts a job at a scheduling pass (the main one at job events,
  the backfill pass every bf_interval, 30 s by default) where the simulator
  starts it the instant it fits: up to 30 s for one job, about half that on
  average, hence 15 s for the mean. One job whose slot frees within a pass of
  a burst's start may start before the burst in one and after it in the
  other; that costs it the burst (40 s at most here) and the lend after it
  (idle 2 s, registration about 1 s, a round), hence 60 s for any one job.
"""

from __future__ import annotations

import time

import pytest

from slurmk8s.api import load_policy
from slurmk8s.simulate.engine import Latencies, Run, Shape, bridge_setup, simulate
from slurmk8s.simulate.traces import ServingPod, TrainingJob

from .conftest import default_release_only
from .lending import LEND, SERVE_IMAGE, Lending, lending_sandbox, policy, wait_for

pytestmark = pytest.mark.slurm
SUBNET = "10.253.92.0/24"
MEAN_TOLERANCE = 15.0
JOB_TOLERANCE = 60.0

#: (second, gpus, duration): the training jobs, as submitted. One size, so that every way Slurm may
#: order its queue (priority, backfill with or without time limits) starts the same job in a free slot:
#: what is compared is lending, not Slurm's scheduling policy.
JOBS = [(5, 2, 60), (5, 2, 40), (6, 2, 80), (8, 2, 50), (12, 2, 30), (20, 2, 45),
        (60, 2, 30), (62, 2, 40), (95, 2, 20), (100, 2, 50), (130, 2, 30), (140, 2, 30)]
#: (second created, second deleted, how many pods of a whole node's 4 GPUs)
BURSTS = [(30, 70, 1), (110, 150, 2), (185, 215, 1)]

JOB = """#!/bin/bash
#SBATCH -p gpu -N 1 --requeue --open-mode=append
#SBATCH -o /shared/researcher/trust-%j.out
date +%s.%N >> /shared/researcher/trust-$SLURM_JOB_NAME.start
sleep "$TRUST_SECONDS"
"""


def _policy() -> dict:
    return policy(idleAfterSeconds=2, reclaim={"gracePeriodSeconds": 0, "signal": "USR1"})


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


@default_release_only
@pytest.mark.timeout(1200)  # the trace alone is four minutes, then its jobs finish
def test_the_simulator_agrees_with_the_sandbox(world):
    r = world.researcher
    r.put(JOB, "/shared/researcher/trust.sh")
    assert world.states() == {LEND[0]: None, LEND[1]: None}
    before = _counts(world)

    # The trace, in the sandbox: every step at its second, the actual time kept.
    steps = sorted([(s, "job", k) for k, (s, _, _) in enumerate(JOBS)]
                   + [(a, "create", k) for k, (a, _, _) in enumerate(BURSTS)]
                   + [(b, "delete", k) for k, (_, b, _) in enumerate(BURSTS)])
    t0 = time.time()
    world.apply(_policy())
    submitted: dict[int, float] = {}
    pods: dict[tuple[int, int], list[float]] = {}
    for second, what, k in steps:
        time.sleep(max(0.0, t0 + second - time.time()))
        if what == "job":
            _, gpus, duration = JOBS[k]
            at = time.time()
            r.sbatch("/shared/researcher/trust.sh", f"--gpus={gpus}", f"--job-name=trust{k}",
                     f"--export=ALL,TRUST_SECONDS={duration}", cwd="/shared/researcher")
            submitted[k] = at
        else:
            for i in range(BURSTS[k][2]):
                at = time.time()
                if what == "create":
                    _serving_pod(world, f"trust-serve-{k}-{i}")
                    pods[(k, i)] = [at]
                else:
                    world.kubectl("delete", "pod", f"trust-serve-{k}-{i}", "--wait=false")
                    pods[(k, i)].append(at)

    def starts() -> dict[int, float] | None:
        found = {}
        for k in range(len(JOBS)):
            path = f"/shared/researcher/trust-trust{k}.start"
            if not r.exists(path):
                return None
            found[k] = float(r.read(path).split()[0])
        return found

    started = wait_for("every job to start", starts, timeout=600, every=2)
    wait_for("every job to end", lambda: not r.check("squeue -h -o %i").strip(), timeout=600, every=2)
    wait_for("both nodes lent again", world.all_lent, show=world.states, timeout=120)
    time.sleep(3)
    after = _counts(world)
    real_lends, real_reclaims = after[0] - before[0], after[1] - before[1]

    # The same trace in the simulator, at the times it actually happened.
    pol = load_policy(_policy())
    cluster, labels = bridge_setup(pol)
    jobs = sorted((submitted[k] - t0, JOBS[k][2], JOBS[k][1], k) for k in range(len(JOBS)))
    order = [k for *_, k in jobs]
    result = simulate(Shape(2, 4, 0), [TrainingJob(i, s, d, g) for i, (s, d, g, _) in enumerate(jobs)],
                      [ServingPod(a - t0, b - t0, 4) for a, b in pods.values()], time.time() - t0,
                      Run(pol.name, "policy", pol), cluster, labels, Latencies(interval=1.0))

    real = {k: started[k] - submitted[k] for k in range(len(JOBS))}
    sim = {order[i]: d for i, d in result.delay_of.items()}
    table = "\n".join(f"job {k}: sandbox {real[k]:6.1f} s  simulator {sim.get(k, float('nan')):6.1f} s"
                      for k in range(len(JOBS)))
    print(f"lends {real_lends:.0f} / {result.lends}, reclaims {real_reclaims:.0f} / {result.reclaims}\n{table}")
    assert (real_lends, real_reclaims) == (result.lends, result.reclaims), table
    assert set(sim) == set(real), table
    mean_real, mean_sim = sum(real.values()) / len(real), sum(sim.values()) / len(sim)
    assert abs(mean_real - mean_sim) <= MEAN_TOLERANCE, f"mean {mean_real:.1f} s / {mean_sim:.1f} s\n{table}"
    worst = max(abs(real[k] - sim[k]) for k in real)
    assert worst <= JOB_TOLERANCE, f"worst difference {worst:.1f} s\n{table}"
