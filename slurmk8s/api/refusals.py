"""How a user string is checked and, when refused, quoted. Pure.

Characters that nothing may carry (line breaks, NUL, control, zero-width and
bidirectional characters), the ones that would let a value escape its slot in
slurm.conf, and pattern-checked string types (:func:`constrained`). A refusal
quotes the value JSON-style with every such character escaped, so a message
never carries what it refuses; :mod:`slurmk8s.api.errors` prefixes the field
path. The field types themselves are in :mod:`.fields`.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterator

from annotated_types import GroupedMetadata
from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError

__all__ = [
    "LINE_BREAKS", "unprintable", "escape", "quote", "bad_char", "refuse", "no_injection", "pattern_check",
    "constrained", "schema_pattern",
]


def schema_pattern(pattern: str, max_length: int):
    """Publish the constraint in the JSON schema (and so in the CRD) only.

    The checks themselves run in the validators, which explain a refusal
    better than a bare pattern mismatch does.
    """
    return Field(json_schema_extra={"pattern": pattern, "maxLength": max_length})


#: What Python's str.splitlines (and so many a reader of a rendered file)
#: takes as a line break, beyond LF and CR.
LINE_BREAKS = frozenset("\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029")


def unprintable(c: str) -> bool:
    """A character that must not reach a config file or a log line as itself:
    control characters (NUL, C1 controls such as U+0085 included), format
    characters (zero-width spaces and joiners, bidirectional overrides, BOM),
    line and paragraph separators, unassigned and private-use code points."""
    return unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp")


def escape(text: str) -> str:
    """``text`` with every unprintable character written as an escape (``\\n``, ``\\u2028``)."""
    if not any(unprintable(c) for c in text):
        return text
    return "".join(json.dumps(c)[1:-1] if c in "\n\r\t" else f"\\u{ord(c):04x}" if unprintable(c) else c
                   for c in text)


def quote(value: str) -> str:
    """Quote a user value for an error message: JSON-style, and every control,
    zero-width or line-separator character escaped (a newline shows as ``\\n``)."""
    return escape(json.dumps(value, ensure_ascii=False))


def bad_char(value: str) -> str | None:
    """Why ``value`` may not be written anywhere, or None."""
    if "\n" in value or "\r" in value:
        return "contains a newline"
    for c in value:
        if c in LINE_BREAKS:
            return f"contains a line break (U+{ord(c):04X})"
        if c == "\0":
            return "contains a NUL character"
        if unprintable(c):
            return f"contains an invisible or control character (U+{ord(c):04X})"
    return None


def refuse(value: str, reason: str) -> PydanticCustomError:
    """An error for ``value``; the message reads ``"<value>" <reason>``."""
    # No context is passed, so pydantic leaves braces in the message alone.
    return PydanticCustomError("slurmk8s", f"{quote(value)} {reason}")


def no_injection(value: str) -> None:
    """Refuse the characters that would let a value escape its slurm.conf slot."""
    bad = bad_char(value)
    if bad:
        raise refuse(value, bad)
    if "#" in value:
        raise refuse(value, "contains '#', which starts a comment in Slurm config files")
    if "=" in value:
        raise refuse(value, "contains '=', which would inject a Slurm parameter")
    if any(c.isspace() for c in value):
        raise refuse(value, "contains whitespace, which would split a Slurm config line")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise refuse(value, "contains a control character")


def pattern_check(pattern: str, what: str, max_len: int, *, slurm: bool = True):
    """A validator for ``pattern``. ``slurm``: the value reaches Slurm config
    files, so injection characters are explained as such."""
    compiled = re.compile(pattern)

    def check(value: str) -> str:
        if slurm:
            no_injection(value)
        elif bad := bad_char(value):
            raise refuse(value, bad)
        if not value:
            raise refuse(value, f"is empty; {what}")
        if len(value) > max_len:
            raise refuse(value, f"is {len(value)} characters long; at most {max_len} are allowed")
        if not compiled.fullmatch(value):
            raise refuse(value, f"is not valid: {what}")
        return value

    return check


class constrained(GroupedMetadata):  # noqa: N801 - read as a type's constraint: Annotated[str, constrained(...)]
    """The constraint of a string type checked against ``pattern``, as ``Annotated[str, constrained(...)]``
    (an alias a type checker reads as ``str``); ``what`` tells the user how to fix it."""

    __slots__ = ("_metadata",)

    def __init__(self, pattern: str, what: str, max_len: int, *, slurm: bool = True):
        self._metadata = (
            AfterValidator(pattern_check(pattern, what, max_len, slurm=slurm)),
            schema_pattern(f"^{pattern}$", max_len),
        )

    def __iter__(self) -> Iterator[object]:
        return iter(self._metadata)
