"""The policy's status: its Ready condition, the nodes it holds, counts. Pure.

Written only when it changed, so that a quiet round writes nothing.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime

from ..api.lending import DemandRecord, LendingCounts, NodeLendingPolicyStatus, PolicyCondition
from ..api.status import ConditionStatus
from ..times import format_time
from .actions import Action, PolicyStatus
from .nodestate import LENDING, LENT, RECLAIMING
from .observed import InvalidPolicy
from .settings import Round, Settings

__all__ = ["policy_status", "invalid_policy_status", "status_actions"]

#: The problems of a policy whose SlurmCluster is gone or cannot be loaded.
_CLUSTER_PROBLEMS = ("ClusterNotFound", "ClusterUnreadable")

#: How many node names a status message lists before "and N more".
_LISTED = 5


def _more(names: Sequence[str]) -> str:
    shown = ", ".join(names[:_LISTED])
    return shown + (f" and {len(names) - _LISTED} more" if len(names) > _LISTED else "")


def policy_status(settings: Settings, r: Round, selected: int, kubernetes: int, problem: tuple[str, str] | None,
                  window_open: bool, down_owed: Sequence[str] = (), demand: DemandRecord | None = None
                  ) -> list[Action]:
    """The status of a policy once the round's actions are applied (none for
    a policy that is gone): ``selected`` nodes, of which ``kubernetes`` then
    serve Kubernetes."""
    policy = settings.policy
    if policy is None:
        return []
    counts: dict[str | None, int] = defaultdict(int)
    for state in r.projected.values():
        counts[state] += 1
    holding = sorted(n for n, s in r.projected.items() if s is not None)
    status_counts = LendingCounts(selected=selected, kubernetes=kubernetes,
                                  lending=counts[LENDING], lent=counts[LENT], reclaiming=counts[RECLAIMING])
    ready: ConditionStatus
    if problem is not None:
        ready, reason, message = "False", problem[0], problem[1]
        deadline = settings.reclaim.grace_period_seconds + settings.reclaim.deadline_seconds
        lent_to_it = [n for n in holding if n not in r.stale]
        if lent_to_it and problem[0] in _CLUSTER_PROBLEMS and settings.cluster_lost:
            message += (f". Nothing is lent to it; the {len(lent_to_it)} node(s) lent to it go back to "
                        "Kubernetes: their jobs get the signal and grace period if Slurm answers again, and "
                        f"each node goes back {deadline}s after its reclaim began whatever Slurm says "
                        "(gracePeriodSeconds + reclaim.deadlineSeconds)")
        elif holding and problem[0] not in ("SlurmUnreachable", *_CLUSTER_PROBLEMS):
            message += (f". Nothing is lent meanwhile; the {len(holding)} node(s) this policy holds are "
                        "taken back only when they fail or pending pods need them (set maxLentNodes: 0 "
                        "or delete the policy to take them all back)")
        elif holding:
            message += (f". The {len(holding)} node(s) this policy holds wait for Slurm, except that "
                        "their owner's claims (pending GPU pods, a withdrawn or cordoned node) and "
                        f"maxLentNodes start a reclaim, which ends {deadline}s later whatever Slurm says "
                        "(gracePeriodSeconds + reclaim.deadlineSeconds)")
    else:
        ready, reason = "True", "Lending"
        message = (f"{counts[LENT]} of {selected} selected nodes lent to partition "
                   f"{policy.spec.partition} of SlurmCluster {settings.cluster_key}")
        if counts[LENDING]:
            message += f"; {counts[LENDING]} starting"
        if counts[RECLAIMING]:
            message += f"; {counts[RECLAIMING]} being reclaimed"
        if not window_open:
            message += "; outside the lending windows, nothing is lent"
    extras = []
    if r.admin_drained:
        extras.append("drained by an administrator, left drained: " + _more(sorted(r.admin_drained)))
    if r.blocked:
        extras.append("cannot be lent: " + _more(sorted(r.blocked)))
    if r.stale:
        extras.append(f"still lent to another SlurmCluster, left alone until spec.clusterRef names it "
                      f"again (or their owner takes them back): {_more(sorted(r.stale))}")
    if down_owed:
        extras.append(f"taken back past the reclaim deadline, to be set DOWN in Slurm once it answers: "
                      f"{_more(list(down_owed))}")
    if extras:
        message += ". " + ". ".join(extras)
    return status_actions(settings.namespace, settings.name, policy.metadata.generation, ready, reason, message,
                          holding, status_counts, policy.status, settings.now, down_owed, demand)


def invalid_policy_status(policy: InvalidPolicy, now: datetime) -> list[Action]:
    """An invalid policy lends nothing: its status says why, and keeps the
    nodes and counts it last reported. (Its nodes are taken back as a
    deleted policy's: the loop decides them with a ``PolicyGone``.)"""
    message = ("the policy is invalid: nothing is lent, and the nodes it holds go back as a deleted policy's "
               "would; fix it to lend again: " + "; ".join(policy.errors))
    old = policy.status
    counts = old.counts if old is not None else LendingCounts()
    holding = old.lent_nodes if old is not None else []
    return status_actions(policy.namespace, policy.name, policy.generation, "False", "InvalidPolicy",
                          message, holding, counts, old, now, old.down_owed if old is not None else (),
                          old.demand if old is not None else None)


def status_actions(namespace: str, name: str, generation: int | None, ready: ConditionStatus, reason: str, message: str,
                   holding: Sequence[str], counts: LendingCounts, old: NodeLendingPolicyStatus | None,
                   now: datetime, down_owed: Sequence[str] = (), demand: DemandRecord | None = None
                   ) -> list[Action]:
    """A ``PolicyStatus`` when the status differs from ``old``; the Ready
    condition keeps its transition time while its status stays."""
    previous = next((c for c in (old.conditions if old else []) if c.type == "Ready"), None)
    since = (previous.last_transition_time
             if previous is not None and previous.status == ready and previous.last_transition_time
             else format_time(now))
    status = NodeLendingPolicyStatus(
        conditions=[PolicyCondition(type="Ready", status=ready, reason=reason, message=message[:32768],
                                    last_transition_time=since, observed_generation=generation)],
        observed_generation=generation,
        lent_nodes=list(holding),
        counts=counts,
        down_owed=list(down_owed),
        demand=demand,
    )
    if old is not None and old == status:
        return []
    return [PolicyStatus(namespace, name, status)]
