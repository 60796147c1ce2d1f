"""The discrete-event simulation: GPU nodes, Kubernetes serving pods, a Slurm queue, and the bridge's rounds.

A run is one of three modes on the same inputs:

- ``static``: the split as configured: Kubernetes keeps its nodes, Slurm its
  own; no bridge.
- ``policy``: the bridge lends and reclaims Kubernetes nodes. At every round
  the simulator builds what the bridge observes (the Kubernetes Nodes and
  Pods as :class:`~slurmk8s.bridge.observed.KubeNode` and
  :class:`~slurmk8s.bridge.observed.KubePod`, Slurm's nodes and jobs as
  :class:`~slurmk8s.slurm.model.Node` and :class:`~slurmk8s.slurm.model.Job`)
  and calls the bridge's own pure :func:`~slurmk8s.bridge.decide.decide`
  with the policy as :func:`~slurmk8s.api.load_policy` validated it, then
  runs its actions through the loop's one executor,
  :func:`slurmk8s.slurm.steps.execute`, and so by its failure rule (in
  order; a refused job is passed over; a node's chain of actions stops at
  the first that fails): Slurm's steps against the simulated Slurm as a
  :class:`~.slurmside.SimSlurm` (refused where Slurm refuses, by
  :mod:`.slurmrules`), the Kubernetes-side actions by :meth:`_Sim.apply`.
  No lending rule, and no rule of taking steps, is written here.
- ``oracle``: knows the future serving demand: a Kubernetes node is given to
  a Slurm job only when serving will not need it before the job ends, at no
  latency. Nothing is ever reclaimed and serving never waits: an upper
  bound for any policy.

**Rounds** follow the watching bridge (``slurmk8s bridge``, decision record
23): a round ``round_delay`` (50 ms) after any change the bridge observes
(a serving pod created, bound, running or ended; a Slurm job started,
ending or ended; a Slurm node registered, drained, down or removed; a Node
patched), another 50 ms after a round that acted (at most three in a row),
and a periodic round every ``interval`` seconds so that time-based rules
(idleAfterSeconds, the grace period, registration timeouts, windows) fire.
Every round calls ``decide``; none is skipped.

**Kubernetes**: a serving pod is bound, at once, to the Kubernetes node
with the fewest free GPUs that fit it (best fit) among nodes without the
lending taint; if none fits it is pending, marked Unschedulable (what
``decide`` counts as demand), and bound as soon as a node frees. It is
Running ``pod_start`` seconds after it is bound. A node handed back
(untainted) takes pods ``reclaim`` seconds later. The lent slurmd pod
registers its node with Slurm ``lend`` seconds after it is created.

**Slurm**: one partition, jobs in submission order (up to
``queue_depth`` of them per pass), with backfill. With time limits (a
job's ``limit``, else its runtime; ``time_limits`` True, the default) it is EASY backfill: the
first job that cannot start gets a reservation at the earliest time enough
GPUs free up (counted in GPUs, not per node), and later jobs start now only
if they end before it or fit in GPUs it leaves spare. Without time limits
(``time_limits`` False) no reservation is in sight, and every later job that
fits starts.
Gang allocation: a job of at most a
node's GPUs goes on one node (best fit, Slurm's own nodes before lent
ones); a larger one on whole free nodes. Runtimes are the trace's; the
scheduler plans with the time limits, as the job records' EndTime shows
them. A reclaim drains the node (no new jobs); signalled
checkpointing jobs write a checkpoint that takes ``checkpoint`` seconds; a
requeued job keeps the work up to a checkpoint that completed, loses the
rest (all of it without one), is COMPLETING for ``requeue`` seconds, goes
to the back of the queue (Slurm resets a requeued job's submit time), and pays ``restart`` seconds when it
starts again. A cancelled job is lost.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta

from ..api.cluster import SlurmCluster
from ..api.lending import NodeLendingPolicy
from ..bridge import actions as A
from ..bridge.decide import decide
from ..bridge.nodestate import LENDING, RECLAIMING, TAINT_KEY
from ..bridge.observed import KubePod, Observed, pod_from_api
from ..bridge.patches import NODE_PATCH_ACTIONS, applied, node_patch
from ..render.manifests import lent_slurmd_pod
from ..slurm import steps
from .kubeside import KubeSide
from .oracle import OracleSide
from .params import (
    COMPLETED,
    JOB_END,
    ORACLE,
    POD_END,
    POD_RUNNING,
    POD_START,
    REGISTERED,
    ROUND,
    SCHEDULABLE,
    SERVING_NAMESPACE,
    SUBMIT,
    T0,
    TICK,
    Latencies,
    Result,
    Run,
    Shape,
)
from .slurmside import SimSlurm, SlurmSide
from .traces import ServingPod, TrainingJob

#: What a round may take: Slurm's steps (through :class:`SimSlurm`) and the Kubernetes-side actions (:meth:`_Sim.apply`).
_TAKES = steps.STEPS + NODE_PATCH_ACTIONS + (A.CreateSlurmdPod, A.DeleteSlurmdPod)

__all__ = ["Shape", "Latencies", "Run", "Result", "simulate", "bridge_setup", "T0", "SERVING_NAMESPACE"]


class _Sim(SlurmSide, KubeSide, OracleSide):
    """One run's state: the clock and its events, the accounting, and the
    bridge's rounds here; the Slurm side (:mod:`.slurmside`), the Kubernetes
    side (:mod:`.kubeside`) and the oracle (:mod:`.oracle`) as mixins."""

    def __init__(self, shape: Shape, jobs: list[TrainingJob], pods: list[ServingPod], span: float,
                 lat: Latencies, run: Run, cluster: SlurmCluster | None, labels: dict[str, str],
                 queue_depth: int, samples: int, progress: Callable[[float], None] | None,
                 time_limits: bool = True, epoch: datetime = T0):
        self.shape, self.lat, self.cfg, self.span = shape, lat, run, span
        #: the wall-clock time of the trace's second 0 (the bridge's rounds read it; POSIX seconds below)
        self.epoch, self.epoch_s = epoch, epoch.timestamp()
        self.G = shape.gpus_per_node
        self.mode = run.mode
        self.policy = run.policy
        self.cluster = cluster
        self.partition = run.policy.spec.partition if run.policy else "gpu"
        self.queue_depth = queue_depth
        self.time_limits = time_limits
        self.progress = progress
        self.res = Result(run.name, span, shape)
        self.t = 0.0
        self.heap: list = []
        self.seq = 0
        # rounds
        self.round_token = 0
        self.round_at: float | None = None
        self.streak = 0
        # accounting
        self.serving_gpus = 0
        self.own_gpus = 0
        self.lent_gpus = 0
        self.lent_nodes = 0
        self.last = 0.0
        self.res.sample = max(span / max(samples, 1), 1.0)
        self.tl = [[0.0, 0.0, 0.0, 0.0] for _ in range(int(span / self.res.sample) + 1)]
        self._init_slurm(jobs)
        self._init_kube(pods, labels)
        self._init_oracle()
        self.slurm_control = SimSlurm(self)

    # -- events -------------------------------------------------------------

    def push(self, t: float, kind: int, a=None, b=None) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, kind, self.seq, a, b))

    def changed(self) -> None:
        """Something the bridge watches changed: a round 50 ms later."""
        if self.mode != "policy":
            return
        due = self.t + self.lat.round_delay
        if self.round_at is None or self.round_at > due:
            self.round_token += 1
            self.round_at = due
            self.push(due, ROUND, self.round_token)

    # -- accounting ---------------------------------------------------------

    def advance(self, t: float) -> None:
        t = min(t, self.span)
        if t <= self.last:
            return
        res = self.res
        s, o, l_, n = self.serving_gpus, self.own_gpus, self.lent_gpus, self.lent_nodes
        dt = t - self.last
        res.gpu_seconds_serving += s * dt
        res.gpu_seconds_own += o * dt
        res.gpu_seconds_lent += l_ * dt
        w = res.sample
        a = self.last
        k = int(a / w)
        last_row = len(self.tl) - 1
        while True:
            b = min(t, (k + 1) * w)
            d = b - a
            if d > 0:
                row = self.tl[min(k, last_row)]
                row[0] += s * d
                row[1] += o * d
                row[2] += l_ * d
                row[3] += n * d
            if b >= t:
                break
            a = b
            k += 1
        self.last = t

    # -- the bridge ---------------------------------------------------------

    def bridge_round(self) -> None:
        self.res.rounds += 1
        assert self.policy is not None  # rounds run in policy mode only, which has a policy
        obs = Observed(self.observed_nodes(), self.observed_pods(), self.cluster, self.observed_slurm())
        acts = []
        for a in decide(obs, self.policy, self.epoch + timedelta(seconds=self.t)):
            if isinstance(a, A.PolicyStatus):  # the bridge reads its status back next round (status.demand)
                self.policy = self.policy.model_copy(update={"status": a.status})
            elif not isinstance(a, A.Event):
                acts.append(a)
        if not acts:
            self.streak = 0
            return
        for a in acts:  # an action the simulator cannot take is its own bug, not a failed step
            if not isinstance(a, _TAKES):
                raise TypeError(f"the simulator does not know the action {type(a).__name__}")
        # Every action was tried or skipped by the failure rule: the round acted.
        steps.execute(self.slurm_control, acts, other=self.apply, chain=A.node_of)
        self.streak += 1
        if self.streak < 3:
            self.changed()

    def apply(self, a) -> None:
        """A Kubernetes-side action: a Node patch or the lent slurmd pod (Slurm's steps go to :class:`SimSlurm`)."""
        t = self.t
        if isinstance(a, NODE_PATCH_ACTIONS):
            k = self.kindex[a.node]
            before = self.knodes[k]
            self.knodes[k] = node = applied(before, node_patch(a, before))
            self.nodes_tuple = None
            if isinstance(a, A.SetLendingState):
                if a.state == LENDING:
                    self.res.lends += 1
                elif a.state == RECLAIMING:
                    self.res.reclaims += 1
                    why = a.reason or "unknown"
                    self.res.reclaim_reasons[why] = self.res.reclaim_reasons.get(why, 0) + 1
            if before.record.taint is not None and node.record.taint is None:
                self.schedulable_at[k] = t + self.lat.reclaim
                self.push(t + self.lat.reclaim, SCHEDULABLE, k)
            self.changed()
        elif isinstance(a, A.CreateSlurmdPod):
            pod = self._slurmd_pod(a)
            key = (pod.namespace, pod.name)
            if key not in self.pod_objs:
                self._set_pod(key, pod)
                self.push(t + self.lat.lend, REGISTERED, a.node, pod)
        elif isinstance(a, A.DeleteSlurmdPod):
            if (a.namespace, a.name) in self.pod_objs:
                self._set_pod((a.namespace, a.name), None)

    def _slurmd_pod(self, a: A.CreateSlurmdPod) -> KubePod:
        """The lent slurmd pod as the loop has it rendered (the renderer is the one place it is made)."""
        pod = self.slurmd_template.get((a.node, a.resources))
        if pod is None:
            assert self.cluster is not None  # a policy run's: lent slurmd pods are the bridge's, in policy runs
            node = self.knodes[self.kindex[a.node]]
            pod = pod_from_api(lent_slurmd_pod(self.cluster, "", node=a.node, resources=dict(a.resources),
                                               labels=node.labels, partition=a.partition, shm_size=a.shm_size,
                                               taint_key=TAINT_KEY, grace_seconds=a.grace_seconds,
                                               pod_template=a.pod_template))
            self.slurmd_template[a.node, a.resources] = pod
        return pod

    def registered(self, node: str, pod: KubePod) -> None:
        key = (pod.namespace, pod.name)
        if self.pod_objs.get(key) is not pod:
            return  # deleted (or replaced) before it registered
        self._set_pod(key, replace(pod, phase="Running"))
        if node not in self.snodes:
            self.advance(self.t)
            self._add_snode(node, lent=True)
            self.changed()

    # -- the run ------------------------------------------------------------

    def run(self) -> Result:
        res = self.res
        biggest = self.shape.nodes * self.G  # a job no run could ever start is left out of every run
        for j in self.jobs:
            if j.gpus > biggest:
                res.dropped_jobs += 1
                j.state = "dropped"
                continue
            self.push(j.submit, SUBMIT, j.id)
        for p in self.pods:
            if p.spec.start < self.span:
                self.push(p.spec.start, POD_START, p.i)
                self.push(p.spec.end, POD_END, p.i)
        if self.mode == "oracle":
            self.oracle_setup([p.spec for p in self.pods])
        if self.mode == "policy":
            k = 0
            while k * self.lat.interval < self.span:
                self.push(k * self.lat.interval, TICK)
                k += 1
        elif self.progress is not None:
            for k in range(101):
                self.push(self.span * k / 100, TICK)
        heap = self.heap
        while heap:
            t, kind, _, a, b = heapq.heappop(heap)
            if t >= self.span:
                break
            self.t = t
            if kind == SUBMIT:
                self.queue.append(a)  # in (re)submission order
                self.sched_needed = True
            elif kind == JOB_END:
                self.job_end(a, b)
            elif kind == COMPLETED:
                self.completed(a, b)
            elif kind == POD_START:
                self.pod_start(a)
            elif kind == POD_END:
                self.pod_end(a)
            elif kind == POD_RUNNING:
                self.pod_running(a)
            elif kind == REGISTERED:
                self.registered(a, b)
            elif kind == SCHEDULABLE:
                self.k8s_needed = True
            elif kind == ORACLE:
                self.sched_needed = True
            elif kind == TICK:
                if self.progress is not None:
                    self.progress(t)
                if self.mode == "policy":
                    self.bridge_round()
            elif kind == ROUND:
                if a == self.round_token:
                    self.round_at = None
                    self.bridge_round()
            if not heap or heap[0][0] > t:
                if self.k8s_needed:
                    self.bind_pending()
                if self.sched_needed:
                    self.schedule()
                    if self.mode == "oracle":
                        self.oracle_lent_nodes()
        self.t = self.span
        self.advance(self.span)
        if self.progress is not None:
            self.progress(self.span)
        for j in self.jobs:
            if j.first_start is None and j.state == "pending" and j.submit < self.span:
                res.unstarted.append(self.span - j.submit)
        for i in self.pending:
            res.serving_pending.append(self.span - self.pods[i].spec.start)
        w = res.sample
        res.timeline = [(r[0] / w, r[1] / w, r[2] / w, r[3] / w) for r in self.tl]
        return res


def simulate(shape: Shape, jobs: list[TrainingJob], pods: list[ServingPod], span: float, run: Run,
             cluster: SlurmCluster | None = None, labels: dict[str, str] | None = None,
             latencies: Latencies = Latencies(), queue_depth: int = 100, samples: int = 500,
             progress: Callable[[float], None] | None = None, time_limits: bool = True,
             epoch: datetime = T0) -> Result:
    """Run one simulation (see the module's docstring). ``epoch``: the wall-clock
    time of the trace's second 0 (a fixed Monday by default; a policy's
    forecast reads its record by the clock, so a run that replays what
    happened gives the time it began)."""
    if run.mode == "policy" and (run.policy is None or cluster is None):
        raise ValueError("a policy run needs the policy and its SlurmCluster")
    short = next((j for j in jobs if j.limit is not None and j.limit < j.duration), None)
    if short is not None:
        raise ValueError(f"training job {short.id}: its time limit ({short.limit:g} s) is shorter than its duration "
                         f"({short.duration:g} s); Slurm would end it at its limit, which is not simulated")
    sim = _Sim(shape, jobs, pods, span, latencies, run, cluster, dict(labels or {}), queue_depth, samples, progress,
               time_limits, epoch)
    return sim.run()


def bridge_setup(policy: NodeLendingPolicy, extra_labels: dict[str, str] | None = None
                 ) -> tuple[SlurmCluster, dict[str, str]]:
    """The SlurmCluster the policy lends to (its clusterRef, with the policy's
    partition taking lent nodes) and the labels of the simulated Kubernetes
    GPU nodes: what the policy's nodeSelector asks for (matchLabels, and the
    first value of each ``In``, ``Exists`` as ``true``), the owner's
    ``slurmk8s.dev/lendable-to`` naming the policy's namespace (decision
    record 15), a GPU product, and ``extra_labels``. Raises ValueError when
    the policy would select none of them, or lends parts of nodes
    (``minFreeGpus``), which the simulator does not model."""
    from ..api import load_cluster
    from ..api.lending import may_lend

    spec = policy.spec
    if spec.min_free_gpus is not None:
        # Its Slurm side has nodes of one size: a node lent beside serving pods
        # would be counted whole.
        raise ValueError(f"NodeLendingPolicy {policy.namespace}/{policy.name}: spec.minFreeGpus is not simulated "
                         "(the simulator lends whole nodes only); remove it to simulate the policy's other settings")
    cluster = load_cluster({
        "apiVersion": "slurmk8s.dev/v1alpha1", "kind": "SlurmCluster",
        "metadata": {"name": spec.cluster_ref.name, "namespace": policy.namespace},
        "spec": {"partitions": [{"name": spec.partition, "acceptLentNodes": True}]},
    })
    sel = spec.node_selector
    labels = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB", "slurmk8s.dev/lendable-to": policy.namespace,
              **sel.match_labels}
    for req in sel.match_expressions:
        if req.operator == "In" and req.values:
            labels.setdefault(req.key, req.values[0])
        elif req.operator == "Exists":
            labels.setdefault(req.key, "true")
    labels.update(extra_labels or {})
    if not (sel.matches(labels) and may_lend(policy.namespace, labels)):
        raise ValueError(f"NodeLendingPolicy {policy.namespace}/{policy.name}: its spec.nodeSelector selects none "
                         f"of the simulated nodes (labels {labels}); give the labels it needs with --node-label KEY=VALUE")
    return cluster, labels
