"""The cluster's NetworkPolicies (slurmk8s/render/network.py), rendered and
then enforced by the sandbox's pod network (tests/networld.py: a network
namespace per pod, labelled as the rendered pods are, without containers) in
a namespace whose default-deny policy cuts ingress and egress. The cluster's
own traffic flows, and a pod that is not the cluster's reaches only SSH and
slurmrestd. The operator's flags, RBAC and API kinds that apply them."""

from __future__ import annotations

import copy

import pytest
import yaml

from slurmk8s import cli
from slurmk8s.api import load_cluster
from slurmk8s.kube import RESOURCES
from slurmk8s.operator.permissions import OPERATOR
from slurmk8s.operator.plan import MANAGED_KINDS
from slurmk8s.render import ClusterKeys, names, render
from slurmk8s.render.manifests import AgentClients, lent_slurmd_pod

from .conftest import EXAMPLE
from .networld import NODE, NetPod, NetWorld
from .tiers import needs

CLIENTS = AgentClients(namespace="slurmk8s-system", release="slurmk8s")
NS = "hpc"
SRUN = (60001, 63000)
#: Every port a pod of the cluster serves, and one a job's own server might use.
PORTS = (22, 3306, 6817, 6818, 6819, 6820, 6830, SRUN[0], SRUN[1], 12345)


def network_policies(objs):
    return [o for o in objs if o["kind"] == "NetworkPolicy"]


def doc(example_doc, **network):
    example_doc = copy.deepcopy(example_doc)  # the fixture is shared
    example_doc["metadata"]["namespace"] = NS
    example_doc["spec"]["restApi"] = {"enabled": True}
    example_doc["spec"]["network"] = network
    example_doc["spec"].setdefault("slurmConfig", {})["srunPortRange"] = f"{SRUN[0]}-{SRUN[1]}"
    return example_doc


def pod_labels(objs) -> dict[str, dict]:
    """One pod's labels per component, as the workloads' templates give them."""
    out = {}
    for o in objs:
        if o["kind"] in ("StatefulSet", "Deployment"):
            labels = o["spec"]["template"]["metadata"]["labels"]
            out.setdefault(labels["app.kubernetes.io/component"], labels)
    return out


@pytest.fixture(scope="module")
@needs("root")
def world(tmp_path_factory):
    cluster = load_cluster(doc(yaml.safe_load(EXAMPLE.read_text()), egress=True))
    objs = render(cluster, ClusterKeys.generate(), agent_clients=CLIENTS)
    lent = lent_slurmd_pod(cluster, "", node="gpu-7", labels={}, partition="gpu",
                           resources={"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "4"}, shm_size="1Gi",
                           taint_key="t")
    labels = pod_labels(objs) | {"lent": lent["metadata"]["labels"]}
    pods = [NetPod(NS, component, labels[component]) for component in sorted(labels)]
    pods += [NetPod("elsewhere", "outsider", {"app": "notebook"}),
             NetPod("slurmk8s-system", "operator", {"app.kubernetes.io/instance": "slurmk8s",
                                                    "app.kubernetes.io/component": "operator"}),
             NetPod("slurmk8s-system", "stranger", {"app.kubernetes.io/instance": "other",
                                                    "app.kubernetes.io/component": "operator"})]
    w = NetWorld(tmp_path_factory.mktemp("clusternet"), "cnet", "10.253.71.0/24",
                 {NS: {}, "slurmk8s-system": {}, "elsewhere": {}}, pods, PORTS)
    try:
        w.policy(NS, "default-deny", {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]})
        for pol in network_policies(objs):
            w.networking.create_namespaced_network_policy(NS, pol)
        yield w
    finally:
        w.close()


def test_under_default_deny_the_cluster_talks_and_no_one_else_reaches_slurmd_the_agent_or_mariadb(world):
    slurm = ("controller", "worker", "lent", "login", "restapi", "slurmdbd")
    slurmd = ("worker", "lent")
    outside = ("outsider", "operator", "stranger")  # in namespaces without policies
    srun = set(SRUN)
    want = set()

    def allow(sources, destination, ports):
        want.update((s, destination, p) for s in sources for p in ports if s != destination)

    # slurmctld from every Slurm pod; the agent from the release's operator alone.
    allow(set(slurm) - {"controller"}, "controller", {6817})
    allow({"operator"}, "controller", {6830})
    # slurmd from slurmd and login on every port (jobs' own traffic, a notebook through login);
    # from slurmctld on slurmd's and srun's.
    for d in slurmd:
        allow({*slurmd, "login"}, d, set(PORTS))
        allow({"controller"}, d, {6818} | srun)
    # login: SSH from anywhere (sshFrom is empty; the cluster's pods do not send it), srun's
    # ports from slurmctld and slurmd.
    allow(outside, "login", {22})
    allow({"controller", *slurmd}, "login", srun)
    # slurmrestd from anyone; slurmdbd from the Slurm pods; MariaDB from slurmdbd alone.
    allow(outside, "restapi", {6820})
    allow({"login", *slurmd}, "restapi", {6820})
    allow({"controller", *slurmd, "login", "restapi"}, "slurmdbd", {6819})
    allow({"slurmdbd"}, "database", {3306})
    # The cluster's pods send nothing else (egress is on); the pods of namespaces without
    # policies reach each other. Every pod reaches its node, as Kubernetes has it.
    allow({p.name for p in world.pods}, NODE, {world.node_port})
    for d in outside:
        allow(outside, d, set(PORTS))
    # The node reaches every pod (the kubelet's probes).
    want |= {(NODE, p.name, port) for p in world.pods for port in PORTS}
    world.converges(want)


def test_the_agent_port_admits_only_the_operator_and_the_bridge(example_doc, keys):
    cluster = load_cluster(doc(example_doc))
    pol = next(p for p in network_policies(render(cluster, keys, agent_clients=CLIENTS))
               if p["metadata"]["name"] == names.network_policy(cluster, "controller"))
    agent = [r for r in pol["spec"]["ingress"] if any(p["port"] == names.AGENT_PORT for p in r["ports"])]
    assert agent == [{
        "ports": [{"protocol": "TCP", "port": names.AGENT_PORT}],
        "from": [{
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "slurmk8s-system"}},
            "podSelector": {
                "matchLabels": {"app.kubernetes.io/instance": "slurmk8s"},
                "matchExpressions": [{"key": "app.kubernetes.io/component", "operator": "In",
                                      "values": ["bridge", "operator"]}],
            },
        }],
    }]
    # Without knowing the release, any pod reaches the agent (which asks for the token).
    pol = next(p for p in network_policies(render(cluster, keys))
               if p["metadata"]["name"] == names.network_policy(cluster, "controller"))
    assert {"ports": [{"protocol": "TCP", "port": names.AGENT_PORT}]} in pol["spec"]["ingress"]


def test_every_port_a_pod_serves_is_admitted_by_its_policy(example_doc, keys):
    cluster = load_cluster(doc(example_doc))
    objs = render(cluster, keys, agent_clients=CLIENTS)
    policies = network_policies(objs)
    for labels, containers in [(o["spec"]["template"]["metadata"]["labels"], o["spec"]["template"]["spec"]["containers"])
                               for o in objs if o["kind"] in ("StatefulSet", "Deployment")]:
        [pol] = [p for p in policies if all(
            labels.get(k) == v for k, v in p["spec"]["podSelector"]["matchLabels"].items())
            and labels["app.kubernetes.io/component"] in p["spec"]["podSelector"]["matchExpressions"][0]["values"]]
        open_ports = {p["port"] for r in pol["spec"]["ingress"] for p in r.get("ports", [])}
        everything = any("ports" not in r for r in pol["spec"]["ingress"])
        served = {p["containerPort"] for c in containers for p in c.get("ports", [])}
        assert everything or served <= open_ports, (labels["app.kubernetes.io/component"], served - open_ports)
        assert "Egress" not in pol["spec"]["policyTypes"]  # egress only when asked


def test_ssh_from_narrows_who_reaches_login_and_policies_can_be_turned_off(example_doc, keys):
    cluster = load_cluster(doc(example_doc, sshFrom=["192.0.2.0/24"]))
    pol = next(p for p in network_policies(render(cluster, keys))
               if p["metadata"]["name"] == names.network_policy(cluster, "login"))
    assert {"ports": [{"protocol": "TCP", "port": names.SSH_PORT}], "from": [{"ipBlock": {"cidr": "192.0.2.0/24"}}]} \
        in pol["spec"]["ingress"]
    assert network_policies(render(load_cluster(doc(example_doc, policies=False)), keys)) == []


def test_the_slurm_metrics_are_admitted_from_the_scrapers_namespaces_and_not_served_when_off(example_doc, keys):
    def controller(d):
        cluster = load_cluster(d)
        objs = render(cluster, keys, agent_clients=CLIENTS)
        [pol] = [p for p in network_policies(objs) if p["metadata"]["name"] == names.network_policy(cluster, "controller")]
        [sts] = [o for o in objs if o["kind"] == "StatefulSet" and o["metadata"]["name"] == names.controller(cluster)]
        [agent] = [c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == "agent"]
        rules = [r for r in pol["spec"]["ingress"] if any(p["port"] == names.METRICS_PORT for p in r["ports"])]
        return rules, agent
    d = doc(example_doc)
    d["spec"]["metrics"] = {"scrapeFrom": ["monitoring", "team-a"]}
    rules, agent = controller(d)
    assert rules == [{"ports": [{"protocol": "TCP", "port": names.METRICS_PORT}], "from": [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}, "podSelector": {}}
        for ns in ("monitoring", "team-a")]}]
    assert {"name": "metrics", "containerPort": names.METRICS_PORT} in agent["ports"]
    assert agent["args"][agent["args"].index("--metrics-listen") + 1] == f"0.0.0.0:{names.METRICS_PORT}"
    d["spec"]["metrics"] = {}  # no namespace named: the pods of the cluster's own namespace, no other
    rules, _ = controller(d)
    assert [r["from"] for r in rules] == [[{"podSelector": {}}]]
    d["spec"]["metrics"] = {"enabled": False}
    rules, agent = controller(d)
    assert rules == [] and agent["args"][agent["args"].index("--metrics-listen") + 1] == "off"
    assert all(p["name"] != "metrics" for p in agent["ports"])


def test_the_operator_may_apply_network_policies():
    assert "NetworkPolicy" in MANAGED_KINDS and RESOURCES["NetworkPolicy"].api_version == "networking.k8s.io/v1"
    verbs = {p.verb for p in OPERATOR if p.resource == "networkpolicies" and p.group == "networking.k8s.io"}
    assert verbs == {"list", "create", "patch", "delete"}


def test_the_operator_command_takes_the_release_it_runs_in():
    params = cli.operator_cmd.make_context("operator", [
        "--namespace", "hpc", "--release-namespace", "slurmk8s-system", "--release-name", "slurmk8s"]).params
    assert (params["release_namespace"], params["release_name"]) == ("slurmk8s-system", "slurmk8s")
