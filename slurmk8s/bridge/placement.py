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
from collections.abc import Iterable
from itertools import chain

from ..api.lending import ReclaimSpec
from .observed import KubeNode, KubePod
from .settings import Settings
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


class _Pool:
    """Nodes that can take pods now or soon, by free GPUs, each group in name
    order (so a node handed back this round is treated as it will be next
    round, as a Kubernetes node). Taking the first node of a group, the
    common case, costs O(1)."""

    def __init__(self, world: World, nodes: Iterable[KubeNode]):
        self.names: dict[int, list[str]] = defaultdict(list)
        #: free GPUs -> how many names at the start of the group are taken
        self.head: dict[int, int] = defaultdict(int)
        self.nodes: dict[str, KubeNode] = {}
        free_gpus = world.free_gpus
        for n in nodes:
            free = free_gpus(n)
            if free > 0 and n.ready and not n.unschedulable:
                self.names[free].append(n.name)
                self.nodes[n.name] = n
        for names in self.names.values():
            names.sort()

    def put(self, n: KubeNode, free: int) -> None:
        if free > 0:
            bisect.insort(self.names[free], n.name, lo=self.head[free])
            self.nodes[n.name] = n

    def take(self, pod: KubePod) -> tuple[KubeNode, int] | None:
        """The node that fits the pod best (fewest free GPUs, then name), taken out."""
        for free in sorted(k for k, names in self.names.items() if k >= pod.gpus and len(names) > self.head[k]):
            names, head = self.names[free], self.head[free]
            for i in range(head, len(names)):
                n = self.nodes[names[i]]
                if fits(pod, n):
                    if i == head:
                        self.head[free] = head + 1
                    else:
                        del names[i]
                    return n, free
        return None


def cover_demand(world: World, settings: Settings, kube: list[KubeNode], returning: list[KubeNode],
                 held: list[KubeNode]) -> tuple[set[str], list[KubePod], list[KubeNode]]:
    """Assign each triggering pending pod to a node that can take it: a free
    Kubernetes node, a node on its way back, or else the held node that is
    cheapest to give back (``held`` is in that order). Returns (Kubernetes
    nodes reserved for pods, pods nothing can take, held nodes to reclaim)."""
    pods = sorted((p for p in world.pending if triggers(p, settings.reclaim)),
                  key=lambda p: (-p.gpus, -p.priority, p.namespace, p.name))
    if not pods:
        return set(), [], []
    pool = _Pool(world, chain((n for n in kube if n.record.taint is None),
                              (n for n in returning if settings.selects(n))))  # as they will be next round
    candidates = [n for n in held if n.ready]
    reserved: set[str] = set()
    unmet: list[KubePod] = []
    chosen: list[KubeNode] = []
    for pod in pods:
        need = pod.gpus
        found = pool.take(pod)
        if found is not None:
            placed, free = found
            pool.put(placed, free - need)
            if placed.record.state is None:  # a Kubernetes node (not one on its way back)
                reserved.add(placed.name)
            continue
        for i, n in enumerate(candidates):
            free = world.free_gpus(n)  # once the slurmd pod is gone
            if free >= need and fits(pod, n):
                chosen.append(candidates.pop(i))
                pool.put(n, free - need)
                break
        else:
            unmet.append(pod)
    return reserved, unmet, chosen
