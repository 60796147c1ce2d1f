"""What ``decide`` asks the loop to do: typed, frozen, in order.

What is done to Slurm are the steps of :mod:`slurmk8s.slurm.steps` (the
evacuation rule's own: Drain, SetDown, Signal, Requeue, StartNow, Cancel,
and DeleteNode); the rest, defined here, is done to Kubernetes. Events are
:class:`slurmk8s.events.Event`.

The loop applies a round's actions in the order given, by the one
executor's failure rule (:func:`slurmk8s.slurm.steps.execute`). Actions
about one node form a chain: when one fails, the rest of that node's
actions wait for this round (the next round decides again from what it
then observes). That is what makes a chain such as drain -> delete the
Slurm node -> delete the slurmd pod -> untaint safe: Slurm refuses to
delete a node that still runs a job, and nothing after it happens. The
steps run through the facade of the policy's SlurmCluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from ..api.lending import NodeLendingPolicyStatus, ReclaimSpec
from ..api.podtemplate import PodTemplate
from ..events import Event
from ..slurm.steps import Cancel, DeleteNode, Drain, Requeue, Reserve, SetDown, Signal, StartNow, Unreserve

__all__ = [
    "SetLendingState", "ClearLending", "RecordIdleSince", "ClearIdleSince", "RecordFreeSince",
    "ClearFreeSince", "RecordSignalled",
    "RecordForced", "ClampTimes", "RecordDownOwed", "ClearDownOwed", "RecordHealthFailed", "Taint", "Untaint",
    "CreateSlurmdPod", "DeleteSlurmdPod", "CreateBudget", "DeleteBudget", "Drain", "SetDown",
    "Signal", "Requeue", "StartNow", "Cancel", "DeleteNode", "Event", "PolicyStatus",
    "Action", "NodeAction", "DESTRUCTIVE_ACTIONS", "node_of",
]


# Node bookkeeping: label, annotations and taint of one Kubernetes Node.


@dataclass(frozen=True)
class SetLendingState:
    """Label the node ``slurmk8s.dev/lending=<state>`` and annotate it with the
    policy, cluster, partition and ``since``, in one patch. Entering
    ``reclaiming`` also records ``reason``; entering ``lending`` drops
    ``idle-since``."""

    node: str
    state: str
    policy: str
    cluster: str
    partition: str
    since: datetime
    reason: str | None = None


@dataclass(frozen=True)
class ClearLending:
    """Remove the lending label and every lending annotation: the node is
    Kubernetes' again."""

    node: str


@dataclass(frozen=True)
class RecordIdleSince:
    """Annotate ``slurmk8s.dev/idle-since=<at>``: the first round the node was seen without GPU pods."""

    node: str
    at: datetime


@dataclass(frozen=True)
class ClearIdleSince:
    """Remove ``slurmk8s.dev/idle-since``: a GPU pod runs on the node again."""

    node: str


@dataclass(frozen=True)
class RecordFreeSince:
    """Annotate ``slurmk8s.dev/free-since=<at>`` and ``slurmk8s.dev/free-gpus=<gpus>``:
    from ``at`` on, at least ``gpus`` of the node's GPUs have been free."""

    node: str
    at: datetime
    gpus: int


@dataclass(frozen=True)
class ClearFreeSince:
    """Remove ``slurmk8s.dev/free-since`` and ``free-gpus``: no GPU of the node is free."""

    node: str


@dataclass(frozen=True)
class RecordSignalled:
    """Annotate ``slurmk8s.dev/reclaim-signalled=<at>``: the grace period runs
    from here; and ``slurmk8s.dev/reclaim-jobs`` with the jobs signalled, so
    that a job that requeues itself on the signal can be started again at
    once (:class:`~slurmk8s.slurm.steps.StartNow`)."""

    node: str
    at: datetime
    jobs: tuple[int, ...] = ()


@dataclass(frozen=True)
class RecordForced:
    """Annotate ``slurmk8s.dev/reclaim-forced=<at>``: remaining jobs were requeued or cancelled."""

    node: str
    at: datetime


@dataclass(frozen=True)
class ClampTimes:
    """Write ``at`` (the round's now) in place of the node's lending times
    named in ``fields`` (``since``, ``signalled``, ``forced``): they were
    later than now, or (``since``) missing or unreadable, and were read as
    now (:mod:`.nodetimes`). From then on they count from this round."""

    node: str
    at: datetime
    fields: tuple[str, ...]


@dataclass(frozen=True)
class RecordDownOwed:
    """Annotate ``slurmk8s.dev/down-owed=<cluster>`` (and the policy): the node
    is taken back past the reclaim deadline, and that SlurmCluster must still
    set it DOWN. ClearLending keeps it; the loop counts it
    (``slurmk8s_bridge_reclaims_overdue_total``)."""

    node: str
    cluster: str
    policy: str


@dataclass(frozen=True)
class RecordHealthFailed:
    """Annotate ``slurmk8s.dev/health-failed=<check>``: the lent node failed a
    health check; it is taken back and not lent again while this is there."""

    node: str
    check: str


@dataclass(frozen=True)
class ClearDownOwed:
    """Remove ``slurmk8s.dev/down-owed``: Slurm set the node DOWN (or has no such node)."""

    node: str


@dataclass(frozen=True)
class Taint:
    """Add the taint ``key=value:effect`` to the node (a no-op when it is there)."""

    node: str
    key: str
    value: str
    effect: str


@dataclass(frozen=True)
class Untaint:
    """Remove every taint with ``key`` from the node."""

    node: str
    key: str


# The lent slurmd pod.


@dataclass(frozen=True)
class CreateSlurmdPod:
    """Create the slurmd pod of ``node``, lent to ``partition`` of SlurmCluster
    ``cluster`` (namespace/name), its /dev/shm bounded by ``shm_size`` (the
    policy's shmSize), shaped by ``pod_template`` (the policy's podTemplate).

    The loop has the renderer build the Pod from the SlurmCluster, the
    Node's labels and ``resources`` (``slurmk8s.render.slurmd.lent_slurmd_pod``): its name
    (``slurmk8s.render.names.lent_slurmd``), labels, the node's description
    to Slurm (``slurmk8s.render.lent``) and everything else are made there
    and nowhere else. Creating a pod that exists is a no-op.
    """

    cluster: str
    node: str
    partition: str
    shm_size: str
    #: What the pod takes and Slurm is told of: the node's cpu, memory and
    #: nvidia.com/gpu less what its other pods request
    #: (:meth:`~slurmk8s.bridge.world.World.lendable`), as sorted pairs.
    resources: tuple[tuple[str, str], ...]
    #: The policy's reclaim.gracePeriodSeconds: what the pod, deleted by
    #: someone else, waits for its jobs (its termination grace covers it).
    grace_seconds: int = ReclaimSpec().grace_period_seconds
    #: How the site shapes the pod: the policy's podTemplate.
    pod_template: PodTemplate | None = None


@dataclass(frozen=True)
class DeleteSlurmdPod:
    """Delete the slurmd pod of a node (gone already: fine)."""

    namespace: str
    name: str
    node: str


# The lent slurmd pod's PodDisruptionBudget (decision record 49).


@dataclass(frozen=True)
class CreateBudget:
    """Create the PodDisruptionBudget that guards the lent slurmd pod of
    ``node`` (lent to SlurmCluster ``cluster``, namespace/name) while Slurm
    runs jobs there; ``pod_uid`` owns it. The loop has the renderer build it
    (``slurmk8s.render.slurmd.lent_budget``). One that exists is fine."""

    cluster: str
    node: str
    pod_uid: str


@dataclass(frozen=True)
class DeleteBudget:
    """Delete the lent slurmd pod's PodDisruptionBudget (gone already: fine)."""

    namespace: str
    name: str
    node: str


# Reports.


@dataclass(frozen=True)
class PolicyStatus:
    """Write the policy's status subresource."""

    namespace: str
    name: str
    status: NodeLendingPolicyStatus


NodeAction = (
    SetLendingState | ClearLending | RecordIdleSince | ClearIdleSince | RecordFreeSince | ClearFreeSince
    | RecordSignalled | RecordForced | ClampTimes
    | RecordDownOwed | ClearDownOwed | RecordHealthFailed | Taint | Untaint | CreateSlurmdPod | DeleteSlurmdPod
    | CreateBudget | DeleteBudget
    | Drain | SetDown | Signal | Requeue | StartNow | Cancel | DeleteNode | Reserve | Unreserve
)
Action = NodeAction | Event | PolicyStatus

#: Actions that stop or disturb Slurm work, or hand a node back to Kubernetes.
DESTRUCTIVE_ACTIONS = (Drain, SetDown, Signal, Requeue, Cancel, DeleteNode, DeleteSlurmdPod,
                       Untaint, ClearLending, DeleteBudget)


def node_of(action: Action) -> str | None:
    """The Kubernetes node an action is about (a chain key), if any."""
    if isinstance(action, Event):
        return action.name if action.kind == "Node" else None
    return getattr(action, "node", None)
