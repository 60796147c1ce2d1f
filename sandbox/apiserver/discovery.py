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

import functools
import hashlib
import json
from pathlib import Path
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


#: The Kubernetes release whose built-in schemas /openapi/v2 serves (the one /version names).
SCHEMA_RELEASE = f"v{VERSION['major']}.{VERSION['minor']}.0-local"


@functools.lru_cache(maxsize=1)
def builtin_definitions() -> dict[str, Any]:
    """The official schemas of the built-in types, as swagger 2.0 ``definitions``,
    from the ``kubernetes-validate`` package's copy of Kubernetes' own OpenAPI
    (JSON Schema form, converted back: nullable type lists become one type,
    ``$defs`` references become ``definitions`` ones, and every top-level kind
    gets its ``x-kubernetes-group-version-kind``). Empty when the package is
    not installed: clients then validate nothing themselves and the server
    still validates what it stores."""
    try:
        import kubernetes_validate
    except ImportError:
        return {}
    path = (Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema" / SCHEMA_RELEASE
            / "_definitions.json")
    if not path.exists():
        return {}
    defs = json.loads(path.read_text())["$defs"]
    out = {}
    for name, schema in defs.items():
        converted = _swagger(schema)
        props = schema.get("properties") or {}
        versions, kinds = (props.get("apiVersion") or {}).get("enum"), (props.get("kind") or {}).get("enum")
        if versions and kinds:
            group, _, version = versions[0].rpartition("/")
            converted["x-kubernetes-group-version-kind"] = [{"group": group, "version": version, "kind": kinds[0]}]
        out[name] = converted
    return out


def _swagger(s: Any) -> Any:
    if isinstance(s, list):
        return [_swagger(x) for x in s]
    if not isinstance(s, dict):
        return s
    out = {}
    for key, value in s.items():
        if key == "type" and isinstance(value, list):
            types = [t for t in value if t != "null"]
            if len(types) == 1:
                out[key] = types[0]
            continue
        if key == "$ref" and isinstance(value, str):
            out[key] = value.replace("#/$defs/", "#/definitions/")
            continue
        if key == "enum" and isinstance(value, list):
            value = [v for v in value if v is not None]
        out[key] = _swagger(value) if key not in ("properties", "patternProperties") else {
            k: _swagger(v) for k, v in value.items()}
    return out


def openapi_v2(reg: Registry) -> dict:
    """The swagger 2.0 document at /openapi/v2: the built-in types' official
    schemas and every served custom resource's schema, each with its
    group-version-kind. kubectl's and Helm's client-side validation load it;
    paths are listed in the OpenAPI v3 documents, where clients look for
    server-side field validation."""
    definitions = dict(builtin_definitions())
    for g, versions in reg.groups():
        for v in versions:
            for rt in reg.in_group_version(g, v):
                if rt.custom and rt.schema:
                    s = dict(_explainable(rt.schema))
                    s["x-kubernetes-group-version-kind"] = [{"group": rt.group, "version": rt.version, "kind": rt.kind}]
                    definitions[schema_name(rt)] = s
    return {"swagger": "2.0", "info": {"title": "Kubernetes", "version": VERSION["gitVersion"]}, "paths": {},
            "definitions": definitions}


#: /openapi/v2 for clients that accept only protobuf (client-go's discovery):
#: a gnostic ``openapi_v2.Document`` holding just ``swagger: "2.0"`` (field 1).
#: It names no definitions, so kubectl and Helm validate nothing on the
#: client and leave validation to this server (``fieldValidation``), which is
#: what they do against a real server whose OpenAPI v3 shows that parameter.
OPENAPI_V2_PROTOBUF = b"\x0a\x032.0"
OPENAPI_V2_PROTOBUF_TYPE = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"
