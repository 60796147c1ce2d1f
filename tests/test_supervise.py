"""The supervisor of the sandbox's control-plane processes (``sandbox/supervise.py``):
the restart rule, and a real supervised process killed, restarted and stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandbox import supervise
from sandbox.supervise import BACKOFF, BURST, STABLE, WINDOW, Restarts


def test_back_off_doubles_to_its_cap_and_starts_over_after_a_stable_run():
    rule = Restarts()
    waits = [rule.after(lasted=WINDOW + 1, failed=True) for _ in range(8)]
    assert waits[0] == BACKOFF[0] and waits[1] == 2 * BACKOFF[0]
    assert max(waits) == BACKOFF[1] and waits == sorted(waits)
    assert rule.after(lasted=STABLE, failed=True) == BACKOFF[0]


def test_it_gives_up_after_a_burst_of_quick_failures_only():
    rule = Restarts()
    assert [rule.after(lasted=0.1, failed=True) is None for _ in range(BURST)] == [False] * (BURST - 1) + [True]
    slow = Restarts()
    assert all(slow.after(lasted=WINDOW, failed=True) is not None for _ in range(3 * BURST))


@given(st.lists(st.tuples(st.floats(0, 2 * STABLE), st.booleans()), max_size=50))
def test_clean_exits_are_always_restarted_within_the_cap(runs):
    rule = Restarts()
    for lasted, failed in runs:
        wait = rule.after(lasted, failed)
        if not failed:
            assert wait is not None
        if wait is not None:
            assert BACKOFF[0] <= wait <= BACKOFF[1]


def _pids(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def _wait_for(predicate, timeout: float = 20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("timed out")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text() if Path(f"/proc/{pid}/stat").exists() else ""
    return ") Z " not in stat


def _supervise(tmp_path: Path, script: str) -> tuple[subprocess.Popen, Path]:
    status = tmp_path / "status.json"
    proc = subprocess.Popen([sys.executable, "-m", "sandbox.supervise", "--status", str(status), "--",
                             sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, status


def test_a_killed_process_is_started_again_and_sigterm_stops_both(tmp_path):
    pids = tmp_path / "pids"
    sup, status = _supervise(tmp_path, f"import os, time; open({str(pids)!r}, 'a').write(f'{{os.getpid()}}\\n'); "
                                       "time.sleep(600)")
    try:
        first = _wait_for(lambda: _pids(pids))[0]
        assert _wait_for(lambda: supervise.read_status(status).get("pid")) == first
        os.kill(first, signal.SIGKILL)
        second = _wait_for(lambda: _pids(pids)[1:])[0]
        assert second != first and _alive(second)
        assert _wait_for(lambda: supervise.read_status(status).get("restarts")) == 1
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(timeout=20) == 0
        assert not _alive(second)
        assert "exited with status -9" in sup.stdout.read()
    finally:
        sup.kill()


def test_a_killed_supervisor_takes_its_process_with_it(tmp_path):
    """`up` starts a new supervisor when it finds the old one dead: its old
    process must not stay behind (two kubelets would run the same pods)."""
    pids = tmp_path / "pids"
    sup, _ = _supervise(tmp_path, f"import os, time; open({str(pids)!r}, 'a').write(f'{{os.getpid()}}\\n'); "
                                  "time.sleep(600)")
    child = _wait_for(lambda: _pids(pids))[0]
    sup.kill()
    sup.wait()
    _wait_for(lambda: not _alive(child))


def test_a_process_that_cannot_start_is_given_up_with_its_status(tmp_path):
    sup, _ = _supervise(tmp_path, "import sys; sys.exit(3)")
    assert sup.wait(timeout=60) == 3
    out = sup.stdout.read()
    assert f"failed {BURST} times" in out and out.count("restarting in") == BURST - 1


def _box(tmp_path: Path, monkeypatch, script: str):
    """A sandbox whose API server is ``script``, started as `up` starts it (under its supervisor)."""
    from sandbox.sandbox import Sandbox, State

    monkeypatch.setattr(Sandbox, "_argv", lambda self, process, state: [sys.executable, "-c", script, "sandbox"])
    box = Sandbox(tmp_path)
    state = State(cluster="c", namespace="d", sid="s", subnet="192.0.2.0/24", gateway="192.0.2.1",  # no network made
                  api_port=1, nodes=[], login=None, shared_storage=None, started=0)
    state.save(box.state_file)
    box._spawn("apiserver", state)
    return box, state


def test_an_api_server_that_fails_is_reported_with_its_exit_status_and_its_output(tmp_path, monkeypatch):
    from sandbox.sandbox import SandboxFailed

    box, state = _box(tmp_path, monkeypatch, "import sys; print('error: cannot listen on 127.0.0.1:1', "
                                             "file=sys.stderr); sys.exit(3)")
    with pytest.raises(SandboxFailed) as failed:
        box._wait_api(state, time.monotonic(), 120)
    message = str(failed.value)
    assert message.startswith("the sandbox's apiserver exited before it answered: its supervisor (pid "
                              f"{state.processes['apiserver']}) exited with status 3; its last run exited with "
                              "status 3.")
    assert message.count("error: cannot listen on 127.0.0.1:1") == BURST  # each run's own words
    assert f"failed {BURST} times" in message


def test_a_supervisor_killed_before_its_api_server_answered_is_said_so_with_its_signal(tmp_path, monkeypatch):
    from sandbox.sandbox import SandboxFailed

    box, state = _box(tmp_path, monkeypatch, "import time; time.sleep(60)")
    status = box.supervisor_status("apiserver")
    child = _wait_for(lambda: supervise.read_status(status).get("pid"))
    os.kill(state.processes["apiserver"], signal.SIGKILL)
    with pytest.raises(SandboxFailed) as failed:
        box._wait_api(state, time.monotonic(), 120)
    message = str(failed.value)
    assert f"its supervisor (pid {state.processes['apiserver']}) was killed by SIGKILL" in message
    assert f"its run 1 (pid {child}) " in message  # still running or ended by now: its parent's death signal
    assert f"supervise: started sandbox (pid {child})" not in message  # named by its module or program
    assert f"supervise: started {sys.executable} (pid {child})" in message  # the log is never empty
    _wait_for(lambda: not _alive(child))
