"""Node lending in the sandbox, as the bridge tests and hack/bench_lending.py drive it.

A small cluster whose `gpu` partition has no node set of its own and takes
only lent nodes, the sandbox's two lendable GPU nodes (`sandbox-lend-0`,
`sandbox-lend-1`), a NodeLendingPolicy for them, and :class:`Lending`: a
platform engineer's tools (kubectl, the Kubernetes client, the bridge's
/metrics) and a researcher's (SSH, sbatch) against it.
"""

from __future__ import annotations

import contextlib
import json
import urllib.request
from collections.abc import Iterator
from datetime import UTC
from pathlib import Path

from sandbox import Sandbox
from sandbox.images import tags
from slurmk8s import versions
from slurmk8s.bridge.nodestate import STATE_LABEL

from .common import kill_leader, running_sandbox, wait_for
from .researcher import Researcher

#: What a serving pod runs: the image examples/serving.yaml names.
SERVE_IMAGE = tags("serve")[0]

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
        # Lent nodes' jobs are accounted like the others': sacct shows a reclaim's requeue.
        "accounting": {"enabled": True, "database": {"managed": {"volume": {"size": "1Gi"}}}},
        # The sandbox's Prometheus (monitoring.py) scrapes the Slurm metrics from its namespace.
        # Read every 5 s: the tests' jobs are short.
        "metrics": {"scrapeFrom": ["monitoring"], "intervalSeconds": 5},
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
  # A periodic checkpoint into the TaskProlog's directory, as training writes one.
  [ "$step" -eq 2 ] && echo "$step" > "$SLURMK8S_CHECKPOINT_DIR/periodic"
  sleep 1 & wait $!
done
"""


class Lending:
    """kubectl and the Kubernetes client against the sandbox, and Slurm through its agent."""

    def __init__(self, box: Sandbox, env: dict, manifest: Path, subnet: str):
        self.box, self.env, self.manifest, self.subnet = box, env, manifest, subnet
        client, api = box.api()
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.slurm = box.slurm()
        login = box.status()["login"]
        self.researcher = Researcher(login["host"], login["port"], login["user"], login["identityFile"],
                                     str(box.dir / "ssh" / "known_hosts"))

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

    def lent_pod(self, node: str):
        """The lent slurmd pod on ``node`` (not being deleted), or None."""
        return next((p for p in self.slurmd_pods() if p.spec.node_name == node
                     and p.metadata.deletion_timestamp is None), None)

    def budgets(self) -> dict[str, object]:
        """The PodDisruptionBudgets of the cluster's namespace, by name."""
        from kubernetes import client

        return {b.metadata.name: b for b in client.PolicyV1Api(self.core.api_client)
                .list_namespaced_pod_disruption_budget("default").items}

    def cluster(self):
        """The SlurmCluster, loaded as the operator and the bridge load it."""
        from slurmk8s.api import load_cluster

        return load_cluster(self.custom.get_namespaced_custom_object("slurmk8s.dev", "v1alpha1", "default",
                                                                     "slurmclusters", CLUSTER["metadata"]["name"]))

    def gpu_pod(self, name: str, node: str, gpus: int = 4) -> None:
        self.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default",
                                                                    "labels": {"app": "serve"}},
                    "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                             "containers": [{"name": "serve", "image": SERVE_IMAGE,
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

    def kill_bridge(self) -> str:
        """Kill the leading bridge's pod at once, as a crash or a lost node would
        (:func:`.common.kill_leader`), and wait for a standby to lead; the pod killed."""
        return kill_leader(self.box, self.kubectl, "bridge")[0]

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

    def reservations(self) -> dict[str, int]:
        """Slurm's lending reservations: node -> start (POSIX seconds)."""
        return {r.node: r.start for r in self.slurm.reservations()}

    def seed_demand(self, peaks: list[int]) -> dict:
        """Write into the policy's status a demand record as the bridge keeps
        it (one peak per 15-minute bucket), ``peaks`` ending with the bucket
        before now: the forecast reads it. Returns the status's ``demand``."""
        from datetime import datetime, timedelta

        from slurmk8s.bridge import forecast as F
        from slurmk8s.bridge.foresight import Foresight, demand_status

        start = datetime.now(UTC) - timedelta(seconds=F.STEP * (len(peaks) + 1))
        rec = None
        for i, v in enumerate(peaks):
            rec = F.record(rec, start + timedelta(seconds=i * F.STEP), v)
        demand = demand_status(Foresight(rec, 0, 0, (), ())).dump()
        self.custom.patch_namespaced_custom_object_status(
            "slurmk8s.dev", "v1alpha1", "default", "nodelendingpolicies", "lend-gpus", {"status": {"demand": demand}})
        return demand

    def seeded(self, peaks: list[int], ready):
        """Seed the record (:meth:`seed_demand`) until ``ready(demand)``
        shows the bridge read the ``demand`` written, and return what
        ``ready`` returned: the bridge writes the status too, and a round
        that read it before the seed writes its own record over it."""
        wait_for("the bridge's own record", lambda: (self.policy().get("status") or {}).get("demand"))
        for _ in range(6):
            demand = self.seed_demand(peaks)
            try:
                return wait_for("the forecast read", lambda: ready(demand), timeout=20)  # noqa: B023 - called within this iteration
            except AssertionError:
                continue
        raise AssertionError(f"the seeded record was never read: {self.reservations()} {self.policy().get('status')}")



@contextlib.contextmanager
def lending_sandbox(work: Path, subnet: str, release: str = versions.DEFAULT) -> Iterator[Lending]:
    """Bring the cluster up in a sandbox under ``work``; take it down after."""
    with running_sandbox(work, CLUSTER, subnet, release) as (box, env, manifest):
        w = Lending(box, env, manifest, subnet)
        try:
            yield w
        finally:
            w.researcher.close()
