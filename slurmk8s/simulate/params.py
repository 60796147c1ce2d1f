"""What a simulation run is given (:class:`Shape`, :class:`Latencies`,
:class:`Run`) and what it measures (:class:`Result`); the simulated clock's
zero and the kinds of events, in the order they are handled at one instant."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from ..api.lending import NodeLendingPolicy

#: The simulated clock's zero, as decide sees it (a Monday, midnight UTC; policies' windows are read against it).
T0 = datetime(2025, 1, 6, 0, 0, 0, tzinfo=UTC)
SERVING_NAMESPACE = "serving"

#: Event kinds, in the order they are handled at one instant.
SUBMIT, JOB_END, COMPLETED, POD_END, POD_START, POD_RUNNING, REGISTERED, SCHEDULABLE, ORACLE, \
    TICK, ROUND = range(11)



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
    #: of which, jobs that started on a lent node before it had a lending reservation
    lost_gpu_seconds_unreserved: float = 0.0
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
