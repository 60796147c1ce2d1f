"""The PATCH content types Kubernetes accepts, applied to plain dicts (pure).

- ``application/merge-patch+json``: RFC 7386 (:func:`merge_patch`).
- ``application/json-patch+json``: RFC 6902 through the ``jsonpatch`` library.
- ``application/strategic-merge-patch+json``: Kubernetes' strategic merge patch
  for the built-in types we serve (:func:`strategic_merge_patch`). Lists that
  Kubernetes merges by key (containers, env, volumes, ports, conditions,
  ownerReferences...) are merged by that key; other lists are replaced. The
  directives ``$patch: replace|delete|merge``, ``$retainKeys``,
  ``$deleteFromPrimitiveList/<field>`` and ``$setElementOrder/<field>`` are honoured.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonpatch
import jsonpointer

from .errors import APIError

MERGE = "application/merge-patch+json"
JSON = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
APPLY = "application/apply-patch+yaml"
APPLY_CBOR = "application/apply-patch+cbor"


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: maps merge recursively, ``null`` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def json_patch(target: dict, operations: Any) -> dict:
    """RFC 6902; 400 for a malformed patch, 422 when an operation cannot apply."""
    if not isinstance(operations, list):
        raise APIError(400, "json patch must be a JSON array of operations, e.g. [{\"op\": \"replace\", \"path\": \"/spec/replicas\", \"value\": 3}]")
    try:
        patch = jsonpatch.JsonPatch(operations)
        return patch.apply(copy.deepcopy(target))
    except jsonpatch.InvalidJsonPatch as e:
        raise APIError(400, f"invalid json patch: {e}") from e
    except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as e:
        raise APIError(422, f"the server rejected our request due to an error in our request: json patch failed: {e}", "Invalid") from e
    except (TypeError, KeyError) as e:
        raise APIError(400, f"invalid json patch: {e}") from e


# --- strategic merge patch ------------------------------------------------------
# A schema node: {"fields": {name: node}} for maps, {"merge": key, "item": node}
# for lists merged by ``key`` (``None``: a list of primitives merged as a set).


def _m(**fields: dict) -> dict:
    return {"fields": fields}


def _l(key: str | None, item: dict | None = None) -> dict:
    return {"merge": key, "item": item or {"fields": {}}}


_CONDITIONS = _l("type")
_META = _m(finalizers=_l(None), ownerReferences=_l("uid"))
_CONTAINER = _m(
    ports=_l("containerPort"),
    env=_l("name"),
    volumeMounts=_l("mountPath"),
    volumeDevices=_l("devicePath"),
)
_POD_SPEC = _m(
    containers=_l("name", _CONTAINER),
    initContainers=_l("name", _CONTAINER),
    ephemeralContainers=_l("name", _CONTAINER),
    volumes=_l("name"),
    imagePullSecrets=_l("name"),
    hostAliases=_l("ip"),
    topologySpreadConstraints=_l("topologyKey"),
    schedulingGates=_l("name"),
    resourceClaims=_l("name"),
)
_POD_TEMPLATE = _m(metadata=_META, spec=_POD_SPEC)
_WORKLOAD = _m(metadata=_META, spec=_m(template=_POD_TEMPLATE), status=_m(conditions=_CONDITIONS))
_WITH_CONDITIONS = _m(metadata=_META, status=_m(conditions=_CONDITIONS))

SCHEMAS: dict[tuple[str, str], dict] = {
    ("", "pods"): _m(
        metadata=_META,
        spec=_POD_SPEC,
        status=_m(conditions=_CONDITIONS, podIPs=_l("ip"), hostIPs=_l("ip")),
    ),
    ("", "services"): _m(metadata=_META, spec=_m(ports=_l("port")), status=_m(conditions=_CONDITIONS)),
    ("", "nodes"): _m(metadata=_META, spec=_m(podCIDRs=_l(None)), status=_m(conditions=_CONDITIONS, addresses=_l("type"))),
    ("", "namespaces"): _WITH_CONDITIONS,
    ("", "persistentvolumeclaims"): _WITH_CONDITIONS,
    ("", "serviceaccounts"): _m(metadata=_META, secrets=_l("name"), imagePullSecrets=_l("name")),
    ("apps", "deployments"): _WORKLOAD,
    ("apps", "statefulsets"): _WORKLOAD,
    ("apps", "replicasets"): _WORKLOAD,
    ("policy", "poddisruptionbudgets"): _WITH_CONDITIONS,
    ("admissionregistration.k8s.io", "validatingwebhookconfigurations"): _m(
        metadata=_META, webhooks=_l("name", _m(matchConditions=_l("name")))),
}
DEFAULT_SCHEMA = _m(metadata=_META)


def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: _strip_directives(v)
            for k, v in value.items()
            if not (k == "$patch" or k == "$retainKeys" or k.startswith("$setElementOrder/") or k.startswith("$deleteFromPrimitiveList/"))
        }
    if isinstance(value, list):
        return [_strip_directives(v) for v in value if not (isinstance(v, dict) and v.get("$patch") == "replace" and len(v) == 1)]
    return copy.deepcopy(value)


def _order(items: list, order: list, key: str | None) -> list:
    def ident(x: Any) -> Any:
        if key is None:
            return json.dumps(x, sort_keys=True)
        return json.dumps(x.get(key) if isinstance(x, dict) else x, sort_keys=True)

    rank = {ident(x): i for i, x in enumerate(order)}
    indexed = list(enumerate(items))
    indexed.sort(key=lambda p: (rank.get(ident(p[1]), len(rank) + p[0]), p[0]))
    return [x for _, x in indexed]


def _merge_list(original: list, patch: list, node: dict, path: str) -> list:
    key = node["merge"]
    if key is None:
        if any(isinstance(v, dict) and v.get("$patch") == "replace" for v in patch):
            return [copy.deepcopy(v) for v in patch if not isinstance(v, dict)]
        out = copy.deepcopy(original)
        for v in patch:
            if v not in out:
                out.append(copy.deepcopy(v))
        return out
    if any(isinstance(v, dict) and v.get("$patch") == "replace" for v in patch):
        return [_strip_directives(v) for v in patch if not (isinstance(v, dict) and v.get("$patch") == "replace")]
    out = copy.deepcopy(original) if isinstance(original, list) else []
    for item in patch:
        if not isinstance(item, dict):
            raise APIError(422, f"strategic merge patch: {path} is merged by '{key}', so its items must be objects, got {json.dumps(item)}", "Invalid")
        if key not in item:
            raise APIError(422, f"strategic merge patch: an item of {path} does not contain the declared merge key: {key}", "Invalid")
        idx = next((i for i, cur in enumerate(out) if isinstance(cur, dict) and cur.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            out = [cur for cur in out if not (isinstance(cur, dict) and cur.get(key) == item[key])]
            continue
        if idx is None:
            out.append(_smp({}, item, node["item"], f"{path}[{key}={item[key]}]"))
        else:
            out[idx] = _smp(out[idx], item, node["item"], f"{path}[{key}={item[key]}]")
    return out


def _smp(original: Any, patch: Any, node: dict | None, path: str) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    node = node or {"fields": {}}
    fields = node.get("fields", {})
    directive = patch.get("$patch")
    if directive == "replace":
        return _strip_directives(patch)
    if directive == "delete":
        return None
    if directive not in (None, "merge"):
        raise APIError(422, f"strategic merge patch: unknown $patch directive {directive!r} at {path or '.'} (use replace, delete or merge)", "Invalid")
    result = copy.deepcopy(original) if isinstance(original, dict) else {}
    orders: dict[str, list] = {}
    for key, value in patch.items():
        if key in ("$patch", "$retainKeys"):
            continue
        if key.startswith("$setElementOrder/"):
            orders[key.split("/", 1)[1]] = value if isinstance(value, list) else []
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            if isinstance(result.get(name), list) and isinstance(value, list):
                result[name] = [v for v in result[name] if v not in value]
            continue
        if key.startswith("$"):
            raise APIError(422, f"strategic merge patch: unknown directive {key!r} at {path or '.'}", "Invalid")
        sub = fields.get(key)
        here = f"{path}.{key}"
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            merged = _smp(result.get(key), value, sub, here)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list) and sub is not None and "merge" in sub:
            result[key] = _merge_list(result.get(key) or [], value, sub, here)
        else:
            result[key] = _strip_directives(value)
    for name, order in orders.items():
        if isinstance(result.get(name), list):
            sub = fields.get(name) or {}
            result[name] = _order(result[name], order, sub.get("merge"))
    retain = patch.get("$retainKeys")
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def strategic_merge_patch(target: dict, patch: Any, storage: tuple[str, str]) -> dict:
    if not isinstance(patch, dict):
        raise APIError(400, "strategic merge patch must be a JSON object")
    out = _smp(target, patch, SCHEMAS.get(storage, DEFAULT_SCHEMA), "")
    if out is None:
        raise APIError(422, "strategic merge patch: $patch: delete is not allowed on the whole object; use DELETE", "Invalid")
    return out


def merge_key_schema(storage: tuple[str, str]) -> dict:
    """The list-merge schema of a built-in resource (server-side apply uses it too)."""
    return SCHEMAS.get(storage, DEFAULT_SCHEMA)
