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

Safety rules, each enforced here:
- Slurm could not be read: nothing that depends on Slurm changes (fail closed).
- A node goes back to Kubernetes (untaint) only when Slurm shows no job on it.
- Drains are set only with the facade's ``slurmk8s:`` prefix and never
  cleared; a node an administrator drained keeps its drain and is reported.
- Lending never takes the policy past maxLentNodes or below minKubernetesNodes.
- A node is lent only if its owner allows the policy's namespace
  (label slurmk8s.dev/lendable-to; decision record 15), whatever the
  selector says; a node whose owner withdraws that is taken back.
"""

from __future__ import annotations

import bisect
import hashlib
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Iterable, Sequence

from ..api.cluster import LENT_PREFIX
from ..api.lending import (
    LENDABLE_TO_LABEL,
    LendingCounts,
    NodeLendingPolicy,
    NodeLendingPolicyStatus,
    PolicyCondition,
    ReclaimSpec,
    describe_selector,
    may_lend,
)
from .. import evacuation
from ..evacuation import DEFAULT_RETRY_SECONDS, evacuate
from ..render.lent import UnlendableNode, lent_node
from ..slurm.hostlist import HostlistError, expand
from ..slurm.model import ACTIVE_JOB_STATES, Job, Node
from ..times import format_time as _rfc3339
from .actions import (
    Action,
    CancelJobs,
    ClearIdleSince,
    ClearLending,
    CreateSlurmdPod,
    DeleteSlurmNode,
    DeleteSlurmdPod,
    DrainSlurmNode,
    DownSlurmNode,
    Event,
    PolicyStatus,
    RecordForced,
    RecordIdleSince,
    RecordSignalled,
    RequeueJobs,
    SetLendingState,
    SignalJobs,
    StartJobsNow,
    Taint,
    Untaint,
)
from .nodestate import (
    COMPONENT_LABEL,
    LENDING,
    LENT,
    RECLAIMING,
    SLURMD_COMPONENT,
    STATES,
    TAINT_EFFECT,
    TAINT_KEY,
    LendingRecord,
)
from .observed import (
    TERMINAL_PHASES,
    InvalidPolicy,
    KubeNode,
    KubePod,
    NodeTaint,
    Observed,
    PolicyGone,
    SlurmState,
)
from .windows import in_window

__all__ = [
    "decide", "lending_metrics", "LendingMetrics", "orphaned_policies", "slurmd_pod_name",
    "REASONS", "FAILURES", "FORCE_RETRY_SECONDS", "DEFAULT_RECLAIM",
    # the observed state, re-exported so that callers need one import
    "Observed", "KubeNode", "KubePod", "NodeTaint", "SlurmState", "PolicyGone", "InvalidPolicy",
]

#: Reclaim settings for nodes whose policy is gone.
DEFAULT_RECLAIM = ReclaimSpec()
DEFAULT_REGISTRATION_TIMEOUT = 600
#: Jobs still running this long after their requeue/cancel get it again.
FORCE_RETRY_SECONDS = DEFAULT_RETRY_SECONDS

# Why a node is reclaimed (the slurmk8s.dev/reclaim-reason annotation).
DEMAND = "demand"
UNSELECTED = "unselected"
CORDONED = "cordoned"
WINDOW = "window"
LIMITS = "limits"
PARTITION = "partition"
POLICY_GONE = "policy-gone"
SLURMD_LOST = "slurmd-lost"
SLURM_NODE_LOST = "slurm-node-lost"
SLURM_NODE_DOWN = "slurm-node-down"
NODE_NOT_READY = "node-not-ready"
REGISTRATION_TIMEOUT = "registration-timeout"
UNLENDABLE = "unlendable"
CLUSTER_GONE = "cluster-gone"
WITHDRAWN = "withdrawn"

REASONS = {
    DEMAND: "pending GPU pods need the node",
    UNSELECTED: "the node no longer matches the policy's nodeSelector",
    CORDONED: "the node was cordoned",
    WINDOW: "outside the policy's lending windows",
    LIMITS: "maxLentNodes or minKubernetesNodes",
    PARTITION: "the policy now lends to another partition",
    POLICY_GONE: "the NodeLendingPolicy was deleted",
    SLURMD_LOST: "the node's slurmd pod is gone or failed",
    SLURM_NODE_LOST: "Slurm no longer knows the node",
    SLURM_NODE_DOWN: "Slurm reports the node DOWN or NOT_RESPONDING",
    NODE_NOT_READY: "the Kubernetes node is not Ready",
    REGISTRATION_TIMEOUT: "the node did not register with Slurm in time",
    UNLENDABLE: "the node cannot be described to Slurm",
    CLUSTER_GONE: "the SlurmCluster was deleted",
    WITHDRAWN: f"the node's {LENDABLE_TO_LABEL} label no longer names the policy's namespace",
}
#: Failures where the node's slurmd is gone: its jobs cannot end by
#: themselves, so the Slurm node is set DOWN, which ends them at once.
#: (A node Kubernetes reports not Ready is not one of them: it may be a
#: blip. It is reclaimed gracefully, and set DOWN only once it is lost:
#: ``_Decider.lost``.)
SLURMD_GONE = frozenset({SLURMD_LOST})
#: Reclaims where the jobs cannot be saved by a checkpoint signal: they are
#: requeued (or cancelled) at once.
FAILURES = frozenset({SLURMD_LOST, SLURM_NODE_LOST, SLURM_NODE_DOWN,
                      REGISTRATION_TIMEOUT, UNLENDABLE, CLUSTER_GONE})

_SERVING = frozenset({"idle", "mixed", "allocated"})
#: How many node names a status message lists before "and N more".
_LISTED = 5


def slurmd_pod_name(cluster: str, node: str) -> str:
    """The lent slurmd pod of ``node`` (deterministic, so it is found again after a restart)."""
    name = f"{cluster}-lent-{node}"
    if len(name) <= 253:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:10]
    return f"{name[:242].rstrip('.-')}-{digest}"


# Indexes over the observed world, built once per round: O(nodes + pods + jobs).


class _World:
    def __init__(self, observed: Observed):
        self.observed = observed
        #: node -> non-DaemonSet pods requesting GPUs that still hold them (makes a node busy)
        self.gpu_pods: dict[str, int] = defaultdict(int)
        #: node -> GPUs requested by pods that are neither ending nor ours
        self.used_gpus: dict[str, int] = defaultdict(int)
        #: (namespace, name) -> lent slurmd pod
        self.slurmd_pods: dict[tuple[str, str], KubePod] = {}
        #: pending, unschedulable pods requesting GPUs (any namespace)
        self.pending: list[KubePod] = []
        #: nodes that still have a lent slurmd pod (in any phase): not idle yet
        self.slurmd_nodes: set[str] = set()
        # One pass over the pods; the common cases are tested first.
        gpu_pods, used_gpus, pending = self.gpu_pods, self.used_gpus, self.pending
        for pod in observed.pods:
            ours = pod.labels.get(COMPONENT_LABEL) == SLURMD_COMPONENT
            if ours:
                self.slurmd_pods[(pod.namespace, pod.name)] = pod
                if pod.node is not None:
                    self.slurmd_nodes.add(pod.node)
            gpus = pod.gpus
            if gpus <= 0 or pod.phase in TERMINAL_PHASES:
                continue
            node = pod.node
            if node is None:
                if (pod.phase == "Pending" and pod.unschedulable and not pod.deleting and not ours
                        and pod.owner_kind != "DaemonSet"):
                    pending.append(pod)
                continue
            if pod.owner_kind != "DaemonSet":
                gpu_pods[node] += 1
            if not pod.deleting and not ours:
                used_gpus[node] += gpus

        slurm = observed.slurm
        self.slurm_known = slurm.known
        self.slurm_problem = "" if slurm.known else "the Slurm facade did not answer"
        self.slurm_nodes: dict[str, Node] = {n.name: n for n in slurm.nodes} if slurm.known else {}
        #: node -> jobs allocated there (active states only)
        self.jobs: dict[str, list[Job]] = defaultdict(list)
        if slurm.known:
            cache: dict[str, list[str]] = {}
            for job in slurm.jobs:
                if job.state not in ACTIVE_JOB_STATES or not job.nodes:
                    continue
                names = cache.get(job.nodes)
                if names is None:
                    try:
                        names = cache[job.nodes] = expand(job.nodes)
                    except HostlistError as exc:
                        # Which nodes the job runs on is unknown: fail closed.
                        self.slurm_known = False
                        self.slurm_problem = f"job {job.job_id}'s node list could not be read ({exc})"
                        self.slurm_nodes, self.jobs = {}, defaultdict(list)
                        break
                for name in names:
                    self.jobs[name].append(job)

    def free_gpus(self, node: KubeNode) -> int:
        return node.gpus - self.used_gpus.get(node.name, 0)

    def jobs_by_id(self, ids: Sequence[int]) -> list[Job]:
        """Slurm's jobs with these ids (any state); none when Slurm is unknown."""
        if not ids or not self.slurm_known:
            return []
        wanted = set(ids)
        return [j for j in self.observed.slurm.jobs if j.job_id in wanted]

    def idle(self, node: str) -> bool:
        """No GPU pod (DaemonSets aside) and no lent slurmd pod left on the node."""
        return not self.gpu_pods.get(node) and node not in self.slurmd_nodes


def _aware(now: datetime) -> datetime:
    return now if now.tzinfo else now.replace(tzinfo=timezone.utc)


def _more(names: Sequence[str]) -> str:
    shown = ", ".join(names[:_LISTED])
    return shown + (f" and {len(names) - _LISTED} more" if len(names) > _LISTED else "")


def _job_ids(jobs: Iterable[Job]) -> tuple[int, ...]:
    return tuple(sorted({j.job_id for j in jobs}))


@dataclass
class _Plan:
    """The policy's settings, or the defaults for a policy that is gone."""

    key: str
    namespace: str
    name: str
    policy: NodeLendingPolicy | None
    reclaim: ReclaimSpec
    registration_timeout: int
    #: namespace/name of the SlurmCluster of a policy that is gone
    cluster: str = ""


@dataclass
class _Round:
    """Facts gathered while deciding, for the status."""

    actions: list[Action] = field(default_factory=list)
    #: node name -> its state once this round's actions are applied (None: Kubernetes)
    projected: dict[str, str | None] = field(default_factory=dict)
    admin_drained: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    unknown_state: list[str] = field(default_factory=list)


class _Decider:
    def __init__(self, world: _World, plan: _Plan, now: datetime):
        self.w = world
        self.plan = plan
        self.now = now
        cluster = world.observed.cluster
        self.cluster = cluster
        if cluster is not None:
            self.cluster_key = f"{cluster.namespace}/{cluster.name}"
            self.cluster_name = cluster.name
        elif plan.policy is not None:
            self.cluster_name = plan.policy.spec.cluster_ref.name
            self.cluster_key = f"{plan.namespace}/{self.cluster_name}"
        else:
            self.cluster_key = plan.cluster
            self.cluster_name = plan.cluster.split("/")[-1]
        self.r = _Round()

    # -- small helpers ------------------------------------------------------

    def emit(self, *actions: Action) -> None:
        self.r.actions.extend(actions)

    def event(self, node: str, reason: str, message: str, warning: bool = False) -> Event:
        return Event("Node", "", node, "Warning" if warning else "Normal", reason, message)

    def pod_of(self, node: KubeNode) -> KubePod | None:
        name = slurmd_pod_name(node.record.cluster.split("/")[-1] if node.record.cluster else self.cluster_name,
                               node.name)
        return self.w.slurmd_pods.get((self.plan.namespace, name))

    def jobs_on(self, node: str) -> list[Job]:
        return self.w.jobs.get(node, [])

    def reclaim_order(self, node: KubeNode) -> tuple:
        """Which held node to give back first: idle before busy, fewest jobs,
        one still starting before one already lent."""
        return (len(self.jobs_on(node.name)), node.record.state != LENDING, node.name)

    # -- the round ------------------------------------------------------------

    def run(self) -> list[Action]:
        plan, w = self.plan, self.w
        policy = plan.policy
        nodes = w.observed.nodes
        mine = [n for n in nodes if n.record.state is not None and n.record.policy == plan.key]
        selected = [n for n in nodes if self.selects(n)]
        kube = [n for n in selected if n.record.state is None]

        # Idle bookkeeping holds whatever Slurm says: it only reads pods.
        for n in nodes:
            if n.record.state is None and n.record.idle_since is not None and w.gpu_pods.get(n.name):
                self.emit(ClearIdleSince(n.name))

        problem = self.problem(selected) if policy is not None else None

        if self.cluster is None and policy is not None:
            # Maybe a typo in clusterRef: report it, and leave the nodes as they are.
            for n in mine:
                self.r.projected[n.name] = n.record.state
            self.record_idle(kube, lending=set())
            return self.finish(selected, kube, problem, window_open=True)
        if self.cluster is None:
            # The policy and its SlurmCluster are gone, and with the cluster
            # Slurm and every job: give the nodes back.
            for n in mine:
                if n.record.state not in STATES:
                    self.r.unknown_state.append(n.name)
                elif n.record.cluster != self.cluster_key:
                    self.r.stale.append(n.name)
                    self.r.projected[n.name] = n.record.state
                else:
                    self.release_without_slurm(n)
            self.record_idle(kube, lending=set())
            return self.finish(selected, kube, problem, window_open=True)

        window_open = policy is None or in_window(policy.spec.windows, policy.spec.time_zone, self.now)
        if not w.slurm_known:
            for n in mine:
                self.r.projected[n.name] = n.record.state
            self.record_idle(kube, lending=set())
            return self.finish(selected, kube, problem, window_open)

        held: list[KubeNode] = []          # lending or lent, staying unless chosen below
        reclaiming: list[KubeNode] = []
        leaving: dict[str, str] = {}       # node -> reason, for held nodes reclaimed now
        by_name = {n.name: n for n in mine}
        for n in mine:
            rec = n.record
            if rec.state not in STATES:
                self.r.unknown_state.append(n.name)
                continue
            if rec.cluster != self.cluster_key:
                self.r.stale.append(n.name)
                self.r.projected[n.name] = rec.state
                continue
            if rec.state == RECLAIMING:
                reclaiming.append(n)
                continue
            # A policy problem (a typo in the partition or the selector, say)
            # must not take every lent node back at once: only failures and
            # pending pods do then.
            # A node whose owner withdrew it goes back whatever the policy says.
            reason = self.failure(n) or self.withdrawn(n) or (None if problem else self.must_go(n, window_open))
            if reason:
                leaving[n.name] = reason
            else:
                held.append(n)

        # Limits: too many lent, or too few left to Kubernetes. The cap holds
        # even with a policy problem (maxLentNodes: 0 takes every node back);
        # the minimum counts selected nodes, which a problem makes unreliable.
        held.sort(key=self.reclaim_order)
        if policy is not None:
            spec = policy.spec
            cap = spec.max_lent_nodes
            if cap is not None and len(held) > cap:
                for n in held[: len(held) - cap]:
                    leaving[n.name] = LIMITS
                held = held[len(held) - cap:]
        if policy is not None and problem is None:
            selected_names = {n.name for n in selected}
            returning = sum(1 for n in [*reclaiming, *(by_name[x] for x in leaving)] if n.name in selected_names)
            short = spec.min_kubernetes_nodes - len(kube) - returning
            if short > 0:
                for n in held[:short]:
                    leaving[n.name] = LIMITS
                held = held[short:]

        # Demand: pending GPU pods the Kubernetes nodes and the nodes on their
        # way back cannot take get as few more nodes as cover them.
        reserved: set[str] = set()
        unmet: list[KubePod] = []
        if policy is not None:
            reserved, unmet, chosen = self.cover_demand(
                kube, [*reclaiming, *(by_name[x] for x in leaving)], held)
            for n in chosen:
                leaving[n.name] = DEMAND
            held = [n for n in held if n.name not in leaving]

        for n in reclaiming:
            self.reclaim(n, entering=None)
        for n in mine:
            if n.name in leaving:
                self.reclaim(n, entering=leaving[n.name])
        for n in held:
            self.keep(n)

        ghosts = self.clean_ghosts(kube) if problem is None else set()
        lending: set[str] = set()
        if policy is not None and problem is None and window_open:
            # Nodes handed back this round serve Kubernetes from now on.
            returned = sum(1 for n in mine if self.r.projected.get(n.name, n.record.state) is None
                           and self.selects(n))
            lending = self.lend(kube, len(kube) + returned, held, reserved, unmet, ghosts)
        self.record_idle(kube, lending)
        return self.finish(selected, kube, problem, window_open)

    # -- policy-level problems --------------------------------------------------

    def problem(self, selected: list[KubeNode]) -> tuple[str, str] | None:
        policy = self.plan.policy
        assert policy is not None
        spec = policy.spec
        cluster = self.cluster
        if cluster is None:
            return ("ClusterNotFound",
                    f"SlurmCluster {self.plan.namespace}/{spec.cluster_ref.name} does not exist; create it, "
                    "or fix spec.clusterRef.name (the cluster must be in the policy's namespace)")
        parts = cluster.spec.partitions
        part = next((p for p in parts if p.name == spec.partition), None)
        if part is None:
            known = ", ".join(p.name for p in parts) or "(none)"
            return ("PartitionNotFound",
                    f"SlurmCluster {self.cluster_key} has no partition {spec.partition!r}; fix spec.partition "
                    f"(partitions: {known})")
        if not part.accept_lent_nodes:
            index = parts.index(part)
            return ("PartitionNotLendable",
                    f"partition {part.name!r} of SlurmCluster {self.cluster_key} does not accept lent nodes; "
                    f"set spec.partitions[{index}].acceptLentNodes: true on the SlurmCluster")
        if not selected:
            forbidden = sum(1 for n in self.w.observed.nodes
                            if n.gpus > 0 and spec.node_selector.matches(n.labels))
            if forbidden:
                return ("NoMatchingNodes",
                        f"spec.nodeSelector ({describe_selector(spec.node_selector)}) matches {forbidden} GPU "
                        f"node(s), but none is labelled {LENDABLE_TO_LABEL}={self.plan.namespace}: a cluster "
                        f"administrator labels the nodes this namespace may lend "
                        f"(kubectl label node <node> {LENDABLE_TO_LABEL}={self.plan.namespace})")
            return ("NoMatchingNodes",
                    f"no Node with allocatable nvidia.com/gpu and label {LENDABLE_TO_LABEL}={self.plan.namespace} "
                    f"matches spec.nodeSelector ({describe_selector(spec.node_selector)}); label the nodes to "
                    "lend, or fix the selector")
        if not self.w.slurm_known:
            return ("SlurmUnreachable",
                    f"Slurm of SlurmCluster {self.cluster_key} could not be read ({self.w.slurm_problem}); "
                    "nothing is lent or reclaimed until it can")
        return None

    # -- held nodes -------------------------------------------------------------

    def registered(self, node: KubeNode) -> bool:
        s = self.w.slurm_nodes.get(node.name)
        partition = self.plan.policy.spec.partition if self.plan.policy else node.record.partition
        return (s is not None and s.state in _SERVING and s.responding
                and partition in s.partitions)

    def lost(self, node: KubeNode) -> bool:
        """The node is gone for good, as far as anyone can tell: Kubernetes has
        reported it not Ready for the policy's notReadyTimeoutSeconds and
        Slurm reports it NOT_RESPONDING. Not knowing since when is not lost."""
        if node.ready or node.not_ready_since is None:
            return False
        snode = self.w.slurm_nodes.get(node.name)
        if snode is None or "NOT_RESPONDING" not in snode.flags:
            return False
        return self.now - node.not_ready_since >= timedelta(seconds=self.plan.reclaim.not_ready_timeout_seconds)

    def failure(self, node: KubeNode) -> str | None:
        """A reason to take the node back, or None: a failure (in FAILURES)
        leaves no time for a checkpoint; a node that is not Ready is given
        back gracefully (and set DOWN later if it is :meth:`lost`)."""
        rec = node.record
        if not node.ready:
            return NODE_NOT_READY
        pod = self.pod_of(node)
        snode = self.w.slurm_nodes.get(node.name)
        pod_gone = pod is None or pod.terminal or pod.deleting
        if rec.state == LENDING:
            if pod is not None and (pod.terminal or pod.deleting):
                return SLURMD_LOST
            if pod is None and snode is not None:
                return SLURMD_LOST
            since = rec.since or self.now
            if self.now - since > timedelta(seconds=self.plan.registration_timeout) and not self.registered(node):
                return REGISTRATION_TIMEOUT
            if pod is None and self.plan.policy is not None:
                try:
                    self.describe(node)
                except UnlendableNode:
                    return UNLENDABLE
            return None
        # lent
        if pod_gone:
            return SLURMD_LOST
        if snode is None:
            return SLURM_NODE_LOST
        if snode.state == "unknown":
            return None  # not answered yet (e.g. slurmctld restarted): no verdict
        if snode.state == "down" or "NOT_RESPONDING" in snode.flags:
            return SLURM_NODE_DOWN
        return None

    def selects(self, node: KubeNode) -> bool:
        """The policy may lend the node (its owner allows the namespace) and
        wants to: it has GPUs and matches the nodeSelector."""
        policy = self.plan.policy
        return (policy is not None and node.gpus > 0 and may_lend(policy.namespace, node.labels)
                and policy.spec.node_selector.matches(node.labels))

    def withdrawn(self, node: KubeNode) -> str | None:
        """The node's owner no longer lets the policy's namespace lend it."""
        if self.plan.policy is not None and not may_lend(self.plan.policy.namespace, node.labels):
            return WITHDRAWN
        return None

    def must_go(self, node: KubeNode, window_open: bool) -> str | None:
        """A reason to give the node back gracefully (signal, grace, jobAction), or None."""
        policy = self.plan.policy
        if policy is None:
            return POLICY_GONE
        if node.record.partition != policy.spec.partition:
            return PARTITION
        if not self.selects(node):
            return UNSELECTED
        if node.unschedulable:
            return CORDONED
        if not window_open:
            return WINDOW
        return None

    def keep(self, node: KubeNode) -> None:
        """A lending or lent node that stays: restore its taint, start its
        slurmd, or mark it lent once Slurm has it."""
        rec = node.record
        self.r.projected[node.name] = rec.state
        if rec.taint is None:
            self.emit(Taint(node.name, TAINT_KEY, self.cluster_name, TAINT_EFFECT))
        snode = self.w.slurm_nodes.get(node.name)
        if snode is not None and snode.drain_set and not snode.drain_is_ours:
            self.r.admin_drained.append(f"{node.name} ({snode.reason or 'no reason given'})")
        if rec.state == LENDING:
            pod = self.pod_of(node)
            if pod is None:
                self.emit(self.create_pod(node, self.describe(node)))
            elif pod.phase == "Running" and self.registered(node):
                self.emit(
                    SetLendingState(node.name, LENT, self.plan.key, self.cluster_key, rec.partition or "",
                                    self.now),
                    self.event(node.name, "Lent",
                               f"registered with Slurm in partition {rec.partition} of SlurmCluster "
                               f"{self.cluster_key}; taking jobs"),
                )
                self.r.projected[node.name] = LENT

    def reclaim(self, node: KubeNode, entering: str | None) -> None:
        """Move a node towards Kubernetes: drain, signal, wait for the grace
        period, requeue or cancel, then remove its Slurm node and slurmd pod
        and untaint it. ``entering``: the reason, when it starts now."""
        rec = node.record
        name = node.name
        reason = entering or rec.reason or "unknown"
        failure = reason in FAILURES
        spec = self.plan.reclaim
        snode = self.w.slurm_nodes.get(name)
        jobs = self.jobs_on(name)
        running = [j for j in jobs if j.state != "COMPLETING"]
        acts: list[Action] = []
        self.r.projected[name] = RECLAIMING
        if entering is not None:
            acts.append(SetLendingState(name, RECLAIMING, self.plan.key, self.cluster_key, rec.partition or "",
                                        self.now, reason=entering))
            what = f"taking the node back from Slurm: {REASONS.get(entering, entering)}"
            if running and not failure:
                what += (f"; {len(_job_ids(running))} job(s) get SIG{spec.signal} and "
                         f"{spec.grace_period_seconds}s to checkpoint, then are {spec.job_action}d")
            elif running:
                what += f"; its {len(_job_ids(running))} job(s) are {spec.job_action}d now"
            acts.append(self.event(name, "Reclaiming", what, warning=failure or reason == NODE_NOT_READY))
            if snode is not None and snode.drain_set and not snode.drain_is_ours:
                acts.append(self.event(
                    name, "AdminDrain",
                    f"Slurm node {name} was drained by someone else ({snode.reason or 'no reason'}); slurmk8s "
                    "leaves that drain alone and removes the node from Slurm once its jobs are gone",
                    warning=True))
        # The evacuation rule (slurmk8s.evacuation), with the record kept on the Node.
        policy = self.evacuation_policy(reason)
        evac = evacuate(name, snode, jobs, _evacuation_record(rec, entering, self.now), policy, self.now,
                        recorded=self.w.jobs_by_id(rec.signalled_jobs if entering is None else ()),
                        slurmd_gone=reason in SLURMD_GONE or self.lost(node))
        acts += self.evacuation_actions(name, evac, policy, rec if entering is None else None)
        if not evac.empty:
            self.emit(*acts)  # jobs are ending, or have their grace period: wait
            return
        # No job left: remove the Slurm node (Slurm refuses if one slipped in,
        # which stops this chain), then the pod, then hand the node back.
        if snode is not None:
            acts.append(DeleteSlurmNode(self.cluster_key, name))
        self.emit(*acts)
        self.hand_back(node)

    def evacuation_policy(self, reason: str) -> evacuation.Policy:
        """A graceful reclaim signals and gives the grace period; a failure
        leaves no time for a checkpoint: what runs is requeued (or cancelled) now."""
        spec = self.plan.reclaim
        failure = reason in FAILURES
        return evacuation.Policy(
            purpose=reason, drain_reason=f"reclaimed by Kubernetes ({reason})",
            signal=None if failure else spec.signal, grace_seconds=0 if failure else spec.grace_period_seconds,
            job_action=spec.job_action, retry_seconds=FORCE_RETRY_SECONDS)

    def evacuation_actions(self, name: str, evac: evacuation.Evacuation, policy: evacuation.Policy,
                           before: LendingRecord | None) -> list[Action]:
        """The rule's actions as the loop's, then the record's changes as Node
        annotations (``before``: the record on the Node; None when the
        reclaim starts this round)."""
        c = self.cluster_key
        acts: list[Action] = []
        new = evac.record
        signalled = new.signalled is not None and (before is None or before.signalled is None)
        for a in evac.actions:
            if signalled and isinstance(a, (evacuation.StartNow, evacuation.Requeue, evacuation.Cancel)):
                acts.append(RecordSignalled(name, new.signalled, new.jobs))
                signalled = False
            if isinstance(a, evacuation.Drain):
                acts.append(DrainSlurmNode(c, name, a.reason))
            elif isinstance(a, evacuation.SetDown):
                acts.append(DownSlurmNode(c, name, a.reason))
            elif isinstance(a, evacuation.Signal):
                acts.append(SignalJobs(c, name, a.job_ids, a.signal))
            elif isinstance(a, evacuation.StartNow):
                acts.append(StartJobsNow(c, name, a.job_ids))
            elif isinstance(a, evacuation.Requeue):
                acts.append(RequeueJobs(c, name, a.job_ids))
            elif isinstance(a, evacuation.Cancel):
                acts.append(CancelJobs(c, name, a.job_ids))
        if signalled:
            acts.append(RecordSignalled(name, new.signalled, new.jobs))
        if new.forced is not None and (before is None or before.forced != new.forced):
            requeued = sum(len(a.job_ids) for a in evac.actions if isinstance(a, evacuation.Requeue))
            cancelled = sum(len(a.job_ids) for a in evac.actions if isinstance(a, evacuation.Cancel))
            acts.append(RecordForced(name, new.forced))
            acts.append(self.event(name, "JobsForced", f"{requeued} job(s) requeued, {cancelled} cancelled" + (
                f" after the {policy.grace_seconds}s grace period" if policy.signal else "")))
        return acts

    def hand_back(self, node: KubeNode) -> None:
        pod = self.pod_of(node)
        acts: list[Action] = []
        if pod is not None and not pod.deleting:
            acts.append(DeleteSlurmdPod(pod.namespace, pod.name, node.name))
        if node.record.taint is not None:
            acts.append(Untaint(node.name, TAINT_KEY))
        acts.append(ClearLending(node.name))
        acts.append(self.event(node.name, "Returned", "the node serves Kubernetes again"))
        if self.w.idle(node.name) and self.selects(node):
            acts.append(RecordIdleSince(node.name, self.now))  # nothing left on it: idle from now
        self.emit(*acts)
        self.r.projected[node.name] = None

    def release_without_slurm(self, node: KubeNode) -> None:
        """The SlurmCluster is gone, and with it Slurm and every job."""
        if node.record.state != RECLAIMING:
            self.emit(
                SetLendingState(node.name, RECLAIMING, self.plan.key, self.cluster_key,
                                node.record.partition or "", self.now, reason=CLUSTER_GONE),
                self.event(node.name, "Reclaiming", f"taking the node back: {REASONS[CLUSTER_GONE]}",
                           warning=True),
            )
        self.hand_back(node)

    # -- demand ---------------------------------------------------------------

    def triggers(self, pod: KubePod) -> bool:
        spec = self.plan.reclaim
        if spec.pod_selector is None and spec.min_priority is None:
            return True
        if spec.pod_selector is not None and spec.pod_selector.matches(pod.labels):
            return True
        return spec.min_priority is not None and pod.priority >= spec.min_priority

    def cover_demand(self, kube: list[KubeNode], returning: list[KubeNode], held: list[KubeNode]):
        """Assign each triggering pending pod to a node that can take it: a free
        Kubernetes node, a node on its way back, or else the held node that is
        cheapest to give back. Returns (Kubernetes nodes reserved for pods,
        pods nothing can take, held nodes to reclaim)."""
        pods = sorted((p for p in self.w.pending if self.triggers(p)),
                      key=lambda p: (-p.gpus, -p.priority, p.namespace, p.name))
        if not pods:
            return set(), [], []
        # pool: free GPUs -> names of nodes that can take pods now or soon, in
        # name order (so a node handed back this round is treated as it will
        # be next round, as a Kubernetes node)
        pool: dict[int, list[str]] = defaultdict(list)
        nodes_by_name: dict[str, KubeNode] = {}

        def add(n: KubeNode, free: int) -> None:
            if free > 0:
                bisect.insort(pool[free], n.name)
                nodes_by_name[n.name] = n

        for n in kube:
            if n.ready and not n.unschedulable and n.record.taint is None:
                add(n, self.w.free_gpus(n))
        for n in returning:  # counted as they will be next round: selected nodes only
            if n.ready and not n.unschedulable and self.selects(n):
                add(n, self.w.free_gpus(n))
        candidates = [n for n in held if n.ready]  # held is in reclaim order
        kube_names = {n.name for n in kube}
        reserved: set[str] = set()
        unmet: list[KubePod] = []
        chosen: list[KubeNode] = []
        for pod in pods:
            need = pod.gpus
            placed = None
            for free in sorted(k for k in pool if k >= need and pool[k]):  # best fit first
                bucket = pool[free]
                for i, name in enumerate(bucket):
                    if _fits(pod, nodes_by_name[name]):
                        placed = nodes_by_name[name]
                        del bucket[i]
                        add(placed, free - need)
                        break
                if placed is not None:
                    break
            if placed is not None:
                if placed.name in kube_names:
                    reserved.add(placed.name)
                continue
            for i, n in enumerate(candidates):
                free = self.w.free_gpus(n)  # once the slurmd pod is gone
                if free >= need and _fits(pod, n):
                    placed = candidates.pop(i)
                    chosen.append(placed)
                    add(placed, free - need)
                    break
            if placed is None:
                unmet.append(pod)
        return reserved, unmet, chosen

    # -- Kubernetes nodes -----------------------------------------------------

    def describe(self, node: KubeNode):
        policy = self.plan.policy
        assert policy is not None
        return lent_node(self.cluster_name, node.name, node.allocatable, node.labels, policy.spec.partition)

    def create_pod(self, node: KubeNode, desc) -> CreateSlurmdPod:
        return CreateSlurmdPod(
            namespace=self.plan.namespace,
            name=slurmd_pod_name(self.cluster_name, node.name),
            node=node.name,
            slurm_node=desc.name,
            cluster=self.cluster_key,
            partition=desc.partition,
            conf=desc.conf,
            gres_conf=desc.gres_conf,
            gpus=desc.gpus,
            gpu_type=desc.gpu_type,
            memory_mib=desc.memory_mib,
            shm_size=self.plan.policy.spec.shm_size,
            labels={
                COMPONENT_LABEL: SLURMD_COMPONENT,
                "app.kubernetes.io/name": "slurm",
                "app.kubernetes.io/instance": self.cluster_name,
                "app.kubernetes.io/part-of": "slurmk8s",
                "slurmk8s.dev/cluster": self.cluster_name,
            },
        )

    def lend(self, kube: list[KubeNode], kube_count: int, held: list[KubeNode], reserved: set[str],
             unmet: list[KubePod], ghosts: set[str]) -> set[str]:
        policy = self.plan.policy
        assert policy is not None
        spec = policy.spec
        # Idle since a recorded time, and for at least a second: a node first
        # seen idle (or just handed back) is lent a round later at the earliest.
        idle_after = max(timedelta(seconds=spec.idle_after_seconds), timedelta(seconds=1))
        eligible: list[tuple[datetime, str, KubeNode]] = []
        for n in kube:
            if n.name in reserved or not n.ready or n.unschedulable or not self.w.idle(n.name):
                continue
            since = n.record.idle_since
            if since is None or self.now - since < idle_after:
                continue
            if n.record.taint is not None:
                self.r.blocked.append(f"{n.name} (carries the {TAINT_KEY} taint)")
                continue
            if n.name in self.w.slurm_nodes and n.name not in ghosts:
                self.r.blocked.append(f"{n.name} (Slurm already has a node of that name)")
                continue
            if any(pod.gpus <= self.w.free_gpus(n) and _fits(pod, n) for pod in unmet):
                continue  # a pending pod may still land here
            eligible.append((since, n.name, n))
        eligible.sort(key=lambda e: (e[0], e[1]))
        lent = len(held)
        kube_left = kube_count
        lending: set[str] = set()
        for since, _, n in eligible:
            if spec.max_lent_nodes is not None and lent >= spec.max_lent_nodes:
                break
            if kube_left - 1 < spec.min_kubernetes_nodes:
                break
            try:
                desc = self.describe(n)
            except UnlendableNode as exc:
                self.r.blocked.append(f"{n.name} ({exc})")
                continue
            self.emit(
                SetLendingState(n.name, LENDING, self.plan.key, self.cluster_key, spec.partition, self.now),
                Taint(n.name, TAINT_KEY, self.cluster_name, TAINT_EFFECT),
                self.create_pod(n, desc),
                self.event(n.name, "Lending",
                           f"idle since {_rfc3339(since)}: lending it to "
                           f"partition {spec.partition} of SlurmCluster {self.cluster_key} "
                           f"(NodeLendingPolicy {self.plan.key}); {desc.gpus} {desc.gpu_type} GPU(s)"),
            )
            self.r.projected[n.name] = LENDING
            lending.add(n.name)
            lent += 1
            kube_left -= 1
        return lending

    def record_idle(self, kube: list[KubeNode], lending: set[str]) -> None:
        for n in kube:
            if n.name not in lending and n.record.idle_since is None and self.w.idle(n.name):
                self.emit(RecordIdleSince(n.name, self.now))

    def clean_ghosts(self, kube: list[KubeNode]) -> set[str]:
        """A Slurm node left behind by a lent node that is Kubernetes' again
        (its slurmd registered while it was being given back): remove it once
        it has no job and no slurmd pod. Returns the nodes cleaned."""
        cleaned = set()
        for n in kube:
            s = self.w.slurm_nodes.get(n.name)
            if (s is None or self.jobs_on(n.name) or s.busy
                    or not any(f.startswith(LENT_PREFIX) for f in s.features)):
                continue
            if n.name not in self.w.slurmd_nodes:
                self.emit(DeleteSlurmNode(self.cluster_key, n.name))
                cleaned.add(n.name)
        return cleaned

    # -- status ---------------------------------------------------------------

    def finish(self, selected, kube, problem, window_open: bool) -> list[Action]:
        policy = self.plan.policy
        if policy is None:
            return self.r.actions
        counts = defaultdict(int)
        for state in self.r.projected.values():
            counts[state] += 1
        selected_names = {n.name for n in selected}
        kube_count = sum(1 for n in selected if self.r.projected.get(n.name, n.record.state) is None)
        holding = sorted(n for n, s in self.r.projected.items() if s is not None)
        status_counts = LendingCounts(selected=len(selected_names), kubernetes=kube_count,
                                      lending=counts[LENDING], lent=counts[LENT], reclaiming=counts[RECLAIMING])
        if problem is not None:
            ready, reason, message = "False", problem[0], problem[1]
            if holding and problem[0] != "SlurmUnreachable":
                message += (f". Nothing is lent meanwhile; the {len(holding)} node(s) this policy holds are "
                            "taken back only when they fail or pending pods need them (set maxLentNodes: 0 "
                            "or delete the policy to take them all back)")
        else:
            ready, reason = "True", "Lending"
            message = (f"{counts[LENT]} of {len(selected_names)} selected nodes lent to partition "
                       f"{policy.spec.partition} of SlurmCluster {self.cluster_key}")
            if counts[LENDING]:
                message += f"; {counts[LENDING]} starting"
            if counts[RECLAIMING]:
                message += f"; {counts[RECLAIMING]} being reclaimed"
            if not window_open:
                message += "; outside the lending windows, nothing is lent"
        extras = []
        if self.r.admin_drained:
            extras.append("drained by an administrator, left drained: " + _more(sorted(self.r.admin_drained)))
        if self.r.blocked:
            extras.append("cannot be lent: " + _more(sorted(self.r.blocked)))
        if self.r.stale:
            extras.append(f"still lent to another SlurmCluster, left alone until spec.clusterRef names it "
                          f"again: {_more(sorted(self.r.stale))}")
        if self.r.unknown_state:
            extras.append(f"unknown value of label slurmk8s.dev/lending, left alone: "
                          f"{_more(sorted(self.r.unknown_state))}")
        if extras:
            message += ". " + ". ".join(extras)
        return self.r.actions + self.status_action(policy.metadata.generation, ready, reason, message,
                                                   holding, status_counts, policy.status)

    def status_action(self, generation, ready, reason, message, holding, counts, old) -> list[Action]:
        return _status_actions(self.plan.namespace, self.plan.name, generation, ready, reason, message,
                               holding, counts, old, self.now)


def _evacuation_record(rec: LendingRecord, entering: str | None, now: datetime) -> evacuation.Record:
    """The evacuation's record as the Node keeps it: the reclaim reason, the
    time the node entered reclaiming, signalled (and which jobs), forced."""
    if entering is not None:
        return evacuation.Record(purpose=entering, started=now)
    return evacuation.Record(purpose=rec.reason or "unknown", started=rec.since or now, signalled=rec.signalled,
                             jobs=rec.signalled_jobs, forced=rec.forced)


def _status_actions(namespace, name, generation, ready, reason, message, holding, counts,
                    old: NodeLendingPolicyStatus | None, now: datetime) -> list[Action]:
    previous = next((c for c in (old.conditions if old else []) if c.type == "Ready"), None)
    since = (previous.last_transition_time
             if previous is not None and previous.status == ready and previous.last_transition_time
             else _rfc3339(now))
    status = NodeLendingPolicyStatus(
        conditions=[PolicyCondition(type="Ready", status=ready, reason=reason, message=message[:32768],
                                    last_transition_time=since, observed_generation=generation)],
        observed_generation=generation,
        lent_nodes=list(holding),
        counts=counts,
    )
    if old is not None and old == status:
        return []
    return [PolicyStatus(namespace, name, status)]


def _fits(pod: KubePod, node: KubeNode) -> bool:
    labels = node.labels
    return all(labels.get(k) == v for k, v in pod.node_selector.items())


def decide(observed: Observed, policy: NodeLendingPolicy | PolicyGone | InvalidPolicy,
           now: datetime) -> list[Action]:
    """The actions that move the policy's nodes along the lending state machine.

    ``policy`` is a valid :class:`NodeLendingPolicy`; a :class:`PolicyGone`
    for a policy that Nodes still name but that was deleted (its nodes are
    reclaimed); or an :class:`InvalidPolicy` (only its status is written).
    ``now`` is timezone-aware (naive means UTC).
    """
    now = _aware(now)
    if isinstance(policy, InvalidPolicy):
        message = "the policy is invalid and nothing is lent or reclaimed until it is fixed: " + "; ".join(
            policy.errors)
        old = policy.status
        counts = old.counts if old is not None else LendingCounts()
        holding = old.lent_nodes if old is not None else []
        return _status_actions(policy.namespace, policy.name, policy.generation, "False", "InvalidPolicy",
                               message, holding, counts, old, now)
    if isinstance(policy, PolicyGone):
        plan = _Plan(policy.key, policy.namespace, policy.name, None, DEFAULT_RECLAIM,
                     DEFAULT_REGISTRATION_TIMEOUT, cluster=policy.cluster)
    else:
        plan = _Plan(policy.key, policy.namespace, policy.name, policy, policy.spec.reclaim,
                     policy.spec.registration_timeout_seconds)
    return _Decider(_World(observed), plan, now).run()


def orphaned_policies(nodes: Iterable[KubeNode], existing: Iterable[str]) -> list[PolicyGone]:
    """Policies that Nodes still name but that no longer exist (``existing``:
    ``namespace/name`` of every NodeLendingPolicy), one per SlurmCluster their
    nodes were lent to: decide on each, with that cluster observed (or None
    when it is gone too), to take the nodes back."""
    alive = set(existing)
    gone = sorted({(n.record.policy, n.record.cluster) for n in nodes
                   if n.record.state is not None and n.record.policy and n.record.cluster
                   and n.record.policy not in alive})
    return [PolicyGone(*key.split("/", 1), cluster) for key, cluster in gone if "/" in key]


@dataclass(frozen=True)
class LendingMetrics:
    """GPU nodes by lending state, overall and per policy (for /metrics)."""

    #: kubernetes, lending, lent, reclaiming -> nodes
    by_state: dict[str, int]
    #: policy namespace/name -> state -> nodes (lending, lent, reclaiming)
    by_policy: dict[str, dict[str, int]]


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
        per = by_policy.setdefault(n.record.policy or "", {LENDING: 0, LENT: 0, RECLAIMING: 0})
        per[state] += 1
    return LendingMetrics(by_state, by_policy)
