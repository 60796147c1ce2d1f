"""Whether Kubernetes wants a worker's node emptied (node maintenance). Pure.

A node is under maintenance when it is cordoned, or has a ``NoSchedule`` or
``NoExecute`` taint the worker pod does not tolerate, but not the taints of
node conditions (:data:`CONDITION_TAINTS`) and not the bridge's lending taint
(``slurmk8s.dev/lent``, :data:`slurmk8s.bridge.nodestate.TAINT_KEY`): that one
keeps new pods off a node lent to Slurm, and asks nothing of the pods already
there (a worker of any cluster on a node that is lent keeps its jobs; decision
record 49). :func:`maintenance` names why, as the purpose and drain reason of
the evacuation that empties the Slurm node (:mod:`.workers`; decision record 36).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..render.names import LENT_TAINT_EFFECT as TAINT_EFFECT
from ..render.names import LENT_TAINT_KEY as TAINT_KEY

__all__ = ["MAINTENANCE", "CORDONED", "CONDITION_TAINTS", "maintenance"]

#: The purpose (and drain reason) of emptying a node for Kubernetes node
#: maintenance starts with this: ``k8s: cordoned``, ``k8s: tainted <key>``.
MAINTENANCE = "k8s:"
CORDONED = f"{MAINTENANCE} cordoned"
#: Taints the node lifecycle controller and the kubelet set for a node's
#: conditions. They come and go with a blip (a missed heartbeat, a moment of
#: disk pressure), and a blip must not end a job: they are not maintenance.
#: (``node.kubernetes.io/unschedulable`` is the cordon's, and is.)
CONDITION_TAINTS = frozenset(f"node.kubernetes.io/{t}" for t in (
    "not-ready", "unreachable", "memory-pressure", "disk-pressure", "pid-pressure", "network-unavailable"))


def _tolerates(toleration: Mapping, taint: Mapping) -> bool:
    """Kubernetes' rule: an empty key with Exists matches every taint; an empty effect every effect."""
    if toleration.get("effect") and toleration.get("effect") != taint.get("effect"):
        return False
    if toleration.get("operator") == "Exists":
        return not toleration.get("key") or toleration.get("key") == taint.get("key")
    return toleration.get("key") == taint.get("key") and (toleration.get("value") or "") == (taint.get("value") or "")


def maintenance(node: Mapping | None, tolerations: Sequence[Mapping]) -> str | None:
    """Why Kubernetes wants a pod's node emptied, as a purpose (:data:`CORDONED`,
    ``k8s: tainted <key>``); None when it does not, or the node is unknown. Pure."""
    if node is None:
        return None
    spec = node.get("spec") or {}
    if spec.get("unschedulable"):
        return CORDONED
    for taint in spec.get("taints") or []:
        key = taint.get("key") or ""
        if taint.get("effect") not in ("NoSchedule", "NoExecute") or key in CONDITION_TAINTS:
            continue
        if key == TAINT_KEY and taint.get("effect") == TAINT_EFFECT:
            continue  # the bridge lent the node: new pods stay off, those there stay
        if not any(_tolerates(t, taint) for t in tolerations):
            return CORDONED if key == "node.kubernetes.io/unschedulable" else f"{MAINTENANCE} tainted {key}"
    return None
