"""The owner always gets its nodes back: the reclaim deadline. Pure.

Everything else in the state machine waits for Slurm (fail closed): a node
goes back only once Slurm shows no job there. That lets a borrower keep a
node for ever, by making its Slurm unreadable (a bad image, a controller
that cannot start) or by lying (a job that never ends). So:

- The owner's claims start a reclaim even while the node's Slurm cannot be
  read (:func:`owner_claim`): the owner withdrew the node
  (``slurmk8s.dev/lendable-to``), cordoned it, deleted the policy, or pending
  GPU pods need it. Only the Node's record changes then; the jobs get their
  signal and grace period once Slurm answers.
- A reclaim has a deadline (:func:`deadline`): ``gracePeriodSeconds`` +
  ``reclaim.deadlineSeconds`` after it began (``slurmk8s.dev/lending-since``
  of a reclaiming node). Past it the node goes back to Kubernetes whatever
  Slurm says (:func:`take_back`): its slurmd pod is deleted, the node
  untainted and its record cleared, and the node owes its SlurmCluster a
  DOWN, recorded on the Node (``slurmk8s.dev/down-owed``, which outlives the
  record) so that a restarted bridge still sets it once that Slurm answers
  (:func:`settle`). DOWN ends (and requeues) whatever Slurm still runs there.

Before the deadline an unknown Slurm still means wait.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from ..api.cluster import LENT_PREFIX
from ..slurm.steps import DeleteNode, SetDown
from ..times import format_time
from .actions import ClearDownOwed, ClearIdleSince, RecordDownOwed, RecordIdleSince, SetLendingState
from .nodestate import RECLAIMING, STATES, readable_key
from .observed import KubeNode
from .reasons import CORDONED, REASONS
from .settings import Round, Settings
from .transitions import hand_back, leave_slurm, node_event, reclaim
from .verdicts import withdrawn
from .world import World

__all__ = ["deadline", "overdue", "owner_claim", "enter_without_slurm", "take_back", "reclaim_or_take_back",
           "settle", "release_owed", "owed_by",
           "DOWN_REASON"]

#: The reason Slurm is given for the DOWN (the facade prefixes ``slurmk8s:``).
DOWN_REASON = "taken back by Kubernetes: the reclaim deadline passed"


def deadline(settings: Settings, node: KubeNode) -> datetime | None:
    """When a reclaiming node goes back whatever Slurm says (None: not reclaiming)."""
    rec = node.record
    if rec.state != RECLAIMING or rec.since is None:
        return None
    spec = settings.reclaim
    return rec.since + timedelta(seconds=spec.grace_period_seconds + spec.deadline_seconds)


def overdue(settings: Settings, node: KubeNode) -> bool:
    """The node has been reclaiming for longer than grace period + deadline."""
    due = deadline(settings, node)
    return due is not None and settings.now >= due


def owner_claim(settings: Settings, node: KubeNode) -> str | None:
    """Why the node's owner wants it back, as far as can be told without
    Slurm: the policy is gone, the owner withdrew the node, or cordoned it.
    (Pending pods are placed by the caller: :func:`slurmk8s.bridge.placement.cover_demand`.)"""
    if settings.policy is None:
        return settings.gone_reason
    return withdrawn(settings, node) or (CORDONED if node.unschedulable else None)


def enter_without_slurm(r: Round, settings: Settings, node: KubeNode, reason: str) -> None:
    """Start the reclaim while the node's Slurm cannot be read: only the
    record changes (with the cluster and partition it names); drain, signal
    and grace follow once Slurm answers, and the deadline runs from now."""
    rec = node.record
    due = settings.now + timedelta(seconds=settings.reclaim.grace_period_seconds + settings.reclaim.deadline_seconds)
    policy, cluster = settings.owner(rec)
    r.emit(
        SetLendingState(node.name, RECLAIMING, policy, rec.cluster or cluster, rec.partition or "",
                        settings.now, reason=reason),
        node_event(node.name, "Reclaiming",
                   f"taking the node back from Slurm: {REASONS.get(reason, reason)}; "
                   + (f"SlurmCluster {rec.cluster} cannot be read now: its jobs get the signal and grace period "
                      "once it answers, " if readable_key(rec.cluster) else
                      "its record names no SlurmCluster that can be asked about its jobs, ")
                   + f"and the node goes back at {format_time(due)} whatever Slurm says", warning=True),
    )
    r.projected[node.name] = RECLAIMING


def take_back(r: Round, world: World, settings: Settings, node: KubeNode, slurm_read: bool) -> None:
    """Past the deadline: the node goes back to Kubernetes whatever Slurm says,
    and owes its SlurmCluster a DOWN (set now when ``slurm_read``: the round
    read that cluster's Slurm)."""
    rec = node.record
    cluster = rec.cluster or settings.cluster_key
    # A SlurmCluster that cannot be told is owed nothing: nobody could settle it.
    owes = readable_key(cluster)
    due = deadline(settings, node)
    jobs = len(world.jobs_on(node.name)) if slurm_read else None
    if owes:
        r.emit(RecordDownOwed(node.name, cluster, settings.key))
        r.down_owed[node.name] = True
    r.emit(
        node_event(node.name, "ReclaimDeadline",
                   f"the reclaim ({REASONS.get(rec.reason or '', rec.reason)}) began at "
                   f"{format_time(rec.since) if rec.since else '?'} and was not done by "
                   f"{format_time(due) if due else '?'} (gracePeriodSeconds {settings.reclaim.grace_period_seconds} + "
                   f"deadlineSeconds {settings.reclaim.deadline_seconds}): the node goes back to Kubernetes whatever "
                   f"SlurmCluster {cluster if owes else '(none named)'} says"
                   + (f" ({jobs} job(s) still shown there)" if jobs else "" if slurm_read else " (it does not answer)")
                   + ("; its Slurm node is set DOWN " + ("now" if slurm_read else "once Slurm answers") if owes
                      else "; no SlurmCluster can be told to set its Slurm node DOWN"),
                   warning=True),
    )
    hand_back(r, world, settings, node)
    if slurm_read and owes:
        _down(r, world, settings, node.name)


def reclaim_or_take_back(r: Round, world: World, settings: Settings, node: KubeNode, ended: dict[int, str]) -> None:
    """A reclaiming node past its deadline, its Slurm read: when the ordinary
    reclaim hands it back this round (Slurm shows no job), that is what
    happens; when Slurm still shows jobs, it goes back all the same."""
    trial = Round()
    reclaim(trial, world, settings, node, entering=None, ended=ended)
    if trial.projected.get(node.name, RECLAIMING) is None:
        r.emit(*trial.actions)
        r.projected.update(trial.projected)
        r.admin_drained.extend(trial.admin_drained)
    else:
        take_back(r, world, settings, node, slurm_read=True)


def _down(r: Round, world: World, settings: Settings, name: str, skip_down: bool = False,
          idle_since: datetime | None = None) -> None:
    """Set the owed DOWN (when Slurm has the lent node), then clear the
    obligation. With no job and no slurmd pod left there, the DOWN node is
    deleted in the same chain: what the ghost rule
    (:func:`.transitions.clean_ghosts`) would do once it saw the node DOWN,
    so that the round's result is final."""
    snode = world.slurm_nodes.get(name)
    if not skip_down and snode is not None and any(f.startswith(LENT_PREFIX) for f in snode.features):
        r.emit(SetDown(name, DOWN_REASON))
        if not world.jobs_on(name) and not world.has_slurmd(name, settings.namespace, settings.cluster_name):
            r.emit(*leave_slurm(world, name))
    # Settled: its idle time starts again, as for a node just handed back, so
    # that it is lent a later round at the earliest (idle_candidates passed
    # it over this one, while it still owed the DOWN); unless this round's
    # idle bookkeeping cleared it (the node is not idle, or not the policy's).
    if idle_since is not None and not any(isinstance(a, ClearIdleSince) and a.node == name for a in r.actions):
        r.emit(RecordIdleSince(name, settings.now))
    r.emit(ClearDownOwed(name))
    r.down_owed[name] = False


def settle(r: Round, world: World, settings: Settings, nodes: Iterable[KubeNode]) -> None:
    """After the round's moves (its Slurm was read): nodes that owe this
    SlurmCluster a DOWN and serve Kubernetes get it, and the obligation is
    cleared. A node lent again meanwhile keeps it until it returns; one whose
    Slurm node this round deletes owes nothing more."""
    for n in nodes:
        if n.record.down_owed != settings.cluster_key or n.name in r.down_owed:
            continue
        if r.projected.get(n.name, n.record.state) in STATES:
            continue
        deleted = any(isinstance(a, DeleteNode) and a.node == n.name for a in r.actions)
        _down(r, world, settings, n.name, skip_down=deleted, idle_since=n.record.idle_since)


def release_owed(r: Round, settings: Settings, nodes: Iterable[KubeNode]) -> None:
    """The SlurmCluster is gone, and with it the Slurm node: nothing is owed."""
    for n in nodes:
        if n.record.down_owed == settings.cluster_key:
            r.emit(ClearDownOwed(n.name))
            r.down_owed[n.name] = False


def owed_by(settings: Settings, nodes: Iterable[KubeNode], r: Round) -> list[str]:
    """The nodes this policy took back past the deadline that still owe a
    DOWN, once this round's actions are applied (for the status)."""
    owed = {n.name for n in nodes if n.record.down_owed and n.record.down_owed_policy == settings.key}
    for name, still in r.down_owed.items():
        (owed.add if still else owed.discard)(name)
    return sorted(owed)
