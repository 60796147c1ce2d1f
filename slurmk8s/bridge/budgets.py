"""The lent slurmd pod's PodDisruptionBudget: there while Slurm runs jobs on the node. Pure.

A held node of the policy's SlurmCluster whose own lent slurmd pod runs
(Running, not being deleted) and on which Slurm shows a job (any active state)
has a budget (``render.slurmd.lent_budget``: the pod's name, maxUnavailable
0 over that one pod, owned by it); any other has none. So an eviction
(``kubectl drain``, a node-pool upgrade, the cluster autoscaler) of a pod
that runs jobs is refused (429) until the bridge took the node back through
Slurm: the drain's cordon is a reclaim (``cordoned``: signal, grace period,
requeue), and once no job is left the budget goes, or the pod itself when
the node is handed back (:func:`.transitions.hand_back` deletes its budget
too, last in the chain: a budget that cannot be deleted keeps no node from
its owner, and goes with its pod anyway). An idle lent node has no budget: a
drain takes it at once, and a bridge that is down holds up no drain of an
idle node. Decision record 49.

Fail closed: when Slurm cannot be read, or the budgets were not observed
(``Observed.budgets`` None), no budget is created or deleted. A pod lent by
a version without the ``slurmk8s.dev/lent-node`` label gets none (no budget
could select it); deleted, it still has its node taken back gracefully
(``pod-deleted``), within its own termination grace.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..render import names
from .actions import CreateBudget, DeleteBudget
from .observed import KubeNode, KubePod
from .settings import Round, Settings
from .verdicts import pod_of
from .world import World

__all__ = ["keep_budgets", "budget_key", "wants_budget", "dropped_budgets"]


def budget_key(namespace: str, cluster: str, node: str) -> tuple[str, str]:
    """(namespace, name) of the budget of ``node`` lent to ``cluster`` of ``namespace``."""
    return namespace, names.lent_budget(cluster, node)


def wants_budget(world: World, node: KubeNode, pod: KubePod | None) -> bool:
    """The node's lent pod (``pod``) runs (an eviction takes a Pending pod
    whatever its budget says), is not being deleted, can be selected by a
    budget, and Slurm shows a job on the node."""
    return (pod is not None and not pod.deleting and pod.phase == "Running"
            and pod.labels.get(names.LENT_NODE_LABEL) == names.lent_node_label(node.name)
            and bool(world.jobs_on(node.name)))


def keep_budgets(r: Round, world: World, settings: Settings, mine: Iterable[KubeNode]) -> None:
    """Create or delete the budgets of the policy's held nodes lent to its
    SlurmCluster, as :func:`wants_budget` says. Nodes handed back this round
    (their state projected None) are :func:`dropped_budgets`' to deal with."""
    have = world.observed.budgets
    if have is None or not world.slurm_known or settings.cluster is None:
        return
    for n in mine:
        if n.record.cluster != settings.cluster_key or r.projected.get(n.name, n.record.state) is None:
            continue
        pod = pod_of(world, settings, n)
        key = budget_key(settings.namespace, settings.cluster_name, n.name)
        if wants_budget(world, n, pod) and key not in have:
            assert pod is not None
            r.emit(CreateBudget(settings.cluster_key, n.name, pod.uid))
        elif not wants_budget(world, n, pod) and key in have:
            r.emit(DeleteBudget(*key, n.name))


def dropped_budgets(world: World, node: KubeNode, pods: Iterable[KubePod]) -> list[DeleteBudget]:
    """The budgets to delete with the lent pods ``pods`` of ``node`` handed back
    (those observed): a budget has its pod's name (``names.lent_budget``)."""
    have = world.observed.budgets or frozenset()
    return [DeleteBudget(pod.namespace, pod.name, node.name) for pod in pods if (pod.namespace, pod.name) in have]
