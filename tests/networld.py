"""A pod network without containers, for NetworkPolicy tests: the API stand-in,
the sandbox's bridge, and one network namespace per pod with TCP listeners on
the given ports; the Pod objects carry the labels and addresses the test
gives them. The sandbox's policy agent (sandbox/netpolwatch.py) programs
nftables from the API, and :meth:`NetWorld.matrix` tries real connections
between them all. Needs root."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes import client, config

from sandbox import runtime
from sandbox.apiserver import APIServer
from sandbox.netpolwatch import PolicyAgent

from .apiserver.conftest import wait_for

LISTENER = """
import socket, sys, threading
def serve(port):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen(64)
    while True:
        c, _ = s.accept(); c.sendall(b"ok"); c.close()
for p in sys.argv[1:]:
    threading.Thread(target=serve, args=(int(p),), daemon=True).start()
print("listening", flush=True)
threading.Event().wait()
"""
PROBE = """
import socket, sys
from concurrent.futures import ThreadPoolExecutor
def connects(target):
    host, port = target.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=0.6) as s:
            return s.recv(2) == b"ok"
    except OSError:
        return False
with ThreadPoolExecutor(len(sys.argv) - 1) as pool:
    for target, ok in zip(sys.argv[1:], pool.map(connects, sys.argv[1:])):
        print(target, ok)
"""
NODE = "node"


@dataclass(frozen=True)
class NetPod:
    namespace: str
    name: str
    labels: dict[str, str] = field(default_factory=dict)
    container_ports: tuple[tuple[str, int], ...] = ()  # (name, port) of its one container


class NetWorld:
    """``pods`` listening on ``ports`` in network ``sid`` (``subnet``: a /24), in
    ``namespaces`` (name -> labels); the node listens on ``node_port``."""

    def __init__(self, tmp: Path, sid: str, subnet: str, namespaces: dict[str, dict[str, str]],
                 pods: list[NetPod], ports: tuple[int, ...], node_port: int = 7000):
        assert os.geteuid() == 0, "network namespaces need root"
        prefix = subnet.rsplit(".", 1)[0]
        self.gateway = f"{prefix}.1"
        self.ports, self.node_port = ports, node_port
        self.server = APIServer(tmp / "api").start()
        api = config.new_client_from_config(str(self.server.write_kubeconfig(tmp / "kubeconfig")))
        self.core = client.CoreV1Api(api)
        self.networking = client.NetworkingV1Api(api)
        self.net = runtime.Network(sid, subnet, self.gateway)
        self.net.create()
        self.pods = pods
        self.ips = {p.name: f"{prefix}.{10 + i}" for i, p in enumerate(pods)}
        self.listeners: list[subprocess.Popen] = []
        self.stop = threading.Event()
        try:
            for ns, labels in namespaces.items():
                self.core.create_namespace({"metadata": {"name": ns, "labels": labels}})
            for i, p in enumerate(pods):
                named = [{"name": n, "containerPort": port} for n, port in p.container_ports]
                self.core.create_namespaced_pod(p.namespace, {
                    "metadata": {"name": p.name, "labels": p.labels},
                    "spec": {"containers": [{"name": "c", "image": "x", "ports": named}]}})
                self.core.patch_namespaced_pod_status(p.name, p.namespace, {
                    "status": {"phase": "Running", "podIP": self.ips[p.name]}})
                self.net.attach(p.name, i, self.ips[p.name])
                proc = subprocess.Popen(["ip", "netns", "exec", self.net.netns(p.name), sys.executable, "-c",
                                         LISTENER, *map(str, ports)], stdout=subprocess.PIPE, text=True)
                self.listeners.append(proc)
                assert proc.stdout.readline().strip() == "listening"
            self.node_listener = socket.create_server((self.gateway, node_port))
            threading.Thread(target=self._node_serve, daemon=True).start()
            self.agent = PolicyAgent(api, self.net)
            threading.Thread(target=self.agent.run, args=(self.stop,), daemon=True).start()
        except BaseException:
            self.close()
            raise

    def _node_serve(self) -> None:
        while True:
            try:
                c, _ = self.node_listener.accept()
            except OSError:
                return
            c.sendall(b"ok")
            c.close()

    def _reach(self, src: str, targets: list[str]) -> dict[str, bool]:
        out = subprocess.run(["ip", "netns", "exec", self.net.netns(src), sys.executable, "-c", PROBE, *targets],
                             capture_output=True, text=True, timeout=60, check=True).stdout
        return {line.split()[0]: line.split()[1] == "True" for line in out.splitlines()}

    def matrix(self) -> set[tuple[str, str, int]]:
        """Every (source pod, destination pod or NODE, port) that connects (a dropped
        connection times out), and (NODE, pod, port) for the node's own connections."""
        where = {ip: name for name, ip in self.ips.items()} | {self.gateway: NODE}
        targets = [f"{ip}:{port}" for name, ip in self.ips.items() for port in self.ports]
        targets.append(f"{self.gateway}:{self.node_port}")
        with ThreadPoolExecutor(len(self.pods)) as pool:
            results = dict(zip(self.ips, pool.map(lambda name: self._reach(name, targets), self.ips), strict=True))
        out = set()
        for src, res in results.items():
            for target, ok in res.items():
                ip, port = target.rsplit(":", 1)
                if ok and where[ip] != src:
                    out.add((src, where[ip], int(port)))
        for name, ip in self.ips.items():
            out |= {(NODE, name, port) for port in self.ports if self._node_reaches(ip, port)}
        return out

    @staticmethod
    def _node_reaches(ip: str, port: int) -> bool:
        try:
            with socket.create_connection((ip, port), timeout=0.6) as s:
                return s.recv(2) == b"ok"
        except OSError:
            return False

    def everything(self) -> set[tuple[str, str, int]]:
        """The matrix without any policy."""
        names = list(self.ips)
        return ({(s, d, p) for s in names for d in names if s != d for p in self.ports}
                | {(s, NODE, self.node_port) for s in names} | {(NODE, d, p) for d in names for p in self.ports})

    def converges(self, want: set) -> None:
        """Wait for the agent to enforce what the API holds: the matrix becomes ``want``."""
        seen: list = [set()]

        def check():
            seen[0] = self.matrix()
            return seen[0] == want
        try:
            wait_for("the network to enforce the policies", check, timeout=20)
        except AssertionError:
            got = seen[0]
            raise AssertionError(f"allowed but not expected: {sorted(got - want)}\n"
                                 f"expected but dropped: {sorted(want - got)}") from None

    def policy(self, ns: str, name: str, spec: dict) -> None:
        self.networking.create_namespaced_network_policy(ns, {"metadata": {"name": name}, "spec": spec})

    def close(self) -> None:
        self.stop.set()
        for p in self.listeners:
            p.kill()
        if getattr(self, "node_listener", None) is not None:
            self.node_listener.close()
        for i, p in enumerate(self.pods):
            self.net.detach(p.name, i)
        self.net.delete()
        self.server.stop()
