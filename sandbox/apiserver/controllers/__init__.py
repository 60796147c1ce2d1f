"""Controllers inside the stand-in: what Kubernetes' controller manager and
scheduler would do for the objects slurmk8s uses. No kubelet runs in it: pods
stay Pending (scheduled) until a kubelet (the sandbox's ``sandbox/kubelet.py``,
or a test acting as one) reports their status through the API."""

from __future__ import annotations

from .aggregation import ClusterRoleAggregation
from .base import Controller, Manager
from .cluster import DisruptionBudgets, Endpoints, ResourceQuotas
from .deployment import Deployments, ReplicaSets
from .lifecycle import CRDCleanup, GarbageCollector, Namespaces, PodGC
from .scheduler import Scheduler, TaintEviction
from .statefulset import StatefulSets
from .volumes import PersistentVolumes

ALL: list[type[Controller]] = [
    Namespaces,
    GarbageCollector,
    CRDCleanup,
    PodGC,
    PersistentVolumes,
    StatefulSets,
    Deployments,
    ReplicaSets,
    Scheduler,
    TaintEviction,
    Endpoints,
    DisruptionBudgets,
    ResourceQuotas,
    ClusterRoleAggregation,
]

__all__ = ["ALL", "Controller", "Manager"]
