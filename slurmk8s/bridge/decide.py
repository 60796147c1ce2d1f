"""The lending decision: observed state + policy + clock in, actions out. Pure.

``decide(observed, policy, now)`` looks at every Kubernetes Node the policy
selects or holds, and returns the actions that move each one along the
lending state machine (see README.md in this folder):

    Kubernetes ──> lending ──> lent ──> reclaiming ──> Kubernetes
                      └────────────────────┘ (failures, demand, windows, ...)

It remembers nothing: every fact it needs later (state, times, reasons) is
written on the Node by its own actions and read back next round
(:mod:`.nodestate`). Applying a round's actions and deciding again on the
result gives no new action until time passes or the world changes.

This module is the composition; the rules live beside it:
:mod:`.world` (the observed world, indexed), :mod:`.settings` (the policy's
settings, the round's facts), :mod:`.problems` (what is wrong with a
policy), :mod:`.verdicts` (why a held node leaves), :mod:`.placement`
(pending pods), :mod:`.choose` (which nodes to lend, which to give back
first), :mod:`.ownpods` (no lending beside the cluster's own pods),
:mod:`.budgets` (the lent pods' disruption budgets), :mod:`.transitions` (each node's moves, as actions), :mod:`.status`
(the policy's status), :mod:`.reasons` (why a node is taken back). Indexes
and the policy's selection are remembered between calls on the identity of
unchanged inputs (:mod:`.memo`), which changes no answer.

Safety rules, each enforced in those modules:
- Slurm could not be read: nothing that depends on Slurm changes (fail closed),
  except the owner's claims and ``maxLentNodes``, which start a reclaim
  (:mod:`.deadline`).
- A SlurmCluster the bridge cannot load (gone while the policy names it,
  invalid, or unknown to this version: ``Observed.unreadable``) is decided
  toward Kubernetes: its Slurm is unknown, nothing is lent to it, and the
  nodes lent to it start a reclaim, which the deadline ends (decision
  record 46). No policy is skipped.
- A held node (the state label, any value, or the taint) whose record names
  no policy and SlurmCluster that can be read is held by an
  :class:`Unattributed` holder (:func:`orphaned_policies` yields it), which
  takes it back with the default settings; one whose state label has a
  value this version does not know is taken back by its policy
  (``record-unreadable``). Nothing is held that nothing takes back.
- A node goes back to Kubernetes (untaint) only when Slurm shows no job on it,
  or when its reclaim is past gracePeriodSeconds + reclaim.deadlineSeconds
  (:mod:`.deadline`): the owner always gets its nodes back.
- Drains are set only with the facade's ``slurmk8s:`` prefix and never
  cleared; a node an administrator drained keeps its drain and is reported.
- Lending never takes the policy past maxLentNodes or below minKubernetesNodes.
- A node is lent only if its owner allows the policy's namespace
  (label slurmk8s.dev/lendable-to; decision record 15), whatever the
  selector says; a node whose owner withdraws that is taken back.
- No node is lent to the SlurmCluster whose own pods run there
  (:mod:`.ownpods`); a lent pod has a PodDisruptionBudget exactly while it
  runs and Slurm shows a job on its node (:mod:`.budgets`; decision record 49).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from ..api.cluster import SlurmCluster
from ..api.lending import NodeLendingPolicy
from . import deadline
from . import transitions as move
from .actions import Action
from .budgets import keep_budgets
from .choose import choose_to_lend, idle_candidates, over_cap, reclaim_order, short_of_minimum
from .foresight import Foresight, demand_status, foresee, reservations, stale_reservations
from .nodecounts import LendingMetrics, lending_metrics
from .nodestate import LENT, RECLAIMING, STATES, readable_key
from .nodetimes import present
from .observed import (
    InvalidPolicy,
    KubeNode,
    KubePod,
    NodeTaint,
    Observed,
    PolicyGone,
    Unattributed,
    UnreadableCluster,
)
from .placement import cover_demand
from .problems import policy_problem
from .reasons import (
    CLUSTER_GONE,
    CLUSTER_UNREADABLE,
    DEFAULT_RECLAIM,
    DEFAULT_REGISTRATION_TIMEOUT,
    DEMAND,
    FAILURES,
    FORCE_RETRY_SECONDS,
    FORECAST,
    LIMITS,
    REASONS,
    RECORD_UNREADABLE,
)
from .settings import Round, Settings
from .status import invalid_policy_status, policy_status
from .verdicts import failure, must_go, withdrawn
from .windows import in_window
from .world import World

__all__ = [
    "decide", "lending_metrics", "LendingMetrics", "orphaned_policies",
    "REASONS", "FAILURES", "FORCE_RETRY_SECONDS", "DEFAULT_RECLAIM",
    # the observed state, re-exported so that callers need one import
    "Observed", "KubeNode", "KubePod", "NodeTaint", "PolicyGone", "Unattributed", "InvalidPolicy",
    "UnreadableCluster",
]


def decide(observed: Observed, policy: NodeLendingPolicy | PolicyGone | Unattributed | InvalidPolicy,
           now: datetime) -> list[Action]:
    """The actions that move the policy's nodes along the lending state machine.

    ``policy`` is a valid :class:`NodeLendingPolicy`; a :class:`PolicyGone`
    for a policy that Nodes still name but that was deleted (its nodes are
    reclaimed); an :class:`Unattributed` for held nodes that name no policy
    (reclaimed too); or an :class:`InvalidPolicy` (only its status is written).
    ``now`` is timezone-aware (naive means UTC).
    """
    now = now if now.tzinfo else now.replace(tzinfo=UTC)
    if isinstance(policy, InvalidPolicy):
        return invalid_policy_status(policy, now)
    # Times on the policy's nodes later than now (or a lending-since it cannot read) count from now.
    observed, clamped = present(observed, policy.key, now)
    return clamped + _round(World(observed), settings_of(policy, observed.cluster, now, observed.unreadable))


def settings_of(policy: NodeLendingPolicy | PolicyGone | Unattributed, cluster: SlurmCluster | None, now: datetime,
                unreadable: UnreadableCluster | None = None) -> Settings:
    """The settings a round goes by, and the SlurmCluster the nodes are lent to
    (``unreadable``: why it could not be loaded)."""
    if isinstance(policy, Unattributed) and policy.cluster is None:
        cluster = None  # none can be told: whatever was observed is not theirs
    if cluster is not None:
        cluster_key, cluster_name = f"{cluster.namespace}/{cluster.name}", cluster.name
    elif isinstance(policy, NodeLendingPolicy):
        cluster_name = policy.spec.cluster_ref.name
        cluster_key = f"{policy.namespace}/{cluster_name}"
    else:
        cluster_key = policy.cluster or ""
        cluster_name = cluster_key.split("/")[-1]
    if isinstance(policy, Unattributed):
        if policy.cluster is None and unreadable is None:
            # No SlurmCluster can be told: decided as one that cannot be loaded (no Slurm, the deadline).
            unreadable = UnreadableCluster("", "the nodes' records name no SlurmCluster as <namespace>/<name>")
        return Settings(policy.key, policy.namespace, policy.name, None, DEFAULT_RECLAIM,
                        DEFAULT_REGISTRATION_TIMEOUT, cluster, cluster_key, cluster_name, now, unreadable, policy)
    if isinstance(policy, PolicyGone):
        return Settings(policy.key, policy.namespace, policy.name, None, DEFAULT_RECLAIM,
                        DEFAULT_REGISTRATION_TIMEOUT, cluster, cluster_key, cluster_name, now, unreadable)
    return Settings(policy.key, policy.namespace, policy.name, policy, policy.spec.reclaim,
                    policy.spec.registration_timeout_seconds, cluster, cluster_key, cluster_name, now, unreadable)


def _round(world: World, settings: Settings) -> list[Action]:
    r = Round()
    policy = settings.policy
    nodes = world.observed.nodes
    mine = [n for n in nodes if n.record.holder == settings.key]
    selected = settings.select(nodes)
    kube = [n for n in selected if n.record.holder is None]
    idle = [n for n in kube if world.idle(n.name, settings.namespace, settings.cluster_name)]
    # Under minFreeGpus, the nodes with a GPU free (their clock is recorded)
    # and those with enough free to lend.
    want = settings.min_free_gpus
    free = [] if want is None else [n for n in kube if world.has_free(n, settings.namespace, settings.cluster_name)]
    lendable = idle if want is None else [n for n in free if world.free_gpus(n) >= want]

    # Idle bookkeeping holds whatever Slurm says: it only reads pods.
    move.clear_idle(r, world, settings, nodes)

    problem = policy_problem(world, settings, selected) if policy is not None else None
    window_open = policy is None or in_window(policy.spec.windows, policy.spec.time_zone, settings.now)
    fs = foresee(world, settings, selected)

    lending: set[str] = set()
    if settings.cluster is None and policy is None and settings.unreadable is None:
        # The policy and its cluster are gone, and with the cluster its Slurm and jobs.
        deadline.release_owed(r, settings, nodes)
        _release_all(r, world, settings, mine)
    elif settings.cluster is None or not world.slurm_known:
        # No Slurm to ask (no cluster, one that cannot be loaded, or Slurm
        # does not answer): nothing is lent, and the nodes go back by the
        # rules that need no Slurm, within the reclaim deadline.
        _without_slurm(r, world, settings, mine, kube)
    else:
        lending = _move_nodes(r, world, settings, mine, selected, kube, lendable, problem, window_open, fs)
        deadline.settle(r, world, settings, nodes)
        stale_reservations(r, world, settings)
    move.record_idle(r, world, settings, idle, free, lending)
    kubernetes = len(kube) - len(lending) + _returned(r, settings, mine)
    return r.actions + policy_status(settings, r, len(selected), kubernetes, problem, window_open,
                                     deadline.owed_by(settings, nodes, r), demand_status(fs))


def _returned(r: Round, settings: Settings, mine: list[KubeNode]) -> int:
    """Selected nodes handed back this round: they serve Kubernetes from now on."""
    return sum(1 for n in mine if r.projected.get(n.name, n.record.state) is None and settings.selects(n))


def _without_slurm(r: Round, world: World, settings: Settings, mine: list[KubeNode], kube: list[KubeNode]) -> None:
    """The nodes' Slurm cannot be read: every held node stays as it is, except
    that the owner's claims (a withdrawn or cordoned node, a deleted policy,
    pending GPU pods), a state that cannot be read and ``maxLentNodes`` start a reclaim, and a reclaim
    past its deadline goes back whatever Slurm says (:mod:`.deadline`). When
    the policy's SlurmCluster is lost (gone, or it cannot be loaded:
    :attr:`.Settings.cluster_lost`), every node lent to it starts its
    reclaim now."""
    held: list[KubeNode] = []
    reclaiming: list[KubeNode] = []
    lost = CLUSTER_UNREADABLE if settings.unreadable is not None else CLUSTER_GONE
    for n in mine:
        r.projected[n.name] = n.record.state
        ours = n.record.cluster == settings.cluster_key
        if not ours:
            r.stale.append(n.name)
        if n.record.state == RECLAIMING:
            reclaiming.append(n)
        elif (reason := deadline.owner_claim(settings, n) or _unreadable(n)
              or (lost if ours and settings.cluster_lost else None)) is not None:
            deadline.enter_without_slurm(r, settings, n, reason)
            reclaiming.append(n)
        else:
            held.append(n)
    if settings.policy is not None and held:
        held.sort(key=lambda n: reclaim_order(world, settings, n))
        extra = over_cap(settings.policy.spec, len(held))
        for n in held[:extra]:
            deadline.enter_without_slurm(r, settings, n, LIMITS)
            reclaiming.append(n)
        held = sorted(held[extra:], key=lambda n: n.name)
        _, _, chosen = cover_demand(world, settings, kube, reclaiming, held)
        for n in chosen:
            deadline.enter_without_slurm(r, settings, n, DEMAND)
    for n in reclaiming:
        if deadline.overdue(settings, n):
            deadline.take_back(r, world, settings, n, slurm_read=False)


def _unreadable(node: KubeNode) -> str | None:
    """A held node whose state label this version does not know (or that
    carries only the taint) is lent to a Slurm the bridge cannot tell
    about: it goes back (``record-unreadable``), never left as it is."""
    return RECORD_UNREADABLE if node.record.state not in STATES else None


def _release_all(r: Round, world: World, settings: Settings, mine: list[KubeNode]) -> None:
    """The policy and its SlurmCluster are gone, and with the cluster Slurm
    and every job: give the nodes back (those this policy lent to it)."""
    for n in mine:
        if n.record.cluster != settings.cluster_key:
            r.stale.append(n.name)
            r.projected[n.name] = n.record.state
        else:
            move.release_without_slurm(r, world, settings, n)


def _move_nodes(r: Round, world: World, settings: Settings, mine: list[KubeNode], selected: list[KubeNode],
                kube: list[KubeNode], idle: list[KubeNode], problem: tuple[str, str] | None,
                window_open: bool, fs: Foresight | None) -> set[str]:
    """Every held node's move, then the nodes to lend; returns those lent now."""
    policy = settings.policy
    # The nodes kept for Kubernetes: minKubernetesNodes, or the forecast's headroom if more.
    keep_kube = max(policy.spec.min_kubernetes_nodes, fs.headroom if fs is not None else 0) \
        if policy is not None else 0
    held: list[KubeNode] = []          # lending or lent, staying unless chosen below
    reclaiming: list[KubeNode] = []
    leaving: dict[str, str] = {}       # node -> reason, for held nodes reclaimed now
    by_name = {n.name: n for n in mine}
    for n in mine:
        rec = n.record
        if rec.cluster != settings.cluster_key:
            # Lent to another SlurmCluster (the policy's clusterRef changed):
            # its Slurm is not read here, so only the owner's claims and the
            # reclaim deadline move it.
            r.stale.append(n.name)
            r.projected[n.name] = rec.state
            if rec.state == RECLAIMING:
                if deadline.overdue(settings, n):
                    deadline.take_back(r, world, settings, n, slurm_read=False)
            elif (reason := deadline.owner_claim(settings, n) or _unreadable(n)) is not None:
                deadline.enter_without_slurm(r, settings, n, reason)
            continue
        if rec.state == RECLAIMING:
            reclaiming.append(n)
            continue
        # A policy problem (a typo in the partition or the selector, say)
        # must not take every lent node back at once: only failures and
        # pending pods do then.
        # A node whose owner withdrew or cordoned it goes back whatever the
        # policy says (:func:`.deadline.owner_claim`).
        reason = (_unreadable(n) or failure(world, settings, n) or withdrawn(settings, n)
                  or (must_go(settings, n, window_open, world.slurm_nodes.get(n.name)) if problem is None
                      else deadline.owner_claim(settings, n)))
        if reason:
            leaving[n.name] = reason
        else:
            held.append(n)

    # Limits: too many lent, or too few left to Kubernetes. The cap holds
    # even with a policy problem (maxLentNodes: 0 takes every node back);
    # the minimum counts selected nodes, which a problem makes unreliable.
    held.sort(key=lambda n: reclaim_order(world, settings, n))
    if policy is not None:
        extra = limits = over_cap(policy.spec, len(held))
        if problem is None:
            returning = sum(1 for n in [*reclaiming, *(by_name[x] for x in leaving), *held[:extra]]
                            if settings.selects(n))
            limits += short_of_minimum(policy.spec.min_kubernetes_nodes, len(kube), returning)
            extra += short_of_minimum(keep_kube, len(kube), returning)
        # The forecast's headroom hurries no job: only idle nodes go back for it
        # (busy ones get a reservation from now on: foresight.reservations).
        for i, n in enumerate(held[:extra]):
            if i < limits:
                leaving[n.name] = LIMITS
            elif not world.jobs_on(n.name):
                leaving[n.name] = FORECAST
        held = [n for n in held if n.name not in leaving]

    # Demand: pending GPU pods the Kubernetes nodes and the nodes on their
    # way back cannot take get as few more nodes as cover them.
    reserved: set[str] = set()
    unmet: list[KubePod] = []
    if policy is not None:
        reserved, unmet, chosen = cover_demand(world, settings, kube, [*reclaiming, *(by_name[x] for x in leaving)],
                                               held)
        for n in chosen:
            leaving[n.name] = DEMAND
        held = [n for n in held if n.name not in leaving]

    reclaimed = [*((n, None) for n in reclaiming), *((n, leaving[n.name]) for n in mine if n.name in leaving)]
    ended = move.ended_by_down(world, settings, reclaimed)
    for n, entering in reclaimed:
        if entering is None and deadline.overdue(settings, n):
            deadline.reclaim_or_take_back(r, world, settings, n, ended)
        else:
            move.reclaim(r, world, settings, n, entering=entering, ended=ended)
    for n in held:
        move.keep(r, world, settings, n)
    # The lent pods' disruption budgets, while Slurm runs jobs there (problem or not).
    keep_budgets(r, world, settings, mine)

    if problem is not None:
        return set()
    returned = _returned(r, settings, mine)
    reservations(r, world, settings, fs, [n for n in held if r.projected.get(n.name) == LENT],
                 len(kube) + returned)
    ghosts = move.clean_ghosts(r, world, settings, kube)
    if policy is None or not window_open:
        return set()
    lending = set()
    candidates = idle_candidates(r, world, settings, idle, reserved, unmet, ghosts)
    for since, n, desc in choose_to_lend(r, world, settings, candidates, len(held), len(kube) + returned,
                                         keep_kube):
        move.start_lending(r, world, settings, n, since, desc)
        lending.add(n.name)
    return lending


def orphaned_policies(nodes: Iterable[KubeNode], existing: Iterable[str],
                      namespaces: Iterable[str] = ()) -> list[PolicyGone | Unattributed]:
    """Who holds nodes that no existing policy holds (``existing``:
    ``namespace/name`` of every NodeLendingPolicy): a :class:`PolicyGone`
    per policy that Nodes still name but that no longer exists and per
    SlurmCluster their nodes were lent to (decide on each, with that cluster
    observed, or None when it is gone too, to take the nodes back); and an
    :class:`Unattributed` per SlurmCluster (or none that can be read) of the
    held nodes whose record names no policy and SlurmCluster as
    ``<namespace>/<name>`` (``namespaces``: those the bridge serves, where
    such a node's lent slurmd pod is looked for when no SlurmCluster can be)."""
    alive = set(existing)
    gone: set[tuple[str, str]] = set()
    unattributed: set[str | None] = set()
    for n in nodes:
        rec = n.record
        holder = rec.holder
        if holder is not None and holder not in alive:
            if readable_key(rec.policy) and readable_key(rec.cluster):
                gone.add((holder, rec.cluster))
            else:
                unattributed.add(rec.cluster if readable_key(rec.cluster) else None)
        # and nodes that still owe a DOWN to a cluster whose policy is gone (or cannot be told)
        owed, by = rec.down_owed, rec.down_owed_policy
        if readable_key(owed) and by not in alive:
            if readable_key(by):
                gone.add((by, owed))
            else:
                unattributed.add(owed)
    out: list[PolicyGone | Unattributed] = [
        PolicyGone(namespace, name, cluster) for key, cluster in sorted(gone)
        for namespace, _, name in [key.partition("/")]]
    return out + [Unattributed(c, tuple(namespaces) if c is None else ())
                  for c in sorted(unattributed, key=lambda c: c or "")]
