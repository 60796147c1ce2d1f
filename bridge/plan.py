"""What one decision knows and gathers: the policy's settings and the round's facts. Pure.

:class:`Plan` is the policy as the rules read it (or the defaults for a
policy that is gone), with the SlurmCluster it lends to and the clock;
:class:`Round` collects the actions and the facts the status reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from ..api.cluster import SlurmCluster
from ..api.lending import NodeLendingPolicy, ReclaimSpec, may_lend
from ..render.lent import LentNode, lent_node
from .actions import Action
from .observed import KubeNode

__all__ = ["Plan", "Round"]


@dataclass(frozen=True)
class Plan:
    """The policy's settings, or the defaults for a policy that is gone."""

    key: str
    namespace: str
    name: str
    policy: NodeLendingPolicy | None
    reclaim: ReclaimSpec
    registration_timeout: int
    #: The policy's SlurmCluster as observed; None when it does not exist.
    cluster: SlurmCluster | None
    #: namespace/name and name of the SlurmCluster the nodes are lent to.
    cluster_key: str
    cluster_name: str
    now: datetime

    def selects(self, node: KubeNode) -> bool:
        """The policy may lend the node (its owner allows the namespace) and
        wants to: it has GPUs and matches the nodeSelector."""
        policy = self.policy
        return (policy is not None and node.gpus > 0 and may_lend(policy.namespace, node.labels)
                and policy.spec.node_selector.matches(node.labels))

    def describe(self, node: KubeNode) -> LentNode:
        """The node as Slurm will see it; raises ``UnlendableNode``."""
        assert self.policy is not None
        return lent_node(self.cluster_name, node.name, node.allocatable, node.labels, self.policy.spec.partition)


@dataclass
class Round:
    """The actions decided so far, and the facts gathered for the status."""

    actions: list[Action] = field(default_factory=list)
    #: node name -> its state once this round's actions are applied (None: Kubernetes)
    projected: dict[str, str | None] = field(default_factory=dict)
    admin_drained: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    unknown_state: list[str] = field(default_factory=list)

    def emit(self, *actions: Action) -> None:
        self.actions.extend(actions)
