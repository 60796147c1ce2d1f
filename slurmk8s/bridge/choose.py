"""Which nodes to lend, and which held nodes to give back first. Pure.

A Kubernetes node is lent when it has been idle for ``idleAfterSeconds`` (and
at least one round): it ran no GPU pod, or, under ``minFreeGpus``, at least
that many of its GPUs were free (:func:`waiting_since`). It is Ready, not
cordoned, carries no lending taint, runs no pod of the policy's SlurmCluster
(:mod:`.ownpods`), Slurm has no other node of its name, no pending GPU pod
could land on it, it can be described to Slurm, and lending it keeps the
policy within ``maxLentNodes`` and ``minKubernetesNodes``.
Longest idle first.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from ..api.lending import NodeLendingPolicySpec
from ..render.lent import LentNode, UnlendableNode
from ..slurm.model import Job
from .nodestate import HEALTH_FAILED_ANNOTATION, LENDING
from .observed import KubeNode, KubePod
from .ownpods import blocked_reason
from .placement import fits
from .settings import Round, Settings
from .world import World

__all__ = ["reclaim_order", "at_risk", "over_cap", "short_of_minimum", "waiting_since", "idle_candidates", "choose_to_lend"]


def reclaim_order(world: World, settings: Settings, node: KubeNode) -> tuple:
    """Which held node to give back first (``reclaim.order``).

    Cheapest: idle before busy; then the node whose jobs would lose least if
    ended now: the fewest whole GPU-hours since each job's last saved point
    (its checkpoint where known, else its start: a job that just started
    loses little); then the one whose jobs' time limits end soonest (a job without
    a known start or end counts as the worst); one still starting before one
    already lent. FewestJobs: fewest jobs first."""
    jobs = world.jobs_on(node.name)
    starting = node.record.state != LENDING
    if settings.reclaim.order == "FewestJobs" or not jobs:
        return (len(jobs), starting, node.name)
    now = settings.now.timestamp()
    return (1, sum(at_risk(j, now) for j in jobs),
            max(max((j.end_time - now if j.end_time is not None else math.inf) for j in jobs), 0), starting, node.name)


def at_risk(job: Job, now: float) -> float:
    """The whole GPU-hours ``job`` would lose if it ended at ``now``: since its last checkpoint
    or, without one, its start (infinite when neither is known). Whole hours, so that jobs a
    few minutes apart tie and the time limits decide, rather than when each was seen."""
    saved = max((t for t in (job.start_time, job.checkpoint_time) if t is not None), default=None)
    if saved is None:
        return math.inf
    return max(now - saved, 0) * max(job.gpus, 1) // 3600


def over_cap(spec: NodeLendingPolicySpec, held: int) -> int:
    """How many held nodes are beyond ``maxLentNodes``."""
    cap = spec.max_lent_nodes
    return held - cap if cap is not None and held > cap else 0


def short_of_minimum(minimum: int, kube: int, returning: int) -> int:
    """How many more nodes Kubernetes needs back to keep ``minimum``
    (``kube``: selected Kubernetes nodes; ``returning``: selected nodes on
    their way back)."""
    return max(minimum - kube - returning, 0)


def waiting_since(settings: Settings, node: KubeNode) -> datetime | None:
    """Since when ``node`` has been idle as the policy counts it (the Node's
    record): without GPU pods, or with at least ``minFreeGpus`` GPUs free."""
    want = settings.min_free_gpus
    if want is None:
        return node.record.idle_since
    free = node.record.free_since
    return free[0] if free is not None and free[1] >= want else None


def idle_candidates(r: Round, world: World, settings: Settings, idle: list[KubeNode], reserved: set[str],
                    unmet: list[KubePod], ghosts: set[str]) -> list[tuple[datetime, KubeNode]]:
    """Of the idle selected Kubernetes nodes (``idle``: as the policy counts
    it), those idle long enough to lend, longest idle first; why others
    cannot be lent goes to ``r.blocked``."""
    assert settings.policy is not None
    # Idle since a time recorded on the Node (to the millisecond) by an
    # earlier round, and for longer than idleAfterSeconds: a node first seen
    # idle (or just handed back) is lent a later round at the earliest,
    # idleAfterSeconds 0 included, and deciding again at the same instant
    # changes nothing.
    idle_after = timedelta(seconds=settings.policy.spec.idle_after_seconds)
    eligible: list[tuple[datetime, str, KubeNode]] = []
    for n in idle:
        if n.name in reserved or not n.ready or n.unschedulable:
            continue
        since = waiting_since(settings, n)
        if since is None or settings.now - since <= idle_after:
            continue
        if n.record.health_failed:
            r.blocked.append(f"{n.name} (failed its {n.record.health_failed} health check while lent; remove "
                             f"its {HEALTH_FAILED_ANNOTATION} annotation once it is mended)")
            continue
        if n.record.down_owed == settings.cluster_key:
            continue  # settled this round (deadline.settle): its idle time starts again then
        if (why := blocked_reason(world, settings, n)) is not None:
            r.blocked.append(why)
            continue
        if n.name in world.slurm_nodes and n.name not in ghosts:
            r.blocked.append(f"{n.name} (Slurm already has a node of that name)")
            continue
        if any(pod.gpus <= world.free_gpus(n) and fits(pod, n) for pod in unmet):
            continue  # a pending pod may still land here
        eligible.append((since, n.name, n))
    eligible.sort(key=lambda e: (e[0], e[1]))
    return [(since, n) for since, _, n in eligible]


def choose_to_lend(r: Round, world: World, settings: Settings, eligible: list[tuple[datetime, KubeNode]],
                   lent: int, kube_left: int, keep_kube: int) -> list[tuple[datetime, KubeNode, LentNode]]:
    """The candidates to lend now, within the limits (``lent``: nodes held;
    ``kube_left``: selected nodes serving Kubernetes; ``keep_kube``: how many
    of them to keep, minKubernetesNodes or the forecast's headroom), with
    their description; a node that cannot be described goes to ``r.blocked``.
    Every candidate is described, the limits reached or not: what is
    reported must not depend on how many are held, or the round after a
    lend (which holds one more) would report less and rewrite the status."""
    assert settings.policy is not None
    spec = settings.policy.spec
    chosen = []
    for since, n in eligible:
        try:
            desc = settings.describe(n, world.lendable(n))
        except UnlendableNode as exc:
            r.blocked.append(f"{n.name} ({exc})")
            continue
        if spec.max_lent_nodes is not None and lent >= spec.max_lent_nodes:
            continue
        if kube_left - 1 < keep_kube:
            continue
        chosen.append((since, n, desc))
        lent += 1
        kube_left -= 1
    return chosen
