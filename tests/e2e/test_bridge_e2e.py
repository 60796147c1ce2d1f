"""Node lending end to end: the bridge in the sandbox, with real Slurm.

One sandbox with a small cluster whose `gpu` partition has no node set of
its own and takes only lent nodes, and two idle Kubernetes GPU nodes
(`sandbox-lend-0`, `sandbox-lend-1`) that a NodeLendingPolicy lends to it.
A platform engineer's tools (kubectl, the Kubernetes client) and a
researcher's (SSH, sbatch) drive it; the tests run in order and each
leaves both nodes lent again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from slurmk8s.bridge.nodestate import STATE_LABEL
from slurmk8s.sandbox import Sandbox

from .researcher import Researcher

pytestmark = pytest.mark.slurm
SLURMK8S = str(Path(sys.executable).parent / "slurmk8s")
SUBNET = "10.253.96.0/24"
LEND = ("sandbox-lend-0", "sandbox-lend-1")
GRACE = 10

CLUSTER = {
    "apiVersion": "slurmk8s.dev/v1alpha1", "kind": "SlurmCluster",
    "metadata": {"name": "lend", "namespace": "default"},
    "spec": {
        "nodeSets": [{"name": "cpu", "replicas": 1, "cpus": 1, "memory": "1Gi"}],
        "partitions": [{"name": "cpu", "nodeSets": ["cpu"], "default": True},
                       {"name": "gpu", "nodeSets": [], "acceptLentNodes": True}],
        "login": {"replicas": 1, "users": [{"name": "researcher", "uid": 2001, "sshPublicKeysFrom": {
            "name": "researcher-ssh", "key": "authorized_keys"}}]},
        "sharedStorage": {"volumes": [{"name": "shared", "mountPath": "/shared", "size": "1Gi"}],
                          "checkpointDir": "/shared/checkpoints"},
    },
}


def policy(**spec) -> dict:
    base = {"clusterRef": {"name": "lend"}, "partition": "gpu",
            "nodeSelector": {"matchLabels": {"slurmk8s.dev/lendable": "true"}},
            "idleAfterSeconds": 2, "minKubernetesNodes": 0,
            "reclaim": {"gracePeriodSeconds": GRACE, "signal": "USR1"}}
    return {"apiVersion": "slurmk8s.dev/v1alpha1", "kind": "NodeLendingPolicy",
            "metadata": {"name": "lend-gpus", "namespace": "default"}, "spec": {**base, **spec}}


# A checkpointing job as researchers write them: on USR1 it saves its step
# and requeues itself; on start it resumes from the saved step.
CHECKPOINT_JOB = """#!/bin/bash
#SBATCH -p gpu --gpus=1 --requeue --open-mode=append
#SBATCH -o /shared/researcher/ckpt-%j.out
ckpt=/shared/researcher/ckpt-$SLURM_JOB_ID.step
step=0
[ -f "$ckpt" ] && step=$(cat "$ckpt") && echo "resumed at step $step on $SLURMD_NODENAME"
echo "running on $SLURMD_NODENAME (restart ${SLURM_RESTART_COUNT:-0})"
on_usr1() {
  echo "$step" > "$ckpt"
  echo "USR1 at step $step: checkpointed"
  scontrol requeue "$SLURM_JOB_ID"
}
trap on_usr1 USR1
while true; do
  step=$((step + 1))
  sleep 1 & wait $!
done
"""


def wait_for(what: str, predicate, timeout: float = 90, show=lambda: ""):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what} {show()}")
        time.sleep(0.3)


class Lending:
    """kubectl and the Kubernetes client against the sandbox, and Slurm through its agent."""

    def __init__(self, box: Sandbox, env: dict):
        self.box, self.env = box, env
        client, api = box.api()
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.slurm = box.slurm()

    def kubectl(self, *args: str, input: str | None = None) -> str:
        proc = self.box.kubectl(*args, input=input)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    def apply(self, obj: dict) -> None:
        self.kubectl("apply", "-f", "-", input=json.dumps(obj))

    def node(self, name: str):
        return self.core.read_node(name)

    def state(self, name: str) -> str | None:
        return (self.node(name).metadata.labels or {}).get(STATE_LABEL)

    def states(self) -> dict[str, str | None]:
        return {n: self.state(n) for n in LEND}

    def slurm_nodes(self) -> dict[str, str]:
        return {n.name: n.state for n in self.slurm.nodes()}

    def lent(self, name: str) -> bool:
        return self.state(name) == "lent" and name in self.slurm_nodes()

    def returned(self, name: str) -> bool:
        node = self.node(name)
        return (STATE_LABEL not in (node.metadata.labels or {})
                and not any(t.key == "slurmk8s.dev/lent" for t in node.spec.taints or []))

    def policy(self, name: str = "lend-gpus") -> dict:
        return self.custom.get_namespaced_custom_object("slurmk8s.dev", "v1alpha1", "default",
                                                        "nodelendingpolicies", name)

    def condition(self, name: str = "lend-gpus") -> dict:
        conds = (self.policy(name).get("status") or {}).get("conditions") or []
        return next((c for c in conds if c["type"] == "Ready"), {})

    def events(self, reason: str, name: str | None = None) -> list:
        return [e for e in self.core.list_event_for_all_namespaces().items
                if e.reason == reason and (name is None or e.involved_object.name == name)]

    def slurmd_pods(self) -> list:
        return self.core.list_namespaced_pod(
            "default", label_selector="app.kubernetes.io/component=lent-slurmd").items

    def gpu_pod(self, name: str, node: str, gpus: int = 4) -> None:
        self.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default",
                                                                    "labels": {"app": "serve"}},
                    "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                             "containers": [{"name": "serve", "image": "slurmk8s/slurmd:22.05",
                                             "command": ["sleep", "3600"],
                                             "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}})

    def delete_pod(self, name: str) -> None:
        self.kubectl("delete", "pod", name, "--wait=false")
        wait_for(f"pod {name} gone", lambda: name not in {p.metadata.name for p in self.core.list_namespaced_pod(
            "default").items}, timeout=60)

    def pod_node(self, name: str) -> str | None:
        pod = self.core.read_namespaced_pod(name, "default")
        return pod.spec.node_name if pod.status.phase == "Running" else None

    def metrics(self) -> dict[tuple[str, tuple], float]:
        """The bridge's /metrics: (sample name, sorted labels) -> value."""
        from prometheus_client.parser import text_string_to_metric_families

        url = self.box.status()["bridgeMetrics"]
        with urllib.request.urlopen(url, timeout=10) as resp:
            text = resp.read().decode()
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    def bridge_pid(self) -> int:
        return json.loads((self.box.dir / "state.json").read_text())["processes"]["bridge"]

    def kill_bridge(self) -> None:
        pid = self.bridge_pid()
        os.kill(pid, signal.SIGKILL)
        wait_for("the bridge to die", lambda: not Path(f"/proc/{pid}").exists() or
                 Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z", timeout=10)

    def restart_bridge(self, manifest: Path) -> None:
        """`sandbox up` starts again whatever is not running."""
        up = subprocess.run([SLURMK8S, "sandbox", "up", "-f", str(manifest), "--subnet", SUBNET],
                            capture_output=True, text=True, env=self.env, timeout=240)
        assert up.returncode == 0, up.stderr
        assert "started bridge" in up.stderr

    def until_state(self, name: str, state: str, timeout: float = 60) -> None:
        """Watch the Node (no polling gap) until its lending label is ``state``."""
        from kubernetes import watch

        if self.state(name) == state:
            return
        w = watch.Watch()
        for ev in w.stream(self.core.list_node, field_selector=f"metadata.name={name}", timeout_seconds=timeout):
            if (ev["object"].metadata.labels or {}).get(STATE_LABEL) == state:
                w.stop()
                return
        raise AssertionError(f"{name} never became {state}: {self.states()}")

    def all_lent(self) -> bool:
        return all(self.lent(n) for n in LEND) and len(self.slurmd_pods()) == 2


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    assert os.geteuid() == 0, "the sandbox needs root"
    work = tmp_path_factory.mktemp("bridge-e2e")
    manifest = work / "lend.yaml"
    manifest.write_text(yaml.safe_dump(CLUSTER))
    env = {**os.environ, "SLURMK8S_SANDBOX_DIR": str(work / "state")}
    up = subprocess.run([SLURMK8S, "sandbox", "up", "-f", str(manifest), "--subnet", SUBNET, "--timeout", "180"],
                        capture_output=True, text=True, env=env, timeout=240)
    box = Sandbox(work / "state")
    try:
        assert up.returncode == 0, up.stderr
        w = Lending(box, env)
        w.manifest = manifest
        st = box.status()
        login = st["login"]
        w.researcher = Researcher(login["host"], login["port"], login["user"], login["identityFile"],
                                  str(box.dir / "ssh" / "known_hosts"))
        yield w
        w.researcher.close()
    finally:
        subprocess.run([SLURMK8S, "sandbox", "down", "--purge"], capture_output=True, env=env, timeout=240)


def test_nothing_is_lent_below_the_minimum_or_while_a_gpu_pod_runs(world):
    world.gpu_pod("busy", LEND[0], gpus=1)
    wait_for("the GPU pod to run", lambda: world.pod_node("busy"))
    world.apply(policy(minKubernetesNodes=2))
    wait_for("the policy's status", lambda: world.condition().get("reason"))
    time.sleep(5)  # more than idleAfterSeconds and several rounds
    assert world.states() == {LEND[0]: None, LEND[1]: None}
    # The minimum drops: only the node without a GPU pod is lent.
    world.apply(policy(minKubernetesNodes=0))
    wait_for(f"{LEND[1]} lent", lambda: world.lent(LEND[1]), show=world.states)
    time.sleep(3)
    assert world.state(LEND[0]) is None
    annotations = world.node(LEND[0]).metadata.annotations or {}
    assert "slurmk8s.dev/idle-since" not in annotations  # a GPU pod runs there: not idle
    world.delete_pod("busy")
    wait_for(f"{LEND[0]} lent once idle", lambda: world.lent(LEND[0]), show=world.states)


def test_lent_nodes_join_the_partition_and_run_a_job_across_them(world):
    wait_for("both nodes lent", world.all_lent, show=world.states)
    slurm = {n.name: n for n in world.slurm.nodes()}
    for name in LEND:
        assert slurm[name].state == "idle" and "gpu" in slurm[name].partitions
    assert world.condition()["status"] == "True"
    status = world.policy()["status"]
    assert sorted(status["lentNodes"]) == list(LEND) and status["counts"]["lent"] == 2
    assert {e.involved_object.name for e in world.events("Lent")} >= set(LEND)
    out = world.researcher.check(
        "srun -p gpu -N2 --gpus-per-node=4 bash -c 'echo $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES' | sort")
    assert out.split("\n")[:2] == [f"{LEND[0]} 0,1,2,3", f"{LEND[1]} 0,1,2,3"]
    lent = ("slurmk8s_bridge_nodes", (("state", "lent"),))
    wait_for("the metrics to show 2 lent nodes", lambda: world.metrics().get(lent) == 2, timeout=20)
    assert world.metrics()[("slurmk8s_bridge_lend_seconds_count", ())] >= 2


def test_an_idle_lent_node_is_reclaimed_for_a_gpu_pod_and_lent_again_after(world):
    wait_for("both nodes lent", world.all_lent, show=world.states)
    world.gpu_pod("serve-idle", LEND[0])
    node = wait_for("the GPU pod to run on the reclaimed node", lambda: world.pod_node("serve-idle"),
                    show=world.states)
    assert node == LEND[0]
    assert LEND[0] not in world.slurm_nodes()  # its Slurm node is gone
    assert world.lent(LEND[1])  # the other one was not needed
    assert [e.message for e in world.events("Reclaiming", LEND[0])]
    world.delete_pod("serve-idle")
    wait_for("the node lent again", world.all_lent, show=world.states)


def test_a_busy_node_is_reclaimed_the_job_checkpoints_and_resumes(world):
    wait_for("both nodes lent", world.all_lent, show=world.states)
    r = world.researcher
    r.put(CHECKPOINT_JOB, "/shared/researcher/ckpt.sh")
    job = r.sbatch("/shared/researcher/ckpt.sh", cwd="/shared/researcher")
    first = wait_for("the job to run", lambda: r.job(job)["JobState"] == "RUNNING" and r.job(job)["NodeList"])
    other = next(n for n in LEND if n != first)
    time.sleep(3)  # a few steps
    world.gpu_pod("serve-busy", first)  # a serving pod that needs exactly that node
    wait_for("the reclaim", lambda: world.state(first) == "reclaiming", show=world.states)
    node = wait_for("the GPU pod to run on the reclaimed node", lambda: world.pod_node("serve-busy"),
                    timeout=GRACE + 60, show=world.states)
    assert node == first
    log = r.read(f"/shared/researcher/ckpt-{job}.out")
    assert "USR1 at step" in log, log
    saved = int(r.read(f"/shared/researcher/ckpt-{job}.step"))
    # It requeued itself; the bridge makes it eligible at once (Slurm would
    # hold it for its requeue delay), and it resumes on the other lent node.
    wait_for("the job to resume", lambda: r.job(job)["JobState"] == "RUNNING", timeout=60,
             show=lambda: r.job(job))
    assert int(r.job(job)["Restarts"]) >= 1 and r.job(job)["NodeList"] == other
    wait_for("the resumed job's output", lambda: f"resumed at step {saved} on {other}"
             in r.read(f"/shared/researcher/ckpt-{job}.out"), timeout=30)
    metrics = world.metrics()
    assert metrics[("slurmk8s_bridge_jobs_total", (("outcome", "signalled"),))] >= 1, metrics
    assert metrics[("slurmk8s_bridge_jobs_total", (("outcome", "started-now"),))] >= 1, metrics
    r.check(f"scancel {job}")
    world.delete_pod("serve-busy")
    wait_for("the node lent again", world.all_lent, show=world.states)


def test_a_node_lost_while_lent_leaves_slurm_safe_and_requeues_its_job(world):
    wait_for("both nodes lent", world.all_lent, show=world.states)
    r = world.researcher
    job = r.sbatch("/shared/researcher/ckpt.sh", "-w", LEND[1], cwd="/shared/researcher")
    wait_for("the job to run", lambda: r.job(job)["JobState"] == "RUNNING")
    pod = next(p.metadata.name for p in world.slurmd_pods() if p.spec.node_name == LEND[1])
    world.kubectl("delete", "pod", pod, "--grace-period=0", "--force", "--wait=false")
    wait_for("the job requeued", lambda: r.job(job)["JobState"] == "PENDING" or int(r.job(job)["Restarts"]) >= 1,
             timeout=60, show=lambda: r.job(job))
    # While it is gone, Slurm never offers the node as usable: drained, down, or removed.
    node = next((n for n in world.slurm.nodes() if n.name == LEND[1]), None)
    assert node is None or node.drain_set or node.state == "down", node
    wait_for("the node reclaimed", lambda: world.state(LEND[1]) in ("reclaiming", None, "lending"))
    messages = [e.message for e in world.events("Reclaiming", LEND[1])]
    assert any("slurmd pod is gone" in m for m in messages), messages
    r.check(f"scancel {job}")
    wait_for("the node lent again", world.all_lent, timeout=120, show=world.states)


@pytest.mark.parametrize("stage", ["lending", "lent", "reclaiming"])
def test_the_bridge_killed_in_any_state_converges_after_a_restart(world, stage):
    wait_for("both nodes lent", world.all_lent, show=world.states)
    r = world.researcher
    job = None
    if stage == "lending":
        # Take a node back by a GPU pod, then let it be lent again: kill the
        # bridge as soon as it marks the node lending, likely mid-round.
        world.gpu_pod("serve-kill", LEND[0])
        wait_for("the pod placed", lambda: world.pod_node("serve-kill"), show=world.states)
        world.kubectl("delete", "pod", "serve-kill", "--wait=false")
        world.until_state(LEND[0], "lending")
    elif stage == "reclaiming":
        job = r.sbatch("/shared/researcher/ckpt.sh", "-w", LEND[0], cwd="/shared/researcher")
        wait_for("the job to run", lambda: r.job(job)["JobState"] == "RUNNING")
        world.gpu_pod("serve-kill", LEND[0])
        world.until_state(LEND[0], "reclaiming")
    world.kill_bridge()
    before = world.states()
    assert before[LEND[0]] == stage
    time.sleep(2)
    assert world.states() == before  # nothing moves without the bridge
    world.restart_bridge(world.manifest)
    if stage == "reclaiming":
        wait_for("the pod on the reclaimed node", lambda: world.pod_node("serve-kill"), timeout=GRACE + 60,
                 show=world.states)
        r.check(f"scancel {job}")
        world.delete_pod("serve-kill")
    wait_for("both nodes lent again", world.all_lent, timeout=90, show=world.states)
    # Exactly one slurmd pod and one Slurm node per lent node: nothing doubled.
    pods = sorted(p.spec.node_name for p in world.slurmd_pods())
    assert pods == list(LEND)
    assert sorted(n for n in world.slurm_nodes() if n.startswith("sandbox-lend")) == list(LEND)


def test_a_policy_that_selects_nothing_or_names_no_partition_says_so_and_touches_nothing(world):
    wait_for("both nodes lent", world.all_lent, show=world.states)
    before = {n: (world.node(n).metadata.labels, world.node(n).metadata.annotations) for n in LEND}
    bad = policy(nodeSelector={"matchLabels": {"no-such": "label"}})
    bad["metadata"]["name"] = "selects-nothing"
    world.apply(bad)
    cond = wait_for("a condition", lambda: world.condition("selects-nothing"))
    assert (cond["status"], cond["reason"]) == ("False", "NoMatchingNodes")
    assert "no-such=label" in cond["message"]
    wrong = policy(partition="nope")
    wrong["metadata"]["name"] = "wrong-partition"
    wrong["spec"]["nodeSelector"] = {"matchLabels": {"kubernetes.io/hostname": "sandbox-node-0"}}
    world.apply(wrong)
    cond = wait_for("a condition", lambda: world.condition("wrong-partition"))
    assert (cond["status"], cond["reason"]) == ("False", "PartitionNotFound")
    time.sleep(2)
    assert {n: (world.node(n).metadata.labels, world.node(n).metadata.annotations) for n in LEND} == before
    assert world.state("sandbox-node-0") is None
    world.kubectl("delete", "nodelendingpolicy", "selects-nothing", "wrong-partition")
