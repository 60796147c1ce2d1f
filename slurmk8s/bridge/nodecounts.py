"""GPU nodes by lending state, overall and per policy: what the gauges show. Pure.

(``metrics.py`` holds the Prometheus metrics themselves.)
"""

from __future__ import annotations

from dataclasses import dataclass

from .nodestate import LENDING, LENT, RECLAIMING, STATES
from .observed import Observed

__all__ = ["LendingMetrics", "lending_metrics"]


@dataclass(frozen=True)
class LendingMetrics:
    """GPU nodes by lending state, overall and per policy (for /metrics)."""

    #: kubernetes, lending, lent, reclaiming -> nodes
    by_state: dict[str, int]
    #: policy namespace/name -> state -> nodes (lending, lent, reclaiming)
    by_policy: dict[str, dict[str, int]]
    #: Pods that ask for GPUs and wait for a node (Pending, not placed)
    pending_gpu_pods: int = 0


def lending_metrics(observed: Observed) -> LendingMetrics:
    by_state = {"kubernetes": 0, LENDING: 0, LENT: 0, RECLAIMING: 0}
    by_policy: dict[str, dict[str, int]] = {}
    for n in observed.nodes:
        state = n.record.state
        if state is None:
            if n.gpus > 0:
                by_state["kubernetes"] += 1
            continue
        if state not in STATES:
            continue
        by_state[state] += 1
        per = by_policy.setdefault(n.record.holder or "", {LENDING: 0, LENT: 0, RECLAIMING: 0})
        per[state] += 1
    pending = sum(1 for p in observed.pods
                  if p.gpus > 0 and p.phase == "Pending" and p.node is None and not p.deleting)
    return LendingMetrics(by_state, by_policy, pending)
