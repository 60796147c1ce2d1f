"""StatefulSets, Deployments, graceful pod deletion, Endpoints and evictions,
with the test acting as the kubelet (it writes pod status through the API)."""

from __future__ import annotations

import json

import pytest
from kubernetes import watch
from kubernetes.client.rest import ApiException

from .conftest import Cluster, wait_for


@pytest.fixture(scope="module", autouse=True)
def nodes(cluster: Cluster) -> None:
    for i in range(2):
        cluster.node(f"worker-{i}", cpu="8", memory="32Gi")


def pods(cluster: Cluster, ns: str, selector: str = "") -> dict:
    return {p.metadata.name: p for p in cluster.core.list_namespaced_pod(ns, label_selector=selector).items}


def kubelet_runs_everything(cluster: Cluster, ns: str) -> None:
    """Report every scheduled, not yet running pod as Running and Ready."""
    for p in cluster.core.list_namespaced_pod(ns).items:
        if p.spec.node_name and p.status.phase == "Pending" and not p.metadata.deletion_timestamp:
            cluster.report_running(ns, p.metadata.name)


def deleted_names(cluster: Cluster, ns: str, since_rv: str, count: int) -> list[str]:
    out = []
    w = watch.Watch()
    for ev in w.stream(cluster.core.list_namespaced_pod, ns, resource_version=since_rv, timeout_seconds=20):
        if ev["type"] == "DELETED":
            out.append(ev["object"].metadata.name)
            if len(out) == count:
                w.stop()
    return out


def statefulset(name: str, replicas: int, policy: str = "OrderedReady", image: str = "slurmd:1", **spec) -> dict:
    return {"metadata": {"name": name}, "spec": {
        "replicas": replicas, "serviceName": name, "podManagementPolicy": policy,
        "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "main", "image": image}]}},
        "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {
            "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}],
        **spec}}


def test_statefulset_ordered_ready_scale_and_rolling_update(cluster: Cluster, ns: str) -> None:
    cluster.core.create_namespaced_service(ns, {"metadata": {"name": "db"}, "spec": {
        "clusterIP": "None", "selector": {"app": "db"}, "ports": [{"port": 5432}]}})
    cluster.apps.create_namespaced_stateful_set(ns, statefulset("db", 2))

    first = wait_for("db-0 to be created and scheduled", lambda: (p := pods(cluster, ns).get("db-0")) and p.spec.node_name and p)
    assert first.spec.hostname == "db-0" and first.spec.subdomain == "db"
    assert first.metadata.labels["statefulset.kubernetes.io/pod-name"] == "db-0"
    assert first.metadata.labels["app"] == "db"
    ref = first.metadata.owner_references[0]
    assert (ref.kind, ref.name, ref.controller) == ("StatefulSet", "db", True)
    assert [v.persistent_volume_claim.claim_name for v in first.spec.volumes if v.name == "data"] == ["data-db-0"]
    pvc = wait_for("data-db-0 to be bound", lambda: (c := cluster.core.read_namespaced_persistent_volume_claim("data-db-0", ns)).status.phase == "Bound" and c)
    assert pvc.status.capacity == {"storage": "1Gi"}
    assert sorted(pods(cluster, ns)) == ["db-0"]  # OrderedReady: db-1 waits for db-0 to be Ready

    cluster.report_running(ns, "db-0", ip="10.1.0.10")
    wait_for("db-1 after db-0 is ready", lambda: "db-1" in pods(cluster, ns) and pods(cluster, ns)["db-1"].spec.node_name)
    cluster.report_running(ns, "db-1", ip="10.1.0.11")
    st = wait_for("status to count two ready replicas", lambda: (s := cluster.apps.read_namespaced_stateful_set_status("db", ns)).status.ready_replicas == 2 and s)
    assert st.status.replicas == 2 and st.status.observed_generation == st.metadata.generation
    assert st.status.current_revision == st.status.update_revision

    ep = wait_for("the headless service's endpoints", lambda: (e := cluster.core.read_namespaced_endpoints("db", ns)).subsets and len(e.subsets[0].addresses or []) == 2 and e)
    assert sorted((a.hostname, a.ip) for a in ep.subsets[0].addresses) == [("db-0", "10.1.0.10"), ("db-1", "10.1.0.11")]

    cluster.apps.patch_namespaced_stateful_set_scale("db", ns, {"spec": {"replicas": 3}})
    wait_for("db-2", lambda: "db-2" in pods(cluster, ns) and pods(cluster, ns)["db-2"].spec.node_name)
    cluster.report_running(ns, "db-2")
    wait_for("three ready", lambda: cluster.apps.read_namespaced_stateful_set("db", ns).status.ready_replicas == 3)

    rv = cluster.core.list_namespaced_pod(ns).metadata.resource_version
    cluster.apps.patch_namespaced_stateful_set_scale("db", ns, {"spec": {"replicas": 1}})
    assert deleted_names(cluster, ns, rv, 2) == ["db-2", "db-1"]  # highest ordinal first
    assert sorted(pods(cluster, ns)) == ["db-0"]
    claims = sorted(c.metadata.name for c in cluster.core.list_namespaced_persistent_volume_claim(ns).items)
    assert claims == ["data-db-0", "data-db-1", "data-db-2"]  # Retain: claims outlive scale-down

    cluster.apps.patch_namespaced_stateful_set_scale("db", ns, {"spec": {"replicas": 2}})
    wait_for("db-1 again", lambda: "db-1" in pods(cluster, ns) and pods(cluster, ns)["db-1"].spec.node_name)
    cluster.report_running(ns, "db-1")
    before = wait_for("two ready again", lambda: (s := cluster.apps.read_namespaced_stateful_set("db", ns)).status.ready_replicas == 2 and s)

    rv = cluster.core.list_namespaced_pod(ns).metadata.resource_version
    cluster.apps.patch_namespaced_stateful_set("db", ns, {"spec": {"template": {"spec": {"containers": [{"name": "main", "image": "slurmd:2"}]}}}})
    order = []
    for _ in range(2):
        order += deleted_names(cluster, ns, rv, 1)
        rv = cluster.core.list_namespaced_pod(ns).metadata.resource_version
        recreated = order[-1]
        wait_for(f"{recreated} to come back", lambda: recreated in pods(cluster, ns) and pods(cluster, ns)[recreated].spec.node_name)  # noqa: B023 - called within this iteration
        assert pods(cluster, ns)[recreated].spec.containers[0].image == "slurmd:2"
        cluster.report_running(ns, recreated)
    assert order == ["db-1", "db-0"]  # one at a time, from the highest ordinal
    after = wait_for("the update to complete", lambda: (s := cluster.apps.read_namespaced_stateful_set("db", ns)).status.current_revision == s.status.update_revision and s.status.updated_replicas == 2 and s)
    assert after.status.update_revision != before.status.update_revision
    assert {p.metadata.labels["controller-revision-hash"] for p in pods(cluster, ns).values()} == {after.status.update_revision}

    cluster.apps.delete_namespaced_stateful_set("db", ns)
    wait_for("the pods to be collected", lambda: not pods(cluster, ns))
    assert len(cluster.core.list_namespaced_persistent_volume_claim(ns).items) == 3


def test_statefulset_parallel_with_claims_deleted_on_scale_down(cluster: Cluster, ns: str) -> None:
    cluster.apps.create_namespaced_stateful_set(ns, statefulset(
        "w", 3, "Parallel", persistentVolumeClaimRetentionPolicy={"whenScaled": "Delete", "whenDeleted": "Delete"}))
    wait_for("three pods at once", lambda: sorted(pods(cluster, ns)) == ["w-0", "w-1", "w-2"])
    cluster.apps.patch_namespaced_stateful_set("w", ns, {"spec": {"replicas": 1}})
    wait_for("scale-down to w-0", lambda: sorted(pods(cluster, ns)) == ["w-0"])
    wait_for("the condemned claims to go", lambda: sorted(c.metadata.name for c in cluster.core.list_namespaced_persistent_volume_claim(ns).items) == ["data-w-0"])
    cluster.apps.delete_namespaced_stateful_set("w", ns)
    wait_for("whenDeleted: Delete to remove the last claim", lambda: not cluster.core.list_namespaced_persistent_volume_claim(ns).items)


def test_statefulset_on_delete_updates_only_deleted_pods(cluster: Cluster, ns: str) -> None:
    cluster.apps.create_namespaced_stateful_set(ns, statefulset("od", 1, updateStrategy={"type": "OnDelete"}))
    wait_for("od-0", lambda: "od-0" in pods(cluster, ns))
    cluster.report_running(ns, "od-0")
    cluster.apps.patch_namespaced_stateful_set("od", ns, {"spec": {"template": {"spec": {"containers": [{"name": "main", "image": "slurmd:2"}]}}}})
    wait_for("the new revision to be observed", lambda: cluster.apps.read_namespaced_stateful_set("od", ns).status.observed_generation == 2)
    assert pods(cluster, ns)["od-0"].spec.containers[0].image == "slurmd:1"
    old_uid = pods(cluster, ns)["od-0"].metadata.uid
    cluster.core.delete_namespaced_pod("od-0", ns)
    new = wait_for("od-0 recreated", lambda: (p := pods(cluster, ns).get("od-0")) and p.metadata.uid != old_uid and p)
    assert new.spec.containers[0].image == "slurmd:2"


def deployment(name: str, replicas: int, image: str) -> dict:
    return {"metadata": {"name": name}, "spec": {
        "replicas": replicas, "selector": {"matchLabels": {"app": name}},
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
        "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "web", "image": image}]}}}}


def test_deployment_through_replicasets(cluster: Cluster, ns: str) -> None:
    cluster.apps.create_namespaced_deployment(ns, deployment("web", 2, "web:1"))
    rs = wait_for("a ReplicaSet", lambda: cluster.apps.list_namespaced_replica_set(ns).items)
    assert len(rs) == 1
    first = rs[0]
    pod_hash = first.metadata.labels["pod-template-hash"]
    assert first.metadata.name == f"web-{pod_hash}" and first.spec.selector.match_labels == {"app": "web", "pod-template-hash": pod_hash}
    assert first.metadata.owner_references[0].kind == "Deployment"
    created = wait_for("two pods", lambda: len(pods(cluster, ns)) == 2 and pods(cluster, ns))
    assert all(n.startswith(f"web-{pod_hash}-") and len(n) == len(f"web-{pod_hash}-") + 5 for n in created)
    wait_for("the pods to be scheduled", lambda: all(p.spec.node_name for p in pods(cluster, ns).values()))
    kubelet_runs_everything(cluster, ns)
    d = wait_for("the deployment to be available", lambda: (x := cluster.apps.read_namespaced_deployment("web", ns)).status.available_replicas == 2 and x)
    assert {c.type: c.reason for c in d.status.conditions} == {"Available": "MinimumReplicasAvailable", "Progressing": "NewReplicaSetAvailable"}
    cluster.kubectl("rollout", "status", "-n", ns, "deployment/web", "--timeout=20s")

    cluster.apps.patch_namespaced_deployment("web", ns, {"spec": {"template": {"spec": {"containers": [{"name": "web", "image": "web:2"}]}}}})

    def rolled() -> bool:
        kubelet_runs_everything(cluster, ns)
        sets = {r.metadata.name: r for r in cluster.apps.list_namespaced_replica_set(ns).items}
        live = [p for p in pods(cluster, ns).values() if not p.metadata.deletion_timestamp]
        return (len(sets) == 2 and sets[first.metadata.name].spec.replicas == 0 and len(live) == 2
                and all(p.spec.containers[0].image == "web:2" and p.status.phase == "Running" for p in live))

    wait_for("the rolling update", rolled)
    d = wait_for("status after the update", lambda: (x := cluster.apps.read_namespaced_deployment("web", ns)).status.updated_replicas == 2 and x.status.available_replicas == 2 and x)
    assert d.metadata.annotations["deployment.kubernetes.io/revision"] == "2"
    cluster.apps.patch_namespaced_deployment_scale("web", ns, {"spec": {"replicas": 3}})
    wait_for("a third pod", lambda: len(pods(cluster, ns)) == 3)
    cluster.apps.delete_namespaced_deployment("web", ns)
    wait_for("ReplicaSets and pods to be collected", lambda: not pods(cluster, ns) and not cluster.apps.list_namespaced_replica_set(ns).items)


def test_graceful_deletion_waits_for_the_kubelet(cluster: Cluster, ns: str) -> None:
    # tainted, so that only this test's pod lands on the one node with a (pretend) kubelet
    cluster.node("ready-node", ready=True, labels={"kind": "ready"}, taints=[{"key": "kubelet", "value": "yes", "effect": "NoSchedule"}])
    cluster.pod(ns, "graceful", nodeSelector={"kind": "ready"}, terminationGracePeriodSeconds=30,
                tolerations=[{"key": "kubelet", "operator": "Exists", "effect": "NoSchedule"}])
    wait_for("scheduling", lambda: cluster.core.read_namespaced_pod("graceful", ns).spec.node_name == "ready-node")
    cluster.report_running(ns, "graceful")
    cluster.core.delete_namespaced_pod("graceful", ns)
    terminating = cluster.core.read_namespaced_pod("graceful", ns)
    assert terminating.metadata.deletion_timestamp and terminating.metadata.deletion_grace_period_seconds == 30
    cluster.core.delete_namespaced_pod("graceful", ns, grace_period_seconds=0)  # the kubelet, once the processes stopped
    with pytest.raises(ApiException) as e:
        cluster.core.read_namespaced_pod("graceful", ns)
    assert e.value.status == 404


def test_eviction_respects_the_disruption_budget(cluster: Cluster, ns: str) -> None:
    cluster.policy.create_namespaced_pod_disruption_budget(ns, {"metadata": {"name": "busy"}, "spec": {
        "minAvailable": 1, "selector": {"matchLabels": {"role": "busy"}}}})
    for name in ("b1", "b2"):  # on nodes without a kubelet: an evicted pod goes at once
        cluster.pod(ns, name, labels={"role": "busy"}, nodeSelector={"kubernetes.io/hostname": "worker-0"})
    wait_for("scheduling", lambda: all(p.spec.node_name for p in pods(cluster, ns).values()))
    kubelet_runs_everything(cluster, ns)
    wait_for("one disruption allowed", lambda: cluster.policy.read_namespaced_pod_disruption_budget("busy", ns).status.disruptions_allowed == 1)
    cluster.core.create_namespaced_pod_eviction("b1", ns, {"metadata": {"name": "b1", "namespace": ns}})
    wait_for("b1 to go", lambda: "b1" not in pods(cluster, ns))
    wait_for("no disruption allowed", lambda: cluster.policy.read_namespaced_pod_disruption_budget("busy", ns).status.disruptions_allowed == 0)
    with pytest.raises(ApiException) as e:
        cluster.core.create_namespaced_pod_eviction("b2", ns, {"metadata": {"name": "b2", "namespace": ns}})
    assert e.value.status == 429
    assert "disruption budget busy needs 1 healthy pods and has 1 currently" in json.loads(e.value.body)["details"]["causes"][0]["message"]


def test_kubectl_drain_is_refused_while_the_budget_allows_no_disruption_and_evicts_once_it_is_gone(
        cluster: Cluster, ns: str) -> None:
    """As a lent slurmd pod is guarded while Slurm runs jobs there: one pod, a budget of
    maxUnavailable 0. kubectl drain's evictions get 429 (it retries until its timeout);
    with the budget deleted, the next drain evicts the pod."""
    node = f"drained-{ns}"
    cluster.node(node, cpu="8", memory="32Gi")
    cluster.policy.create_namespaced_pod_disruption_budget(ns, {"metadata": {"name": "guard"}, "spec": {
        "maxUnavailable": 0, "selector": {"matchLabels": {"role": "guarded"}}}})
    cluster.pod(ns, "guarded", labels={"role": "guarded"}, nodeSelector={"kubernetes.io/hostname": node})
    wait_for("scheduling", lambda: pods(cluster, ns)["guarded"].spec.node_name == node)
    cluster.report_running(ns, "guarded")
    wait_for("the budget seen by its controller", lambda: (s := cluster.policy.read_namespaced_pod_disruption_budget(
        "guard", ns).status).observed_generation == 1 and s.expected_pods == 1 and s.current_healthy == 1)
    drain = cluster.kubectl("drain", node, "--force", "--timeout=3s", check=False)
    assert drain.returncode != 0
    assert "Cannot evict pod as it would violate the pod's disruption budget" in drain.stdout + drain.stderr
    assert "guarded" in pods(cluster, ns)
    assert cluster.core.read_node(node).spec.unschedulable  # cordoned all the same
    cluster.policy.delete_namespaced_pod_disruption_budget("guard", ns)
    cluster.kubectl("drain", node, "--force", "--timeout=20s")
    assert "guarded" not in pods(cluster, ns)
