"""The NodeLendingPolicy resource (group slurmk8s.dev, version v1alpha1).

A policy lends idle Kubernetes GPU nodes to one partition of a SlurmCluster in
its namespace, and says when Kubernetes takes them back and how Slurm jobs on
them are treated (signal, grace period, requeue or cancel). The bridge
(``slurmk8s.bridge``) acts on it; the CRD is generated from these models.

Which nodes a policy may lend is not the policy's to say: a Node must carry
the label ``slurmk8s.dev/lendable-to`` naming the policy's namespace
(:func:`may_lend`; decision record 15). Labelling Nodes takes a cluster
role, so a namespace's admin cannot lend nodes that belong to others.
"""

from __future__ import annotations

import zoneinfo
from collections.abc import Mapping
from typing import Annotated, Final, Literal

from pydantic import AfterValidator, Field

from .base import ApiModel, list_map
from .cluster import API_VERSION, GROUP, DnsSubdomain, ObjectMeta
from .fields import SLURM_SIGNALS as SIGNALS
from .fields import DnsLabel, PartitionName, Quantity, constrained, refuse
from .podtemplate import PodTemplate
from .scheduling import LabelSelector, LabelSelectorRequirement, describe_selector
from .status import Condition

__all__ = [
    "KIND", "PLURAL", "NodeLendingPolicy", "NodeLendingPolicySpec", "NodeLendingPolicyStatus",
    "LabelSelector", "LabelSelectorRequirement", "LendingWindow", "ReclaimSpec", "ClusterRef",
    "WEEKDAYS", "RECLAIM_SIGNALS", "describe_selector", "LENDABLE_TO_LABEL", "may_lend", "ForecastSpec",
    "DemandRecord", "ForecastBasis",
]

KIND: Final = "NodeLendingPolicy"
PLURAL = "nodelendingpolicies"

#: Signals a reclaim may send: those the Slurm facade sends, less the two a
#: job cannot catch (it would get no chance to write a checkpoint).
RECLAIM_SIGNALS = tuple(sorted(SIGNALS - {"KILL", "STOP"}))

#: The Node label that names the one namespace whose NodeLendingPolicies may
#: lend the node. Set by whoever may label Nodes (a cluster role); a node
#: without it is lent by no policy (decision record 15).
LENDABLE_TO_LABEL = f"{GROUP}/lendable-to"


def may_lend(namespace: str, labels: Mapping[str, str]) -> bool:
    """Whether a policy in ``namespace`` may lend a Node with ``labels``:
    the Node's owner named that namespace in its lendable-to label."""
    return labels.get(LENDABLE_TO_LABEL) == namespace


Weekday = Literal["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
#: Which answer a forecast gave (slurmk8s/bridge/forecast.py).
ForecastBasis = Literal["recent", "daily", "weekly"]
WEEKDAYS: tuple[Weekday, ...] = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")

ClockTime = Annotated[str, constrained(
    r"([01][0-9]|2[0-3]):[0-5][0-9]|24:00",
    "use a time of day as HH:MM from 00:00 to 24:00, e.g. 08:30",
    5,
    slurm=False,
)]


def _signal(value: str) -> str:
    if value not in RECLAIM_SIGNALS:
        hint = ""
        if value.upper().removeprefix("SIG") in RECLAIM_SIGNALS:
            hint = f"; write it as {value.upper().removeprefix('SIG')}"
        elif value.upper().removeprefix("SIG") in SIGNALS:
            hint = " (it cannot be caught, so jobs could not checkpoint)"
        raise refuse(value, f"is not a signal a reclaim sends{hint}; use one of {', '.join(RECLAIM_SIGNALS)}")
    return value


Signal = Annotated[str, AfterValidator(_signal), Field(json_schema_extra={"enum": list(RECLAIM_SIGNALS)})]


def _time_zone(value: str) -> str:
    if not value or "\n" in value or ".." in value or value.startswith("/") or len(value) > 64:
        raise refuse(value, "is not a time zone name; use an IANA name such as Europe/Berlin or UTC")
    try:
        zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise refuse(value, "is not a known time zone; use an IANA name such as Europe/Berlin or UTC") from None
    return value


TimeZone = Annotated[
    str,
    AfterValidator(_time_zone),
    Field(json_schema_extra={"pattern": r"^[A-Za-z0-9_+-]+(/[A-Za-z0-9_+-]+)*$", "maxLength": 64}),
]


class ClusterRef(ApiModel):
    name: DnsLabel
    """Name of the SlurmCluster, in the policy's namespace."""


class LendingWindow(ApiModel):
    """A time of the week when nodes may be lent."""

    days: list[Weekday] = Field(default_factory=lambda: list(WEEKDAYS), min_length=1, max_length=7)
    """Days the window starts on (Mon ... Sun); every day when unset."""
    start: ClockTime
    """Start, HH:MM in the policy's timeZone."""
    end: ClockTime
    """End, HH:MM. An end at or before start runs past midnight into the
    next day; 24:00 is midnight at the end of the day."""


class ReclaimSpec(ApiModel):
    pod_selector: LabelSelector | None = None
    """Pending, unschedulable pods that request nvidia.com/gpu and carry these
    labels make the bridge take lent nodes back. Without podSelector and
    minPriority, every such pod does."""
    min_priority: int | None = Field(None, ge=-2147483648, le=2000001000)
    """Pending GPU pods with at least this priority also trigger a reclaim
    (in addition to those podSelector picks)."""
    grace_period_seconds: int = Field(60, ge=0, le=86400)
    """Seconds a Slurm job on a reclaimed node gets after the signal to write
    a checkpoint, before jobAction is applied."""
    signal: Signal = "USR1"
    """Signal sent to the batch shell of each job on a reclaimed node, as
    `#SBATCH --signal=B:USR1@...` would: the job's cue to checkpoint."""
    job_action: Literal["requeue", "cancel"] = "requeue"
    """What happens to jobs still running when the grace period is over:
    requeue (eligible to start again at once, elsewhere) or cancel. Jobs
    submitted with --no-requeue are cancelled either way."""
    deadline_seconds: int = Field(600, ge=30, le=86400)
    """How long the borrower's Slurm has, after the grace period, to give a
    reclaimed node back. Past gracePeriodSeconds + deadlineSeconds since the
    reclaim began, the node goes back to Kubernetes whatever Slurm says, or
    if it does not answer at all: its slurmd pod is deleted, the node
    untainted, and its Slurm node set DOWN once Slurm answers again (which
    ends and requeues what still runs there)."""
    order: Literal["Cheapest", "FewestJobs"] = "Cheapest"
    """Which lent nodes go back first when some must: Cheapest takes idle
    nodes first, then those whose jobs would lose least (the fewest whole
    GPU-hours since each job's last checkpoint, or its start where no
    checkpoint is known), then those with the least time left to their time
    limits; FewestJobs takes the nodes with the fewest jobs first."""
    not_ready_timeout_seconds: int = Field(300, ge=0, le=86400)
    """How long Kubernetes must have reported a lent node not Ready (NotReady
    or Unknown) before the bridge sets its Slurm node DOWN, which ends its
    jobs at once; Slurm must also report the node NOT_RESPONDING. Until then
    a node that is not Ready is taken back gracefully (signal, grace period,
    jobAction), so that a brief blip does not end a job."""


class ForecastSpec(ApiModel):
    """Lend with foresight: the bridge records the serving demand it sees on
    the selected nodes (status.demand, five weeks) and forecasts from it how
    many nodes Kubernetes will want (decision record 40)."""

    quantile_percent: int = Field(95, ge=50, le=100)
    """Which quantile of the demand's past rises the forecast takes: higher
    keeps more nodes for Kubernetes and lends less."""
    headroom_seconds: int = Field(600, ge=0, le=86400)
    """Keep unlent the nodes Kubernetes is forecast to want within this long
    (at least minKubernetesNodes), and take lent nodes back, gracefully,
    when the forecast rises above the nodes it has. 0: no headroom beyond
    minKubernetesNodes. Pods beyond the forecast still take nodes back at
    once, as without a forecast."""
    reserve_seconds: int = Field(259200, ge=0, le=2592000)
    """Tell Slurm, up to this far ahead, when each lent node is forecast to
    be wanted back: a reservation on the node from then on, so that Slurm
    starts there only jobs whose time limit ends before it. A node not
    wanted within this long (or within as long as the demand record can
    tell yet) is reserved from then: no job longer than the forecast can see
    starts on a lent node. Moved as the forecast moves, removed before the
    node goes back. 0: no reservations."""
    seasonal_days: int = Field(7, ge=0, le=28)
    """Forecast also from what the same time of day looked like on each of
    this many past days (their quantilePercent-quantile, once three are
    recorded): the forecast is the higher of that and the recent peak plus
    its past rises, so that tomorrow evening's peak is kept for even while
    the night is quieter than usual. 0: no daily answer."""
    seasonal_weeks: int = Field(4, ge=0, le=4)
    """And from the same time of the week, this many weeks back (the highest
    of them): a peak one weekday has is kept for on that weekday. 0: no
    weekly answer."""


class NodeLendingPolicySpec(ApiModel):
    cluster_ref: ClusterRef
    """The SlurmCluster the nodes are lent to."""
    partition: PartitionName
    """Partition of that cluster the lent nodes join; it must have
    acceptLentNodes: true."""
    node_selector: LabelSelector
    """Kubernetes Nodes to lend, among those whose owner allows it: only
    Nodes labelled slurmk8s.dev/lendable-to=<this policy's namespace> (a
    cluster administrator sets it) and with allocatable nvidia.com/gpu are
    ever lent. The selector must ask for a label (matchLabels, In or
    Exists); an empty one, or one of NotIn and DoesNotExist alone, is
    refused."""
    idle_after_seconds: int = Field(120, ge=0, le=604800)
    """How long a node must have run no pod (other than DaemonSet pods) that
    requests nvidia.com/gpu before it is lent; with minFreeGpus, how long
    that many of its GPUs must have been free."""
    min_free_gpus: int | None = Field(None, ge=1, le=64)
    """Also lend nodes that run GPU pods: a node of which at least this many
    GPUs have been free for idleAfterSeconds is lent with what its pods
    leave (its free GPUs, and its allocatable cpu and memory less what its
    pods request), and its pods keep running. Unset: only nodes that run no
    GPU pod are lent."""
    min_kubernetes_nodes: int = Field(0, ge=0, le=100000)
    """Selected nodes always kept for Kubernetes, lent never."""
    max_lent_nodes: int | None = Field(None, ge=0, le=100000)
    """Most nodes lent at once; no limit when unset. 0 lends none (and takes
    lent nodes back)."""
    windows: list[LendingWindow] = Field(default_factory=list, max_length=64)
    """When lending is allowed; always when empty. Outside every window, lent
    nodes are taken back gracefully (signal, grace period, jobAction)."""
    time_zone: TimeZone = "UTC"
    """IANA time zone of the windows, e.g. Europe/Berlin."""
    shm_size: Quantity = "1Gi"
    """Size limit of /dev/shm in the lent slurmd pods (memory-backed, so it
    counts against their memory limit, the node's allocatable memory)."""
    registration_timeout_seconds: int = Field(600, ge=30, le=86400)
    """How long a node may take from lending to registering with Slurm (pulling
    the slurmd image included) before it is given back to Kubernetes."""
    reclaim: ReclaimSpec = ReclaimSpec()
    """Which pending pods take nodes back, and how Slurm jobs are treated."""
    forecast: ForecastSpec | None = None
    """Forecast serving demand from what the bridge saw: keep headroom for
    it and have Slurm start on lent nodes only jobs that end before the
    nodes are wanted back. Unset: lend every idle node, reclaim on demand."""
    pod_template: PodTemplate | None = None
    """How the site shapes the slurmd pods of the nodes this policy lends (as a
    node set's podTemplate, without affinity: a lent pod is bound to its node):
    e.g. runtimeClassName nvidia where the GPU Operator does not make the NVIDIA
    runtime containerd's default. Its mounts must stay apart from the
    cluster's shared storage. A change reaches the pods the bridge starts next."""


class PolicyCondition(Condition):
    type: str = Field(max_length=316)
    """Ready: the policy is valid, its cluster and partition accept lent
    nodes, its selector matches GPU nodes and Slurm answers."""


class LendingCounts(ApiModel):
    selected: int = 0
    """GPU nodes the nodeSelector matches."""
    kubernetes: int = 0
    """Selected nodes serving Kubernetes (not lent)."""
    lending: int = 0
    """Nodes whose slurmd is starting."""
    lent: int = 0
    """Nodes registered with Slurm and taking jobs."""
    reclaiming: int = 0
    """Nodes on their way back to Kubernetes."""


class DemandRecord(ApiModel):
    """The serving demand the bridge saw on the policy's nodes: the peak of
    each 15-minute bucket over the last five weeks, from start on, as
    varints in base64 (slurmk8s/bridge/forecast.py). Written by the bridge
    only."""

    start: str = Field(max_length=64)
    """When the first bucket starts (RFC 3339)."""
    peaks: str = Field("", max_length=16384)
    """The buckets' peaks, in nodes."""
    forecast_nodes: int | None = None
    """Nodes Kubernetes is forecast to want within forecast.headroomSeconds."""
    forecast_basis: ForecastBasis | None = None
    """Which answer gave forecastNodes: recent (the recent peak and the
    rises the record shows), daily (the same time of day on past days) or
    weekly (the same time of the week)."""


class NodeLendingPolicyStatus(ApiModel):
    conditions: list[PolicyCondition] = Field(
        default_factory=list,
        json_schema_extra=list_map("type"),
    )
    """Ready, with a reason and a message that says what to fix."""
    observed_generation: int | None = None
    """The .metadata.generation the bridge last acted on."""
    lent_nodes: list[str] = Field(default_factory=list)
    """Nodes this policy holds for Slurm (lending, lent or reclaiming), by name."""
    counts: LendingCounts = LendingCounts()
    """Nodes by lending state."""
    down_owed: list[str] = Field(default_factory=list)
    """Nodes Kubernetes took back past the reclaim deadline (reclaim.deadlineSeconds)
    whose Slurm node is still to be set DOWN, once Slurm answers again."""
    demand: DemandRecord | None = None
    """With spec.forecast: the serving demand seen, which the forecast reads."""


class PolicyMeta(ObjectMeta):
    """A SlurmCluster's metadata, but any DNS subdomain names a policy (a
    cluster's name prefixes its objects, so it must be a DNS label)."""

    name: DnsSubdomain
    """Policy name."""


class NodeLendingPolicy(ApiModel):
    """Lends idle Kubernetes GPU nodes to a partition of a SlurmCluster, and
    takes them back when Kubernetes workloads need them: signal, checkpoint,
    requeue, resume."""

    api_version: Literal["slurmk8s.dev/v1alpha1"] = Field(API_VERSION, alias="apiVersion")
    kind: Literal["NodeLendingPolicy"] = KIND
    metadata: PolicyMeta
    spec: NodeLendingPolicySpec
    status: NodeLendingPolicyStatus | None = None

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def namespace(self) -> str:
        return self.metadata.namespace

    @property
    def key(self) -> str:
        """``namespace/name``: how Nodes record which policy lent them."""
        return f"{self.namespace}/{self.name}"
