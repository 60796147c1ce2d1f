"""Where pending GPU pods could run, and which lent nodes they need back. Pure.

Pending pods that request ``nvidia.com/gpu``, that the scheduler marked
Unschedulable and that the policy's ``reclaim`` picks are placed, largest
first, on nodes that can take them: free GPUs on selected Kubernetes nodes
and on nodes already on their way back (best fit, respecting the pod's
``nodeSelector``). Only pods left over take held nodes, in the order given
(cheapest to give back first).
"""

from __future__ import annotations

import bisect
from collections import defaultdict

from ..api.lending import ReclaimSpec
from .observed import KubeNode, KubePod
from .plan import Plan
from .world import World

__all__ = ["fits", "triggers", "cover_demand"]


def fits(pod: KubePod, node: KubeNode) -> bool:
    """The node carries the labels the pod's nodeSelector asks for."""
    labels = node.labels
    return all(labels.get(k) == v for k, v in pod.node_selector.items())


def triggers(pod: KubePod, spec: ReclaimSpec) -> bool:
    """The policy's ``reclaim`` lets this pod take nodes back (every pod when
    neither podSelector nor minPriority is set)."""
    if spec.pod_selector is None and spec.min_priority is None:
        return True
    if spec.pod_selector is not None and spec.pod_selector.matches(pod.labels):
        return True
    return spec.min_priority is not None and pod.priority >= spec.min_priority


def cover_demand(world: World, plan: Plan, kube: list[KubeNode], returning: list[KubeNode],
                 held: list[KubeNode]) -> tuple[set[str], list[KubePod], list[KubeNode]]:
    """Assign each triggering pending pod to a node that can take it: a free
    Kubernetes node, a node on its way back, or else the held node that is
    cheapest to give back (``held`` is in that order). Returns (Kubernetes
    nodes reserved for pods, pods nothing can take, held nodes to reclaim)."""
    pods = sorted((p for p in world.pending if triggers(p, plan.reclaim)),
                  key=lambda p: (-p.gpus, -p.priority, p.namespace, p.name))
    if not pods:
        return set(), [], []
    # pool: free GPUs -> names of nodes that can take pods now or soon, in
    # name order (so a node handed back this round is treated as it will
    # be next round, as a Kubernetes node)
    pool: dict[int, list[str]] = defaultdict(list)
    nodes_by_name: dict[str, KubeNode] = {}

    def add(n: KubeNode, free: int) -> None:
        if free > 0:
            bisect.insort(pool[free], n.name)
            nodes_by_name[n.name] = n

    for n in kube:
        if n.ready and not n.unschedulable and n.record.taint is None:
            add(n, world.free_gpus(n))
    for n in returning:  # counted as they will be next round: selected nodes only
        if n.ready and not n.unschedulable and plan.selects(n):
            add(n, world.free_gpus(n))
    candidates = [n for n in held if n.ready]
    kube_names = {n.name for n in kube}
    reserved: set[str] = set()
    unmet: list[KubePod] = []
    chosen: list[KubeNode] = []
    for pod in pods:
        need = pod.gpus
        placed = None
        for free in sorted(k for k in pool if k >= need and pool[k]):  # best fit first
            bucket = pool[free]
            for i, name in enumerate(bucket):
                if fits(pod, nodes_by_name[name]):
                    placed = nodes_by_name[name]
                    del bucket[i]
                    add(placed, free - need)
                    break
            if placed is not None:
                break
        if placed is not None:
            if placed.name in kube_names:
                reserved.add(placed.name)
            continue
        for i, n in enumerate(candidates):
            free = world.free_gpus(n)  # once the slurmd pod is gone
            if free >= need and fits(pod, n):
                placed = candidates.pop(i)
                chosen.append(placed)
                add(placed, free - need)
                break
        if placed is None:
            unmet.append(pod)
    return reserved, unmet, chosen
