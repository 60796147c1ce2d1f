"""Lending with foresight: headroom and reservations from the forecast. Pure.

With ``spec.forecast`` a round (:func:`foresee`) records the demand it sees
in the policy's status (the selected Kubernetes nodes that run a GPU pod,
the bridge's own slurmd pods still ending after a reclaim left out, and
the nodes pending pods would fill) and asks the forecast (:mod:`.forecast`)
two things:

- **headroom**: how many nodes Kubernetes will want within
  ``headroomSeconds``, beyond those its pending pods take back (as without
  a forecast). The policy keeps that many unlent (at least
  ``minKubernetesNodes``). When the forecast rises above what Kubernetes
  has, idle lent nodes go back at once (reason ``forecast``); a busy one is
  not hurried: its reservation starts now, so it takes no new job and goes
  back once its jobs end or a pending pod needs it.
- **when each lent node is wanted back**, up to ``reserveSeconds`` ahead:
  the lent nodes in the order they would be given back (:func:`.choose.reclaim_order`),
  the k-th wanted once Kubernetes is forecast to want more than its own
  nodes and k of them; a node the forecast does not want back within the
  longest horizon its record can tell (at most ``reserveSeconds``) is
  wanted from that horizon: past it nothing is known, and unknown is not
  "never". :func:`reservations` has Slurm hold each from then on
  (a ``slurmk8s-lend-<node>`` reservation, ``Flags=MAINT,IGNORE_JOBS``), so
  that backfill starts there only jobs whose time limit ends before it.
  Until the record tells any horizon (its first hours) nothing is reserved.

A reservation is moved when the forecast moves it later, or earlier than
it is; it is kept while it is at most a quarter of the time ahead early
(so a steady forecast does not move it every round). It is removed when the
node no longer needs one, and before the node leaves Slurm
(:func:`.transitions.reclaim`). :func:`stale_reservations` removes a lending
reservation on any node no policy holds lent (a bridge killed between two
steps, a policy that stopped forecasting): none is left behind.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from ..api.lending import DemandRecord, ForecastBasis
from ..slurm.steps import Reserve, Unreserve
from . import forecast
from .nodestate import LENDING, LENT
from .observed import KubeNode
from .placement import triggers
from .settings import Round, Settings
from .world import World

__all__ = ["Foresight", "foresee", "reservations", "stale_reservations", "demand_status"]


@dataclass(frozen=True)
class Foresight:
    """What the forecast says this round."""

    record: forecast.Record
    demand: int
    #: Nodes to keep for Kubernetes (0: no headroom).
    headroom: int
    #: Reservation horizons (seconds ahead) and the nodes wanted within each.
    horizons: tuple[int, ...]
    wanted: tuple[int, ...]
    #: Which answer gave the headroom (:data:`.forecast.RECENT`, ``DAILY``, ``WEEKLY``; None: none known).
    basis: ForecastBasis | None = None


def foresee(world: World, settings: Settings, selected: Sequence[KubeNode]) -> Foresight | None:
    """The round's demand, recorded, and the forecast; None without ``spec.forecast``."""
    policy = settings.policy
    if policy is None or policy.spec.forecast is None:
        return None
    spec = policy.spec.forecast
    busy = sum(1 for n in selected
               if n.record.state is None and world.serving(n.name, settings.namespace, settings.cluster_name))
    pending = sum(p.gpus for p in world.pending if triggers(p, settings.reclaim))
    per_node = max((n.gpus for n in selected), default=0)
    demand = forecast.demand_now(busy, pending, per_node)
    old = policy.status.demand if policy.status is not None else None
    rec = forecast.record(forecast.decode(old.start, old.peaks) if old is not None else None, settings.now, demand)
    horizons = forecast.reserve_horizons(spec.headroom_seconds or forecast.STEP, spec.reserve_seconds) \
        if spec.reserve_seconds else ()
    q = spec.quantile_percent / 100
    asked = ((spec.headroom_seconds,) if spec.headroom_seconds else ()) + horizons
    told = forecast.explained(rec, settings.now, demand, asked, q, spec.seasonal_days, spec.seasonal_weeks) \
        if asked else []
    got = [v for v, _ in told]
    # The pending pods' nodes are demand's own to take back (placement.cover_demand):
    # the headroom is what Kubernetes will want beyond them.
    pending_nodes = demand - busy
    near = got[0] if spec.headroom_seconds and got[0] is not None else demand
    headroom = max(near - pending_nodes, 0) if spec.headroom_seconds else 0
    ahead = got[1 if spec.headroom_seconds else 0:]
    # The horizons the record can tell (a longer one needs a longer record): beyond the last, unknown.
    known = next((i for i, v in enumerate(ahead) if v is None), len(ahead))
    basis = told[0][1] if spec.headroom_seconds and got[0] is not None else None
    return Foresight(rec, demand, headroom, horizons[:known], tuple(v for v in ahead[:known] if v is not None),
                     basis)


def demand_status(fs: Foresight | None) -> DemandRecord | None:
    """The record as the status holds it."""
    if fs is None:
        return None
    start, peaks = forecast.encode(fs.record)
    return DemandRecord(start=start, peaks=peaks, forecast_nodes=fs.headroom or None,
                        forecast_basis=fs.basis if fs.headroom else None)


def _wanted_at(fs: Foresight, kube: int, k: int) -> int:
    """Seconds ahead from which the k-th lent node to go back is wanted:
    the horizon before the first one whose forecast exceeds ``kube`` + k,
    else the last horizon the forecast knows. Beyond it the forecast cannot
    tell, so the node is not lent past it (fail closed): a job whose time
    limit runs past what the record has seen would be the one a rise ends."""
    j = bisect.bisect_right(fs.wanted, kube + k)  # wanted is non-decreasing
    if j >= len(fs.wanted):
        return fs.horizons[-1]
    return 0 if j == 0 else fs.horizons[j - 1]


def reservations(r: Round, world: World, settings: Settings, fs: Foresight | None, lent: Sequence[KubeNode],
                 kube: int) -> None:
    """Make, move or remove the reservation of each node that stays lent
    (``lent``: in the order they would go back; ``kube``: selected nodes
    serving Kubernetes after this round). Only once Slurm's reservations
    were read."""
    have = world.observed.slurm.reservations
    if have is None:
        return
    by_node = {res.node: res.start for res in have}
    now = int(settings.now.timestamp())
    k = 0
    for n in lent:
        if n.name not in world.slurm_nodes:
            continue  # not registered yet: nothing to reserve
        ahead = _wanted_at(fs, kube, k) if fs is not None and fs.horizons else None  # None: none known
        k += 1
        current = by_node.get(n.name)
        if ahead is None:
            if current is not None:
                r.emit(Unreserve(n.name))
            continue
        start = now + ahead
        tolerance = max(forecast.STEP, ahead // 4)
        if current is None or current > start or current < start - tolerance:
            r.emit(Reserve(n.name, start))


def stale_reservations(r: Round, world: World, settings: Settings) -> None:
    """Remove the lending reservations on nodes that no policy holds lent or
    lending in this cluster, except those this round reclaims (their
    reclaim removes it before the node leaves Slurm)."""
    have = world.observed.slurm.reservations
    if not have:
        return
    nodes = {n.name: n for n in world.observed.nodes}
    removed = {a.node for a in r.actions if isinstance(a, Unreserve)}  # with a ghost or an owed DOWN
    for res in have:
        node = nodes.get(res.node)
        if res.node in r.projected or res.node in removed:
            continue  # this policy holds it (reservations() or its reclaim see to it), or removes it already
        if (node is not None and node.record.state in (LENDING, LENT) and node.record.policy != settings.key
                and node.record.cluster == settings.cluster_key):
            continue  # another policy lends it to this cluster: its rounds see to it
        r.emit(Unreserve(res.node))
