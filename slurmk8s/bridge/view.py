"""Where a round's Kubernetes input comes from: the bridge's view of the API.

Two views with one interface (what :class:`.loop.Bridge` reads):

- :class:`Watching` (what ``slurmk8s bridge`` runs, decision record 23):
  informers (:mod:`slurmk8s.informer`) keep Nodes, Pods, NodeLendingPolicies,
  SlurmClusters and PodDisruptionBudgets (the lent pods', decision record 49)
  in memory from watches, and wake the loop when something a decision depends
  on changes. Until every cache is synced (after the start,
  and after a 410 or a broken watch until the relist is in), ``not_synced``
  names them and the loop decides nothing.
- :class:`Listing`: reads everything from the API each round (decision
  record 8); for tests that drive rounds by hand, and API servers without watch.

Either way the state of every node is on the Node: a fresh view (a restarted
bridge) converges to the same decisions.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from operator import attrgetter
from typing import Any

from ..informer import Change, Informer, Store, object_key
from .nodestate import COMPONENT_LABEL, SLURMD_COMPONENT
from .observed import KubeBudget, KubeNode, KubePod, budget_from_api, node_from_api, pod_from_api

__all__ = ["Listing", "Watching", "relevant", "World", "WATCHED_KINDS"]

#: (raw Nodes by name, parsed Nodes, parsed Pods)
World = tuple[dict[str, dict], tuple[KubeNode, ...], tuple[KubePod, ...]]

#: The kinds the watching view keeps, and whether per watched namespace.
WATCHED_KINDS = (("Node", False), ("Pod", False), ("NodeLendingPolicy", True), ("SlurmCluster", True),
                 ("PodDisruptionBudget", True))
#: How each kind is kept: parsed (what a decision reads), or as the API gives it.
_PARSERS: dict[str, Callable[[Mapping[str, Any]], Any]] = {"PodDisruptionBudget": budget_from_api}


def _pod_matters(pod: KubePod | None) -> bool:
    return pod is not None and (pod.gpus > 0 or pod.labels.get(COMPONENT_LABEL) == SLURMD_COMPONENT)


def relevant(kind: str, change: Change | None) -> bool:
    """Whether a cache change may change a decision (and so wakes the loop).
    A list (``None``), any policy or cluster change, a Node or a
    PodDisruptionBudget whose parsed form changed (a budget created or
    deleted; not its status, which the disruption controller rewrites); a
    Pod only when it requests GPUs or is a lent slurmd pod, before or after.
    Status heartbeats and CPU pods do not wake it."""
    if change is None or kind in ("NodeLendingPolicy", "SlurmCluster"):
        return True
    if change.old == change.new:
        return False
    if kind == "Pod":
        return _pod_matters(change.old) or _pod_matters(change.new)
    return True


def _identity(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj


def _lent(budgets: Iterable[KubeBudget]) -> frozenset[tuple[str, str]]:
    return frozenset((b.namespace, b.name) for b in budgets if b.lent)


def _sleep_until(wake: threading.Event, timeout: float, stop: Callable[[], bool]) -> bool:
    """Wait up to ``timeout`` for ``wake``, checking ``stop`` every 0.2 s; True when woken."""
    import time

    deadline = time.monotonic() + max(timeout, 0)
    while not stop():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if wake.wait(min(0.2, left)):
            wake.clear()
            return True
    return False


class Listing:
    """Every read goes to the API server, each round."""

    def __init__(self, kube: Any, namespaces: Iterable[str] = ()):
        self.kube = kube
        self.namespaces = tuple(namespaces)
        self._never = threading.Event()

    def not_synced(self) -> list[str]:
        return []

    def policies(self) -> list[dict]:
        if not self.namespaces:
            return self.kube.list("NodeLendingPolicy")
        return [p for ns in self.namespaces for p in self.kube.list("NodeLendingPolicy", ns)]

    def world(self) -> World:
        node_objs = {n["metadata"]["name"]: n for n in self.kube.list("Node")}
        pods = tuple(pod_from_api(p) for p in self.kube.list("Pod"))
        return node_objs, tuple(node_from_api(n) for n in node_objs.values()), pods

    def budgets(self) -> frozenset[tuple[str, str]]:
        """(namespace, name) of the lent pods' PodDisruptionBudgets, in the watched namespaces."""
        found = self.kube.list("PodDisruptionBudget") if not self.namespaces else \
            [b for ns in self.namespaces for b in self.kube.list("PodDisruptionBudget", ns)]
        return _lent(budget_from_api(b) for b in found)

    def cluster(self, namespace: str, name: str) -> dict | None:
        return self.kube.get("SlurmCluster", namespace, name)

    def clusters(self, namespace: str | None) -> list[dict]:
        return self.kube.list("SlurmCluster", namespace)

    def wrote(self, obj: Mapping[str, Any]) -> None:
        """Our own write, as the server returned it (nothing to update here)."""

    def wait(self, timeout: float, stop: Callable[[], bool]) -> bool:
        """Sleep until the next round is due; nothing wakes it earlier."""
        return _sleep_until(self._never, timeout, stop)

    def close(self) -> None:
        pass


class Watching:
    """Informer-backed view; :meth:`start` lists and starts watching."""

    def __init__(self, kube: Any, namespaces: Iterable[str] = (), *, resync: float = 600.0,
                 watch_timeout: int = 300):
        self.kube = kube
        self.namespaces = tuple(namespaces)
        self._wake = threading.Event()
        self.nodes: Store[KubeNode] = Store(node_from_api, keep_raw=True)
        self.pods: Store[KubePod] = Store(pod_from_api, keep_raw=False)
        self.stores: dict[tuple[str, str | None], Store] = {("Node", None): self.nodes, ("Pod", None): self.pods}
        for kind, per_namespace in WATCHED_KINDS:
            if per_namespace:
                for ns in self.namespaces or (None,):
                    self.stores[(kind, ns)] = Store(_PARSERS.get(kind, _identity), keep_raw=False)
        self.informers = [
            Informer(kube, kind, ns, store, on_change=self._changed(kind), resync=resync,
                     watch_timeout=watch_timeout)
            for (kind, ns), store in self.stores.items()
        ]

    def _changed(self, kind: str) -> Callable[[Change | None], None]:
        def changed(change: Change | None) -> None:
            if relevant(kind, change):
                self._wake.set()
        return changed

    def start(self) -> Watching:
        for informer in self.informers:
            informer.start()
        return self

    def close(self) -> None:
        for informer in self.informers:
            informer.stop()

    def not_synced(self) -> list[str]:
        return [f"{kind}/{ns}" if ns else kind for (kind, ns), s in self.stores.items() if not s.synced]

    def _of(self, kind: str) -> list[Store]:
        return [s for (k, _), s in self.stores.items() if k == kind]

    def policies(self) -> list[dict]:
        return sorted((dict(p) for s in self._of("NodeLendingPolicy") for p in s.values()), key=object_key)

    def world(self) -> World:
        node_objs = {k: dict(v) for k, v in sorted(self.nodes.raw().items())}
        nodes = tuple(sorted(self.nodes.values(), key=attrgetter("name")))
        pods = tuple(sorted(self.pods.values(), key=attrgetter("namespace", "name")))
        return node_objs, nodes, pods

    def budgets(self) -> frozenset[tuple[str, str]]:
        """(namespace, name) of the lent pods' PodDisruptionBudgets, from the caches."""
        return _lent(b for s in self._of("PodDisruptionBudget") for b in s.values())

    def _covers(self, namespace: str) -> bool:
        return not self.namespaces or namespace in self.namespaces

    def cluster(self, namespace: str, name: str) -> dict | None:
        if not self._covers(namespace):  # not watched here: ask
            return self.kube.get("SlurmCluster", namespace, name)
        for store in self._of("SlurmCluster"):
            obj = store.get(f"{namespace}/{name}")
            if obj is not None:
                return dict(obj)
        return None

    def clusters(self, namespace: str | None) -> list[dict]:
        found = [dict(c) for s in self._of("SlurmCluster") for c in s.values()]
        return sorted((c for c in found if namespace is None or c["metadata"].get("namespace") == namespace),
                      key=object_key)

    def wrote(self, obj: Mapping[str, Any]) -> None:
        """Our own write shows in the cache at once, so the next round does not act on what it already did."""
        kind = obj.get("kind")
        if kind == "Node" or (kind is None and not (obj.get("metadata") or {}).get("namespace")):
            self.nodes.write_through(obj)
        elif kind == "Pod":
            self.pods.write_through(obj)
        elif kind == "PodDisruptionBudget":
            ns = (obj.get("metadata") or {}).get("namespace")
            store = self.stores.get((kind, ns)) or self.stores.get((kind, None))
            if store is not None:
                store.write_through(obj)

    def wait(self, timeout: float, stop: Callable[[], bool]) -> bool:
        """Sleep until the next round is due or a relevant change arrives (True)."""
        return _sleep_until(self._wake, timeout, stop)
