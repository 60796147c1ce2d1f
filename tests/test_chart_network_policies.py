"""The chart's NetworkPolicies for the operator's and the bridge's own pods
(charts/slurmk8s/templates/networkpolicy.yaml; decision record 47): rendered
by the real Helm engine, then enforced by the sandbox's pod network
(tests/networld.py: a network namespace per pod, labelled as the rendered
pods are, without containers), beside a SlurmCluster's own policies in a
namespace with the site's default-deny. A researcher's job reaches the
webhook's port and nothing else of the operator; only the configured
scrapers reach the metrics ports; the operator and the bridge send only to
the API server's ports and the watched clusters' Slurm agents."""

from __future__ import annotations

import json

import helm_python as helm
import pytest
import yaml

from sandbox import install, site
from slurmk8s.api import load_cluster
from slurmk8s.render import ClusterKeys, names, render
from slurmk8s.render.manifests import AgentClients

from .conftest import EXAMPLE, ROOT
from .networld import NODE, NetPod, NetWorld
from .test_chart import CHART, VALUE_SETS, WATCHED, deployment, notes, objects
from .tiers import needs

NS = "hpc"
#: The operator's ports (metrics, health, webhook), the bridge's, the agent's, and the API server's.
PORTS = (443, 6830, 8080, 8081, 8090, 8091, 9443)


def policies(objs: list[dict]) -> dict[str, dict]:
    """component -> its NetworkPolicy."""
    return {o["metadata"]["labels"]["app.kubernetes.io/component"]: o for o in objs if o["kind"] == "NetworkPolicy"}


def release_objects(values: dict) -> list[dict]:
    """The chart as the sandbox installs it: its release name and namespace."""
    with helm.Chart.load(CHART) as chart:
        out = chart.render(values, name=install.RELEASE, namespace=install.RELEASE_NAMESPACE)
    return [d for path, text in out.items() if not path.endswith("NOTES.txt") for d in yaml.safe_load_all(text) if d]


def cluster_objects(namespace: str) -> list[dict]:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["namespace"] = namespace
    return render(load_cluster(doc), ClusterKeys.generate(),
                  agent_clients=AgentClients(install.RELEASE_NAMESPACE, install.RELEASE))


def template_labels(objs: list[dict], component: str) -> dict[str, str]:
    return next(o["spec"]["template"]["metadata"]["labels"] for o in objs
                if o["kind"] in ("StatefulSet", "Deployment")
                and o["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == component)


def chart_pod(objs: list[dict], component: str) -> NetPod:
    """A pod of the chart's ``component`` Deployment: its labels and named ports."""
    spec = deployment(objs, component)["spec"]["template"]
    ports = tuple((p["name"], p["containerPort"]) for p in spec["spec"]["containers"][0]["ports"])
    return NetPod(install.RELEASE_NAMESPACE, component, spec["metadata"]["labels"], ports)


@pytest.fixture(scope="module")
@needs("root")
def world(tmp_path_factory):
    chart = release_objects(install.values(NS))
    slurm = cluster_objects(NS)
    pods = [
        chart_pod(chart, "operator"),
        chart_pod(chart, "bridge"),
        NetPod(install.RELEASE_NAMESPACE, "neighbour", {"app": "other"}),
        NetPod(install.MONITORING_NAMESPACE, "prometheus", {"app.kubernetes.io/name": "prometheus"}),
        NetPod(NS, "controller", template_labels(slurm, "controller"), (("agent", names.AGENT_PORT),)),
        # A researcher's job: a slurmd pod of the cluster.
        NetPod(NS, "job", template_labels(slurm, "worker")),
        # Another team's SlurmCluster, in a namespace the release does not watch.
        NetPod("unwatched", "stranger-agent", template_labels(slurm, "controller"), (("agent", names.AGENT_PORT),)),
    ]
    w = NetWorld(tmp_path_factory.mktemp("chartnet"), "chnet", "10.253.72.0/24",
                 {install.RELEASE_NAMESPACE: {}, install.MONITORING_NAMESPACE: {}, NS: {}, "unwatched": {}},
                 pods, PORTS)
    try:
        w.policy(NS, site.DEFAULT_DENY, {"podSelector": {}, "policyTypes": ["Ingress"]})
        for pol in slurm:
            if pol["kind"] == "NetworkPolicy":
                w.networking.create_namespaced_network_policy(NS, pol)
        w.chart = policies(chart)
        yield w
    finally:
        w.close()


def apply_chart_policies(world: NetWorld, values: dict) -> None:
    world.networking.delete_collection_namespaced_network_policy(install.RELEASE_NAMESPACE)
    for pol in policies(release_objects(values)).values():
        world.networking.create_namespaced_network_policy(install.RELEASE_NAMESPACE, pol)


def test_the_operator_and_bridge_admit_the_webhook_and_the_scrapers_and_send_only_to_the_api_and_agents(world):
    open_pods = {"neighbour", "prometheus", "stranger-agent"}  # no policy selects them
    everyone = {p.name for p in world.pods}
    chart_pods = {"operator", "bridge"}
    want = set()

    def allow(sources, destination, ports):
        want.update((s, destination, p) for s in sources for p in ports if s != destination)

    # Before the chart's policies: the cluster's agent admits the release's operator and
    # bridge alone, and the chart's pods admit everyone on every port.
    for d in open_pods | chart_pods:
        allow(everyone, d, PORTS)
    allow(chart_pods, "controller", {names.AGENT_PORT})
    allow(everyone, NODE, {world.node_port})
    want |= {(NODE, p.name, port) for p in world.pods for port in PORTS}
    world.converges(want)

    apply_chart_policies(world, install.values(NS))
    # Others send freely (no egress policy), but reach the operator only at the webhook and
    # Prometheus at the metrics ports; no pod reaches a health port (the node does).
    want = {t for t in want if t[0] == NODE or t[1] == NODE or (t[0] not in chart_pods and t[1] not in chart_pods)}
    others = everyone - chart_pods
    allow(others, "operator", {9443})
    allow({"prometheus"}, "operator", {8080})
    allow({"prometheus"}, "bridge", {8090})
    # The operator and the bridge send to the API server's ports (any address) and to the
    # agents of the watched namespace; not to another namespace's agent, nor anything else.
    allow(chart_pods, "controller", {names.AGENT_PORT})
    for d in open_pods:
        allow(chart_pods, d, {443})
    world.converges(want)

    # A site narrows the webhook to its control plane's addresses and lets its blackbox
    # prober (here the neighbour) reach /healthz; egress off: they send anywhere again.
    apply_chart_policies(world, {**install.values(NS), "networkPolicy": {
        "webhookFrom": [f"{world.ips['job']}/32"],
        "healthFrom": [{"podSelector": {"matchLabels": {"app": "other"}}}],
        "egress": {"enabled": False}}})
    want = {t for t in want if t[0] == NODE or t[1] == NODE or (t[0] not in chart_pods and t[1] not in chart_pods)}
    allow({"job"}, "operator", {9443})
    allow({"neighbour"}, "operator", {8081})
    allow({"neighbour"}, "bridge", {8091})
    allow(chart_pods, "controller", {names.AGENT_PORT})
    for d in open_pods:
        allow(chart_pods, d, PORTS)
    world.converges(want)


# --- the rendered policies -----------------------------------------------------------


@pytest.mark.parametrize("name", [n for n in VALUE_SETS if n != "bare"])
def test_each_policy_selects_its_own_deployments_pods_and_admits_no_pod_to_health(name):
    objs = objects(VALUE_SETS[name])
    found = policies(objs)
    assert set(found) == {"operator", "bridge"} - ({"bridge"} if name == "bridgeless" else set())
    for component, pol in found.items():
        d = deployment(objs, component)
        assert pol["spec"]["podSelector"] == d["spec"]["selector"], component
        ports = {p["name"]: p["containerPort"] for p in d["spec"]["template"]["spec"]["containers"][0]["ports"]}
        admitted = {p["port"]: r.get("from") for r in pol["spec"]["ingress"] for p in r["ports"]}
        health_from = VALUE_SETS[name].get("networkPolicy", {}).get("healthFrom")
        assert admitted.get(ports["health"]) == health_from, "health: the kubelet probes from the node"
        metrics_from = VALUE_SETS[name].get("networkPolicy", {}).get("metricsFrom")
        assert admitted.get(ports["metrics"]) == metrics_from
        assert set(admitted) <= set(ports.values()), "every admitted port is one the pod serves"
        if "webhook" in ports:
            assert ports["webhook"] in admitted


def test_the_webhook_is_open_to_any_address_unless_narrowed_and_gone_with_the_webhook():
    pol = policies(objects())["operator"]
    assert {"ports": [{"protocol": "TCP", "port": 9443}]} in pol["spec"]["ingress"]
    narrowed = policies(objects({"networkPolicy": {"webhookFrom": ["192.0.2.0/24", "2001:db8::/64"]}}))["operator"]
    assert {"ports": [{"protocol": "TCP", "port": 9443}],
            "from": [{"ipBlock": {"cidr": "192.0.2.0/24"}}, {"ipBlock": {"cidr": "2001:db8::/64"}}]} \
        in narrowed["spec"]["ingress"]
    assert policies(objects({"webhook": {"enabled": False}}))["operator"]["spec"]["ingress"] == []
    assert policies(objects())["bridge"]["spec"]["ingress"] == []


def test_egress_reaches_the_agents_of_exactly_the_namespaces_each_component_watches():
    def agent_rule(values, component):
        pol = policies(objects(values))[component]
        [rule] = [r for r in pol["spec"]["egress"] if r["ports"] == [{"protocol": "TCP", "port": names.AGENT_PORT}]]
        [peer] = rule["to"]
        return peer

    slurm = cluster_objects(NS)
    for component, values, namespaces in [
        ("operator", {"watchNamespaces": WATCHED}, WATCHED),
        ("bridge", {"watchNamespaces": WATCHED}, WATCHED),
        ("bridge", {"watchNamespaces": WATCHED, "bridge": {"watchNamespaces": ["lending"]}}, ["lending"]),
        ("operator", {}, ["slurmk8s-system"]),
    ]:
        peer = agent_rule(values, component)
        assert peer["namespaceSelector"] == {"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": namespaces}]}
        # The agent's pods, as the operator renders them, and only those of the cluster's pods.
        wanted = peer["podSelector"]["matchLabels"]
        selected = {template_labels(slurm, c)["app.kubernetes.io/component"] for c in
                    ("controller", "worker", "login") if wanted.items() <= template_labels(slurm, c).items()}
        assert selected == {"controller"}
    for component in ("operator", "bridge"):
        assert agent_rule(VALUE_SETS["clusterwide"], component)["namespaceSelector"] == {}


def test_egress_allows_the_api_servers_ports_and_the_sites_rules_and_can_be_turned_off():
    pol = policies(objects())["operator"]
    assert pol["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert pol["spec"]["egress"][0] == {"ports": [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 6443}]}
    dns = {"ports": [{"protocol": "UDP", "port": 53}]}
    custom = policies(objects({"networkPolicy": {"egress": {
        "apiServer": {"ports": [8443], "cidrs": ["198.51.100.7/32"]}, "extraRules": [dns]}}}))
    for pol in custom.values():
        assert pol["spec"]["egress"][0] == {"ports": [{"protocol": "TCP", "port": 8443}],
                                            "to": [{"ipBlock": {"cidr": "198.51.100.7/32"}}]}
        assert pol["spec"]["egress"][-1] == dns
    for pol in policies(objects({"networkPolicy": {"egress": {"enabled": False}}})).values():
        assert pol["spec"]["policyTypes"] == ["Ingress"] and "egress" not in pol["spec"]
    assert policies(objects({"networkPolicy": {"enabled": False}})) == {}


def test_the_sandbox_admits_the_example_prometheus_to_the_metrics_ports():
    """hack/demo.sh and the e2e Prometheus test scrape the operator and the bridge from the
    namespace examples/monitoring/prometheus.yaml runs Prometheus in."""
    docs = list(yaml.safe_load_all((ROOT / "examples" / "monitoring" / "prometheus.yaml").read_text()))
    prometheus_ns = next(d for d in docs if d["kind"] == "Deployment")["metadata"]["namespace"]
    objs = release_objects(install.values(NS))
    for component, port in (("operator", 8080), ("bridge", 8090)):
        rules = [r for r in policies(objs)[component]["spec"]["ingress"] if r["ports"][0]["port"] == port]
        assert rules == [{"ports": [{"protocol": "TCP", "port": port}], "from": [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": prometheus_ns}}}]}]


def test_the_notes_say_how_to_admit_prometheus_while_no_scraper_is_named():
    text = notes({})
    [line] = [ln for ln in text.splitlines() if "networkPolicy.metricsFrom=" in ln]
    value = json.loads(line.split("networkPolicy.metricsFrom=", 1)[1].rstrip("'"))
    rules = policies(objects({"networkPolicy": {"metricsFrom": value}}))["operator"]["spec"]["ingress"]
    assert {"ports": [{"protocol": "TCP", "port": 8080}], "from": value} in rules
    assert "networkPolicy.metricsFrom" not in notes({"networkPolicy": {"metricsFrom": value}})
    assert "networkPolicy.metricsFrom" not in notes({"networkPolicy": {"enabled": False}})
