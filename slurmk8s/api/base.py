"""The base class of every API model: camelCase names, strict keys, docstring descriptions;
objects as the API server keeps them (:func:`without_nulls`); and the API group, whose
domain names slurmk8s's own labels, annotations and taints (:func:`in_group`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

#: The API group of every slurmk8s resource, label, annotation and taint: the one place it is written.
GROUP = "slurmk8s.dev"

#: The bound of integer fields whose natural bound (Kubernetes' int64, Slurm's
#: uint64) is larger: 2^53 - 1, the largest integer every JSON reader holds
#: exactly (Helm reads the CRD's maximum as a float64).
MAX_EXACT_INTEGER = 2**53 - 1


def in_group(key: str) -> bool:
    """Whether a label, annotation or taint key is slurmk8s's own: its prefix is :data:`GROUP`
    or a subdomain of it (``slurmk8s.dev/lent``, ``x.slurmk8s.dev/y``)."""
    prefix, slash, _ = key.rpartition("/")
    return bool(slash) and (prefix == GROUP or prefix.endswith("." + GROUP))


class ApiModel(BaseModel):
    """Fields are snake_case in Python and camelCase in YAML; unknown keys are errors.

    The docstring under each field becomes its description in the CRD, and so
    in ``kubectl explain``.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
        validate_default=False,
        # As the CRD: "3" is not an integer and 1 is not true. YAML already
        # gives each scalar its type; converting would accept what the API
        # server refuses.
        strict=True,
    )

    def dump(self) -> dict:
        """The YAML/JSON form: camelCase keys, unset optional fields left out."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def list_map(key: str = "name") -> dict:
    """Mark a list of objects as a map keyed by ``key`` (server-side apply merges by it)."""
    return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": [key]}


def without_nulls(value: Any) -> Any:
    """``value`` less its null map entries. No field of our CRDs is nullable, and the API server
    drops such nulls before it validates or stores a custom resource: a field set to null is a
    field not set (its default applies), and the validators judge it so too. Null list items
    stay (the API refuses them)."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value
