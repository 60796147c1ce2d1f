"""Kubernetes resource quantities (``500m``, ``4Gi``, ``1e3``) as exact decimals."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_SUFFIXES = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}
_RE = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?:([eE][+-]?[0-9]+)|([numkMGTPE]i?)?)$")


def parse(value: str | int | float) -> Decimal:
    """The quantity's value; raises ValueError naming the bad text."""
    if isinstance(value, bool):
        raise ValueError(f"quantity {value!r} is not a number")
    if isinstance(value, (int, float)):
        return Decimal(str(value))
    m = _RE.match(str(value).strip())
    if not m or (m.group(3) or "") not in _SUFFIXES:
        raise ValueError(f"quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {value!r}")
    try:
        number = Decimal(m.group(1))
        if m.group(2):
            return number * (Decimal(10) ** int(m.group(2)[1:]))
        return number * _SUFFIXES[m.group(3) or ""]
    except InvalidOperation as e:  # pragma: no cover - the regex rules it out
        raise ValueError(f"bad quantity {value!r}") from e


def valid(value) -> bool:
    try:
        parse(value)
        return True
    except ValueError:
        return False
