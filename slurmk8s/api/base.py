"""The base class of every API model: camelCase names, strict keys, docstring descriptions;
and objects as the API server keeps them (:func:`without_nulls`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


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
