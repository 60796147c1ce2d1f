"""Whether a lending or lent node stays, and if not, why. Pure.

One function per question the state machine asks of a held node: is its
slurmd registered, has it failed, did its owner withdraw it, must it go back
to Kubernetes gracefully, is it lost for good. Each answers from the indexed
world (:mod:`.world`) and the policy (:mod:`.settings`) only.
"""

from __future__ import annotations

from datetime import timedelta

from ..api.lending import may_lend
from ..render.lent import UnlendableNode
from ..slurm.model import Node, unhealthy
from .nodestate import LENDING
from .observed import KubeNode, KubePod
from .reasons import (
    CORDONED,
    NODE_NOT_READY,
    PARTITION,
    POD_DELETED,
    REGISTRATION_TIMEOUT,
    SLURM_NODE_DOWN,
    SLURM_NODE_LOST,
    SLURMD_LOST,
    UNHEALTHY,
    UNLENDABLE,
    UNSELECTED,
    WINDOW,
    WITHDRAWN,
)
from .settings import Settings
from .world import World

__all__ = ["pod_of", "pods_of", "registered", "lost", "failure", "withdrawn", "must_go"]

#: Slurm node states in which a node takes jobs.
_SERVING = frozenset({"idle", "mixed", "allocated"})


def pod_of(world: World, settings: Settings, node: KubeNode) -> KubePod | None:
    """The node's lent slurmd pod, if it exists (named after the cluster it was lent to)."""
    cluster = node.record.cluster.split("/")[-1] if node.record.cluster else settings.cluster_name
    return world.slurmd_pod(settings.namespace, cluster, node.name)


def pods_of(world: World, settings: Settings, node: KubeNode) -> list[KubePod]:
    """The lent slurmd pods to delete when the node goes back: its own
    (:func:`pod_of`); for a node whose record names no SlurmCluster that can
    be read, every pod on it that is some cluster's lent slurmd pod, in the
    namespaces the bridge serves (:meth:`.World.lent_pods_on`)."""
    if settings.unattributed is not None and settings.unattributed.cluster is None:
        return world.lent_pods_on(node.name, settings.unattributed.namespaces)
    pod = pod_of(world, settings, node)
    return [] if pod is None else [pod]


def registered(world: World, settings: Settings, node: KubeNode) -> bool:
    """Slurm has a node of that name, responding, in the partition."""
    s = world.slurm_nodes.get(node.name)
    partition = settings.policy.spec.partition if settings.policy else node.record.partition
    return s is not None and s.state in _SERVING and s.responding and partition in s.partitions


def lost(world: World, settings: Settings, node: KubeNode) -> bool:
    """The node is gone for good, as far as anyone can tell: Kubernetes has
    reported it not Ready for the policy's notReadyTimeoutSeconds and
    Slurm reports it NOT_RESPONDING. Not knowing since when is not lost."""
    if node.ready or node.not_ready_since is None:
        return False
    snode = world.slurm_nodes.get(node.name)
    if snode is None or "NOT_RESPONDING" not in snode.flags:
        return False
    return settings.now - node.not_ready_since >= timedelta(seconds=settings.reclaim.not_ready_timeout_seconds)


def failure(world: World, settings: Settings, node: KubeNode) -> str | None:
    """A reason to take the node back, or None: a failure (in FAILURES)
    leaves no time for a checkpoint; a node that is not Ready is given
    back gracefully (and set DOWN later if it is :func:`lost`), and so is a
    lent node whose slurmd pod is being deleted but still runs (its
    entrypoint drains and waits while jobs run, within a termination grace
    that covers the policy's grace period: ``render.slurmd.termination_grace``)."""
    rec = node.record
    if not node.ready:
        return NODE_NOT_READY
    pod = pod_of(world, settings, node)
    snode = world.slurm_nodes.get(node.name)
    if rec.state == LENDING:
        if pod is not None and (pod.terminal or pod.deleting):
            return SLURMD_LOST
        if pod is None and snode is not None:
            return SLURMD_LOST
        since = rec.since or settings.now
        overdue = settings.now - since > timedelta(seconds=settings.registration_timeout)
        if overdue and not registered(world, settings, node):
            return REGISTRATION_TIMEOUT
        if pod is None and settings.policy is not None:
            try:
                settings.describe(node, world.lendable(node))
            except UnlendableNode:
                return UNLENDABLE
        return None
    # lent
    if pod is None or pod.terminal:
        return SLURMD_LOST
    if snode is None:
        return SLURM_NODE_LOST
    if snode.state != "unknown" and (snode.state == "down" or "NOT_RESPONDING" in snode.flags):
        return SLURM_NODE_DOWN
    if pod.deleting:
        return POD_DELETED  # Kubernetes wants the pod gone; its slurmd still answers for the jobs
    return None  # (a node Slurm shows in state unknown has not answered yet: no verdict)


def withdrawn(settings: Settings, node: KubeNode) -> str | None:
    """The node's owner no longer lets the policy's namespace lend it."""
    if settings.policy is not None and not may_lend(settings.policy.namespace, node.labels):
        return WITHDRAWN
    return None


def must_go(settings: Settings, node: KubeNode, window_open: bool, snode: Node | None = None) -> str | None:
    """A reason to give the node back gracefully (signal, grace, jobAction), or
    None. ``snode``: the node as Slurm shows it (a health check's drain)."""
    policy = settings.policy
    if policy is None:
        return settings.gone_reason
    if node.record.partition != policy.spec.partition:
        return PARTITION
    if not settings.selects(node):
        return UNSELECTED
    if node.unschedulable:
        return CORDONED
    if snode is not None and snode.name in unhealthy([snode]):
        return UNHEALTHY
    if not window_open:
        return WINDOW
    return None
