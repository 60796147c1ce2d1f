"""Slurm host lists, as squeue and sinfo print them: ``gpu-[01-03,7],cpu0``. Pure."""

from __future__ import annotations

import itertools
import re

__all__ = ["expand", "HostlistError"]

_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
_ONE_RANGE = re.compile(r"([^\[\],]*)\[(\d+)-(\d+)\]([^\[\],]*)")
#: Ranges beyond this many names are refused rather than expanded.
MAX_NAMES = 1 << 20


class HostlistError(ValueError):
    """The text is not a Slurm host list."""


def _split_top(text: str) -> list[str]:
    """Split on the commas that are not inside brackets."""
    items, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"nested '[' in host list {text!r}")
        elif c == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unbalanced ']' in host list {text!r}")
        elif c == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise HostlistError(f"unbalanced '[' in host list {text!r}")
    items.append(text[start:])
    return [item for item in items if item]


def _expand_group(group: str, text: str) -> list[str]:
    out: list[str] = []
    for part in group.split(","):
        m = _RANGE.fullmatch(part)
        if not m:
            raise HostlistError(f"{part!r} is not a number or a range in host list {text!r}")
        lo, hi = m.group(1), m.group(2)
        if hi is None:
            out.append(lo)
        else:
            out += _numbers(lo, hi, text)
    return out


def _numbers(lo: str, hi: str, text: str) -> list[str]:
    """The numbers of the range ``lo-hi``, as wide as ``lo`` (``01-03``: 01, 02, 03)."""
    first, last = int(lo), int(hi)
    if last < first or last - first >= MAX_NAMES:
        raise HostlistError(f"range {f'{lo}-{hi}'!r} in host list {text!r} is reversed or too long")
    width = len(lo)
    return [str(n).zfill(width) for n in range(first, last + 1)]


def expand(hostlist: str) -> list[str]:
    """The node names of a host list, in order: ``"n[1-2],x"`` -> ``["n1", "n2", "x"]``.

    Several bracket groups in one name expand to every combination
    (``"r[1-2]n[1-2]"`` -> r1n1, r1n2, r2n1, r2n2). Raises :class:`HostlistError`.
    """
    hostlist = hostlist.strip()
    if "[" not in hostlist and "]" not in hostlist:  # plain names: the common case
        return [name for name in hostlist.split(",") if name]
    one = _ONE_RANGE.fullmatch(hostlist)
    if one is not None:  # one name with one range (``gpu-[01-04]``): the common case
        prefix, lo, hi, suffix = one.groups()
        return [prefix + n + suffix for n in _numbers(lo, hi, hostlist)]
    names: list[str] = []
    for item in _split_top(hostlist):
        pieces = re.split(r"\[([^\]]*)\]", item)
        # pieces alternate: literal, group, literal, group, ..., literal
        choices = [[p] if i % 2 == 0 else _expand_group(p, hostlist) for i, p in enumerate(pieces)]
        names.extend("".join(combo) for combo in itertools.product(*choices))
        if len(names) > MAX_NAMES:
            raise HostlistError(f"host list {hostlist[:60]!r} names more than {MAX_NAMES} nodes")
    return names
