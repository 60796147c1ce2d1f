"""Where the operator and the bridge send the agent's bearer token: the
controller pod's IP, and nowhere else (issue 13, item 6: a DNS name built
from spec.clusterDomain could send the token to someone else's host)."""

from __future__ import annotations

import socket
import urllib.request

import pytest

from slurmk8s.api import load_cluster
from slurmk8s.bridge import loop
from slurmk8s.operator import round as operator_round
from slurmk8s.slurm import AgentUnreachable

TOKEN = b"t" * 32


@pytest.fixture
def cluster(example_doc):
    doc = {**example_doc, "spec": {**example_doc["spec"], "clusterDomain": "attacker.example"}}
    return load_cluster(doc)


@pytest.fixture
def no_network(monkeypatch):
    sent = []

    def urlopen(request, *args, **kwargs):
        sent.append(getattr(request, "full_url", request))
        raise AssertionError(f"a request was sent to {sent[-1]}")

    def connect(address, *args, **kwargs):
        sent.append(address)
        raise AssertionError(f"a connection was opened to {address}")

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    monkeypatch.setattr(socket, "create_connection", connect)
    return sent


def pod(ip=None):
    return {"metadata": {"name": "demo-controller-0"}, "status": {"podIP": ip} if ip else {}}


@pytest.mark.parametrize("controller_pod,url", [
    (pod("10.244.0.7"), "http://10.244.0.7:6830"),
    (pod("fd00::7"), "http://[fd00::7]:6830"),
    (pod(), None),
    (None, None),
    (pod("demo-controller-0.attacker.example"), None),  # not an IP: not a place to send the token
])
def test_the_operator_addresses_the_agent_by_the_pods_ip_only(cluster, controller_pod, url):
    assert operator_round._default_agent(cluster, TOKEN, controller_pod).base_url == url


@pytest.mark.parametrize("make", [operator_round._default_agent, loop._default_agent], ids=["operator", "bridge"])
def test_without_a_pod_ip_nothing_is_sent_anywhere(cluster, no_network, make):
    slurm = make(cluster, TOKEN, pod())
    with pytest.raises(AgentUnreachable, match="no IP"):
        slurm.nodes()
    with pytest.raises(AgentUnreachable, match="no IP"):
        slurm.published("/shared/checkpoints/x")
    assert not slurm.healthy()
    assert no_network == []
    assert "attacker" not in repr(slurm)
