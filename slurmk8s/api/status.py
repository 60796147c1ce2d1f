"""What the operator reports on a SlurmCluster (its status), and the
condition type the NodeLendingPolicy's status shares. Written by the
controllers, never by users; the CRD publishes it as the status subresource.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import ApiModel, list_map

__all__ = ["Condition", "NodeCounts", "SlurmClusterStatus"]


ConditionStatus = Literal["True", "False", "Unknown"]
Phase = Literal["Pending", "Provisioning", "Ready", "Degraded", "Deleting", "Failed"]


class Condition(ApiModel):
    """A status condition, as in Kubernetes' metav1.Condition."""

    type: str = Field(max_length=316)
    """Ready, or a part: StorageReady, ControllerReady, WorkersReady, LoginReady, RestApiReady, AccountingReady, DirectoryReady."""
    status: ConditionStatus
    """Whether the condition holds."""
    reason: str = Field("", max_length=1024)
    """One CamelCase word for the last transition."""
    message: str = Field("", max_length=32768)
    """What happened, for people."""
    last_transition_time: str | None = None
    """When status last changed (RFC 3339)."""
    observed_generation: int | None = None
    """The .metadata.generation the condition was computed for."""


class NodeCounts(ApiModel):
    total: int = 0
    """Slurm nodes registered."""
    idle: int = 0
    """Nodes without jobs."""
    mixed: int = 0
    """Nodes with jobs on part of their CPUs or GPUs."""
    allocated: int = 0
    """Fully allocated nodes."""
    drain: int = 0
    """Nodes draining or drained."""
    down: int = 0
    """Nodes down or not responding."""
    other: int = 0
    """Nodes in any other state (future, invalid, ...)."""


class SlurmClusterStatus(ApiModel):
    phase: Phase = "Pending"
    """Summary of the cluster's state."""
    conditions: list[Condition] = Field(default_factory=list, json_schema_extra=list_map("type"))
    """Ready, and one condition per component."""
    observed_generation: int | None = None
    """The .metadata.generation the operator last acted on."""
    node_counts: NodeCounts = NodeCounts()
    """Slurm nodes by state."""
    config_hash: str | None = None
    """Hash of the rendered Slurm config files currently applied."""
    slurm_version: str | None = None
    """The Slurm release the cluster runs (its slurmctld's), which a change of
    spec.slurm.version is judged against."""
    leader: str | None = None
    """The operator replica that leads and wrote this status: its identity
    in the Lease slurmk8s-operator (`<pod>_<suffix>`)."""
    site_checks: str | None = None
    """The ConfigMap of spec.healthCheck.siteChecks as the operator last
    found it labelled for that use (slurmk8s.dev/configmap-use=health-checks):
    lent slurmd pods mount it only while it is the one the spec names."""
