"""The namespaces of a sandbox as a real site sets them up. Pure.

A platform team rarely hands out an open namespace. ``sandbox up`` gives the
cluster's namespace what sites commonly put there, before anything of
slurmk8s is installed, so that the product is held to them:

- Pod Security ``enforce`` and ``warn`` at ``baseline`` (``privileged`` for a
  SlurmCluster with ``slurmConfig.cgroups``, whose slurmd pods are privileged),
  ``audit`` at ``restricted``;
- a default-deny NetworkPolicy: ingress, and egress too when the SlurmCluster
  renders egress rules (``spec.network.egress``);
- a ResourceQuota on requests, limits, GPUs and pods, sized to the sandbox's
  Nodes (GPUs of lendable nodes twice: the lent slurmd pods hold them while a
  pod that takes the node back is created), and a LimitRange whose defaults
  fill in a container that sets none.

The operator's and bridge's namespace is at Pod Security ``restricted``.
"""

from __future__ import annotations

from collections.abc import Sequence

from slurmk8s.api import SlurmCluster
from slurmk8s.api.quantities import quantity_value

PSA = "pod-security.kubernetes.io"
DEFAULT_DENY = "default-deny"
QUOTA = "team-quota"
LIMITS = "container-defaults"
LENDABLE = "slurmk8s.dev/lendable"


def _namespace(name: str, level: str) -> dict:
    labels = {f"{PSA}/{mode}": level for mode in ("enforce", "warn")}
    labels[f"{PSA}/audit"] = "restricted"  # what would not pass the strictest level, in the audit log
    labels |= {f"{PSA}/{mode}-version": "v1.33" for mode in ("enforce", "warn", "audit")}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def level(cluster: SlurmCluster) -> str:
    """The Pod Security level the cluster's namespace enforces."""
    return "privileged" if cluster.spec.slurm_config.cgroups else "baseline"


def cluster_namespace(cluster: SlurmCluster, nodes: Sequence[dict]) -> list[dict]:
    """The cluster's namespace and its rules; ``nodes``: the sandbox's Nodes (``SandboxNode`` fields)."""
    ns = cluster.namespace
    types = ["Ingress", "Egress"] if cluster.spec.network.egress else ["Ingress"]
    cpu = sum(quantity_value(n["cpu"]) for n in nodes)
    memory_gi = sum(quantity_value(n["memory"]) for n in nodes) / 2**30
    # Lent slurmd pods hold the GPUs they are lent in this namespace, and a pod that takes a
    # node back must be created while they still do: the GPUs of lendable nodes count twice.
    gpus = sum(n.get("gpus", 0) * (2 if (n.get("labels") or {}).get(LENDABLE) == "true" else 1) for n in nodes)
    hard = {"requests.cpu": f"{cpu:g}", "limits.cpu": f"{2 * cpu:g}",
            "requests.memory": f"{memory_gi:g}Gi", "limits.memory": f"{2 * memory_gi:g}Gi",
            "requests.nvidia.com/gpu": str(gpus), "pods": "100"}
    meta = {"namespace": ns, "labels": {"app.kubernetes.io/managed-by": "slurmk8s-sandbox"}}
    return [
        _namespace(ns, level(cluster)),
        {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
         "metadata": {"name": DEFAULT_DENY, **meta}, "spec": {"podSelector": {}, "policyTypes": types}},
        {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": QUOTA, **meta}, "spec": {"hard": hard}},
        {"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": LIMITS, **meta}, "spec": {"limits": [{
            "type": "Container",
            "default": {"cpu": "500m", "memory": "512Mi"},
            "defaultRequest": {"cpu": "100m", "memory": "128Mi"}}]}},
    ]


def release_namespace(name: str) -> list[dict]:
    """The namespace the chart installs the operator and the bridge into."""
    return [_namespace(name, "restricted")]
