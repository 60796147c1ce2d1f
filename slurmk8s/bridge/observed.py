"""What ``decide`` is given: Nodes, Pods, the SlurmCluster and Slurm, as observed.

Slurm's part is :class:`slurmk8s.slurm.model.SlurmState`, the one record
the operator reads too.

Small frozen records, and pure parsers from the Kubernetes API's JSON
(``node_from_api``, ``pod_from_api``). The loop reads everything once per
round and passes it in; ``decide`` does no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any

from ..api.cluster import SlurmCluster
from ..api.fields import parse_quantity
from ..api.lending import NodeLendingPolicyStatus
from ..render.lent import GPU_RESOURCE
from ..render.slurmd import LENT_COMPONENT, LENT_MANAGER
from ..slurm.model import SlurmState
from .nodestate import LendingRecord, parse_time, unattributed

__all__ = [
    "NodeTaint", "KubeNode", "KubePod", "KubeBudget", "Observed", "PolicyGone", "Unattributed", "InvalidPolicy",
    "UnreadableCluster", "node_from_api", "pod_from_api", "budget_from_api", "gpu_count", "requested",
]

#: Pod phases of pods that hold no resources any more.
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True)
class NodeTaint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"


def gpu_count(resources: Mapping[str, Any]) -> int:
    """Whole nvidia.com/gpu in a resource list; 0 when absent or unreadable."""
    raw = resources.get(GPU_RESOURCE)
    if raw is None:
        return 0
    try:
        value = parse_quantity(str(raw))
    except (ValueError, KeyError):
        return 0
    return int(value) if 0 <= value < 1 << 20 else 0


def _amount(resources: Mapping[str, Any], key: str, scale: int) -> int:
    """``key`` of a resource list in units of 1/``scale`` (cpu in millicores:
    1000), rounded up; 0 when absent or unreadable."""
    raw = resources.get(key)
    if raw is None:
        return 0
    try:
        value = parse_quantity(str(raw)) * scale
    except (ValueError, KeyError):
        return 0
    return math.ceil(value) if 0 <= value < 1 << 62 else 0


def requested(spec: Mapping[str, Any], key: str, scale: int = 1) -> int:
    """What a pod requests of ``key`` (cpu, memory), as the scheduler counts
    it: the larger of its containers' sum and any one init container, each
    container's request being its limit where it gives no request, plus the
    pod's overhead. In units of 1/``scale``."""
    def one(c: Mapping[str, Any]) -> int:
        res = c.get("resources") or {}
        requests = res.get("requests") or {}
        return _amount(requests if key in requests else res.get("limits") or {}, key, scale)

    total = sum(one(c) for c in spec.get("containers") or [])
    total = max([total, *(one(c) for c in spec.get("initContainers") or [])])
    return total + _amount(spec.get("overhead") or {}, key, scale)


@dataclass(frozen=True)
class KubeNode:
    """A Kubernetes Node."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[NodeTaint, ...] = ()
    #: status.allocatable: cpu, memory, nvidia.com/gpu, ...
    allocatable: Mapping[str, str] = field(default_factory=dict)
    #: The Ready condition is True.
    ready: bool = True
    #: When the Ready condition last changed, while it is not True (None:
    #: Ready, or not known when).
    not_ready_since: datetime | None = None
    #: spec.unschedulable (cordoned).
    unschedulable: bool = False

    @cached_property
    def gpus(self) -> int:
        return gpu_count(self.allocatable)

    @cached_property
    def record(self) -> LendingRecord:
        return LendingRecord.read(self.labels, self.annotations, self.taints)


@dataclass(frozen=True)
class KubePod:
    """A Kubernetes Pod, as far as lending cares."""

    namespace: str
    name: str
    #: spec.nodeName; None while unscheduled.
    node: str | None = None
    #: Pending, Running, Succeeded, Failed or Unknown.
    phase: str = "Pending"
    #: nvidia.com/gpu the pod requests.
    gpus: int = 0
    #: cpu the pod requests, in millicores (:func:`requested`).
    cpu_millis: int = 0
    #: memory the pod requests, in bytes.
    memory: int = 0
    priority: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)
    #: Kind of the controlling owner (DaemonSet, ReplicaSet, Job, ...), if any.
    owner_kind: str | None = None
    #: metadata.deletionTimestamp is set.
    deleting: bool = False
    #: The scheduler could not place it (PodScheduled False, reason Unschedulable).
    unschedulable: bool = False
    #: spec.nodeSelector: a lent node can only serve the pod if it carries these labels.
    node_selector: Mapping[str, str] = field(default_factory=dict)
    #: metadata.uid (a lent pod's budget names it as its owner).
    uid: str = ""

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES


@dataclass(frozen=True)
class KubeBudget:
    """A PodDisruptionBudget, as far as lending cares: the bridge's own guard
    of a lent slurmd pod (``lent``: its component and manager labels say so)
    or any other."""

    namespace: str
    name: str
    lent: bool = False


@dataclass(frozen=True)
class UnreadableCluster:
    """A SlurmCluster the bridge could not load: it is invalid by the rule the
    operator judges it by (:func:`slurmk8s.api.load_cluster`, with the same
    trusted repositories), it carries a field this version does not know (a
    newer operator's status, say), or reading it failed. ``transient``: the
    read failed in a way that may pass by itself (the API server busy or
    unreachable); otherwise the cluster is lost to the bridge until it
    changes. Either way its Slurm is unknown and nothing is lent to it
    (decision record 46)."""

    #: namespace/name
    key: str
    #: What went wrong, for the policy's status.
    problem: str
    transient: bool = False


@dataclass(frozen=True)
class Observed:
    """One round's view of the world, for one policy."""

    nodes: tuple[KubeNode, ...]
    pods: tuple[KubePod, ...]
    #: The policy's SlurmCluster; None when the API server says there is
    #: none, or when it could not be loaded (then ``unreadable`` says why).
    cluster: SlurmCluster | None
    slurm: SlurmState
    #: Why the policy's SlurmCluster could not be loaded (``cluster`` is None then).
    unreadable: UnreadableCluster | None = None
    #: (namespace, name) of the lent pods' PodDisruptionBudgets that exist
    #: (:class:`KubeBudget` ``lent``); None: not observed, and the budget rule
    #: waits (:mod:`.budgets`).
    budgets: frozenset[tuple[str, str]] | None = None


@dataclass(frozen=True)
class PolicyGone:
    """A policy that Nodes still name (``slurmk8s.dev/lending-policy``) but that
    no longer exists: its nodes lent to ``cluster`` (``namespace/name``, from
    their ``slurmk8s.dev/lending-cluster``) are taken back with the default
    reclaim settings."""

    namespace: str
    name: str
    cluster: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Unattributed:
    """The holder of held nodes (the ``slurmk8s.dev/lending`` label, any
    value, or the ``slurmk8s.dev/lent`` taint) whose record does not name a
    policy and a SlurmCluster as ``<namespace>/<name>``: no policy holds
    them, so this one takes them back, with the default reclaim settings
    (decision record 46). ``cluster``: the SlurmCluster their record names,
    when it can be read (its Slurm is asked, as for a deleted policy's
    nodes); None: none can, and they go back without Slurm, by the reclaim
    deadline. ``namespaces``: where their lent slurmd pods may be looked for
    when ``cluster`` is None (those the bridge serves; empty: any)."""

    cluster: str | None = None
    namespaces: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """What the nodes' records say holds them (:attr:`LendingRecord.holder`)."""
        return unattributed(self.cluster)

    @property
    def namespace(self) -> str:
        return self.cluster.partition("/")[0] if self.cluster else ""

    @property
    def name(self) -> str:
        return self.key


@dataclass(frozen=True)
class InvalidPolicy:
    """A policy object that failed validation (``load_policy`` raised)."""

    namespace: str
    name: str
    errors: tuple[str, ...]
    generation: int | None = None
    status: NodeLendingPolicyStatus | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


# Parsers from the Kubernetes API's JSON (as `kubectl get -o json` prints it).


def node_from_api(obj: Mapping[str, Any]) -> KubeNode:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    ready_cond: Mapping[str, Any] = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {})
    ready = conditions.get("Ready") == "True"
    return KubeNode(
        name=meta["name"],
        labels=dict(meta.get("labels") or {}),
        annotations=dict(meta.get("annotations") or {}),
        taints=tuple(
            NodeTaint(t.get("key", ""), t.get("value") or "", t.get("effect", ""))
            for t in spec.get("taints") or []
        ),
        allocatable={k: str(v) for k, v in (status.get("allocatable") or {}).items()},
        ready=ready,
        not_ready_since=None if ready else parse_time(ready_cond.get("lastTransitionTime")),
        unschedulable=bool(spec.get("unschedulable", False)),
    )


def _container_gpus(container: Mapping[str, Any]) -> int:
    res = container.get("resources") or {}
    # Extended resources need requests == limits; either may be written.
    return max(gpu_count(res.get("requests") or {}), gpu_count(res.get("limits") or {}))


def _priority(value: Any) -> int:
    """spec.priority: an int32 as the API server keeps it; anything else is 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and -2**31 <= value < 2**31 else 0


def pod_from_api(obj: Mapping[str, Any]) -> KubePod:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    gpus = sum(_container_gpus(c) for c in spec.get("containers") or [])
    gpus = max([gpus, *(_container_gpus(c) for c in spec.get("initContainers") or [])])
    owner = next((o for o in meta.get("ownerReferences") or [] if o.get("controller")), None)
    scheduled: Mapping[str, Any] = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), {})
    return KubePod(
        namespace=meta.get("namespace", "default"),
        name=meta["name"],
        node=spec.get("nodeName") or None,
        phase=status.get("phase", "Pending"),
        gpus=gpus,
        cpu_millis=requested(spec, "cpu", 1000),
        memory=requested(spec, "memory"),
        priority=_priority(spec.get("priority")),
        labels=dict(meta.get("labels") or {}),
        owner_kind=owner.get("kind") if owner else None,
        deleting=bool(meta.get("deletionTimestamp")),
        unschedulable=scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable",
        node_selector=dict(spec.get("nodeSelector") or {}),
        uid=str(meta.get("uid") or ""),
    )


def budget_from_api(obj: Mapping[str, Any]) -> KubeBudget:
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    return KubeBudget(namespace=meta.get("namespace", "default"), name=meta["name"],
                      lent=(labels.get("app.kubernetes.io/component") == LENT_COMPONENT
                            and labels.get("app.kubernetes.io/managed-by") == LENT_MANAGER))
