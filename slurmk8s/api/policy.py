"""Load and check a NodeLendingPolicy: the schema (pydantic) and the rules
that span fields, each problem with its field path (as :mod:`.validate` does
for a SlurmCluster, whose prechecks it shares)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pydantic import ValidationError

from .errors import FieldError, InvalidSpec, from_pydantic
from .fields import quantity_value, quote
from .lending import NodeLendingPolicy
from .podtemplate import pod_template_errors, unknown_field_reason
from .scheduling import selector_errors
from .validate import _name_of, _precheck

__all__ = ["load_policy", "policy_errors"]


def load_policy(obj: Any) -> NodeLendingPolicy:
    """Parse and check a NodeLendingPolicy manifest, reporting every problem by field path."""
    obj = _precheck(obj, "NodeLendingPolicy")
    name = _name_of(obj)
    try:
        policy = NodeLendingPolicy.model_validate(obj)
    except ValidationError as exc:
        raise InvalidSpec(sorted(from_pydantic(exc, explain=unknown_field_reason)), kind="NodeLendingPolicy",
                          name=name) from None
    errors = list(policy_errors(policy))
    if errors:
        raise InvalidSpec(errors, kind="NodeLendingPolicy", name=policy.name)
    return policy


def policy_errors(p: NodeLendingPolicy) -> Iterator[FieldError]:
    """Rules of a NodeLendingPolicy that involve more than one field."""
    spec = p.spec
    if spec.node_selector.empty:
        yield FieldError(
            "spec.nodeSelector",
            "is empty and would lend every GPU node of the cluster; give matchLabels or matchExpressions, "
            'e.g. matchLabels: {slurmk8s.dev/lendable: "true"}',
        )
    elif not spec.node_selector.positive:
        yield FieldError(
            "spec.nodeSelector",
            "only says which labels a node must not have, so it matches every node without them; "
            "ask for a label with matchLabels, or an In or Exists expression, "
            'e.g. matchLabels: {slurmk8s.dev/lendable: "true"}',
        )
    yield from selector_errors(spec.node_selector, "spec.nodeSelector")
    if quantity_value(spec.shm_size) < 2**20:
        yield FieldError("spec.shmSize", f"{quote(spec.shm_size)} is not at least 1Mi")
    pod_selector = spec.reclaim.pod_selector
    if pod_selector is not None:
        if pod_selector.empty:
            yield FieldError(
                "spec.reclaim.podSelector",
                "is empty and matches every pod; leave podSelector out (then every pending GPU pod "
                "triggers a reclaim, or those with minPriority) or give matchLabels or matchExpressions",
            )
        yield from selector_errors(pod_selector, "spec.reclaim.podSelector")
    for i, w in enumerate(spec.windows):
        where = f"spec.windows[{i}]"
        if w.start == "24:00":
            yield FieldError(f"{where}.start", '"24:00" is the end of a day; start the window at 00:00')
        elif w.start == w.end:
            yield FieldError(
                f"{where}.end",
                f"{quote(w.end)} equals start, which leaves an empty window; for a whole day use "
                "start 00:00 and end 24:00",
            )
        for j, day in enumerate(w.days):
            if day in w.days[:j]:
                yield FieldError(f"{where}.days[{j}]", f"{quote(day)} is listed twice")
    if spec.pod_template is not None:
        yield from pod_template_errors(spec.pod_template, "spec.podTemplate", lent=True)
