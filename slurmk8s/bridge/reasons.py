"""Why a lent node is taken back: the reclaim reasons and their defaults. Pure.

The reason is written on the Node (``slurmk8s.dev/reclaim-reason``), quoted in
Events, and decides how the node's jobs are treated: a graceful reclaim
signals them and gives them the grace period; a failure leaves no time for a
checkpoint.
"""

from __future__ import annotations

from ..api.lending import LENDABLE_TO_LABEL, ReclaimSpec
from ..evacuation import DEFAULT_RETRY_SECONDS

__all__ = [
    "DEFAULT_RECLAIM", "DEFAULT_REGISTRATION_TIMEOUT", "FORCE_RETRY_SECONDS", "REASONS", "FAILURES", "SLURMD_GONE",
    "DEMAND", "UNSELECTED", "CORDONED", "WINDOW", "LIMITS", "PARTITION", "POLICY_GONE", "SLURMD_LOST",
    "SLURM_NODE_LOST", "SLURM_NODE_DOWN", "NODE_NOT_READY", "REGISTRATION_TIMEOUT", "UNLENDABLE", "CLUSTER_GONE",
    "CLUSTER_UNREADABLE", "WITHDRAWN", "UNHEALTHY", "FORECAST", "RECORD_UNREADABLE", "POD_DELETED",
]

#: Reclaim settings for nodes whose policy is gone.
DEFAULT_RECLAIM = ReclaimSpec()
DEFAULT_REGISTRATION_TIMEOUT = 600
#: Jobs still running this long after their requeue/cancel get it again.
FORCE_RETRY_SECONDS = DEFAULT_RETRY_SECONDS

DEMAND = "demand"
UNSELECTED = "unselected"
CORDONED = "cordoned"
WINDOW = "window"
LIMITS = "limits"
PARTITION = "partition"
POLICY_GONE = "policy-gone"
SLURMD_LOST = "slurmd-lost"
SLURM_NODE_LOST = "slurm-node-lost"
SLURM_NODE_DOWN = "slurm-node-down"
NODE_NOT_READY = "node-not-ready"
REGISTRATION_TIMEOUT = "registration-timeout"
UNLENDABLE = "unlendable"
CLUSTER_GONE = "cluster-gone"
CLUSTER_UNREADABLE = "cluster-unreadable"
WITHDRAWN = "withdrawn"
UNHEALTHY = "unhealthy"
FORECAST = "forecast"
RECORD_UNREADABLE = "record-unreadable"
POD_DELETED = "pod-deleted"

REASONS = {
    DEMAND: "pending GPU pods need the node",
    UNSELECTED: "the node no longer matches the policy's nodeSelector",
    CORDONED: "the node was cordoned",
    WINDOW: "outside the policy's lending windows",
    LIMITS: "maxLentNodes or minKubernetesNodes",
    PARTITION: "the policy now lends to another partition",
    POLICY_GONE: "the NodeLendingPolicy was deleted",
    SLURMD_LOST: "the node's slurmd pod is gone or failed",
    SLURM_NODE_LOST: "Slurm no longer knows the node",
    SLURM_NODE_DOWN: "Slurm reports the node DOWN or NOT_RESPONDING",
    NODE_NOT_READY: "the Kubernetes node is not Ready",
    REGISTRATION_TIMEOUT: "the node did not register with Slurm in time",
    UNLENDABLE: "the node cannot be described to Slurm",
    CLUSTER_GONE: "the SlurmCluster was deleted",
    CLUSTER_UNREADABLE: "the bridge cannot load the SlurmCluster (invalid, or written by a newer version)",
    WITHDRAWN: f"the node's {LENDABLE_TO_LABEL} label no longer names the policy's namespace",
    UNHEALTHY: "the node failed a health check (its Slurm node is drained 'slurmk8s: health: <check>')",
    FORECAST: "the forecast wants the node for Kubernetes within spec.forecast.headroomSeconds",
    POD_DELETED: ("the node's lent slurmd pod is being deleted (an eviction, a drain, kubectl delete); it waits "
                  "for its jobs within its termination grace"),
    RECORD_UNREADABLE: ("the node's lending record cannot be read (its slurmk8s.dev/lending label has a value the "
                        "bridge does not know, or its slurmk8s.dev/lending-policy or slurmk8s.dev/lending-cluster "
                        "annotation names no object as <namespace>/<name>)"),
}
#: Failures where the node's slurmd is gone: its jobs cannot end by
#: themselves, so the Slurm node is set DOWN, which ends them at once.
#: (A node Kubernetes reports not Ready is not one of them: it may be a
#: blip. It is reclaimed gracefully, and set DOWN only once it is lost:
#: ``verdicts.lost``.)
SLURMD_GONE = frozenset({SLURMD_LOST})
#: Reclaims where the jobs cannot be saved by a checkpoint signal: they are
#: requeued (or cancelled) at once.
FAILURES = frozenset({SLURMD_LOST, SLURM_NODE_LOST, SLURM_NODE_DOWN,
                      REGISTRATION_TIMEOUT, UNLENDABLE, CLUSTER_GONE})
