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
        "compute", ns).status) and s.used == {"limits.cpu": "1500m", "requests.memory": "268435456", "pods": "1"}
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
