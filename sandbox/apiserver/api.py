"""The API operations (get, list, create, update, patch, delete, scale, bind,
evict), shared by the HTTP routes and the in-process controllers.

Over 500 lines because it holds every verb (create, update, patch, apply,
delete, scale, bind, evict) over one store, with the order of admission,
defaults, validation and write in one place; the rules each applies are in
``strategy``, ``admission``, ``patch`` and ``apply``.

This is where Kubernetes' request semantics live: defaulting and validation,
status kept apart from the rest of the object, ``metadata.generation``,
optimistic concurrency on ``resourceVersion``, finalizers and
``deletionTimestamp``, propagation policies, graceful pod deletion.
"""

from __future__ import annotations

import copy
import ipaddress
import secrets
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import admission, jsonpath, podsecurity, quota, storage, strategy, timeutil
from . import apply as ssa
from . import patch as patches
from . import schema as crdschema
from .errors import (
    APIError,
    FieldError,
    already_exists,
    bad_request,
    conflict,
    invalid,
    not_found,
    success_status,
)
from .eviction import budget_to_spend
from .resources import Registry, ResourceType, crd_errors
from .selectors import (
    FieldSelector,
    LabelSelector,
    fields_match,
    labels_match,
    object_fields,
    selectable_fields,
)
from .store import Store, meta

PROTECTED_NAMESPACES = ("default", "kube-system", "kube-public")
CRD_STORAGE = ("apiextensions.k8s.io", "customresourcedefinitions")
CRD_CLEANUP = "customresourcecleanup.apiextensions.k8s.io"
SERVICE_CIDR = ipaddress.ip_network("10.96.0.0/16")
# DELETE answers with the object for these (as Kubernetes' registries do);
# with a Status for the others.
RETURNS_OBJECT_ON_DELETE = {
    ("", "pods"),
    ("", "services"),
    ("", "namespaces"),
    ("", "nodes"),
    ("apiextensions.k8s.io", "customresourcedefinitions"),
}


@dataclass
class Options:
    """Query options of a write."""

    dry_run: bool = False
    field_manager: str | None = None
    field_validation: str = "Warn"  # Strict | Warn | Ignore
    force: bool = False
    warnings: list[str] = field(default_factory=list)
    #: Admission's annotations of the request's audit event (Pod Security's audit mode).
    audit_annotations: dict[str, str] = field(default_factory=dict)
    # called with (rt, new, old) once an object is defaulted and valid, before it is stored:
    # the HTTP routes' RBAC escalation check (in-process controllers pass none)
    admit: Callable[[ResourceType, dict, dict | None], None] | None = None


@dataclass
class DeleteOptions:
    propagation: str | None = None  # Background | Foreground | Orphan
    grace_period: int | None = None
    precondition_uid: str | None = None
    precondition_rv: str | None = None
    dry_run: bool = False

    @classmethod
    def from_body(cls, body: dict | None, query: dict[str, str]) -> DeleteOptions:
        body = body or {}
        pre = body.get("preconditions") or {}
        policy = query.get("propagationPolicy") or body.get("propagationPolicy")
        orphan = body.get("orphanDependents")
        if orphan is None and "orphanDependents" in query:
            orphan = query["orphanDependents"] == "true"
        if policy is None and orphan is not None:
            policy = "Orphan" if orphan else "Background"
        if policy not in (None, "Background", "Foreground", "Orphan"):
            raise bad_request(f'propagationPolicy must be one of "Background", "Foreground", "Orphan", not {policy!r}')
        grace = body.get("gracePeriodSeconds")
        if grace is None and query.get("gracePeriodSeconds") not in (None, ""):
            try:
                grace = int(query["gracePeriodSeconds"])
            except ValueError as e:
                raise bad_request(f"gracePeriodSeconds must be an integer, not {query['gracePeriodSeconds']!r}") from e
        dry = body.get("dryRun") or ([query["dryRun"]] if query.get("dryRun") else [])
        return cls(policy, grace, pre.get("uid"), pre.get("resourceVersion"), bool(dry))


def new_uid() -> str:
    return str(uuid.uuid4())


def random_suffix(n: int = 5) -> str:
    return "".join(secrets.choice(strategy.GENERATE_NAME_CHARS) for _ in range(n))


def _spec_view(rt: ResourceType, obj: dict) -> Any:
    """What a change of bumps ``metadata.generation``."""
    if rt.custom or rt.storage == ("apiextensions.k8s.io", "customresourcedefinitions"):
        return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}
    return obj.get("spec")


def _same_except_rv(a: dict, b: dict) -> bool:
    ma = {k: v for k, v in meta(a).items() if k != "resourceVersion"}
    mb = {k: v for k, v in meta(b).items() if k != "resourceVersion"}
    if ma != mb:
        return False
    return {k: v for k, v in a.items() if k != "metadata"} == {k: v for k, v in b.items() if k != "metadata"}


def node_ready(node: dict | None) -> bool:
    if node is None:
        return False
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("status") == "True"
    return False


def selector_string(sel: dict | None) -> str:
    parts = [f"{k}={v}" for k, v in sorted(((sel or {}).get("matchLabels") or {}).items())]
    for e in (sel or {}).get("matchExpressions") or []:
        op = e.get("operator")
        vals = ",".join(e.get("values") or [])
        if op == "In":
            parts.append(f"{e['key']} in ({vals})")
        elif op == "NotIn":
            parts.append(f"{e['key']} notin ({vals})")
        elif op == "Exists":
            parts.append(e["key"])
        elif op == "DoesNotExist":
            parts.append(f"!{e['key']}")
    return ",".join(parts)


class API:
    def __init__(self, store: Store, registry: Registry, ca_pem: str = "") -> None:
        self.store = store
        self.registry = registry
        self.ca_pem = ca_pem
        self.crd_listeners: list[Callable[[], None]] = []

    # --- lookups ------------------------------------------------------------

    def resource(self, group: str, version: str, plural: str) -> ResourceType:
        rt = self.registry.get(group, version, plural)
        if rt is None:
            gv = f"{group}/{version}" if group else version
            raise APIError(404, f"the server could not find the requested resource ({plural} in {gv}); "
                           f"`kubectl api-resources` lists what this server serves", "NotFound",
                           {"group": group, "kind": plural})
        return rt

    def rt_of(self, api_version: str, kind: str) -> ResourceType:
        rt = self.registry.by_kind(api_version, kind)
        if rt is None:
            raise APIError(404, f'no resource of kind "{kind}" in "{api_version}" is served', "NotFound")
        return rt

    def present(self, rt: ResourceType, obj: dict) -> dict:
        """A stored object as the client asked for it (its group/version)."""
        if rt.storage_group is not None and rt.group == "events.k8s.io":
            return strategy.event_to_v1beta(obj)
        if obj.get("apiVersion") != rt.group_version:
            out = dict(obj)
            out["apiVersion"] = rt.group_version
            return out
        return obj

    def _ns(self, rt: ResourceType, ns: str | None) -> str:
        return (ns or "") if rt.namespaced else ""

    def _require(self, rt: ResourceType, ns: str | None, name: str) -> dict:
        obj = self.store.get(rt.storage, self._ns(rt, ns), name)
        if obj is None:
            raise not_found(rt.plural, rt.group, name)
        return obj

    def get(self, rt: ResourceType, ns: str | None, name: str) -> dict:
        return self.present(rt, self._require(rt, ns, name))

    def raw(self, rt: ResourceType, ns: str | None, name: str) -> dict | None:
        return self.store.get(rt.storage, self._ns(rt, ns), name)

    def matcher(self, rt: ResourceType, labels: LabelSelector, fields: FieldSelector) -> Callable[[dict], bool]:
        supported = selectable_fields(rt.storage, rt.selectable)

        def match(obj: dict) -> bool:
            if labels and not labels_match(labels, meta(obj).get("labels")):
                return False
            if fields and not fields_match(fields, object_fields(obj, supported)):
                return False
            return True

        return match

    def select(self, rt: ResourceType, ns: str | None, labels: LabelSelector = (), fields: FieldSelector = ()) -> list[dict]:
        match = self.matcher(rt, labels, fields)
        return [o for o in self.store.list(rt.storage, ns if rt.namespaced else None) if match(o)]

    # --- create ---------------------------------------------------------------

    def _check_body(self, rt: ResourceType, body: Any) -> dict:
        if not isinstance(body, dict):
            raise bad_request(f"the request body must be a {rt.kind} object (a JSON map)")
        expected_kind = rt.kind
        api_version = body.get("apiVersion")
        kind = body.get("kind")
        if rt.storage == ("", "events") and rt.group == "events.k8s.io":
            if api_version not in (None, "events.k8s.io/v1") or kind not in (None, "Event"):
                raise bad_request(f"the API version in the data ({api_version}) does not match the expected API version (events.k8s.io/v1)")
            body = strategy.event_from_v1beta(body)
            return copy.deepcopy(body)
        if api_version not in (None, "") and api_version != rt.group_version:
            raise bad_request(f"the API version in the data ({api_version}) does not match the expected API version ({rt.group_version})")
        if kind not in (None, "") and kind != expected_kind:
            raise bad_request(f"the kind in the data ({kind}) does not match the expected kind ({expected_kind})")
        body = copy.deepcopy(body)
        body["apiVersion"] = rt.group_version
        body["kind"] = expected_kind
        if not isinstance(body.get("metadata"), dict):
            body["metadata"] = {}
        return body

    def _namespace_usable(self, rt: ResourceType, ns: str | None) -> None:
        if not rt.namespaced:
            return
        if not ns:
            raise bad_request(f"{rt.plural} are namespaced: the request needs a namespace (use /namespaces/<ns>/{rt.plural})")
        nsobj = self.store.get(("", "namespaces"), "", ns)
        if nsobj is None:
            raise not_found("namespaces", "", ns)
        if meta(nsobj).get("deletionTimestamp"):
            raise APIError(403, f'{rt.plural} "{ns}" is forbidden: unable to create new content in namespace {ns} because it is being terminated',
                           "Forbidden", {"name": ns, "kind": rt.plural, "causes": [{"reason": "NamespaceTerminating", "message": f"namespace {ns} is being terminated", "field": "metadata.namespace"}]})

    def _process(self, rt: ResourceType, obj: dict, opts: Options, old: dict | None) -> dict:
        """Defaults, schema (custom resources) and validation; raises 422."""
        if rt.custom:
            out = crdschema.process(obj, rt.schema, old)
            obj = out.obj
            if out.unknown:
                if opts.field_validation == "Strict":
                    raise bad_request(
                        f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: strict decoding error: '
                        + ", ".join(f'unknown field "{p}"' for p in out.unknown)
                    )
                if opts.field_validation != "Ignore":
                    opts.warnings += [f'unknown field "{p}"' for p in out.unknown]
            errors = strategy.meta_errors(rt, obj) + out.errors
        else:
            strategy.apply_defaults(rt, obj)
            errors = strategy.validate(rt, obj, old)
        if rt.storage == ("apiextensions.k8s.io", "customresourcedefinitions"):
            errors += crd_errors(obj)
        if rt.storage == ("", "namespaces"):
            errors += [FieldError(f"metadata.labels[{k}]", "Invalid", why, (meta(obj).get("labels") or {}).get(k))
                       for k, why in podsecurity.label_errors(meta(obj).get("labels"))]
        if errors:
            raise invalid(rt.kind, rt.group, meta(obj).get("name") or meta(obj).get("generateName") or "", errors)
        self._pod_security(rt, obj, opts, old)
        if rt.namespaced and old is None:
            self._quota(rt, obj)
        return obj

    def _forbidden_pod(self, obj: dict, message: str) -> APIError:
        name = meta(obj).get("name") or meta(obj).get("generateName") or ""
        return APIError(403, f'pods "{name}" is forbidden: {message}', "Forbidden", {"name": name, "kind": "pods"})

    def _limit_ranges(self, ns: str, pod: dict) -> None:
        """LimitRanger (quota.py): the namespace's defaults filled in; a pod outside its bounds refused."""
        errors = quota.apply_limit_ranges(pod, self.store.list(("", "limitranges"), ns))
        if errors:
            raise self._forbidden_pod(pod, errors[0] if len(errors) == 1 else f"[{', '.join(errors)}]")

    def _quota(self, rt: ResourceType, obj: dict) -> None:
        """ResourceQuota (quota.py): an object the namespace's quotas have no room for, or a pod that
        does not say what they limit, is refused."""
        ns = meta(obj).get("namespace") or ""
        quotas = self.store.list(("", "resourcequotas"), ns)
        if not quotas:
            return
        errors = quota.quota_errors(obj, quotas, self.store.list(rt.storage, ns), rt.storage)
        if not errors:
            return
        if rt.storage == ("", "pods"):
            raise self._forbidden_pod(obj, errors[0])
        name = meta(obj).get("name") or meta(obj).get("generateName") or ""
        raise APIError(403, f'{rt.plural}{"." + rt.group if rt.group else ""} "{name}" is forbidden: {errors[0]}',
                       "Forbidden", {"name": name, "kind": rt.plural})

    #: Kinds whose pod template Pod Security admission checks (warnings only).
    _TEMPLATED = {("apps", "deployments"), ("apps", "statefulsets"), ("apps", "replicasets"),
                  ("apps", "daemonsets"), ("batch", "jobs")}

    def _pod_security(self, rt: ResourceType, obj: dict, opts: Options, old: dict | None) -> None:
        """Pod Security admission (podsecurity.py): a new pod that violates its
        namespace's enforce level is refused (403); a new pod or a workload's
        changed template gets a warning for each level it violates."""
        is_pod = rt.storage == ("", "pods")
        if is_pod:
            if old is not None:
                return
            spec = obj.get("spec")
        elif rt.storage in self._TEMPLATED:
            spec = ((obj.get("spec") or {}).get("template") or {}).get("spec")
            if spec is None or (old is not None and ((old.get("spec") or {}).get("template") or {}).get("spec") == spec):
                return
        else:
            return
        nsobj = self.store.get(("", "namespaces"), "", meta(obj).get("namespace") or "")
        levels = podsecurity.namespace_levels(meta(nsobj).get("labels") if nsobj else None)
        audited = podsecurity.check(spec, levels["audit"])
        if audited:  # in the request's audit event, allowed or not
            opts.audit_annotations[f"{podsecurity.PREFIX}audit-violations"] = \
                podsecurity.warning(levels["audit"], audited)
        if is_pod and (enforce := podsecurity.check(spec, levels["enforce"])):
            raise self._forbidden_pod(obj, podsecurity.forbidden_message(levels["enforce"], enforce))
        for mode in ("warn",) if is_pod else ("enforce", "warn"):
            found = podsecurity.check(spec, levels[mode])
            text = podsecurity.warning(levels[mode], found) if found else ""
            if text and text not in opts.warnings:
                opts.warnings.append(text)

    def create(self, rt: ResourceType, ns: str | None, body: Any, opts: Options | None = None) -> dict:
        opts = opts or Options()
        obj = self._check_body(rt, body)
        m = obj["metadata"]
        for key in ("name", "namespace", "generateName"):
            if m.get(key) is not None and not isinstance(m[key], str):
                # As Kubernetes' decoder: "cannot unmarshal array into ... of type string".
                raise bad_request(f"metadata.{key}: must be a string")
        if rt.namespaced:
            if m.get("namespace") and ns and m["namespace"] != ns:
                raise bad_request("the namespace of the provided object does not match the namespace sent on the request")
            ns = ns or m.get("namespace")
            m["namespace"] = ns
        else:
            m.pop("namespace", None)
        self._namespace_usable(rt, ns)
        if rt.custom:
            crd = self.store.get(CRD_STORAGE, "", rt.crd_name or "")
            if crd is not None and meta(crd).get("deletionTimestamp"):
                raise APIError(405, f"create not allowed while custom resource definition {rt.crd_name} is terminating", "MethodNotAllowed")
        if m.get("resourceVersion"):
            raise bad_request("resourceVersion should not be set on objects to be created")
        if rt.storage == ("", "pods"):
            sa = self.store.get(("", "serviceaccounts"), ns or "", admission.service_account_name(obj))
            admission.admit_pod(obj, sa, random_suffix())
            admission.tolerate_extended_resources(obj)
            self._limit_ranges(ns or "", obj)
        if rt.storage == ("", "limitranges"):
            quota.limitrange_defaults(obj)
        if rt.storage == ("", "persistentvolumeclaims"):
            storage.admit_claim(obj, self.store.list(storage.STORAGECLASSES))
        if not m.get("name"):
            base = m.get("generateName")
            if not base:
                raise invalid(rt.kind, rt.group, "", [FieldError("metadata.name", "Required", "name or generateName is required")])
            base = base[:58]
            for _ in range(8):
                candidate = base + random_suffix()
                if self.store.get(rt.storage, self._ns(rt, ns), candidate) is None:
                    break
            m["name"] = candidate
        for key in ("uid", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"):
            m.pop(key, None)
        if m.get("finalizers") == []:
            del m["finalizers"]
        if self.store.get(rt.storage, self._ns(rt, ns), m["name"]) is not None:
            raise already_exists(rt.plural, rt.group, m["name"])
        m["uid"] = new_uid()
        m["creationTimestamp"] = timeutil.rfc3339()
        if rt.generation:
            m["generation"] = 1
        else:
            m.pop("generation", None)
        if rt.has_status or rt.storage == ("apiextensions.k8s.io", "customresourcedefinitions"):
            strategy.reset_status_on_create(rt, obj)
        obj = self._process(rt, obj, opts, None)
        if opts.admit is not None:
            opts.admit(rt, obj, None)
        if rt.storage == ("apiextensions.k8s.io", "customresourcedefinitions"):
            strategy.reset_status_on_create(rt, obj)
            self._check_crd_names(obj)
        if rt.storage == ("", "services"):
            self._allocate_cluster_ip(obj)
        if opts.dry_run:
            return self.present(rt, obj)
        self.store.put(rt.storage, obj)
        self._after_write(rt, obj)
        if rt.storage == ("", "namespaces"):
            self._default_service_account(m["name"])
        return self.present(rt, obj)

    def _default_service_account(self, ns: str) -> None:
        """The namespace's ``default`` ServiceAccount, made with the namespace so
        a pod created right after it passes ServiceAccount admission (the
        namespace controller makes it again if it is deleted)."""
        if self.store.get(("", "serviceaccounts"), ns, "default") is None:
            self.create(self.resource("", "v1", "serviceaccounts"), ns, {"metadata": {"name": "default"}},
                        Options(field_manager="serviceaccount-controller"))

    def _check_crd_names(self, crd: dict) -> None:
        spec = crd["spec"]
        for v in spec.get("versions") or []:
            other = self.registry.get(spec["group"], v["name"], spec["names"]["plural"])
            if other is not None and other.crd_name != crd["metadata"]["name"]:
                raise APIError(409, f"{spec['names']['plural']}.{spec['group']} is already served by a built-in resource", "Conflict")

    def _allocate_cluster_ip(self, svc: dict) -> None:
        spec = svc.setdefault("spec", {})
        if spec.get("type") == "ExternalName":
            return
        ip = spec.get("clusterIP")
        if ip == "None":
            spec["clusterIPs"] = ["None"]
            return
        used = {(s.get("spec") or {}).get("clusterIP") for s in self.store.list(("", "services"))}
        if ip:
            if ip in used:
                raise invalid("Service", "", meta(svc)["name"], [FieldError("spec.clusterIPs", "Invalid", "failed to allocate IP: provided IP is already allocated", ip)])
        else:
            for host in SERVICE_CIDR.hosts():
                if int(host) - int(SERVICE_CIDR.network_address) < 10:
                    continue
                if str(host) not in used:
                    ip = str(host)
                    break
            spec["clusterIP"] = ip
        spec["clusterIPs"] = [ip]

    def _after_write(self, rt: ResourceType, obj: dict | None, removed: dict | None = None) -> None:
        if rt.storage == ("apiextensions.k8s.io", "customresourcedefinitions"):
            if obj is not None:
                self.registry.set_crd(obj)
            elif removed is not None:
                self.registry.remove_crd(meta(removed)["name"])
            for cb in list(self.crd_listeners):
                cb()

    # --- update ---------------------------------------------------------------

    def update(self, rt: ResourceType, ns: str | None, name: str, body: Any, opts: Options | None = None,
               subresource: str | None = None, old: dict | None = None, managed_fields: list | None = None) -> dict:
        opts = opts or Options()
        old = old if old is not None else self._require(rt, ns, name)
        new = self._check_body(rt, body)
        m = new["metadata"]
        if m.get("name") and m["name"] != name:
            raise bad_request(f"the name of the object ({m['name']}) does not match the name on the URL ({name})")
        if rt.namespaced and m.get("namespace") and m["namespace"] != (ns or meta(old).get("namespace")):
            raise bad_request("the namespace of the provided object does not match the namespace sent on the request")
        rv = m.get("resourceVersion")
        if rv and rv != meta(old).get("resourceVersion"):
            raise conflict(rt.plural, rt.group, name)
        if m.get("uid") and m["uid"] != meta(old).get("uid"):
            raise conflict(rt.plural, rt.group, name, f"Precondition failed: UID in precondition: {m['uid']}, UID in object meta: {meta(old).get('uid')}")
        if subresource == "status":
            merged = copy.deepcopy(old)
            if "status" in new:
                merged["status"] = new["status"]
            else:
                merged.pop("status", None)
            new = merged
        else:
            om = meta(old)
            for key in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "namespace", "name", "managedFields"):
                if key in om:
                    m[key] = copy.deepcopy(om[key])
                else:
                    m.pop(key, None)
            if "generation" in om:
                m["generation"] = om["generation"]
            if rt.has_status:
                if "status" in old:
                    new["status"] = copy.deepcopy(old["status"])
                else:
                    new.pop("status", None)
            if rt.storage == ("apiextensions.k8s.io", "customresourcedefinitions"):
                new["status"] = copy.deepcopy(old.get("status") or {})
            strategy.preserve_on_update(rt, old, new)
            if m.get("finalizers") == []:
                del m["finalizers"]
            if om.get("deletionTimestamp"):
                added = [f for f in m.get("finalizers") or [] if f not in (om.get("finalizers") or [])]
                if added:
                    raise invalid(rt.kind, rt.group, name, [FieldError("metadata.finalizers", "Forbidden", f"no new finalizers can be added if the object is being deleted, found new finalizers {added}")])
        if managed_fields is not None:
            meta(new)["managedFields"] = managed_fields
        new = self._process(rt, new, opts, old)
        if opts.admit is not None:
            opts.admit(rt, new, old)
        if rt.generation and subresource != "status":
            if _spec_view(rt, new) != _spec_view(rt, old):
                meta(new)["generation"] = int(meta(old).get("generation") or 1) + 1
        if rt.storage == ("apiextensions.k8s.io", "customresourcedefinitions") and subresource != "status":
            new["status"] = strategy.crd_status(new) if _spec_view(rt, new) != _spec_view(rt, old) else new.get("status")
            self._check_crd_names(new)
        meta(new)["resourceVersion"] = meta(old).get("resourceVersion")
        if _same_except_rv(new, old):
            return self.present(rt, old)
        if opts.dry_run:
            return self.present(rt, new)
        if self._gone(rt, new):
            self.store.remove(rt.storage, new)
            self._after_write(rt, None, removed=new)
            return self.present(rt, new)
        self.store.put(rt.storage, new)
        self._after_write(rt, new)
        return self.present(rt, new)

    def _gone(self, rt: ResourceType, obj: dict) -> bool:
        """A deleting object whose finalizers (and pod grace period) are done."""
        m = meta(obj)
        if not m.get("deletionTimestamp") or m.get("finalizers"):
            return False
        if rt.storage == ("", "pods") and int(m.get("deletionGracePeriodSeconds") or 0) > 0:
            return False
        if rt.storage == ("", "namespaces") and (obj.get("spec") or {}).get("finalizers"):
            return False
        return True

    # --- patch ----------------------------------------------------------------

    def patch(self, rt: ResourceType, ns: str | None, name: str, content_type: str, body: Any,
              opts: Options | None = None, subresource: str | None = None) -> tuple[dict, bool]:
        """Returns (object, created): only server-side apply creates."""
        opts = opts or Options()
        ctype = content_type.split(";")[0].strip().lower()
        if ctype in (patches.APPLY, patches.APPLY_CBOR):
            if ctype == patches.APPLY_CBOR:
                raise APIError(415, "application/apply-patch+cbor is not supported; send application/apply-patch+yaml")
            return self._apply(rt, ns, name, body, opts, subresource)
        old = self._require(rt, ns, name)
        current = self.present(rt, old)
        if ctype == patches.MERGE:
            result = patches.merge_patch(current, body)
        elif ctype == patches.JSON:
            result = patches.json_patch(current, body)
        elif ctype == patches.STRATEGIC:
            if rt.custom:
                raise APIError(415, f"strategic merge patch is not supported for custom resources ({rt.plural}.{rt.group}); "
                               "use application/merge-patch+json or application/json-patch+json", "UnsupportedMediaType")
            result = patches.strategic_merge_patch(current, body, rt.storage)
        else:
            raise APIError(415, f"the body of the request was in an unknown format - accepted media types include: "
                           f"{patches.JSON}, {patches.MERGE}, {patches.APPLY}"
                           + ("" if rt.custom else f", {patches.STRATEGIC}"), "UnsupportedMediaType")
        if not isinstance(result, dict):
            raise APIError(422, "the patch turned the object into something that is not a JSON object", "Invalid")
        return self.update(rt, ns, name, result, opts, subresource, old=old), False

    def _apply(self, rt: ResourceType, ns: str | None, name: str, body: Any, opts: Options,
               subresource: str | None) -> tuple[dict, bool]:
        if not opts.field_manager:
            raise bad_request("PATCH with apply (application/apply-patch+yaml) requires the fieldManager query parameter")
        if not isinstance(body, dict):
            raise bad_request("an apply patch must be a YAML or JSON object")
        for key in ("apiVersion", "kind"):
            if not body.get(key):
                raise bad_request(f"an apply patch must set {key}")
        bm = body.get("metadata") or {}
        if bm.get("name") and bm["name"] != name:
            raise bad_request(f"the name of the object ({bm['name']}) does not match the name on the URL ({name})")
        old = self.raw(rt, ns, name)
        schema = ssa.list_schema(rt)
        if old is None:
            if subresource:
                raise not_found(rt.plural, rt.group, name)
            obj = copy.deepcopy(body)
            obj.setdefault("metadata", {})["name"] = name
            if rt.namespaced:
                obj["metadata"]["namespace"] = ns
            fields = ssa.applied_fields(body, schema)
            obj["metadata"]["managedFields"] = ssa.set_manager(None, opts.field_manager, rt.group_version, fields, None)
            return self.create(rt, ns, obj, opts), True
        current = copy.deepcopy(self.present(rt, old))
        merged, fields = ssa.apply(current, body, opts.field_manager, schema, subresource)
        if (body.get("metadata") or {}).get("resourceVersion") is None:
            meta(merged)["resourceVersion"] = meta(old).get("resourceVersion")
        mf = ssa.set_manager(meta(old).get("managedFields"), opts.field_manager, rt.group_version, fields, subresource)
        return self.update(rt, ns, name, merged, opts, subresource, old=old, managed_fields=mf), False

    # --- delete ---------------------------------------------------------------

    def delete(self, rt: ResourceType, ns: str | None, name: str, opts: DeleteOptions | None = None) -> tuple[dict, int]:
        """Returns (body, http code): 200 when gone, 202 when deletion is pending."""
        opts = opts or DeleteOptions()
        obj = self._require(rt, ns, name)
        m = meta(obj)
        if rt.storage == ("", "namespaces") and name in PROTECTED_NAMESPACES:
            raise APIError(403, f'namespaces "{name}" is forbidden: this namespace may not be deleted', "Forbidden",
                           {"name": name, "kind": "namespaces"})
        if opts.precondition_uid and opts.precondition_uid != m.get("uid"):
            raise conflict(rt.plural, rt.group, name, f"Precondition failed: UID in precondition: {opts.precondition_uid}, UID in object meta: {m.get('uid')}")
        if opts.precondition_rv and opts.precondition_rv != m.get("resourceVersion"):
            raise conflict(rt.plural, rt.group, name, f"Precondition failed: ResourceVersion in precondition: {opts.precondition_rv}, ResourceVersion in object meta: {m.get('resourceVersion')}")
        new = copy.deepcopy(obj)
        nm = meta(new)
        finalizers = list(nm.get("finalizers") or [])
        policy = opts.propagation
        if policy == "Orphan" and "orphan" not in finalizers:
            finalizers = [f for f in finalizers if f != "foregroundDeletion"] + ["orphan"]
        elif policy == "Foreground" and "foregroundDeletion" not in finalizers:
            finalizers = [f for f in finalizers if f != "orphan"] + ["foregroundDeletion"]
        elif policy == "Background":
            finalizers = [f for f in finalizers if f not in ("orphan", "foregroundDeletion")]
        if finalizers:
            nm["finalizers"] = finalizers
        else:
            nm.pop("finalizers", None)
        if rt.storage == CRD_STORAGE and not nm.get("deletionTimestamp") and CRD_CLEANUP not in finalizers:
            nm["finalizers"] = finalizers = finalizers + [CRD_CLEANUP]
            conds = [c for c in (new.get("status") or {}).get("conditions") or [] if c.get("type") != "Terminating"]
            conds.append({"type": "Terminating", "status": "True", "lastTransitionTime": timeutil.rfc3339(),
                          "reason": "InstanceDeletionInProgress", "message": "CustomResource deletion is in progress"})
            new.setdefault("status", {})["conditions"] = conds
        grace = 0
        if rt.storage == ("", "pods"):
            grace = self._pod_grace(new, opts.grace_period)
        if not nm.get("deletionTimestamp"):
            nm["deletionTimestamp"] = timeutil.rfc3339(timeutil.now()) if grace == 0 else _later(grace)
            nm["deletionGracePeriodSeconds"] = grace
            if rt.generation and nm.get("generation"):
                nm["generation"] = int(nm["generation"]) + 1
        elif rt.storage == ("", "pods") and grace < int(nm.get("deletionGracePeriodSeconds") or 0):
            nm["deletionGracePeriodSeconds"] = grace
            nm["deletionTimestamp"] = timeutil.rfc3339(timeutil.now()) if grace == 0 else _later(grace)
        if rt.storage == ("", "namespaces"):
            new.setdefault("status", {})["phase"] = "Terminating"
        if opts.dry_run:
            return self.present(rt, new), 200
        if self._gone(rt, new):
            self.store.remove(rt.storage, obj)
            self._after_write(rt, None, removed=obj)
            gone = self.present(rt, new)
            if rt.storage in RETURNS_OBJECT_ON_DELETE or rt.custom:
                return gone, 200
            return success_status(self._details(rt, obj)), 200
        if not _same_except_rv(new, obj):
            self.store.put(rt.storage, new)
        return self.present(rt, self._require(rt, ns, name)), 202

    def _details(self, rt: ResourceType, obj: dict) -> dict:
        d = {"name": meta(obj).get("name"), "kind": rt.plural, "uid": meta(obj).get("uid")}
        if rt.group:
            d["group"] = rt.group
        return d

    def _pod_grace(self, pod: dict, requested: int | None) -> int:
        """Graceful deletion waits for a kubelet: only pods bound to a Ready node get one."""
        spec = pod.get("spec") or {}
        phase = (pod.get("status") or {}).get("phase")
        if not spec.get("nodeName") or phase in ("Succeeded", "Failed"):
            return 0
        if not node_ready(self.store.get(("", "nodes"), "", spec["nodeName"])):
            return 0
        grace = requested if requested is not None else spec.get("terminationGracePeriodSeconds", 30)
        return max(0, int(grace or 0))

    def delete_collection(self, rt: ResourceType, ns: str | None, labels: LabelSelector, fields: FieldSelector,
                          opts: DeleteOptions) -> dict:
        for obj in self.select(rt, ns if rt.namespaced else None, labels, fields):
            try:
                self.delete(rt, meta(obj).get("namespace"), meta(obj)["name"], opts)
            except APIError as e:
                if e.code != 404:
                    raise
        return success_status()

    # --- status helpers for controllers ----------------------------------------

    def write_status(self, rt: ResourceType, obj: dict, status: dict, manager: str = "") -> dict | None:
        """Replace ``status`` if it changed (no precondition: controllers own it)."""
        if obj.get("status") == status:
            return None
        current = self.raw(rt, meta(obj).get("namespace"), meta(obj)["name"])
        if current is None:
            return None
        body = copy.deepcopy(current)
        body["status"] = status
        return self.update(rt, meta(obj).get("namespace"), meta(obj)["name"], body,
                           Options(field_manager=manager or None), subresource="status" if rt.has_status else None, old=current)

    # --- scale ----------------------------------------------------------------

    def _scale_paths(self, rt: ResourceType) -> tuple[str, str, str | None]:
        if rt.custom:
            if not rt.scale:
                raise APIError(404, f"{rt.plural}.{rt.group} has no scale subresource", "NotFound")
            return (rt.scale.get("specReplicasPath", ".spec.replicas"), rt.scale.get("statusReplicasPath", ".status.replicas"),
                    rt.scale.get("labelSelectorPath"))
        return (".spec.replicas", ".status.replicas", None)

    def get_scale(self, rt: ResourceType, ns: str | None, name: str) -> dict:
        obj = self._require(rt, ns, name)
        spec_path, status_path, sel_path = self._scale_paths(rt)
        m = meta(obj)
        if sel_path:
            selector = jsonpath.first(obj, sel_path) or ""
        else:
            selector = selector_string((obj.get("spec") or {}).get("selector"))
        scale = {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {k: m[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp") if k in m},
            "spec": {"replicas": int(jsonpath.first(obj, spec_path) or 0)},
            "status": {"replicas": int(jsonpath.first(obj, status_path) or 0)},
        }
        if selector:
            scale["status"]["selector"] = selector
        return scale

    def update_scale(self, rt: ResourceType, ns: str | None, name: str, scale: Any, opts: Options | None = None) -> dict:
        if not isinstance(scale, dict):
            raise bad_request("the body must be an autoscaling/v1 Scale")
        obj = self._require(rt, ns, name)
        rv = (scale.get("metadata") or {}).get("resourceVersion")
        if rv and rv != meta(obj).get("resourceVersion"):
            raise conflict(rt.plural, rt.group, name)
        replicas = (scale.get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise invalid("Scale", "autoscaling", name, [FieldError("spec.replicas", "Invalid", "must be greater than or equal to 0", replicas)])
        body = copy.deepcopy(obj)
        jsonpath.set_value(body, self._scale_paths(rt)[0], replicas)
        self.update(rt, ns, name, body, opts, old=obj)
        return self.get_scale(rt, ns, name)

    def patch_scale(self, rt: ResourceType, ns: str | None, name: str, content_type: str, body: Any,
                    opts: Options | None = None) -> dict:
        current = self.get_scale(rt, ns, name)
        ctype = content_type.split(";")[0].strip().lower()
        if ctype == patches.MERGE or ctype == patches.STRATEGIC:
            result = patches.merge_patch(current, body)
        elif ctype == patches.JSON:
            result = patches.json_patch(current, body)
        elif ctype == patches.APPLY:
            result = patches.merge_patch(current, {k: v for k, v in (body or {}).items() if k in ("spec",)})
        else:
            raise APIError(415, f"unsupported patch type {ctype!r} for the scale subresource", "UnsupportedMediaType")
        return self.update_scale(rt, ns, name, result, opts)

    # --- pods: binding and eviction ---------------------------------------------

    def bind(self, ns: str, name: str, binding: Any, opts: Options | None = None) -> dict:
        rt = self.registry.get("", "v1", "pods")
        assert rt is not None
        if not isinstance(binding, dict) or not (binding.get("target") or {}).get("name"):
            raise invalid("Binding", "", name, [FieldError("target.name", "Required")])
        target = binding["target"]
        if target.get("kind") not in (None, "", "Node"):
            raise invalid("Binding", "", name, [FieldError("target.kind", "NotSupported", 'supported values: "Node"', target.get("kind"))])
        pod = self._require(rt, ns, name)
        node_name = target["name"]
        if meta(pod).get("deletionTimestamp"):
            raise conflict("pods/binding", "", name, f"pod {name} is being deleted, cannot be assigned to a host")
        if (pod.get("spec") or {}).get("nodeName"):
            raise conflict("pods/binding", "", name, f'pod {name} is already assigned to node "{pod["spec"]["nodeName"]}"')
        new = copy.deepcopy(pod)
        new["spec"]["nodeName"] = node_name
        status = new.setdefault("status", {})
        conds = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
        conds.append({"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": timeutil.rfc3339()})
        status["conditions"] = conds
        if not (opts and opts.dry_run):
            self.store.put(rt.storage, new)
        return success_status()

    def evict(self, ns: str, name: str, eviction: Any) -> dict:
        rt = self.registry.get("", "v1", "pods")
        assert rt is not None
        pod = self._require(rt, ns, name)
        body = eviction if isinstance(eviction, dict) else {}
        opts = DeleteOptions.from_body(body.get("deleteOptions"), {})
        if meta(pod).get("deletionTimestamp"):
            return success_status()
        # Which budget the eviction spends, or why it is refused: eviction.py (kube-apiserver's rules).
        pdb = budget_to_spend(pod, self.store.list(("policy", "poddisruptionbudgets"), ns))
        if pdb is not None:
            pdb_rt = self.registry.get("policy", "v1", "poddisruptionbudgets")
            assert pdb_rt is not None
            new_status = copy.deepcopy(pdb.get("status") or {})
            new_status["disruptionsAllowed"] = int(new_status.get("disruptionsAllowed", 0)) - 1
            new_status.setdefault("disruptedPods", {})[name] = timeutil.rfc3339()
            self.write_status(pdb_rt, pdb, new_status, "eviction")
        self.delete(rt, ns, name, opts)
        return success_status()


def _later(seconds: int) -> str:
    from datetime import timedelta

    return timeutil.rfc3339(timeutil.now() + timedelta(seconds=seconds))
