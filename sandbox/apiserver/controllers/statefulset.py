"""The StatefulSet controller.

:func:`plan` (pure) decides from a StatefulSet and its pods what to do next:
pods ``<name>-<ordinal>`` with stable identity (hostname, subdomain = the
serviceName, a PVC per volumeClaimTemplate named ``<template>-<name>-<ordinal>``),
OrderedReady (one at a time, each waiting for the previous to be Running and
Ready) or Parallel, scale-down from the highest ordinal, RollingUpdate from the
highest ordinal down to the partition (one pod at a time, waiting for Ready) or
OnDelete, the PVC retention policy, and the status.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

from ..api import DeleteOptions, Options
from ..errors import APIError
from ..store import Event, meta
from .base import Controller
from .events import Recorder
from .util import (
    PODS,
    PVCS,
    STATEFULSETS,
    controller_of,
    deleting,
    name,
    namespace,
    owned_by,
    owner_ref,
    pod_available,
    pod_running_ready,
    pod_terminal,
    template_hash,
    uid,
)

REVISION_LABEL = "controller-revision-hash"
POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"


@dataclass
class Plan:
    create: list[tuple[list[dict], dict]] = field(default_factory=list)  # (PVCs, pod)
    delete_pods: list[str] = field(default_factory=list)
    delete_pvcs: list[str] = field(default_factory=list)
    status: dict = field(default_factory=dict)


def ordinal(sts_name: str, pod_name: str) -> int | None:
    m = re.fullmatch(re.escape(sts_name) + r"-(\d+)", pod_name)
    return int(m.group(1)) if m else None


def update_revision(sts: dict) -> str:
    return f"{name(sts)}-{template_hash((sts.get('spec') or {}).get('template'))}"


def claim_name(template: dict, sts: dict, ordinal_: int) -> str:
    return f"{(template.get('metadata') or {}).get('name')}-{name(sts)}-{ordinal_}"


def new_claims(sts: dict, ordinal_: int) -> list[dict]:
    spec = sts.get("spec") or {}
    policy = spec.get("persistentVolumeClaimRetentionPolicy") or {}
    selector_labels = (spec.get("selector") or {}).get("matchLabels") or {}
    out = []
    for tpl in spec.get("volumeClaimTemplates") or []:
        tmeta = tpl.get("metadata") or {}
        labels = dict(tmeta.get("labels") or {})
        labels.update(selector_labels)
        pvc = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim_name(tpl, sts, ordinal_), "namespace": namespace(sts), "labels": labels},
            "spec": copy.deepcopy(tpl.get("spec") or {}),
        }
        if tmeta.get("annotations"):
            pvc["metadata"]["annotations"] = dict(tmeta["annotations"])
        if policy.get("whenDeleted") == "Delete":
            pvc["metadata"]["ownerReferences"] = [owner_ref(sts, controller=True, block=True)]
        out.append(pvc)
    return out


def new_pod(sts: dict, ordinal_: int, revision: str) -> dict:
    spec = sts.get("spec") or {}
    tpl = copy.deepcopy(spec.get("template") or {})
    tmeta = tpl.get("metadata") or {}
    pname = f"{name(sts)}-{ordinal_}"
    labels = dict(tmeta.get("labels") or {})
    labels.update({POD_NAME_LABEL: pname, REVISION_LABEL: revision, POD_INDEX_LABEL: str(ordinal_)})
    pod_spec = tpl.get("spec") or {}
    pod_spec["hostname"] = pname
    if spec.get("serviceName"):
        pod_spec["subdomain"] = spec["serviceName"]
    volumes = [v for v in pod_spec.get("volumes") or []]
    for ctpl in spec.get("volumeClaimTemplates") or []:
        vname = (ctpl.get("metadata") or {}).get("name")
        volumes = [v for v in volumes if v.get("name") != vname]
        volumes.append({"name": vname, "persistentVolumeClaim": {"claimName": claim_name(ctpl, sts, ordinal_)}})
    if volumes:
        pod_spec["volumes"] = volumes
    pod_meta = {"name": pname, "namespace": namespace(sts), "labels": labels, "ownerReferences": [owner_ref(sts)]}
    if tmeta.get("annotations"):
        pod_meta["annotations"] = dict(tmeta["annotations"])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": pod_spec}


def _rev(pod: dict) -> str:
    return (meta(pod).get("labels") or {}).get(REVISION_LABEL, "")


def plan(sts: dict, pods: list[dict], pvc_names: set[str]) -> Plan:
    spec = sts.get("spec") or {}
    replicas = int(spec.get("replicas", 1))
    start = int((spec.get("ordinals") or {}).get("start", 0))
    end = start + replicas
    monotonic = spec.get("podManagementPolicy", "OrderedReady") != "Parallel"
    strategy = spec.get("updateStrategy") or {}
    min_ready = int(spec.get("minReadySeconds") or 0)
    update_rev = update_revision(sts)
    old_status = sts.get("status") or {}
    current_rev = old_status.get("currentRevision") or update_rev
    out = Plan()

    by_ord: dict[int, dict] = {}
    condemned: list[tuple[int, dict]] = []
    for p in pods:
        o = ordinal(name(sts), name(p))
        if o is None:
            continue
        if start <= o < end:
            by_ord[o] = p
        else:
            condemned.append((o, p))
    condemned.sort(key=lambda x: -x[0])

    # status, from the pods as they are now
    ready = sum(1 for p in pods if pod_running_ready(p))
    available = sum(1 for p in pods if pod_running_ready(p) and pod_available(p, min_ready))
    live = [p for p in pods if not deleting(p)]
    updated = sum(1 for p in live if _rev(p) == update_rev)
    current = sum(1 for p in live if _rev(p) == current_rev)
    if updated == replicas and ready == replicas and len(pods) == replicas:
        current_rev, current = update_rev, updated
    out.status = {
        "observedGeneration": meta(sts).get("generation", 1),
        "replicas": len(pods),
        "readyReplicas": ready,
        "currentReplicas": current,
        "updatedReplicas": updated,
        "availableReplicas": available,
        "currentRevision": current_rev,
        "updateRevision": update_rev,
        "collisionCount": int(old_status.get("collisionCount") or 0),
    }
    if not ready:
        del out.status["readyReplicas"]
    if deleting(sts):
        return out

    blocked = False
    for o in range(start, end):
        p = by_ord.get(o)
        if p is None:
            pod = new_pod(sts, o, update_rev)
            claims = [c for c in new_claims(sts, o) if name(c) not in pvc_names]
            out.create.append((claims, pod))
            if monotonic:
                blocked = True
                break
            continue
        if pod_terminal(p) and not deleting(p):
            out.delete_pods.append(name(p))  # recreated on a later pass
            if monotonic:
                blocked = True
                break
            continue
        if deleting(p) or not pod_running_ready(p):
            if monotonic:
                blocked = True
                break
    if not blocked:
        for _o, p in condemned:
            if deleting(p):
                if monotonic:
                    blocked = True
                    break
                continue
            out.delete_pods.append(name(p))
            if monotonic:
                blocked = True
                break
    if not blocked and not condemned and strategy.get("type", "RollingUpdate") == "RollingUpdate":
        partition = int((strategy.get("rollingUpdate") or {}).get("partition") or 0)
        for o in range(end - 1, max(start, start + partition) - 1, -1):
            p = by_ord.get(o)
            if p is None:
                break
            if _rev(p) != update_rev:
                if not deleting(p):
                    out.delete_pods.append(name(p))
                break
            if not pod_running_ready(p):
                break
    policy = spec.get("persistentVolumeClaimRetentionPolicy") or {}
    if policy.get("whenScaled") == "Delete":
        present = {ordinal(name(sts), name(p)) for p in pods}
        for tpl in spec.get("volumeClaimTemplates") or []:
            prefix = f"{(tpl.get('metadata') or {}).get('name')}-{name(sts)}-"
            for claim in sorted(pvc_names):
                if claim.startswith(prefix) and claim[len(prefix):].isdigit():
                    o = int(claim[len(prefix):])
                    if not (start <= o < end) and o not in present:
                        out.delete_pvcs.append(claim)
    return out


class StatefulSets(Controller):
    name = "statefulset-controller"
    watches = (STATEFULSETS, PODS)

    def keys_for(self, ev: Event) -> Iterable[Hashable]:
        if ev.storage == STATEFULSETS:
            yield (namespace(ev.obj), name(ev.obj))
            return
        ref = controller_of(ev.obj)
        if ref and ref.get("kind") == "StatefulSet":
            yield (namespace(ev.obj), ref.get("name"))

    def initial_keys(self) -> Iterable[Hashable]:
        return [(namespace(s), name(s)) for s in self.api.store.list(STATEFULSETS)]

    def reconcile(self, key) -> float | None:
        ns, sname = key
        api = self.api
        sts = api.store.get(STATEFULSETS, ns, sname)
        if sts is None:
            return None
        pods = owned_by(api.store.list(PODS, ns), uid(sts))
        pvc_names = {name(p) for p in api.store.list(PVCS, ns)}
        p = plan(sts, pods, pvc_names)
        opts = Options(field_manager=self.name)
        pvc_rt = api.resource("", "v1", "persistentvolumeclaims")
        pod_rt = api.resource("", "v1", "pods")
        for claims, pod in p.create:
            for claim in claims:
                try:
                    api.create(pvc_rt, ns, claim, opts)
                except APIError as e:
                    if e.code != 409:
                        raise
            try:
                api.create(pod_rt, ns, pod, opts)
            except APIError as e:
                # Refused (Pod Security, a quota, validation): said on the
                # StatefulSet as its controller says it, then retried.
                Recorder(api, self.name).event(sts, "Warning", "FailedCreate",
                                               f"create Pod {name(pod)} in StatefulSet {sname} failed error: {e.message}")
                raise
        for pname in p.delete_pods:
            try:
                api.delete(pod_rt, ns, pname, DeleteOptions(propagation="Background"))
            except APIError as e:
                if e.code != 404:
                    raise
        for claim in p.delete_pvcs:
            try:
                api.delete(pvc_rt, ns, claim, DeleteOptions(propagation="Background"))
            except APIError as e:
                if e.code != 404:
                    raise
        current = api.store.get(STATEFULSETS, ns, sname)
        if current is not None:
            api.write_status(api.resource("apps", "v1", "statefulsets"), current, p.status, self.name)
        min_ready = int((sts.get("spec") or {}).get("minReadySeconds") or 0)
        if min_ready and p.status.get("availableReplicas", 0) < p.status.get("readyReplicas", 0):
            return float(min_ready)
        return None
