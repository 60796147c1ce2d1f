"""The sandbox's kubelet against the Kubernetes stand-in, with real Slurm: the
rendered objects go in through kubectl, the stand-in's controllers make pods,
its scheduler binds them to sandbox Nodes, and the kubelet runs them under
runc from the images (built when missing) until every Slurm node is idle (asked through the
Slurm agent, as the operator asks)."""

from __future__ import annotations

import base64
import time

import pytest
import yaml

from sandbox import runtime
from sandbox.kubelet import SandboxNode
from slurmk8s.api import load_cluster
from slurmk8s.api.storageclass import with_storage_class
from slurmk8s.render import ClusterKeys, render
from slurmk8s.slurm.remote import RemoteSlurm

from .conftest import example_without_accounting
from .kubeletworld import KubeletWorld
from .tiers import needs

pytestmark = pytest.mark.slurm
GPU_TAINT = {"key": "nvidia.com/gpu", "effect": "NoSchedule"}
NODES = [SandboxNode("sbx-cpu-0"), SandboxNode("sbx-gpu-0", gpus=4, taints=[GPU_TAINT]),
         SandboxNode("sbx-gpu-1", gpus=4, taints=[GPU_TAINT])]


def wait_for(what: str, predicate, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except Exception as exc:  # noqa: BLE001 - retried until the deadline, then reported
            value, last = None, exc
        else:
            last = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}" + (f": {last}" if last else ""))
        time.sleep(0.5)


def images(objs: list[dict]) -> list[str]:
    """Every image the pod templates of ``objs`` name."""
    out = set()
    for obj in objs:
        spec = (obj.get("spec") or {}).get("template", {}).get("spec", {})
        out |= {c["image"] for c in spec.get("containers", []) + spec.get("initContainers", [])}
    return sorted(out)


def site_cluster():
    """The example as the operator of a site whose shared class is the stand-in's `shared`
    (the chart's sharedStorage.storageClassName): its default class refuses ReadWriteMany."""
    return with_storage_class(load_cluster(example_without_accounting()), "shared")


class World(KubeletWorld):
    def __init__(self, tmp):
        self.keys = ClusterKeys.generate()
        self.objs = render(site_cluster(), self.keys)
        super().__init__(tmp, "kltest", "10.253.91.0/24", NODES, images=images(self.objs))

    def kubectl(self, *args: str, input: str | None = None) -> str:
        return self.run_kubectl(*args, input=input).stdout

    def slurm(self) -> RemoteSlurm:
        ip = self.pod("demo-controller-0").status.pod_ip
        return RemoteSlurm(f"http://{ip}:6830", self.keys.agent_token)

    def idle_nodes(self) -> set[str]:
        return {n.name for n in self.slurm().nodes() if n.state == "idle" and not n.flags - {"DYNAMIC_NORM"}}



@pytest.fixture(scope="module")
@needs("root")
def world(tmp_path_factory):
    w = World(tmp_path_factory.mktemp("kubelet"))
    try:
        cluster = site_cluster()
        objs = w.objs
        # The Secret the example's login user takes its SSH keys from.
        objs.append({"apiVersion": "v1", "kind": "Secret",
                     "metadata": {"name": "researcher-ssh", "namespace": "default"},
                     "data": {"authorized_keys": base64.b64encode(b"ssh-ed25519 AAAAC3Nza x@y\n").decode()}})
        w.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objs))
        w.expected = {f"demo-{ns.name}-{i}" for ns in cluster.spec.node_sets for i in range(ns.replicas)}
        wait_for("every Slurm node idle", lambda: w.idle_nodes() >= w.expected)
        yield w
    finally:
        w.close()


def test_rendered_objects_become_running_pods_and_idle_slurm_nodes(world):
    pods = {p.metadata.name: p for p in world.core.list_namespaced_pod("default").items}
    assert world.expected <= set(pods)
    wait_for("every pod Ready", lambda: all(
        any(c.type == "Ready" and c.status == "True" for c in world.pod(n).status.conditions) for n in pods))
    for pod in pods.values():
        assert pod.status.phase == "Running" and pod.status.pod_ip.startswith("10.253.91.")
    # GPU workers landed on GPU nodes (the scheduler honoured resources and taints).
    assert {pods[n].spec.node_name for n in pods if n.startswith("demo-gpu-")} == {"sbx-gpu-0", "sbx-gpu-1"}
    table = world.kubectl("get", "pods", "-o", "wide")
    assert "demo-controller-0" in table and "2/2" in table  # slurmctld and its agent
    nodes = world.core.list_node().items
    assert {n.metadata.name for n in nodes} == {n.name for n in NODES}
    assert all(any(c.type == "Ready" and c.status == "True" for c in n.status.conditions) for n in nodes)


def test_a_restarted_kubelet_adopts_its_pods(world):
    before = {p.uid: p.holder for p in world.kubelet.pods.values()}
    world.kill_kubelet()
    world.start_kubelet()
    time.sleep(3)  # a few rounds of the new kubelet
    after = {p.uid: p.holder for p in world.kubelet.pods.values()}
    assert after == before
    assert all(runtime.alive(h) for h in after.values())
    assert world.idle_nodes() >= world.expected


def test_a_deleted_worker_leaves_slurm_and_its_statefulset_brings_it_back(world):
    old = world.pod("demo-gpu-1").metadata.uid
    world.kubectl("delete", "pod", "demo-gpu-1", "--wait=true", "--timeout=90s")
    # The entrypoint drained its node and deleted the record on SIGTERM (graceful deletion).
    logs = (world.dir / "kubelet" / "pods").glob(f"default_demo-gpu-1_{old[:8]}/containers/0/log")
    assert any("deleted node demo-gpu-1 from slurmctld" in log.read_text() for log in logs)
    new = wait_for("a new demo-gpu-1 pod", lambda: (p := world.pod("demo-gpu-1")).metadata.uid != old and p)
    assert new.spec.node_name in {"sbx-gpu-0", "sbx-gpu-1"}
    wait_for("demo-gpu-1 idle again", lambda: "demo-gpu-1" in world.idle_nodes())
