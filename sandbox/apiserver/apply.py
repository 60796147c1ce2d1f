"""Server-side apply, simplified (pure).

What it does: the applied configuration is merged into the live object (maps
recursively, lists by their merge keys — ``x-kubernetes-list-map-keys`` for
custom resources, the strategic-merge keys for built-ins — sets as unions,
other lists replaced whole). The fields each manager applied are recorded in
``metadata.managedFields`` (``operation: Apply``, ``fieldsV1``), and fields a
manager applied before and leaves out now are removed.

What it does not do: ownership of fields written by other operations (update,
patch) is not tracked, so a field another writer also set is still removed when
its applier stops applying it, and conflicts between managers are never
reported (``force`` changes nothing).
"""

from __future__ import annotations

import copy
import json
from typing import Any

from . import patch as patches
from .resources import ResourceType
from .timeutil import rfc3339

_SKIP_META = ("name", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp",
              "deletionTimestamp", "deletionGracePeriodSeconds", "managedFields", "selfLink")


def _from_patch_schema(node: dict | None) -> dict:
    node = node or {"fields": {}}
    out: dict[str, Any] = {"fields": {k: _from_patch_schema(v) for k, v in node.get("fields", {}).items()}}
    if "merge" in node:
        key = node["merge"]
        out = {"keys": (key,) if key else None, "set": key is None, "item": _from_patch_schema(node.get("item"))}
    return out


def _from_openapi(s: Any) -> dict:
    if not isinstance(s, dict):
        return {"fields": {}}
    if s.get("type") == "array" or "items" in s:
        kind = s.get("x-kubernetes-list-type")
        item = _from_openapi(s.get("items"))
        if kind == "map":
            return {"keys": tuple(s.get("x-kubernetes-list-map-keys") or ()), "set": False, "item": item}
        if kind == "set":
            return {"keys": None, "set": True, "item": item}
        return {"atomic": True}
    fields = {k: _from_openapi(v) for k, v in (s.get("properties") or {}).items()}
    out: dict[str, Any] = {"fields": fields}
    if isinstance(s.get("additionalProperties"), dict):
        out["values"] = _from_openapi(s["additionalProperties"])
    if s.get("x-kubernetes-map-type") == "atomic":
        out["atomic"] = True
    return out


def list_schema(rt: ResourceType) -> dict:
    if rt.custom:
        node = _from_openapi(rt.schema or {})
        node.setdefault("fields", {})["metadata"] = _from_patch_schema(patches.merge_key_schema(("", ""))["fields"]["metadata"])
        return node
    return _from_patch_schema(patches.merge_key_schema(rt.storage))


def _child(node: dict, key: str) -> dict:
    if "fields" in node and key in node["fields"]:
        return node["fields"][key]
    return node.get("values") or {"fields": {}}


def _item_key(item: Any, keys: tuple[str, ...]) -> str:
    return "k:" + json.dumps({k: item.get(k) for k in keys if k in item}, sort_keys=True, separators=(",", ":"))


def _value_key(v: Any) -> str:
    return "v:" + json.dumps(v, sort_keys=True, separators=(",", ":"))


def applied_fields(config: Any, node: dict, top: bool = True) -> dict:
    """The ``fieldsV1`` set of an applied configuration."""
    out: dict[str, Any] = {}
    if not isinstance(config, dict):
        return out
    for key, value in config.items():
        if top and key in ("apiVersion", "kind"):
            continue
        if top and key == "metadata" and isinstance(value, dict):
            value = {k: v for k, v in value.items() if k not in _SKIP_META}
            if not value:
                continue
        sub = _child(node, key)
        out[f"f:{key}"] = _fields_of(value, sub)
    return out


def _fields_of(value: Any, node: dict) -> dict:
    if node.get("atomic"):
        return {}
    if isinstance(value, dict):
        return applied_fields(value, node, top=False)
    if isinstance(value, list) and "keys" in node:
        out: dict[str, Any] = {}
        for item in value:
            if node.get("set") or not isinstance(item, dict):
                out[_value_key(item)] = {}
            else:
                entry = {".": {}}
                entry.update(applied_fields(item, node["item"], top=False))
                out[_item_key(item, node["keys"])] = entry
        return out
    return {}


def _merge(live: Any, config: Any, node: dict) -> Any:
    if node.get("atomic") or not isinstance(config, (dict, list)):
        return copy.deepcopy(config)
    if isinstance(config, dict):
        out = copy.deepcopy(live) if isinstance(live, dict) else {}
        for key, value in config.items():
            if value is None:
                out.pop(key, None)
            else:
                out[key] = _merge(out.get(key), value, _child(node, key))
        return out
    if "keys" not in node or not isinstance(live, list):
        return copy.deepcopy(config)
    out_list = copy.deepcopy(live)
    if node.get("set"):
        for v in config:
            if v not in out_list:
                out_list.append(copy.deepcopy(v))
        return out_list
    for item in config:
        if not isinstance(item, dict):
            return copy.deepcopy(config)
        ident = _item_key(item, node["keys"])
        idx = next((i for i, cur in enumerate(out_list) if isinstance(cur, dict) and _item_key(cur, node["keys"]) == ident), None)
        if idx is None:
            out_list.append(_merge({}, item, node["item"]))
        else:
            out_list[idx] = _merge(out_list[idx], item, node["item"])
    return out_list


def _remove(obj: Any, before: dict, after: dict, node: dict) -> None:
    """Remove from ``obj`` what is in ``before`` and not in ``after``."""
    for key, sub in before.items():
        if key == ".":
            continue
        kind, _, ident = key.partition(":")
        if kind == "f" and isinstance(obj, dict):
            if key not in after:
                obj.pop(ident, None)
            elif sub and ident in obj:
                _remove(obj[ident], sub, after[key], _child(node, ident))
        elif kind == "k" and isinstance(obj, list) and "keys" in node:
            keys = node.get("keys") or ()
            for i in range(len(obj) - 1, -1, -1):
                item = obj[i]
                if isinstance(item, dict) and _item_key(item, keys) == key:
                    if key not in after:
                        del obj[i]
                    else:
                        _remove(item, sub, after[key], node["item"])
        elif kind == "v" and isinstance(obj, list) and key not in after:
            value = json.loads(ident)
            while value in obj:
                obj.remove(value)


def _owned(managed: list | None, manager: str, subresource: str | None) -> dict:
    for entry in managed or []:
        if entry.get("manager") == manager and entry.get("operation") == "Apply" and entry.get("subresource") == subresource:
            return entry.get("fieldsV1") or {}
    return {}


def apply(live: dict, config: dict, manager: str, node: dict, subresource: str | None = None) -> tuple[dict, dict]:
    """(merged object, the fields this manager now owns)."""
    fields = applied_fields(config, node)
    before = _owned((live.get("metadata") or {}).get("managedFields"), manager, subresource)
    body = {k: v for k, v in config.items() if k not in ("apiVersion", "kind")}
    if isinstance(body.get("metadata"), dict):
        body["metadata"] = {k: v for k, v in body["metadata"].items() if k not in _SKIP_META}
    merged = _merge(live, body, node)
    _remove(merged, before, fields, node)
    return merged, fields


def set_manager(managed: list | None, manager: str, api_version: str, fields: dict, subresource: str | None) -> list:
    for e in managed or []:
        if (e.get("manager") == manager and e.get("operation") == "Apply" and e.get("subresource") == subresource
                and e.get("fieldsV1") == fields and e.get("apiVersion") == api_version):
            return copy.deepcopy(managed)  # unchanged: keep its time, so a no-op apply stays a no-op
    out = [copy.deepcopy(e) for e in managed or []
           if not (e.get("manager") == manager and e.get("operation") == "Apply" and e.get("subresource") == subresource)]
    entry: dict[str, Any] = {
        "manager": manager,
        "operation": "Apply",
        "apiVersion": api_version,
        "time": rfc3339(),
        "fieldsType": "FieldsV1",
        "fieldsV1": fields,
    }
    if subresource:
        entry["subresource"] = subresource
    out.append(entry)
    return out
