"""A node that runs the SlurmCluster's own pods is not lent to it. Pure.

The operator's renderer gives every pod of a SlurmCluster (its controller,
login, workers, slurmdbd, database, slurmrestd) the labels
``slurmk8s.dev/cluster=<name>`` and
``app.kubernetes.io/managed-by=slurmk8s-operator``; the one reading of them
is :func:`slurmk8s.render.names.rendered_for`. A lent slurmd pod is the
bridge's (``managed-by=slurmk8s-bridge``), not one of these.

A Kubernetes node where such a pod of the policy's SlurmCluster runs (bound
to it, not ended) is not lent to that cluster (:func:`cluster_pods_on`;
``choose.idle_candidates`` reports it as blocked). Lending it would tie the
two together: a drain or loss of the node would take the cluster's own
controller (whose agent the bridge's graceful reclaim goes through) or its
workers away with the lent node, and Slurm would count one host as two of
its nodes (its worker and the lent node) for multi-node jobs. A pod of
another SlurmCluster is an ordinary Kubernetes pod to this one: the node
lends what its pods leave (decision record 32). Decision record 49.

Only lending looks at this. A node already held when such a pod arrives
(a race with the scheduler, or a pod that tolerates the lending taint)
stays lent: the operator does not take the lending taint for maintenance,
so the pod keeps its jobs.

Anyone who may create pods in the cluster's namespace can put these labels
on a pod; that keeps a node from being lent, as any GPU pod there would,
and no more.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .observed import KubeNode
    from .settings import Settings
    from .world import World

__all__ = ["cluster_pods_on", "blocked_reason"]


def cluster_pods_on(world: World, settings: Settings, node: KubeNode) -> int:
    """How many pods of the policy's SlurmCluster run on ``node`` (in its namespace)."""
    namespace, _, name = settings.cluster_key.partition("/")
    return world.cluster_pods.get((node.name, namespace, name), 0)


def blocked_reason(world: World, settings: Settings, node: KubeNode) -> str | None:
    """Why ``node`` is not lent by this rule (for the policy's status), or None."""
    count = cluster_pods_on(world, settings, node)
    if not count:
        return None
    return (f"{node.name} (runs {count} pod(s) of SlurmCluster {settings.cluster_key}: a node is not lent to "
            "the cluster whose own pods run there)")
