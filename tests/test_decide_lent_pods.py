"""Lent nodes beside the cluster's own pods, and a lent pod that Kubernetes wants gone
(issue 44, item 4; decision record 49): a node that runs the SlurmCluster's own pods is
not lent to it."""

from __future__ import annotations

from datetime import timedelta

import pytest

from slurmk8s.api import load_cluster
from slurmk8s.bridge import actions as A
from slurmk8s.bridge.nodestate import IDLE_SINCE_ANNOTATION, format_time
from slurmk8s.bridge.observed import KubePod, pod_from_api
from slurmk8s.render import ClusterKeys, render

from .lending_sim import T0, World, gpu_node, policy

POLICY = policy(idleAfterSeconds=0)
IDLE = {IDLE_SINCE_ANNOTATION: format_time(T0 - timedelta(seconds=600))}


def rendered_pods(namespace: str = "hpc", name: str = "demo") -> dict[str, dict]:
    """The pod templates the operator renders for a SlurmCluster, by component: what its own pods carry."""
    c = load_cluster({"apiVersion": "slurmk8s.dev/v1alpha1", "kind": "SlurmCluster",
                      "metadata": {"name": name, "namespace": namespace},
                      "spec": {"nodeSets": [{"name": "cpu", "replicas": 1}],
                               "partitions": [{"name": "cpu", "nodeSets": ["cpu"]},
                                              {"name": "gpu", "acceptLentNodes": True}],
                               "login": {"replicas": 1}}})
    out = {}
    for obj in render(c, ClusterKeys.generate()):
        if obj["kind"] in ("StatefulSet", "Deployment"):
            template = obj["spec"]["template"]
            out[template["metadata"]["labels"]["app.kubernetes.io/component"]] = template
    return out


def own_pod(component: str, node: str | None, namespace: str = "hpc", cluster_name: str = "demo",
            phase: str = "Running") -> KubePod:
    """A pod of the SlurmCluster as the operator renders it (its template's labels and spec), bound to ``node``."""
    template = rendered_pods(namespace, cluster_name)[component]
    return pod_from_api({"metadata": {"name": f"{cluster_name}-{component}-0", "namespace": namespace,
                                      "labels": template["metadata"]["labels"]},
                         "spec": {**template["spec"], "nodeName": node}, "status": {"phase": phase}})


def lent_now(w: World) -> list[str]:
    return [a.node for a in w.decide(POLICY, T0) if isinstance(a, A.SetLendingState) and a.state == "lending"]


def blocked(w: World) -> str:
    acts = w.decide(POLICY, T0)
    status = next(a for a in acts if isinstance(a, A.PolicyStatus)).status
    return next(c for c in status.conditions if c.type == "Ready").message


# -- a node that runs the cluster's own pods is not lent to it ------------------------------------


@pytest.mark.parametrize("component", ["controller", "worker", "login"])
def test_a_node_that_runs_a_pod_of_the_policys_cluster_is_not_lent_and_says_why(component):
    w = World.of(nodes=[gpu_node("n1", annotations=IDLE), gpu_node("n2", annotations=IDLE)],
                 pods=[own_pod(component, "n1")])
    assert lent_now(w) == ["n2"]
    assert "n1 (runs 1 pod(s) of SlurmCluster hpc/demo" in blocked(w)
    # Once that pod is gone (or ended), the node is lent.
    w.pods = {k: p for k, p in w.pods.items() if p.node != "n1"}
    assert lent_now(w) == ["n1", "n2"]
    w.pods[("hpc", "done")] = own_pod(component, "n1", phase="Succeeded")
    assert lent_now(w) == ["n1", "n2"]


@pytest.mark.parametrize("where", [
    {"namespace": "other-ns"},         # a cluster of the same name in another namespace
    {"cluster_name": "other"},         # another cluster in the policy's namespace
])
def test_another_clusters_pods_are_ordinary_pods_to_this_one(where):
    w = World.of(nodes=[gpu_node("n1", annotations=IDLE)], pods=[own_pod("worker", "n1", **where)])
    assert lent_now(w) == ["n1"]


def test_an_unscheduled_pod_of_the_cluster_keeps_no_node_from_being_lent():
    w = World.of(nodes=[gpu_node("n1", annotations=IDLE)], pods=[own_pod("worker", None, phase="Pending")])
    assert lent_now(w) == ["n1"]


def test_a_node_lent_before_the_clusters_pod_came_stays_lent():
    """Only lending looks at the rule: a worker that lands on a lent node (it tolerates the
    taint, or the scheduler placed it as the node was lent) leaves the node lent."""
    w = World.of(nodes=[gpu_node("n1", annotations=IDLE)])
    w.apply(w.decide(POLICY, T0))
    w.step()
    w.apply(w.decide(POLICY, T0 + timedelta(seconds=10)))
    assert w.nodes["n1"].record.state == "lent"
    w.pods[("hpc", "demo-cpu-0")] = own_pod("worker", "n1")
    acts = w.decide(POLICY, T0 + timedelta(seconds=20))
    assert not [a for a in acts if isinstance(a, A.SetLendingState)], acts
