"""Node health checks without daemons: what spec.healthCheck renders (the
slurm.conf keys and the `#slurmk8s:Health` lines the program reads, the site
checks' volume), refusals by field path, the drains the health check sets
read back, and the operator's Event and metric for them. The program itself
runs against real Slurm in the sandbox (tests/e2e/test_sandbox_e2e.py)."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from slurmk8s.api import load_cluster
from slurmk8s.api.errors import InvalidSpec
from slurmk8s.api.status import SlurmClusterStatus
from slurmk8s.operator import metrics
from slurmk8s.render import ClusterKeys, config_files, render
from slurmk8s.render.config import HEALTH_CHECK_PROGRAM
from slurmk8s.render.manifests import lent_slurmd_pod
from slurmk8s.render.slurmd import SITE_CHECKS_DIR
from slurmk8s.slurm.model import Node, unhealthy

from sandbox.faults import fault_commands

from .conftest import minimal

SHARED = {"volumes": [{"name": "shared", "mountPath": "/shared", "size": "1Gi"},
                      {"name": "data", "mountPath": "/data", "size": "1Gi"}]}


def conf(**spec) -> str:
    return config_files(load_cluster(minimal(partitions=[{"name": "p"}], **spec)))["slurm.conf"]


def test_by_default_every_slurmd_runs_the_three_checks_every_two_minutes():
    lines = conf(sharedStorage=SHARED).splitlines()
    assert f"HealthCheckProgram={HEALTH_CHECK_PROGRAM}" in lines
    assert "HealthCheckInterval=120" in lines and "HealthCheckNodeState=ANY" in lines
    assert "#slurmk8s:HealthChecks=gpus munge sharedStorage" in lines
    assert "#slurmk8s:HealthSharedPaths=/shared /data" in lines
    assert not [line for line in lines if "HealthMin" in line]


def test_thresholds_add_their_checks_in_bytes_and_disabled_renders_nothing():
    lines = conf(healthCheck={"minFreeDisk": "10Gi", "minAvailableMemory": "512Mi", "checks": ["munge"],
                              "intervalSeconds": 30, "nodeStates": ["IDLE", "MIXED", "CYCLE"]}).splitlines()
    assert "#slurmk8s:HealthChecks=munge disk memory" in lines
    assert f"#slurmk8s:HealthMinFreeDisk={10 * 2**30}" in lines
    assert f"#slurmk8s:HealthMinAvailableMemory={512 * 2**20}" in lines
    assert "HealthCheckNodeState=IDLE,MIXED,CYCLE" in lines and "HealthCheckInterval=30" in lines
    assert "HealthCheck" not in conf(healthCheck={"enabled": False})


@pytest.mark.parametrize("health,path,why", [
    ({"intervalSeconds": 5}, "spec.healthCheck.intervalSeconds", "the least allowed is 10"),
    ({"checks": ["gpus", "gpus"]}, "spec.healthCheck.checks", "listed twice"),
    ({"checks": ["nvidia-smi"]}, "spec.healthCheck.checks[0]", "gpus"),
    ({"nodeStates": ["NONDRAINED_IDLE"]}, "spec.healthCheck.nodeStates[0]", "ANY"),
    ({"minFreeDisk": "-1Gi"}, "spec.healthCheck.minFreeDisk", ""),
    ({"siteChecks": "Bad_Name"}, "spec.healthCheck.siteChecks", ""),
])
def test_bad_health_settings_are_refused_by_field_path(health, path, why):
    with pytest.raises(InvalidSpec) as err:
        load_cluster(minimal(partitions=[{"name": "p"}], healthCheck=health))
    found = {e.path: e.message for e in err.value.errors}
    assert path in found, found
    assert why in found[path]


def test_site_checks_are_mounted_read_only_on_workers_and_on_lent_nodes_once_verified():
    """Workers mount the site checks' ConfigMap (the operator renders them only once it
    found the ConfigMap labelled for that use), never optional: a pod does not start
    to run whatever ConfigMap of that name someone makes later. A lent pod, which the
    bridge renders, mounts it only while status.siteChecks (the operator's verdict)
    names the ConfigMap the spec names."""
    doc = minimal(nodeSets=[{"name": "cpu", "replicas": 1}], partitions=[{"name": "p", "nodeSets": ["cpu"]},
                  {"name": "gpu", "acceptLentNodes": True}], healthCheck={"siteChecks": "site-health"})
    doc["metadata"]["uid"] = "0b5e2c6e-1111-4c2b-9c57-3a9a4d3c2e01"
    cluster = load_cluster(doc)
    worker = next(o for o in render(cluster, ClusterKeys.generate()) if o["kind"] == "StatefulSet"
                  and o["metadata"]["name"] == "c1-cpu")["spec"]["template"]["spec"]

    def lent(status: dict | None) -> dict:
        c = load_cluster({**doc, "status": status}) if status is not None else cluster
        return lent_slurmd_pod(c, "h", node="n", resources={"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"},
                               labels={}, partition="gpu", shm_size="1Gi", taint_key="slurmk8s.dev/lent")["spec"]

    volume = {"name": "site-checks", "configMap": {"name": "site-health", "defaultMode": 0o444}}
    mount = {"name": "site-checks", "mountPath": SITE_CHECKS_DIR, "readOnly": True}
    for spec in (worker, lent({"siteChecks": "site-health"})):
        assert volume in spec["volumes"] and mount in spec["containers"][0]["volumeMounts"]
    for status in (None, {}, {"siteChecks": "other-checks"}):  # not verified, or verified under another name
        spec = lent(status)
        assert all(v["name"] != "site-checks" for v in spec["volumes"])
        assert mount not in spec["containers"][0]["volumeMounts"]


def node(name: str, reason: str = "", drained: bool = True) -> Node:
    return Node(name=name, state="idle", flags=frozenset({"DRAIN"} if drained else ()), reason=reason, features=(),
                partitions=(), cpus=1, alloc_cpus=0, gres="", address="")


def test_only_the_health_checks_own_drains_read_as_unhealthy():
    nodes = [node("a", "slurmk8s: health: gpus"), node("b", "slurmk8s: health: site-nfs.sh [root@2026-01-01]"),
             node("c", "slurmk8s: scale-in"), node("d", "health: gpus"), node("e", "slurmk8s: health: gpus", False)]
    assert unhealthy(nodes) == {"a": "gpus", "b": "site-nfs.sh"}


def test_the_metric_counts_unhealthy_nodes_by_check_and_falls_back_to_zero():
    class Outcome:
        def __init__(self, nodes):
            self.nodes, self.status = nodes, SlurmClusterStatus()

    def value(check: str) -> float | None:
        return REGISTRY.get_sample_value("slurmk8s_cluster_unhealthy_nodes",
                                         {"namespace": "hpc", "cluster": "h1", "check": check})
    metrics.observe_cluster("hpc", "h1", Outcome([node("a", "slurmk8s: health: gpus"),
                                                  node("b", "slurmk8s: health: gpus")]))
    assert value("gpus") == 2
    metrics.observe_cluster("hpc", "h1", Outcome([node("a")]))
    assert value("gpus") == 0
    metrics.forget_cluster("hpc", "h1")
    assert value("gpus") is None


def test_the_sandbox_takes_away_the_highest_gpu_and_gives_back_every_missing_one():
    assert fault_commands("gpu", False, gpus=[4, 5, 6, 7], present=[4, 5, 6, 7], shared=[]) == [
        ["rm", "-f", "/dev/nvidia7"]]
    assert fault_commands("gpu", True, gpus=[4, 5, 6, 7], present=[4, 5], shared=[]) == [
        ["mknod", "-m", "0666", "/dev/nvidia6", "c", "195", "6"], ["mknod", "-m", "0666", "/dev/nvidia7", "c", "195", "7"]]
    assert fault_commands("shared-readonly", False, gpus=[], present=[], shared=["/shared", "/data"]) == [
        ["mount", "-o", "remount,bind,ro", "/shared"], ["mount", "-o", "remount,bind,ro", "/data"]]
    assert fault_commands("shared-readonly", True, gpus=[], present=[], shared=["/shared"]) == [
        ["mount", "-o", "remount,bind,rw", "/shared"]]
    with pytest.raises(ValueError, match="given no GPU"):
        fault_commands("gpu", False, gpus=[], present=[], shared=[])
