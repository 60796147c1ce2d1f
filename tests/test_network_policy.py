"""NetworkPolicy enforced on the sandbox's pod network: the policy agent
(sandbox/netpolwatch.py) watches the API stand-in and programs nftables, and
real TCP connections between network namespaces on the sandbox bridge are
let through or dropped. The pods are API objects whose address the test gives
them, each a network namespace with listeners: no images, no containers.
Needs root."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from kubernetes import client, config

from sandbox import runtime
from sandbox.apiserver import APIServer
from sandbox.netpolwatch import PolicyAgent

from .apiserver.conftest import wait_for

SUBNET = "10.253.70.0/24"
GATEWAY = "10.253.70.1"
PORTS = (80, 6818, 7000, 7005)
#: namespace, pod, address, labels
PODS = [
    ("team-a", "client", "10.253.70.10", {"role": "client"}),
    ("team-a", "server", "10.253.70.11", {"role": "server"}),
    ("team-b", "db", "10.253.70.20", {"role": "db"}),
    ("team-b", "other", "10.253.70.21", {"role": "other"}),
]
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


class World:
    def __init__(self, tmp: Path):
        assert os.geteuid() == 0, "network namespaces need root"
        self.server = APIServer(tmp / "api").start()
        api = config.new_client_from_config(str(self.server.write_kubeconfig(tmp / "kubeconfig")))
        self.core = client.CoreV1Api(api)
        self.net_api = client.NetworkingV1Api(api)
        self.net = runtime.Network("npol", SUBNET, GATEWAY)
        self.net.create()
        self.listeners: list[subprocess.Popen] = []
        for ns in ("team-a", "team-b"):
            self.core.create_namespace({"metadata": {"name": ns, "labels": {"team": ns[-1]}}})
        for i, (ns, name, ip, labels) in enumerate(PODS):
            self.core.create_namespaced_pod(ns, {"metadata": {"name": name, "labels": labels}, "spec": {
                "containers": [{"name": "c", "image": "x", "ports": [{"name": "web", "containerPort": 80}]}]}})
            self.core.patch_namespaced_pod_status(name, ns, {"status": {"phase": "Running", "podIP": ip}})
            self.net.attach(name, i, ip)
            proc = subprocess.Popen(["ip", "netns", "exec", self.net.netns(name), sys.executable, "-c", LISTENER,
                                     *map(str, PORTS)], stdout=subprocess.PIPE, text=True)
            assert proc.stdout.readline().strip() == "listening"
            self.listeners.append(proc)
        # The node's own listener, for pods' egress to the node.
        self.node_listener = socket.create_server((GATEWAY, 7000))
        threading.Thread(target=self._node_serve, daemon=True).start()
        self.stop = threading.Event()
        self.agent = PolicyAgent(api, self.net)
        threading.Thread(target=self.agent.run, args=(self.stop,), daemon=True).start()

    def _node_serve(self):
        while True:
            try:
                c, _ = self.node_listener.accept()
            except OSError:
                return
            c.sendall(b"ok")
            c.close()

    def reach(self, src: str, targets: list[str]) -> dict[str, bool]:
        """Which ``ip:port`` pod ``src`` connects to (a dropped connection times out)."""
        out = subprocess.run(["ip", "netns", "exec", self.net.netns(src), sys.executable, "-c", PROBE, *targets],
                             capture_output=True, text=True, timeout=60, check=True).stdout
        return {line.split()[0]: line.split()[1] == "True" for line in out.splitlines()}

    def matrix(self) -> set[tuple[str, str, int]]:
        """Every (source pod, destination, port) that connects, destinations being pods and the node."""
        ips = {ip: name for _, name, ip, _ in PODS} | {GATEWAY: "node"}
        targets = [f"{ip}:{p}" for ip in ips for p in (PORTS if ip != GATEWAY else (7000,))]
        with ThreadPoolExecutor(len(PODS)) as pool:
            results = dict(zip([p[1] for p in PODS], pool.map(lambda p: self.reach(p[1], targets), PODS)))
        return {(src, ips[t.rsplit(":", 1)[0]], int(t.rsplit(":", 1)[1]))
                for src, res in results.items() for t, ok in res.items() if ok
                and ips[t.rsplit(":", 1)[0]] != src}

    def node_reaches(self, ip: str, port: int) -> bool:
        try:
            with socket.create_connection((ip, port), timeout=0.6) as s:
                return s.recv(2) == b"ok"
        except OSError:
            return False

    def policy(self, ns: str, name: str, spec: dict) -> None:
        self.net_api.create_namespaced_network_policy(ns, {"metadata": {"name": name}, "spec": spec})

    def close(self):
        self.stop.set()
        for p in self.listeners:
            p.kill()
        self.node_listener.close()
        for i, (_, name, _, _) in enumerate(PODS):
            self.net.detach(name, i)
        self.net.delete()
        self.server.stop()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    w = World(tmp_path_factory.mktemp("netpol"))
    try:
        yield w
    finally:
        w.close()


def everything() -> set[tuple[str, str, int]]:
    names = [p[1] for p in PODS]
    return ({(s, d, p) for s in names for d in names if s != d for p in PORTS}
            | {(s, "node", 7000) for s in names})


def converges(world: World, want: set) -> None:
    """The agent applies policies within moments of their change: wait for the matrix."""
    seen: list = []

    def check():
        seen[:] = [world.matrix()]
        return seen[0] == want
    try:
        wait_for("the network to enforce the policies", check, timeout=20)
    except AssertionError:
        got = seen[0]
        raise AssertionError(f"allowed but not expected: {sorted(got - want)}\n"
                             f"expected but dropped: {sorted(want - got)}") from None


def test_policies_let_through_what_they_allow_and_drop_the_rest(world: World):
    # No policy: every pod reaches every pod, and the node.
    converges(world, everything())

    # The default-deny idiom in team-b: nothing reaches its pods; they still reach out.
    world.policy("team-b", "default-deny-ingress", {"podSelector": {}, "policyTypes": ["Ingress"]})
    allowed = {t for t in everything() if t[1] not in ("db", "other")}
    converges(world, allowed)

    # db admits team-a's pods on port 80 by name (namespaceSelector), and 7000-7005 from
    # the client alone (both selectors in one peer), and "other" on any port (podSelector).
    world.policy("team-b", "db", {
        "podSelector": {"matchLabels": {"role": "db"}},
        "ingress": [
            {"from": [{"namespaceSelector": {"matchLabels": {"team": "a"}}}], "ports": [{"port": "web"}]},
            {"from": [{"namespaceSelector": {"matchLabels": {"team": "a"}},
                       "podSelector": {"matchLabels": {"role": "client"}}}],
             "ports": [{"protocol": "TCP", "port": 7000, "endPort": 7005}]},
            {"from": [{"podSelector": {"matchLabels": {"role": "other"}}}]},
        ]})
    allowed |= {("client", "db", 80), ("server", "db", 80), ("client", "db", 7000), ("client", "db", 7005)}
    allowed |= {("other", "db", p) for p in PORTS}
    converges(world, allowed)

    # Egress default-deny in team-a, then the client may reach db's 6818 and the node by ipBlock.
    world.policy("team-a", "default-deny-egress", {"podSelector": {}, "policyTypes": ["Egress"]})
    allowed = {t for t in allowed if t[0] not in ("client", "server")}
    converges(world, allowed)
    world.policy("team-a", "client-out", {
        "podSelector": {"matchLabels": {"role": "client"}},
        "policyTypes": ["Egress"],
        "egress": [{"to": [{"ipBlock": {"cidr": "10.253.70.0/24", "except": ["10.253.70.11/32"]}}],
                    "ports": [{"port": 7000}]},
                   {"to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"role": "db"}}}],
                    "ports": [{"port": "web"}]}]})
    # 7000 to everything but server (and db admits it); node's 7000 too. Port 80 to db by name.
    allowed |= {("client", "db", 7000), ("client", "node", 7000), ("client", "db", 80)}
    converges(world, allowed)

    # The node reaches every pod, isolated or not (the kubelet's probes).
    assert all(world.node_reaches(ip, 80) for _, _, ip, _ in PODS)

    # Policies deleted: everything flows again.
    for ns in ("team-a", "team-b"):
        world.net_api.delete_collection_namespaced_network_policy(ns)
    converges(world, everything())


def test_the_api_refuses_a_policy_it_could_not_enforce(world: World):
    from kubernetes.client.rest import ApiException

    with pytest.raises(ApiException) as err:
        world.policy("team-a", "bad", {"podSelector": {}, "ingress": [
            {"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["192.168.0.0/16"]}}],
             "ports": [{"port": 7000, "endPort": 6000}]}]})
    assert err.value.status == 422
    assert "spec.ingress[0].from[0].ipBlock.except[0]" in err.value.body
    assert "spec.ingress[0].ports[0].endPort" in err.value.body
