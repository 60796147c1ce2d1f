"""What happens to Slurm nodes when their pods must go. Pure: state in, actions out.

What removes or restarts a worker pod empties its Slurm node first, the
same way (:meth:`_Round.empty`):

- **scale-in**: a node set's replicas go down (or the node set is removed).
  The highest ordinals go, as a StatefulSet removes them.
- **rolling update**: the pod template changed (an image update). Worker
  StatefulSets use ``OnDelete``; the operator restarts one pod per node set
  at a time. A change of the termination grace period alone (it follows
  ``killWait``, a config setting) restarts nothing: the templates' restart
  hash leaves it out.
- a worker pod **someone else deletes** (kubectl delete, an eviction) whose
  node runs jobs: its node is emptied while its entrypoint waits;
- **Kubernetes node maintenance**: the pod's node is cordoned, or has a
  ``NoSchedule``/``NoExecute`` taint the pod does not tolerate (but those
  of node conditions, which a blip sets, and the bridge's lending taint:
  :mod:`.maintenance`). The
  Slurm node is emptied (``slurmk8s: k8s: cordoned`` / ``k8s: tainted
  <key>``) and its busy label goes, so that ``kubectl drain`` may evict the
  pod; the operator deletes nothing. Uncordoned, the node takes jobs again;
- and afterwards, **leftover records**: a Slurm node whose pod is gone is
  deleted from slurmctld (the worker's entrypoint normally does this itself).

Emptying a node is the one evacuation rule, :func:`slurmk8s.evacuation.evacuate`
(the bridge's too): drain it (``slurmk8s: scale-in`` / ``rolling update`` /
``pod terminating``); if it runs jobs, send the node set's signal to them
(when one is set) and give them ``drain.gracePeriod`` seconds; then requeue
them (eligible at once; ``--no-requeue`` jobs are cancelled); a signalled job
that requeued itself is started again at once; then the pod may go. The
rule's record is kept on the pod (annotations, :mod:`.podrecord`), so an
operator restart resumes the grace period instead of starting it again or
forgetting it. Slurm's jobs are read once a round, when a decision asks for
them (:attr:`Decision.needs_jobs`).

Safety rules, each tested:
- Unknown Slurm state (the agent did not answer, a job lookup failed) means
  *wait*: replicas stay, nothing is deleted.
- A drain someone else set is never cleared or overwritten. Such a node is
  still removed on scale-in (it is drained, after all), but a rolling update
  passes it by.
- A drain the operator set is cleared when nothing needs it any more (a
  scale-in that was called off, a restarted pod whose old record survived).

Worker pods whose Slurm node runs jobs carry the label
``slurmk8s.dev/slurm-busy=true``, which the node set's PodDisruptionBudget
(maxUnavailable 0) selects: a busy worker cannot be evicted (node drains,
autoscalers) while its jobs run. The label follows the node's state each round.

Config changes are not decided here but in :mod:`.reconfigure`.

Why one module of some 490 lines: scale-in, rolling updates, deleted pods,
undrains, busy labels and leftover records are one decision per node set,
not five. They share one collector (``_Round``: the evacuation, its record
and its Events) and read each other's state within one pass: a rolling
update waits while a scale-in runs and keeps its drain meanwhile, an undrain
skips a pod being restarted, a record is removed only past the pods that
stay. Split apart, they would import each other and each would have to know
the others' rules. What changes on its own is elsewhere: the rule
(:mod:`slurmk8s.evacuation`), its record on the pod (:mod:`.podrecord`),
config changes (:mod:`.reconfigure`), and how the node sets are read from the
API (:mod:`.observe`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeGuard

from slurmk8s import evacuation
from slurmk8s.events import Event
from slurmk8s.render import names
from slurmk8s.slurm.hostlist import HostlistError, expand
from slurmk8s.slurm.model import DRAIN_PREFIX, POD_TERMINATING, Job, Node, SlurmState
from slurmk8s.slurm.steps import Cancel, Drain, Requeue, SetDown, Signal, StartNow, Undrain
from slurmk8s.times import from_epoch

from . import podrecord
from .maintenance import MAINTENANCE

_ids = evacuation.format_job_ids

__all__ = [
    "SCALE_IN", "ROLLING_UPDATE", "POD_TERMINATING", "OPERATOR_DRAINS", "Pod", "NodeSetState",
    "Drain", "Undrain", "Signal", "Requeue", "StartNow", "Cancel", "DeleteNodeRecord", "AnnotatePod", "LabelBusy",
    "DeletePod", "Event", "Decision", "decide",
]

SCALE_IN = "scale-in"
ROLLING_UPDATE = "rolling update"
#: Drain reasons, as Slurm shows them, that slurmk8s's node lifecycle sets:
#: the operator's own, and the worker entrypoint's on pod termination. Only
#: these are ever cleared by the operator; other slurmk8s components (the
#: bridge) use other reasons.
OPERATOR_DRAINS = frozenset(
    f"{DRAIN_PREFIX} {r}" for r in (SCALE_IN, ROLLING_UPDATE, POD_TERMINATING)
)
# Observed state.


@dataclass(frozen=True)
class Pod:
    name: str
    uid: str
    ordinal: int
    ready: bool
    deleting: bool
    #: The pod's controller-revision-hash label (None when the API server sets none).
    revision: str | None = None
    annotations: Mapping[str, str] = field(default_factory=dict)
    #: Whether the pod carries the busy label now.
    busy_label: bool = False
    #: The pod's restart hash annotation (names.RESTART_HASH), None when it has none.
    restart_hash: str | None = None
    #: Why its Kubernetes node is under maintenance (:func:`maintenance`); None: it is not.
    maintenance: str | None = None


@dataclass(frozen=True)
class NodeSetState:
    name: str
    #: StatefulSet name; its pods and Slurm nodes are ``<statefulset>-<ordinal>``.
    statefulset: str
    #: Replicas the spec asks for; 0 for a node set removed from the spec.
    desired: int
    #: The StatefulSet's spec.replicas as observed; None when it does not exist.
    current: int | None
    #: The StatefulSet's status.updateRevision (None when unknown).
    update_revision: str | None = None
    pods: tuple[Pod, ...] = ()
    grace_period: int = 300
    signal: str | None = None
    #: The restart hash of the StatefulSet's pod template (None when it has none).
    restart_hash: str | None = None


# Actions.


@dataclass(frozen=True)
class DeleteNodeRecord:
    node: str


@dataclass(frozen=True)
class AnnotatePod:
    pod: str
    uid: str
    #: (annotation, value); a None value removes the annotation.
    annotations: tuple[tuple[str, str | None], ...]


@dataclass(frozen=True)
class LabelBusy:
    pod: str
    uid: str
    busy: bool  # set the busy label (True) or remove it (False)


@dataclass(frozen=True)
class DeletePod:
    pod: str
    uid: str  # a precondition: never delete a newer pod of the same name


#: The steps (slurmk8s.slurm.steps; Drain, Signal, Requeue, StartNow and Cancel
#: come from the evacuation rule), and the pod annotations that record them.
SlurmAction = Drain | SetDown | Undrain | Signal | Requeue | StartNow | Cancel | AnnotatePod


@dataclass(frozen=True)
class Decision:
    #: StatefulSet name -> the replicas to write now.
    replicas: Mapping[str, int]
    #: Run first, in order, by the one executor (slurmk8s.slurm.steps.execute;
    #: a pod's annotations are its node's chain): when anything fails the
    #: caller keeps every StatefulSet at its current size this round.
    slurm_actions: tuple[SlurmAction, ...]
    #: Busy labels to set or remove on worker pods.
    busy_labels: tuple[LabelBusy, ...]
    #: After the StatefulSets are written: pods to restart.
    pod_deletions: tuple[DeletePod, ...]
    #: Last: Slurm node records whose pods are gone.
    record_deletions: tuple[DeleteNodeRecord, ...]
    #: Node sets whose StatefulSet and PodDisruptionBudget must stay for now.
    keep: frozenset[str]
    #: The decision needs Slurm's jobs: read them (once), then decide again.
    needs_jobs: bool
    events: tuple[Event, ...]
    #: Why something waits, for people (status message, logs).
    waiting: tuple[str, ...]
    #: An evacuation waits for signalled jobs that may requeue themselves at
    #: any moment: decide again within a second or two, to start them at once.
    hurry: bool = False

    def hold(self, sets: Iterable[NodeSetState]) -> Decision:
        """This decision with no scale-in, restart or record removal: for a
        round where a Slurm action failed."""
        replicas = {s.statefulset: max(s.current, s.desired) if s.current is not None else s.desired
                    for s in sets}
        return Decision(replicas, (), self.busy_labels, (), (), frozenset(s.name for s in sets), False,
                        self.events, self.waiting, self.hurry)




class _Round:
    """Collects the actions of one decision."""

    def __init__(self, slurm: SlurmState, now: float):
        self.slurm = slurm
        self.now = now
        self.actions: list[SlurmAction] = []
        self.annotations: dict[tuple[str, str], dict[str, str | None]] = {}
        self.events: list[Event] = []
        self.waiting: list[str] = []
        self.needs_jobs = False
        self.hurry = False
        # Slurm's jobs by node and by id, indexed once; None: unknown (the
        # read failed, or a job's node list could not be read: fail closed).
        self.by_node: dict[str, list[Job]] | None = defaultdict(list)
        self.by_id: dict[int, Job] = {}
        if slurm.jobs_read:
            if slurm.jobs is None:
                self.by_node = None
            else:
                try:
                    for j in slurm.jobs:
                        self.by_id[j.job_id] = j
                        for n in (expand(j.nodes) if j.nodes else ()):
                            self.by_node[n].append(j)
                except HostlistError:
                    self.by_node = None

    def annotate(self, pod: Pod, values: Mapping[str, str | None]) -> None:
        self.annotations.setdefault((pod.name, pod.uid), {}).update(values)

    def event(self, type_: str, reason: str, message: str) -> None:
        self.events.append(Event(type_, reason, message))

    def empty(self, s: NodeSetState, node_name: str, pod: Pod | None, purpose: str) -> bool:
        """Work towards an empty node by the evacuation rule; True once the pod may go.

        The rule's actions (drain, signal, requeue, start now, cancel) come
        first in the decision; the caller removes the pod only after they
        succeeded. The rule's record lives in the pod's annotations.
        """
        node = self.slurm.node(node_name)
        if node is None or pod is None:
            # Not a Slurm node (never registered, or already removed), or no
            # pod left to protect: nothing of Slurm's runs there.
            return True
        if not self.slurm.jobs_read:
            self.needs_jobs = True
            return False
        before = podrecord.read_record(pod.annotations)
        jobs = None if self.by_node is None else self.by_node.get(node_name, [])
        policy = evacuation.Policy(purpose=purpose, drain_reason=purpose, signal=s.signal,
                                   grace_seconds=s.grace_period)
        e = evacuation.evacuate(node_name, node, jobs, before, policy, from_epoch(self.now),
                                recorded=[self.by_id[i] for i in before.jobs if i in self.by_id])
        self.actions += e.actions
        changed = {k: v for k, v in podrecord.record_annotations(e.record).items() if pod.annotations.get(k) != v}
        if changed:
            self.annotate(pod, changed)
        for a in e.actions:
            self.report(a, s, purpose)
        if not e.released:
            self.waiting.append(f"{node_name}: {e.waiting} ({purpose})")
            if e.record.jobs and any(i in self.by_id for i in e.record.jobs):
                self.hurry = True  # a signalled job may requeue itself any moment: start it at once
        return e.released

    def report(self, a: SlurmAction, s: NodeSetState, purpose: str) -> None:
        """The Event that says what an evacuation step did."""
        if isinstance(a, Drain):
            self.event("Normal", "Draining", f"Slurm node {a.node} is draining for {purpose}: "
                                             "no new jobs start there")
        elif isinstance(a, Signal):
            self.event("Normal", "JobsSignalled",
                       f"sent SIG{a.signal} to the jobs on {a.node} ({_ids(a.job_ids)}); they have "
                       f"{s.grace_period}s to checkpoint before they are requeued")
        elif isinstance(a, Requeue):
            self.event("Normal", "JobsRequeued", f"requeued jobs {_ids(a.job_ids)} from {a.node} after the "
                                                 f"{s.grace_period}s grace period; they may start again at once")
        elif isinstance(a, Cancel):
            self.event("Warning", "JobsCancelled",
                       f"cancelled jobs {_ids(a.job_ids)} on {a.node} after the {s.grace_period}s grace period: "
                       "they were submitted with --no-requeue")
        elif isinstance(a, StartNow):
            self.event("Normal", "JobsStarted", f"jobs {_ids(a.job_ids)} requeued themselves on the signal; "
                                                "they may start again at once")


def _ours(reason: str) -> bool:
    return reason in OPERATOR_DRAINS or reason.startswith(f"{DRAIN_PREFIX} {MAINTENANCE} ")


def _operator_drain(node: Node | None) -> TypeGuard[Node]:
    return node is not None and node.drain_set and _ours(node.reason)


def _foreign_drain(node: Node | None) -> bool:
    return node is not None and node.drain_set and not _ours(node.reason)


def decide(sets: Sequence[NodeSetState], slurm: SlurmState, now: float) -> Decision:
    """The node lifecycle actions for one cluster, for this round.

    ``slurm.nodes`` None: the agent could not be asked. Then every node set stays
    at least at its current size and nothing is drained, restarted or
    deleted.
    """
    r = _Round(slurm, now)
    replicas: dict[str, int] = {}
    pod_deletions: list[DeletePod] = []
    busy: list[LabelBusy] = []
    records: list[DeleteNodeRecord] = []
    keep: set[str] = set()
    for s in sets:
        if s.current is None:
            replicas[s.statefulset] = s.desired
            continue
        pods = {p.ordinal: p for p in s.pods}
        removing = list(range(s.current - 1, s.desired - 1, -1))
        if slurm.nodes is None:
            replicas[s.statefulset] = max(s.current, s.desired)
            keep.add(s.name)
            if removing:
                r.waiting.append(f"node set {s.name}: scale-in to {s.desired} waits for the Slurm agent")
            continue
        # Scale-in: drain every node that goes; remove pods from the top as
        # their nodes become empty.
        gone = 0
        for o in removing:
            ready = r.empty(s, f"{s.statefulset}-{o}", pods.get(o), SCALE_IN)
            if ready and gone == s.current - 1 - o:
                gone += 1
        replicas[s.statefulset] = max(s.current, s.desired) - gone if removing else s.desired
        if removing and gone:
            r.event("Normal", "ScaledIn", f"node set {s.name}: {s.current} -> {s.current - gone} pods "
                                          f"(nodes {s.statefulset}-[{s.current - gone}-{s.current - 1}] are empty)")
        # A pod whose rolling update has begun keeps its drain, even while a
        # scale-in goes first or the update waits for another pod.
        restarting = {p.ordinal for p in s.pods if _outdated(s, p)
                      and p.annotations.get(names.DRAIN_PURPOSE) == ROLLING_UPDATE}
        if not removing:
            _restart(r, s, pod_deletions)
        # Worker pods someone else deletes: their nodes are emptied by the
        # same rule while the entrypoint waits (its own step is a last resort).
        for p in s.pods:
            node = slurm.node(f"{s.statefulset}-{p.ordinal}")
            if (p.deleting and p.ordinal < min(s.current, s.desired) and node is not None
                    and (node.busy or p.annotations.get(names.DRAIN_PURPOSE) == POD_TERMINATING)):
                r.empty(s, node.name, p, POD_TERMINATING)
        # Kubernetes node maintenance: empty the node, so that the pod may be
        # evicted (its busy label goes once Slurm shows it idle).
        for p in s.pods:
            if p.maintenance and p.ordinal < min(s.current, s.desired) and not p.deleting \
                    and p.ordinal not in restarting:
                if r.empty(s, f"{s.statefulset}-{p.ordinal}", p, p.maintenance):
                    r.waiting.append(f"{p.name}: its Slurm node is empty ({p.maintenance}); the pod may be evicted")
        # Drains of ours that nothing needs any more.
        for p in s.pods:
            if p.ordinal >= s.desired or p.deleting or not p.ready or p.ordinal in restarting or p.maintenance:
                continue
            name = f"{s.statefulset}-{p.ordinal}"
            node = slurm.node(name)
            if _operator_drain(node):
                r.actions.append(Undrain(name))
                r.event("Normal", "Undrained", f"Slurm node {name} takes jobs again ({node.reason!r} cleared)")
            if any(a in p.annotations for a in podrecord.ANNOTATIONS):
                r.annotate(p, {a: None for a in podrecord.ANNOTATIONS})
        # Busy workers may not be evicted.
        for p in s.pods:
            node = slurm.node(f"{s.statefulset}-{p.ordinal}")
            is_busy = node is not None and node.busy
            if is_busy != p.busy_label and not p.deleting:
                busy.append(LabelBusy(p.name, p.uid, is_busy))
        # Records of nodes whose pods are gone.
        for node in slurm.nodes:
            ordinal = names.worker_ordinal(s.statefulset, node.name)
            if ordinal is None or ordinal < s.current or ordinal in pods:
                continue
            keep.add(s.name)
            if node.responding and not node.drain_set:
                r.waiting.append(f"{node.name}: its pod is gone but slurmd still answers; waiting")
                continue
            if not slurm.jobs_read:
                r.needs_jobs = True
                continue
            if r.by_node is None or any(j.active for j in r.by_node.get(node.name, ())):
                r.waiting.append(f"{node.name}: its pod is gone; waiting for Slurm to end its jobs")
                continue
            records.append(DeleteNodeRecord(node.name))
            r.event("Normal", "NodeRemoved", f"deleted Slurm node {node.name}: its pod is gone")
        if s.current > 0 or s.pods:
            keep.add(s.name)
    actions = list(r.actions)
    actions += [AnnotatePod(pod, uid, tuple(sorted(values.items())))
                for (pod, uid), values in sorted(r.annotations.items())]
    return Decision(
        replicas=replicas,
        slurm_actions=tuple(actions),
        busy_labels=tuple(busy),
        pod_deletions=tuple(pod_deletions),
        record_deletions=tuple(records),
        keep=frozenset(keep),
        needs_jobs=r.needs_jobs,
        events=tuple(r.events),
        waiting=tuple(r.waiting),
        hurry=r.hurry,
    )


def _outdated(s: NodeSetState, p: Pod) -> bool:
    """The pod runs an older template that differs in something it must restart for.

    The restart hashes say so when the template and the pod both carry one
    (a change of the termination grace period alone is not such a
    difference); otherwise the StatefulSet's revisions do.
    """
    if s.current is None or p.ordinal >= s.current:
        return False
    if s.restart_hash and p.restart_hash:
        return p.restart_hash != s.restart_hash
    return bool(s.update_revision and p.revision and p.revision != s.update_revision)


def _restart(r: _Round, s: NodeSetState, deletions: list[DeletePod]) -> None:
    """One rolling-update step for a node set: at most one pod at a time."""
    assert s.current is not None
    live = [p for p in s.pods if p.ordinal < s.current]
    outdated = [p for p in live if _outdated(s, p)]
    if not outdated:
        return
    if any(p.deleting for p in live):
        r.waiting.append(f"node set {s.name}: rolling update waits for a pod to finish terminating")
        return
    starting = [p for p in live if not p.ready and p not in outdated]
    if starting:
        r.waiting.append(f"node set {s.name}: rolling update waits for {starting[0].name} to be ready")
        return

    def foreign(p: Pod) -> bool:
        return _foreign_drain(r.slurm.node(f"{s.statefulset}-{p.ordinal}"))

    in_progress = [p for p in outdated if p.annotations.get(names.DRAIN_PURPOSE) == ROLLING_UPDATE]
    # Broken pods first (a restart may mend them), then from the highest ordinal.
    # A pod on a node under maintenance is left to the node's drain: once
    # evicted, it comes back with the new template anyway.
    choices = in_progress or sorted((p for p in outdated if not foreign(p) and not p.maintenance),
                                    key=lambda p: (p.ready, -p.ordinal))
    for p in outdated:
        if foreign(p) and p not in choices:
            r.waiting.append(f"{p.name} keeps its old pod template: its Slurm node was drained by someone else")
    if not choices:
        return
    pod = choices[0]
    if r.empty(s, f"{s.statefulset}-{pod.ordinal}", pod, ROLLING_UPDATE):
        deletions.append(DeletePod(pod.name, pod.uid))
        r.event("Normal", "Restarting", f"restarting {pod.name} for the updated pod template "
                                        f"({len(outdated) - 1} more to go in node set {s.name})")
