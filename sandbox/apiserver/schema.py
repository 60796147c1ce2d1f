"""Custom resources against their CRD's ``openAPIV3Schema`` (pure).

:func:`process` does what the Kubernetes API server does to a custom resource
on every write, in the same order: drop ``null`` values of fields that are not
``nullable``, prune fields the schema does not declare (unless
``x-kubernetes-preserve-unknown-fields``), apply ``default``s, then validate.
Validation uses ``jsonschema`` (draft 4, which OpenAPI v3.0 follows) plus the
Kubernetes list rules (``x-kubernetes-list-type: map|set`` uniqueness).
Last, the CEL rules (``x-kubernetes-validations``, :mod:`.cel`), on an object whose
schema holds (Kubernetes, too, runs them only then).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import jsonschema

from . import cel
from .errors import FieldError

_ROOT_KEYS = ("apiVersion", "kind", "metadata")


def _path(parts) -> str:
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += f".{p}" if out else str(p)
    return out


def _to_jsonschema(node: Any) -> Any:
    """OpenAPI v3 structural schema -> JSON Schema draft 4."""
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("properties", "patternProperties", "definitions"):
            out[key] = {k: _to_jsonschema(v) for k, v in value.items()}
        elif key in ("items", "additionalProperties", "not"):
            out[key] = _to_jsonschema(value) if isinstance(value, dict) else value
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [_to_jsonschema(v) for v in value]
        elif key.startswith("x-kubernetes-") or key in ("default", "nullable", "example", "externalDocs", "format", "description"):
            continue
        else:
            out[key] = value
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["type"] = ["integer", "string"]
        out.pop("anyOf", None)
    if node.get("nullable") and "type" in out:
        t = out["type"]
        out["type"] = (t if isinstance(t, list) else [t]) + ["null"]
        if "enum" in out and None not in out["enum"]:
            out["enum"] = list(out["enum"]) + [None]
    return out


@lru_cache(maxsize=64)
def _validator(schema_json: str) -> jsonschema.Draft4Validator:
    schema = _to_jsonschema(json.loads(schema_json))
    jsonschema.Draft4Validator.check_schema(schema)
    return jsonschema.Draft4Validator(schema)


def check_schema(schema: dict) -> str | None:
    """A problem with the schema itself, or None."""
    try:
        _validator(json.dumps(schema, sort_keys=True))
    except jsonschema.SchemaError as e:
        return f"{_path(e.absolute_path) or 'openAPIV3Schema'}: {e.message}"
    problems = cel.rule_problems(schema)
    return "; ".join(problems) if problems else None


@dataclass
class Outcome:
    obj: dict
    unknown: list[str] = field(default_factory=list)
    errors: list[FieldError] = field(default_factory=list)


def _is_object_schema(s: dict) -> bool:
    return s.get("type") == "object" or "properties" in s or "additionalProperties" in s


def _prune(value: Any, s: dict, path: list, unknown: list[str], root: bool = False) -> None:
    if not isinstance(s, dict):
        return
    if isinstance(value, dict) and _is_object_schema(s):
        props = s.get("properties") or {}
        addl = s.get("additionalProperties")
        preserve = s.get("x-kubernetes-preserve-unknown-fields") is True
        embedded = s.get("x-kubernetes-embedded-resource") is True
        for key in list(value):
            child = value[key]
            if root and key in _ROOT_KEYS:
                continue  # apiVersion, kind and metadata are the server's, not the schema's
            if key in props:
                if child is None and not props[key].get("nullable"):
                    del value[key]
                    continue
                _prune(child, props[key], path + [key], unknown)
            elif isinstance(addl, dict):
                if child is None and not addl.get("nullable"):
                    del value[key]
                    continue
                _prune(child, addl, path + [key], unknown)
            elif embedded and key in _ROOT_KEYS:
                continue
            elif addl is True or preserve:
                continue
            else:
                del value[key]
                unknown.append(_path(path + [key]))
    elif isinstance(value, list) and isinstance(s.get("items"), dict):
        for i, item in enumerate(value):
            _prune(item, s["items"], path + [i], unknown)


def _default(value: Any, s: dict) -> None:
    if not isinstance(s, dict):
        return
    if isinstance(value, dict):
        props = s.get("properties") or {}
        for key, sub in props.items():
            if key not in value and isinstance(sub, dict) and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
        for key, child in value.items():
            if key in props:
                _default(child, props[key])
            elif isinstance(s.get("additionalProperties"), dict):
                _default(child, s["additionalProperties"])
    elif isinstance(value, list) and isinstance(s.get("items"), dict):
        for item in value:
            _default(item, s["items"])


def _list_rules(value: Any, s: dict, path: list, errors: list[FieldError]) -> None:
    if not isinstance(s, dict):
        return
    if isinstance(value, dict):
        props = s.get("properties") or {}
        for key, child in value.items():
            if key in props:
                _list_rules(child, props[key], path + [key], errors)
            elif isinstance(s.get("additionalProperties"), dict):
                _list_rules(child, s["additionalProperties"], path + [key], errors)
    elif isinstance(value, list):
        kind = s.get("x-kubernetes-list-type")
        seen: set[str] = set()
        for i, item in enumerate(value):
            if kind == "map" and isinstance(item, dict):
                keys = {k: item.get(k) for k in s.get("x-kubernetes-list-map-keys") or []}
                ident = json.dumps(keys, sort_keys=True)
                if ident in seen:
                    errors.append(FieldError(_path(path + [i]), "Duplicate", "", keys))
                seen.add(ident)
            elif kind == "set":
                ident = json.dumps(item, sort_keys=True)
                if ident in seen:
                    errors.append(FieldError(_path(path + [i]), "Duplicate", "", item))
                seen.add(ident)
            if isinstance(s.get("items"), dict):
                _list_rules(item, s["items"], path + [i], errors)


def _type_name(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


def _field_error(e: jsonschema.ValidationError) -> FieldError:
    where = _path(e.absolute_path)
    v = e.instance
    kw = e.validator
    if kw == "required":
        missing = e.message.split("'")[1] if "'" in e.message else "?"
        return FieldError(_path(list(e.absolute_path) + [missing]), "Required")
    if kw == "type":
        want = e.validator_value
        want = " or ".join(want) if isinstance(want, list) else want
        return FieldError(where, "Invalid", f'{where} in body must be of type {want}: "{_type_name(v)}"', _type_name(v))
    if kw == "enum":
        return FieldError(where, "NotSupported", "supported values: " + ", ".join(json.dumps(x) for x in e.validator_value), v)
    if kw == "pattern":
        return FieldError(where, "Invalid", f"{where} in body should match '{e.validator_value}'", v)
    if kw == "maxLength":
        return FieldError(where, "TooLong", f"may not be more than {e.validator_value} bytes", v)
    if kw == "minLength":
        return FieldError(where, "Invalid", f"{where} in body should be at least {e.validator_value} chars long", v)
    if kw == "minimum":
        op = "greater than" if e.schema.get("exclusiveMinimum") else "greater than or equal to"
        return FieldError(where, "Invalid", f"{where} in body should be {op} {e.validator_value}", v)
    if kw == "maximum":
        op = "less than" if e.schema.get("exclusiveMaximum") else "less than or equal to"
        return FieldError(where, "Invalid", f"{where} in body should be {op} {e.validator_value}", v)
    if kw == "maxItems":
        return FieldError(where, "TooMany", f"must have at most {e.validator_value} items", len(v) if isinstance(v, list) else v)
    if kw == "minItems":
        return FieldError(where, "Invalid", f"{where} in body should have at least {e.validator_value} items", len(v) if isinstance(v, list) else v)
    if kw == "maxProperties":
        return FieldError(where, "TooMany", f"must have at most {e.validator_value} properties", v)
    if kw == "minProperties":
        return FieldError(where, "Invalid", f"{where} in body should have at least {e.validator_value} properties", v)
    if kw == "uniqueItems":
        return FieldError(where, "Duplicate", "", v)
    if kw == "multipleOf":
        return FieldError(where, "Invalid", f"{where} in body should be a multiple of {e.validator_value}", v)
    return FieldError(where, "Invalid", e.message, v)


def process(obj: dict, schema: dict | None, old: dict | None = None) -> Outcome:
    """Prune, default and validate a custom resource (a deep copy is returned);
    ``old``: the stored object an update replaces, for CEL transition rules."""
    out = copy.deepcopy(obj)
    if not schema:
        return Outcome(out)
    unknown: list[str] = []
    _prune(out, schema, [], unknown, root=True)
    _default(out, schema)
    errors: list[FieldError] = []
    body = {k: v for k, v in out.items() if k != "metadata"}
    validator = _validator(json.dumps(schema, sort_keys=True))
    for e in sorted(validator.iter_errors(body), key=lambda e: [str(p) for p in e.absolute_path]):
        if list(e.absolute_path)[:1] == ["metadata"]:
            continue
        if e.validator in ("anyOf", "oneOf", "allOf") and e.context:
            errors.append(_field_error(min(e.context, key=lambda c: len(list(c.absolute_path)))))
        else:
            errors.append(_field_error(e))
    _list_rules(out, schema, [], errors)
    if not errors:
        errors = cel.validation_errors(out, schema, old)
    return Outcome(out, unknown, errors)
