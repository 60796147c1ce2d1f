"""Desired objects and observed objects in, a plan out. Pure: no I/O, no clock.

``desired`` is what :func:`slurmk8s.render.render` returns for a cluster (with
the replica counts the scale-in decision allows, :func:`with_replicas`);
``observed`` is what the API server holds in the cluster's namespace with the
cluster's label. The plan says what to create, what to update and what to
delete, and nothing else:

- *update* only when a field we render differs from the observed object.
  Fields the server or other controllers set (status, uid, defaults such as a
  container's terminationMessagePath, clusterIP) are not compared, and
  quantities compare by value (``0.5`` equals ``500m``).
- Objects marked create-only (the key Secrets) are created once and never
  updated or deleted: replacing a key would cut every node off.
- *delete* only objects labelled as ours for this cluster that are no longer
  desired, of a kind we render, not being deleted already, not held by the
  caller (node sets still being drained), and for claims only those whose
  deletion policy says Delete. Objects we did not render (pods, the
  controller's state claim) are never deleted.

Applying the plan and observing the result yields an empty plan.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slurmk8s.api.fields import parse_quantity
from slurmk8s.render import names

from .workers import NodeSetState

__all__ = [
    "MANAGED_KINDS", "Key", "Create", "Update", "Delete", "Plan", "plan", "key", "differences",
    "is_ours", "create_only", "with_replicas", "held_objects", "removed_scales",
]

#: Kinds the renderer produces, in the order they are created.
MANAGED_KINDS = (
    "ConfigMap", "Secret", "PersistentVolumeClaim", "Service", "StatefulSet", "Deployment",
    "PodDisruptionBudget", "NetworkPolicy",
)
#: Under these keys strings are Kubernetes quantities (an emptyDir: its sizeLimit).
_QUANTITY_PARENTS = frozenset({"requests", "limits", "capacity", "emptyDir"})

Key = tuple[str, str]  # (kind, name) in the cluster's namespace


def key(obj: Mapping) -> Key:
    return obj["kind"], obj["metadata"]["name"]


@dataclass(frozen=True)
class Create:
    obj: dict

    @property
    def key(self) -> Key:
        return key(self.obj)


@dataclass(frozen=True)
class Update:
    obj: dict
    #: Paths of the rendered fields that differ, e.g. ``spec.replicas``.
    changed: tuple[str, ...]

    @property
    def key(self) -> Key:
        return key(self.obj)


@dataclass(frozen=True)
class Delete:
    api_version: str
    kind: str
    namespace: str
    name: str
    #: The observed object's uid: the delete is refused if the name now belongs to another object.
    uid: str | None

    @property
    def key(self) -> Key:
        return self.kind, self.name


@dataclass(frozen=True)
class Plan:
    creates: tuple[Create, ...] = ()
    updates: tuple[Update, ...] = ()
    deletes: tuple[Delete, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.creates or self.updates or self.deletes)

    def __iter__(self) -> Iterator[Create | Update | Delete]:
        yield from self.creates
        yield from self.updates
        yield from self.deletes


def _same_quantity(desired: Any, observed: Any) -> bool:
    try:
        return parse_quantity(str(desired)) == parse_quantity(str(observed))
    except (ValueError, TypeError):
        return False


def differences(desired: Any, observed: Any, path: str = "", quantities: bool = False) -> list[str]:
    """Paths where ``desired`` is not contained in ``observed``.

    Maps: every desired key must be present with a contained value (extra
    observed keys are fine: the server's). Lists: the same length, each item
    contained in the observed item at the same index (lists we render are
    ours in full). Scalars: equal; in ``requests``/``limits`` maps, equal as
    quantities.
    """
    if isinstance(desired, Mapping):
        if not isinstance(observed, Mapping):
            return [path or "."]
        out = []
        for k, v in desired.items():
            sub = f"{path}.{k}" if path else str(k)
            if k not in observed:
                out.append(sub)
            else:
                # Values of a requests/limits map are quantities.
                nested = isinstance(v, Mapping)
                out += differences(v, observed[k], sub, k in _QUANTITY_PARENTS if nested else quantities)
        return out
    if isinstance(desired, list):
        if not isinstance(observed, list) or len(desired) != len(observed):
            return [path]
        out = []
        for i, (d, o) in enumerate(zip(desired, observed, strict=True)):
            out += differences(d, o, f"{path}[{i}]")
        return out
    if desired == observed and type(desired) is type(observed):
        return []
    if quantities and _same_quantity(desired, observed):
        return []
    return [path]


def is_ours(obj: Mapping, cluster_name: str) -> bool:
    """Labelled as rendered by the operator for this cluster."""
    labels = obj.get("metadata", {}).get("labels") or {}
    return names.rendered_for(labels) == cluster_name


def create_only(obj: Mapping) -> bool:
    """Created once, never updated or deleted (the key Secrets)."""
    return (obj.get("metadata", {}).get("annotations") or {}).get(names.CREATE_ONLY) == "true"


def _deleting(obj: Mapping) -> bool:
    return bool(obj.get("metadata", {}).get("deletionTimestamp"))


def _deletable(obj: Mapping) -> bool:
    if obj["kind"] not in MANAGED_KINDS or create_only(obj):
        return False
    if obj["kind"] == "PersistentVolumeClaim":
        # Only claims the renderer made, and only when the cluster says so;
        # the controller's state claim (from volumeClaimTemplates) has no such annotation.
        return (obj["metadata"].get("annotations") or {}).get(names.DELETION_POLICY) == "Delete"
    return True


def plan(desired: Sequence[dict], observed: Iterable[dict], *, cluster_name: str,
         keep: Collection[Key] = ()) -> Plan:
    """What to create, update and delete so that ``observed`` becomes ``desired``.

    ``keep``: objects that must not be deleted now even if no longer desired
    (the StatefulSet and PodDisruptionBudget of a node set that is still
    being drained).
    """
    seen: dict[Key, dict] = {key(o): o for o in observed if o.get("kind") in MANAGED_KINDS}
    creates: list[Create] = []
    updates: list[Update] = []
    wanted = set()
    for d in desired:
        k = key(d)
        wanted.add(k)
        o = seen.get(k)
        if o is None:
            creates.append(Create(d))
        elif _deleting(o):
            continue  # being deleted: created again once gone
        elif not create_only(d):
            d = _with_immutable_claims(d, o)
            changed = differences(_comparable(d), o)
            if changed:
                updates.append(Update(d, tuple(changed)))
    deletes = []
    for k, o in sorted(seen.items()):
        if k in wanted or k in keep or _deleting(o) or not is_ours(o, cluster_name) or not _deletable(o):
            continue
        meta = o["metadata"]
        deletes.append(Delete(o.get("apiVersion", ""), o["kind"], meta.get("namespace", ""), meta["name"],
                              meta.get("uid")))
    order = {kind: i for i, kind in enumerate(MANAGED_KINDS)}
    creates.sort(key=lambda c: order[c.key[0]])
    # Deletes run in the reverse order: workloads before the config they mount.
    deletes.sort(key=lambda d: -order[d.kind])
    return Plan(tuple(creates), tuple(updates), tuple(deletes))


def _with_immutable_claims(desired: dict, observed: Mapping) -> dict:
    """A StatefulSet's update carries the claim templates it has: Kubernetes forbids
    changing them (a new claim size or label never reaches a StatefulSet that
    exists; its claims are resized on their own). A claim's carries the spec it
    has but its size, the one field Kubernetes lets change: a claim made with
    another StorageClass (the spec's or the operator's default changed since)
    keeps it, rather than fail every round."""
    spec = observed.get("spec") or {}
    if desired.get("kind") == "StatefulSet" and spec.get("volumeClaimTemplates") is not None:
        out = copy.deepcopy(desired)
        out["spec"]["volumeClaimTemplates"] = copy.deepcopy(spec["volumeClaimTemplates"])
        return out
    if desired.get("kind") == "PersistentVolumeClaim" and spec:
        out = copy.deepcopy(desired)
        out["spec"] = {**copy.deepcopy(dict(spec)), "resources": copy.deepcopy(desired["spec"].get("resources") or {})}
        return out
    return desired


def _comparable(obj: dict) -> dict:
    """The rendered object without what the server never echoes back as rendered."""
    return {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}


def with_replicas(desired: Sequence[dict], replicas: Mapping[str, int]) -> list[dict]:
    """``desired`` with the StatefulSets named in ``replicas`` set to those counts."""
    out = []
    for o in desired:
        if o["kind"] == "StatefulSet" and o["metadata"]["name"] in replicas:
            o = copy.deepcopy(o)
            o["spec"]["replicas"] = replicas[o["metadata"]["name"]]
        out.append(o)
    return out


def held_objects(sets: Iterable[NodeSetState], held: Collection[str]) -> frozenset[Key]:
    """The StatefulSet and busy-worker PodDisruptionBudget of each node set named in
    ``held`` (those still being drained): :func:`plan`'s ``keep``."""
    return frozenset((kind, name) for s in sets if s.name in held
                     for kind, name in (("StatefulSet", s.statefulset),
                                        ("PodDisruptionBudget", names.busy_budget(s.statefulset))))


def removed_scales(sets: Iterable[NodeSetState], desired: Sequence[Mapping],
                   replicas: Mapping[str, int]) -> list[tuple[str, int]]:
    """(StatefulSet, replicas) of each node set gone from ``desired`` whose observed
    StatefulSet ``replicas`` resizes: it is scaled in place, not rendered."""
    rendered = {o["metadata"]["name"] for o in desired if o["kind"] == "StatefulSet"}
    return [(s.statefulset, replicas[s.statefulset]) for s in sets
            if s.statefulset not in rendered and s.current is not None
            and replicas.get(s.statefulset, s.current) != s.current]
