"""The supervisor of one pod under runc: what containerd's shim does for a pod.

Usage: ``unshare --mount --propagation private -- python -m sandbox.runcshim POD_DIR``
(``runcruntime.start``). Its PID is the pod's holder in ``kubelet.json``.

It reads ``POD_DIR/runc.json`` (``runcruntime.prepare`` wrote it, and the
container ids in it, before anything ran), then:

1. runs the pod's pause container (``runc run --detach``): PID 1 of the
   pod's PID namespace, holding its UTS and IPC namespaces too;
2. per container: mounts the overlay root (the image's rootfs below, the
   container's writable layer above; in this process's own mount namespace,
   so no mount is left on the host when the pod ends), writes the pause's
   PID into the bundle's namespace paths and runs it with runc, detached,
   its stdout and stderr appended to the container's log;
3. reaps the containers' processes (it is their subreaper) and ends the pod
   when one of them ends: the kubelet restarts it.

SIGTERM: each container gets SIGTERM (``runc kill``); SIGINT: SIGKILL to
every process of every container. When all have ended it removes them and
the pause (``runc delete --force``) and exits with the first one's status.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36
PAUSE_PLACEHOLDER = "@PAUSE@"  # oci.PAUSE_PLACEHOLDER: this module imports nothing of the package


def runc(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["runc", *args], capture_output=True, text=True, stdin=subprocess.DEVNULL, **kw)


def say(text: str) -> None:
    print(f"runc-shim: {text}", file=sys.stderr, flush=True)


class Shim:
    def __init__(self, pod_dir: Path):
        self.dir = pod_dir
        self.pod = json.loads((pod_dir / "runc.json").read_text())
        self.term = False
        self.kill = False
        self.pids: dict[int, int] = {}  # host PID of a container's process -> its index
        self.status: dict[int, int] = {}  # index -> exit status

    def ids(self) -> list[str]:
        return [c["id"] for c in self.pod["containers"]] + [self.pod["pause"]["id"]]

    def run(self) -> int:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "term", True))
        signal.signal(signal.SIGINT, lambda *_: setattr(self, "kill", True))
        for cid in self.ids():  # what a killed shim left
            runc("delete", "--force", cid)
        try:
            pause = self.start_pause()
            for i, c in enumerate(self.pod["containers"]):
                if self.term or self.kill:
                    break
                self.start_container(i, c, pause)
        except ShimError as exc:
            say(str(exc))
            self.status.setdefault(-1, 1)
            self.term = True
        return self.supervise()

    def start_pause(self) -> int:
        p = self.pod["pause"]
        pid_file = self.dir / "pause.pid"
        with open(self.dir / "log", "ab") as log:
            proc = subprocess.run(["runc", "run", "--detach", "--pid-file", str(pid_file), "--bundle", p["bundle"],
                                   p["id"]], stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        if proc.returncode != 0:
            raise ShimError(f"the pod's pause container did not start (runc exit status {proc.returncode}; "
                            f"its error is above in {self.dir / 'log'})")
        return int(pid_file.read_text())

    def start_container(self, i: int, c: dict, pause: int) -> None:
        ctr = self.dir / "containers" / str(i)
        merged, upper, work = Path(c["root"]), ctr / "layer" / "upper", ctr / "layer" / "work"
        for d in (merged, upper, work):
            d.mkdir(parents=True, exist_ok=True)
        mount = subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                                f"lowerdir={c['lower']},upperdir={upper},workdir={work}", str(merged)],
                               capture_output=True, text=True)
        if mount.returncode != 0:
            raise ShimError(f"container {c['name']}: mounting its root (overlay on {c['lower']}) failed: "
                            f"{mount.stderr.strip()}")
        bundle = Path(c["bundle"])
        spec = (bundle / "config.template.json").read_text().replace(PAUSE_PLACEHOLDER, str(pause))
        (bundle / "config.json").write_text(spec)
        pid_file = ctr / "pid"
        with open(ctr / "log", "ab") as log:
            proc = subprocess.run(["runc", "run", "--detach", "--pid-file", str(pid_file), "--bundle", str(bundle),
                                   c["id"]], stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        if proc.returncode != 0:
            self.status[i] = 128
            raise ShimError(f"container {c['name']} did not start (runc exit status {proc.returncode}; what runc "
                            f"said is at the end of its log)")
        self.pids[int(pid_file.read_text())] = i

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.pids:
                i = self.pids.pop(pid)
                self.status[i] = os.waitstatus_to_exitcode(status)
                if self.status[i] < 0:
                    self.status[i] = 128 - self.status[i]

    def signal_all(self, sig: str) -> None:
        for i, c in enumerate(self.pod["containers"]):
            if i in self.status:
                continue
            runc("kill", *(["--all"] if sig == "KILL" else []), c["id"], sig)

    def supervise(self) -> int:
        termed = killed = False
        first: int | None = None
        while True:
            self.reap()
            ended = [i for i in self.status if i >= 0]
            if first is None and self.status:
                first = next(iter(self.status))
                if not self.term and first >= 0:
                    name = self.pod["containers"][first]["name"]
                    say(f"container {name} exited with status {self.status[first]}; stopping the pod")
                self.term = True
            if self.term and not termed:
                termed = True
                self.signal_all("TERM")
            if self.kill and not killed:
                killed = True
                self.signal_all("KILL")
            if not self.pids and (self.term or len(ended) == len(self.pod["containers"])):
                break
            time.sleep(0.1)
        for cid in self.ids():
            runc("delete", "--force", cid)
        self.reap()
        return self.status.get(first, 0) if first is not None else 0


class ShimError(RuntimeError):
    pass


def main() -> None:
    sys.exit(Shim(Path(sys.argv[1])).run())


if __name__ == "__main__":
    main()
