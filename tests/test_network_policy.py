"""NetworkPolicy enforced on the sandbox's pod network: the policy agent
(sandbox/netpolwatch.py) watches the API stand-in and programs nftables, and
real TCP connections between network namespaces on the sandbox bridge are
let through or dropped (tests/networld.py: pods without containers)."""

from __future__ import annotations

import pytest
from kubernetes.client.rest import ApiException

from .networld import NODE, NetPod, NetWorld
from .tiers import needs

PORTS = (80, 6818, 7000, 7005)
PODS = [
    NetPod("team-a", "client", {"role": "client"}, (("web", 80),)),
    NetPod("team-a", "server", {"role": "server"}, (("web", 80),)),
    NetPod("team-b", "db", {"role": "db"}, (("web", 80),)),
    NetPod("team-b", "other", {"role": "other"}, (("web", 80),)),
]


@pytest.fixture(scope="module")
@needs("root")
def world(tmp_path_factory):
    w = NetWorld(tmp_path_factory.mktemp("netpol"), "npol", "10.253.70.0/24",
                 {"team-a": {"team": "a"}, "team-b": {"team": "b"}}, PODS, PORTS)
    try:
        yield w
    finally:
        w.close()


def test_policies_let_through_what_they_allow_and_drop_the_rest(world: NetWorld):
    # No policy: every pod reaches every pod, and the node.
    everything = world.everything()
    world.converges(everything)

    # The default-deny idiom in team-b: nothing reaches its pods but the node; they still reach out.
    world.policy("team-b", "default-deny-ingress", {"podSelector": {}, "policyTypes": ["Ingress"]})
    allowed = {t for t in everything if t[1] not in ("db", "other") or t[0] == NODE}
    world.converges(allowed)

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
    world.converges(allowed)

    # Egress default-deny in team-a; then the client may send to port 7000 of its network but
    # the server (ipBlock with except: db), and to db on port "web" by name.
    world.policy("team-a", "default-deny-egress", {"podSelector": {}, "policyTypes": ["Egress"]})
    # A pod and its node always reach each other.
    allowed = {t for t in allowed if t[0] not in ("client", "server") or t[1] == NODE}
    world.converges(allowed)
    world.policy("team-a", "client-out", {
        "podSelector": {"matchLabels": {"role": "client"}},
        "policyTypes": ["Egress"],
        "egress": [{"to": [{"ipBlock": {"cidr": "10.253.70.0/24", "except": ["10.253.70.11/32"]}}],
                    "ports": [{"port": 7000}]},
                   {"to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"role": "db"}}}],
                    "ports": [{"port": "web"}]}]})
    allowed |= {("client", "db", 7000), ("client", "db", 80)}
    world.converges(allowed)

    # Policies deleted: everything flows again.
    for ns in ("team-a", "team-b"):
        world.networking.delete_collection_namespaced_network_policy(ns)
    world.converges(everything)


def test_the_api_refuses_a_policy_it_could_not_enforce(world: NetWorld):
    with pytest.raises(ApiException) as err:
        world.policy("team-a", "bad", {"podSelector": {}, "ingress": [
            {"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["192.168.0.0/16"]}}],
             "ports": [{"port": 7000, "endPort": 6000}]}]})
    assert err.value.status == 422
    assert "spec.ingress[0].from[0].ipBlock.except[0]" in err.value.body
    assert "spec.ingress[0].ports[0].endPort" in err.value.body


@pytest.mark.root
def test_overlapping_ports_and_blocks_and_a_one_port_range_make_a_table_nft_takes():
    """nft refuses overlapping set intervals and an empty range; one bad policy must not stop
    the enforcement of all (the agent would keep the old table)."""
    import subprocess

    from sandbox import netpol

    pods = [netpol.Endpoint("a", "p", "10.9.0.5", {"app": "p"}), netpol.Endpoint("a", "q", "10.9.0.6", {})]
    tricky = {"metadata": {"namespace": "a", "name": "tricky"}, "spec": {"podSelector": {}, "ingress": [
        {"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.9.0.0/16", "10.9.0.0/24", "10.9.1.0/24"]}},
                  {"podSelector": {}}],
         "ports": [{"port": 7000, "endPort": 7000}, {"port": 6999, "endPort": 7010}, {"port": 7005},
                   {"port": 7011}, {"protocol": "UDP", "port": 53}]}]}}
    text = netpol.ruleset("sktricky", "10.9.0.0/24", "10.9.0.1", pods, {"a": {}}, [tricky])
    assert "6999-7011" in text and "7000-7000" not in text and "{ 10.9.0.0/16 }" in text
    check = subprocess.run(["nft", "-c", "-f", "-"], input=text.replace("delete table inet sktricky\n", ""),
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
