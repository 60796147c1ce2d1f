"""Label and field selectors: parse the query-string form, match objects (pure).

Label selectors take every operator Kubernetes has: ``=``, ``==``, ``!=``,
``in``, ``notin``, ``key`` (exists), ``!key`` (does not exist), ``>``/``<``.
Field selectors take ``=``, ``==`` and ``!=`` on the fields a resource declares
selectable (see :func:`field_value`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import APIError

_NAME = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_KEY_RE = re.compile(rf"^(([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)/)?{_NAME}$")
_VALUE_RE = re.compile(rf"^({_NAME})?$")


def valid_label_key(key: str) -> bool:
    if not _KEY_RE.fullmatch(key):  # not .match: "$" would let a trailing newline through
        return False
    prefix, _, name = key.rpartition("/")
    return len(name) <= 63 and len(prefix) <= 253


def valid_label_value(value: str) -> bool:
    return len(value) <= 63 and bool(_VALUE_RE.fullmatch(value))


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # = != in notin exists !exists gt lt
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        has = self.key in labels
        value = labels.get(self.key)
        if self.op == "=":
            return has and value == self.values[0]
        if self.op == "in":
            return has and value in self.values
        if self.op == "!=":
            return not has or value != self.values[0]
        if self.op == "notin":
            return not has or value not in self.values
        if self.op == "exists":
            return has
        if self.op == "!exists":
            return not has
        if self.op in ("gt", "lt"):
            try:
                n, bound = int(value), int(self.values[0])  # type: ignore[arg-type]
            except (TypeError, ValueError):
                return False
            return n > bound if self.op == "gt" else n < bound
        raise AssertionError(self.op)


LabelSelector = tuple[Requirement, ...]
_TOKEN = re.compile(r"\s*(\(|\)|,|==|=|!=|!|>|<|[^\s(),=!<>]+)")


def _bad(text: str, why: str) -> APIError:
    return APIError(400, f"unable to parse requirement: {why} (in label selector {text!r})", "BadRequest")


def parse_label_selector(text: str | None) -> LabelSelector:
    """``a=b,c in (d,e),!f`` into requirements; 400 Bad Request on bad syntax."""
    if not text or not text.strip():
        return ()
    tokens: list[str] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            if text[pos:].strip() == "":
                break
            raise _bad(text, f"unexpected character at {text[pos:]!r}")
        tokens.append(m.group(1))
        pos = m.end()
    reqs: list[Requirement] = []
    i = 0

    def take() -> str | None:
        nonlocal i
        if i < len(tokens):
            i += 1
            return tokens[i - 1]
        return None

    def peek() -> str | None:
        return tokens[i] if i < len(tokens) else None

    while True:
        tok = take()
        if tok is None:
            raise _bad(text, "found end of input, expected a label key")
        negate = tok == "!"
        if negate:
            tok = take()
        if tok is None or tok in "(),=!<>" or tok in ("==", "!="):
            raise _bad(text, f"found {tok!r}, expected a label key")
        key = tok
        if not valid_label_key(key):
            raise _bad(text, f"invalid label key {key!r}: name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character")
        nxt = peek()
        if negate:
            if nxt not in (None, ","):
                raise _bad(text, f"found {nxt!r}, expected ',' or end of input after !{key}")
            reqs.append(Requirement(key, "!exists"))
        elif nxt in (None, ","):
            reqs.append(Requirement(key, "exists"))
        elif nxt in ("=", "==", "!="):
            take()
            value = peek()
            if value in (None, ","):
                value = ""
            else:
                take()
            if value in "()=!<>" and value != "":
                raise _bad(text, f"found {value!r}, expected a label value")
            if not valid_label_value(value):
                raise _bad(text, f"invalid label value {value!r}: must be 63 characters or less and consist of alphanumerics, '-', '_' or '.'")
            reqs.append(Requirement(key, "!=" if nxt == "!=" else "=", (value,)))
        elif nxt in ("in", "notin"):
            take()
            if take() != "(":
                raise _bad(text, f"expected '(' after {nxt}")
            values: list[str] = []
            while True:
                v = take()
                if v is None:
                    raise _bad(text, "found end of input, expected ')'")
                if v == ")":
                    break
                if v == ",":
                    continue
                if not valid_label_value(v):
                    raise _bad(text, f"invalid label value {v!r}")
                values.append(v)
            if not values:
                raise _bad(text, f"for '{nxt}' operator, values set can't be empty")
            reqs.append(Requirement(key, nxt, tuple(values)))
        elif nxt in (">", "<"):
            take()
            v = take()
            if v is None or not re.fullmatch(r"-?[0-9]+", v):
                raise _bad(text, f"for '{nxt}' operator, the value must be an integer")
            reqs.append(Requirement(key, "gt" if nxt == ">" else "lt", (v,)))
        else:
            raise _bad(text, f"found {nxt!r}, expected one of: in, notin, =, ==, !=, >, <, ',' or end of input")
        sep = take()
        if sep is None:
            break
        if sep != ",":
            raise _bad(text, f"found {sep!r}, expected ','")
    return tuple(reqs)


def labels_match(selector: LabelSelector, labels: Mapping[str, str] | None) -> bool:
    labels = labels or {}
    return all(r.matches(labels) for r in selector)


def from_label_selector_object(sel: Mapping[str, Any] | None) -> LabelSelector | None:
    """A structured ``LabelSelector`` (matchLabels + matchExpressions).

    ``None`` or ``{}`` selects everything: returns ``()``. Returns ``None`` for a
    selector that can match nothing (an unknown operator), as Kubernetes does.
    """
    if not sel:
        return ()
    reqs = [Requirement(k, "=", (str(v),)) for k, v in (sel.get("matchLabels") or {}).items()]
    ops = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!exists"}
    for expr in sel.get("matchExpressions") or []:
        op = ops.get(expr.get("operator"))
        if op is None:
            return None
        reqs.append(Requirement(expr.get("key", ""), op, tuple(str(v) for v in expr.get("values") or ())))
    return tuple(reqs)


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str] | None) -> bool:
    """Whether a structured selector selects ``labels``, as NetworkPolicies and webhooks read
    one: absent or ``{}`` selects everything, an unknown operator nothing."""
    parsed = from_label_selector_object(selector)
    return parsed is not None and labels_match(parsed, labels)


def label_selector_errors(sel: Mapping[str, Any] | None, path: str) -> list[tuple[str, str]]:
    """Problems in a structured selector as (field, message) pairs."""
    out: list[tuple[str, str]] = []
    if not sel:
        return out
    for k, v in (sel.get("matchLabels") or {}).items():
        if not valid_label_key(k):
            out.append((f"{path}.matchLabels", f"invalid label key {k!r}"))
        if not isinstance(v, str) or not valid_label_value(v):
            out.append((f"{path}.matchLabels", f"invalid label value {v!r}"))
    for i, expr in enumerate(sel.get("matchExpressions") or []):
        op = expr.get("operator")
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            out.append((f"{path}.matchExpressions[{i}].operator", f"not a valid selector operator: {op!r}"))
        elif op in ("In", "NotIn") and not expr.get("values"):
            out.append((f"{path}.matchExpressions[{i}].values", "must be specified when `operator` is 'In' or 'NotIn'"))
        elif op in ("Exists", "DoesNotExist") and expr.get("values"):
            out.append((f"{path}.matchExpressions[{i}].values", "may not be specified when `operator` is 'Exists' or 'DoesNotExist'"))
    return out


# --- field selectors ---------------------------------------------------------


@dataclass(frozen=True)
class FieldRequirement:
    field: str
    op: str  # = or !=
    value: str

    def matches(self, fields: Mapping[str, str]) -> bool:
        v = fields.get(self.field, "")
        return v == self.value if self.op == "=" else v != self.value


FieldSelector = tuple[FieldRequirement, ...]


def _split_unescaped(text: str, sep: str) -> list[str]:
    parts, cur, i = [], [], 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            cur.append(text[i : i + 2])
            i += 2
            continue
        if c == sep:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(c)
        i += 1
    parts.append("".join(cur))
    return parts


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def parse_field_selector(text: str | None, supported: Sequence[str]) -> FieldSelector:
    """``metadata.name=x,status.phase!=Running``; 400 on bad syntax or an unsupported field."""
    if not text or not text.strip():
        return ()
    reqs = []
    for part in _split_unescaped(text, ","):
        part = part.strip()
        if not part:
            continue
        m = re.match(r"^((?:[^=!\\]|\\.)+?)\s*(==|=|!=)\s*(.*)$", part)
        if not m:
            raise APIError(400, f"invalid selector: {text!r}; can't understand {part!r}", "BadRequest")
        field, op, value = m.group(1).strip(), m.group(2), _unescape(m.group(3).strip())
        if field not in supported:
            raise APIError(
                400,
                f'field label not supported: {field} (this resource supports: {", ".join(supported)})',
                "BadRequest",
            )
        reqs.append(FieldRequirement(field, "!=" if op == "!=" else "=", value))
    return tuple(reqs)


def fields_match(selector: FieldSelector, fields: Mapping[str, str]) -> bool:
    return all(r.matches(fields) for r in selector)


def _get(obj: Mapping, path: str) -> Any:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(part)
    return cur


def _str(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


COMMON_FIELDS = ("metadata.name", "metadata.namespace")

# Selectable fields per (group, plural), beyond metadata.name and metadata.namespace.
EXTRA_FIELDS: dict[tuple[str, str], tuple[str, ...]] = {
    ("", "pods"): (
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    ),
    ("", "events"): (
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    ),
    ("", "nodes"): ("spec.unschedulable",),
    ("", "namespaces"): ("status.phase",),
    ("", "secrets"): ("type",),
    ("", "persistentvolumeclaims"): (),
    ("apps", "replicasets"): ("status.replicas",),
}


def selectable_fields(storage: tuple[str, str], crd_fields: Sequence[str] = ()) -> tuple[str, ...]:
    return COMMON_FIELDS + EXTRA_FIELDS.get(storage, ()) + tuple(crd_fields)


def field_value(obj: Mapping, field: str) -> str:
    if field == "source":
        return _str(_get(obj, "source.component"))
    return _str(_get(obj, field))


def object_fields(obj: Mapping, fields: Sequence[str]) -> dict[str, str]:
    return {f: field_value(obj, f) for f in fields}


Matcher = Callable[[Mapping], bool]
