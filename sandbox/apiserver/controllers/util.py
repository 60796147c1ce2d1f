"""Small pure helpers the controllers share."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from typing import Any

from .. import timeutil
from ..store import meta
from ..strategy import pod_ready  # noqa: F401 (re-exported: the controllers' one reading of Ready)

PODS = ("", "pods")
NODES = ("", "nodes")
PVCS = ("", "persistentvolumeclaims")
SERVICES = ("", "services")
ENDPOINTS = ("", "endpoints")
NAMESPACES = ("", "namespaces")
EVENTS = ("", "events")
STATEFULSETS = ("apps", "statefulsets")
DEPLOYMENTS = ("apps", "deployments")
REPLICASETS = ("apps", "replicasets")
PDBS = ("policy", "poddisruptionbudgets")
CRDS = ("apiextensions.k8s.io", "customresourcedefinitions")

SAFE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def name(obj: dict) -> str:
    return meta(obj).get("name", "")


def namespace(obj: dict) -> str:
    return meta(obj).get("namespace") or ""


def uid(obj: dict) -> str:
    return meta(obj).get("uid", "")


def deleting(obj: dict) -> bool:
    return bool(meta(obj).get("deletionTimestamp"))


def owner_ref(owner: dict, controller: bool = True, block: bool = True) -> dict:
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": name(owner),
        "uid": uid(owner),
        "controller": controller,
        "blockOwnerDeletion": block,
    }


def controller_of(obj: dict) -> dict | None:
    for ref in meta(obj).get("ownerReferences") or []:
        if ref.get("controller"):
            return ref
    return None


def owned_by(objs: Iterable[dict], owner_uid: str) -> list[dict]:
    return [o for o in objs if (controller_of(o) or {}).get("uid") == owner_uid]


def pod_running_ready(pod: dict) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running" and pod_ready(pod)


def pod_terminal(pod: dict) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def pod_active(pod: dict) -> bool:
    return not deleting(pod) and not pod_terminal(pod)


def pod_available(pod: dict, min_ready_seconds: int, now=None) -> bool:
    if not pod_ready(pod):
        return False
    if not min_ready_seconds:
        return True
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            t = timeutil.parse(c.get("lastTransitionTime") or "")
            if t is None:
                return False
            return ((now or timeutil.now()) - t).total_seconds() >= min_ready_seconds
    return False


def fnv32a(data: bytes) -> int:
    h = 0x811C9DC5
    for b in data:
        h ^= b
        h = (h * 0x01000193) & 0xFFFFFFFF
    return h


def safe_encode(text: str) -> str:
    return "".join(SAFE_ALPHABET[ord(c) % len(SAFE_ALPHABET)] for c in text)


def template_hash(template: Any, collision_count: int = 0) -> str:
    """A short, stable hash of a pod template, spelled as Kubernetes spells them."""
    data = json.dumps(template, sort_keys=True, separators=(",", ":")).encode()
    if collision_count:
        data += str(collision_count).encode()
    return safe_encode(str(fnv32a(data)))


def set_condition(conditions: list[dict] | None, cond: dict) -> list[dict]:
    """Replace the condition of the same type, keeping its transition time if the status is unchanged."""
    out = [copy.deepcopy(c) for c in conditions or []]
    for i, c in enumerate(out):
        if c.get("type") == cond["type"]:
            new = dict(cond)
            if c.get("status") == cond.get("status") and c.get("lastTransitionTime"):
                new["lastTransitionTime"] = c["lastTransitionTime"]
                if c.get("reason") == cond.get("reason") and c.get("message") == cond.get("message"):
                    for k in ("lastUpdateTime", "lastHeartbeatTime", "lastProbeTime"):
                        if k in c:
                            new[k] = c[k]
            out[i] = new
            return out
    out.append(dict(cond))
    return out


def resolve_int_or_percent(value: Any, total: int, round_up: bool) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    text = str(value)
    if text.endswith("%"):
        pct = int(text[:-1])
        n = total * pct
        return -(-n // 100) if round_up else n // 100
    return int(text)
