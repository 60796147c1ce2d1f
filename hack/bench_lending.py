#!/usr/bin/env python3
"""Benchmark node lending in the sandbox: prints figures, asserts nothing.

The cluster of tests/e2e/lending.py (a `gpu` partition that takes only lent
nodes) and the sandbox's two lendable GPU nodes, lent by a policy with
idleAfterSeconds 0 (so lending starts the first round a node is idle) and
the bridge's round every second. Each round:

1. **reclaim, idle node**: a pod requesting the node's 4 GPUs and pinned to a
   lent node with no job is created. Measured: pod created -> node handed
   back (lending label and taint gone: schedulable for Kubernetes), and ->
   pod Running.
2. **lend**: the pod is deleted. Measured: pod gone -> the Slurm node IDLE
   in the partition again.
3. **reclaim, busy node**: a checkpointing job (it saves its step and
   requeues itself on USR1, as examples/train.sh does) runs on a lent node;
   the same pod is pinned to that node. Measured: pod created -> node handed
   back (the job's checkpoint included), and -> pod Running.
4. **resume**: the job's USR1 -> the job running again, on the other lent
   node, from its checkpoint (Slurm alone would hold it for its requeue
   delay; the bridge makes it eligible at once).

Then the decide function's time on 10,000 nodes and 50,000 pods and jobs
(hack/bench_decide.py).

    hack/bench_lending.py [--rounds 5]     (root, after hack/setup.sh)
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.e2e.lending import CHECKPOINT_JOB, LEND, Lending, lending_sandbox, policy, wait_for  # noqa: E402 - after the checkout is put on sys.path

SUBNET = "10.253.98.0/24"
POD = "bench-serve"


def summary(name: str, values: list[float]) -> str:
    return (f"{name:<52} median {statistics.median(values):7.2f} s   "
            f"min {min(values):7.2f}   max {max(values):7.2f}   (n={len(values)})")


def tight(what: str, predicate, timeout: float = 120) -> float:
    """Poll ``predicate`` every 50 ms; return the time it first held."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return time.time()


def pod_running(w: Lending) -> bool:
    try:
        pod = w.core.read_namespaced_pod(POD, "default")
    except Exception:  # noqa: BLE001 - not there yet
        return False
    return pod.status.phase == "Running"


def pod_gone(w: Lending) -> bool:
    return POD not in {p.metadata.name for p in w.core.list_namespaced_pod("default").items}


def slurm_idle(w: Lending, node: str) -> bool:
    n = next((n for n in w.slurm.nodes() if n.name == node), None)
    return n is not None and n.state == "idle" and not n.drain_set


def reclaim(w: Lending, node: str) -> tuple[float, float]:
    t0 = time.time()
    w.gpu_pod(POD, node)
    handed = tight("the node handed back", lambda: w.returned(node))
    running = tight("the pod running", lambda: pod_running(w))
    return handed - t0, running - t0


def lend(w: Lending, node: str) -> float:
    w.kubectl("delete", "pod", POD, "--wait=false")
    gone = tight("the pod gone", lambda: pod_gone(w))
    return tight("the Slurm node idle", lambda: slurm_idle(w, node)) - gone


def one_round(w: Lending, n: int) -> dict[str, float]:
    out: dict[str, float] = {}
    wait_for("both nodes lent", w.all_lent, timeout=120, show=w.states)
    out["reclaim_idle_handed"], out["reclaim_idle_running"] = reclaim(w, LEND[0])
    out["lend"] = lend(w, LEND[0])
    wait_for("both nodes lent", w.all_lent, timeout=120, show=w.states)
    r = w.researcher
    script = f"/shared/researcher/bench-{n}.sh"
    r.put(CHECKPOINT_JOB.replace("echo \"USR1 at step", "date +usr1=%s.%N; echo \"USR1 at step")
          .replace("echo \"running on", "date +start=%s.%N; echo \"running on"), script)
    job = r.sbatch(script, cwd="/shared/researcher")
    node = wait_for("the job to run", lambda: r.job(job)["JobState"] == "RUNNING" and r.job(job)["NodeList"])
    time.sleep(2)
    out["reclaim_busy_handed"], out["reclaim_busy_running"] = reclaim(w, node)
    wait_for("the job to resume", lambda: r.job(job)["JobState"] == "RUNNING", timeout=180)
    log = wait_for("the resumed job's start", lambda: (lambda t: t if t.count("start=") >= 2 else None)(
        r.read(f"/shared/researcher/ckpt-{job}.out")), timeout=30)
    usr1 = float(next(line for line in log.splitlines() if line.startswith("usr1=")).split("=")[1])
    start = float([line for line in log.splitlines() if line.startswith("start=")][-1].split("=")[1])
    out["resume"] = start - usr1
    r.check(f"scancel {job}")
    wait_for("the job gone", lambda: r.job(job)["JobState"] in ("CANCELLED", "COMPLETED"), timeout=60)
    out["lend_after_busy"] = lend(w, node)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-lending-") as tmp:
        print("bringing the sandbox up ...", flush=True)
        with lending_sandbox(Path(tmp), SUBNET) as w:
            w.apply(policy(idleAfterSeconds=0, reclaim={"gracePeriodSeconds": 30, "signal": "USR1"}))
            for n in range(args.rounds):
                figures = one_round(w, n)
                for key, value in figures.items():
                    results.setdefault(key, []).append(value)
                print(f"round {n + 1}/{args.rounds}: " + ", ".join(f"{k} {v:.2f}s" for k, v in figures.items()),
                      flush=True)
    print()
    print(summary("lend: idle node -> Slurm IDLE", results["lend"] + results["lend_after_busy"]))
    print(summary("reclaim, idle: GPU pod created -> node schedulable", results["reclaim_idle_handed"]))
    print(summary("reclaim, idle: GPU pod created -> pod Running", results["reclaim_idle_running"]))
    print(summary("reclaim, busy: GPU pod created -> node schedulable", results["reclaim_busy_handed"]))
    print(summary("reclaim, busy: GPU pod created -> pod Running", results["reclaim_busy_running"]))
    print(summary("resume: job's USR1 -> running again elsewhere", results["resume"]))
    print()
    subprocess.run([sys.executable, str(ROOT / "hack" / "bench_decide.py")], check=True)


if __name__ == "__main__":
    main()
