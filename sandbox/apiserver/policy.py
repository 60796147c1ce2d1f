"""The bootstrap RBAC policy the stand-in creates at start, as kube-apiserver
does (``plugin/pkg/auth/authorizer/rbac/bootstrappolicy``): a subset sized to
what this server serves. Pure data; :mod:`.server` reconciles it.

The user-facing roles ``admin``, ``edit`` and ``view`` are aggregated, as in
Kubernetes: they hold no rules of their own but an ``aggregationRule``, and the
clusterrole-aggregation controller (:mod:`.controllers.aggregation`) fills in
the rules of the ClusterRoles labelled ``rbac.authorization.k8s.io/aggregate-to-<role>``.
The built-in grants come from ``system:aggregate-to-admin``, ``-edit`` and
``-view``; ``view`` is labelled into ``edit``, and ``edit`` into ``admin``. A
custom resource's group (``slurmk8s.dev``) is in none of them: its chart ships
labelled ClusterRoles, as on a real cluster."""

from __future__ import annotations

BOOTSTRAP_LABELS = {"kubernetes.io/bootstrapping": "rbac-defaults"}
AUTOUPDATE = {"rbac.authorization.kubernetes.io/autoupdate": "true"}
#: ``aggregate_to("edit")``: the label that puts a ClusterRole's rules into ``edit``.
AGGREGATE_TO = "rbac.authorization.k8s.io/aggregate-to-"


def aggregate_to(role: str) -> dict[str, str]:
    return {AGGREGATE_TO + role: "true"}

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
]
_ADMIN = [
    _rule(["rbac.authorization.k8s.io"], ["roles", "rolebindings"], READ + WRITE),
    _rule(["authorization.k8s.io"], ["localsubjectaccessreviews"], ["create"]),
]

CLUSTER_ROLES: list[dict] = [
    {"metadata": {"name": "cluster-admin"},
     "rules": [_rule(["*"], ["*"], ["*"]), _urls(["*"], ["*"])]},
    {"metadata": {"name": "admin"}, "aggregate": "admin"},
    {"metadata": {"name": "edit", "labels": aggregate_to("admin")}, "aggregate": "edit"},
    {"metadata": {"name": "view", "labels": aggregate_to("edit")}, "aggregate": "view"},
    {"metadata": {"name": "system:aggregate-to-admin", "labels": aggregate_to("admin")}, "rules": _ADMIN},
    {"metadata": {"name": "system:aggregate-to-edit", "labels": aggregate_to("edit")}, "rules": _EDIT},
    {"metadata": {"name": "system:aggregate-to-view", "labels": aggregate_to("view")}, "rules": _VIEW},
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
    """The bootstrap ClusterRoles; an aggregated one has an ``aggregationRule``
    and no rules (the controller fills them in)."""
    out = []
    for cr in CLUSTER_ROLES:
        labels = dict(cr["metadata"].get("labels") or {}) | BOOTSTRAP_LABELS
        doc = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
               "metadata": {"name": cr["metadata"]["name"], "labels": labels, "annotations": dict(AUTOUPDATE)},
               "rules": [dict(r) for r in cr.get("rules") or ()]}
        if "aggregate" in cr:
            doc["aggregationRule"] = {"clusterRoleSelectors": [{"matchLabels": aggregate_to(cr["aggregate"])}]}
        out.append(doc)
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
    rules/subjects, aggregation selectors and labels if it drifted and still
    carries the autoupdate annotation, ``None`` to leave it (a user set
    autoupdate to false, or nothing changed). As kube-apiserver's
    reconciliation, an aggregated role's rules are not reconciled: the
    aggregation controller owns them."""
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
    if "aggregationRule" in wanted:
        selectors = list((current.get("aggregationRule") or {}).get("clusterRoleSelectors") or [])
        missing = [s for s in wanted["aggregationRule"]["clusterRoleSelectors"] if s not in selectors]
        if missing:
            out["aggregationRule"] = {"clusterRoleSelectors": selectors + missing}
            changed = True
    if "roleRef" in wanted and current.get("roleRef") != wanted["roleRef"]:
        return None  # roleRef is immutable; a user replaced it: leave theirs
    md = dict(current.get("metadata") or {})
    labels = dict(md.get("labels") or {})
    wanted_labels = (wanted.get("metadata") or {}).get("labels") or BOOTSTRAP_LABELS
    if any(k not in labels for k in wanted_labels):  # missing labels come back; a user's value stays
        labels = dict(wanted_labels) | labels
        md["labels"] = labels
        out["metadata"] = md
        changed = True
    return out if changed else None
