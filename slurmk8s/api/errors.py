"""Validation errors that name the field path and the reason."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from pydantic import ValidationError

from .fields import escape

__all__ = ["FieldError", "InvalidSpec", "field_path", "from_pydantic"]


@dataclass(frozen=True, order=True)
class FieldError:
    """One problem with one field: ``spec.partitions[1].name: <reason>``."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{escape(self.path)}: {escape(self.message)}"


class InvalidSpec(ValueError):
    """A resource failed validation. Carries every problem found, not just the first."""

    def __init__(self, errors: Sequence[FieldError], kind: str = "SlurmCluster", name: str = ""):
        self.errors = list(errors)
        self.kind = kind
        self.name = name
        super().__init__(str(self))

    def __str__(self) -> str:
        what = f"{self.kind} {self.name!r}" if self.name else self.kind
        lines = [f"{what} is invalid ({len(self.errors)} problem{'s' if len(self.errors) != 1 else ''}):"]
        lines = [escape(lines[0])] + [f"  {e}" for e in self.errors]
        return "\n".join(lines)


def field_path(loc: Iterable[str | int], root: str = "") -> str:
    """``("spec", "partitions", 1, "name")`` -> ``spec.partitions[1].name``."""
    out = root
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            part = escape(str(part))  # a map key is user input: no raw newlines in messages
            out += f".{part}" if out else part
    return out


# Pydantic's wording for the generic cases, rephrased for people writing YAML.
_REPHRASE = {
    "missing": "is required",
    "extra_forbidden": "is not a known field (check its spelling and indentation)",
    "string_type": "must be a string",
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "float_type": "must be a number",
    "recursion_loop": "is nested too deeply",
    "list_type": "must be a list",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping",
    "model_attributes_type": "must be a mapping",
}


_BOUNDS = {
    "greater_than_equal": "{input} is too small; the least allowed is {ge}",
    "greater_than": "{input} is too small; it must be more than {gt}",
    "less_than_equal": "{input} is too large; the most allowed is {le}",
    "less_than": "{input} is too large; it must be less than {lt}",
    "too_short": "has {actual_length} items; at least {min_length} are needed",
    "too_long": "has {actual_length} items; at most {max_length} are allowed",
}


def from_pydantic(exc: ValidationError, root: str = "",
                  explain: Callable[[Sequence[str | int]], str | None] | None = None) -> list[FieldError]:
    """Turn a pydantic ValidationError into field-path errors. ``explain``: why an unknown
    field is refused, where there is more to say than that it is unknown (its location ->
    the reason, or None)."""
    out = []
    for err in exc.errors(include_url=False):
        loc = [p for p in err["loc"] if not (isinstance(p, str) and "[" in p)]
        # Tagged unions and function validators add their own loc segments; drop them.
        loc = [p for p in loc if p not in ("function-after[_check()]",)]
        typ = err["type"]
        if typ == "slurmk8s":
            msg = err["msg"]
        elif typ == "extra_forbidden" and explain is not None and (why := explain(loc)) is not None:
            msg = why
        elif typ in _REPHRASE:
            msg = _REPHRASE[typ]
        elif typ in _BOUNDS:
            shown = err.get("input")
            shown = shown if isinstance(shown, (int, float)) else "it"
            msg = _BOUNDS[typ].format(input=shown, **err.get("ctx", {}))
        elif typ == "literal_error" or typ == "enum":
            msg = f"{err['input']!r} is not allowed; {err['msg'][0].lower()}{err['msg'][1:]}"
        else:
            msg = err["msg"]
            if msg.startswith("Value error, "):
                msg = msg[len("Value error, ") :]
        out.append(FieldError(field_path(loc, root), msg))
    return out
