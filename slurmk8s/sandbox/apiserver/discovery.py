"""Discovery documents (``/api``, ``/apis``, group versions) and the OpenAPI v3
documents kubectl reads (pure functions of the registry).

Aggregated discovery is declined by answering the plain form, which clients
then follow group by group. The OpenAPI v3 documents list every resource's
paths (with the ``fieldValidation`` parameter, so kubectl leaves validation to
the server) and, for custom resources, their schema (``kubectl explain``).
Built-in types have no schema here: kubectl computes their patches from the
types compiled into it.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from .resources import Registry, ResourceType

VERSION = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.0-slurmk8s",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2025-01-01T00:00:00Z",
    "goVersion": "python",
    "compiler": "python",
    "platform": "linux/amd64",
}

SUB_VERBS = {"status": ["get", "patch", "update"], "scale": ["get", "patch", "update"], "binding": ["create"],
             "eviction": ["create"], "finalize": ["update"], "token": ["create"]}


def api_versions(server_address: str) -> dict:
    return {"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]}


def _group(name: str, versions: list[str]) -> dict:
    vs = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"name": name, "versions": vs, "preferredVersion": vs[0]}


def api_group_list(reg: Registry) -> dict:
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [_group(g, vs) for g, vs in reg.groups() if g]}


def api_group(reg: Registry, group: str) -> dict | None:
    for g, vs in reg.groups():
        if g == group and g:
            return {"kind": "APIGroup", "apiVersion": "v1", **_group(g, vs)}
    return None


def _storage_hash(rt: ResourceType) -> str:
    import base64

    h = hashlib.sha256(f"{rt.group}/{rt.version}/{rt.kind}".encode()).digest()
    return base64.b64encode(h[:8]).decode()


def resource_list(reg: Registry, group: str, version: str) -> dict | None:
    types = reg.in_group_version(group, version)
    if not types:
        return None
    resources: list[dict[str, Any]] = []
    for rt in sorted(types, key=lambda r: r.plural):
        entry: dict[str, Any] = {
            "name": rt.plural,
            "singularName": rt.singular,
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": list(rt.verbs),
            "storageVersionHash": _storage_hash(rt),
        }
        if rt.short_names:
            entry["shortNames"] = list(rt.short_names)
        if rt.categories:
            entry["categories"] = list(rt.categories)
        resources.append(entry)
        for sub in rt.subresources:
            s: dict[str, Any] = {"name": f"{rt.plural}/{sub}", "singularName": "", "namespaced": rt.namespaced,
                                 "kind": rt.kind, "verbs": SUB_VERBS.get(sub, ["get"])}
            if sub == "scale":
                s.update(group="autoscaling", version="v1", kind="Scale")
            elif sub == "binding":
                s["kind"] = "Binding"
            elif sub == "eviction":
                s.update(group="policy", version="v1", kind="Eviction")
            elif sub == "token":
                s.update(group="authentication.k8s.io", version="v1", kind="TokenRequest")
            resources.append(s)
    gv = f"{group}/{version}" if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}


# --- OpenAPI v3 -------------------------------------------------------------------

_QUERY = [
    {"name": n, "in": "query", "schema": {"type": "string", "uniqueItems": True}}
    for n in ("dryRun", "fieldManager", "fieldValidation", "force", "pretty")
]


def _gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def schema_name(rt: ResourceType) -> str:
    domain = ".".join(reversed(rt.group.split("."))) if rt.group else "io.k8s.api.core"
    return f"{domain}.{rt.version}.{rt.kind}"


def _op(rt: ResourceType, action: str) -> dict:
    return {
        "operationId": f"{action}{rt.kind}",
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": {"group": rt.group, "version": rt.version, "kind": rt.kind},
        "parameters": list(_QUERY),
        "responses": {"200": {"description": "OK"}},
    }


def _explainable(s: Any) -> Any:
    """A CRD schema as kubectl explain wants it: metadata described, not expanded."""
    if not isinstance(s, dict):
        return s
    out = dict(s)
    props = dict(out.get("properties") or {})
    if "metadata" in props:
        props["metadata"] = {"type": "object", "description": "Standard object's metadata. More info: "
                             "https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata"}
    if props:
        out["properties"] = props
    return out


def openapi_gv(reg: Registry, group: str, version: str) -> dict | None:
    types = reg.in_group_version(group, version)
    if not types:
        return None
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    base = f"/apis/{group}/{version}" if group else f"/api/{version}"
    for rt in types:
        prefix = f"{base}/namespaces/{{namespace}}/{rt.plural}" if rt.namespaced else f"{base}/{rt.plural}"
        paths[prefix] = {"get": _op(rt, "list"), "post": _op(rt, "post")}
        item = {"get": _op(rt, "get"), "put": _op(rt, "put"), "patch": _op(rt, "patch"), "delete": _op(rt, "delete")}
        paths[f"{prefix}/{{name}}"] = item
        for sub in rt.subresources:
            if sub in ("status", "scale"):
                paths[f"{prefix}/{{name}}/{sub}"] = {"get": _op(rt, "get"), "put": _op(rt, "put"), "patch": _op(rt, "patch")}
        if rt.custom and rt.schema:
            s = _explainable(rt.schema)
            s = dict(s, **{"x-kubernetes-group-version-kind": [{"group": rt.group, "version": rt.version, "kind": rt.kind}]})
            schemas[schema_name(rt)] = s
    doc = {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    }
    return doc


def openapi_root(reg: Registry) -> dict:
    paths: dict[str, Any] = {}
    for g, versions in reg.groups():
        for v in versions:
            doc = openapi_gv(reg, g, v)
            digest = hashlib.sha512(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32].upper()
            key = _gv_path(g, v)
            paths[key] = {"serverRelativeURL": f"/openapi/v3/{key}?hash={digest}"}
    return {"paths": paths}
