#!/usr/bin/env python3
"""Time `slurmk8s simulate` on a month of the Philly trace and print medians.

    .venv/bin/python hack/bench_simulate.py [--nodes 64 256 1024] [--days 30] [--runs 3]

Per cluster size: the Philly jobs of --days from 2017-10-09, serving demand
from the Azure conversation trace (sized to the Kubernetes nodes' GPUs),
half the nodes Slurm's own, one policy (examples/simulate/idle-5m.yaml).
Jobs are scaled with the cluster: at N nodes each job is submitted N/64
times (so a bigger cluster is as loaded as the 64-node one). Prints the
median wall time of the policy run, the bridge rounds it had (decide is
called at every one), and the time per round. Asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from slurmk8s.bridge.memo import forget  # noqa: E402 - after the checkout is put on sys.path
from slurmk8s.manifest import policies  # noqa: E402 - after the checkout is put on sys.path
from slurmk8s.simulate.engine import Latencies, Run, Shape, bridge_setup, simulate  # noqa: E402 - after the checkout is put on sys.path
from slurmk8s.simulate.traces import (  # noqa: E402 - after the checkout is put on sys.path
    RequestModel,
    TrainingJob,
    parse_when,
    read_jobs,
    read_requests,
    replicas_from_requests,
    window,
)

TRACES = Path("/work/shared/traces") if Path("/work/shared/traces").is_dir() else ROOT.parent / "shared" / "traces"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--days", type=float, default=30.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--traces", type=Path, default=TRACES)
    ap.add_argument("--policy", default=str(ROOT / "examples/simulate/idle-5m.yaml"))
    args = ap.parse_args()
    base, _, span = window(read_jobs(args.traces / "philly.csv"), parse_when("2017-10-09"), args.days)
    requests = read_requests(args.traces / "azure_llm_conv.csv")
    policy = next(iter(policies(args.policy)))
    cluster, labels = bridge_setup(policy)
    print(f"{len(base):,} jobs over {args.days:g} days (x N/64 at N nodes); policy {policy.name}; "
          f"median of {args.runs} runs")
    for n in args.nodes:
        shape = Shape(n, 8, n // 2)
        copies = max(1, n // 64)
        jobs = sorted((TrainingJob(0, j.submit, j.duration, j.gpus) for j in base for _ in range(copies)),
                      key=lambda j: j.submit)
        jobs = [TrainingJob(i, j.submit, j.duration, j.gpus) for i, j in enumerate(jobs)]
        pods, _, _ = replicas_from_requests(requests, span, RequestModel(peak_gpus=shape.kube_nodes * 8))
        times, rounds = [], 0
        for _ in range(args.runs):
            forget()
            t = time.perf_counter()
            r = simulate(shape, jobs, pods, span, Run(policy.name, "policy", policy), cluster, labels, Latencies())
            times.append(time.perf_counter() - t)
            rounds = r.rounds
        med = statistics.median(times)
        print(f"{n:>5} nodes  {len(jobs):>7,} jobs  median {med:7.1f} s  (min {min(times):.1f}, max {max(times):.1f})"
              f"  {rounds:,} rounds, decide every round: {1e6 * med / max(rounds, 1):.0f} us per round", flush=True)


if __name__ == "__main__":
    main()
