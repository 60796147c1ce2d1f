"""LimitRange and ResourceQuota in the stand-in: a LimitRange stored with
Kubernetes' defaults, its defaults filled into pods and its bounds refused;
a quota refusing a pod that does not say what it limits or has no room, its
status.used kept, and a ReplicaSet's refused pod as FailedCreate."""

from __future__ import annotations

import json

import pytest
from kubernetes.client.rest import ApiException

from .conftest import Cluster, wait_for


def pod(name: str, **resources) -> dict:
    container = {"name": "main", "image": "busybox:1.36"}
    if resources:
        container["resources"] = resources
    return {"metadata": {"name": name}, "spec": {"containers": [container]}}


def refused(c: Cluster, ns: str, body: dict) -> str:
    with pytest.raises(ApiException) as e:
        c.core.create_namespaced_pod(ns, body)
    assert e.value.status == 403
    return json.loads(e.value.body)["message"]


def test_a_limit_range_is_stored_with_its_defaults_fills_pods_and_refuses_what_exceeds_it(cluster: Cluster):
    c = cluster
    ns = c.namespace("lr")
    c.core.create_namespaced_limit_range(ns, {"metadata": {"name": "bounds"}, "spec": {"limits": [
        {"type": "Container", "max": {"cpu": "2", "memory": "1Gi"}, "defaultRequest": {"cpu": "100m"}}]}})
    (item,) = c.core.read_namespaced_limit_range("bounds", ns).spec.limits
    assert item.default == {"cpu": "2", "memory": "1Gi"}                     # from max
    assert item.default_request == {"cpu": "100m", "memory": "1Gi"}          # given, then from default
    made = c.core.create_namespaced_pod(ns, pod("plain"))
    assert made.spec.containers[0].resources.limits == {"cpu": "2", "memory": "1Gi"}
    assert made.spec.containers[0].resources.requests == {"cpu": "100m", "memory": "1Gi"}
    assert refused(c, ns, pod("big", limits={"cpu": "4", "memory": "512Mi"})) == \
        'pods "big" is forbidden: maximum cpu usage per Container is 2, but limit is 4'


def test_a_quota_refuses_a_pod_that_does_not_say_what_it_limits_or_has_no_room_and_counts_what_runs(
        cluster: Cluster):
    c = cluster
    ns = c.namespace("quota")
    c.core.create_namespaced_resource_quota(ns, {"metadata": {"name": "compute"}, "spec": {"hard": {
        "limits.cpu": "2", "requests.memory": "1Gi", "pods": "3"}}})
    assert refused(c, ns, pod("bare")) == \
        'pods "bare" is forbidden: failed quota: compute: must specify limits.cpu for: main; requests.memory for: main'
    c.core.create_namespaced_pod(ns, pod("one", limits={"cpu": "1500m"}, requests={"memory": "256Mi"}))
    assert refused(c, ns, pod("two", limits={"cpu": "1"}, requests={"memory": "256Mi"})) == (
        'pods "two" is forbidden: exceeded quota: compute, requested: limits.cpu=1, used: limits.cpu=1500m, '
        'limited: limits.cpu=2')
    used = wait_for("the quota's usage", lambda: (s := c.core.read_namespaced_resource_quota(
        "compute", ns).status) and s.used == {"limits.cpu": "1500m", "requests.memory": "256Mi", "pods": "1"}
        and s)
    assert used.hard == {"limits.cpu": "2", "requests.memory": "1Gi", "pods": "3"}
    c.core.delete_namespaced_pod("one", ns, grace_period_seconds=0)
    wait_for("the usage to fall", lambda: c.core.read_namespaced_resource_quota("compute", ns).status.used["pods"] == "0")


def test_a_replicasets_pod_refused_by_the_quota_is_a_failed_create_event(cluster: Cluster):
    c = cluster
    ns = c.namespace("quota")
    c.core.create_namespaced_resource_quota(ns, {"metadata": {"name": "counts"}, "spec": {"hard": {"limits.memory": "1Gi"}}})
    rs = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "web", "namespace": ns}, "spec": {
        "replicas": 1, "selector": {"matchLabels": {"app": "web"}},
        "template": {"metadata": {"labels": {"app": "web"}}, "spec": pod("x")["spec"]}}}
    c.kubectl("apply", "-f", "-", stdin=json.dumps(rs))
    events = wait_for("FailedCreate", lambda: c.core.list_namespaced_event(
        ns, field_selector="involvedObject.name=web,reason=FailedCreate").items)
    assert events[0].type == "Warning"
    assert "is forbidden: failed quota: counts: must specify limits.memory for: main" in events[0].message
    assert events[0].message.startswith("Error creating: pods ")


def test_a_quota_counts_objects_of_every_kind_and_refuses_the_one_past_it(cluster: Cluster):
    ns = cluster.namespace("counts")
    hard = {"configmaps": "2", "count/deployments.apps": "1", "services.loadbalancers": "0",
            "persistentvolumeclaims": "2", "requests.storage": "15Gi",
            "fast.storageclass.storage.k8s.io/requests.storage": "5Gi"}
    cluster.core.create_namespaced_resource_quota(ns, {"metadata": {"name": "objects"}, "spec": {"hard": hard}})
    # A namespace's quota is counted as it is written: the kube-root-ca.crt ConfigMap is one.
    existing = len(cluster.core.list_namespaced_config_map(ns).items)
    for i in range(2 - existing):
        cluster.core.create_namespaced_config_map(ns, {"metadata": {"name": f"cm-{i}"}})
    with pytest.raises(ApiException) as err:
        cluster.core.create_namespaced_config_map(ns, {"metadata": {"name": "one-too-many"}})
    message = json.loads(err.value.body)["message"]
    assert err.value.status == 403
    assert message == ('configmaps "one-too-many" is forbidden: exceeded quota: objects, requested: configmaps=1, '
                       'used: configmaps=2, limited: configmaps=2')
    deployment = {"metadata": {"name": "d"}, "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {
        "metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}}}
    cluster.apps.create_namespaced_deployment(ns, deployment)
    with pytest.raises(ApiException) as err:
        cluster.apps.create_namespaced_deployment(ns, {**deployment, "metadata": {"name": "d2"}})
    assert 'deployments.apps "d2" is forbidden: exceeded quota: objects' in json.loads(err.value.body)["message"]
    with pytest.raises(ApiException) as err:
        cluster.core.create_namespaced_service(ns, {"metadata": {"name": "lb"}, "spec": {
            "type": "LoadBalancer", "selector": {"a": "b"}, "ports": [{"port": 22}]}})
    assert "services.loadbalancers=1" in json.loads(err.value.body)["message"]

    def claim(name: str, size: str, cls: str | None = None) -> dict:
        spec = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}
        if cls:
            spec["storageClassName"] = cls
        return {"metadata": {"name": name}, "spec": spec}
    cluster.core.create_namespaced_persistent_volume_claim(ns, claim("fast", "4Gi", "fast"))
    with pytest.raises(ApiException) as err:
        cluster.core.create_namespaced_persistent_volume_claim(ns, claim("fast-2", "2Gi", "fast"))
    assert "fast.storageclass.storage.k8s.io/requests.storage=2Gi" in json.loads(err.value.body)["message"]
    with pytest.raises(ApiException) as err:
        cluster.core.create_namespaced_persistent_volume_claim(ns, claim("big", "12Gi"))
    assert "requests.storage=12Gi" in json.loads(err.value.body)["message"]
    cluster.core.create_namespaced_persistent_volume_claim(ns, claim("slow", "10Gi"))
    # The quota's status counts what exists, of every kind it names.
    wait_for("the quota's usage", lambda: (cluster.core.read_namespaced_resource_quota("objects", ns).status.used
                                            or {}) == {
        "configmaps": "2", "count/deployments.apps": "1", "services.loadbalancers": "0",
        "persistentvolumeclaims": "2", "requests.storage": "14Gi",
        "fast.storageclass.storage.k8s.io/requests.storage": "4Gi"})
