"""Per-type rules applied on every write, as Kubernetes' registry strategies do (pure).

Over 500 lines because it holds one small pure function per type and rule, as
Kubernetes' registry strategies are; split by type, the container and metadata
checks every type shares would be scattered.

- :func:`apply_defaults`: the defaults Kubernetes fills in (pod spec, workloads,
  services, secrets' ``stringData``...).
- :func:`reset_status_on_create`: status a client may not choose on create.
- :func:`validate`: the checks we make (names, labels, owner references,
  containers, selectors vs template labels...) and, on update, the immutable
  fields (pod spec, StatefulSet spec, selectors, immutable Secrets/ConfigMaps).
- events.k8s.io/v1 <-> core/v1 Event conversion (one storage, two views).
"""

from __future__ import annotations

import base64
import binascii
import copy
import ipaddress
import re
from typing import Any

from . import quantity, storage, timeutil
from .errors import FieldError
from .resources import ResourceType
from .selectors import (
    from_label_selector_object,
    label_selector_errors,
    labels_match,
    valid_label_key,
    valid_label_value,
)

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
GENERATE_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"


def name_errors(rt: ResourceType, name: str, path: str = "metadata.name") -> list[FieldError]:
    if rt.storage in (("", "namespaces"),):
        ok = len(name) <= 63 and DNS1123_LABEL.match(name)
        what = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc')"
    elif rt.group == "rbac.authorization.k8s.io":  # path segment names, as Kubernetes' RBAC types
        ok = name not in (".", "..") and "/" not in name and "%" not in name
        what = 'may not be "." or "..", and may not contain "/" or "%"'
    elif rt.storage == ("", "services"):
        ok = len(name) <= 63 and DNS1035_LABEL.match(name)
        what = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123')"
    else:
        ok = len(name) <= 253 and DNS1123_SUBDOMAIN.match(name)
        what = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com')"
    return [] if ok else [FieldError(path, "Invalid", what, name)]


# --- defaults ---------------------------------------------------------------------


def _default_container(c: dict) -> None:
    image = c.get("image") or ""
    tag = image.rsplit("/", 1)[-1]
    latest = ("@" not in tag) and (":" not in tag or tag.endswith(":latest"))
    c.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
    c.setdefault("terminationMessagePath", "/dev/termination-log")
    c.setdefault("terminationMessagePolicy", "File")
    c.setdefault("resources", {})
    res = c["resources"]
    if isinstance(res, dict) and isinstance(res.get("limits"), dict):
        # requests default to limits, as Kubernetes does
        req = res.setdefault("requests", {})
        for k, v in res["limits"].items():
            req.setdefault(k, v)
    for p in c.get("ports") or []:
        if isinstance(p, dict):
            p.setdefault("protocol", "TCP")


def default_pod_spec(spec: dict) -> None:
    if not isinstance(spec, dict):
        return
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("securityContext", {})
    spec.setdefault("schedulerName", "default-scheduler")
    for key in ("containers", "initContainers"):
        for c in spec.get(key) or []:
            if isinstance(c, dict):
                _default_container(c)
    if spec.get("serviceAccount") and not spec.get("serviceAccountName"):
        spec["serviceAccountName"] = spec["serviceAccount"]


def _default_pod(pod: dict) -> None:
    spec = pod.setdefault("spec", {})
    default_pod_spec(spec)
    spec.setdefault("serviceAccountName", "default")
    spec.setdefault("serviceAccount", spec["serviceAccountName"])
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("priority", 0)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    # the DefaultTolerationSeconds admission plugin
    tols = spec.setdefault("tolerations", [])
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        if not any(t.get("key") == key and t.get("effect") in ("NoExecute", None, "") for t in tols if isinstance(t, dict)):
            tols.append({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300})


def _default_template(obj: dict) -> None:
    tpl = (obj.get("spec") or {}).get("template")
    if isinstance(tpl, dict):
        default_pod_spec(tpl.setdefault("spec", {}))
        tpl.setdefault("metadata", {}).setdefault("creationTimestamp", None)


def _default_selector_from_template(obj: dict) -> None:
    spec = obj.get("spec") or {}
    if "selector" not in spec:
        labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels")
        if labels:
            spec["selector"] = {"matchLabels": dict(labels)}


def apply_defaults(rt: ResourceType, obj: dict) -> None:
    s = rt.storage
    if s == ("", "pods"):
        _default_pod(obj)
    elif s == ("apps", "deployments"):
        spec = obj.setdefault("spec", {})
        spec.setdefault("replicas", 1)
        strategy = spec.setdefault("strategy", {})
        strategy.setdefault("type", "RollingUpdate")
        if strategy["type"] == "RollingUpdate":
            ru = strategy.setdefault("rollingUpdate", {})
            ru.setdefault("maxUnavailable", "25%")
            ru.setdefault("maxSurge", "25%")
        spec.setdefault("revisionHistoryLimit", 10)
        spec.setdefault("progressDeadlineSeconds", 600)
        _default_template(obj)
    elif s == ("apps", "statefulsets"):
        spec = obj.setdefault("spec", {})
        spec.setdefault("replicas", 1)
        spec.setdefault("podManagementPolicy", "OrderedReady")
        us = spec.setdefault("updateStrategy", {})
        us.setdefault("type", "RollingUpdate")
        if us["type"] == "RollingUpdate":
            us.setdefault("rollingUpdate", {}).setdefault("partition", 0)
        spec.setdefault("revisionHistoryLimit", 10)
        spec.setdefault(
            "persistentVolumeClaimRetentionPolicy", {"whenDeleted": "Retain", "whenScaled": "Retain"}
        )
        for t in spec.get("volumeClaimTemplates") or []:
            if isinstance(t, dict):
                t.setdefault("apiVersion", "v1")
                t.setdefault("kind", "PersistentVolumeClaim")
                t.setdefault("spec", {}).setdefault("volumeMode", "Filesystem")
                t.setdefault("status", {"phase": "Pending"})
        _default_template(obj)
    elif s == ("apps", "replicasets"):
        spec = obj.setdefault("spec", {})
        spec.setdefault("replicas", 1)
        _default_template(obj)
    elif s == ("", "services"):
        spec = obj.setdefault("spec", {})
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        spec.setdefault("internalTrafficPolicy", "Cluster")
        spec.setdefault("ipFamilies", ["IPv4"])
        spec.setdefault("ipFamilyPolicy", "SingleStack")
        for p in spec.get("ports") or []:
            if isinstance(p, dict):
                p.setdefault("protocol", "TCP")
                if "port" in p:
                    p.setdefault("targetPort", p["port"])
    elif s == ("", "secrets"):
        obj.setdefault("type", "Opaque")
        string_data = obj.pop("stringData", None)
        if isinstance(string_data, dict):
            data = obj.setdefault("data", {}) or {}
            obj["data"] = data
            for k, v in string_data.items():
                data[k] = base64.b64encode(str(v).encode()).decode()
    elif s == ("", "persistentvolumeclaims"):
        obj.setdefault("spec", {}).setdefault("volumeMode", "Filesystem")
    elif s == storage.STORAGECLASSES:
        storage.class_defaults(obj)
    elif s == ("admissionregistration.k8s.io", "validatingwebhookconfigurations"):
        for hook in obj.get("webhooks") or []:
            hook.setdefault("failurePolicy", "Fail")
            hook.setdefault("matchPolicy", "Equivalent")
            hook.setdefault("timeoutSeconds", 10)
            hook.setdefault("namespaceSelector", {})
            hook.setdefault("objectSelector", {})
            for rule in hook.get("rules") or []:
                rule.setdefault("scope", "*")
            service = (hook.get("clientConfig") or {}).get("service")
            if service is not None:
                service.setdefault("port", 443)
    elif s == ("networking.k8s.io", "networkpolicies"):
        spec = obj.setdefault("spec", {})
        if not spec.get("policyTypes"):
            spec["policyTypes"] = ["Ingress", "Egress"] if spec.get("egress") else ["Ingress"]
        for rule in (spec.get("ingress") or []) + (spec.get("egress") or []):
            for port in rule.get("ports") or []:
                port.setdefault("protocol", "TCP")
    elif s == ("", "namespaces"):
        obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
        name = obj.get("metadata", {}).get("name")
        if name:
            obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = name
    elif s == ("", "nodes"):
        now = timeutil.rfc3339()
        for t in (obj.get("spec") or {}).get("taints") or []:
            if isinstance(t, dict) and t.get("effect") == "NoExecute" and not t.get("timeAdded"):
                t["timeAdded"] = now
    elif s == ("policy", "poddisruptionbudgets"):
        pass
    elif s == ("apiextensions.k8s.io", "customresourcedefinitions"):
        spec = obj.setdefault("spec", {})
        names = spec.setdefault("names", {})
        if names.get("kind"):
            names.setdefault("singular", names["kind"].lower())
            names.setdefault("listKind", names["kind"] + "List")
        spec.setdefault("conversion", {"strategy": "None"})
        for v in spec.get("versions") or []:
            if isinstance(v, dict):
                v.setdefault("served", True)


def pod_ready(pod: dict) -> bool:
    """The pod's Ready condition is True (what the disruption controller and evictions count as healthy)."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("status") == "True"
    return False


def qos_class(pod: dict) -> str:
    containers = (pod.get("spec") or {}).get("containers") or []
    requests_any = limits_all = False
    guaranteed = True
    for c in containers:
        res = c.get("resources") or {}
        req, lim = res.get("requests") or {}, res.get("limits") or {}
        if req or lim:
            requests_any = True
        for r in ("cpu", "memory"):
            if r not in lim:
                guaranteed = False
            elif r in req and quantity.valid(req[r]) and quantity.valid(lim[r]) and quantity.parse(req[r]) != quantity.parse(lim[r]):
                guaranteed = False
        limits_all = True
    if not requests_any:
        return "BestEffort"
    return "Guaranteed" if guaranteed and limits_all else "Burstable"


def reset_status_on_create(rt: ResourceType, obj: dict) -> None:
    s = rt.storage
    if s == ("", "pods"):
        obj["status"] = {"phase": "Pending", "qosClass": qos_class(obj)}
    elif s in (("apps", "deployments"), ("apps", "statefulsets"), ("apps", "replicasets"), ("policy", "poddisruptionbudgets")):
        obj["status"] = {}
        if s == ("policy", "poddisruptionbudgets"):
            obj["status"] = {"disruptionsAllowed": 0, "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 0}
        elif s == ("apps", "statefulsets"):
            obj["status"] = {"replicas": 0, "availableReplicas": 0}
    elif s == ("", "services"):
        obj["status"] = {"loadBalancer": {}}
    elif s == ("", "namespaces"):
        obj["status"] = {"phase": "Active"}
    elif s == ("", "persistentvolumeclaims"):
        obj["status"] = {"phase": "Pending"}
    elif s == ("apiextensions.k8s.io", "customresourcedefinitions"):
        obj["status"] = crd_status(obj)
    elif rt.custom and rt.has_status:
        obj.pop("status", None)


def crd_status(crd: dict) -> dict:
    spec = crd.get("spec") or {}
    names = dict(spec.get("names") or {})
    now = timeutil.rfc3339()
    storage = [v["name"] for v in spec.get("versions") or [] if v.get("storage")]
    old = crd.get("status") or {}
    stored = list(old.get("storedVersions") or [])
    for v in storage:
        if v not in stored:
            stored.append(v)
    return {
        "acceptedNames": names,
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "lastTransitionTime": now, "reason": "NoConflicts", "message": "no conflicts found"},
            {"type": "Established", "status": "True", "lastTransitionTime": now, "reason": "InitialNamesAccepted", "message": "the initial names have been accepted"},
        ],
        "storedVersions": stored,
    }


# --- validation -------------------------------------------------------------------


#: apimachinery's TotalAnnotationSizeLimitB: all of an object's annotations together.
TOTAL_ANNOTATION_SIZE_LIMIT = 256 * 1024


def meta_errors(rt: ResourceType, obj: dict) -> list[FieldError]:
    errs: list[FieldError] = []
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return [FieldError("metadata", "Required")]
    name = meta.get("name") or ""
    if not name:
        errs.append(FieldError("metadata.name", "Required", "name or generateName is required"))
    else:
        errs += name_errors(rt, name)
    for k, v in (meta.get("labels") or {}).items():
        if not valid_label_key(k):
            errs.append(FieldError("metadata.labels", "Invalid", "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (with an optional DNS subdomain prefix and '/')", k))
        if not isinstance(v, str) or not valid_label_value(v):
            errs.append(FieldError("metadata.labels", "Invalid", "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character", v))
    annotations = meta.get("annotations") or {}
    for k, v in annotations.items():
        if not valid_label_key(k.lower()):
            errs.append(FieldError("metadata.annotations", "Invalid", "name part must consist of alphanumeric characters, '-', '_' or '.'", k))
        if not isinstance(v, str):
            errs.append(FieldError(f"metadata.annotations[{k}]", "Invalid", "annotation values must be strings", v))
    # ValidateAnnotationsSize: keys and values together, in bytes.
    if sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items() if isinstance(v, str)) \
            > TOTAL_ANNOTATION_SIZE_LIMIT:
        errs.append(FieldError("metadata.annotations", "TooLong",
                               f"may not be more than {TOTAL_ANNOTATION_SIZE_LIMIT} bytes"))
    controllers = 0
    for i, ref in enumerate(meta.get("ownerReferences") or []):
        for key in ("apiVersion", "kind", "name", "uid"):
            if not ref.get(key):
                errs.append(FieldError(f"metadata.ownerReferences[{i}].{key}", "Required" if key != "apiVersion" else "Invalid", "" if key != "apiVersion" else "version must not be empty", ref.get(key)))
        controllers += 1 if ref.get("controller") else 0
    if controllers > 1:
        errs.append(FieldError("metadata.ownerReferences", "Invalid", "Only one reference can have Controller set to true", meta.get("ownerReferences")))
    for i, f in enumerate(meta.get("finalizers") or []):
        if not isinstance(f, str) or not valid_label_key(f):
            errs.append(FieldError(f"metadata.finalizers[{i}]", "Invalid", "name part must consist of alphanumeric characters, '-', '_' or '.'", f))
    return errs


def _containers(spec: dict, path: str, errs: list[FieldError]) -> None:
    containers = spec.get("containers")
    if not containers:
        errs.append(FieldError(f"{path}.containers", "Required"))
        return
    seen = set()
    for key in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(key) or []):
            cpath = f"{path}.{key}[{i}]"
            if not isinstance(c, dict):
                errs.append(FieldError(cpath, "Invalid", "must be an object", c))
                continue
            name = c.get("name") or ""
            if not name:
                errs.append(FieldError(f"{cpath}.name", "Required"))
            elif not DNS1123_LABEL.match(name) or len(name) > 63:
                errs.append(FieldError(f"{cpath}.name", "Invalid", "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character", name))
            elif name in seen:
                errs.append(FieldError(f"{cpath}.name", "Duplicate", "", name))
            seen.add(name)
            if not c.get("image"):
                errs.append(FieldError(f"{cpath}.image", "Required"))
            res = c.get("resources") or {}
            for part in ("requests", "limits"):
                for r, q in (res.get(part) or {}).items():
                    if not quantity.valid(q):
                        errs.append(FieldError(f"{cpath}.resources.{part}[{r}]", "Invalid", "must be a valid quantity, e.g. 500m or 4Gi", q))
                    elif quantity.parse(q) < 0:
                        errs.append(FieldError(f"{cpath}.resources.{part}[{r}]", "Invalid", "must be greater than or equal to 0", q))
            lim, req = res.get("limits") or {}, res.get("requests") or {}
            for r, q in req.items():
                if r in lim and quantity.valid(q) and quantity.valid(lim[r]) and quantity.parse(q) > quantity.parse(lim[r]):
                    errs.append(FieldError(f"{cpath}.resources.requests", "Invalid", f"must be less than or equal to {r} limit of {lim[r]}", q))
    rp = spec.get("restartPolicy")
    if rp not in (None, "Always", "OnFailure", "Never"):
        errs.append(FieldError(f"{path}.restartPolicy", "NotSupported", 'supported values: "Always", "OnFailure", "Never"', rp))


def _workload(obj: dict, errs: list[FieldError], kind: str) -> None:
    spec = obj.get("spec") or {}
    replicas = spec.get("replicas")
    if replicas is not None and (not isinstance(replicas, int) or replicas < 0):
        errs.append(FieldError("spec.replicas", "Invalid", "must be greater than or equal to 0", replicas))
    sel = spec.get("selector")
    if not sel:
        errs.append(FieldError("spec.selector", "Required"))
    else:
        for field, msg in label_selector_errors(sel, "spec.selector"):
            errs.append(FieldError(field, "Invalid", msg, sel))
        if not (sel.get("matchLabels") or sel.get("matchExpressions")):
            errs.append(FieldError("spec.selector", "Invalid", f"empty selector is invalid for {kind.lower()}", sel))
    tpl = spec.get("template")
    if not isinstance(tpl, dict):
        errs.append(FieldError("spec.template", "Required"))
        return
    labels = (tpl.get("metadata") or {}).get("labels") or {}
    parsed = from_label_selector_object(sel) if sel else None
    if sel and parsed is not None and not labels_match(parsed, labels):
        errs.append(FieldError("spec.template.metadata.labels", "Invalid", "`selector` does not match template `labels`", labels))
    tspec = tpl.get("spec") or {}
    _containers(tspec, "spec.template.spec", errs)
    rp = tspec.get("restartPolicy", "Always")
    if rp != "Always":
        errs.append(FieldError("spec.template.spec.restartPolicy", "NotSupported", 'supported values: "Always"', rp))


def _old_new_spec_diff(old: dict, new: dict, allowed: tuple[str, ...]) -> bool:
    a = {k: v for k, v in (old or {}).items() if k not in allowed}
    b = {k: v for k, v in (new or {}).items() if k not in allowed}
    return a != b


def _pod_spec_changed(old: dict, new: dict) -> bool:
    o, n = copy.deepcopy(old or {}), copy.deepcopy(new or {})
    for key in ("containers", "initContainers"):
        oc, nc = o.get(key) or [], n.get(key) or []
        if len(oc) == len(nc):
            for a, b in zip(oc, nc, strict=True):
                if isinstance(a, dict) and isinstance(b, dict):
                    a.pop("image", None)
                    b.pop("image", None)
    for key in ("activeDeadlineSeconds", "terminationGracePeriodSeconds", "schedulingGates"):
        o.pop(key, None)
        n.pop(key, None)
    ot, nt = o.pop("tolerations", None) or [], n.pop("tolerations", None) or []
    if any(t not in nt for t in ot):
        return True
    return o != n


def _rbac_binding(obj: dict, old: dict | None, errs: list[FieldError], namespaced: bool) -> None:
    ref = obj.get("roleRef") if isinstance(obj.get("roleRef"), dict) else {}
    if not ref.get("name"):
        errs.append(FieldError("roleRef.name", "Required"))
    kinds = ("Role", "ClusterRole") if namespaced else ("ClusterRole",)
    if ref.get("kind") not in kinds:
        errs.append(FieldError("roleRef.kind", "NotSupported", "supported values: " + ", ".join(f'"{k}"' for k in kinds), ref.get("kind")))
    if ref.get("apiGroup") != "rbac.authorization.k8s.io":
        errs.append(FieldError("roleRef.apiGroup", "NotSupported", 'supported values: "rbac.authorization.k8s.io"', ref.get("apiGroup")))
    if old is not None and (old.get("roleRef") or {}) != ref:
        errs.append(FieldError("roleRef", "Invalid", "cannot change roleRef", ref))
    for i, sub in enumerate(obj.get("subjects") or []):
        if not isinstance(sub, dict):
            errs.append(FieldError(f"subjects[{i}]", "Invalid", "must be an object", sub))
            continue
        if not sub.get("name"):
            errs.append(FieldError(f"subjects[{i}].name", "Required"))
        kind = sub.get("kind")
        if kind not in ("User", "Group", "ServiceAccount"):
            errs.append(FieldError(f"subjects[{i}].kind", "NotSupported", 'supported values: "Group", "ServiceAccount", "User"', kind))
        elif kind == "ServiceAccount":
            if sub.get("apiGroup"):
                errs.append(FieldError(f"subjects[{i}].apiGroup", "NotSupported", 'supported values: ""', sub.get("apiGroup")))
            if not sub.get("namespace") and not namespaced:  # a RoleBinding's defaults to its own namespace
                errs.append(FieldError(f"subjects[{i}].namespace", "Required"))
        elif sub.get("apiGroup") != "rbac.authorization.k8s.io":
            errs.append(FieldError(f"subjects[{i}].apiGroup", "NotSupported", 'supported values: "rbac.authorization.k8s.io"', sub.get("apiGroup")))


def validate(rt: ResourceType, obj: dict, old: dict | None = None) -> list[FieldError]:
    """Field-path problems with an object about to be stored (``old``: on update)."""
    errs = meta_errors(rt, obj)
    s = rt.storage
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    if s == ("", "pods"):
        _containers(spec, "spec", errs)
        if old is not None and _pod_spec_changed(old.get("spec"), spec):
            errs.append(FieldError("spec", "Forbidden", "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)"))
    elif s in (("apps", "deployments"), ("apps", "replicasets"), ("apps", "statefulsets")):
        _workload(obj, errs, rt.kind)
        if old is not None and (old.get("spec") or {}).get("selector") != spec.get("selector"):
            errs.append(FieldError("spec.selector", "Invalid", "field is immutable", spec.get("selector")))
        if s == ("apps", "statefulsets"):
            if spec.get("podManagementPolicy") not in ("OrderedReady", "Parallel"):
                errs.append(FieldError("spec.podManagementPolicy", "NotSupported", 'supported values: "OrderedReady", "Parallel"', spec.get("podManagementPolicy")))
            ut = (spec.get("updateStrategy") or {}).get("type")
            if ut not in ("RollingUpdate", "OnDelete"):
                errs.append(FieldError("spec.updateStrategy.type", "NotSupported", 'supported values: "RollingUpdate", "OnDelete"', ut))
            for i, t in enumerate(spec.get("volumeClaimTemplates") or []):
                if not (t.get("metadata") or {}).get("name"):
                    errs.append(FieldError(f"spec.volumeClaimTemplates[{i}].metadata.name", "Required"))
            if old is not None and _old_new_spec_diff(
                old.get("spec"), spec,
                ("replicas", "ordinals", "template", "updateStrategy", "revisionHistoryLimit", "persistentVolumeClaimRetentionPolicy", "minReadySeconds"),
            ):
                errs.append(FieldError("spec", "Forbidden", "updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', 'revisionHistoryLimit', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden"))
        if s == ("apps", "deployments"):
            st = (spec.get("strategy") or {}).get("type")
            if st not in ("RollingUpdate", "Recreate"):
                errs.append(FieldError("spec.strategy.type", "NotSupported", 'supported values: "Recreate", "RollingUpdate"', st))
            if st == "Recreate" and (spec.get("strategy") or {}).get("rollingUpdate"):
                errs.append(FieldError("spec.strategy.rollingUpdate", "Forbidden", "may not be specified when strategy `type` is 'Recreate'"))
    elif s in (("rbac.authorization.k8s.io", "rolebindings"), ("rbac.authorization.k8s.io", "clusterrolebindings")):
        _rbac_binding(obj, old, errs, s[1] == "rolebindings")
    elif s in (("rbac.authorization.k8s.io", "roles"), ("rbac.authorization.k8s.io", "clusterroles")):
        for i, r in enumerate(obj.get("rules") or []):
            if not isinstance(r, dict) or not r.get("verbs"):
                errs.append(FieldError(f"rules[{i}].verbs", "Required"))
            elif r.get("nonResourceURLs") and (r.get("resources") or r.get("apiGroups")):
                errs.append(FieldError(f"rules[{i}].nonResourceURLs", "Invalid", "rules cannot apply to both regular resources and non-resource URLs", r["nonResourceURLs"]))
            elif r.get("nonResourceURLs") and s[1] == "roles":
                errs.append(FieldError(f"rules[{i}].nonResourceURLs", "Invalid", "namespaced rules cannot apply to non-resource URLs", r["nonResourceURLs"]))
            elif not r.get("nonResourceURLs") and not r.get("resources"):
                errs.append(FieldError(f"rules[{i}].resources", "Required", "resource rules must supply at least one resource"))
            elif not r.get("nonResourceURLs") and not r.get("apiGroups"):
                errs.append(FieldError(f"rules[{i}].apiGroups", "Required", "resource rules must supply at least one api group"))
    elif s == ("", "services"):
        for i, p in enumerate(spec.get("ports") or []):
            port = p.get("port")
            if not isinstance(port, int) or not 0 < port < 65536:
                errs.append(FieldError(f"spec.ports[{i}].port", "Invalid", "must be between 1 and 65535, inclusive", port))
        if len(spec.get("ports") or []) > 1:
            for i, p in enumerate(spec["ports"]):
                if not p.get("name"):
                    errs.append(FieldError(f"spec.ports[{i}].name", "Required"))
        if spec.get("type") not in ("ClusterIP", "NodePort", "LoadBalancer", "ExternalName"):
            errs.append(FieldError("spec.type", "NotSupported", 'supported values: "ClusterIP", "ExternalName", "LoadBalancer", "NodePort"', spec.get("type")))
        if old is not None:
            oip = (old.get("spec") or {}).get("clusterIP")
            if oip and spec.get("clusterIP") not in (None, "", oip):
                errs.append(FieldError("spec.clusterIP", "Invalid", "field is immutable", spec.get("clusterIP")))
    elif s == ("", "secrets"):
        for k, v in (obj.get("data") or {}).items():
            try:
                base64.b64decode(v or "", validate=True)
            except (binascii.Error, TypeError, ValueError):
                errs.append(FieldError(f"data[{k}]", "Invalid", "must be base64-encoded", "<value>"))
        _immutable_data(obj, old, ("data", "type"), errs)
    elif s == ("", "configmaps"):
        _immutable_data(obj, old, ("data", "binaryData"), errs)
    elif s == ("networking.k8s.io", "networkpolicies"):
        _network_policy(spec, errs)
    elif s == ("admissionregistration.k8s.io", "validatingwebhookconfigurations"):
        from .webhooks import config_errors

        errs += config_errors(obj)
    elif s == ("policy", "poddisruptionbudgets"):
        if "minAvailable" in spec and "maxUnavailable" in spec:
            errs.append(FieldError("spec", "Invalid", "minAvailable and maxUnavailable cannot be both set", spec))
    elif s == ("", "persistentvolumeclaims"):
        if old is None and not ((spec.get("resources") or {}).get("requests") or {}).get("storage"):
            errs.append(FieldError("spec.resources.requests[storage]", "Required"))
        if old is None and not spec.get("accessModes"):
            errs.append(FieldError("spec.accessModes", "Required", "at least 1 access mode is required"))
        if old is not None:
            o = {k: v for k, v in (old.get("spec") or {}).items() if k not in ("resources", "volumeName")}
            n = {k: v for k, v in spec.items() if k not in ("resources", "volumeName")}
            if o != n:
                errs.append(FieldError("spec", "Forbidden", "spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims"))
    elif s == storage.STORAGECLASSES:
        _storage_class(obj, old, errs)
    return errs


def _storage_class(obj: dict, old: dict | None, errs: list[FieldError]) -> None:
    """What the API validates of a StorageClass (top-level fields; it has no spec)."""
    if not obj.get("provisioner"):
        errs.append(FieldError("provisioner", "Required"))
    if obj.get("reclaimPolicy") not in ("Delete", "Retain"):
        errs.append(FieldError("reclaimPolicy", "NotSupported", 'supported values: "Delete", "Retain"', obj.get("reclaimPolicy")))
    if obj.get("volumeBindingMode") not in ("Immediate", "WaitForFirstConsumer"):
        errs.append(FieldError("volumeBindingMode", "NotSupported", 'supported values: "Immediate", "WaitForFirstConsumer"',
                               obj.get("volumeBindingMode")))
    if old is not None:
        for key, why in storage.IMMUTABLE.items():
            if (old.get(key) or None) != (obj.get(key) or None):
                errs.append(FieldError(key, "Forbidden" if key != "volumeBindingMode" else "Invalid", why, obj.get(key)))


def _network_policy(spec: dict, errs: list[FieldError]) -> None:
    """What the API validates of a NetworkPolicy: selectors, peers, ipBlocks, ports."""
    errs += label_selector_errors(spec.get("podSelector"), "spec.podSelector")
    for t in spec.get("policyTypes") or []:
        if t not in ("Ingress", "Egress"):
            errs.append(FieldError("spec.policyTypes", "NotSupported", 'supported values: "Egress", "Ingress"', t))
    for direction, peers_key in (("ingress", "from"), ("egress", "to")):
        for i, rule in enumerate(spec.get(direction) or []):
            path = f"spec.{direction}[{i}]"
            for j, port in enumerate(rule.get("ports") or []):
                _network_policy_port(port, f"{path}.ports[{j}]", errs)
            for j, peer in enumerate(rule.get(peers_key) or []):
                ppath = f"{path}.{peers_key}[{j}]"
                given = [k for k in ("podSelector", "namespaceSelector", "ipBlock") if peer.get(k) is not None]
                if not given:
                    errs.append(FieldError(ppath, "Required", "must specify a peer"))
                elif "ipBlock" in given and len(given) > 1:
                    errs.append(FieldError(ppath, "Forbidden", "may not specify more than 1 peer type"))
                for k in ("podSelector", "namespaceSelector"):
                    errs += label_selector_errors(peer.get(k), f"{ppath}.{k}")
                if "ipBlock" in given:
                    _ip_block(peer["ipBlock"], f"{ppath}.ipBlock", errs)


def _network_policy_port(port: dict, path: str, errs: list[FieldError]) -> None:
    if port.get("protocol", "TCP") not in ("TCP", "UDP", "SCTP"):
        errs.append(FieldError(f"{path}.protocol", "NotSupported", 'supported values: "SCTP", "TCP", "UDP"', port.get("protocol")))
    number, end = port.get("port"), port.get("endPort")
    if isinstance(number, int) and not 0 < number < 65536:
        errs.append(FieldError(f"{path}.port", "Invalid", "must be between 1 and 65535, inclusive", number))
    elif isinstance(number, str) and not re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,13}[a-z0-9])?", number):
        errs.append(FieldError(f"{path}.port", "Invalid", "must be no more than 15 characters, lower case alphanumerics or '-'", number))
    if end is not None:
        if not isinstance(number, int):
            errs.append(FieldError(f"{path}.endPort", "Invalid", "may not be specified when `port` is non-numeric", end))
        elif not isinstance(end, int) or end < number or end > 65535:
            errs.append(FieldError(f"{path}.endPort", "Invalid", "must be greater than or equal to `port` and at most 65535", end))


def _ip_block(block: dict, path: str, errs: list[FieldError]) -> None:
    try:
        cidr = ipaddress.ip_network(block.get("cidr") or "", strict=False)
    except ValueError:
        errs.append(FieldError(f"{path}.cidr", "Invalid", "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)", block.get("cidr")))
        return
    for k, text in enumerate(block.get("except") or []):
        try:
            inner = ipaddress.ip_network(text, strict=False)
        except ValueError:
            errs.append(FieldError(f"{path}.except[{k}]", "Invalid", "must be a valid CIDR value", text))
            continue
        if inner.version != cidr.version or not inner.subnet_of(cidr) or inner == cidr:
            errs.append(FieldError(f"{path}.except[{k}]", "Invalid", "must be a strict subset of `cidr`", text))


def _immutable_data(obj: dict, old: dict | None, fields: tuple[str, ...], errs: list[FieldError]) -> None:
    if old is None or not old.get("immutable"):
        return
    if not obj.get("immutable"):
        errs.append(FieldError("immutable", "Forbidden", "field is immutable when `immutable` is set"))
    for f in fields:
        if old.get(f) != obj.get(f):
            errs.append(FieldError(f, "Forbidden", "field is immutable when `immutable` is set"))


def preserve_on_update(rt: ResourceType, old: dict, new: dict) -> None:
    """Values the server allocated that an update may leave out (kept from ``old``)."""
    if rt.storage == ("", "services"):
        ospec, nspec = old.get("spec") or {}, new.setdefault("spec", {})
        for key in ("clusterIP", "clusterIPs"):
            if ospec.get(key) and not nspec.get(key):
                nspec[key] = copy.deepcopy(ospec[key])
    if rt.storage == ("", "namespaces"):
        nspec = new.setdefault("spec", {})
        if "finalizers" not in nspec and (old.get("spec") or {}).get("finalizers") is not None:
            nspec["finalizers"] = list(old["spec"]["finalizers"])


# --- events.k8s.io/v1 <-> v1 -------------------------------------------------------

_EV_MAP = (
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("reportingController", "reportingComponent"),
    ("reportingInstance", "reportingInstance"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
)
_EV_SAME = ("eventTime", "series", "action", "reason", "related", "type")


def event_to_v1beta(core: dict) -> dict:
    """A stored (core/v1) Event as an events.k8s.io/v1 Event."""
    out: dict[str, Any] = {"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": core.get("metadata", {})}
    for new, old in _EV_MAP:
        if core.get(old) not in (None, "", {}):
            out[new] = core[old]
    for k in _EV_SAME:
        if core.get(k) not in (None, ""):
            out[k] = core[k]
    series = out.get("series")
    if isinstance(series, dict) and "lastObservedTime" not in series and core.get("lastTimestamp"):
        series["lastObservedTime"] = core["lastTimestamp"]
    return out


def event_from_v1beta(ev: dict) -> dict:
    out: dict[str, Any] = {"apiVersion": "v1", "kind": "Event", "metadata": ev.get("metadata", {})}
    for new, old in _EV_MAP:
        if ev.get(new) not in (None, ""):
            out[old] = ev[new]
    for k in _EV_SAME:
        if ev.get(k) not in (None, ""):
            out[k] = ev[k]
    out.setdefault("involvedObject", {})
    return out
