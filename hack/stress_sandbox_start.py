#!/usr/bin/env python3
"""The start of the sandbox's API server, as `sandbox up` does it, many times over
beside a busy machine: prints how many starts `up` would have reported as failed.

Each cycle does what `up` does for the API server and nothing else: its
supervisor started (``Sandbox._spawn``), the wait until it answers
(``Sandbox._wait_api``), then the supervisor stopped as `down` stops it. The
API server listens on 127.0.0.1 only (no bridge, no root needed). Meanwhile
``--burn`` processes spin on the CPUs and ``--lanes`` cycles run at once, as
the test command's lanes start their sandboxes beside each other.

With ``--first-look``, each cycle is only `up`'s first look at the API server's
supervisor, made as `up` makes it right after starting it (``_wait_api`` with
no time to wait: "exited before it answered" or "did not answer within 0s"),
and the supervisor is stopped at once: thousands of cycles in minutes, where
the look is what failed.

    hack/stress_sandbox_start.py [--cycles 100] [--lanes 2] [--burn 2] [--first-look]

Prints each failure's message and, at the end, ``failed: F of N starts``; exits 1 when F > 0.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# The supervisor and the API server run with -P from the installed packages: this checkout's.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))

from sandbox import runtime  # noqa: E402
from sandbox.sandbox import Sandbox, SandboxFailed, State, _free_port  # noqa: E402


def burn() -> None:
    while True:
        pass


def one_start(work: Path, timeout: float) -> str | None:
    """One API server start as `up` does it; None when it answered (or, with no time to wait,
    was found running), else `up`'s message."""
    box = Sandbox(work)
    work.mkdir(parents=True, exist_ok=True)
    state = State(cluster="stress", namespace="stress", sid=runtime.short_id(str(work)), subnet="127.0.0.0/8",
                  gateway="127.0.0.1", api_port=_free_port(), nodes=[], login=None, shared_storage=None,
                  started=time.time())
    state.save(box.state_file)
    try:
        box._spawn("apiserver", state)
        box._wait_api(state, time.monotonic(), timeout)
        return None
    except SandboxFailed as exc:
        return None if timeout == 0 and "did not answer within" in str(exc) else str(exc)
    finally:
        stop(state.processes.get("apiserver"))


def stop(pid: int | None) -> None:
    """SIGTERM to the supervisor (it stops the API server), SIGKILL after 20 s; waits until it is gone."""
    if not pid:
        return
    try:
        os.kill(pid, 15)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 20
    while runtime.alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if runtime.alive(pid):
        os.kill(pid, 9)
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cycles", type=int, default=100, help="API server starts in all (default 100)")
    p.add_argument("--lanes", type=int, default=2, help="starts run at once (default 2)")
    p.add_argument("--burn", type=int, default=os.cpu_count() or 1, help="CPU-spinning processes (default: one per CPU)")
    p.add_argument("--timeout", type=float, default=60, help="`up`'s wait for the API server (default 60 s)")
    p.add_argument("--first-look", action="store_true", help="only `up`'s first look after the start (no wait)")
    args = p.parse_args()
    burners = [multiprocessing.Process(target=burn, daemon=True) for _ in range(args.burn)]
    for b in burners:
        b.start()
    started = time.monotonic()
    timeout = 0 if args.first_look else args.timeout
    # Each lane a process of its own, as the test command's lanes are.
    with tempfile.TemporaryDirectory(prefix="stress-sandbox-") as tmp, \
            multiprocessing.get_context("fork").Pool(args.lanes) as pool:
        results = pool.starmap(one_start, [(Path(tmp) / f"c{i}", timeout) for i in range(args.cycles)], chunksize=1)
    for b in burners:
        b.terminate()
    failures = [msg for msg in results if msg is not None]
    for msg in failures[:5]:
        print(f"--- a start failed:\n{msg}", flush=True)
    print(f"failed: {len(failures)} of {args.cycles} {'first looks' if args.first_look else 'starts'} ({args.lanes} at once, {args.burn} CPU burners, "
          f"{time.monotonic() - started:.0f}s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
