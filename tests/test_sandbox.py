"""The sandbox's lifecycle with real pods: a failing pod is named with its
log, an `up` killed half way is cleaned up by the next one, and `down` leaves
no process, runc container, namespace, mount, veth or bridge behind, however
often it runs.
(The researcher's view of a running sandbox is in e2e/.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from sandbox import Sandbox, runcruntime, runtime

pytestmark = pytest.mark.slurm
SLURMK8S = str(Path(sys.executable).parent / "slurmk8s")


def manifest(tmp_path: Path, name: str, **slurm_config) -> Path:
    doc = {
        "apiVersion": "slurmk8s.dev/v1alpha1", "kind": "SlurmCluster", "metadata": {"name": name},
        "spec": {
            "nodeSets": [{"name": "cpu", "replicas": 2, "cpus": 1, "memory": "1Gi"}],
            "partitions": [{"name": "cpu", "nodeSets": ["cpu"], "default": True}],
            "slurmConfig": slurm_config,
        },
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def sandbox(*args: str, state: Path, check: bool = False, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([SLURMK8S, "sandbox", *args, "--state-dir", str(state)],
                          capture_output=True, text=True, timeout=180, check=check, **kw)


def footprint(box: Sandbox) -> dict:
    """What a running sandbox holds on this host: processes, pods, namespaces, links."""
    state = box.state()
    net = box.network(state)
    spaces, links = net.leftovers()
    inodes = {os.stat(f"/var/run/netns/{s}").st_ino for s in spaces}
    holders = [p["holder"] for p in box._local_pods().values()]
    children = [box.process_pid(p) for p in state.processes]  # the supervised API server and kubelet
    return {"sid": state.sid, "spaces": spaces, "links": links, "inodes": inodes,
            "containers": runcruntime.leftovers(state.sid),
            "pids": holders + list(state.processes.values()) + [pid for pid in children if pid]}


def assert_nothing_left(box: Sandbox, before: dict) -> None:
    assert box.state() is None
    assert not any(runtime.alive(pid) for pid in before["pids"])  # gone, or a zombie of an exited parent
    in_pod_netns = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if os.stat(proc / "ns/net").st_ino in before["inodes"]:
                    in_pod_netns.append(proc.name)
            except (FileNotFoundError, PermissionError, ProcessLookupError):
                continue
    assert in_pod_netns == [], f"processes still in a pod's network namespace: {in_pod_netns}"
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(s in netns for s in before["spaces"])
    assert not any(Path(f"/sys/class/net/{link}").exists() for link in before["links"])
    mounts = Path("/proc/self/mountinfo").read_text()
    assert str(box.dir) not in mounts and f"/run/netns/sk8s-{before['sid']}-" not in mounts
    assert runcruntime.leftovers(before["sid"]) == []  # no runc container of its pods, nor their pauses


def test_a_pod_that_fails_is_named_with_the_tail_of_its_log(tmp_path):
    state = tmp_path / "state"
    try:  # an `up` that runs past its limit is torn down too: nothing is left on the subnet
        up = sandbox("up", "-f", str(manifest(tmp_path, "broken", extraLines=["MessageTimeout=soon"])),
                     "--subnet", "10.253.78.0/24", "--timeout", "120", state=state)
        assert up.returncode == 1
        assert "pod broken-controller-0 keeps failing" in up.stderr
        # the log's tail carries slurmctld's own words, and the message says what to do next
        assert 'MessageTimeout value "soon" is not a valid number' in up.stderr
        assert "sandbox up` again" in up.stderr
        logs = sandbox("logs", "broken-controller-0", state=state, check=True).stdout
        assert "fatal: Unable to process configuration file" in logs
    finally:
        sandbox("down", "--purge", state=state, check=True)


def test_up_after_a_crash_recovers_and_down_leaves_nothing(tmp_path):
    state = tmp_path / "state"
    path = str(manifest(tmp_path, "crash"))
    subnet = ["--subnet", "10.253.79.0/24"]
    # An `up` killed while it starts the sandbox, as by a crash or Ctrl-C at the wrong moment...
    first = subprocess.Popen([SLURMK8S, "sandbox", "up", "-f", path, *subnet, "--state-dir", str(state)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for line in first.stderr:
        if "helm: installing" in line:  # or in the middle of Helm's install
            time.sleep(0.5)
            first.send_signal(signal.SIGKILL)
            break
    first.wait(timeout=30)
    try:
        recover_and_tear_down(state, path, subnet)
    finally:
        sandbox("down", "--purge", state=state)


def recover_and_tear_down(state: Path, path: str, subnet: list[str]) -> None:
    box = Sandbox(state)
    half = box.state()
    # ...and the kubelet killed with it: its pods must not be lost or doubled.
    os.kill(half.processes["kubelet"], signal.SIGKILL)

    up = sandbox("up", "-f", path, *subnet, state=state)
    assert up.returncode == 0, up.stderr
    assert "starting what is not running" in up.stderr and "started kubelet" in up.stderr
    assert "started apiserver" not in up.stderr  # still running: kept
    nodes = box.slurm().nodes()
    assert sorted((n.name, n.state) for n in nodes) == [("crash-cpu-0", "idle"), ("crash-cpu-1", "idle")]
    pods = [p["name"] for p in box._local_pods().values()]
    assert len(pods) == len(set(pods))

    before = footprint(box)
    assert before["spaces"] and before["links"] and before["inodes"] and before["containers"]
    down = sandbox("down", state=state, check=True)
    assert "pod crash-cpu-1" in down.stdout and "apiserver" in down.stdout
    assert_nothing_left(box, before)
    again = sandbox("down", state=state, check=True)
    assert again.stdout.strip() == "Nothing was running."


def test_a_process_started_but_not_recorded_is_adopted_by_up_and_stopped_by_down(tmp_path, monkeypatch):
    """An `up` killed between starting a process and writing its pid leaves it
    running: the next `up` keeps it instead of starting a second one (which
    would find its port taken), and `down` stops it."""
    import uuid

    from sandbox.sandbox import State

    argv = [sys.executable, "-c", "import time; time.sleep(60)", f"sandbox-{uuid.uuid4().hex}"]
    monkeypatch.setattr(Sandbox, "_command", lambda self, process, state: argv)
    box = Sandbox(tmp_path)
    state = State(cluster="c", namespace="d", sid="s", subnet="10.253.80.0/24", gateway="10.253.80.1",
                  api_port=1, nodes=[], login=None, shared_storage=None, started=0)
    state.save(box.state_file)
    orphan = subprocess.Popen(argv)
    try:
        deadline = time.monotonic() + 10  # until it has exec'd: its command line is its own
        while not box._unrecorded("kubelet", state) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert box._unrecorded("kubelet", state) == [orphan.pid]
        box._ensure_processes(state, 0, 10)
        assert State.load(box.state_file).processes["kubelet"] == orphan.pid  # kept, none started
        monkeypatch.setattr(runtime, "Network", lambda *a: type("N", (), {
            "delete": lambda self: None, "leftovers": lambda self: ([], []), "bridge": "none"})())
        removed = box.down()
        assert "kubelet" in removed
        assert orphan.wait(timeout=20) is not None  # stopped
    finally:
        if orphan.poll() is None:
            orphan.kill()


def in_execve(monkeypatch, pids: set[int], seconds: float) -> None:
    """/proc/PID/cmdline of each of ``pids`` reads empty for ``seconds`` from now, as the kernel
    reads a process that is in its execve: switched to the new program's memory (its parent's
    fork has returned) and its arguments not yet placed there. The window is microseconds on an
    idle machine and longer on a busy one; stretched here so that every look falls in it."""
    until = time.monotonic() + seconds
    read_bytes = Path.read_bytes

    def read(path: Path) -> bytes:
        if time.monotonic() < until and str(path) in {f"/proc/{pid}/cmdline" for pid in pids}:
            return b""
        return read_bytes(path)

    monkeypatch.setattr(Path, "read_bytes", read)


def test_a_process_still_in_its_execve_is_running_and_a_kernel_thread_is_not_ours(monkeypatch):
    from sandbox.sandbox import _running

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "sandbox-in-execve"])
    try:
        in_execve(monkeypatch, {child.pid}, 0.5)
        assert _running(child.pid, "sandbox-in-execve")
        kernel_thread = next(int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and runtime._stat(
            int(p.name)) and int(runtime._stat(int(p.name))[6]) & runtime.PF_KTHREAD)
        started = time.monotonic()
        assert runtime.cmdline(kernel_thread) == [] and not _running(kernel_thread, "sandbox")
        assert time.monotonic() - started < runtime.EXEC_SETTLE / 2  # not waited on: it never has one
    finally:
        child.kill()
        child.wait()


def test_up_waits_for_an_api_server_whose_supervisor_is_still_in_its_execve(tmp_path, monkeypatch):
    """`up` looks at the API server's supervisor right after starting it; a look that falls
    in its execve must not be taken for its end ("exited before it answered", empty log)."""
    from sandbox.sandbox import State, _free_port

    box = Sandbox(tmp_path)
    state = State(cluster="c", namespace="d", sid="s", subnet="10.253.80.0/24", gateway="10.253.80.1",
                  api_port=_free_port(), nodes=[], login=None, shared_storage=None, started=0)
    state.save(box.state_file)
    # An API server that answers after a second: writes both kubeconfigs and listens.
    server = (f"import socket, time, pathlib; time.sleep(1); s = socket.create_server(('127.0.0.1', {state.api_port})); "
              f"[pathlib.Path(p).write_text('') for p in ({str(box.kubeconfig)!r}, {str(box.kubelet_kubeconfig)!r})]; "
              "time.sleep(60)")
    monkeypatch.setattr(Sandbox, "_argv", lambda self, process, state: [sys.executable, "-c", server, "sandbox"])
    spawn = subprocess.Popen

    def popen(argv, **kw):  # the supervisor's command line reads empty for its first 0.6 s
        proc = spawn(argv, **kw)
        in_execve(monkeypatch, {proc.pid}, 0.6)
        return proc

    monkeypatch.setattr(subprocess, "Popen", popen)
    try:
        box._spawn("apiserver", state)
        box._wait_api(state, time.monotonic(), 30)
    finally:
        monkeypatch.undo()
        box._kill(state.processes.get("apiserver"))
