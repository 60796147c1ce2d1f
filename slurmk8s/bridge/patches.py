"""How the Node bookkeeping actions change a Node: merge patches. Pure.

The loop sends ``node_patch(action, node)`` to the API server as a JSON
merge patch (``kubectl patch --type merge``); the simulator and the tests
apply the same patch to their Nodes with :func:`applied`, so all agree on
what an action means.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from .actions import (
    ClampTimes,
    ClearDownOwed,
    ClearFreeSince,
    ClearIdleSince,
    ClearLending,
    RecordDownOwed,
    RecordForced,
    RecordFreeSince,
    RecordHealthFailed,
    RecordIdleSince,
    RecordSignalled,
    SetLendingState,
    Taint,
    Untaint,
)
from .nodestate import (
    CLUSTER_ANNOTATION,
    DOWN_OWED_ANNOTATION,
    DOWN_OWED_POLICY_ANNOTATION,
    FORCED_ANNOTATION,
    FREE_GPUS_ANNOTATION,
    FREE_SINCE_ANNOTATION,
    HEALTH_FAILED_ANNOTATION,
    IDLE_SINCE_ANNOTATION,
    JOBS_ANNOTATION,
    LENDING,
    LENDING_ANNOTATIONS,
    PARTITION_ANNOTATION,
    POLICY_ANNOTATION,
    REASON_ANNOTATION,
    RECLAIMING,
    SIGNALLED_ANNOTATION,
    SINCE_ANNOTATION,
    STATE_LABEL,
    format_job_ids,
    format_time,
)
from .observed import KubeNode, NodeTaint

__all__ = ["NODE_PATCH_ACTIONS", "node_patch"]

NODE_PATCH_ACTIONS = (
    SetLendingState, ClearLending, RecordIdleSince, ClearIdleSince, RecordFreeSince, ClearFreeSince,
    RecordSignalled, RecordForced, ClampTimes, RecordDownOwed, ClearDownOwed, RecordHealthFailed, Taint, Untaint,
)

#: The annotation of each time :class:`ClampTimes` may write.
_CLAMPED = {"since": SINCE_ANNOTATION, "signalled": SIGNALLED_ANNOTATION, "forced": FORCED_ANNOTATION}


def _taints(node: KubeNode) -> list[dict]:
    return [{"key": t.key, **({"value": t.value} if t.value else {}), "effect": t.effect} for t in node.taints]


def node_patch(action: Any, node: KubeNode) -> dict:
    """The merge patch that applies ``action`` to ``node`` (None deletes a key).

    Taints are a list, which a merge patch replaces whole: the patch carries
    the node's taints as observed, changed; the loop should send it with the
    Node's resourceVersion so that a concurrent change is not lost.
    """
    if isinstance(action, SetLendingState):
        annotations: dict[str, str | None] = {
            POLICY_ANNOTATION: action.policy,
            CLUSTER_ANNOTATION: action.cluster,
            PARTITION_ANNOTATION: action.partition,
            SINCE_ANNOTATION: format_time(action.since),
        }
        if action.state == LENDING:
            annotations |= {IDLE_SINCE_ANNOTATION: None, FREE_SINCE_ANNOTATION: None, FREE_GPUS_ANNOTATION: None,
                            REASON_ANNOTATION: None,
                            SIGNALLED_ANNOTATION: None, JOBS_ANNOTATION: None, FORCED_ANNOTATION: None}
        if action.state == RECLAIMING:
            annotations |= {REASON_ANNOTATION: action.reason, SIGNALLED_ANNOTATION: None, JOBS_ANNOTATION: None,
                            FORCED_ANNOTATION: None}
        return {"metadata": {"labels": {STATE_LABEL: action.state}, "annotations": annotations}}
    if isinstance(action, ClearLending):
        return {"metadata": {"labels": {STATE_LABEL: None},
                             "annotations": {k: None for k in LENDING_ANNOTATIONS}}}
    if isinstance(action, RecordIdleSince):
        return {"metadata": {"annotations": {IDLE_SINCE_ANNOTATION: format_time(action.at, millis=True)}}}
    if isinstance(action, ClearIdleSince):
        return {"metadata": {"annotations": {IDLE_SINCE_ANNOTATION: None}}}
    if isinstance(action, RecordFreeSince):
        return {"metadata": {"annotations": {FREE_SINCE_ANNOTATION: format_time(action.at, millis=True),
                                             FREE_GPUS_ANNOTATION: str(action.gpus)}}}
    if isinstance(action, ClearFreeSince):
        return {"metadata": {"annotations": {FREE_SINCE_ANNOTATION: None, FREE_GPUS_ANNOTATION: None}}}
    if isinstance(action, RecordSignalled):
        return {"metadata": {"annotations": {SIGNALLED_ANNOTATION: format_time(action.at),
                                             JOBS_ANNOTATION: format_job_ids(action.jobs) or None}}}
    if isinstance(action, RecordForced):
        return {"metadata": {"annotations": {FORCED_ANNOTATION: format_time(action.at)}}}
    if isinstance(action, ClampTimes):
        return {"metadata": {"annotations": {_CLAMPED[f]: format_time(action.at) for f in action.fields}}}
    if isinstance(action, RecordDownOwed):
        return {"metadata": {"annotations": {DOWN_OWED_ANNOTATION: action.cluster,
                                             DOWN_OWED_POLICY_ANNOTATION: action.policy}}}
    if isinstance(action, ClearDownOwed):
        return {"metadata": {"annotations": {DOWN_OWED_ANNOTATION: None, DOWN_OWED_POLICY_ANNOTATION: None}}}
    if isinstance(action, RecordHealthFailed):
        return {"metadata": {"annotations": {HEALTH_FAILED_ANNOTATION: action.check}}}
    if isinstance(action, Taint):
        taints = [t for t in _taints(node) if not (t["key"] == action.key and t["effect"] == action.effect)]
        taints.append({"key": action.key, "value": action.value, "effect": action.effect})
        return {"spec": {"taints": taints}}
    if isinstance(action, Untaint):
        return {"spec": {"taints": [t for t in _taints(node) if t["key"] != action.key] or None}}
    raise TypeError(f"{type(action).__name__} does not patch a Node")


def _merged(target, patch: dict) -> dict:
    out = dict(target)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def applied(node: KubeNode, patch: dict) -> KubeNode:
    """``node`` after the API server applies ``patch`` (a :func:`node_patch`) as a JSON merge patch."""
    meta = patch.get("metadata", {})
    taints = node.taints
    if "spec" in patch:
        taints = tuple(NodeTaint(t["key"], t.get("value", ""), t["effect"]) for t in patch["spec"]["taints"] or [])
    return replace(node, labels=_merged(node.labels, meta.get("labels", {})),
                   annotations=_merged(node.annotations, meta.get("annotations", {})), taints=taints)
