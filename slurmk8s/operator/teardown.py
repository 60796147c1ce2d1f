"""Tearing a SlurmCluster down in order, one step per call: the finalizer's work.

Drain the cluster's Slurm nodes, delete the worker StatefulSets and wait for
their pods (their entrypoints wait for their jobs, set a node still running
some DOWN as a last resort, which requeues what may be requeued, and remove
the nodes while slurmctld still runs), then delete the rest of the cluster's
objects. Claims stay unless spec.deletionPolicy is Delete.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from slurmk8s import log
from slurmk8s.api import load_cluster
from slurmk8s.render import names
from slurmk8s.render.keys import keys_from_secrets

from . import plan, reads

if TYPE_CHECKING:
    from .round import Operator

__all__ = ["step", "REASON", "PATIENCE"]

#: The drain reason of a cluster's nodes while it is torn down.
REASON = "cluster deleted"
#: Rounds a teardown waits for the agent, then for worker pods to go, before it goes on regardless.
PATIENCE = 30

_log = log.get("slurmk8s.operator")


def step(op: Operator, body: Mapping, attempt: int = 0) -> tuple[bool, str]:
    """One step of an orderly teardown; (done, what it waits for).

    After PATIENCE attempts a step that waits goes on regardless.
    """
    meta = body["metadata"]
    cluster_name, namespace = meta["name"], meta.get("namespace", "default")
    policy = ((body.get("spec") or {}).get("deletionPolicy")) or "Retain"
    patient = attempt < PATIENCE
    observed = reads.observe(op.kube, namespace, cluster_name)
    ours = [o for o in observed if plan.is_ours(o, cluster_name)]
    workers = [o for o in ours if o["kind"] == "StatefulSet"
               and names.NODESET_LABEL in (o["metadata"].get("labels") or {})]
    worker_pods = [o for o in observed if o["kind"] == "Pod"
                   and (o["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == "worker"]
    if workers or worker_pods:
        bases = {w["metadata"]["name"] for w in workers}
        try:
            cluster = load_cluster({k: v for k, v in body.items() if k != "status"},
                                   trusted_repositories=op.trusted_repositories)
            secrets = {o["metadata"]["name"]: o for o in observed if o["kind"] == "Secret"}
            keys, missing = keys_from_secrets(cluster, secrets, op.new_key)
            if names.agent_token_secret(cluster) in missing:
                raise RuntimeError("the agent token Secret is gone")
            pod = next((p for p in observed if p["metadata"]["name"] == names.controller_pod(cluster)), None)
            slurm = op.agent(cluster, keys.agent_token, pod)
            for n in slurm.nodes():
                if n.name.rpartition("-")[0] in bases and not n.drain_set:
                    slurm.drain(n.name, REASON)
        except Exception as exc:  # noqa: BLE001 - Slurm unknown: wait, or tear down without draining when told to
            if patient:
                return False, f"waiting to drain the Slurm nodes: {exc}"
            _log.warning("tearing down without draining", cluster=cluster_name, error=str(exc))
        for w in workers:
            if not w["metadata"].get("deletionTimestamp"):
                op.kube.delete("StatefulSet", namespace, w["metadata"]["name"], uid=w["metadata"].get("uid"))
        if worker_pods and patient:
            return False, f"waiting for {len(worker_pods)} worker pods to stop (their jobs are requeued)"
    for o in sorted(ours, key=lambda o: -plan.MANAGED_KINDS.index(o["kind"])
                    if o["kind"] in plan.MANAGED_KINDS else 0):
        kind, name = o["kind"], o["metadata"]["name"]
        if kind not in plan.MANAGED_KINDS or o["metadata"].get("deletionTimestamp"):
            continue
        if kind == "PersistentVolumeClaim" and policy != "Delete":
            continue  # Retain: the controller state and shared data stay
        op.kube.delete(kind, namespace, name, uid=o["metadata"].get("uid"))
    return True, "deleted"
