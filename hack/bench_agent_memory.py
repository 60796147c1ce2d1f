#!/usr/bin/env python3
"""Print the Slurm agent's peak memory while it answers ``GET /v1/jobs``.

    .venv/bin/python hack/bench_agent_memory.py [--jobs 10000 100000] [--release 26.05]

Real ``squeue --json`` output of 100,000 jobs is impractical to produce, so a
fake ``squeue`` on PATH prints output of the real shape: the release's
``tests/fixtures/slurm-json/<release>/squeue.json`` with its one job repeated
(each copy its own id, name and node). Everything else is the agent's own
code path: an :class:`AgentServer` over ``SlurmClient(local_runner)`` in a
child process, asked once over HTTP with the token, as the operator and the
bridge ask it.

For each job count, two children: ``before`` reads ``squeue --json`` whole
and parses it at once (what the facade did until issue 24), ``after`` is
the facade as it is. Each prints its peak resident memory (VmHWM, the
high-water mark of the process doing the read) before the request and after
it. The fake squeue's own memory is not counted: it is not Slurm's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from slurmk8s import versions  # noqa: E402 - after the checkout is put on sys.path

TOKEN = "bench-token-0123456789abcdef"
#: Starts the child's lines for the parent (the agent logs to the same stdout).
MARK = "bench-agent-memory: "

FAKE_SQUEUE = '''#!{python}
"""A fake squeue: SQUEUE_TEMPLATE's output with its one job repeated SQUEUE_JOBS times."""
import json, os, sys
data = json.load(open(os.environ["SQUEUE_TEMPLATE"]))
job = data.pop("jobs")[0]
n = int(os.environ["SQUEUE_JOBS"])
out = sys.stdout
head = json.dumps(data, indent=2)
out.write(head[:-1].rstrip() + ',\\n  "jobs": [\\n')
for i in range(n):
    job["job_id"] = {{"set": True, "infinite": False, "number": i + 1}} if isinstance(job["job_id"], dict) else i + 1
    job["name"] = f"train-{{i}}"
    job["nodes"] = f"gpu-{{i % 512}}"
    out.write(("," if i else "") + json.dumps(job, indent=2))
out.write("\\n  ]\\n}}\\n")
'''


def vm_hwm() -> int:
    """This process's peak resident memory, in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status")


def legacy_jobs(self, nodes=()):
    """The facade's jobs() until issue 24: the whole output, then the whole parse tree."""
    from slurmk8s.slurm.client import _check_node
    from slurmk8s.slurm.hostlist import expand
    from slurmk8s.slurm.model import job_from_json

    wanted = {_check_node(n) for n in nodes}
    data = json.loads(self._run("squeue", "--json"))
    jobs = (job_from_json(j) for j in data.get("jobs", []))
    if wanted:
        jobs = (j for j in jobs if j.nodes and wanted.intersection(expand(j.nodes)))
    return sorted(jobs, key=lambda j: j.job_id)


def child(mode: str) -> None:
    from slurmk8s.slurm.agent import make_server
    from slurmk8s.slurm.client import SlurmClient, local_runner

    if mode == "before":
        SlurmClient.jobs = legacy_jobs
    server = make_server("127.0.0.1:0", SlurmClient(local_runner), TOKEN.encode())
    server.start()
    print(MARK + json.dumps({"port": server.server_address[1], "idle_kib": vm_hwm()}), flush=True)
    sys.stdin.readline()  # the parent has its answer
    print(MARK + json.dumps({"peak_kib": vm_hwm()}), flush=True)
    server.stop()


def _reply(stdout) -> dict:
    for line in stdout:
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    raise SystemExit("the agent's process ended without a reply")


def measure(mode: str, jobs: int, env: dict) -> dict:
    proc = subprocess.Popen([sys.executable, __file__, "--child", mode], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env={**env, "SQUEUE_JOBS": str(jobs)})
    try:
        start = _reply(proc.stdout)
        req = urllib.request.Request(f"http://127.0.0.1:{start['port']}/v1/jobs",
                                     headers={"Authorization": f"Bearer {TOKEN}"})
        began = time.monotonic()
        with urllib.request.urlopen(req, timeout=600) as resp:
            answered = len(json.load(resp)["jobs"])
        seconds = time.monotonic() - began
        proc.stdin.write("done\n")
        proc.stdin.flush()
        end = _reply(proc.stdout)
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
    if answered != jobs:
        raise SystemExit(f"{mode}: the agent answered {answered} jobs, not {jobs}")
    return {"idle_mib": start["idle_kib"] / 1024, "peak_mib": end["peak_kib"] / 1024, "seconds": seconds}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, nargs="+", default=[10_000, 100_000])
    p.add_argument("--release", default=versions.DEFAULT, help="whose squeue --json shape (tests/fixtures/slurm-json/)")
    p.add_argument("--modes", nargs="+", default=["before", "after"], choices=["before", "after"])
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args.child)
    template = ROOT / "tests/fixtures/slurm-json" / args.release / "squeue.json"
    with tempfile.TemporaryDirectory() as tmp:
        squeue = Path(tmp) / "squeue"
        squeue.write_text(FAKE_SQUEUE.format(python=sys.executable))
        squeue.chmod(0o755)
        env = {**os.environ, "PATH": f"{tmp}:{os.environ['PATH']}", "SQUEUE_TEMPLATE": str(template),
               "PYTHONPATH": str(ROOT)}
        per_job = len(json.dumps(json.loads(template.read_text())["jobs"][0], indent=2))
        print(f"squeue --json of Slurm {args.release}: about {per_job} bytes per job")
        print(f"{'jobs':>8} {'mode':>7} {'output MiB':>10} {'idle MiB':>9} {'peak MiB':>9} {'seconds':>8}")
        for jobs in args.jobs:
            for mode in args.modes:
                r = measure(mode, jobs, env)
                print(f"{jobs:>8} {mode:>7} {jobs * per_job / 2**20:>10.0f} {r['idle_mib']:>9.1f} "
                      f"{r['peak_mib']:>9.1f} {r['seconds']:>8.1f}", flush=True)


if __name__ == "__main__":
    main()
