"""Kubernetes resource quantities (``500m``, ``4``, ``16Gi``): their exact and
approximate values, and the API type that checks them. Pure.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Annotated

from kubernetes.utils import parse_quantity as _k8s_quantity
from pydantic import AfterValidator

from .refusals import pattern_check, refuse, schema_pattern

__all__ = ["QUANTITY_RE", "NONNEGATIVE_QUANTITY_RE", "MAX_QUANTITY", "Quantity", "quantity_value", "parse_quantity"]

QUANTITY_RE = (
    r"(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?"
)

#: What the CRD publishes: the same, without a sign (no negative amounts).
NONNEGATIVE_QUANTITY_RE = QUANTITY_RE.removeprefix(r"(\+|-)?")



def quantity_value(value: str) -> Decimal:
    """The exact value of a Kubernetes quantity string ("8Gi" -> 8589934592),
    as the Kubernetes client reads it (kubernetes.utils.parse_quantity)."""
    if not re.fullmatch(QUANTITY_RE, value, re.ASCII):  # Decimal alone would take "Infinity" or "1_0"
        raise ValueError(f"not a quantity: {value!r}")
    try:
        return _k8s_quantity(value)
    except (ValueError, InvalidOperation):
        raise ValueError(f"not a quantity: {value!r}") from None


def parse_quantity(value: str) -> float:
    """The numeric value of a Kubernetes quantity string ("8Gi" -> 8589934592.0);
    out of a float's range, inf or 0.0. Checks on user input use
    :func:`quantity_value`, which is exact."""
    return float(quantity_value(value))


#: Kubernetes keeps quantities in a signed 64-bit integer: 8Ei - 1 is the most.
MAX_QUANTITY = 2**63 - 1


def _quantity(value: str) -> str:
    pattern_check(QUANTITY_RE, "use a Kubernetes quantity such as 500m, 4 or 16Gi", 32)(value)
    if value.startswith("+"):  # the CRD's pattern has no sign either
        raise refuse(value, "has a sign; write the amount without '+'")
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
