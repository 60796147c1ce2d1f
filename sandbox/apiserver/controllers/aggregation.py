"""The clusterrole-aggregation controller, as Kubernetes' controller manager
runs it: a ClusterRole with an ``aggregationRule`` gets, as its own ``rules``,
the rules of the ClusterRoles its selectors match, recomputed whenever any
ClusterRole is created, changed or deleted (:func:`..rbac.aggregated_rules`,
pure). The authorizer reads only stored rules, so what ``admin``, ``edit``
and ``view`` grant is what this controller last wrote."""

from __future__ import annotations

import copy
from collections.abc import Hashable, Iterable

from ..api import Options
from ..rbac import aggregated_rules
from ..store import Event, Storage
from .base import Controller
from .util import name

CLUSTERROLES: Storage = ("rbac.authorization.k8s.io", "clusterroles")
FIELD_MANAGER = "clusterrole-aggregation-controller"


class ClusterRoleAggregation(Controller):
    """Keeps every aggregated ClusterRole's rules equal to what its selectors gather."""

    name = "clusterrole-aggregation"
    watches = (CLUSTERROLES,)

    def _aggregated(self) -> list[str]:
        return [name(cr) for cr in self.api.store.list(CLUSTERROLES) if cr.get("aggregationRule") is not None]

    def keys_for(self, ev: Event) -> Iterable[Hashable]:
        # As Kubernetes does: the set of ClusterRoles is small and the graph of
        # who selects whom unknown, so any change requeues every aggregated one.
        return self._aggregated()

    def initial_keys(self) -> Iterable[Hashable]:
        return self._aggregated()

    def reconcile(self, key: Hashable) -> float | None:
        store = self.api.store
        current = store.get(CLUSTERROLES, "", str(key))
        if current is None:
            return None
        wanted = aggregated_rules(current, store.list(CLUSTERROLES))
        if wanted is None or wanted == list(current.get("rules") or ()):
            return None
        rt = self.api.registry.by_storage(CLUSTERROLES)
        if rt is None:
            return None
        body = copy.deepcopy(current)
        body["rules"] = copy.deepcopy(wanted)
        self.api.update(rt, "", str(key), body, Options(field_manager=FIELD_MANAGER), old=current)
        return None
