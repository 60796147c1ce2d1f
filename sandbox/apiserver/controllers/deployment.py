"""Deployments through ReplicaSets, as Kubernetes runs them.

A Deployment owns one ReplicaSet per pod template, named
``<deployment>-<pod-template-hash>``; RollingUpdate moves replicas from the old
ReplicaSets to the new one within maxSurge/maxUnavailable, Recreate scales the
old ones to zero first. A ReplicaSet keeps ``replicas`` pods named
``<replicaset>-<random>``. :func:`rollout` and :func:`pods_to_delete` are pure.
"""

from __future__ import annotations

import copy
from collections.abc import Hashable, Iterable

from .. import timeutil
from ..api import DeleteOptions, Options
from ..errors import APIError
from ..store import Event, meta
from .base import Controller
from .events import Recorder
from .util import (
    DEPLOYMENTS,
    PODS,
    REPLICASETS,
    controller_of,
    deleting,
    name,
    namespace,
    owned_by,
    owner_ref,
    pod_active,
    pod_available,
    pod_ready,
    resolve_int_or_percent,
    set_condition,
    template_hash,
    uid,
)

HASH_LABEL = "pod-template-hash"
REVISION = "deployment.kubernetes.io/revision"


# --- ReplicaSet ---------------------------------------------------------------------


def pods_to_delete(pods: list[dict], count: int) -> list[dict]:
    """Which pods a ReplicaSet removes first: unscheduled, then pending, then not
    ready, then the newest."""
    phase_rank = {"Pending": 0, "Unknown": 1, "Running": 2}

    def rank(p: dict):
        st = p.get("status") or {}
        return (
            1 if (p.get("spec") or {}).get("nodeName") else 0,
            phase_rank.get(st.get("phase", "Pending"), 0),
            1 if pod_ready(p) else 0,
            [-ord(c) for c in meta(p).get("creationTimestamp", "")],
        )

    return sorted(pods, key=rank)[:count]


class ReplicaSets(Controller):
    name = "replicaset-controller"
    watches = (REPLICASETS, PODS)

    def keys_for(self, ev: Event) -> Iterable[Hashable]:
        if ev.storage == REPLICASETS:
            yield (namespace(ev.obj), name(ev.obj))
            return
        ref = controller_of(ev.obj)
        if ref and ref.get("kind") == "ReplicaSet":
            yield (namespace(ev.obj), ref.get("name"))

    def initial_keys(self) -> Iterable[Hashable]:
        return [(namespace(r), name(r)) for r in self.api.store.list(REPLICASETS)]

    def reconcile(self, key) -> float | None:
        ns, rname = key
        api = self.api
        rs = api.store.get(REPLICASETS, ns, rname)
        if rs is None:
            return None
        spec = rs.get("spec") or {}
        pods = owned_by(api.store.list(PODS, ns), uid(rs))
        active = [p for p in pods if pod_active(p)]
        want = int(spec.get("replicas", 1))
        pod_rt = api.resource("", "v1", "pods")
        if not deleting(rs):
            if len(active) < want:
                tpl = copy.deepcopy(spec.get("template") or {})
                tmeta = tpl.get("metadata") or {}
                for _ in range(want - len(active)):
                    pod_meta = {"generateName": f"{rname}-", "namespace": ns, "labels": dict(tmeta.get("labels") or {}),
                                "ownerReferences": [owner_ref(rs)]}
                    if tmeta.get("annotations"):
                        pod_meta["annotations"] = dict(tmeta["annotations"])
                    try:
                        api.create(pod_rt, ns, {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta,
                                                "spec": copy.deepcopy(tpl.get("spec") or {})},
                                   Options(field_manager=self.name))
                    except APIError as e:
                        Recorder(api, self.name).event(rs, "Warning", "FailedCreate", f"Error creating: {e.message}")
                        raise
            elif len(active) > want:
                for p in pods_to_delete(active, len(active) - want):
                    try:
                        api.delete(pod_rt, ns, name(p), DeleteOptions(propagation="Background"))
                    except APIError as e:
                        if e.code != 404:
                            raise
        pods = owned_by(api.store.list(PODS, ns), uid(rs))
        active = [p for p in pods if pod_active(p)]
        min_ready = int(spec.get("minReadySeconds") or 0)
        labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
        status = {
            "replicas": len(active),
            "fullyLabeledReplicas": sum(1 for p in active if all((meta(p).get("labels") or {}).get(k) == v for k, v in labels.items())),
            "readyReplicas": sum(1 for p in active if pod_ready(p)),
            "availableReplicas": sum(1 for p in active if pod_available(p, min_ready)),
            "observedGeneration": meta(rs).get("generation", 1),
        }
        current = api.store.get(REPLICASETS, ns, rname)
        if current is not None:
            api.write_status(api.resource("apps", "v1", "replicasets"), current, status, self.name)
        if min_ready and status["availableReplicas"] < status["readyReplicas"]:
            return float(min_ready)
        return None


# --- Deployment -----------------------------------------------------------------------


def _replicas(rs: dict) -> int:
    return int((rs.get("spec") or {}).get("replicas", 0))


def _available(rs: dict) -> int:
    return int((rs.get("status") or {}).get("availableReplicas", 0))


def rollout(deployment: dict, new: dict, old: list[dict]) -> dict[str, int]:
    """New ``spec.replicas`` per ReplicaSet name (only those that change)."""
    spec = deployment.get("spec") or {}
    want = int(spec.get("replicas", 1))
    strategy = spec.get("strategy") or {}
    sizes = {name(rs): _replicas(rs) for rs in [new, *old]}
    if strategy.get("type") == "Recreate":
        for rs in old:
            sizes[name(rs)] = 0
        old_pods = sum(int((rs.get("status") or {}).get("replicas", 0)) for rs in old)
        if old_pods == 0 and all(_replicas(rs) == 0 for rs in old):
            sizes[name(new)] = want
        return {k: v for k, v in sizes.items() if v != _replicas(next(r for r in [new, *old] if name(r) == k))}
    ru = strategy.get("rollingUpdate") or {}
    surge = resolve_int_or_percent(ru.get("maxSurge", "25%"), want, True)
    unavailable = resolve_int_or_percent(ru.get("maxUnavailable", "25%"), want, False)
    if surge == 0 and unavailable == 0:
        unavailable = 1
    # scale up the new ReplicaSet within the surge
    total = sum(sizes.values())
    if sizes[name(new)] < want:
        room = want + surge - total
        if room > 0:
            sizes[name(new)] += min(room, want - sizes[name(new)])
    elif sizes[name(new)] > want:
        sizes[name(new)] = want
    # scale down old ones without going below the availability floor
    min_available = want - unavailable
    new_unavailable = sizes[name(new)] - _available(new)
    max_down = sum(sizes.values()) - min_available - new_unavailable
    olds = sorted(old, key=lambda r: meta(r).get("creationTimestamp", ""))
    if max_down > 0:
        cleaned = 0
        for rs in olds:  # unhealthy old replicas first
            n = sizes[name(rs)]
            unhealthy = n - _available(rs)
            if n == 0 or unhealthy <= 0 or cleaned >= max_down:
                continue
            down = min(max_down - cleaned, unhealthy)
            sizes[name(rs)] -= down
            cleaned += down
        available = sum(_available(rs) for rs in [new, *old])
        budget = available - min_available
        scaled = 0
        for rs in olds:
            if budget - scaled <= 0:
                break
            n = sizes[name(rs)]
            if n == 0:
                continue
            down = min(n, budget - scaled)
            sizes[name(rs)] -= down
            scaled += down
    current = {name(r): _replicas(r) for r in [new, *old]}
    return {k: v for k, v in sizes.items() if v != current[k]}


def _template_without_hash(rs: dict) -> dict:
    tpl = copy.deepcopy((rs.get("spec") or {}).get("template") or {})
    labels = (tpl.get("metadata") or {}).get("labels")
    if isinstance(labels, dict):
        labels.pop(HASH_LABEL, None)
    return tpl


class Deployments(Controller):
    name = "deployment-controller"
    watches = (DEPLOYMENTS, REPLICASETS)

    def keys_for(self, ev: Event) -> Iterable[Hashable]:
        if ev.storage == DEPLOYMENTS:
            yield (namespace(ev.obj), name(ev.obj))
            return
        ref = controller_of(ev.obj)
        if ref and ref.get("kind") == "Deployment":
            yield (namespace(ev.obj), ref.get("name"))

    def initial_keys(self) -> Iterable[Hashable]:
        return [(namespace(d), name(d)) for d in self.api.store.list(DEPLOYMENTS)]

    def reconcile(self, key) -> float | None:
        ns, dname = key
        api = self.api
        d = api.store.get(DEPLOYMENTS, ns, dname)
        if d is None or deleting(d):
            return None
        spec = d.get("spec") or {}
        rs_rt = api.resource("apps", "v1", "replicasets")
        opts = Options(field_manager=self.name)
        owned = owned_by(api.store.list(REPLICASETS, ns), uid(d))
        template = spec.get("template") or {}
        new = next((rs for rs in owned if _template_without_hash(rs) == template), None)
        revisions = [int((meta(rs).get("annotations") or {}).get(REVISION, "0") or 0) for rs in owned]
        if spec.get("paused"):
            return None
        if new is None:
            h = template_hash(template, int((d.get("status") or {}).get("collisionCount") or 0))
            tpl = copy.deepcopy(template)
            tpl.setdefault("metadata", {}).setdefault("labels", {})[HASH_LABEL] = h
            selector = copy.deepcopy(spec.get("selector") or {})
            selector.setdefault("matchLabels", {})[HASH_LABEL] = h
            recreate = (spec.get("strategy") or {}).get("type") == "Recreate"
            start = 0 if (owned and (recreate or any(_replicas(r) for r in owned))) else int(spec.get("replicas", 1))
            body = {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "metadata": {
                    "name": f"{dname}-{h}",
                    "namespace": ns,
                    "labels": dict(tpl["metadata"]["labels"]),
                    "annotations": {REVISION: str(max(revisions, default=0) + 1),
                                    "deployment.kubernetes.io/desired-replicas": str(spec.get("replicas", 1))},
                    "ownerReferences": [owner_ref(d)],
                },
                "spec": {"replicas": start, "selector": selector, "template": tpl,
                         "minReadySeconds": int(spec.get("minReadySeconds") or 0)},
            }
            try:
                api.create(rs_rt, ns, body, opts)
            except APIError as e:
                if e.code == 409:  # a ReplicaSet of that name with another template: count a collision
                    status = copy.deepcopy(d.get("status") or {})
                    status["collisionCount"] = int(status.get("collisionCount") or 0) + 1
                    api.write_status(api.resource("apps", "v1", "deployments"), d, status, self.name)
                    return 0
                raise
            owned = owned_by(api.store.list(REPLICASETS, ns), uid(d))
            new = next(rs for rs in owned if _template_without_hash(rs) == template)
        old = [rs for rs in owned if name(rs) != name(new)]
        for rs_name, size in rollout(d, new, old).items():
            rs = api.store.get(REPLICASETS, ns, rs_name)
            if rs is None:
                continue
            body = copy.deepcopy(rs)
            body["spec"]["replicas"] = size
            if rs_name == name(new):
                body["metadata"].setdefault("annotations", {})["deployment.kubernetes.io/desired-replicas"] = str(spec.get("replicas", 1))
            api.update(rs_rt, ns, rs_name, body, opts, old=rs)
        # keep revisionHistoryLimit old, empty ReplicaSets
        limit = int(spec.get("revisionHistoryLimit", 10))
        empty = sorted((rs for rs in old if _replicas(api.store.get(REPLICASETS, ns, name(rs)) or rs) == 0
                        and int((rs.get("status") or {}).get("replicas", 0)) == 0),
                       key=lambda r: int((meta(r).get("annotations") or {}).get(REVISION, "0") or 0))
        for rs in empty[: max(0, len(empty) - limit)]:
            api.delete(rs_rt, ns, name(rs), DeleteOptions(propagation="Background"))
        self._status(d, new, old)
        return None

    def _status(self, d: dict, new: dict, old: list[dict]) -> None:
        api = self.api
        ns = namespace(d)
        new = api.store.get(REPLICASETS, ns, name(new)) or new
        old = [api.store.get(REPLICASETS, ns, name(r)) or r for r in old]
        spec = d.get("spec") or {}
        want = int(spec.get("replicas", 1))
        all_rs = [new, *old]
        st = lambda rs, k: int((rs.get("status") or {}).get(k, 0))  # noqa: E731 - a one-line accessor
        replicas = sum(st(rs, "replicas") for rs in all_rs)
        available = sum(st(rs, "availableReplicas") for rs in all_rs)
        ready = sum(st(rs, "readyReplicas") for rs in all_rs)
        updated = st(new, "replicas")
        ru = (spec.get("strategy") or {}).get("rollingUpdate") or {}
        max_unavailable = resolve_int_or_percent(ru.get("maxUnavailable", "25%"), want, False) if ru else 0
        now = timeutil.rfc3339()
        old_status = d.get("status") or {}
        conds = old_status.get("conditions") or []
        if available >= want - max_unavailable:
            conds = set_condition(conds, {"type": "Available", "status": "True", "lastUpdateTime": now, "lastTransitionTime": now,
                                          "reason": "MinimumReplicasAvailable", "message": "Deployment has minimum availability."})
        else:
            conds = set_condition(conds, {"type": "Available", "status": "False", "lastUpdateTime": now, "lastTransitionTime": now,
                                          "reason": "MinimumReplicasUnavailable", "message": "Deployment does not have minimum availability."})
        complete = updated == want and replicas == want and available == want and st(new, "observedGeneration") >= int(meta(new).get("generation", 1))
        if complete:
            conds = set_condition(conds, {"type": "Progressing", "status": "True", "lastUpdateTime": now, "lastTransitionTime": now,
                                          "reason": "NewReplicaSetAvailable", "message": f'ReplicaSet "{name(new)}" has successfully progressed.'})
        else:
            conds = set_condition(conds, {"type": "Progressing", "status": "True", "lastUpdateTime": now, "lastTransitionTime": now,
                                          "reason": "ReplicaSetUpdated", "message": f'ReplicaSet "{name(new)}" is progressing.'})
        status = {
            "observedGeneration": meta(d).get("generation", 1),
            "replicas": replicas,
            "updatedReplicas": updated,
            "readyReplicas": ready,
            "availableReplicas": available,
            "unavailableReplicas": max(0, want - available) if replicas or want else 0,
            "conditions": conds,
        }
        if old_status.get("collisionCount"):
            status["collisionCount"] = old_status["collisionCount"]
        for k in ("replicas", "updatedReplicas", "readyReplicas", "availableReplicas", "unavailableReplicas"):
            if not status[k]:
                del status[k]
        dep_rt = api.resource("apps", "v1", "deployments")
        current = api.store.get(DEPLOYMENTS, ns, name(d))
        if current is None:
            return
        revision = (meta(new).get("annotations") or {}).get(REVISION)
        if revision and (meta(current).get("annotations") or {}).get(REVISION) != revision:
            body = copy.deepcopy(current)
            body["metadata"].setdefault("annotations", {})[REVISION] = revision
            current = api.update(dep_rt, ns, name(d), body, Options(field_manager=self.name), old=current)
            current = api.store.get(DEPLOYMENTS, ns, name(d)) or current
        api.write_status(dep_rt, current, status, self.name)
