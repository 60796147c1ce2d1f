"""A small Kubernetes for the kubelet tests: the API stand-in, a network for
pods, the sandbox's registry, and the sandbox's real kubelet running in a
thread; its pods run under runc from images built from images/ (built here
when missing, cached after), pushed to the registry and pulled from it by the
kubelet, as ``sandbox up`` does. Needs root."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import termios
import threading
import time
from pathlib import Path

from kubernetes import client, config

from sandbox import publish, registry, runtime
from sandbox.apiserver import APIServer
from sandbox.images import recipes
from sandbox.imagestore import ImageStore
from sandbox.kubelet import Kubelet, SandboxNode, image_cache
from sandbox.pulls import NodeImages


class KubeletWorld:
    """``nodes`` served by one kubelet on network ``sid`` (``subnet``, gateway ``.1``),
    whose pods may run the ``images`` (references)."""

    def __init__(self, tmp: Path, sid: str, subnet: str, nodes: list[SandboxNode], images: list[str] = ()):
        assert os.geteuid() == 0, "the kubelet needs root (namespaces, mounts, veths)"
        built = ImageStore().ensure(images, progress=print)  # seconds when all are cached
        self.dir = tmp
        self.nodes = nodes
        self.server = APIServer(tmp / "api").start()
        self.registry: registry.Registry | None = None
        self.net: runtime.Network | None = None
        try:
            self.kubeconfig = self.server.write_kubeconfig(tmp / "kubeconfig")
            self.api = config.new_client_from_config(str(self.kubeconfig))
            self.core = client.CoreV1Api(self.api)
            net = runtime.Network(sid, subnet, subnet.rsplit(".", 1)[0] + ".1")
            net.create()
            self.net = net
            self.registry = registry.start(publish.directory(sid), "127.0.0.1:0", storage=publish.storage())
            store = ImageStore()
            for release in sorted({i.meta["slurmVersion"] for i in built.values()}):
                # Every image of the release: seconds, the registry has them.
                publish.publish(self.registry, [t for r in recipes([], release, store.names()) for t in r.tags], print)
        except BaseException:  # what started goes with the failure: no registry, bridge or API server left
            if self.registry is not None:
                self.registry.stop()
            if self.net is not None:
                self.net.delete()
            self.server.stop()
            raise
        self.images = NodeImages(image_cache(), publish.node_registries(self.registry), tmp / "images")
        self.kubelet: Kubelet | None = None
        self.start_kubelet()

    def start_kubelet(self) -> None:
        self.stop = threading.Event()
        self.kubelet = Kubelet(self.api, self.nodes, self.dir / "kubelet", self.net, images=self.images)
        self.thread = threading.Thread(target=self.kubelet.run, args=(self.stop,), daemon=True)
        self.thread.start()

    def kill_kubelet(self) -> None:
        """The kubelet process goes away; its pods keep running."""
        self.stop.set()
        self.thread.join(timeout=10)

    def run_kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run(["kubectl", "--kubeconfig", str(self.kubeconfig), *args], input=input,
                              capture_output=True, text=True, timeout=60)
        if check:
            assert proc.returncode == 0, proc.stderr
        return proc

    def exec_in_terminal(self, target: list[str], script: bytes, size: tuple[int, int] = (33, 97),
                         timeout: float = 30) -> tuple[str, int]:
        """`kubectl exec -it <target> -- sh` under a pseudo-terminal of ``size``
        (rows, columns), typing ``script``; returns what the terminal showed and
        kubectl's exit code."""
        pid, fd = pty.fork()
        if pid == 0:
            os.execvp("kubectl", ["kubectl", "--kubeconfig", str(self.kubeconfig), "exec", "-it", *target,
                                  "--", "sh"])
        try:
            fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", *size, 0, 0))
            output = b""
            deadline = time.monotonic() + timeout
            # Typed once the shell shows its prompt ($ or #), as a person does: kubectl sends
            # the terminal's size beside the session, and a loaded machine may let a
            # command typed ahead run before the size arrived.
            while not (b"$ " in output or b"# " in output) and time.monotonic() < deadline:
                if select.select([fd], [], [], 1)[0]:
                    output += os.read(fd, 4096)
            os.write(fd, script)
            while time.monotonic() < deadline:
                if not select.select([fd], [], [], 1)[0]:
                    continue
                try:
                    chunk = os.read(fd, 4096)
                except OSError:
                    break
                if not chunk:
                    break
                output += chunk
            _, status = os.waitpid(pid, 0)
        finally:
            os.close(fd)
        return output.decode(errors="replace"), os.waitstatus_to_exitcode(status)

    def pod(self, name: str):
        return self.core.read_namespaced_pod(name, "default")

    def close(self) -> None:
        self.kill_kubelet()
        self.kubelet.stop_all()
        self.net.delete()
        for ns in self.net.leftovers()[0]:
            runtime.sh("ip", "netns", "del", ns, check=False)
        self.registry.stop()
        self.server.stop()
