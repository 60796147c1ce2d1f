#!/usr/bin/env python3
"""The end of hack/test.sh: the 15 slowest tests of all its lanes and the totals.

Reads the lanes' JUnit XML (pytest --junitxml; a test's time there is its
setup, call and teardown, a module fixture's setup counted in its first
test) and prints the slowest tests and the slowest modules (each module's
tests summed: what a lane's balance is made of), then one closing line
``suite: N passed, N failed, N skipped``. Exits 1 when a file is missing or
names no test.

    hack/test_summary.py [--seconds WALL] LANE.xml...
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

SLOWEST = 15
SLOWEST_MODULES = 12


def _cases(path: Path):
    """(test id, seconds, outcome) of every test case in one JUnit XML file."""
    for case in ET.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed"
            elif child.tag == "skipped" and outcome == "passed":
                outcome = "skipped"
        yield f"{module}.py::{case.get('name')}", float(case.get("time") or 0.0), outcome


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=int, help="the lanes' wall-clock time, to print beside the totals")
    p.add_argument("files", nargs="+", type=Path)
    args = p.parse_args(argv)
    cases = []
    for path in args.files:
        if not path.is_file():
            print(f"test_summary: {path}: no JUnit XML (did that lane start?)", file=sys.stderr)
            return 1
        cases += list(_cases(path))
    if not cases:
        print("test_summary: no test ran", file=sys.stderr)
        return 1
    print(f"\n===== the {SLOWEST} slowest tests of the whole suite =====")
    for test, seconds, _ in sorted(cases, key=lambda c: -c[1])[:SLOWEST]:
        print(f"{seconds:8.2f}s {test}")
    modules: dict[str, list[float]] = {}
    for test, seconds, _ in cases:
        modules.setdefault(test.split("::")[0], []).append(seconds)
    print(f"\n===== the {SLOWEST_MODULES} slowest modules (their tests' time summed) =====")
    for module, times in sorted(modules.items(), key=lambda m: -sum(m[1]))[:SLOWEST_MODULES]:
        print(f"{sum(times):8.2f}s {module} ({len(times)} tests)")
    count = {o: sum(1 for *_, out in cases if out == o) for o in ("passed", "failed", "skipped")}
    busy = sum(seconds for _, seconds, _ in cases)
    wall = f" in {args.seconds // 60} min {args.seconds % 60} s of wall-clock time" if args.seconds is not None else ""
    print(f"{len(cases)} tests, {busy / 60:.1f} min of test time{wall}")
    print(f"suite: {count['passed']} passed, {count['failed']} failed, {count['skipped']} skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
