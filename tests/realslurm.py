"""Run real Slurm daemons for tests, isolated in Linux namespaces.

A :class:`SlurmNamespace` gets private mount, UTS, network and PID namespaces
(``unshare``): its own hostname, /etc/hosts, munge socket and ports. It runs
slurmctld on a rendered config and, optionally, dynamic slurmd nodes; tests run
Slurm commands inside it through :meth:`SlurmNamespace.run`. The host is left
as it was.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from slurmk8s.render import ClusterKeys

FIXTURES = Path(__file__).parent / "fixtures"
NEEDED = ("slurmctld", "slurmd", "scontrol", "sinfo", "munged", "unshare", "nsenter", "ip")


def missing_tools() -> list[str]:
    return [t for t in NEEDED if shutil.which(t) is None]


def parse_config(text: str) -> dict[str, str]:
    """``scontrol show config`` -> {key: value}."""
    out = {}
    for line in text.splitlines():
        if " = " in line:
            key, value = line.split(" = ", 1)
            out[key.strip()] = value.strip()
    return out


def parse_oneliners(text: str, key: str) -> dict[str, dict[str, str]]:
    """``scontrol show <thing> --oneliner`` -> {name: {field: value}}."""
    out = {}
    for line in text.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if key in fields:
            out[fields[key]] = fields
    return out


class SlurmNamespace:
    """slurmctld (and slurmd nodes) on ``files`` in private namespaces."""

    def __init__(self, files: dict[str, str], keys: ClusterKeys, work: Path,
                 nodes: Sequence[tuple[str, str]] = (), timeout: float = 60,
                 roots: Sequence[Path] = ()):
        """``roots``: run the daemons and commands from these image root file
        systems (an overlay, the first on top) instead of this host's."""
        self.work = work
        self.root = work / "root" if roots else None
        conf = work / "conf"
        conf.mkdir(parents=True)
        for name, text in files.items():
            (conf / name).write_text(text)
        (work / "munge.key").write_bytes(keys.munge_key)
        (work / "jwt.key").write_bytes(keys.jwt_key)
        args = [a for node in nodes for a in node]
        self.proc = subprocess.Popen(
            # A PID namespace too: daemons (munged forks away) die with the script.
            ["unshare", "--mount", "--uts", "--net", "--pid", "--mount-proc", "--fork", "--kill-child",
             "bash", str(FIXTURES / "slurm-ns.sh"), str(conf), str(work), *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
            env={**os.environ, "SLURM_ROOTS": ":".join(map(str, roots))},
        )
        deadline = time.monotonic() + timeout
        while not (work / "ready").exists():
            if self.proc.poll() is not None:
                _, err = self.proc.communicate()
                raise AssertionError(f"Slurm did not start (exit {self.proc.returncode}):\n{err}\n{self.log()}")
            if time.monotonic() > deadline:
                self.close()
                raise AssertionError(f"Slurm did not start within {timeout}s:\n{self.log()}")
            time.sleep(0.1)
        self.pid = self._inner_pid()

    def _inner_pid(self) -> int:
        # unshare --fork: the script runs as unshare's child, in the new namespaces.
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        return int(children[0])

    def run(self, argv: Sequence[str], input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        """Run a command inside the namespaces (as a process on the controller)."""
        chroot = ["chroot", str(self.root)] if self.root else []
        return subprocess.run(
            ["nsenter", "-t", str(self.pid), "--mount", "--uts", "--net", "--pid", "--", *chroot, *argv],
            input=input, capture_output=True, text=True, timeout=60, check=check,
        )

    def start_local_node(self, name: str, node_conf: str, conf_dir: Path, timeout: float = 30) -> str:
        """Start a dynamic slurmd that reads ``conf_dir`` (not configless), as a
        lent node does, and wait until it is registered; returns its state."""
        log = self.work / f"slurmd-{name}.log"
        self.run(["slurmd", "-Z", "-N", name, "-f", str(conf_dir / "slurm.conf"),
                  "-L", str(log), "--conf", node_conf])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.run(["sinfo", "-h", "-N", "-n", name, "-o", "%T"], check=False).stdout.strip()
            if state and not state.startswith(("unk", "down", "inval")):
                return state
            time.sleep(0.2)
        raise AssertionError(f"node {name} did not register within {timeout}s (state {state!r}):\n"
                             f"{log.read_text() if log.exists() else ''}\n{self.log()[-3000:]}")

    def log(self) -> str:
        path = self.work / "slurmctld.log"
        return path.read_text() if path.exists() else ""

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def __enter__(self) -> SlurmNamespace:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
