"""``application/json;as=Table`` answers: what ``kubectl get`` prints (pure).

Custom resources get their CRD's ``additionalPrinterColumns``; built-in types
get the columns Kubernetes prints for them (a close, simplified version).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from . import jsonpath, storage, timeutil
from .resources import ResourceType

Column = dict[str, Any]


def _col(name: str, type_: str = "string", priority: int = 0, fmt: str = "", desc: str = "") -> Column:
    return {"name": name, "type": type_, "format": fmt, "description": desc or name, "priority": priority}


NAME = _col("Name", fmt="name", desc="Name must be unique within a namespace.")
AGE = _col("Age", desc="CreationTimestamp is a timestamp representing the server time when this object was created.")


def _age(obj: dict) -> str:
    return timeutil.age((obj.get("metadata") or {}).get("creationTimestamp"))


def _name(obj: dict) -> str:
    return (obj.get("metadata") or {}).get("name", "")


def _pod_status(pod: dict) -> str:
    st = pod.get("status") or {}
    reason = st.get("reason") or st.get("phase") or "Unknown"
    for c in reversed(st.get("containerStatuses") or []):
        state = c.get("state") or {}
        if (state.get("waiting") or {}).get("reason"):
            reason = state["waiting"]["reason"]
        elif (state.get("terminated") or {}).get("reason"):
            reason = state["terminated"]["reason"]
        elif state.get("terminated"):
            t = state["terminated"]
            reason = f"Signal:{t['signal']}" if t.get("signal") else f"ExitCode:{t.get('exitCode', 0)}"
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        reason = "Terminating"
    return reason


def _pod(pod: dict) -> list:
    spec, st = pod.get("spec") or {}, pod.get("status") or {}
    statuses = st.get("containerStatuses") or []
    ready = sum(1 for c in statuses if c.get("ready"))
    restarts = sum(int(c.get("restartCount") or 0) for c in statuses)
    gates = spec.get("readinessGates") or []
    return [_name(pod), f"{ready}/{len(spec.get('containers') or [])}", _pod_status(pod), str(restarts), _age(pod),
            st.get("podIP") or "<none>", spec.get("nodeName") or "<none>", st.get("nominatedNodeName") or "<none>",
            f"0/{len(gates)}" if gates else "<none>"]


def _node(node: dict) -> list:
    st = node.get("status") or {}
    ready = next((c.get("status") for c in st.get("conditions") or [] if c.get("type") == "Ready"), None)
    status = {"True": "Ready", "False": "NotReady"}.get(ready or "", "Unknown")
    if (node.get("spec") or {}).get("unschedulable"):
        status += ",SchedulingDisabled"
    roles = sorted(k.split("/", 1)[1] for k in (node.get("metadata") or {}).get("labels", {}) if k.startswith("node-role.kubernetes.io/"))
    addrs = {a.get("type"): a.get("address") for a in st.get("addresses") or []}
    info = st.get("nodeInfo") or {}
    return [_name(node), status, ",".join(roles) or "<none>", _age(node), info.get("kubeletVersion", ""),
            addrs.get("InternalIP", "<none>"), addrs.get("ExternalIP", "<none>"), info.get("osImage", "<unknown>"),
            info.get("kernelVersion", "<unknown>"), info.get("containerRuntimeVersion", "<unknown>")]


def _service(svc: dict) -> list:
    spec = svc.get("spec") or {}
    ports = ",".join(
        f"{p.get('port')}{':' + str(p['nodePort']) if p.get('nodePort') else ''}/{p.get('protocol', 'TCP')}" for p in spec.get("ports") or []
    )
    sel = ",".join(f"{k}={v}" for k, v in sorted((spec.get("selector") or {}).items()))
    ext = ",".join(spec.get("externalIPs") or []) or ("<pending>" if spec.get("type") == "LoadBalancer" else "<none>")
    return [_name(svc), spec.get("type", "ClusterIP"), spec.get("clusterIP") or "<none>", ext, ports or "<none>", _age(svc), sel or "<none>"]


def _ready(obj: dict, want: Any) -> str:
    return f"{(obj.get('status') or {}).get('readyReplicas', 0)}/{want}"


def _containers(obj: dict) -> tuple[str, str]:
    cs = (((obj.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers") or []
    return ",".join(c.get("name", "") for c in cs), ",".join(c.get("image", "") for c in cs)


def _selector(obj: dict) -> str:
    from .api import selector_string

    return selector_string((obj.get("spec") or {}).get("selector")) or "<none>"


def _deployment(d: dict) -> list:
    st = d.get("status") or {}
    names, images = _containers(d)
    return [_name(d), _ready(d, (d.get("spec") or {}).get("replicas", 0)), st.get("updatedReplicas", 0),
            st.get("availableReplicas", 0), _age(d), names, images, _selector(d)]


def _statefulset(s: dict) -> list:
    names, images = _containers(s)
    return [_name(s), _ready(s, (s.get("spec") or {}).get("replicas", 0)), _age(s), names, images]


def _replicaset(r: dict) -> list:
    st = r.get("status") or {}
    names, images = _containers(r)
    return [_name(r), (r.get("spec") or {}).get("replicas", 0), st.get("replicas", 0), st.get("readyReplicas", 0), _age(r),
            names, images, _selector(r)]


_MODES = {"ReadWriteOnce": "RWO", "ReadOnlyMany": "ROX", "ReadWriteMany": "RWX", "ReadWriteOncePod": "RWOP"}


def _pvc(p: dict) -> list:
    spec, st = p.get("spec") or {}, p.get("status") or {}
    cap = (st.get("capacity") or {}).get("storage", "")
    modes = ",".join(_MODES.get(m, m) for m in st.get("accessModes") or [])
    return [_name(p), st.get("phase", ""), spec.get("volumeName", ""), cap, modes, spec.get("storageClassName") or "<unset>",
            spec.get("volumeAttributesClassName") or "<unset>", _age(p), spec.get("volumeMode", "Filesystem")]


def _storage_class(sc: dict) -> list:
    name = _name(sc) + (" (default)" if storage.is_default(sc) else "")
    return [name, sc.get("provisioner", ""), sc.get("reclaimPolicy", ""), sc.get("volumeBindingMode", ""),
            bool(sc.get("allowVolumeExpansion")), _age(sc)]


def _event(e: dict) -> list:
    io = e.get("involvedObject") or {}
    last = e.get("lastTimestamp") or e.get("eventTime") or (e.get("metadata") or {}).get("creationTimestamp")
    first = e.get("firstTimestamp") or e.get("eventTime") or (e.get("metadata") or {}).get("creationTimestamp")
    src = (e.get("source") or {}).get("component") or e.get("reportingComponent") or ""
    obj = f"{(io.get('kind') or '').lower()}/{io.get('name', '')}"
    return [timeutil.age(last), e.get("type", ""), e.get("reason", ""), obj, io.get("fieldPath", ""), src,
            (e.get("message") or "").strip(), timeutil.age(first), e.get("count") or 1, _name(e)]


def _pdb(p: dict) -> list:
    spec = p.get("spec") or {}
    return [_name(p), str(spec.get("minAvailable", "N/A")), str(spec.get("maxUnavailable", "N/A")),
            (p.get("status") or {}).get("disruptionsAllowed", 0), _age(p)]


def _role_ref(b: dict) -> str:
    ref = b.get("roleRef") or {}
    return f"{ref.get('kind', '')}/{ref.get('name', '')}"


def _subjects(b: dict, kind: str) -> str:
    names = []
    for s in b.get("subjects") or []:
        if s.get("kind") == kind:
            names.append(f"{s.get('namespace', '')}/{s.get('name', '')}" if kind == "ServiceAccount" else s.get("name", ""))
    return ", ".join(names)


def _binding(b: dict) -> list:
    return [_name(b), _role_ref(b), _age(b), _subjects(b, "User"), _subjects(b, "Group"), _subjects(b, "ServiceAccount")]


_BINDING_COLS = [NAME, _col("Role"), AGE, _col("Users", priority=1), _col("Groups", priority=1), _col("ServiceAccounts", priority=1)]


PRINTERS: dict[tuple[str, str], tuple[list[Column], Callable[[dict], list]]] = {
    ("rbac.authorization.k8s.io", "roles"): ([NAME, _col("Created At")], lambda o: [_name(o), (o.get("metadata") or {}).get("creationTimestamp", "")]),
    ("rbac.authorization.k8s.io", "clusterroles"): ([NAME, _col("Created At")], lambda o: [_name(o), (o.get("metadata") or {}).get("creationTimestamp", "")]),
    ("rbac.authorization.k8s.io", "rolebindings"): (_BINDING_COLS, _binding),
    ("rbac.authorization.k8s.io", "clusterrolebindings"): (_BINDING_COLS, _binding),
    ("", "pods"): ([NAME, _col("Ready"), _col("Status"), _col("Restarts"), AGE, _col("IP", priority=1), _col("Node", priority=1),
                    _col("Nominated Node", priority=1), _col("Readiness Gates", priority=1)], _pod),
    ("", "nodes"): ([NAME, _col("Status"), _col("Roles"), AGE, _col("Version"), _col("Internal-IP", priority=1),
                     _col("External-IP", priority=1), _col("OS-Image", priority=1), _col("Kernel-Version", priority=1),
                     _col("Container-Runtime", priority=1)], _node),
    ("", "namespaces"): ([NAME, _col("Status"), AGE], lambda o: [_name(o), (o.get("status") or {}).get("phase", ""), _age(o)]),
    ("", "services"): ([NAME, _col("Type"), _col("Cluster-IP"), _col("External-IP"), _col("Port(s)"), AGE, _col("Selector", priority=1)], _service),
    ("", "configmaps"): ([NAME, _col("Data", "integer"), AGE], lambda o: [_name(o), len(o.get("data") or {}) + len(o.get("binaryData") or {}), _age(o)]),
    ("", "secrets"): ([NAME, _col("Type"), _col("Data", "integer"), AGE], lambda o: [_name(o), o.get("type", ""), len(o.get("data") or {}), _age(o)]),
    ("", "serviceaccounts"): ([NAME, _col("Secrets", "integer"), AGE], lambda o: [_name(o), len(o.get("secrets") or []), _age(o)]),
    ("", "endpoints"): ([NAME, _col("Endpoints"), AGE], lambda o: [_name(o), _endpoints(o), _age(o)]),
    ("", "persistentvolumeclaims"): ([NAME, _col("Status"), _col("Volume"), _col("Capacity"), _col("Access Modes"), _col("StorageClass"),
                                      _col("VolumeAttributesClass"), AGE, _col("VolumeMode", priority=1)], _pvc),
    ("storage.k8s.io", "storageclasses"): ([NAME, _col("Provisioner"), _col("ReclaimPolicy"), _col("VolumeBindingMode"),
                                            _col("AllowVolumeExpansion", "boolean"), AGE], _storage_class),
    ("", "events"): ([_col("Last Seen"), _col("Type"), _col("Reason"), _col("Object"), _col("Subobject", priority=1),
                      _col("Source", priority=1), _col("Message"), _col("First Seen", priority=1), _col("Count", "integer", priority=1),
                      _col("Name", priority=1, fmt="name")], _event),
    ("apps", "deployments"): ([NAME, _col("Ready"), _col("Up-to-date", "integer"), _col("Available", "integer"), AGE,
                               _col("Containers", priority=1), _col("Images", priority=1), _col("Selector", priority=1)], _deployment),
    ("apps", "statefulsets"): ([NAME, _col("Ready"), AGE, _col("Containers", priority=1), _col("Images", priority=1)], _statefulset),
    ("apps", "replicasets"): ([NAME, _col("Desired", "integer"), _col("Current", "integer"), _col("Ready", "integer"), AGE,
                               _col("Containers", priority=1), _col("Images", priority=1), _col("Selector", priority=1)], _replicaset),
    ("policy", "poddisruptionbudgets"): ([NAME, _col("Min Available"), _col("Max Unavailable"), _col("Allowed Disruptions", "integer"), AGE], _pdb),
    ("apiextensions.k8s.io", "customresourcedefinitions"): ([NAME, _col("Created At", "date")],
                                                            lambda o: [_name(o), (o.get("metadata") or {}).get("creationTimestamp", "")]),
    ("coordination.k8s.io", "leases"): ([NAME, _col("Holder"), AGE], lambda o: [_name(o), (o.get("spec") or {}).get("holderIdentity", ""), _age(o)]),
}


def _endpoints(ep: dict) -> str:
    out = []
    for s in ep.get("subsets") or []:
        for a in s.get("addresses") or []:
            for p in s.get("ports") or [{}]:
                out.append(f"{a.get('ip')}:{p.get('port')}" if p.get("port") else a.get("ip", ""))
    if not out:
        return "<none>"
    return ",".join(out[:3]) + (f" + {len(out) - 3} more..." if len(out) > 3 else "")


def _cell(type_: str, value: Any) -> Any:
    if value is None:
        return None
    if type_ == "date":
        return timeutil.age(value) if isinstance(value, str) else "<invalid>"
    if type_ == "integer":
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    if type_ == "number":
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    if type_ == "boolean":
        return value if isinstance(value, bool) else None
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"))


def _custom(rt: ResourceType) -> tuple[list[Column], Callable[[dict], list]]:
    cols = list(rt.printer_columns)
    if not cols:
        return [NAME, AGE], lambda o: [_name(o), _age(o)]
    defs = [NAME] + [_col(c["name"], c.get("type", "string"), int(c.get("priority", 0)), c.get("format", ""),
                           c.get("description", c["name"])) for c in cols]

    def row(o: dict) -> list:
        cells: list[Any] = [_name(o)]
        for c in cols:
            try:
                found = jsonpath.find(o, c["jsonPath"])
            except ValueError:
                found = []
            cells.append(_cell(c.get("type", "string"), found[0]) if found else None)
        return cells

    return defs, row


def printer(rt: ResourceType) -> tuple[list[Column], Callable[[dict], list]]:
    if rt.custom:
        return _custom(rt)
    return PRINTERS.get(rt.storage, ([NAME, AGE], lambda o: [_name(o), _age(o)]))


def table(rt: ResourceType, objs: list[dict], include: str = "Metadata", resource_version: str | None = None,
          cont: str | None = None, remaining: int | None = None, columns: bool = True) -> dict:
    defs, row = printer(rt)
    rows = []
    for o in objs:
        r: dict[str, Any] = {"cells": row(o)}
        if include == "Object":
            r["object"] = o
        elif include != "None":
            r["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o.get("metadata", {})}
        rows.append(r)
    md: dict[str, Any] = {}
    if resource_version:
        md["resourceVersion"] = resource_version
    if cont:
        md["continue"] = cont
    if remaining:
        md["remainingItemCount"] = remaining
    out: dict[str, Any] = {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": md, "columnDefinitions": defs if columns else [], "rows": rows}
    return out
