#!/usr/bin/env python3
"""Benchmark the sandbox: prints figures, asserts nothing.

1. `sandbox up` -> every Slurm node IDLE, over several rounds (each round
   brings the example cluster up in a fresh state directory and takes it down):
   the API stand-in and the kubelet start, the chart is installed with Helm
   (the operator and the bridge as pods), the manifest is applied, the
   operator renders the cluster and the kubelet runs its pods.
2. sbatch -> the job's first instruction running, through the sandbox (sbatch
   in the login pod, the job on a worker pod) and, in the same run, on a bare
   slurmctld + slurmd started by hand in private namespaces on this machine
   (tests/realslurm.py), with the same rendered slurm.conf, run from the same
   images' root file systems as the sandbox's pods (the slurmctld and slurmd
   images, one overlay). The ratio of the medians is the sandbox's overhead.

Each supported Slurm release in turn (or those given with --slurm-version),
from its own images; a table per release at the end.

With --pulls, only this instead: `sandbox up` with an empty kubelet image
store (every image pulled from the sandbox's registry and unpacked) against
the store a previous up left (nothing pulled), rounds alternating, medians
and their ratio.

    hack/bench_sandbox.py [--rounds 5] [--jobs 20] [--slurm-version V ...]   (root, after hack/setup.sh)
    hack/bench_sandbox.py --pulls [--rounds 3] [--slurm-version V]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402 - after the checkout is put on sys.path

from sandbox import Sandbox  # noqa: E402 - after the checkout is put on sys.path
from sandbox.images import tags  # noqa: E402 - after the checkout is put on sys.path
from sandbox.imagestore import ImageStore  # noqa: E402 - after the checkout is put on sys.path
from slurmk8s import versions  # noqa: E402 - after the checkout is put on sys.path
from slurmk8s.api import load_cluster  # noqa: E402 - after the checkout is put on sys.path
from slurmk8s.manifest import with_slurm_version  # noqa: E402 - after the checkout is put on sys.path
from slurmk8s.render import ClusterKeys, config_files, node_conf  # noqa: E402 - after the checkout is put on sys.path
from tests.realslurm import SlurmNamespace  # noqa: E402 - after the checkout is put on sys.path

EXAMPLE = ROOT / "examples" / "slurmcluster.yaml"
SUBNET = "10.253.99.0/24"

# Runs where sbatch runs: submit N jobs one after the other; each job writes
# the time its script started. Prints "submitted started" per job.
LATENCY = r"""
set -eu
dir=$1 n=$2 part=$3
mkdir -p "$dir"
for i in $(seq "$n"); do
  t0=$(date +%s.%N)
  sbatch -Q -p "$part" -o /dev/null --wrap "date +%s.%N > $dir/start-$i.tmp; mv $dir/start-$i.tmp $dir/start-$i"
  while [ ! -s "$dir/start-$i" ]; do sleep 0.005; done
  echo "$t0 $(cat "$dir/start-$i")"
done
"""


def summary(name: str, values: list[float], unit: str = "s") -> str:
    return (f"{name:<44} median {statistics.median(values):7.3f} {unit}   "
            f"min {min(values):7.3f}   max {max(values):7.3f}   (n={len(values)})")


def latencies(output: str) -> list[float]:
    return [float(b) - float(a) for a, b in (line.split() for line in output.splitlines() if line.strip())]


def bench_up(cluster, rounds: int) -> tuple[list[float], list[float]]:
    ups, downs = [], []
    for i in range(rounds):
        with tempfile.TemporaryDirectory(prefix="slurmk8s-bench-") as d:
            box = Sandbox(Path(d))
            t0 = time.monotonic()
            box.up(cluster, subnet=SUBNET, timeout=120)
            ups.append(time.monotonic() - t0)
            t0 = time.monotonic()
            box.down(purge=True)
            downs.append(time.monotonic() - t0)
        print(f"  round {i + 1}: up {ups[-1]:.2f} s, down {downs[-1]:.2f} s", file=sys.stderr)
    return ups, downs


def bench_pulls(cluster, rounds: int) -> None:
    """`sandbox up` with an empty kubelet image store, then with the store it left; rounds alternate."""
    from sandbox.kubelet import IMAGE_CACHE_ENV

    times: dict[str, list[float]] = {"empty": [], "warm": []}
    with tempfile.TemporaryDirectory(prefix="slurmk8s-bench-images-") as store:
        os.environ[IMAGE_CACHE_ENV] = store
        for i in range(rounds):
            for kind in ("empty", "warm"):
                if kind == "empty":
                    shutil.rmtree(store)
                    os.mkdir(store)
                with tempfile.TemporaryDirectory(prefix="slurmk8s-bench-") as d:
                    box = Sandbox(Path(d))
                    t0 = time.monotonic()
                    box.up(cluster, subnet=SUBNET, timeout=180)
                    times[kind].append(time.monotonic() - t0)
                    box.down(purge=True)
                print(f"  round {i + 1}: up with the {kind} image store {times[kind][-1]:.1f} s", file=sys.stderr)
    print(f"\nslurmk8s sandbox up, Slurm {cluster.spec.slurm.version}: kubelet image store empty against warm")
    print(summary("up, image store empty (all pulled)", times["empty"]))
    print(summary("up, image store warm (none pulled)", times["warm"]))
    print(f"{'empty / warm (medians)':<44} {statistics.median(times['empty']) / statistics.median(times['warm']):7.2f} x")


def bench_sandbox_latency(cluster, jobs: int, partition: str) -> list[float]:
    with tempfile.TemporaryDirectory(prefix="slurmk8s-bench-") as d:
        box = Sandbox(Path(d))
        state = box.up(cluster, subnet=SUBNET, timeout=120)
        try:
            login = next(p["name"] for p in box.status()["pods"] if p["name"].startswith(f"{state.cluster}-login-"))
            shared = state.shared_storage["mountPath"]
            argv = box.exec(login, ["bash", "-c", LATENCY, "bench", f"{shared}/bench", str(jobs), partition])
            out = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=True).stdout
        finally:
            box.down(purge=True)
    return latencies(out)


def bench_bare_latency(cluster, jobs: int, partition: str) -> list[float]:
    ns = next(n for n in cluster.spec.node_sets if any(partition == p.name and n.name in p.node_sets
                                                          for p in cluster.spec.partitions))
    version = cluster.spec.slurm.version
    built = ImageStore().ensure([tags("slurmd", version)[0], tags("slurmctld", version)[0]])
    roots = [image.rootfs for image in built.values()]
    with tempfile.TemporaryDirectory(prefix="slurmk8s-bench-") as d:
        node = f"{cluster.name}-{ns.name}-0"
        work = Path(d) / "slurm"
        # GPUs need device files; the CPU node set is what the bare run compares.
        with SlurmNamespace(config_files(cluster), ClusterKeys.generate(), work,
                            nodes=[(node, node_conf(cluster, ns))], roots=roots) as bare:
            out = bare.run(["bash", "-c", LATENCY, "bench", f"{work}/bench", str(jobs), partition]).stdout
    return latencies(out)


def bench_release(doc: dict, version: str, rounds: int, jobs: int, partition: str) -> dict[str, list[float]]:
    """Every figure of one Slurm release, from its own images."""
    cluster = load_cluster(with_slurm_version([doc], version)[0])
    print(f"Slurm {version}: sandbox up -> all nodes idle, {rounds} rounds ...", file=sys.stderr)
    ups, downs = bench_up(cluster, rounds)
    print(f"Slurm {version}: sbatch -> running, {jobs} jobs in the sandbox ...", file=sys.stderr)
    sandbox = bench_sandbox_latency(cluster, jobs, partition)
    print(f"Slurm {version}: sbatch -> running, {jobs} jobs on bare slurmctld + slurmd ...", file=sys.stderr)
    bare = bench_bare_latency(cluster, jobs, partition)
    return {"up": ups, "down": downs, "sandbox": [x * 1000 for x in sandbox], "bare": [x * 1000 for x in bare]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5, help="sandbox up/down rounds per release")
    ap.add_argument("--jobs", type=int, default=20, help="jobs per latency run")
    ap.add_argument("-f", "--filename", type=Path, default=EXAMPLE, help="SlurmCluster manifest")
    ap.add_argument("--slurm-version", action="append", choices=versions.SUPPORTED, dest="releases",
                    help="a Slurm release to measure (repeatable; default: every supported one)")
    ap.add_argument("--pulls", action="store_true",
                    help="measure only `sandbox up` with an empty kubelet image store against a warm one")
    args = ap.parse_args()
    doc = yaml.safe_load(args.filename.read_text())
    if args.pulls:
        version = (args.releases or [versions.DEFAULT])[0]
        bench_pulls(load_cluster(with_slurm_version([doc], version)[0]), args.rounds)
        return
    partition = "cpu"
    figures = {v: bench_release(doc, v, args.rounds, args.jobs, partition) for v in args.releases or versions.SUPPORTED}

    cluster = load_cluster(doc)
    nodes = sum(n.replicas for n in cluster.spec.node_sets)
    print(f"\nslurmk8s sandbox benchmark: {args.filename.name} ({nodes} Slurm nodes), partition {partition}")
    for version, f in figures.items():
        print(f"\nSlurm {version}")
        print(summary("sandbox up -> all nodes IDLE", f["up"]))
        print(summary("sandbox down", f["down"]))
        print(summary("sbatch -> RUNNING, sandbox", f["sandbox"], "ms"))
        print(summary("sbatch -> RUNNING, bare (same images)", f["bare"], "ms"))
        print(f"{'sandbox / bare (medians)':<44} {statistics.median(f['sandbox']) / statistics.median(f['bare']):7.2f} x")
    print("\n| Slurm | up (median) | down | sbatch -> RUNNING sandbox / bare (medians) | ratio |")
    print("| --- | --- | --- | --- | --- |")
    for version, f in figures.items():
        sb, bare = statistics.median(f["sandbox"]), statistics.median(f["bare"])
        print(f"| {version} | {statistics.median(f['up']):.1f} s | {statistics.median(f['down']):.1f} s "
              f"| {sb:.0f} / {bare:.0f} ms | {sb / bare:.2f} |")


if __name__ == "__main__":
    main()
