"""What happens to Slurm nodes when their pods must go. Pure: state in, actions out.

Three things remove or restart a worker pod, and all of them empty its Slurm
node first, the same way (:func:`_empty`):

- **scale-in**: a node set's replicas go down (or the node set is removed).
  The highest ordinals go, as a StatefulSet removes them.
- **rolling update**: the pod template changed (an image update). Worker
  StatefulSets use ``OnDelete``; the operator restarts one pod per node set
  at a time. A change of the termination grace period alone (it follows
  ``killWait``, a config setting) restarts nothing: the templates' restart
  hash leaves it out.
- and afterwards, **leftover records**: a Slurm node whose pod is gone is
  deleted from slurmctld (the worker's entrypoint normally does this itself).

Emptying a node: drain it (``slurmk8s: scale-in`` / ``slurmk8s: rolling
update``); if it runs jobs, send the node set's signal to them (when one is
set) and give them ``drain.gracePeriod`` seconds; then requeue them (eligible
at once) and let the pod go. When the drain started and when jobs were
signalled is kept on the pod (annotations), so an operator restart resumes the
grace period instead of starting it again or forgetting it.

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

Config changes are here too (:func:`decide_reconfigure`): update the
ConfigMap, wait until the agent sees the rendered files, then reconfigure.
slurmctld is never restarted for a config change.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Iterable, Mapping, Sequence

from slurmk8s.render import names
from slurmk8s.slurm.model import DRAIN_PREFIX, Job, Node

__all__ = [
    "SCALE_IN", "ROLLING_UPDATE", "OPERATOR_DRAINS", "Pod", "NodeSetState", "SlurmState",
    "Drain", "Undrain", "SignalJobs", "Requeue", "DeleteNodeRecord", "AnnotatePod", "LabelBusy", "DeletePod",
    "Event",
    "Decision", "decide", "decide_reconfigure", "timestamp", "parse_timestamp",
]

SCALE_IN = "scale-in"
ROLLING_UPDATE = "rolling update"
#: Drain reasons, as Slurm shows them, that slurmk8s's node lifecycle sets:
#: the operator's own, and the worker entrypoint's on pod termination. Only
#: these are ever cleared by the operator; other slurmk8s components (the
#: bridge) use other reasons.
OPERATOR_DRAINS = frozenset(
    f"{DRAIN_PREFIX} {r}" for r in (SCALE_IN, ROLLING_UPDATE, "pod terminating")
)
_ANNOTATIONS = (names.DRAIN_STARTED, names.DRAIN_PURPOSE, names.JOBS_SIGNALLED)


def timestamp(now: float) -> str:
    """RFC 3339, seconds, UTC: what the annotations hold."""
    return datetime.fromtimestamp(int(now), tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_timestamp(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


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


@dataclass(frozen=True)
class SlurmState:
    """What the agent said. ``jobs`` holds the jobs of the nodes asked about;
    None for a node whose lookup failed."""

    nodes: Mapping[str, Node]
    jobs: Mapping[str, tuple[Job, ...] | None] = field(default_factory=dict)


# Actions.


@dataclass(frozen=True)
class Drain:
    node: str
    reason: str  # without the prefix, which the facade adds


@dataclass(frozen=True)
class Undrain:
    node: str


@dataclass(frozen=True)
class SignalJobs:
    node: str
    signal: str


@dataclass(frozen=True)
class Requeue:
    job_id: int
    node: str


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


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


SlurmAction = Drain | Undrain | SignalJobs | Requeue | AnnotatePod


@dataclass(frozen=True)
class Decision:
    #: StatefulSet name -> the replicas to write now.
    replicas: Mapping[str, int]
    #: Run first, in order; the caller stops at the first failure and then
    #: keeps every StatefulSet at its current size this round.
    slurm_actions: tuple[SlurmAction, ...]
    #: Busy labels to set or remove on worker pods.
    busy_labels: tuple[LabelBusy, ...]
    #: After the StatefulSets are written: pods to restart.
    pod_deletions: tuple[DeletePod, ...]
    #: Last: Slurm node records whose pods are gone.
    record_deletions: tuple[DeleteNodeRecord, ...]
    #: Node sets whose StatefulSet and PodDisruptionBudget must stay for now.
    keep: frozenset[str]
    #: Nodes whose jobs the decision needs; ask the agent, then decide again.
    missing_jobs: frozenset[str]
    events: tuple[Event, ...]
    #: Why something waits, for people (status message, logs).
    waiting: tuple[str, ...]

    def hold(self, sets: Iterable[NodeSetState]) -> "Decision":
        """This decision with no scale-in, restart or record removal: for a
        round where a Slurm action failed."""
        replicas = {s.statefulset: max(s.current, s.desired) if s.current is not None else s.desired
                    for s in sets}
        return Decision(replicas, (), self.busy_labels, (), (), frozenset(s.name for s in sets), frozenset(),
                        self.events, self.waiting)


_ORDINAL = re.compile(r"(?P<base>.+)-(?P<ordinal>0|[1-9][0-9]*)")


class _Round:
    """Collects the actions of one decision."""

    def __init__(self, slurm: SlurmState | None, now: float):
        self.slurm = slurm
        self.now = now
        self.actions: list[SlurmAction] = []
        self.annotations: dict[tuple[str, str], dict[str, str | None]] = {}
        self.events: list[Event] = []
        self.waiting: list[str] = []
        self.missing: set[str] = set()

    def annotate(self, pod: Pod, values: Mapping[str, str | None]) -> None:
        self.annotations.setdefault((pod.name, pod.uid), {}).update(values)

    def event(self, type_: str, reason: str, message: str) -> None:
        self.events.append(Event(type_, reason, message))

    def empty(self, s: NodeSetState, node_name: str, pod: Pod | None, purpose: str) -> bool:
        """Work towards an empty node; True once the pod may go.

        Requeue actions for jobs past their grace period are added first;
        the caller removes the pod only after they succeeded.
        """
        assert self.slurm is not None
        node = self.slurm.nodes.get(node_name)
        if node is None or pod is None:
            # Not a Slurm node (never registered, or already removed), or no
            # pod left to protect: nothing of Slurm's runs there.
            return True
        ann = pod.annotations
        fresh = ann.get(names.DRAIN_PURPOSE) != purpose or parse_timestamp(ann.get(names.DRAIN_STARTED)) is None
        if not node.drain_set:
            self.actions.append(Drain(node_name, purpose))
            if fresh:
                self.annotate(pod, {names.DRAIN_STARTED: timestamp(self.now), names.DRAIN_PURPOSE: purpose,
                                    names.JOBS_SIGNALLED: None})
            self.event("Normal", "Draining", f"Slurm node {node_name} is draining for {purpose}: "
                                             "no new jobs start there")
            return False
        started = self.now
        if fresh:
            self.annotate(pod, {names.DRAIN_STARTED: timestamp(self.now), names.DRAIN_PURPOSE: purpose,
                                names.JOBS_SIGNALLED: None})
            signalled = None
        else:
            started = parse_timestamp(ann[names.DRAIN_STARTED]) or self.now
            signalled = parse_timestamp(ann.get(names.JOBS_SIGNALLED))
        if node_name not in self.slurm.jobs:
            self.missing.add(node_name)
            return False
        jobs = self.slurm.jobs[node_name]
        if jobs is None:
            self.waiting.append(f"{node_name}: the jobs on it could not be listed; waiting")
            return False
        active = [j for j in jobs if j.active]
        if not active:
            return True
        if s.signal and signalled is None:
            self.actions.append(SignalJobs(node_name, s.signal))
            self.annotate(pod, {names.JOBS_SIGNALLED: timestamp(self.now)})
            self.event("Normal", "JobsSignalled",
                       f"sent SIG{s.signal} to the jobs on {node_name} ({_ids(active)}); they have "
                       f"{s.grace_period}s to checkpoint before they are requeued")
            return False
        since = signalled if signalled is not None else started
        left = since + s.grace_period - self.now
        if left > 0:
            self.waiting.append(f"{node_name}: jobs {_ids(active)} may run {int(left + 0.999)}s more "
                                f"before they are requeued ({purpose})")
            return False
        running = [j for j in active if j.state != "COMPLETING"]
        requeue = [j for j in running if j.requeue]
        self.actions += [Requeue(j.job_id, node_name) for j in requeue]
        if requeue:
            self.event("Normal", "JobsRequeued", f"requeued jobs {_ids(requeue)} from {node_name} after the "
                                                 f"{s.grace_period}s grace period; they may start again at once")
        stuck = [j for j in running if not j.requeue]
        if stuck:
            self.event("Warning", "JobsNotRequeueable",
                       f"jobs {_ids(stuck)} on {node_name} were submitted with --no-requeue and end with the pod")
        return True


def _ids(jobs: Sequence[Job]) -> str:
    return ",".join(str(j.job_id) for j in jobs)


def _ordinal(node_name: str, statefulset: str) -> int | None:
    m = _ORDINAL.fullmatch(node_name)
    if m and m.group("base") == statefulset:
        return int(m.group("ordinal"))
    return None


def _operator_drain(node: Node | None) -> bool:
    return node is not None and node.drain_set and node.reason in OPERATOR_DRAINS


def _foreign_drain(node: Node | None) -> bool:
    return node is not None and node.drain_set and node.reason not in OPERATOR_DRAINS


def decide(sets: Sequence[NodeSetState], slurm: SlurmState | None, now: float) -> Decision:
    """The node lifecycle actions for one cluster, for this round.

    ``slurm`` None: the agent could not be asked. Then every node set stays
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
        if slurm is None:
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
        # Drains of ours that nothing needs any more.
        for p in s.pods:
            if p.ordinal >= s.desired or p.deleting or not p.ready or p.ordinal in restarting:
                continue
            name = f"{s.statefulset}-{p.ordinal}"
            node = slurm.nodes.get(name)
            if _operator_drain(node):
                r.actions.append(Undrain(name))
                r.event("Normal", "Undrained", f"Slurm node {name} takes jobs again ({node.reason!r} cleared)")
            if any(a in p.annotations for a in _ANNOTATIONS):
                r.annotate(p, {a: None for a in _ANNOTATIONS})
        # Busy workers may not be evicted.
        for p in s.pods:
            node = slurm.nodes.get(f"{s.statefulset}-{p.ordinal}")
            is_busy = node is not None and node.busy
            if is_busy != p.busy_label and not p.deleting:
                busy.append(LabelBusy(p.name, p.uid, is_busy))
        # Records of nodes whose pods are gone.
        for node in slurm.nodes.values():
            o = _ordinal(node.name, s.statefulset)
            if o is None or o < s.current or o in pods:
                continue
            keep.add(s.name)
            if node.responding and not node.drain_set:
                r.waiting.append(f"{node.name}: its pod is gone but slurmd still answers; waiting")
                continue
            if node.name not in slurm.jobs:
                r.missing.add(node.name)
                continue
            jobs = slurm.jobs[node.name]
            if jobs is None or any(j.active for j in jobs):
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
        missing_jobs=frozenset(r.missing),
        events=tuple(r.events),
        waiting=tuple(r.waiting),
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
    assert r.slurm is not None and s.current is not None
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
        return _foreign_drain(r.slurm.nodes.get(f"{s.statefulset}-{p.ordinal}"))

    in_progress = [p for p in outdated if p.annotations.get(names.DRAIN_PURPOSE) == ROLLING_UPDATE]
    # Broken pods first (a restart may mend them), then from the highest ordinal.
    choices = in_progress or sorted((p for p in outdated if not foreign(p)), key=lambda p: (p.ready, -p.ordinal))
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


def decide_reconfigure(rendered: str, applied: str | None, seen: str | None) -> tuple[bool, str | None]:
    """Whether to run ``scontrol reconfigure`` now, and if not, why we wait.

    ``rendered``: hash of the config files just rendered (in the ConfigMap).
    ``applied``: status.configHash, the last config reconfigured.
    ``seen``: the agent's hash of the files in the slurmctld pod (None: unknown).
    """
    if applied == rendered:
        return False, None
    if seen is None:
        return False, "the config changed; waiting for the Slurm agent to reconfigure"
    if seen != rendered:
        return False, ("the config changed; waiting for the kubelet to update /etc/slurm in the "
                       "controller pod (up to about a minute)")
    return True, None
