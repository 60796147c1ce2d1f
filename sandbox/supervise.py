"""Keeps one of the sandbox's control-plane processes (the API server, the
kubelet) running, as systemd's ``Restart=always`` keeps a node's kubelet.

``python -m sandbox.supervise --status FILE -- COMMAND...`` runs
COMMAND, and runs it again when it exits, after a back-off that doubles from
0.5 s to 10 s and starts over once a run has lasted a minute. Like systemd's
start limit, it gives up (and exits with the command's status) when the
command fails ``BURST`` times in a row within ``WINDOW`` seconds each: a
process that cannot start at all is reported by ``sandbox up``, not retried
forever.

SIGTERM or SIGINT stops the command (SIGTERM, SIGKILL after ``GRACE``
seconds) and then the supervisor. The status file (JSON, replaced
atomically) says the command's current ``pid`` (null between runs), how often
it was ``restarts`` and how its last run ended (``lastExit``, negative for a
signal, as :class:`subprocess.Popen` says it); ``sandbox status`` shows it and
``sandbox up`` reads the pid and, when the command fails, the status. The
supervisor writes a line to its output for every start, exit and stop, so the
log of a supervised process never reads empty, whatever ended it.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

BURST = 5
WINDOW = 10.0
GRACE = 15.0
STABLE = 60.0
BACKOFF = (0.5, 10.0)
PR_SET_PDEATHSIG = 1


@dataclass
class Restarts:
    """The restart rule, without processes: what to do after a run ended."""

    quick_failures: int = 0
    backoff: float = BACKOFF[0]

    def after(self, lasted: float, failed: bool) -> float | None:
        """Seconds to wait before the next run, or None to give up."""
        if lasted >= STABLE:
            self.backoff = BACKOFF[0]
        self.quick_failures = self.quick_failures + 1 if failed and lasted < WINDOW else 0
        if self.quick_failures >= BURST:
            return None
        wait, self.backoff = self.backoff, min(self.backoff * 2, BACKOFF[1])
        return wait


def read_status(path: Path) -> dict:
    """The supervisor's status file; {} while there is none (or half a one)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _write_status(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def describe(returncode: int) -> str:
    """A process's end in words, from its status as :class:`subprocess.Popen` gives it."""
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


def _name(command: list[str]) -> str:
    """How the log names the command: the module of ``python -m MODULE``, else the program."""
    return command[command.index("-m") + 1] if "-m" in command[:-1] else command[0]


def _log(message: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} supervise: {message}", flush=True)


def _die_with_parent() -> None:
    """In the child: SIGTERM when the supervisor dies, even by SIGKILL, so that a
    killed supervisor never leaves a second API server or kubelet behind."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _wait(child: subprocess.Popen, stopping) -> int:
    """The child's exit status; once ``stopping()``, SIGKILL after GRACE seconds."""
    while True:
        try:
            return child.wait(0.2)
        except subprocess.TimeoutExpired:
            pass
        if stopping():
            try:
                return child.wait(GRACE)
            except subprocess.TimeoutExpired:
                child.kill()
                return child.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--status", type=Path, required=True, help="the JSON file that says the pid and restarts")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to supervise: give it after --")
    stopping = []
    child: subprocess.Popen | None = None

    def stop(signum, _frame) -> None:
        stopping.append(signum)
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    rule = Restarts()
    restarts = 0
    name = _name(command)
    status: dict = {"pid": None, "restarts": 0, "supervisor": os.getpid()}
    while not stopping:
        started = time.monotonic()
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        status.update(pid=child.pid, restarts=restarts)
        _write_status(args.status, status)
        _log(f"started {name} (pid {child.pid})")
        if stopping:  # the signal came between the check and Popen
            child.send_signal(signal.SIGTERM)
        rc = _wait(child, lambda: bool(stopping))
        status.update(pid=None, lastExit=rc)
        _write_status(args.status, status)
        if stopping:
            _log(f"stopping on {signal.Signals(stopping[0]).name}: {name} {describe(rc)}")
            break
        lasted = time.monotonic() - started
        wait = rule.after(lasted, rc != 0)
        if wait is None:
            _log(f"{name} failed {BURST} times within {WINDOW:.0f}s each (last: {describe(rc)}); giving up")
            return rc if rc > 0 else 128 - rc if rc < 0 else 1
        _log(f"{name} exited with status {rc} after {lasted:.1f}s; restarting in {wait:.1f}s")
        deadline = time.monotonic() + wait
        while not stopping and time.monotonic() < deadline:
            time.sleep(0.1)
        restarts += 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
