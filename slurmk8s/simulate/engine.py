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
  applies its actions as the bridge's loop does (in order; a node's chain of
  actions stops at the first that fails). No lending rule is written here.
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
``queue_depth`` of them per pass), with backfill. With time limits equal to
the runtimes (``time_limits`` True, the default) it is EASY backfill: the
first job that cannot start gets a reservation at the earliest time enough
GPUs free up (counted in GPUs, not per node), and later jobs start now only
if they end before it or fit in GPUs it leaves spare. Without time limits
(``time_limits`` False) no reservation is in sight, and every later job that
fits starts.
Gang allocation: a job of at most a
node's GPUs goes on one node (best fit, Slurm's own nodes before lent
ones); a larger one on whole free nodes. Runtimes are the trace's, known
to the scheduler. A reclaim drains the node (no new jobs); signalled
checkpointing jobs write a checkpoint that takes ``checkpoint`` seconds; a
requeued job keeps the work up to a checkpoint that completed, loses the
rest (all of it without one), is COMPLETING for ``requeue`` seconds, goes
to the back of the queue (Slurm resets a requeued job's submit time), and pays ``restart`` seconds when it
starts again. A cancelled job is lost.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import Callable

from ..api.cluster import SlurmCluster, lent_nodeset
from ..api.lending import NodeLendingPolicy
from ..bridge import actions as A
from ..bridge.decide import decide
from ..bridge.nodestate import LENDING, RECLAIMING, TAINT_KEY
from ..bridge.observed import KubeNode, KubePod, Observed, SlurmState, pod_from_api
from ..bridge.patches import NODE_PATCH_ACTIONS, applied, node_patch
from ..render.manifests import lent_slurmd_pod
from ..slurm.model import DRAIN_PREFIX, Job, Node
from .traces import ServingPod, TrainingJob

__all__ = ["Shape", "Latencies", "Run", "Result", "simulate", "bridge_setup", "T0", "SERVING_NAMESPACE"]

#: The simulated clock's zero, as decide sees it (a Monday, midnight UTC; policies' windows are read against it).
T0 = datetime(2025, 1, 6, 0, 0, 0, tzinfo=timezone.utc)
SERVING_NAMESPACE = "serving"

# event kinds, in the order they are handled at one instant
_SUBMIT, _JOB_END, _COMPLETED, _POD_END, _POD_START, _POD_RUNNING, _REGISTERED, _SCHEDULABLE, _ORACLE, \
    _TICK, _ROUND = range(11)


@dataclass(frozen=True)
class Shape:
    """The cluster: ``nodes`` GPU nodes of ``gpus_per_node`` GPUs, the first
    ``slurm_nodes`` of them Slurm's own, the rest Kubernetes' (lendable)."""

    nodes: int
    gpus_per_node: int
    slurm_nodes: int

    @property
    def kube_nodes(self) -> int:
        return self.nodes - self.slurm_nodes


@dataclass(frozen=True)
class Latencies:
    """Seconds. Defaults: hack/bench_lending.py's medians on the sandbox
    (lend 0.89 s; reclaim of an idle node: schedulable 0.16 s, pod Running
    0.71 s; of a busy node 0.26 s / 0.84 s; resume 0.75 s)."""

    #: slurmd pod created -> its node registered in Slurm (measured: lend, 0.89 s)
    lend: float = 0.89
    #: node handed back (untainted) -> Kubernetes schedules pods on it (measured: idle node schedulable, 0.16 s)
    reclaim: float = 0.16
    #: serving pod bound -> Running (measured: pod Running 0.71 s - node schedulable 0.16 s)
    pod_start: float = 0.55
    #: a requeued or cancelled job ending -> its node empty (measured: busy 0.26 s - idle 0.16 s)
    requeue: float = 0.10
    #: a requeued job starting again -> doing work (measured: resume, 0.75 s)
    restart: float = 0.75
    #: a checkpointing job's signal -> its checkpoint written (a property of the jobs, not measured)
    checkpoint: float = 60.0
    #: a change the bridge watches -> its round (the watching bridge: 50 ms)
    round_delay: float = 0.05
    #: seconds between periodic rounds
    interval: float = 10.0


@dataclass
class Run:
    """One run's configuration."""

    name: str
    mode: str  # static, policy, oracle
    policy: NodeLendingPolicy | None = None


@dataclass
class Result:
    """What a run measured (see :mod:`.report` for the summary)."""

    name: str
    span: float
    shape: Shape
    #: per job started: seconds from submission to first start
    queueing: list[float] = field(default_factory=list)
    #: job id -> its queueing delay, for jobs started
    delay_of: dict[int, float] = field(default_factory=dict)
    #: per job not started by the end: seconds waited so far
    unstarted: list[float] = field(default_factory=list)
    #: per job completed: submission to completion
    jct: list[float] = field(default_factory=list)
    #: per serving pod: created -> Running (or -> deleted, if it never ran)
    serving_pending: list[float] = field(default_factory=list)
    gpu_seconds_serving: float = 0.0
    gpu_seconds_own: float = 0.0
    gpu_seconds_lent: float = 0.0
    lost_gpu_seconds: float = 0.0
    lends: int = 0
    reclaims: int = 0
    reclaim_reasons: dict[str, int] = field(default_factory=dict)
    requeued: int = 0
    cancelled: int = 0
    rounds: int = 0
    dropped_jobs: int = 0
    #: timeline: sample width (s) and per sample the mean GPUs in use by serving, own Slurm, lent; mean lent nodes
    sample: float = 0.0
    timeline: list[tuple[float, float, float, float]] = field(default_factory=list)


class _Job:
    __slots__ = ("id", "submit", "gpus", "remaining", "first_start", "state", "token", "alloc", "run_start",
                 "overhead", "signalled", "restarts", "record", "end", "lent_gpus")

    def __init__(self, j: TrainingJob):
        self.id, self.submit, self.gpus, self.remaining = j.id, j.submit, j.gpus, j.duration
        self.first_start: float | None = None
        self.state = "pending"
        self.token = 0
        self.alloc: list[tuple[str, int]] = []
        self.run_start = 0.0
        self.overhead = 0.0
        self.signalled: float | None = None
        self.restarts = 0
        self.record: Job | None = None
        self.end = 0.0
        self.lent_gpus = 0


class _SNode:
    """A Slurm node."""

    __slots__ = ("name", "lent", "free", "jobs", "drain", "down", "reason", "record", "oracle_index")

    def __init__(self, name: str, lent: bool, gpus: int):
        self.name, self.lent, self.free = name, lent, gpus
        self.jobs: dict[int, None] = {}
        self.drain = self.down = False
        self.reason = ""
        self.record: Node | None = None
        self.oracle_index = -1


class _Pod:
    __slots__ = ("i", "spec", "node", "bound", "running", "obj", "ended")

    def __init__(self, i: int, spec: ServingPod):
        self.i, self.spec = i, spec
        self.node: str | None = None
        self.bound = self.running = False
        self.obj: KubePod | None = None
        self.ended = False


class _Sim:
    def __init__(self, shape: Shape, jobs: list[TrainingJob], pods: list[ServingPod], span: float,
                 lat: Latencies, run: Run, cluster: SlurmCluster | None, labels: dict[str, str],
                 queue_depth: int, samples: int, progress: Callable[[float], None] | None,
                 time_limits: bool = True):
        self.shape, self.lat, self.cfg, self.span = shape, lat, run, span
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
        # Slurm
        self.jobs = [_Job(j) for j in jobs]
        self.queue: list[int] = []
        self.snodes: dict[str, _SNode] = {}
        #: usable nodes by (lent, free GPUs) -> names (dicts as ordered sets)
        self.buckets: dict[tuple[bool, int], dict[str, None]] = {
            (lent, f): {} for lent in (False, True) for f in range(self.G + 1)}
        self.free_total = 0
        self.running: dict[int, _Job] = {}
        self.active_records: dict[int, Job] = {}
        self.slurm_dirty = True
        self.slurm_state: SlurmState | None = None
        self.sched_needed = False
        self.gres = f"gpu:sim:{self.G}"
        for k in range(shape.slurm_nodes):
            self._add_snode(f"slurm-{k:04d}", lent=False)
        # Kubernetes
        self.knames = [f"gpu-{k:04d}" for k in range(shape.kube_nodes)]
        self.kindex = {n: k for k, n in enumerate(self.knames)}
        alloc = {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": str(self.G)}
        self.knodes = [KubeNode(name=n, labels=dict(labels), allocatable=alloc) for n in self.knames]
        self.nodes_tuple: tuple[KubeNode, ...] | None = None
        self.kfree = [self.G] * len(self.knames)  # GPUs not held by serving pods
        self.schedulable_at = [0.0] * len(self.knames)
        self.pods = [_Pod(i, p) for i, p in enumerate(pods)]
        self.pod_objs: dict[tuple[str, str], KubePod] = {}
        self.pods_tuple: tuple[KubePod, ...] | None = None
        self.pending: dict[int, None] = {}  # serving pods waiting, in creation order
        self.k8s_needed = False
        self.slurmd_template: dict[str, KubePod] = {}
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
        # oracle: serving GPU demand as a step function, and per Kubernetes node when serving wants it
        self.oracle_busy: list[list[tuple[float, float]]] = []
        self.oracle_starts: list[list[float]] = []

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
            self.push(due, _ROUND, self.round_token)

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

    # -- Slurm --------------------------------------------------------------

    def _usable(self, s: _SNode) -> bool:
        return not s.drain and not s.down

    def _set_free(self, s: _SNode, free: int) -> None:
        if self._usable(s):
            self.buckets[(s.lent, s.free)].pop(s.name, None)
            self.free_total += free - s.free
            self.buckets[(s.lent, free)][s.name] = None
        s.free = free
        s.record = None
        self.slurm_dirty = True

    def _add_snode(self, name: str, lent: bool) -> _SNode:
        s = _SNode(name, lent, self.G)
        self.snodes[name] = s
        self.buckets[(lent, self.G)][name] = None
        self.free_total += self.G
        self.slurm_dirty = True
        self.sched_needed = True
        if lent:
            self.lent_nodes += 1
        return s

    def _unusable(self, s: _SNode) -> None:
        """Drained or down: no new jobs."""
        if self._usable(s):
            self.buckets[(s.lent, s.free)].pop(s.name, None)
            self.free_total -= s.free

    def _remove_snode(self, s: _SNode) -> None:
        self._unusable(s)
        del self.snodes[s.name]
        self.slurm_dirty = True
        if s.lent:
            self.lent_nodes -= 1

    def _node_record(self, s: _SNode) -> Node:
        if s.record is None:
            if s.down:
                state = "down"
            elif s.free == self.G and not s.jobs:
                state = "idle"
            elif s.free == 0:
                state = "allocated"
            else:
                state = "mixed"
            flags = set()
            if s.drain:
                flags.add("DRAIN")
            if any(self.jobs[j].state == "completing" for j in s.jobs):
                flags.add("COMPLETING")
            s.record = Node(name=s.name, state=state, flags=frozenset(flags), reason=s.reason,
                            features=(lent_nodeset(self.partition),) if s.lent else (),
                            partitions=(self.partition,), cpus=64, alloc_cpus=0, gres=self.gres, address="")
        return s.record

    def _job_record(self, j: _Job) -> Job:
        if j.record is None:
            j.record = Job(job_id=j.id + 1, name=f"train-{j.id}", user="trace",
                           state="RUNNING" if j.state == "running" else "COMPLETING", partition=self.partition,
                           nodes=",".join(n for n, _ in j.alloc), requeue=True, restart_count=j.restarts, reason="")
        return j.record

    def observed_slurm(self) -> SlurmState:
        if self.slurm_dirty or self.slurm_state is None:
            self.slurm_state = SlurmState(True, tuple(self._node_record(s) for s in self.snodes.values()),
                                          tuple(self.active_records.values()))
            self.slurm_dirty = False
        return self.slurm_state

    def _place(self, j: _Job, end: float) -> list[tuple[str, int]] | None:
        G = self.G
        if j.gpus <= G:
            for lent in (False, True):
                for f in range(j.gpus, G + 1):
                    names = self.buckets[(lent, f)]
                    if not names:
                        continue
                    if self.mode == "oracle" and lent:
                        for name in names:
                            if self._oracle_free_until(self.snodes[name]) >= end:
                                return [(name, j.gpus)]
                        continue
                    return [(next(iter(names)), j.gpus)]
            return None
        need = math.ceil(j.gpus / G)
        chosen: list[str] = []
        for lent in (False, True):
            for name in self.buckets[(lent, G)]:
                if len(chosen) == need:
                    break
                if self.mode == "oracle" and lent and self._oracle_free_until(self.snodes[name]) < end:
                    continue
                chosen.append(name)
        if len(chosen) < need:
            return None
        left = j.gpus
        out = []
        for name in chosen:
            out.append((name, min(G, left)))
            left -= G
        return out

    def _reservation(self, need: int, free: int) -> tuple[float, int]:
        """EASY backfill's reservation for the first job that cannot start:
        when enough GPUs will be free, and how many are spare then."""
        ends = sorted((j.end, j.gpus) for j in self.running.values())
        acc = free
        for end, gpus in ends:
            acc += gpus
            if acc >= need:
                return end, acc - need
        return math.inf, 0

    def schedule(self) -> None:
        self.sched_needed = False
        if not self.queue or self.free_total <= 0:
            return
        t = self.t
        free = self.free_total
        shadow: float | None = None
        extra = 0
        started: list[int] = []
        for jid in self.queue[:self.queue_depth]:
            j = self.jobs[jid]
            runtime = (self.lat.restart if j.restarts else 0.0) + j.remaining
            end = t + runtime
            fits = j.gpus <= free
            if fits and shadow is not None and not (end <= shadow or j.gpus <= extra):
                continue
            alloc = self._place(j, end) if fits else None
            if alloc is None:
                if shadow is None and self.time_limits:
                    shadow, extra = self._reservation(j.gpus, free)
                continue
            if shadow is not None and end > shadow:
                extra -= j.gpus
            self._start(j, alloc, runtime)
            free = self.free_total
            started.append(jid)
            if free <= 0:
                break
        if started:
            gone = set(started)
            self.queue = [x for x in self.queue if x not in gone]

    def _start(self, j: _Job, alloc: list[tuple[str, int]], runtime: float) -> None:
        t = self.t
        self.advance(t)
        j.state = "running"
        j.alloc = alloc
        j.run_start = t
        j.overhead = self.lat.restart if j.restarts else 0.0
        j.signalled = None
        j.end = t + runtime
        j.token += 1
        j.record = None
        if j.first_start is None:
            j.first_start = t
            self.res.queueing.append(t - j.submit)
            self.res.delay_of[j.id] = t - j.submit
        lent = 0
        for name, g in alloc:
            s = self.snodes[name]
            s.jobs[j.id] = None
            self._set_free(s, s.free - g)
            if s.lent:
                lent += g
        j.lent_gpus = lent
        self.lent_gpus += lent
        self.own_gpus += j.gpus - lent
        self.running[j.id] = j
        self.active_records[j.id] = self._job_record(j)
        self.slurm_dirty = True
        self.push(j.end, _JOB_END, j.id, j.token)
        self.changed()

    def _stop_using(self, j: _Job) -> None:
        """The job stops using its GPUs (ended, or requeued): for the accounting."""
        self.advance(self.t)
        self.lent_gpus -= j.lent_gpus
        self.own_gpus -= j.gpus - j.lent_gpus
        j.lent_gpus = 0
        self.running.pop(j.id, None)

    def _release(self, j: _Job) -> None:
        for name, g in j.alloc:
            s = self.snodes.get(name)
            if s is not None:
                s.jobs.pop(j.id, None)
                self._set_free(s, s.free + g)
        j.alloc = []
        self.active_records.pop(j.id, None)
        self.slurm_dirty = True
        self.sched_needed = True
        self.changed()

    def job_end(self, jid: int, token: int) -> None:
        j = self.jobs[jid]
        if j.token != token or j.state != "running":
            return
        self._stop_using(j)
        j.state = "done"
        self.res.jct.append(self.t - j.submit)
        self._release(j)

    def end_job(self, jid: int, cancel: bool) -> None:
        """Requeue (or cancel) a running job: it loses the work since its last completed checkpoint."""
        j = self.jobs[jid]
        if j.state != "running":
            return
        t = self.t
        self._stop_using(j)
        done = min(max(0.0, t - j.run_start - j.overhead), j.remaining)
        saved = 0.0
        if not cancel and j.signalled is not None and t - j.signalled >= self.lat.checkpoint:
            saved = min(max(0.0, j.signalled - j.run_start - j.overhead), j.remaining)
        lost = (done if cancel else done - saved) + min(t - j.run_start, j.overhead)
        self.res.lost_gpu_seconds += lost * j.gpus
        j.remaining -= saved
        j.state = "cancelling" if cancel else "completing"
        j.token += 1
        j.record = None
        self.active_records[j.id] = self._job_record(j)
        for name, _ in j.alloc:
            s = self.snodes.get(name)
            if s is not None:
                s.record = None
        self.slurm_dirty = True
        if cancel:
            self.res.cancelled += 1
        else:
            self.res.requeued += 1
        self.push(t + self.lat.requeue, _COMPLETED, jid, j.token)
        self.changed()

    def completed(self, jid: int, token: int) -> None:
        j = self.jobs[jid]
        if j.token != token:
            return
        cancelled = j.state == "cancelling"
        self._release(j)
        if cancelled:
            j.state = "cancelled"
        else:
            j.state = "pending"
            j.restarts += 1
            j.record = None
            self.queue.append(jid)  # Slurm resets a requeued job's submit time: the back of the queue

    # -- Kubernetes ---------------------------------------------------------

    def observed_nodes(self) -> tuple[KubeNode, ...]:
        if self.nodes_tuple is None:
            self.nodes_tuple = tuple(self.knodes)
        return self.nodes_tuple

    def observed_pods(self) -> tuple[KubePod, ...]:
        if self.pods_tuple is None:
            self.pods_tuple = tuple(self.pod_objs.values())
        return self.pods_tuple

    def _set_pod(self, key: tuple[str, str], obj: KubePod | None) -> None:
        if obj is None:
            self.pod_objs.pop(key, None)
        else:
            self.pod_objs[key] = obj
        self.pods_tuple = None
        self.changed()

    def _schedulable(self, k: int) -> bool:
        n = self.knodes[k]
        return n.record.taint is None and not n.unschedulable and self.schedulable_at[k] <= self.t

    def _bind(self, p: _Pod) -> bool:
        best = None
        for k in range(len(self.knodes)):
            f = self.kfree[k]
            if f >= p.spec.gpus and (best is None or f < self.kfree[best]) and self._schedulable(k):
                best = k
                if f == p.spec.gpus:
                    break
        if best is None:
            return False
        self.advance(self.t)
        self.kfree[best] -= p.spec.gpus
        p.node = self.knames[best]
        p.bound = True
        self._set_pod(("serving", f"serve-{p.i}"),
                      KubePod(SERVING_NAMESPACE, f"serve-{p.i}", node=p.node, phase="Pending", gpus=p.spec.gpus,
                              owner_kind="ReplicaSet"))
        self.push(self.t + self.lat.pod_start, _POD_RUNNING, p.i)
        return True

    def pod_start(self, i: int) -> None:
        p = self.pods[i]
        if self.mode == "oracle":
            self.advance(self.t)
            self.serving_gpus += p.spec.gpus
            p.running = True
            self.res.serving_pending.append(0.0)
            return
        if not self.pending and self._bind(p):
            return
        self.pending[i] = None
        self._set_pod(("serving", f"serve-{i}"),
                      KubePod(SERVING_NAMESPACE, f"serve-{i}", phase="Pending", gpus=p.spec.gpus,
                              owner_kind="ReplicaSet", unschedulable=True))
        self.k8s_needed = True

    def pod_running(self, i: int) -> None:
        p = self.pods[i]
        if p.ended or not p.bound:
            return
        self.advance(self.t)
        p.running = True
        self.serving_gpus += p.spec.gpus
        self.res.serving_pending.append(self.t - p.spec.start)
        self._set_pod(("serving", f"serve-{i}"), replace(self.pod_objs[("serving", f"serve-{i}")], phase="Running"))

    def pod_end(self, i: int) -> None:
        p = self.pods[i]
        p.ended = True
        self.advance(self.t)
        if p.running:
            self.serving_gpus -= p.spec.gpus
        elif self.mode != "oracle":
            self.res.serving_pending.append(self.t - p.spec.start)
        if self.mode == "oracle":
            return
        self.pending.pop(i, None)
        if p.bound:
            self.kfree[self.kindex[p.node]] += p.spec.gpus
            self.k8s_needed = True
        self._set_pod(("serving", f"serve-{i}"), None)

    def bind_pending(self) -> None:
        self.k8s_needed = False
        for i in list(self.pending):
            if self._bind(self.pods[i]):
                del self.pending[i]

    # -- the bridge ---------------------------------------------------------

    def bridge_round(self) -> None:
        self.res.rounds += 1
        obs = Observed(self.observed_nodes(), self.observed_pods(), self.cluster, self.observed_slurm())
        acts = decide(obs, self.policy, T0 + timedelta(seconds=self.t))
        failed: set[str] = set()
        acted = False
        for a in acts:
            if isinstance(a, (A.Event, A.PolicyStatus)):
                continue
            node = A.node_of(a)
            if node in failed:
                continue
            acted = True
            if not self.apply(a):
                failed.add(node)
        if acted:
            self.streak += 1
            if self.streak < 3:
                self.changed()
        else:
            self.streak = 0

    def apply(self, a) -> bool:
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
                self.push(t + self.lat.reclaim, _SCHEDULABLE, k)
            self.changed()
            return True
        if isinstance(a, A.CreateSlurmdPod):
            pod = self._slurmd_pod(a)
            key = (pod.namespace, pod.name)
            if key not in self.pod_objs:
                self._set_pod(key, pod)
                self.push(t + self.lat.lend, _REGISTERED, a.node, pod)
            return True
        if isinstance(a, A.DeleteSlurmdPod):
            if (a.namespace, a.name) in self.pod_objs:
                self._set_pod((a.namespace, a.name), None)
            return True
        s = self.snodes.get(getattr(a, "node", ""))
        if isinstance(a, A.DrainSlurmNode):
            if s is None:
                return False
            if not s.drain:
                self._unusable(s)
                s.drain, s.reason, s.record = True, f"{DRAIN_PREFIX} {a.reason}", None
                self.slurm_dirty = True
                self.changed()
            return True
        if isinstance(a, A.DownSlurmNode):
            if s is None:
                return False
            self._unusable(s)
            s.down, s.reason, s.record = True, f"{DRAIN_PREFIX} {a.reason}", None
            self.slurm_dirty = True
            for jid in list(s.jobs):
                self.end_job(jid, cancel=False)
            self.changed()
            return True
        if isinstance(a, A.SignalJobs):
            for jid in a.job_ids:
                j = self.jobs[jid - 1]
                if j.state == "running" and j.signalled is None:
                    j.signalled = t
            return True
        if isinstance(a, (A.RequeueJobs, A.CancelJobs)):
            for jid in a.job_ids:
                self.end_job(jid - 1, cancel=isinstance(a, A.CancelJobs))
            return True
        if isinstance(a, A.StartJobsNow):
            return True  # a requeued job is eligible at once here
        if isinstance(a, A.DeleteSlurmNode):
            if s is None:
                return True
            if s.jobs:
                return False  # Slurm: Requested nodes are busy
            self._remove_snode(s)
            self.changed()
            return True
        raise TypeError(f"the simulator does not know the action {type(a).__name__}")

    def _slurmd_pod(self, a: A.CreateSlurmdPod) -> KubePod:
        """The lent slurmd pod as the loop has it rendered (the renderer is the one place it is made)."""
        pod = self.slurmd_template.get(a.node)
        if pod is None:
            node = self.knodes[self.kindex[a.node]]
            pod = pod_from_api(lent_slurmd_pod(self.cluster, "", node=a.node, allocatable=node.allocatable,
                                               labels=node.labels, partition=a.partition, shm_size=a.shm_size,
                                               taint_key=TAINT_KEY))
            self.slurmd_template[a.node] = pod
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

    # -- the oracle ---------------------------------------------------------

    def oracle_setup(self, pods: list[ServingPod]) -> None:
        """Serving's node demand D(t) = ceil(GPUs / G); node k serves while D > k."""
        steps: dict[float, int] = {}
        for p in pods:
            steps[p.start] = steps.get(p.start, 0) + p.gpus
            steps[p.end] = steps.get(p.end, 0) - p.gpus
        K = len(self.knames)
        busy: list[list[tuple[float, float]]] = [[] for _ in range(K)]
        opened: list[float | None] = [None] * K
        gpus = 0
        for t in sorted(steps):
            gpus += steps[t]
            d = min(K, math.ceil(gpus / self.G - 1e-9))
            for k in range(K):
                if k < d and opened[k] is None:
                    opened[k] = t
                elif k >= d and opened[k] is not None:
                    busy[k].append((opened[k], t))
                    opened[k] = None
            self.push(t, _ORACLE)
        for k in range(K):
            if opened[k] is not None:
                busy[k].append((opened[k], math.inf))
        self.oracle_busy = busy
        self.oracle_starts = [[a for a, _ in b] for b in busy]
        for k, name in enumerate(self.knames):
            s = self._add_snode(name, lent=True)
            s.oracle_index = k
        self.lent_nodes = 0

    def _oracle_free_until(self, s: _SNode) -> float:
        """Until when serving leaves this node alone (now: -inf if it serves now)."""
        k, t = s.oracle_index, self.t
        busy, starts = self.oracle_busy[k], self.oracle_starts[k]
        i = bisect_right(starts, t) - 1
        if i >= 0 and busy[i][1] > t:
            return -math.inf
        j = bisect_left(starts, t)
        if j < len(starts) and starts[j] == t:
            return -math.inf
        return starts[j] if j < len(starts) else math.inf

    def oracle_lent_nodes(self) -> None:
        self.advance(self.t)
        self.lent_nodes = sum(1 for n in self.knames if self.snodes[n].jobs)

    # -- the run ------------------------------------------------------------

    def run(self) -> Result:
        res = self.res
        biggest = self.shape.nodes * self.G  # a job no run could ever start is left out of every run
        for j in self.jobs:
            if j.gpus > biggest:
                res.dropped_jobs += 1
                j.state = "dropped"
                continue
            self.push(j.submit, _SUBMIT, j.id)
        for p in self.pods:
            if p.spec.start < self.span:
                self.push(p.spec.start, _POD_START, p.i)
                self.push(p.spec.end, _POD_END, p.i)
        if self.mode == "oracle":
            self.oracle_setup([p.spec for p in self.pods])
        if self.mode == "policy":
            k = 0
            while k * self.lat.interval < self.span:
                self.push(k * self.lat.interval, _TICK)
                k += 1
        elif self.progress is not None:
            for k in range(101):
                self.push(self.span * k / 100, _TICK)
        heap = self.heap
        while heap:
            t, kind, _, a, b = heapq.heappop(heap)
            if t >= self.span:
                break
            self.t = t
            if kind == _SUBMIT:
                self.queue.append(a)  # in (re)submission order
                self.sched_needed = True
            elif kind == _JOB_END:
                self.job_end(a, b)
            elif kind == _COMPLETED:
                self.completed(a, b)
            elif kind == _POD_START:
                self.pod_start(a)
            elif kind == _POD_END:
                self.pod_end(a)
            elif kind == _POD_RUNNING:
                self.pod_running(a)
            elif kind == _REGISTERED:
                self.registered(a, b)
            elif kind == _SCHEDULABLE:
                self.k8s_needed = True
            elif kind == _ORACLE:
                self.sched_needed = True
            elif kind == _TICK:
                if self.progress is not None:
                    self.progress(t)
                if self.mode == "policy":
                    self.bridge_round()
            elif kind == _ROUND:
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
             progress: Callable[[float], None] | None = None, time_limits: bool = True) -> Result:
    """Run one simulation (see the module's docstring)."""
    if run.mode == "policy" and (run.policy is None or cluster is None):
        raise ValueError("a policy run needs the policy and its SlurmCluster")
    sim = _Sim(shape, jobs, pods, span, latencies, run, cluster, dict(labels or {}), queue_depth, samples, progress,
               time_limits)
    return sim.run()


def bridge_setup(policy: NodeLendingPolicy, extra_labels: dict[str, str] | None = None
                 ) -> tuple[SlurmCluster, dict[str, str]]:
    """The SlurmCluster the policy lends to (its clusterRef, with the policy's
    partition taking lent nodes) and the labels of the simulated Kubernetes
    GPU nodes: what the policy's nodeSelector asks for (matchLabels, and the
    first value of each ``In``, ``Exists`` as ``true``), the owner's
    ``slurmk8s.dev/lendable-to`` naming the policy's namespace (decision
    record 15), a GPU product, and ``extra_labels``. Raises ValueError when
    the policy would select none of them."""
    from ..api import load_cluster
    from ..api.lending import may_lend

    spec = policy.spec
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
