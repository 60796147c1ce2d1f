"""The JSONPath subset Kubernetes uses in printer columns, scale paths and
selectable fields: ``.a.b``, ``.a[0]``, ``.a[*].b``, ``.a['x.y']`` and filters
``[?(@.type=="Ready")]`` (``==``/``!=``, string or number literals). Pure."""

from __future__ import annotations

import json
import re
from typing import Any

from .errors import APIError

_FILTER = re.compile(r"""^\?\(@((?:\.[A-Za-z0-9_\-/]+)+)\s*(==|!=)\s*(?:"([^"]*)"|'([^']*)'|(-?[0-9.]+)|(true|false))\)$""")


def parse(path: str) -> list[tuple]:
    """Steps: ('key', name) | ('index', n) | ('all',) | ('filter', [keys], op, value)."""
    p = path.strip()
    if p.startswith("{") and p.endswith("}"):
        p = p[1:-1]
    if p.startswith("$"):
        p = p[1:]
    steps: list[tuple] = []
    i = 0
    while i < len(p):
        c = p[i]
        if c == ".":
            j = i + 1
            name = []
            while j < len(p) and p[j] not in ".[":
                if p[j] == "\\" and j + 1 < len(p):
                    name.append(p[j + 1])
                    j += 2
                    continue
                name.append(p[j])
                j += 1
            if not name:
                raise ValueError(f"empty field name in JSONPath {path!r}")
            steps.append(("key", "".join(name)))
            i = j
        elif c == "[":
            j = p.find("]", i)
            if j < 0:
                raise ValueError(f"unterminated [ in JSONPath {path!r}")
            # a filter may contain ']' only inside quotes; we do not support that
            inner = p[i + 1 : j].strip()
            if inner == "*":
                steps.append(("all",))
            elif re.fullmatch(r"-?[0-9]+", inner):
                steps.append(("index", int(inner)))
            elif (inner.startswith("'") and inner.endswith("'")) or (inner.startswith('"') and inner.endswith('"')):
                steps.append(("key", inner[1:-1]))
            else:
                m = _FILTER.match(inner)
                if not m:
                    raise ValueError(f"unsupported JSONPath expression [{inner}] in {path!r}")
                keys = m.group(1).split(".")[1:]
                if m.group(3) is not None:
                    value: Any = m.group(3)
                elif m.group(4) is not None:
                    value = m.group(4)
                elif m.group(5) is not None:
                    value = json.loads(m.group(5))
                else:
                    value = m.group(6) == "true"
                steps.append(("filter", keys, m.group(2), value))
            i = j + 1
        else:
            raise ValueError(f"JSONPath {path!r} must start with '.' (at {p[i:]!r})")
    return steps


def find(obj: Any, path: str | list[tuple]) -> list[Any]:
    """Every value the path selects (empty when nothing matches)."""
    steps = parse(path) if isinstance(path, str) else path
    current = [obj]
    for step in steps:
        nxt: list[Any] = []
        for v in current:
            if step[0] == "key":
                if isinstance(v, dict) and step[1] in v:
                    nxt.append(v[step[1]])
            elif step[0] == "index":
                if isinstance(v, list) and -len(v) <= step[1] < len(v):
                    nxt.append(v[step[1]])
            elif step[0] == "all":
                if isinstance(v, list):
                    nxt.extend(v)
                elif isinstance(v, dict):
                    nxt.extend(v.values())
            else:
                _, keys, op, want = step
                if not isinstance(v, list):
                    continue
                for item in v:
                    got: Any = item
                    for k in keys:
                        got = got.get(k) if isinstance(got, dict) else None
                    if (got == want) == (op == "=="):
                        nxt.append(item)
        current = nxt
    return current


def first(obj: Any, path: str) -> Any:
    found = find(obj, path)
    return found[0] if found else None


def set_value(obj: dict, path: str, value: Any) -> None:
    """Set a value at a simple ``.a.b.c`` path, creating maps on the way."""
    steps = parse(path)
    if not steps or any(s[0] != "key" for s in steps):
        raise APIError(500, f"cannot write through JSONPath {path!r}: only .a.b.c paths are writable")
    cur = obj
    for s in steps[:-1]:
        nxt = cur.get(s[1])
        if not isinstance(nxt, dict):
            nxt = cur[s[1]] = {}
        cur = nxt
    cur[steps[-1][1]] = value
