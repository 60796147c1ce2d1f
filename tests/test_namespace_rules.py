"""The cluster's objects in a namespace as real sites run them: Pod Security
at baseline (enforced and warned), a ResourceQuota on requests, limits and
pods, and a LimitRange with bounds and defaults. The objects the operator
renders are applied to the API stand-in, whose workload controllers create
the pods through its admission: every pod is admitted, as the lent slurmd
pod is; with cgroups, slurmd is refused, and the StatefulSet says why."""

from __future__ import annotations

import json

import yaml

from slurmk8s.api import load_cluster
from slurmk8s.render.manifests import lent_slurmd_pod, render
from slurmk8s.render.names import NODESET_LABEL

from .apiserver.conftest import Cluster, wait_for
from .apiserver.conftest import cluster as api  # noqa: F401 (the stand-in, as a fixture)
from .conftest import EXAMPLE

QUOTA = {"requests.cpu": "32", "requests.memory": "64Gi", "limits.cpu": "64", "limits.memory": "128Gi",
         "pods": "20", "requests.nvidia.com/gpu": "16"}
LIMITS = [{"type": "Container", "max": {"cpu": "16", "memory": "32Gi"},
           "default": {"cpu": "250m", "memory": "256Mi"}}]



def site_namespace(c: Cluster) -> str:
    ns = c.namespace("hpc")
    c.core.patch_namespace(ns, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "baseline",
                                                        "pod-security.kubernetes.io/warn": "baseline"}}})
    c.core.create_namespaced_resource_quota(ns, {"metadata": {"name": "team"}, "spec": {"hard": QUOTA}})
    c.core.create_namespaced_limit_range(ns, {"metadata": {"name": "bounds"}, "spec": {"limits": LIMITS}})
    return ns


def cluster_doc(ns: str, **config) -> dict:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["namespace"] = ns
    doc["spec"]["restApi"] = {"enabled": True}
    if config:
        doc["spec"]["slurmConfig"] = config
        for p in doc["spec"]["partitions"]:
            p.pop("acceptLentNodes", None)
    return doc


def apply(c: Cluster, objs: list[dict]) -> str:
    out = c.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}))
    return out.stderr


def replicas(objs: list[dict]) -> dict[str, int]:
    return {o["metadata"]["name"]: o["spec"].get("replicas", 1) for o in objs
            if o["kind"] in ("StatefulSet", "Deployment")}


def test_every_pod_of_the_example_is_admitted_under_baseline_a_quota_and_a_limit_range(api: Cluster, keys):  # noqa: F811 - the fixture imported above
    ns = site_namespace(api)
    cluster = load_cluster(cluster_doc(ns))
    objs = render(cluster, keys)
    warnings = apply(api, objs)
    assert "PodSecurity" not in warnings, warnings
    want = replicas(objs)
    assert want and sum(want.values()) >= 6

    def pods_made() -> dict[str, int]:
        made: dict[str, int] = {}
        for p in api.core.list_namespaced_pod(ns).items:
            owner = p.metadata.labels.get("app.kubernetes.io/component")
            made[owner] = made.get(owner, 0) + 1
        return made

    wait_for("every workload's pods", lambda: sum(pods_made().values()) == sum(want.values()), timeout=30)
    failed = api.core.list_namespaced_event(ns, field_selector="reason=FailedCreate").items
    assert failed == [], [e.message for e in failed]
    # Nothing was left for the LimitRange to fill in: each container says its own.
    rendered = {(o["spec"]["template"]["metadata"]["labels"].get(NODESET_LABEL), c["name"]): c["resources"]
                for o in objs if o["kind"] in ("StatefulSet", "Deployment")
                for c in o["spec"]["template"]["spec"]["containers"]}
    for p in api.core.list_namespaced_pod(ns).items:
        for c in p.spec.containers:
            key = (p.metadata.labels.get(NODESET_LABEL), c.name)
            for section in ("requests", "limits"):
                mine = {k: v for k, v in getattr(c.resources, section).items() if k in ("cpu", "memory")}
                assert mine == {k: v for k, v in rendered[key][section].items() if k in ("cpu", "memory")}, key
    lent = lent_slurmd_pod(cluster, "", node="gpu-7", labels={}, partition="gpu", shm_size="1Gi", taint_key="t",
                           resources={"cpu": "8", "memory": "16Gi", "nvidia.com/gpu": "4"})
    api.core.create_namespaced_pod(ns, lent)


def test_with_cgroups_slurmd_is_refused_under_baseline_and_its_statefulset_says_why(api: Cluster, keys):  # noqa: F811 - the fixture imported above
    ns = site_namespace(api)
    objs = render(load_cluster(cluster_doc(ns, cgroups=True)), keys)
    warnings = apply(api, objs)
    assert 'would violate PodSecurity "baseline:latest": privileged (container "slurmd"' in warnings
    event = wait_for("FailedCreate", lambda: api.core.list_namespaced_event(
        ns, field_selector="reason=FailedCreate").items, timeout=30)[0]
    assert event.involved_object.kind == "StatefulSet"
    assert 'violates PodSecurity "baseline:latest": privileged' in event.message
