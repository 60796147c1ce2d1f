"""Kubernetes resource quantities (``500m``, ``4Gi``, ``1e3``) as the API
server reads them: the product's parser (``slurmk8s.api.quantities``, itself the
Kubernetes client's), with what a request body adds to it — a JSON number
where a quantity goes, and the API server's words for a bad one."""

from __future__ import annotations

from decimal import Decimal

from slurmk8s.api.quantities import quantity_value

#: What the API server answers for text that is no quantity.
_BAD = "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"


def parse(value: str | int | float) -> Decimal:
    """The quantity's value; raises ValueError naming the bad text."""
    if isinstance(value, bool):
        raise ValueError(f"quantity {value!r} is not a number")
    if isinstance(value, (int, float)):  # JSON's numbers: the API server takes them
        return Decimal(str(value))
    try:
        return quantity_value(str(value).strip())
    except ValueError:
        raise ValueError(f"{_BAD}: {value!r}") from None


def valid(value) -> bool:
    try:
        parse(value)
        return True
    except ValueError:
        return False
