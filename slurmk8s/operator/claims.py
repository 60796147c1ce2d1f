"""StorageReady: whether the claims the cluster's pods mount are bound and,
while one is not, why, in the words of whoever provisions it. Pure.

A claim that stays Pending holds every pod that mounts it (on a managed
cluster: a ReadWriteMany claim of a block storage class, a class that does
not exist, a provisioner that is not installed). Kubernetes says why only in
the claim's Events (``ProvisioningFailed``, ``FailedBinding``,
``ExternalProvisioning``, ``WaitForFirstConsumer``), which the SlurmCluster's
owner may not think to read: StorageReady (and Ready, while it is False)
says it instead. The claims are those of the rendered workloads: their pod
templates' claim volumes (the shared claims, the operator's or the spec's
``existingClaim``) and their StatefulSets' claims of ``volumeClaimTemplates``
(``<template>-<statefulset>-<ordinal>``: the controller's state, the managed
database's data).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from slurmk8s.api.cluster import SlurmCluster
from slurmk8s.api.status import ConditionStatus

__all__ = ["CONDITION", "Claim", "used", "unbound", "condition"]

CONDITION = "StorageReady"
#: A provisioner's Event reason that may stand as the condition's (one CamelCase word).
_REASON = re.compile(r"[A-Z][A-Za-z0-9]{0,63}")

_Cond = tuple[ConditionStatus, str, str]


@dataclass(frozen=True)
class Claim:
    """A claim the cluster's pods mount; ``field``: the spec field that names it
    (``existingClaim``), None for one the operator or a StatefulSet makes."""

    name: str
    field: str | None = None


def used(cluster: SlurmCluster, desired: Sequence[Mapping]) -> list[Claim]:
    """The claims the rendered workloads (``desired``) mount, each once, in order."""
    existing = {v.existing_claim: f"spec.sharedStorage.volumes[{i}].existingClaim"
                for i, v in enumerate(cluster.spec.shared_storage.volumes if cluster.spec.shared_storage else [])
                if v.existing_claim}
    out: dict[str, Claim] = {}
    for o in desired:
        if o.get("kind") not in ("StatefulSet", "Deployment"):
            continue
        spec = o.get("spec") or {}
        for v in ((spec.get("template") or {}).get("spec") or {}).get("volumes") or []:
            name = (v.get("persistentVolumeClaim") or {}).get("claimName")
            if name:
                out.setdefault(name, Claim(name, existing.get(name)))
        if o["kind"] == "StatefulSet":
            for t in spec.get("volumeClaimTemplates") or []:
                for i in range(int(spec.get("replicas", 1))):
                    name = f"{t['metadata']['name']}-{o['metadata']['name']}-{i}"
                    out.setdefault(name, Claim(name))
    return list(out.values())


def _bound(claim: Mapping | None) -> bool:
    return claim is not None and (claim.get("status") or {}).get("phase") == "Bound"


def unbound(wanted: Sequence[Claim], claims: Mapping[str, Mapping]) -> list[Claim]:
    """The claims of ``wanted`` that are missing or not bound (``claims``: those read, by name)."""
    return [c for c in wanted if not _bound(claims.get(c.name))]


def _about(claim: Mapping, events: Sequence[Mapping]) -> Mapping | None:
    """The Event that says best why ``claim`` waits: its latest Warning, else its latest Event.
    Only the Events of this claim (its uid, when the Event names one; an older claim of
    the same name had another)."""
    meta = claim.get("metadata") or {}
    mine = []
    for e in events:
        io = e.get("involvedObject") or {}
        if io.get("kind") == "PersistentVolumeClaim" and io.get("name") == meta.get("name") \
                and (not io.get("uid") or not meta.get("uid") or io.get("uid") == meta.get("uid")):
            mine.append(e)
    if not mine:
        return None
    warnings = [e for e in mine if e.get("type") == "Warning"]
    return max(warnings or mine, key=lambda e: (e.get("lastTimestamp") or e.get("eventTime") or "",
                                                int(e.get("count") or 1)))


def condition(wanted: Sequence[Claim], claims: Mapping[str, Mapping], events: Sequence[Mapping] = ()) -> _Cond:
    """StorageReady from the claims read (by name) and their namespace's claim Events."""
    if not wanted:
        return "True", "NoClaims", "the cluster's pods mount no claims"
    problems: list[str] = []
    reasons: list[str] = []
    for c in unbound(wanted, claims):
        named = f"claim {c.name}" + (f" ({c.field})" if c.field else "")
        claim = claims.get(c.name)
        if claim is None:
            if c.field:
                problems.append(f"{named} does not exist: create it (ReadWriteMany), or set size instead")
                reasons.append("ClaimNotFound")
            else:
                problems.append(f"{named} does not exist yet")
                reasons.append("ClaimNotCreated")
            continue
        phase = (claim.get("status") or {}).get("phase") or "Pending"
        event = _about(claim, events)
        said = f": {event.get('reason')}: {(event.get('message') or '').strip()[:1024]}" if event else ""
        problems.append(f"{named} is {phase}{said}")
        warned = str(event.get("reason") or "") if event is not None and event.get("type") == "Warning" else ""
        reasons.append("ClaimLost" if phase == "Lost" else warned if _REASON.fullmatch(warned) else "ClaimPending")
    if not problems:
        return "True", "Bound", f"{len(wanted)} claim{'s' if len(wanted) != 1 else ''} bound"
    return "False", reasons[0], "; ".join(problems)
