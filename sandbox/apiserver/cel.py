"""CEL as the Kubernetes API server evaluates it (pure): webhooks' ``matchConditions``
and custom resources' validation rules (``x-kubernetes-validations``).

The language is the CEL library ``cel-python`` (``celpy``), given the few functions
of Kubernetes' CEL libraries the chart's rules use (``lowerAscii``, ``upperAscii``
of the strings extension, ``sum``/``min``/``max`` of the lists library).

Validation rules (:func:`validation_errors`) run after a custom resource is
pruned, defaulted and its schema checked, at every schema node that carries
``x-kubernetes-validations``, with ``self`` the value there (and ``oldSelf`` its
value before an update, for transition rules, where the node can be matched
with the old object's: through object properties and ``listType: map`` keys).
A false rule is a ``<path>: Invalid value: "<type>": <message>`` field error
(``fieldPath`` appended to the path; ``messageExpression`` evaluated for the
message when given), as kube-apiserver writes it.

Cost (:func:`rule_problems`, when a CRD is written): Kubernetes estimates the
worst-case cost of each rule from the schema's ``maxItems``/``maxLength``/
``maxProperties`` and refuses a CRD whose rule goes over its limit. The stand-in
estimates only what dominates it, the comprehensions (``all``, ``exists``,
``exists_one``, ``map``, ``filter``): a comprehension over a list or map without
``maxItems``/``maxProperties`` is refused ("unbounded"), and nested
comprehensions multiply their bounds, which must stay within
:data:`ESTIMATED_COST_LIMIT`. The string lengths that Kubernetes multiplies in
too are left out.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from typing import Any

import celpy
from celpy import celtypes
from celpy.evaluation import CELUnsupportedError

from .errors import FieldError

__all__ = ["program", "compile_problem", "eval_message", "validation_errors", "rule_problems",
           "ESTIMATED_COST_LIMIT", "EvalErrors"]

#: Kubernetes' limit on one rule's estimated cost (apiextensions' StaticEstimatedCostLimit).
ESTIMATED_COST_LIMIT = 10_000_000

#: The macros that iterate a list or map.
_COMPREHENSIONS = ("all", "exists_one", "exists", "map", "filter")

EvalErrors = (celpy.CELEvalError, CELUnsupportedError, TypeError, ValueError)


def _lower_ascii(s: celtypes.StringType) -> celtypes.StringType:
    return celtypes.StringType("".join(c.lower() if c.isascii() else c for c in s))


def _upper_ascii(s: celtypes.StringType) -> celtypes.StringType:
    return celtypes.StringType("".join(c.upper() if c.isascii() else c for c in s))


def _sum(values: celtypes.ListType) -> Any:
    return functools.reduce(lambda a, b: a + b, values, celtypes.IntType(0))


#: Kubernetes' CEL library functions the stand-in knows (strings extension, lists library).
FUNCTIONS: dict[str, Callable[..., Any]] = {
    "lowerAscii": _lower_ascii,
    "upperAscii": _upper_ascii,
    "sum": _sum,
    "min": lambda values: min(values),
    "max": lambda values: max(values),
}


@functools.lru_cache(maxsize=1024)
def program(expression: str) -> celpy.Runner:
    """The compiled CEL program of an expression (celpy.CELParseError when it does not compile)."""
    env = celpy.Environment()
    return env.program(env.compile(expression), functions=FUNCTIONS)


def compile_problem(expression: str) -> str | None:
    """Why ``expression`` does not compile as CEL, or None."""
    try:
        program(expression)
    except celpy.CELParseError as exc:
        return f"compilation failed: {' '.join(str(exc).split())}"
    return None


def eval_message(exc: Exception) -> str:
    """A CEL evaluation error in the words cel-go uses where they differ (a missing key)."""
    text = str(exc.args[0]) if exc.args else str(exc)
    missing = re.fullmatch(r"no such member in mapping: '(.*)'", text)
    return f"no such key: {missing.group(1)}" if missing else text


# -- validation rules -------------------------------------------------------------------------------

_ROOT_SELF_KEYS = ("apiVersion", "kind", "metadata")


def _schema_type(s: Mapping) -> str:
    if s.get("x-kubernetes-int-or-string"):
        return "integer-or-string"
    return str(s.get("type") or "object")


def _is_true(result: Any) -> bool | None:
    """True/False for a bool result, None for anything else (an error: the rule must give a bool)."""
    return bool(result) if isinstance(result, celtypes.BoolType) else None


def _self_value(value: Any, root: bool) -> Any:
    """What ``self`` sees: at the root, of metadata only name and generateName (as Kubernetes)."""
    if root and isinstance(value, dict):
        out = {k: v for k, v in value.items() if k != "metadata"}
        meta = value.get("metadata")
        if isinstance(meta, dict):
            out["metadata"] = {k: meta[k] for k in ("name", "generateName") if k in meta}
        return out
    return value


def _path(base: str, field_path: str | None) -> str:
    if not field_path:
        return base
    rel = field_path if field_path.startswith((".", "[")) else "." + field_path
    return (base + rel) if base else rel.lstrip(".")


def _check_rules(value: Any, old: Any, s: Mapping, path: str, root: bool, errors: list[FieldError]) -> None:
    for rule in s.get("x-kubernetes-validations") or ():
        text = rule.get("rule") or ""
        if old is _MISSING and re.search(r"\boldSelf\b", text):
            continue  # a transition rule runs only on an update that keeps the node
        activation = {"self": celpy.json_to_cel(_self_value(value, root))}
        if old is not _MISSING:
            activation["oldSelf"] = celpy.json_to_cel(_self_value(old, root))
        where = _path(path, rule.get("fieldPath"))
        try:
            ok = _is_true(program(text).evaluate(activation))
        except EvalErrors as exc:
            errors.append(FieldError(where or "<nil>", "Invalid", f"rule evaluation error: {eval_message(exc)}",
                                     _schema_type(s)))
            continue
        if ok is None:
            errors.append(FieldError(where or "<nil>", "Invalid", "rule evaluation error: the rule did not return a "
                                     "bool", _schema_type(s)))
            continue
        if ok:
            continue
        message = rule.get("message") or f"failed rule: {text}"
        if rule.get("messageExpression"):
            try:
                got = program(rule["messageExpression"]).evaluate(activation)
                if isinstance(got, str) and got.strip() and "\n" not in got:
                    message = str(got)
            except EvalErrors:
                pass  # Kubernetes falls back to message (or the default) and logs the error
        kind = {"FieldValueForbidden": "Forbidden", "FieldValueRequired": "Required",
                "FieldValueDuplicate": "Duplicate"}.get(rule.get("reason") or "", "Invalid")
        errors.append(FieldError(where or "<nil>", kind, message, _schema_type(s)))


class _Missing:
    pass


_MISSING: Any = _Missing()


def _walk(value: Any, old: Any, s: Any, path: str, root: bool, errors: list[FieldError]) -> None:
    if not isinstance(s, Mapping):
        return
    if isinstance(value, dict):
        props = s.get("properties") or {}
        addl = s.get("additionalProperties")
        for key, child in value.items():
            if root and key in _ROOT_SELF_KEYS:
                continue
            sub = props.get(key, addl if isinstance(addl, Mapping) else None)
            if sub is None:
                continue
            old_child = old.get(key, _MISSING) if isinstance(old, dict) else _MISSING
            child_path = f"{path}.{key}" if path else key
            if key not in props:
                child_path = f"{path}[{key}]"
            _walk(child, old_child, sub, child_path, False, errors)
    elif isinstance(value, list) and isinstance(s.get("items"), Mapping):
        keys = s.get("x-kubernetes-list-map-keys") if s.get("x-kubernetes-list-type") == "map" else None
        olds: dict[str, Any] = {}
        if keys and isinstance(old, list):
            olds = {repr([o.get(k) for k in keys]): o for o in old if isinstance(o, dict)}
        for i, item in enumerate(value):
            old_item = olds.get(repr([item.get(k) for k in keys]), _MISSING) \
                if keys and isinstance(item, dict) else _MISSING
            _walk(item, old_item, s["items"], f"{path}[{i}]", False, errors)
    if value is not None:
        _check_rules(value, old, s, path, root, errors)


def validation_errors(obj: dict, schema: Mapping, old: dict | None = None) -> list[FieldError]:
    """The field errors of ``obj``'s validation rules (its CRD version's ``openAPIV3Schema``);
    ``old``: the object before an update, for transition rules."""
    errors: list[FieldError] = []
    _walk(obj, old if old is not None else _MISSING, schema, "", True, errors)
    return errors


# -- cost --------------------------------------------------------------------------------------------

_MACRO = re.compile(r"((?:[A-Za-z_][A-Za-z0-9_]*)(?:\.[A-Za-z_][A-Za-z0-9_]*)*)\.(" + "|".join(_COMPREHENSIONS)
                    + r")\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*,")


def _close(text: str, start: int) -> int:
    """The index of the parenthesis that closes the one before ``start`` (strings skipped)."""
    depth, i, quote = 1, start, ""
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return len(text)


def _resolve(chain: str, scope: Mapping[str, Mapping]) -> Mapping | None:
    """The schema node a member chain (``self.a.b``, ``x.c``) names, or None."""
    head, *rest = chain.split(".")
    node = scope.get(head)
    for part in rest:
        if node is None:
            return None
        props = node.get("properties") or {}
        node = props.get(part) if part in props else (
            node.get("additionalProperties") if isinstance(node.get("additionalProperties"), Mapping) else None)
    return node


def _cost(text: str, scope: dict[str, Mapping], problems: list[str]) -> int:
    """The estimated number of iterations of ``text``'s comprehensions (nested ones multiply)."""
    total, pos = 0, 0
    while True:
        m = _MACRO.search(text, pos)
        if m is None:
            return total
        end = _close(text, m.end())
        target = _resolve(m.group(1), scope)
        bound = None
        element: Mapping = {}
        if target is not None:
            if target.get("type") == "array":
                bound = target.get("maxItems")
                element = target.get("items") or {}
            elif target.get("type") == "object":
                bound = target.get("maxProperties")
                element = {"type": "string"}
        if target is not None and bound is None:
            problems.append(f"{m.group(1)}.{m.group(2)}() iterates a list or map with no maxItems or maxProperties: "
                            "its cost cannot be bounded")
            bound = ESTIMATED_COST_LIMIT
        inner = _cost(text[m.end():end], {**scope, m.group(3): element}, problems)
        total += (bound or 1) * (1 + inner)
        pos = end


def rule_problems(schema: Mapping, path: str = "openAPIV3Schema") -> list[str]:
    """What a CRD's validation rules have wrong: a rule or messageExpression that does not
    compile, a fieldPath that names no field, a rule whose cost cannot be bounded or goes
    over :data:`ESTIMATED_COST_LIMIT`, a rule where Kubernetes allows none."""
    problems: list[str] = []

    def visit(s: Any, where: str, root: bool) -> None:
        if not isinstance(s, Mapping):
            return
        for i, rule in enumerate(s.get("x-kubernetes-validations") or ()):
            at = f"{where}.x-kubernetes-validations[{i}]"
            text = rule.get("rule") or ""
            for key in ("rule", "messageExpression"):
                if rule.get(key):
                    why = compile_problem(rule[key])
                    if why:
                        problems.append(f"{at}.{key}: {why}")
            if not text:
                problems.append(f"{at}.rule: Required value")
            if "\n" in (rule.get("message") or ""):
                problems.append(f"{at}.message: must not contain line breaks")
            if rule.get("fieldPath") and _resolve("self" + rule["fieldPath"], {"self": s}) is None:
                problems.append(f"{at}.fieldPath: does not refer to a field of the schema: {rule['fieldPath']}")
            found: list[str] = []
            cost = _cost(text, {"self": s}, found)
            problems.extend(f"{at}.rule: {p}" for p in found)
            if not found and cost > ESTIMATED_COST_LIMIT:
                problems.append(f"{at}.rule: estimated rule cost exceeds budget by factor of "
                                f"{cost / ESTIMATED_COST_LIMIT:.1f}x (try simplifying the rule, or adding maxItems, "
                                "maxProperties, and maxLength where arrays, maps, and strings are declared)")
        for key, sub in (s.get("properties") or {}).items():
            visit(sub, f"{where}.properties[{key}]", False)
        if isinstance(s.get("items"), Mapping):
            visit(s["items"], f"{where}.items", False)
        if isinstance(s.get("additionalProperties"), Mapping):
            visit(s["additionalProperties"], f"{where}.additionalProperties", False)

    visit(schema, path, True)
    return problems
