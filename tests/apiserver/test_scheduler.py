"""The scheduler (node selectors, required node affinity, taints and
tolerations, GPU and other resources, unschedulable nodes) and NoExecute
eviction. Each test gets its own server, so the node set is exactly its own."""

from __future__ import annotations

import pytest
from kubernetes.client.rest import ApiException

from .conftest import Cluster, start_server, wait_for

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


@pytest.fixture
def fresh(tmp_path) -> Cluster:
    c = start_server(tmp_path)
    yield c
    c.api_client.close()
    c.srv.stop()


def node_of(c: Cluster, ns: str, name: str) -> str | None:
    return c.core.read_namespaced_pod(name, ns).spec.node_name


def unschedulable(c: Cluster, ns: str, name: str):
    def check():
        pod = c.core.read_namespaced_pod(name, ns)
        cond = [x for x in pod.status.conditions or [] if x.type == "PodScheduled"]
        return cond and cond[0].status == "False" and cond[0]
    return wait_for(f"{name} to be reported unschedulable", check)


def gpu_cluster(c: Cluster) -> None:
    c.node("cpu-0", cpu="8", memory="16Gi", labels={"pool": "cpu"})
    c.node("gpu-0", cpu="16", memory="64Gi", labels={"pool": "gpu"}, taints=[GPU_TAINT], extra={"nvidia.com/gpu": "4"})
    c.node("gpu-1", cpu="16", memory="64Gi", labels={"pool": "gpu"}, taints=[GPU_TAINT], extra={"nvidia.com/gpu": "2"})


def test_gpu_requests_taints_and_failed_scheduling(fresh: Cluster) -> None:
    c = fresh
    gpu_cluster(c)
    ns = c.namespace()
    c.pod(ns, "train", requests={"nvidia.com/gpu": "4", "cpu": "2"}, tolerations=[GPU_TOLERATION], nodeSelector={"pool": "gpu"})
    assert wait_for("train to be bound", lambda: node_of(c, ns, "train")) == "gpu-0"
    events = wait_for("the Scheduled event", lambda: c.core.list_namespaced_event(ns, field_selector="involvedObject.name=train,reason=Scheduled").items)
    assert events[0].message == f"Successfully assigned {ns}/train to gpu-0" and events[0].source.component == "default-scheduler"

    c.pod(ns, "second", requests={"nvidia.com/gpu": "4"}, tolerations=[GPU_TOLERATION], nodeSelector={"pool": "gpu"})
    cond = unschedulable(c, ns, "second")
    expected = "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 2 Insufficient nvidia.com/gpu."
    assert (cond.reason, cond.message) == ("Unschedulable", expected)
    failed = wait_for("FailedScheduling", lambda: c.core.list_namespaced_event(ns, field_selector="involvedObject.name=second,reason=FailedScheduling").items)
    assert failed[0].type == "Warning" and failed[0].message == expected

    c.pod(ns, "untolerated", requests={"cpu": "1"}, nodeSelector={"pool": "gpu"})
    cond = unschedulable(c, ns, "untolerated")
    assert cond.message == ("0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, "
                            "2 node(s) had untolerated taint {nvidia.com/gpu: present}.")
    # ExtendedResourceToleration: a pod that asks for GPUs tolerates the GPU taint, once.
    c.pod(ns, "asks-gpus", requests={"nvidia.com/gpu": "1", "example.com/fpga": "1"})
    tolerations = [t.to_dict() for t in c.core.read_namespaced_pod("asks-gpus", ns).spec.tolerations]
    assert [(t["key"], t["operator"], t["effect"]) for t in tolerations if t["key"] in
            ("nvidia.com/gpu", "example.com/fpga")] == [("example.com/fpga", "Exists", "NoSchedule"),
                                                        ("nvidia.com/gpu", "Exists", "NoSchedule")]
    assert len([t for t in c.core.read_namespaced_pod("train", ns).spec.tolerations
                if t.key == "nvidia.com/gpu"]) == 1

    c.core.delete_namespaced_pod("train", ns)  # frees gpu-0's four GPUs
    assert wait_for("second to take the freed GPUs", lambda: node_of(c, ns, "second")) == "gpu-0"


def test_cpu_memory_and_pod_count(fresh: Cluster) -> None:
    c = fresh
    c.node("small", cpu="1", memory="1Gi", pods="2")
    ns = c.namespace()
    c.pod(ns, "half", requests={"cpu": "500m", "memory": "512Mi"})
    assert wait_for("half", lambda: node_of(c, ns, "half")) == "small"
    c.pod(ns, "too-big", requests={"cpu": "600m", "memory": "600Mi"})
    assert unschedulable(c, ns, "too-big").message == "0/1 nodes are available: 1 Insufficient cpu, 1 Insufficient memory."
    c.pod(ns, "tiny")
    assert wait_for("tiny", lambda: node_of(c, ns, "tiny")) == "small"
    c.pod(ns, "third")
    assert unschedulable(c, ns, "third").message == "0/1 nodes are available: 1 Too many pods."


def test_node_affinity_and_unschedulable_nodes(fresh: Cluster) -> None:
    c = fresh
    gpu_cluster(c)
    ns = c.namespace()

    def affinity(*exprs):
        return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": list(exprs)}]}}}

    c.pod(ns, "in-cpu", affinity=affinity({"key": "pool", "operator": "In", "values": ["cpu"]}))
    assert wait_for("in-cpu", lambda: node_of(c, ns, "in-cpu")) == "cpu-0"
    c.pod(ns, "not-gpu-0", tolerations=[GPU_TOLERATION], affinity=affinity(
        {"key": "pool", "operator": "Exists"}, {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["gpu-0", "cpu-0"]}))
    assert wait_for("not-gpu-0", lambda: node_of(c, ns, "not-gpu-0")) == "gpu-1"
    c.pod(ns, "nowhere", affinity=affinity({"key": "pool", "operator": "DoesNotExist"}))
    assert unschedulable(c, ns, "nowhere").message == "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 2 node(s) had untolerated taint {nvidia.com/gpu: present}."

    c.core.patch_node("cpu-0", {"spec": {"unschedulable": True}})
    c.pod(ns, "cordoned", nodeSelector={"pool": "cpu"})
    assert unschedulable(c, ns, "cordoned").message.startswith("0/3 nodes are available: 1 node(s) were unschedulable")
    c.core.patch_node("cpu-0", {"spec": {"unschedulable": False}})
    assert wait_for("cordoned after uncordon", lambda: node_of(c, ns, "cordoned")) == "cpu-0"


def test_binding_by_another_scheduler(fresh: Cluster) -> None:
    c = fresh
    c.node("n1")
    ns = c.namespace()
    c.pod(ns, "manual", schedulerName="my-scheduler")
    c.core.create_namespaced_binding(ns, {"metadata": {"name": "manual"}, "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"}},
                                     _preload_content=False)
    assert node_of(c, ns, "manual") == "n1"
    with pytest.raises(ApiException) as e:
        c.core.create_namespaced_binding(ns, {"metadata": {"name": "manual"}, "target": {"kind": "Node", "name": "n1"}},
                                         _preload_content=False)
    assert e.value.status == 409


def test_no_execute_taints_evict_pods_that_do_not_tolerate_them(fresh: Cluster) -> None:
    c = fresh
    c.node("host")
    ns = c.namespace()
    c.pod(ns, "plain")
    c.pod(ns, "brief", tolerations=[{"key": "maintenance", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 1}])
    c.pod(ns, "forever", tolerations=[{"key": "maintenance", "operator": "Exists", "effect": "NoExecute"}])
    for name in ("plain", "brief", "forever"):
        wait_for(f"{name} to be bound", lambda name=name: node_of(c, ns, name))
    c.core.patch_node("host", {"spec": {"taints": [{"key": "maintenance", "value": "yes", "effect": "NoExecute"}]}})
    assert c.core.read_node("host").spec.taints[0].time_added  # set by the server, as Kubernetes does

    def names():
        return {p.metadata.name for p in c.core.list_namespaced_pod(ns).items}

    wait_for("the pod without a toleration to be evicted", lambda: "plain" not in names())
    wait_for("the pod tolerating for one second to be evicted", lambda: "brief" not in names())
    assert names() == {"forever"}
    ev = c.core.list_namespaced_event(ns, field_selector="involvedObject.name=plain,reason=TaintManagerEviction").items
    assert ev and ev[0].message == f"Marking for deletion Pod {ns}/plain"


def test_topology_spread_constraints(fresh: Cluster) -> None:
    """ScheduleAnyway spreads a Deployment's replicas over nodes even where
    the least allocated node is another; DoNotSchedule refuses a node that
    would raise the skew past maxSkew, with the scheduler's message."""
    c = fresh
    c.node("big", cpu="64", memory="256Gi")
    c.node("small", cpu="4", memory="8Gi")
    ns = c.namespace()
    soft = [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
             "labelSelector": {"matchLabels": {"app": "op"}}}]
    c.pod(ns, "op-0", labels={"app": "op"}, requests={"cpu": "100m"}, topologySpreadConstraints=soft)
    assert wait_for("op-0 bound", lambda: node_of(c, ns, "op-0")) == "big"
    c.pod(ns, "op-1", labels={"app": "op"}, requests={"cpu": "100m"}, topologySpreadConstraints=soft)
    assert wait_for("op-1 bound", lambda: node_of(c, ns, "op-1")) == "small"
    # Another app's pods do not count.
    c.pod(ns, "other", labels={"app": "other"}, requests={"cpu": "100m"}, topologySpreadConstraints=soft)
    assert wait_for("other bound", lambda: node_of(c, ns, "other")) == "big"

    hard = [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule",
             "labelSelector": {"matchLabels": {"app": "db"}}}]
    c.pod(ns, "db-0", labels={"app": "db"}, requests={"cpu": "100m"}, nodeName="big")
    c.pod(ns, "db-1", labels={"app": "db"}, requests={"cpu": "100m"}, nodeName="big")
    c.pod(ns, "db-2", labels={"app": "db"}, requests={"cpu": "4"}, topologySpreadConstraints=hard)
    cond = unschedulable(c, ns, "db-2")
    assert cond.message == ("0/2 nodes are available: 1 Insufficient cpu, "
                            "1 node(s) didn't match pod topology spread constraints.")
