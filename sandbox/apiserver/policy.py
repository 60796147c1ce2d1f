"""The bootstrap RBAC policy the stand-in creates at start, as kube-apiserver
does (``plugin/pkg/auth/authorizer/rbac/bootstrappolicy``): a subset sized to
what this server serves. Pure data; :mod:`.server` reconciles it."""

from __future__ import annotations

BOOTSTRAP_LABELS = {"kubernetes.io/bootstrapping": "rbac-defaults"}
AUTOUPDATE = {"rbac.authorization.kubernetes.io/autoupdate": "true"}

READ = ["get", "list", "watch"]
WRITE = ["create", "delete", "deletecollection", "patch", "update"]


def _rule(groups, resources, verbs, names=None) -> dict:
    r = {"verbs": list(verbs), "apiGroups": list(groups), "resources": list(resources)}
    if names:
        r["resourceNames"] = list(names)
    return r


def _urls(urls, verbs=("get",)) -> dict:
    return {"verbs": list(verbs), "nonResourceURLs": list(urls)}


# what `view`, `edit` and `admin` cover, by API group (namespaced types this server serves)
_VIEW = [
    _rule([""], ["pods", "pods/status", "pods/log", "services", "services/status", "endpoints", "configmaps",
                 "persistentvolumeclaims", "persistentvolumeclaims/status", "events", "serviceaccounts",
                 "replicationcontrollers", "namespaces", "namespaces/status"], READ),
    _rule(["apps"], ["statefulsets", "statefulsets/status", "statefulsets/scale", "deployments", "deployments/status",
                     "deployments/scale", "replicasets", "replicasets/status", "replicasets/scale"], READ),
    _rule(["policy"], ["poddisruptionbudgets", "poddisruptionbudgets/status"], READ),
    _rule(["events.k8s.io"], ["events"], READ),
    _rule(["slurmk8s.dev"], ["*"], READ),
]
_EDIT = [
    _rule([""], ["pods", "pods/attach", "pods/exec", "pods/portforward", "pods/proxy", "pods/eviction", "services",
                 "endpoints", "configmaps", "secrets", "persistentvolumeclaims", "events"], WRITE),
    _rule([""], ["secrets"], READ),
    _rule([""], ["serviceaccounts"], WRITE),
    _rule([""], ["serviceaccounts/token"], ["create"]),
    _rule(["apps"], ["statefulsets", "statefulsets/scale", "deployments", "deployments/scale", "replicasets",
                     "replicasets/scale"], WRITE),
    _rule(["policy"], ["poddisruptionbudgets"], WRITE),
    _rule(["coordination.k8s.io"], ["leases"], READ + WRITE),
    _rule(["slurmk8s.dev"], ["*"], WRITE),
]
_ADMIN = [
    _rule(["rbac.authorization.k8s.io"], ["roles", "rolebindings"], READ + WRITE),
    _rule(["authorization.k8s.io"], ["localsubjectaccessreviews"], ["create"]),
]

CLUSTER_ROLES: list[dict] = [
    {"metadata": {"name": "cluster-admin"},
     "rules": [_rule(["*"], ["*"], ["*"]), _urls(["*"], ["*"])]},
    {"metadata": {"name": "admin"}, "rules": _VIEW + _EDIT + _ADMIN},
    {"metadata": {"name": "edit"}, "rules": _VIEW + _EDIT},
    {"metadata": {"name": "view"}, "rules": _VIEW},
    {"metadata": {"name": "system:discovery"},
     "rules": [_urls(["/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi", "/openapi/*",
                      "/readyz", "/version", "/version/"])]},
    {"metadata": {"name": "system:basic-user"},
     "rules": [_rule(["authorization.k8s.io"], ["selfsubjectaccessreviews", "selfsubjectrulesreviews"], ["create"]),
               _rule(["authentication.k8s.io"], ["selfsubjectreviews"], ["create"])]},
    {"metadata": {"name": "system:public-info-viewer"},
     "rules": [_urls(["/healthz", "/livez", "/readyz", "/version", "/version/"])]},
    {"metadata": {"name": "system:node"},
     "rules": [
         _rule(["authentication.k8s.io"], ["tokenreviews"], ["create"]),
         _rule(["authorization.k8s.io"], ["subjectaccessreviews", "localsubjectaccessreviews"], ["create"]),
         _rule([""], ["services", "endpoints"], READ),
         _rule([""], ["nodes"], READ + ["create", "patch", "update", "delete"]),
         _rule([""], ["nodes/status"], ["patch", "update"]),
         _rule([""], ["events"], ["create", "patch", "update"]),
         _rule(["events.k8s.io"], ["events"], ["create", "patch", "update"]),
         _rule([""], ["pods"], READ + ["create", "delete"]),
         _rule([""], ["pods/status"], ["patch", "update"]),
         _rule([""], ["pods/eviction"], ["create"]),
         _rule([""], ["configmaps", "secrets"], READ),
         _rule([""], ["persistentvolumeclaims", "persistentvolumes"], ["get"]),
         _rule([""], ["persistentvolumeclaims/status"], ["get", "patch", "update"]),
         _rule([""], ["serviceaccounts"], ["get"]),
         _rule([""], ["serviceaccounts/token"], ["create"]),
         _rule(["coordination.k8s.io"], ["leases"], READ + ["create", "delete", "patch", "update"]),
     ]},
]

CLUSTER_ROLE_BINDINGS: list[dict] = [
    {"metadata": {"name": "cluster-admin"}, "roleRef": "cluster-admin", "groups": ["system:masters"]},
    {"metadata": {"name": "system:discovery"}, "roleRef": "system:discovery", "groups": ["system:authenticated"]},
    {"metadata": {"name": "system:basic-user"}, "roleRef": "system:basic-user", "groups": ["system:authenticated"]},
    {"metadata": {"name": "system:public-info-viewer"}, "roleRef": "system:public-info-viewer",
     "groups": ["system:authenticated", "system:unauthenticated"]},
    {"metadata": {"name": "system:node"}, "roleRef": "system:node", "groups": ["system:nodes"]},
]


def cluster_roles() -> list[dict]:
    out = []
    for cr in CLUSTER_ROLES:
        out.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                    "metadata": {"name": cr["metadata"]["name"], "labels": dict(BOOTSTRAP_LABELS), "annotations": dict(AUTOUPDATE)},
                    "rules": [dict(r) for r in cr["rules"]]})
    return out


def cluster_role_bindings() -> list[dict]:
    out = []
    for b in CLUSTER_ROLE_BINDINGS:
        out.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                    "metadata": {"name": b["metadata"]["name"], "labels": dict(BOOTSTRAP_LABELS), "annotations": dict(AUTOUPDATE)},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": b["roleRef"]},
                    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": g} for g in b["groups"]]})
    return out


def reconcile(current: dict | None, wanted: dict) -> dict | None:
    """What to write for a bootstrap object: ``wanted`` if missing, a union of
    rules/subjects if it drifted and still carries the autoupdate annotation,
    ``None`` to leave it (a user set autoupdate to false, or nothing changed)."""
    if current is None:
        return wanted
    ann = (current.get("metadata") or {}).get("annotations") or {}
    if ann.get("rbac.authorization.kubernetes.io/autoupdate") == "false":
        return None
    out = dict(current)
    changed = False
    for key in ("rules", "subjects"):
        if key not in wanted:
            continue
        have = list(current.get(key) or [])
        for item in wanted[key]:
            if item not in have:
                have.append(item)
                changed = True
        out[key] = have
    if "roleRef" in wanted and current.get("roleRef") != wanted["roleRef"]:
        return None  # roleRef is immutable; a user replaced it: leave theirs
    md = dict(current.get("metadata") or {})
    labels = dict(md.get("labels") or {})
    if any(labels.get(k) != v for k, v in BOOTSTRAP_LABELS.items()):
        labels.update(BOOTSTRAP_LABELS)
        md["labels"] = labels
        out["metadata"] = md
        changed = True
    return out if changed else None
