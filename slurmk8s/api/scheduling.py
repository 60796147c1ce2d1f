"""Where pods may run, as a PodSpec says it: tolerations, label selectors and affinity, and
the rules of each that Kubernetes' validation (or slurmk8s) adds to their schema. Pure.

The node sets' tolerations and the pod templates (:mod:`.podtemplate`) use the tolerations
and affinity; a NodeLendingPolicy's node and pod selectors are :class:`LabelSelector`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Literal

from pydantic import Field

from .base import GROUP, MAX_EXACT_INTEGER, ApiModel, in_group
from .errors import FieldError
from .fields import LabelKey, LabelValue, NamespaceName, quote

__all__ = [
    "Toleration", "toleration_errors", "LabelSelectorRequirement", "LabelSelector", "selector_errors",
    "describe_selector", "NodeSelectorRequirement", "NodeSelectorTerm", "NodeSelector", "PreferredSchedulingTerm",
    "NodeAffinity", "PodAffinityTerm", "WeightedPodAffinityTerm", "PodAffinity", "PodAntiAffinity", "Affinity",
    "affinity_errors",
]


class Toleration(ApiModel):
    """A taint the pods tolerate (as in a Kubernetes PodSpec)."""

    key: LabelKey | None = None
    """Taint key the toleration applies to; empty with operator Exists matches all taints.
    Not one of slurmk8s's own (slurmk8s.dev/...), such as the lending taint."""
    operator: Literal["Exists", "Equal"] = "Equal"
    """Exists, or Equal (the value must match)."""
    value: LabelValue | None = None
    """Taint value to match when operator is Equal."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to match; all effects when unset."""
    toleration_seconds: int | None = Field(None, ge=0, le=MAX_EXACT_INTEGER)
    """For NoExecute: how long the pod stays bound after the taint appears."""


def toleration_errors(path: str, t: Toleration) -> Iterator[FieldError]:
    """What Kubernetes' validation of a PodSpec refuses in a toleration
    (validateTolerations): the workload would be refused at every apply. And a
    taint of slurmk8s's own: the bridge's lending taint keeps every pod but the
    lent slurmd off a lent node, which belongs to one Slurm cluster for the time."""
    if t.key and in_group(t.key):
        yield FieldError(f"{path}.key", f"{quote(t.key)} is a taint of slurmk8s's own ({GROUP}/...; the bridge "
                                        "taints the nodes it lends with it): these pods would run on nodes lent to "
                                        "a Slurm cluster. Tolerate the site's taints only")
    if not t.key and t.operator != "Exists":
        yield FieldError(f"{path}.operator", "must be Exists when key is empty (which matches every taint); "
                                             "give a key, or operator: Exists")
    if t.operator == "Exists" and t.value:
        yield FieldError(f"{path}.value", f"{quote(t.value)}: a toleration with operator Exists matches any "
                                          "value and may not give one; drop value, or use operator: Equal")
    if t.toleration_seconds is not None and t.effect != "NoExecute":
        yield FieldError(f"{path}.tolerationSeconds", f"only applies to effect NoExecute, not "
                                                      f"{quote(t.effect) if t.effect else 'every effect'}; "
                                                      "drop it or set effect: NoExecute")


class LabelSelectorRequirement(ApiModel):
    """One requirement of a label selector, as in Kubernetes' metav1.LabelSelector."""

    key: LabelKey
    """Label key the requirement applies to."""
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    """In and NotIn compare the label's value with values; Exists and
    DoesNotExist only look at the key."""
    values: list[LabelValue] = Field(default_factory=list, max_length=64)
    """Values for In and NotIn (at least one); empty for Exists and DoesNotExist."""


class LabelSelector(ApiModel):
    """A Kubernetes label selector: every matchLabels pair and every
    matchExpressions requirement must hold."""

    match_labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=32)
    """Labels an object must carry, with these values."""
    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list, max_length=32)
    """Further requirements on the object's labels."""

    @property
    def empty(self) -> bool:
        return not self.match_labels and not self.match_expressions

    @property
    def positive(self) -> bool:
        """Some requirement asks for a label to be there (matchLabels, In,
        Exists); a selector of NotIn and DoesNotExist alone matches every
        object that lacks a label, e.g. every node."""
        return bool(self.match_labels) or any(r.operator in ("In", "Exists") for r in self.match_expressions)

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether an object with ``labels`` satisfies the selector."""
        get = labels.get
        for key, value in self.match_labels.items():
            if get(key) != value:
                return False
        for req in self.match_expressions:
            present = req.key in labels
            if req.operator == "Exists":
                ok = present
            elif req.operator == "DoesNotExist":
                ok = not present
            elif req.operator == "In":
                ok = present and get(req.key) in req.values
            else:  # NotIn: also true when the label is absent, as in Kubernetes
                ok = not present or get(req.key) not in req.values
            if not ok:
                return False
        return True


def selector_errors(sel: LabelSelector, path: str) -> Iterator[FieldError]:
    """What Kubernetes refuses in a label selector's expressions: In and NotIn without
    values, Exists and DoesNotExist with some."""
    for i, req in enumerate(sel.match_expressions):
        where = f"{path}.matchExpressions[{i}]"
        if req.operator in ("In", "NotIn") and not req.values:
            yield FieldError(f"{where}.values", f"operator {req.operator} needs at least one value")
        if req.operator in ("Exists", "DoesNotExist") and req.values:
            yield FieldError(f"{where}.values", f"must be empty with operator {req.operator}, which only looks at the key")


def describe_selector(sel: LabelSelector) -> str:
    """A selector in kubectl's -l syntax, for messages."""
    parts = [f"{k}={v}" for k, v in sel.match_labels.items()]
    for r in sel.match_expressions:
        if r.operator == "Exists":
            parts.append(r.key)
        elif r.operator == "DoesNotExist":
            parts.append(f"!{r.key}")
        else:
            parts.append(f"{r.key} {r.operator.lower()} ({','.join(r.values)})")
    return ",".join(parts) or "(everything)"


# --- Affinity, as a PodSpec has it -------------------------------------------------------------


class NodeSelectorRequirement(ApiModel):
    """A requirement on a Node's labels."""

    key: LabelKey
    """Node label key."""
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    """In and NotIn compare the label's value with values; Exists and DoesNotExist
    only look at the key; Gt and Lt compare it, as an integer, with the one value."""
    values: list[LabelValue] = Field(default_factory=list, max_length=64)
    """Values for In and NotIn (at least one), one integer for Gt and Lt; empty for
    Exists and DoesNotExist."""


class NodeSelectorTerm(ApiModel):
    """Requirements a Node's labels must all meet."""

    match_expressions: list[NodeSelectorRequirement] = Field(default_factory=list, max_length=32)
    """The requirements."""


class NodeSelector(ApiModel):
    """Nodes that meet any one of the terms."""

    node_selector_terms: list[NodeSelectorTerm] = Field(min_length=1, max_length=16)
    """The terms; a node that meets one is chosen."""


class PreferredSchedulingTerm(ApiModel):
    """Nodes the scheduler prefers, by weight."""

    weight: int = Field(ge=1, le=100)
    """Weight of the preference, 1 to 100."""
    preference: NodeSelectorTerm
    """The nodes preferred."""


class NodeAffinity(ApiModel):
    """Which nodes the pods may, and would rather, run on."""

    required_during_scheduling_ignored_during_execution: NodeSelector | None = None
    """Nodes the pods may only run on."""
    preferred_during_scheduling_ignored_during_execution: list[PreferredSchedulingTerm] = Field(
        default_factory=list, max_length=16)
    """Nodes the scheduler prefers for the pods."""


class PodAffinityTerm(ApiModel):
    """Pods (by labels, in some namespaces) whose topology domain counts."""

    label_selector: LabelSelector | None = None
    """The pods."""
    namespace_selector: LabelSelector | None = None
    """Namespaces (by their labels) of the pods; with namespaces unset too, the pod's own."""
    namespaces: list[NamespaceName] = Field(default_factory=list, max_length=16)
    """Namespaces of the pods, by name."""
    topology_key: LabelKey
    """Node label whose value is the domain: kubernetes.io/hostname for the node,
    topology.kubernetes.io/zone for the zone."""


class WeightedPodAffinityTerm(ApiModel):
    """A preferred pod affinity term, by weight."""

    weight: int = Field(ge=1, le=100)
    """Weight of the preference, 1 to 100."""
    pod_affinity_term: PodAffinityTerm
    """The term."""


class PodAffinity(ApiModel):
    """Run the pods in the topology domains of the pods these terms select."""

    required_during_scheduling_ignored_during_execution: list[PodAffinityTerm] = Field(
        default_factory=list, max_length=16)
    """Terms every pod must meet."""
    preferred_during_scheduling_ignored_during_execution: list[WeightedPodAffinityTerm] = Field(
        default_factory=list, max_length=16)
    """Terms the scheduler prefers the pods to meet."""


class PodAntiAffinity(PodAffinity):
    """Keep the pods out of the topology domains of the pods these terms select
    (e.g. one worker per node: the node set's own labels, kubernetes.io/hostname)."""


class Affinity(ApiModel):
    """Scheduling constraints of the pods (a PodSpec's affinity)."""

    node_affinity: NodeAffinity | None = None
    """Which nodes."""
    pod_affinity: PodAffinity | None = None
    """Near which pods."""
    pod_anti_affinity: PodAntiAffinity | None = None
    """Away from which pods."""


def _node_term_errors(term: NodeSelectorTerm, path: str) -> Iterator[FieldError]:
    for i, req in enumerate(term.match_expressions):
        where = f"{path}.matchExpressions[{i}].values"
        if req.operator in ("In", "NotIn") and not req.values:
            yield FieldError(where, f"operator {req.operator} needs at least one value")
        elif req.operator in ("Exists", "DoesNotExist") and req.values:
            yield FieldError(where, f"must be empty with operator {req.operator}, which only looks at the key")
        elif req.operator in ("Gt", "Lt") and (len(req.values) != 1 or not req.values[0].isascii()
                                                or not req.values[0].isdigit()):
            yield FieldError(where, f"operator {req.operator} compares with exactly one value, an integer "
                                    "of digits, e.g. [\"4\"]")


def _pod_term_errors(term: PodAffinityTerm, path: str) -> Iterator[FieldError]:
    for name in ("label_selector", "namespace_selector"):
        sel = getattr(term, name)
        if sel is not None:
            yield from selector_errors(sel, f"{path}.{'labelSelector' if name == 'label_selector' else 'namespaceSelector'}")


def affinity_errors(a: Affinity, path: str) -> Iterator[FieldError]:
    """What Kubernetes' validation refuses in an affinity, and a required node term
    that asks for nothing (it matches no node: the pods would never be scheduled)."""
    node = a.node_affinity
    if node is not None:
        base = f"{path}.nodeAffinity"
        required = node.required_during_scheduling_ignored_during_execution
        if required is not None:
            for i, term in enumerate(required.node_selector_terms):
                where = f"{base}.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[{i}]"
                if not term.match_expressions:
                    yield FieldError(where, "is empty and matches no node, so the pods would never be "
                                            "scheduled; give matchExpressions")
                yield from _node_term_errors(term, where)
        for i, pref in enumerate(node.preferred_during_scheduling_ignored_during_execution):
            yield from _node_term_errors(
                pref.preference, f"{base}.preferredDuringSchedulingIgnoredDuringExecution[{i}].preference")
    for field, pods in (("podAffinity", a.pod_affinity), ("podAntiAffinity", a.pod_anti_affinity)):
        if pods is None:
            continue
        base = f"{path}.{field}"
        for i, pod_term in enumerate(pods.required_during_scheduling_ignored_during_execution):
            yield from _pod_term_errors(pod_term, f"{base}.requiredDuringSchedulingIgnoredDuringExecution[{i}]")
        for i, weighted in enumerate(pods.preferred_during_scheduling_ignored_during_execution):
            yield from _pod_term_errors(
                weighted.pod_affinity_term,
                f"{base}.preferredDuringSchedulingIgnoredDuringExecution[{i}].podAffinityTerm")
