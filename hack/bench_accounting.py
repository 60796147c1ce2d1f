#!/usr/bin/env python3
"""Benchmark accounting: prints figures, asserts nothing.

The real daemons of tests/test_accounting_images.py (MariaDB, slurmdbd,
slurmctld, one slurmd, from the images of one Slurm release) record
``--jobs`` short jobs (arrays of `true`; 1% of them the user alice's), then
``sacct`` is timed over all of them and over alice's last day, as a
researcher asks. Prints the medians. Target: under 2 s for 10,000 jobs.

    flock /run/slurmk8s-sandbox.lock hack/bench_accounting.py [--jobs 10000] [--slurm-version 26.05]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from slurmk8s import versions  # noqa: E402 - after the checkout is put on sys.path
from tests.test_accounting_images import run_accounting_cluster  # noqa: E402 - after the checkout is put on sys.path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=10000, help="jobs to record (default 10000)")
    p.add_argument("--repeat", type=int, default=5, help="sacct runs of each kind (default 5)")
    p.add_argument("--slurm-version", default=versions.DEFAULT, choices=versions.SUPPORTED)
    args = p.parse_args()
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-acct-") as tmp:
        out, _, everything = run_accounting_cluster(
            args.slurm_version, Path(tmp), timeout=3600, stream=True,
            env={"SLURMK8S_BENCH_JOBS": str(args.jobs), "SLURMK8S_BENCH_REPEAT": str(args.repeat),
                 "SLURMK8S_NODE_CPUS": "16"},
            # Room for the queued arrays; finished jobs leave slurmctld's memory soon (sacct has them).
            extra_lines=["MaxJobCount=50000", "MaxArraySize=10001", "MinJobAge=10"])
    figures = {kind: [(int(n), float(s)) for n, s in re.findall(rf"^bench sacct {kind}: (\d+) jobs ([0-9.]+) s$",
                                                                  out, re.M)] for kind in ("all", "user")}
    if not figures["all"]:
        print(everything, file=sys.stderr)
        return 1
    print(f"Slurm {args.slurm_version}, {args.jobs} jobs recorded "
          f"({re.search(r'^bench recorded: .*$', out, re.M)[0].split(': ', 1)[1]}); {args.repeat} runs each:")
    for kind, what in (("all", "sacct -a over every job of the last day"),
                       ("user", "sacct of one user's last day")):
        rows = figures[kind]
        print(f"  {what}: {rows[0][0]} jobs, median {statistics.median(s for _, s in rows):.3f} s "
              f"(min {min(s for _, s in rows):.3f}, max {max(s for _, s in rows):.3f})")
    print(f"  total run {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
