"""What one decision knows and gathers: the policy's settings and the round's facts. Pure.

:class:`Settings` is the policy as the rules read it (or the defaults for a
policy that is gone), with the SlurmCluster it lends to and the clock;
:class:`Round` collects the actions and the facts the status reports.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from itertools import compress
from typing import cast

from ..api.cluster import SlurmCluster
from ..api.lending import NodeLendingPolicy, ReclaimSpec, may_lend
from ..render.lent import LentNode, lent_node
from .actions import Action
from .memo import Recent, changed_spans, respliced
from .nodestate import LendingRecord
from .observed import KubeNode, Unattributed, UnreadableCluster
from .reasons import POLICY_GONE, RECORD_UNREADABLE

__all__ = ["Settings", "Round"]


@dataclass(frozen=True)
class Settings:
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
    #: Why the SlurmCluster could not be loaded (``cluster`` is None then).
    unreadable: UnreadableCluster | None = None
    #: The round is for the held nodes no policy can be told for.
    unattributed: Unattributed | None = None

    @property
    def gone_reason(self) -> str:
        """Why a node held without a policy (``policy`` is None) goes back."""
        return RECORD_UNREADABLE if self.unattributed is not None else POLICY_GONE

    def owner(self, record: LendingRecord) -> tuple[str, str]:
        """The policy and SlurmCluster a node's record is to name when this
        round changes its state: this policy's, or, for a node no policy can
        be told for, what it named (so that it stays unattributed)."""
        if self.unattributed is not None:
            return record.policy or "", record.cluster or ""
        return self.key, self.cluster_key

    @property
    def cluster_lost(self) -> bool:
        """The policy's SlurmCluster is gone or cannot be loaded, and not
        because of a read that may pass by itself: its Slurm is unknown, and
        the nodes lent to it go back (decision record 46)."""
        return self.cluster is None and (self.unreadable is None or not self.unreadable.transient)

    def selects(self, node: KubeNode) -> bool:
        """The policy may lend the node (its owner allows the namespace) and
        wants to: it has GPUs and matches the nodeSelector."""
        return (self.policy is not None and node.gpus > 0 and may_lend(self.namespace, node.labels)
                and self._matches(node.labels))

    def select(self, nodes: Sequence[KubeNode]) -> list[KubeNode]:
        """The nodes the policy selects, in order. Remembered for the nodes
        observed last under the same namespace and selector: only the nodes
        that changed since are asked again (:mod:`.memo`)."""
        if self.policy is None:
            return []
        key = (self.namespace, self.policy.spec.node_selector.model_dump_json())
        last = _SELECTIONS.latest(key)
        if last is not None and last[0] is nodes:
            flags = last[1]
        else:
            spans = None if last is None else changed_spans(cast("Sequence[KubeNode]", last[0]), nodes,
                                                               max(len(nodes) // 4, 16))  # put() with nodes below
            if last is not None and spans is not None:
                flags = respliced(last[1], spans, nodes, self.selects)
            else:
                flags = [self.selects(n) for n in nodes]
            _SELECTIONS.put(nodes, flags, key)
        return list(compress(nodes, flags))

    @cached_property
    def _matches(self) -> Callable[[Mapping[str, str]], bool]:
        assert self.policy is not None
        return self.policy.spec.node_selector.matches

    @property
    def min_free_gpus(self) -> int | None:
        """The policy's minFreeGpus: None lends only nodes without GPU pods."""
        return self.policy.spec.min_free_gpus if self.policy is not None else None

    def describe(self, node: KubeNode, resources: Mapping[str, str]) -> LentNode:
        """The node as Slurm will see it, given what of it is lent
        (:meth:`~.world.World.lendable`); raises ``UnlendableNode``."""
        assert self.policy is not None
        return lent_node(self.cluster_name, node.name, resources, node.labels, self.policy.spec.partition)


#: What policies selected last, one entry per namespace and selector.
_SELECTIONS: Recent[list[bool]] = Recent(16)


@dataclass
class Round:
    """The actions decided so far, and the facts gathered for the status."""

    actions: list[Action] = field(default_factory=list)
    #: node name -> its state once this round's actions are applied (None: Kubernetes)
    projected: dict[str, str | None] = field(default_factory=dict)
    admin_drained: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    #: node -> whether it owes the cluster a DOWN once this round's actions
    #: are applied (only the nodes whose obligation changes)
    down_owed: dict[str, bool] = field(default_factory=dict)

    def emit(self, *actions: Action) -> None:
        self.actions.extend(actions)
