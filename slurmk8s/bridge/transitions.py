"""The per-node moves of the lending state machine, as actions. Pure.

    Kubernetes ──> lending ──> lent ──> reclaiming ──> Kubernetes

Each function moves one node one step (or holds it where it is) and adds
its actions to the :class:`~.settings.Round`, with the state the node will be in
once they are applied. Which nodes move, and why, the composition in
:mod:`.decide` works out from :mod:`.verdicts`, :mod:`.placement` and
:mod:`.choose`. The reclaim applies the one evacuation rule
(:mod:`slurmk8s.evacuation`); this module keeps only its record's codec on
the Node.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime

from .. import evacuation
from ..api.cluster import LENT_PREFIX
from ..evacuation import evacuate
from ..render.lent import LentNode
from ..slurm.model import Job, unhealthy
from ..slurm.steps import Cancel, DeleteNode, Requeue, StartNow, Unreserve
from ..times import format_time
from .actions import (
    Action,
    ClearFreeSince,
    ClearIdleSince,
    ClearLending,
    CreateSlurmdPod,
    DeleteSlurmdPod,
    Event,
    RecordForced,
    RecordFreeSince,
    RecordHealthFailed,
    RecordIdleSince,
    RecordSignalled,
    SetLendingState,
    Taint,
    Untaint,
)
from .budgets import dropped_budgets
from .nodestate import LENDING, LENT, RECLAIMING, TAINT_EFFECT, TAINT_KEY, LendingRecord
from .observed import KubeNode
from .reasons import CLUSTER_GONE, FAILURES, FORCE_RETRY_SECONDS, NODE_NOT_READY, REASONS, SLURMD_GONE, UNHEALTHY
from .settings import Round, Settings
from .verdicts import lost, pod_of, pods_of, registered
from .world import World

__all__ = ["node_event", "start_lending", "keep", "reclaim", "leave_slurm", "hand_back", "release_without_slurm",
           "clear_idle", "record_idle", "clean_ghosts"]


def node_event(node: str, reason: str, message: str, warning: bool = False) -> Event:
    return Event("Warning" if warning else "Normal", reason, message, kind="Node", name=node)


def _past(job_action: str) -> str:
    """``requeue`` -> requeued, ``cancel`` -> cancelled."""
    return "requeued" if job_action == evacuation.REQUEUE else "cancelled"


def _job_ids(jobs: list[Job]) -> tuple[int, ...]:
    return tuple(sorted({j.job_id for j in jobs}))


def create_pod(world: World, settings: Settings, node: KubeNode) -> CreateSlurmdPod:
    """The lent slurmd pod of ``node``, with what of the node it takes
    (:meth:`World.lendable`) and the policy's podTemplate: the loop has it rendered
    (``slurmk8s.render.manifests``)."""
    assert settings.policy is not None
    spec = settings.policy.spec
    return CreateSlurmdPod(cluster=settings.cluster_key, node=node.name, partition=spec.partition,
                           shm_size=spec.shm_size, resources=tuple(sorted(world.lendable(node).items())),
                           grace_seconds=settings.reclaim.grace_period_seconds,
                           pod_template=spec.pod_template)


def start_lending(r: Round, world: World, settings: Settings, node: KubeNode, since: datetime,
                  desc: LentNode) -> None:
    """Kubernetes -> lending: taint the node and start its slurmd."""
    assert settings.policy is not None
    partition = settings.policy.spec.partition
    r.emit(
        SetLendingState(node.name, LENDING, settings.key, settings.cluster_key, partition, settings.now),
        Taint(node.name, TAINT_KEY, settings.cluster_name, TAINT_EFFECT),
        create_pod(world, settings, node),
        node_event(node.name, "Lending",
                   f"idle since {format_time(since)}: lending it to "
                   f"partition {partition} of SlurmCluster {settings.cluster_key} "
                   f"(NodeLendingPolicy {settings.key}); {desc.gpus} {desc.gpu_type} GPU(s)"),
    )
    r.projected[node.name] = LENDING


def keep(r: Round, world: World, settings: Settings, node: KubeNode) -> None:
    """A lending or lent node that stays: restore its taint, start its
    slurmd, or mark it lent once Slurm has it."""
    rec = node.record
    r.projected[node.name] = rec.state
    if rec.taint is None:
        r.emit(Taint(node.name, TAINT_KEY, settings.cluster_name, TAINT_EFFECT))
    snode = world.slurm_nodes.get(node.name)
    if snode is not None and snode.drain_set and not snode.drain_is_ours:
        r.admin_drained.append(f"{node.name} ({snode.reason or 'no reason given'})")
    if rec.state == LENDING:
        pod = pod_of(world, settings, node)
        if pod is None:
            r.emit(create_pod(world, settings, node))
        elif pod.phase == "Running" and registered(world, settings, node):
            r.emit(
                SetLendingState(node.name, LENT, settings.key, settings.cluster_key, rec.partition or "", settings.now),
                node_event(node.name, "Lent",
                           f"registered with Slurm in partition {rec.partition} of SlurmCluster "
                           f"{settings.cluster_key}; taking jobs"),
            )
            r.projected[node.name] = LENT


def slurmd_gone(world: World, settings: Settings, node: KubeNode, entering: str | None) -> bool:
    """Nothing answers for the node's jobs any more: the evacuation rule sets it
    DOWN. So it is when its slurmd was lost, the node is :func:`lost`, or its
    lent slurmd pod is gone or ended (deleted by someone else and past its
    termination grace during the reclaim, say) while Slurm still shows jobs
    there."""
    reason = entering or node.record.reason or "unknown"
    if reason in SLURMD_GONE or lost(world, settings, node):
        return True
    pod = pod_of(world, settings, node)
    return pod is None or pod.terminal


def ended_by_down(world: World, settings: Settings, reclaimed: Sequence[tuple[KubeNode, str | None]]) -> dict[int, str]:
    """Job id -> the node whose DOWN this round ends it (Slurm requeues or fails
    every job of a node set DOWN). Another node's evacuation leaves such a job
    alone, so a round's outcome depends neither on the order nodes are taken in
    nor on the bridge being killed between the DOWN and the rest."""
    out: dict[int, str] = {}
    for node, entering in reclaimed:
        jobs = world.jobs_on(node.name)
        if evacuation.sets_down(world.slurm_nodes.get(node.name), jobs, slurmd_gone(world, settings, node, entering)):
            for job in jobs:
                out.setdefault(job.job_id, node.name)
    return out


def reclaim(r: Round, world: World, settings: Settings, node: KubeNode, entering: str | None,
            ended: dict[int, str] | None = None) -> None:
    """Move a node towards Kubernetes: drain, signal, wait for the grace
    period, requeue or cancel, then remove its Slurm node and slurmd pod
    and untaint it. ``entering``: the reason, when it starts now; ``ended``:
    :func:`ended_by_down`."""
    rec = node.record
    name = node.name
    reason = entering or rec.reason or "unknown"
    failure = reason in FAILURES
    spec = settings.reclaim
    snode = world.slurm_nodes.get(name)
    jobs = world.jobs_on(name)
    # Jobs another node's DOWN ends this round: Slurm requeues or fails them; this
    # node neither requeues nor cancels them, and waits for them as for any job.
    ending = {j.job_id for j in jobs if (ended or {}).get(j.job_id, name) != name}
    acts: list[Action] = []
    r.projected[name] = RECLAIMING
    if entering is not None:
        running = [j for j in jobs if j.state != "COMPLETING"]
        acts.append(SetLendingState(name, RECLAIMING, *settings.owner(rec), rec.partition or "",
                                    settings.now, reason=entering))
        if entering == UNHEALTHY and snode is not None:
            acts.append(RecordHealthFailed(name, unhealthy([snode]).get(name, "unknown")))
        what = f"taking the node back from Slurm: {REASONS.get(entering, entering)}"
        if running and not failure:
            what += (f"; {len(_job_ids(running))} job(s) get SIG{spec.signal} and "
                     f"{spec.grace_period_seconds}s to checkpoint, then are {_past(spec.job_action)}")
        elif running:
            what += f"; its {len(_job_ids(running))} job(s) are {_past(spec.job_action)} now"
        acts.append(node_event(name, "Reclaiming", what, warning=failure or reason == NODE_NOT_READY))
        if snode is not None and snode.drain_set and not snode.drain_is_ours:
            acts.append(node_event(
                name, "AdminDrain",
                f"Slurm node {name} was drained by someone else ({snode.reason or 'no reason'}); slurmk8s "
                "leaves that drain alone and removes the node from Slurm once its jobs are gone",
                warning=True))
    # The evacuation rule (slurmk8s.evacuation), with the record kept on the Node.
    policy = evacuation_policy(settings, reason)
    evac = evacuate(name, snode, jobs, evacuation_record(rec, entering, settings.now), policy, settings.now,
                    recorded=world.jobs_by_id(rec.signalled_jobs if entering is None else ()),
                    slurmd_gone=slurmd_gone(world, settings, node, entering))
    if ending:
        evac = _leave_to_slurm(evac, ending)
    acts += evacuation_actions(name, evac, policy, rec if entering is None else None)
    if not evac.empty:
        r.emit(*acts)  # jobs are ending, or have their grace period: wait
        return
    # No job left: remove it from Slurm, then the pod, then hand the node back.
    acts += leave_slurm(world, name, in_slurm=snode is not None)
    r.emit(*acts)
    hand_back(r, world, settings, node)


def leave_slurm(world: World, name: str, in_slurm: bool = True) -> list[Action]:
    """The steps that remove a lent node from Slurm, in one chain: its lending
    reservation first, when it may have one (Slurm keeps a reservation on a
    node it deletes, naming it, and would hold the next node of that name),
    then the node itself when Slurm has it (Slurm refuses while a job runs
    there, which stops the chain)."""
    return [*([Unreserve(name)] if world.reserved(name) else []), *([DeleteNode(name)] if in_slurm else [])]


def _leave_to_slurm(evac: evacuation.Evacuation, job_ids: set[int]) -> evacuation.Evacuation:
    """``evac`` without requeueing, cancelling or starting ``job_ids``."""
    kept = []
    for a in evac.actions:
        if isinstance(a, (Requeue, Cancel, StartNow)):
            rest = tuple(j for j in a.job_ids if j not in job_ids)
            if not rest:
                continue
            a = dataclasses.replace(a, job_ids=rest)
        kept.append(a)
    return dataclasses.replace(evac, actions=tuple(kept))


def evacuation_record(rec: LendingRecord, entering: str | None, now: datetime) -> evacuation.Record:
    """The evacuation's record as the Node keeps it: the reclaim reason, the
    time the node entered reclaiming, signalled (and which jobs), forced."""
    if entering is not None:
        return evacuation.Record(purpose=entering, started=now)
    return evacuation.Record(purpose=rec.reason or "unknown", started=rec.since or now, signalled=rec.signalled,
                             jobs=rec.signalled_jobs, forced=rec.forced)


def evacuation_policy(settings: Settings, reason: str) -> evacuation.Policy:
    """A graceful reclaim signals and gives the grace period; a failure
    leaves no time for a checkpoint: what runs is requeued (or cancelled) now."""
    spec = settings.reclaim
    failure = reason in FAILURES
    return evacuation.Policy(
        purpose=reason, drain_reason=f"reclaimed by Kubernetes ({reason})",
        signal=None if failure else spec.signal, grace_seconds=0 if failure else spec.grace_period_seconds,
        job_action=spec.job_action, retry_seconds=FORCE_RETRY_SECONDS)


def evacuation_actions(name: str, evac: evacuation.Evacuation, policy: evacuation.Policy,
                       before: LendingRecord | None) -> list[Action]:
    """The rule's steps, as they are, then the record's changes as Node
    annotations (``before``: the record on the Node; None when the
    reclaim starts this round)."""
    acts: list[Action] = []
    new = evac.record
    # when the jobs were signalled, if this round signalled them: recorded once, before they go
    signalled = new.signalled if before is None or before.signalled is None else None
    for a in evac.actions:
        if signalled is not None and isinstance(a, (StartNow, Requeue, Cancel)):
            acts.append(RecordSignalled(name, signalled, new.jobs))
            signalled = None
        acts.append(a)
    if signalled is not None:
        acts.append(RecordSignalled(name, signalled, new.jobs))
    if new.forced is not None and (before is None or before.forced != new.forced):
        requeued = sum(len(a.job_ids) for a in evac.actions if isinstance(a, Requeue))
        cancelled = sum(len(a.job_ids) for a in evac.actions if isinstance(a, Cancel))
        acts.append(RecordForced(name, new.forced))
        acts.append(node_event(name, "JobsForced", f"{requeued} job(s) requeued, {cancelled} cancelled" + (
            f" after the {policy.grace_seconds}s grace period" if policy.signal else "")))
    return acts


def hand_back(r: Round, world: World, settings: Settings, node: KubeNode) -> None:
    """Reclaiming -> Kubernetes: delete the slurmd pod, untaint, clear the
    record; then the pod's budget (last: it goes with its pod anyway)."""
    pods = pods_of(world, settings, node)
    acts: list[Action] = [DeleteSlurmdPod(pod.namespace, pod.name, node.name) for pod in pods if not pod.deleting]
    if node.record.taint is not None:
        acts.append(Untaint(node.name, TAINT_KEY))
    acts.append(ClearLending(node.name))
    acts.append(node_event(node.name, "Returned", "the node serves Kubernetes again"))
    if world.idle(node.name, settings.namespace, settings.cluster_name) and settings.selects(node):
        acts.append(RecordIdleSince(node.name, settings.now))  # nothing left on it: idle from now
    if (settings.min_free_gpus is not None and settings.selects(node)
            and world.has_free(node, settings.namespace, settings.cluster_name)):
        acts.append(RecordFreeSince(node.name, settings.now, world.free_gpus(node)))
    acts += dropped_budgets(world, node, pods)
    r.emit(*acts)
    r.projected[node.name] = None


def release_without_slurm(r: Round, world: World, settings: Settings, node: KubeNode) -> None:
    """The SlurmCluster is gone, and with it Slurm and every job."""
    if node.record.state != RECLAIMING:
        r.emit(
            SetLendingState(node.name, RECLAIMING, *settings.owner(node.record),
                            node.record.partition or "", settings.now, reason=CLUSTER_GONE),
            node_event(node.name, "Reclaiming", f"taking the node back: {REASONS[CLUSTER_GONE]}", warning=True),
        )
    hand_back(r, world, settings, node)


def clear_idle(r: Round, world: World, settings: Settings, nodes: Sequence[KubeNode]) -> None:
    """A Kubernetes node recorded idle that runs a GPU pod again is not idle;
    one recorded with N GPUs free that now has fewer has had the fewer free
    since now (none: its record goes). Facts of the node, whichever policy
    asks."""
    gpu_pods = world.gpu_pods
    for n in nodes:
        rec = n.record
        if rec.state is not None:
            continue
        if rec.idle_since is not None and gpu_pods.get(n.name):
            r.emit(ClearIdleSince(n.name))
        if rec.free_since is not None and (free := world.free_gpus(n)) < rec.free_since[1]:
            r.emit(RecordFreeSince(n.name, settings.now, free) if free > 0 else ClearFreeSince(n.name))


def record_idle(r: Round, world: World, settings: Settings, idle: list[KubeNode], free: list[KubeNode],
                lending: set[str]) -> None:
    """A Kubernetes node seen idle for the first time: remember since when.
    (``idle``: the selected Kubernetes nodes that are idle, :meth:`World.idle`;
    ``free``: under minFreeGpus, those with a GPU free, :meth:`World.has_free`.)"""
    for n in idle:
        if n.name not in lending and n.record.idle_since is None:
            r.emit(RecordIdleSince(n.name, settings.now))
    want = settings.min_free_gpus or 1
    for n in free:
        rec = n.record.free_since
        # A record of fewer GPUs than the policy wants starts the clock again
        # once enough are free (and stays then: no other policy rewrites it).
        if n.name not in lending and (rec is None or rec[1] < want <= world.free_gpus(n)):
            r.emit(RecordFreeSince(n.name, settings.now, world.free_gpus(n)))


def clean_ghosts(r: Round, world: World, settings: Settings, kube: list[KubeNode]) -> set[str]:
    """A Slurm node left behind by a lent node that is Kubernetes' again
    (its slurmd registered while it was being given back): remove it once
    it has no job and no slurmd pod. Returns the nodes cleaned."""
    cleaned = set()
    for n in kube:
        s = world.slurm_nodes.get(n.name)
        if (s is None or world.jobs_on(n.name) or s.busy
                or not any(f.startswith(LENT_PREFIX) for f in s.features)):
            continue
        if not world.has_slurmd(n.name, settings.namespace, settings.cluster_name):
            r.emit(*leave_slurm(world, n.name))
            cleaned.add(n.name)
    return cleaned
