"""The sandbox's NetworkPolicy enforcement, as a CNI's policy agent (Calico's
Felix, Cilium's agent) does it: it watches Pods, Namespaces and
NetworkPolicies and, after each change, replaces the network's nftables table
with what :mod:`.netpol` compiles, in one ``nft -f`` transaction. A table that
would not change is not written.

It runs in the kubelet's process, with the administrator's credentials (a
CNI's agent has its own ServiceAccount; nothing of slurmk8s talks to it). A
watch that breaks costs latency only: a full resync runs every few seconds.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable

import urllib3
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from . import netpol, runtime

RESYNC = 5.0


class PolicyAgent:
    def __init__(self, api: client.ApiClient, net: runtime.Network, progress: Callable[[str], None] = lambda _: None):
        self.core = client.CoreV1Api(api)
        self.networking = client.NetworkingV1Api(api)
        self.net = net
        self.progress = progress
        self.applied = ""

    def ruleset(self) -> str:
        ser = self.core.api_client.sanitize_for_serialization
        pods = [e for e in (netpol.endpoint(ser(p)) for p in self.core.list_pod_for_all_namespaces().items) if e]
        namespaces = {n.metadata.name: dict(n.metadata.labels or {}) for n in self.core.list_namespace().items}
        policies = [ser(p) for p in self.networking.list_network_policy_for_all_namespaces().items]
        return netpol.ruleset(self.net.table, self.net.subnet, self.net.gateway, pods, namespaces, policies)

    def sync(self) -> None:
        text = self.ruleset()
        if text == self.applied:
            return
        proc = subprocess.run(["nft", "-f", "-"], input=text, capture_output=True, text=True)
        if proc.returncode != 0:
            raise runtime.SandboxError(f"nft refused the NetworkPolicy table: {proc.stderr.strip()}")
        self.applied = text

    def run(self, stop: threading.Event, settle: float = 0.05) -> None:
        wake = threading.Event()
        for lister in (self.core.list_pod_for_all_namespaces, self.core.list_namespace,
                       self.networking.list_network_policy_for_all_namespaces):
            threading.Thread(target=wake_on_changes, args=(lister, stop, wake), daemon=True,
                             name=f"netpol-{lister.__name__}").start()
        while not stop.is_set():
            try:
                self.sync()
            except (ApiException, OSError, urllib3.exceptions.HTTPError, runtime.SandboxError) as exc:
                self.progress(f"network policy: {exc}")
            if wake.wait(RESYNC):
                wake.clear()
                stop.wait(settle)


def wake_on_changes(lister, stop: threading.Event, wake: threading.Event,
                    wanted: Callable[[object], bool] = lambda _: True) -> None:
    """Set ``wake`` on each watched change of what ``lister`` lists whose object is
    ``wanted``, until ``stop``. A watch that breaks (the API server restarting) is started
    again after a second: the caller's own resync period bounds what that costs."""
    while not stop.is_set():
        w = watch.Watch()
        try:
            for event in w.stream(lister, timeout_seconds=60, _request_timeout=(5, 90)):
                if stop.is_set():
                    w.stop()
                    break
                if wanted(event.get("object")):
                    wake.set()
        except (ApiException, OSError, ValueError, urllib3.exceptions.HTTPError):
            stop.wait(1)
