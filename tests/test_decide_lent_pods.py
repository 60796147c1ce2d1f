"""Lent nodes beside the cluster's own pods, and a lent pod that Kubernetes wants gone
(issue 44, item 4; decision record 49): a node that runs the SlurmCluster's own pods is
not lent to it; a lent pod has a disruption budget while Slurm runs jobs on its node, so
that `kubectl drain` takes the graceful reclaim; a lent pod being deleted is taken back
gracefully, within a termination grace that covers the policy's grace and KillWait."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from slurmk8s.api import load_cluster
from slurmk8s.bridge import actions as A
from slurmk8s.bridge.nodestate import IDLE_SINCE_ANNOTATION, format_time
from slurmk8s.bridge.observed import KubePod, pod_from_api
from slurmk8s.render import ClusterKeys, names, render
from slurmk8s.render.manifests import lent_budget, lent_slurmd_pod
from slurmk8s.render.names import lent_slurmd
from slurmk8s.render.slurmd import termination_grace

from .lending_sim import T0, World, cluster, gpu_node, job, policy
from .test_decide import kinds, of, only

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


# -- the lent pod's disruption budget, while Slurm runs jobs there ---------------------------------


def lend(w: World, node: str = "n1", t=T0) -> World:
    """``node`` lent through the bridge's own rounds (its pod as the renderer makes it); the budgets observed."""
    w.budgets = {} if w.budgets is None else w.budgets
    w.nodes.setdefault(node, gpu_node(node, annotations=IDLE))
    for k in range(3):
        w.apply(w.decide(POLICY, t + timedelta(seconds=k)))
        w.step()
    assert w.nodes[node].record.state == "lent", w.summary()
    return w


def lent_pod(w: World, node: str = "n1") -> KubePod:
    return w.pods[("hpc", lent_slurmd("demo", node))]


def budget_of(node: str = "n1") -> tuple[str, str]:
    return "hpc", names.lent_budget("demo", node)


def test_a_lent_node_running_a_job_gets_a_budget_on_its_pod_and_loses_it_when_the_job_is_gone():
    w = lend(World.of())
    assert w.budgets == {}  # idle: a drain takes it at once
    w.jobs[1] = job(1, "n1")
    w.pods[("hpc", lent_slurmd("demo", "n1"))] = replace(lent_pod(w), uid="pod-uid")
    acts = w.decide(POLICY, T0 + timedelta(seconds=10))
    assert of(acts, A.CreateBudget) == [A.CreateBudget("hpc/demo", "n1", "pod-uid")]
    # The budget as the loop has it rendered: the pod's name, owned by it, guarding that pod only.
    obj = lent_budget(cluster(), "", node="n1", pod_uid="pod-uid")
    assert (obj["metadata"]["namespace"], obj["metadata"]["name"]) == budget_of()
    assert obj["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Pod", "name": lent_pod(w).name,
                                                   "uid": "pod-uid"}]
    assert obj["spec"]["maxUnavailable"] == 0
    assert obj["spec"]["selector"]["matchLabels"].items() <= lent_pod(w).labels.items()
    other = own_pod("worker", "n1")  # no other pod of the cluster is guarded by it
    assert not obj["spec"]["selector"]["matchLabels"].items() <= other.labels.items()
    w.apply(acts)
    assert budget_of() in w.budgets
    assert [a for a in w.decide(POLICY, T0 + timedelta(seconds=11)) if isinstance(a, (A.CreateBudget, A.DeleteBudget))] == []
    del w.jobs[1]  # it ended
    acts = w.decide(POLICY, T0 + timedelta(seconds=12))
    assert of(acts, A.DeleteBudget) == [A.DeleteBudget(*budget_of(), "n1")]


def test_the_budget_waits_when_slurm_or_the_budgets_cannot_be_read():
    w = lend(World.of())
    w.jobs[1] = job(1, "n1")
    w.slurm_known = False
    assert not of(w.decide(POLICY, T0 + timedelta(seconds=10)), A.CreateBudget)
    w.slurm_known, w.budgets = True, None
    assert not of(w.decide(POLICY, T0 + timedelta(seconds=10)), A.CreateBudget)
    w.budgets = {budget_of(): ("hpc", lent_pod(w).name)}
    del w.jobs[1]
    w.slurm_known = False
    assert not of(w.decide(POLICY, T0 + timedelta(seconds=10)), A.DeleteBudget)


def test_a_pod_lent_without_the_node_label_gets_no_budget_no_budget_could_select_it():
    w = lend(World.of())
    pod = lent_pod(w)
    w.pods[("hpc", pod.name)] = replace(pod, labels={k: v for k, v in pod.labels.items() if k != names.LENT_NODE_LABEL})
    w.jobs[1] = job(1, "n1")
    assert not of(w.decide(POLICY, T0 + timedelta(seconds=10)), A.CreateBudget)


def test_kubectl_drain_of_a_busy_lent_node_is_a_graceful_reclaim_behind_the_budget():
    """The drain cordons the node; its eviction is refused while the budget stands. The
    bridge takes the node back gracefully (drain, signal, grace, requeue) and keeps the
    budget while the job is there; with the job gone it hands the node back, deleting
    the pod (which the drain then finds going) and its budget."""
    w = lend(World.of())
    w.jobs[1] = job(1, "n1")
    w.apply(w.decide(POLICY, T0 + timedelta(seconds=10)))
    assert budget_of() in w.budgets
    w.nodes["n1"] = replace(w.nodes["n1"], unschedulable=True)  # kubectl drain's cordon
    t = T0 + timedelta(seconds=20)
    acts = w.decide(POLICY, t)
    assert only(acts, A.SetLendingState).reason == "cordoned"
    assert of(acts, A.Signal) and not of(acts, A.SetDown) and not of(acts, A.DeleteBudget)
    w.apply(acts)
    # The grace period: the budget stays; then the job is requeued, ends, and the node goes back.
    assert not of(w.decide(POLICY, t + timedelta(seconds=30)), A.DeleteBudget)
    grace = POLICY.spec.reclaim.grace_period_seconds
    w.apply(w.decide(POLICY, t + timedelta(seconds=grace)))
    assert ("requeue", 1, "n1") in w.log and budget_of() in w.budgets
    w.step()  # the job leaves the node
    acts = w.decide(POLICY, t + timedelta(seconds=grace + 1))
    assert kinds(acts)[-5:] == ["DeleteNode", "DeleteSlurmdPod", "Untaint", "ClearLending", "DeleteBudget"]
    w.apply(acts)
    assert w.nodes["n1"].record.state is None and not w.budgets
    assert ("node-fail", 1, "n1") not in w.log


# -- a lent pod someone deletes ------------------------------------------------------------------


def test_a_lent_pod_being_deleted_is_taken_back_gracefully_within_its_termination_grace():
    """An eviction the budget let through (no job was seen yet) or a kubectl delete:
    the pod drains its Slurm node and waits; the bridge signals the jobs and gives them
    the policy's grace, never DOWN while the pod still runs."""
    w = lend(World.of())
    w.jobs[1] = job(1, "n1")
    pod = lent_pod(w)
    w.pods[("hpc", pod.name)] = replace(pod, deleting=True)
    acts = w.decide(POLICY, T0 + timedelta(seconds=10))
    assert only(acts, A.SetLendingState).reason == "pod-deleted"
    assert of(acts, A.Signal) and not of(acts, A.SetDown) and not of(acts, A.DeleteSlurmdPod)
    reclaiming = [e for e in of(acts, A.Event) if e.reason == "Reclaiming"]
    assert reclaiming and reclaiming[0].type == "Normal" and "SIGUSR1" in reclaiming[0].message


def test_a_pod_that_goes_before_its_jobs_leave_sets_the_node_down():
    """Past its termination grace (or deleted at once), nothing answers for the jobs:
    the node is set DOWN, which ends and requeues them now."""
    w = lend(World.of())
    w.jobs[1] = job(1, "n1")
    pod = lent_pod(w)
    w.pods[("hpc", pod.name)] = replace(pod, deleting=True)
    w.apply(w.decide(POLICY, T0 + timedelta(seconds=10)))
    assert not of(w.decide(POLICY, T0 + timedelta(seconds=11)), A.SetDown)  # the pod still runs: wait
    del w.pods[("hpc", pod.name)]
    acts = w.decide(POLICY, T0 + timedelta(seconds=12))
    assert of(acts, A.SetDown) == [A.SetDown("n1", "reclaimed by Kubernetes (pod-deleted)")]


def test_the_lent_pod_waits_out_the_policys_grace_and_slurms_kill_wait_before_it_is_killed():
    c = cluster()
    for grace in (0, 10, 300):
        pod = lent_slurmd_pod(c, "", node="n1", resources={"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "4"},
                              labels={}, partition="gpu", shm_size="1Gi", taint_key="t", grace_seconds=grace)
        env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"] if "value" in e}
        # The entrypoint waits its drain timeout + 30 s for the bridge, then KillWait + 10 s: all within the grace.
        assert env["SLURMK8S_DRAIN_TIMEOUT"] == str(grace)
        assert pod["spec"]["terminationGracePeriodSeconds"] == termination_grace(c, grace)
        assert termination_grace(c, grace) >= grace + 30 + c.spec.slurm_config.kill_wait + 10
    # The cluster's own workers wait by the same rule, with their node set's drain grace.
    worker = next(o for o in render(load_cluster({
        "apiVersion": "slurmk8s.dev/v1alpha1", "kind": "SlurmCluster", "metadata": {"name": "demo", "namespace": "hpc"},
        "spec": {"nodeSets": [{"name": "cpu", "replicas": 1, "drain": {"gracePeriod": 42}}],
                 "partitions": [{"name": "cpu", "nodeSets": ["cpu"]}]}}), ClusterKeys.generate())
        if o["kind"] == "StatefulSet" and o["metadata"]["name"] == "demo-cpu")
    assert worker["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == termination_grace(c, 42)
