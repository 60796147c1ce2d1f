"""Kubernetes resource quantities (``500m``, ``4``, ``16Gi``): their exact and
approximate values, and the API type that checks them. Pure.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Annotated

from pydantic import AfterValidator

from .refusals import pattern_check, refuse, schema_pattern

__all__ = ["QUANTITY_RE", "NONNEGATIVE_QUANTITY_RE", "MAX_QUANTITY", "Quantity", "quantity_value", "parse_quantity"]

QUANTITY_RE = (
    r"(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?"
)

#: What the CRD publishes: the same, without a sign (no negative amounts).
NONNEGATIVE_QUANTITY_RE = QUANTITY_RE.removeprefix(r"(\+|-)?")

_SUFFIX = {
    "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30), "Ti": Decimal(2**40),
    "Pi": Decimal(2**50), "Ei": Decimal(2**60),
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
    "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12),
    "P": Decimal(10**15), "E": Decimal(10**18),
}


def quantity_value(value: str) -> Decimal:
    """The exact value of a Kubernetes quantity string ("8Gi" -> 8589934592)."""
    m = re.fullmatch(r"([+-]?[0-9.]+)([eE][+-]?[0-9.]+|[A-Za-z]*)", value, re.ASCII)
    if not m:
        raise ValueError(f"not a quantity: {value!r}")
    number, suffix = m.groups()
    try:
        if suffix[:1] in ("e", "E"):
            exponent = Decimal(suffix[1:])
            if abs(exponent) > 64:  # Decimal would happily build 1e400000
                raise ValueError(f"quantity out of range: {value!r}")
            return Decimal(number).scaleb(exponent)
        if suffix not in _SUFFIX:
            raise ValueError(f"not a quantity: {value!r}")
        return Decimal(number) * _SUFFIX[suffix]
    except InvalidOperation:
        raise ValueError(f"not a quantity: {value!r}") from None


def parse_quantity(value: str) -> float:
    """The numeric value of a Kubernetes quantity string ("8Gi" -> 8589934592.0);
    out of a float's range, inf or 0.0. Checks on user input use
    :func:`quantity_value`, which is exact."""
    m = re.fullmatch(r"([+-]?[0-9.]+)([eE][+-]?[0-9.]+|[A-Za-z]*)", value, re.ASCII)
    if not m:
        raise ValueError(f"not a quantity: {value!r}")
    number, suffix = m.groups()
    if suffix[:1] in ("e", "E"):
        return float(number + suffix)
    return float(number) * float(_SUFFIX[suffix])


#: Kubernetes keeps quantities in a signed 64-bit integer: 8Ei - 1 is the most.
MAX_QUANTITY = 2**63 - 1


def _quantity(value: str) -> str:
    pattern_check(QUANTITY_RE, "use a Kubernetes quantity such as 500m, 4 or 16Gi", 32)(value)
    try:
        amount = quantity_value(value)
    except ValueError:
        raise refuse(value, "is not a quantity Kubernetes can hold; use one such as 500m, 4 or 16Gi") from None
    if amount < 0:
        raise refuse(value, "is negative; a resource amount must be 0 or more")
    if amount > MAX_QUANTITY:
        raise refuse(value, "is larger than Kubernetes can hold (8Ei)")
    return value


#: A Kubernetes resource quantity such as ``500m``, ``4`` or ``16Gi``.
Quantity = Annotated[str, AfterValidator(_quantity), schema_pattern(f"^{NONNEGATIVE_QUANTITY_RE}$", 32)]
