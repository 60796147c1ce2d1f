#!/usr/bin/env python3
"""Print what one reading and one scrape of Slurm's metrics cost at a size.

    .venv/bin/python hack/bench_slurm_metrics.py [--jobs 10000] [--nodes 1000] [--release 26.05] [--runs 5]

The agent's own code path (``SlurmClient(local_runner).metrics_reading()``,
then the collector through prometheus_client's text encoder) runs in a child
process against fake Slurm commands on PATH that print output of the real
shape: the release's ``tests/fixtures/slurm-json/`` job and node repeated
(each copy its own id, partition, account, state and GPUs), and the real
sdiag text of the release whose ``sdiag.txt`` the fixtures hold. Each fake command counts its calls: one
call is one RPC to slurmctld, the load a reading adds to it.

Prints, per run, the reading's and the scrape's seconds, then their medians,
the child's peak resident memory (VmHWM), the series a scrape holds and its
size. The fake commands' own time is in the reading's (they stand for
slurmctld's answer); their memory is not in the peak.

With ``--real``, the load on a real slurmctld instead: this host's Slurm in
private namespaces (tests/realslurm.py) on the example's config, ``--jobs``
held jobs submitted (fewer than Slurm's MaxJobCount, 10,000: at the limit sbatch
waits and retries), then each reading
through the facade, with the CPU time slurmctld spent on it (utime + stime
of its process) and the reading's time. The example's few nodes, not
``--nodes``: a thousand nodes would need a thousand slurmd.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from slurmk8s import versions  # noqa: E402 - after the checkout is put on sys.path

MARK = "bench-slurm-metrics: "

#: A fake squeue --json / node listing: the fixture's first record repeated, varied per copy.
FAKE = '''#!{python}
import json, os, sys
with open(os.environ["FAKE_CALLS"], "a") as f:
    f.write(os.path.basename(sys.argv[0]) + "\\n")
kind = os.environ["FAKE_KIND_" + os.path.basename(sys.argv[0]).upper()]
data = json.load(open(os.environ["FAKE_TEMPLATE_" + kind.upper()]))
one = data.pop(kind)[0]
n = int(os.environ["FAKE_" + kind.upper()])
wrap = isinstance(one.get("job_id", one.get("cpus")), dict)
num = (lambda v: {{"set": True, "infinite": False, "number": v}}) if wrap else (lambda v: v)
out = sys.stdout
head = json.dumps(data)
out.write(head[:-1].rstrip() + ', "' + kind + '": [')
states = ["RUNNING"] * 6 + ["PENDING"] * 3 + ["COMPLETED"]
for i in range(n):
    if kind == "jobs":
        one.update(job_id=num(i + 1), name=f"train-{{i}}", nodes=f"gpu-{{i % 1000}}", partition=f"p{{i % 8}}",
                   account=f"acct{{i % 40}}", user_name=f"user{{i % 500}}", submit_time=num(1795000000 + i),
                   start_time=num(1795000000 + i + i % 3600), tres_alloc_str=f"cpu=8,node=1,gres/gpu={{i % 8}}")
        state = states[i % len(states)]
        one["job_state"] = [state] if isinstance(one["job_state"], list) else state
        one["state_reason"] = ("Priority", "Resources", "BeginTime")[i % 3] if state == "PENDING" else "None"
    else:
        one.update(name=f"gpu-{{i}}", partitions=[f"p{{i % 8}}"], gres="gpu:h100:8(S:0-1)",
                   gres_used=f"gpu:h100:{{i % 9}}(IDX:0-{{i % 9}})")
    out.write(("," if i else "") + json.dumps(one))
out.write("]}}\\n")
'''

FAKE_SDIAG = '''#!/bin/sh
echo sdiag >> "$FAKE_CALLS"
cat "$FAKE_SDIAG_TEXT"
'''


def vm_hwm() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status")


def child(release: str, runs: int) -> None:
    import time

    from prometheus_client import CollectorRegistry, generate_latest

    from slurmk8s.slurm.client import SlurmClient, local_runner
    from slurmk8s.slurm.metrics import SlurmMetrics

    client = SlurmClient(local_runner, config_dir=Path(os.environ["FAKE_CONF"]), release=versions.release(release))
    metrics = SlurmMetrics(client)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    idle = vm_hwm()
    out = []
    for _ in range(runs):
        began = time.perf_counter()
        metrics.read()
        read = time.perf_counter() - began
        began = time.perf_counter()
        text = generate_latest(registry)
        scrape = time.perf_counter() - began
        out.append({"read": read, "scrape": scrape})
    series = sum(1 for line in text.decode().splitlines() if line and not line.startswith("#"))
    print(MARK + json.dumps({"runs": out, "idle_kib": idle, "peak_kib": vm_hwm(), "series": series,
                             "bytes": len(text), "up": b"slurmk8s_slurm_up 1.0" in text}), flush=True)


def real(jobs: int, runs: int) -> None:
    import time

    from slurmk8s.api import load_cluster
    from slurmk8s.render import ClusterKeys, config_files
    from slurmk8s.slurm.client import SlurmClient
    from tests.conftest import example_without_accounting, host_release
    from tests.realslurm import SlurmNamespace

    doc = example_without_accounting()
    doc["spec"]["slurm"]["version"] = release = host_release()
    cluster = load_cluster(doc)
    with tempfile.TemporaryDirectory() as tmp, \
            SlurmNamespace(config_files(cluster), ClusterKeys.generate(), Path(tmp)) as ns:
        began = time.monotonic()
        for first in range(0, jobs, 200):  # in batches: each ns.run has 60 s
            n = min(200, jobs - first)
            ns.run(["bash", "-c", f"for i in $(seq {n}); do sbatch -Q --hold -J bench --wrap true || exit 1; done"])
        print(f"Slurm {release} (this host) in private namespaces: {jobs} held jobs submitted in "
              f"{time.monotonic() - began:.0f} s")
        pid = ns.run(["pgrep", "-x", "slurmctld"]).stdout.split()[0]
        tick = os.sysconf("SC_CLK_TCK")

        def cpu() -> float:
            fields = ns.run(["cat", f"/proc/{pid}/stat"]).stdout.rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / tick

        client = SlurmClient(lambda argv, stdin: ns.run(argv, input=stdin, check=False), config_dir=ns.work / "conf")
        out = []
        for _ in range(runs):
            before, began = cpu(), time.monotonic()
            reading = client.metrics_reading()
            out.append((time.monotonic() - began, cpu() - before))
        assert len(reading.jobs) == jobs, f"the reading saw {len(reading.jobs)} jobs, not {jobs}"
        for i, (wall, used) in enumerate(out, 1):
            print(f"  run {i}: reading {wall:.2f} s, slurmctld CPU {used * 1000:.0f} ms")
        median = statistics.median(u for _, u in out)
        print(f"median slurmctld CPU per reading: {median * 1000:.0f} ms, "
              f"{median / 15 * 100:.1f}% of one core at one reading per 15 s")
        print(f"median reading: {statistics.median(w for w, _ in out):.2f} s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=10_000)
    p.add_argument("--nodes", type=int, default=1_000)
    p.add_argument("--release", default=versions.DEFAULT, help="whose JSON shapes (tests/fixtures/slurm-json/)")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--real", action="store_true", help="measure the load on this host's slurmctld instead")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args.release, args.runs)
    if args.real:
        return real(args.jobs, args.runs)
    release = versions.release(args.release)
    fixtures = ROOT / "tests/fixtures/slurm-json" / args.release
    nodes_file = "sinfo.json" if release.nodes_command[0] == "sinfo" else "scontrol-nodes.json"
    with tempfile.TemporaryDirectory() as tmp:
        bin_dir, calls, conf = Path(tmp) / "bin", Path(tmp) / "calls", Path(tmp) / "conf"
        bin_dir.mkdir()
        conf.mkdir()
        for name in ("squeue", release.nodes_command[0]):
            (bin_dir / name).write_text(FAKE.format(python=sys.executable))
        (bin_dir / "sdiag").write_text(FAKE_SDIAG)
        for f in bin_dir.iterdir():
            f.chmod(0o755)
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT),
               "FAKE_CALLS": str(calls), "FAKE_CONF": str(conf), "FAKE_JOBS": str(args.jobs),
               "FAKE_NODES": str(args.nodes), "FAKE_KIND_SQUEUE": "jobs",
               f"FAKE_KIND_{release.nodes_command[0].upper()}": "nodes",
               "FAKE_TEMPLATE_JOBS": str(fixtures / "squeue.json"), "FAKE_TEMPLATE_NODES": str(fixtures / nodes_file),
               "FAKE_SDIAG_TEXT": str(next((ROOT / "tests/fixtures/slurm-json").glob("*/sdiag.txt")))}
        proc = subprocess.run([sys.executable, __file__, "--child", "1", "--release", args.release,
                               "--runs", str(args.runs)], capture_output=True, text=True, env=env, timeout=1800)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)), None)
        if line is None:
            raise SystemExit(f"the child failed:\n{proc.stderr[-3000:]}")
        r = json.loads(line[len(MARK):])
        rpcs = Path(calls).read_text().split()
    if not r["up"]:
        raise SystemExit("the reading failed: slurmk8s_slurm_up is not 1")
    print(f"Slurm {args.release} shapes, {args.jobs} jobs, {args.nodes} nodes, {args.runs} runs")
    for i, run in enumerate(r["runs"], 1):
        print(f"  run {i}: reading {run['read']:.2f} s, scrape {run['scrape'] * 1000:.1f} ms")
    print(f"median reading: {statistics.median(x['read'] for x in r['runs']):.2f} s "
          "(the fake commands' time included: they print the JSON as slurmctld would)")
    print(f"median scrape: {statistics.median(x['scrape'] for x in r['runs']) * 1000:.1f} ms (never reads Slurm)")
    print(f"memory: {r['idle_kib'] / 1024:.1f} MiB before, {r['peak_kib'] / 1024:.1f} MiB peak")
    print(f"series: {r['series']}, scrape size {r['bytes'] / 1024:.1f} KiB")
    per = {c: rpcs.count(c) / args.runs for c in sorted(set(rpcs))}
    print("commands (RPCs to slurmctld) per reading: " + ", ".join(f"{c} {n:g}" for c, n in per.items()))


if __name__ == "__main__":
    main()
