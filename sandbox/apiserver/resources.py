"""What the stand-in serves: one :class:`ResourceType` per group/version/resource.

Built-in types are listed in :data:`BUILTINS`; a CustomResourceDefinition adds
one type per served version (:func:`from_crd`). Objects are stored once per
``storage`` key (group, plural) whatever version they are read in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from . import schema as crdschema
from .errors import FieldError

ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclass(frozen=True)
class ResourceType:
    group: str
    version: str
    plural: str
    singular: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()  # status, scale, binding, eviction
    verbs: tuple[str, ...] = ALL_VERBS
    storage_group: str | None = None  # events.k8s.io events live with core events
    generation: bool = False  # metadata.generation counts spec changes
    # custom resources
    crd_name: str | None = None
    schema: dict | None = field(default=None, hash=False, compare=False)
    printer_columns: tuple = field(default=(), hash=False, compare=False)
    scale: dict | None = field(default=None, hash=False, compare=False)
    selectable: tuple[str, ...] = ()

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def storage(self) -> tuple[str, str]:
        return (self.group if self.storage_group is None else self.storage_group, self.plural)

    @property
    def custom(self) -> bool:
        return self.crd_name is not None

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    @property
    def base_path(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else "/api/v1"


def _rt(group, version, plural, kind, namespaced=True, short=(), sub=(), cats=(), singular=None, **kw) -> ResourceType:
    return ResourceType(
        group=group,
        version=version,
        plural=plural,
        singular=singular or kind.lower(),
        kind=kind,
        namespaced=namespaced,
        short_names=tuple(short),
        subresources=tuple(sub),
        categories=tuple(cats),
        **kw,
    )


BUILTINS: tuple[ResourceType, ...] = (
    _rt("", "v1", "namespaces", "Namespace", namespaced=False, short=("ns",), sub=("status", "finalize"),
        verbs=("create", "delete", "get", "list", "patch", "update", "watch")),
    _rt("", "v1", "nodes", "Node", namespaced=False, short=("no",), sub=("status",)),
    _rt("", "v1", "pods", "Pod", short=("po",), sub=("status", "binding", "eviction"), cats=("all",)),
    _rt("", "v1", "services", "Service", short=("svc",), sub=("status",), cats=("all",),
        verbs=("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")),
    _rt("", "v1", "bindings", "Binding", verbs=("create",)),  # POST only: binds the pod named in the body
    _rt("", "v1", "endpoints", "Endpoints", short=("ep",), singular="endpoints"),
    _rt("", "v1", "configmaps", "ConfigMap", short=("cm",)),
    _rt("", "v1", "secrets", "Secret"),
    _rt("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", short=("pvc",), sub=("status",)),
    _rt("", "v1", "events", "Event", short=("ev",)),
    _rt("", "v1", "resourcequotas", "ResourceQuota", short=("quota",), sub=("status",)),
    _rt("", "v1", "limitranges", "LimitRange", short=("limits",)),
    _rt("", "v1", "serviceaccounts", "ServiceAccount", short=("sa",), sub=("token",)),
    _rt("apps", "v1", "statefulsets", "StatefulSet", short=("sts",), sub=("status", "scale"), cats=("all",), generation=True),
    _rt("apps", "v1", "deployments", "Deployment", short=("deploy",), sub=("status", "scale"), cats=("all",), generation=True),
    _rt("apps", "v1", "replicasets", "ReplicaSet", short=("rs",), sub=("status", "scale"), cats=("all",), generation=True),
    _rt("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", short=("pdb",), sub=("status",), generation=True),
    # Enforced on the pod network by the kubelet process (sandbox/netpol.py).
    _rt("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", short=("netpol",), generation=True),
    _rt("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations", "ValidatingWebhookConfiguration",
        namespaced=False, cats=("api-extensions",), generation=True),
    _rt("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", namespaced=False,
        short=("crd", "crds"), sub=("status",), cats=("api-extensions",), generation=True),
    _rt("events.k8s.io", "v1", "events", "Event", short=("ev",), storage_group=""),
    _rt("coordination.k8s.io", "v1", "leases", "Lease"),
    # Provisioned by the stand-in's persistent volume controller (storage.py).
    _rt("storage.k8s.io", "v1", "storageclasses", "StorageClass", namespaced=False, short=("sc",)),
    _rt("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    _rt("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
    _rt("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False),
    _rt("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False),
    # answered, never stored (create only)
    _rt("authorization.k8s.io", "v1", "selfsubjectaccessreviews", "SelfSubjectAccessReview", namespaced=False, verbs=("create",)),
    _rt("authorization.k8s.io", "v1", "selfsubjectrulesreviews", "SelfSubjectRulesReview", namespaced=False, verbs=("create",)),
    _rt("authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview", namespaced=False, verbs=("create",)),
    _rt("authorization.k8s.io", "v1", "localsubjectaccessreviews", "LocalSubjectAccessReview", verbs=("create",)),
    _rt("authentication.k8s.io", "v1", "selfsubjectreviews", "SelfSubjectReview", namespaced=False, verbs=("create",)),
    _rt("authentication.k8s.io", "v1", "tokenreviews", "TokenReview", namespaced=False, verbs=("create",)),
)

REVIEWS = {
    ("authorization.k8s.io", "selfsubjectaccessreviews"),
    ("authorization.k8s.io", "selfsubjectrulesreviews"),
    ("authorization.k8s.io", "subjectaccessreviews"),
    ("authorization.k8s.io", "localsubjectaccessreviews"),
    ("authentication.k8s.io", "selfsubjectreviews"),
    ("authentication.k8s.io", "tokenreviews"),
}

PREFERRED_GROUP_ORDER = ("", "apps", "events.k8s.io", "authentication.k8s.io", "authorization.k8s.io", "policy",
                         "rbac.authorization.k8s.io", "storage.k8s.io", "apiextensions.k8s.io", "coordination.k8s.io")


def crd_errors(crd: dict) -> list[FieldError]:
    """What Kubernetes would refuse in a CustomResourceDefinition (the subset we check)."""
    errs: list[FieldError] = []
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    group = spec.get("group") or ""
    if not group:
        errs.append(FieldError("spec.group", "Required"))
    elif "." not in group:
        errs.append(FieldError("spec.group", "Invalid", "should be a domain with at least one dot", group))
    for key in ("plural", "kind"):
        if not names.get(key):
            errs.append(FieldError(f"spec.names.{key}", "Required"))
    plural = names.get("plural") or ""
    if plural and not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", plural):
        errs.append(FieldError("spec.names.plural", "Invalid", "a lowercase RFC 1123 label", plural))
    if plural and group and crd.get("metadata", {}).get("name") != f"{plural}.{group}":
        errs.append(FieldError("metadata.name", "Invalid", 'must be spec.names.plural+"."+spec.group', crd.get("metadata", {}).get("name")))
    if spec.get("scope") not in ("Namespaced", "Cluster"):
        errs.append(FieldError("spec.scope", "NotSupported", 'supported values: "Cluster", "Namespaced"', spec.get("scope")))
    versions = spec.get("versions") or []
    if not versions:
        errs.append(FieldError("spec.versions", "Required"))
    if versions and sum(1 for v in versions if v.get("storage")) != 1:
        errs.append(FieldError("spec.versions", "Invalid", "must have exactly one version marked as storage version", [v.get("name") for v in versions]))
    for i, v in enumerate(versions):
        if not v.get("name"):
            errs.append(FieldError(f"spec.versions[{i}].name", "Required"))
        s = (v.get("schema") or {}).get("openAPIV3Schema")
        if s is not None:
            problem = crdschema.check_schema(s)
            if problem:
                errs.append(FieldError(f"spec.versions[{i}].schema.openAPIV3Schema", "Invalid", problem, "<schema>"))
    conv = (spec.get("conversion") or {}).get("strategy", "None")
    if conv != "None":
        errs.append(FieldError("spec.conversion.strategy", "NotSupported",
                               'this stand-in serves only conversion strategy "None" (no conversion webhooks)', conv))
    return errs


def from_crd(crd: dict) -> list[ResourceType]:
    """The resource types a CRD serves (one per served version)."""
    spec = crd["spec"]
    names = spec["names"]
    out = []
    for v in spec.get("versions") or []:
        if not v.get("served", True):
            continue
        subs = v.get("subresources") or {}
        cols = tuple(v.get("additionalPrinterColumns") or ())
        out.append(
            ResourceType(
                group=spec["group"],
                version=v["name"],
                plural=names["plural"],
                singular=names.get("singular") or names["kind"].lower(),
                kind=names["kind"],
                namespaced=spec.get("scope") == "Namespaced",
                short_names=tuple(names.get("shortNames") or ()),
                categories=tuple(names.get("categories") or ()),
                subresources=tuple(k for k in ("status", "scale") if k in subs),
                generation=True,
                crd_name=crd["metadata"]["name"],
                schema=(v.get("schema") or {}).get("openAPIV3Schema"),
                printer_columns=cols,
                scale=subs.get("scale"),
                selectable=tuple(f["jsonPath"].lstrip(".") for f in v.get("selectableFields") or ()),
            )
        )
    return out


class Registry:
    """Resource types by group/version/plural, and the lookups discovery needs."""

    def __init__(self) -> None:
        self._types: dict[tuple[str, str, str], ResourceType] = {}
        self._crd_versions: dict[str, list[tuple[str, str, str]]] = {}
        self._crd_preferred: dict[str, str] = {}
        self.changed = 0  # bumps on every change, for discovery caches
        for rt in BUILTINS:
            self._types[(rt.group, rt.version, rt.plural)] = rt

    def get(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self._types.get((group, version, plural))

    def all(self) -> list[ResourceType]:
        return list(self._types.values())

    def by_storage(self, storage: tuple[str, str]) -> ResourceType | None:
        """The preferred type an object of this storage key is presented as."""
        group, plural = storage
        preferred = self._crd_preferred.get(group)
        for rt in self._types.values():
            if rt.storage == storage and rt.storage_group is None and (preferred is None or rt.version == preferred):
                return rt
        for rt in self._types.values():
            if rt.storage == storage:
                return rt
        return None

    def by_kind(self, api_version: str, kind: str) -> ResourceType | None:
        group, _, version = api_version.rpartition("/")
        for rt in self._types.values():
            if rt.group == group and rt.version == version and rt.kind == kind:
                return rt
        return None

    def storages(self) -> list[tuple[str, str]]:
        seen: dict[tuple[str, str], None] = {}
        for rt in self._types.values():
            seen[rt.storage] = None
        return list(seen)

    def set_crd(self, crd: dict) -> None:
        self.remove_crd(crd["metadata"]["name"], bump=False)
        types = from_crd(crd)
        storage_version = next((v["name"] for v in crd["spec"]["versions"] if v.get("storage")), None)
        self._crd_preferred[crd["spec"]["group"]] = storage_version or (types[0].version if types else "")
        keys = []
        for rt in types:
            key = (rt.group, rt.version, rt.plural)
            self._types[key] = rt
            keys.append(key)
        self._crd_versions[crd["metadata"]["name"]] = keys
        self.changed += 1

    def remove_crd(self, name: str, bump: bool = True) -> None:
        for key in self._crd_versions.pop(name, []):
            self._types.pop(key, None)
        if bump:
            self.changed += 1

    def groups(self) -> list[tuple[str, list[str]]]:
        """(group, versions) with the preferred version first; core ("") first."""
        found: dict[str, list[str]] = {}
        for rt in self._types.values():
            found.setdefault(rt.group, [])
            if rt.version not in found[rt.group]:
                found[rt.group].append(rt.version)
        order = {g: i for i, g in enumerate(PREFERRED_GROUP_ORDER)}
        out = []
        for g in sorted(found, key=lambda g: (order.get(g, len(order)), g)):
            versions = sorted(found[g], key=_version_priority)
            pref = self._crd_preferred.get(g)
            if pref in versions:
                versions.remove(pref)
                versions.insert(0, pref)
            out.append((g, versions))
        return out

    def in_group_version(self, group: str, version: str) -> list[ResourceType]:
        return [rt for (g, v, _), rt in self._types.items() if g == group and v == version]


def _version_priority(v: str) -> tuple:
    """Kubernetes' version order: GA > beta > alpha, higher numbers first."""
    m = re.fullmatch(r"v(\d+)(?:(alpha|beta)(\d+))?", v)
    if not m:
        return (3, 0, 0, v)
    major = int(m.group(1))
    stage = {"": 0, "beta": 1, "alpha": 2}[m.group(2) or ""]
    minor = int(m.group(3) or 0)
    return (stage, -major, -minor, v)


def find_by_name(reg: Registry, name: str) -> ResourceType | None:
    """A resource by plural, singular, short name or kind (case-insensitive)."""
    low = name.lower()
    for rt in reg.all():
        if low in (rt.plural, rt.singular, rt.kind.lower()) or low in rt.short_names:
            return rt
    return None


def crd_of(obj: dict[str, Any]) -> bool:
    return obj.get("kind") == "CustomResourceDefinition"
