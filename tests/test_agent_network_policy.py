"""Only the operator and the bridge reach the Slurm agent's port (issue 13,
item 6): the renderer's NetworkPolicy, the operator that learns the release
namespace from the chart, and the RBAC and API that let it apply one."""

from __future__ import annotations

import pytest

from slurmk8s import cli
from slurmk8s.api import load_cluster
from slurmk8s.kube import RESOURCES
from slurmk8s.operator.permissions import OPERATOR
from slurmk8s.operator.plan import MANAGED_KINDS
from slurmk8s.render import names, render
from slurmk8s.render.manifests import AgentClients

CLIENTS = AgentClients(namespace="slurmk8s-system", release="slurmk8s")


@pytest.fixture
def cluster(example_doc):
    return load_cluster(example_doc)


def network_policies(objs):
    return [o for o in objs if o["kind"] == "NetworkPolicy"]


def test_the_agent_port_admits_only_the_operator_and_the_bridge(cluster, keys):
    objs = render(cluster, keys, agent_clients=CLIENTS)
    [pol] = network_policies(objs)
    assert pol["apiVersion"] == "networking.k8s.io/v1"
    assert pol["metadata"]["namespace"] == cluster.namespace
    spec = pol["spec"]
    assert spec["podSelector"] == {"matchLabels": names.selector(cluster, "controller")}
    assert spec["policyTypes"] == ["Ingress"]
    agent = [r for r in spec["ingress"] if any(p["port"] == names.AGENT_PORT for p in r["ports"])]
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
    # Every other port of the controller pod stays open to the cluster's
    # pods (slurmd, login, lent slurmd pods reach slurmctld); nothing else
    # names the agent port.
    sts = next(o for o in objs if o["kind"] == "StatefulSet" and o["metadata"]["name"] == names.controller(cluster))
    ports = {p["containerPort"] for c in sts["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])}
    others = [r for r in spec["ingress"] if r not in agent]
    assert {p["port"] for r in others for p in r["ports"]} == ports - {names.AGENT_PORT}
    assert all("from" not in r for r in others)


def test_without_knowing_the_clients_no_policy_is_rendered(cluster, keys):
    assert network_policies(render(cluster, keys)) == []


def test_the_operator_may_apply_network_policies():
    assert "NetworkPolicy" in MANAGED_KINDS and RESOURCES["NetworkPolicy"].api_version == "networking.k8s.io/v1"
    verbs = {p.verb for p in OPERATOR if p.resource == "networkpolicies" and p.group == "networking.k8s.io"}
    assert verbs == {"list", "create", "patch", "delete"}


def test_the_operator_command_takes_the_release_it_runs_in():
    params = cli.operator_cmd.make_context("operator", [
        "--namespace", "hpc", "--release-namespace", "slurmk8s-system", "--release-name", "slurmk8s"]).params
    assert (params["release_namespace"], params["release_name"]) == ("slurmk8s-system", "slurmk8s")
