"""The steps slurmk8s takes in Slurm, and the one executor that takes them.

Whatever the operator or the bridge does to Slurm is one of the steps here
(the evacuation rule, :mod:`slurmk8s.evacuation`, emits most of them), and
it reaches Slurm through :func:`execute` and nowhere else. Each step names
the Slurm node it is about.

**The failure rule** (decision record 29):

1. Steps and the caller's other actions run in the order given. Actions
   about one node form a *chain* (the chain key is the node's name; the
   caller says which key its own actions have).
2. A step that fails stops the rest of its node's chain this round: the
   node's later steps and the caller's later actions about it are skipped
   (the record that says what was done is then not written either). Other
   nodes go on; the next round decides again from what it observes.
3. Slurm unreachable (``SlurmError.unreachable``, ``AgentUnreachable``)
   stops every later Slurm step this round, on every node: each fails at
   once, without asking, and stops its node's chain. Actions that are not
   Slurm steps, about other nodes, still run.
4. For per-job steps (requeue, start now, cancel) a job Slurm refuses,
   while answering, has ended or changed meanwhile: its answer is final for
   that job. It is reported (a Warning :class:`~slurmk8s.events.Event` about
   the node), the other jobs go on, and the step counts as done. The same
   holds for an undrain Slurm refuses because someone else drained the node
   meanwhile (``NotOurDrain``): that drain is theirs now.

The rule is in :func:`execute`; :func:`apply_step` is one step against a
:class:`~.control.SlurmControl`, which the executor alone calls.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..events import WARNING, Event
from .client import NotOurDrain, SlurmError
from .remote import AgentUnreachable

__all__ = [
    "Drain", "SetDown", "Undrain", "Signal", "Requeue", "StartNow", "Cancel", "DeleteNode", "Reserve", "Unreserve",
    "Step", "STEPS",
    "PER_JOB", "Outcome", "StepControl", "apply_step", "execute", "is_unreachable", "node_chain",
]


@dataclass(frozen=True)
class Drain:
    """``drain(node, reason)``: the facade prefixes ``slurmk8s:``; someone else's drain is kept."""

    node: str
    reason: str  # without the prefix, which the facade adds


@dataclass(frozen=True)
class SetDown:
    """``set_down(node, reason)``: the node's slurmd is gone, so its jobs cannot
    end by themselves; slurmctld ends them at once, requeueing those that may
    be, instead of after SlurmdTimeout."""

    node: str
    reason: str


@dataclass(frozen=True)
class Undrain:
    """``undrain(node)``: clear a slurmk8s drain nothing needs any more."""

    node: str


@dataclass(frozen=True)
class Signal:
    """Signal the batch shells of the running jobs on the node, their cue to
    checkpoint (``job_ids``: those seen running, which the record remembers)."""

    node: str
    job_ids: tuple[int, ...]
    signal: str


@dataclass(frozen=True)
class Requeue:
    """Requeue each job, eligible to start again at once."""

    node: str
    job_ids: tuple[int, ...]


@dataclass(frozen=True)
class StartNow:
    """Make each pending job eligible now: a signalled job that requeued itself
    (``scontrol requeue $SLURM_JOB_ID``) would otherwise wait Slurm's requeue
    delay (about two minutes)."""

    node: str
    job_ids: tuple[int, ...]


@dataclass(frozen=True)
class Cancel:
    """Cancel each job (``scancel``): for jobs that may not be requeued."""

    node: str
    job_ids: tuple[int, ...]


@dataclass(frozen=True)
class DeleteNode:
    """``delete_node(node)``. Slurm refuses while jobs run there, which stops the node's chain."""

    node: str


@dataclass(frozen=True)
class Reserve:
    """Make or move the node's lending reservation to start at ``start``
    (POSIX seconds): Slurm then starts there only jobs that end before it
    (decision record 40)."""

    node: str
    start: int


@dataclass(frozen=True)
class Unreserve:
    """Remove the node's lending reservation (none there is fine)."""

    node: str


Step = Drain | SetDown | Undrain | Signal | Requeue | StartNow | Cancel | DeleteNode | Reserve | Unreserve
STEPS = (Drain, SetDown, Undrain, Signal, Requeue, StartNow, Cancel, DeleteNode, Reserve, Unreserve)

class StepControl(Protocol):
    """The operations of :class:`~.control.SlurmControl` that the steps call:
    what the simulator's Slurm (:class:`slurmk8s.simulate.slurmside.SimSlurm`) has too."""

    def drain(self, name: str, reason: str) -> None: ...

    def set_down(self, name: str, reason: str) -> None: ...

    def undrain(self, name: str) -> None: ...

    def signal_node_jobs(self, name: str, signal: str) -> list[int]: ...

    def requeue(self, job_id: int) -> None: ...

    def start_now(self, job_id: int) -> None: ...

    def cancel(self, job_id: int) -> None: ...

    def delete_node(self, name: str) -> None: ...

    def reserve(self, name: str, start: int) -> None: ...

    def unreserve(self, name: str) -> None: ...


#: Steps that run one operation per job: (SlurmControl operation, what a job
#: it did is counted as, the reason of the Event about a job Slurm refused).
PER_JOB = {
    Requeue: ("requeue", "requeued", "RequeueRefused"),
    StartNow: ("start_now", "started-now", "StartRefused"),
    Cancel: ("cancel", "cancelled", "CancelRefused"),
}


def is_unreachable(exc: BaseException) -> bool:
    """Slurm did not answer (as opposed to: it answered no)."""
    return isinstance(exc, AgentUnreachable) or (isinstance(exc, SlurmError) and exc.unreachable)


@dataclass
class Outcome:
    """What :func:`execute` did, in order."""

    applied: list[Any] = field(default_factory=list)
    failed: list[tuple[Any, str]] = field(default_factory=list)
    #: Actions of a chain stopped earlier this round.
    skipped: list[Any] = field(default_factory=list)
    #: Warning Events: jobs (or an undrain) Slurm refused; their steps count as done.
    refusals: list[Event] = field(default_factory=list)
    #: Jobs by what was done to them: signalled, requeued, started-now, cancelled.
    jobs: Counter = field(default_factory=Counter)
    #: Why Slurm's later steps were not tried this round; None while it answers.
    unreachable: str | None = None


def node_chain(action: Any) -> str | None:
    """The default chain key: the node an action names, if any."""
    return getattr(action, "node", None)


def apply_step(slurm: StepControl, step: Step, out: Outcome) -> None:
    """Take one step; raises when it failed. Refused jobs go to ``out.refusals``."""
    if isinstance(step, Drain):
        slurm.drain(step.node, step.reason)
    elif isinstance(step, SetDown):
        slurm.set_down(step.node, step.reason)
    elif isinstance(step, Undrain):
        try:
            slurm.undrain(step.node)
        except NotOurDrain as exc:
            out.refusals.append(Event(WARNING, "UndrainRefused", f"{step.node}: {exc}", kind="Node", name=step.node))
    elif isinstance(step, Signal):
        out.jobs["signalled"] += len(slurm.signal_node_jobs(step.node, step.signal))
    elif isinstance(step, (Requeue, StartNow, Cancel)):  # the keys of PER_JOB
        operation, done, refused = PER_JOB[type(step)]
        for job_id in step.job_ids:
            try:
                getattr(slurm, operation)(job_id)
            except SlurmError as exc:
                if exc.unreachable:
                    raise
                # The job ended meanwhile, or refuses: Slurm's answer is final for this job.
                out.refusals.append(Event(WARNING, refused, f"job {job_id} on {step.node}: {exc.stderr or exc}",
                                          kind="Node", name=step.node))
                continue
            out.jobs[done] += 1
    elif isinstance(step, DeleteNode):
        slurm.delete_node(step.node)
    elif isinstance(step, Reserve):
        slurm.reserve(step.node, step.start)
    elif isinstance(step, Unreserve):
        slurm.unreserve(step.node)
    else:
        raise TypeError(f"{type(step).__name__} is not a Slurm step")


def execute(slurm: StepControl | None, actions: Iterable[Any], *,
            other: Callable[[Any], None] | None = None,
            chain: Callable[[Any], str | None] = node_chain,
            unreachable: str | None = None) -> Outcome:
    """Run ``actions`` in order by the failure rule (module docstring).

    Slurm steps go to ``slurm`` (None: Slurm could not be reached, and every
    step fails); anything else to ``other``, which raises when it failed.
    ``chain(action)``: the chain an action belongs to (None: none, it never
    stops or is stopped). ``unreachable``: Slurm already did not answer this
    round (the steps then fail at once)."""
    out = Outcome(unreachable=unreachable if unreachable is not None
                  else (None if slurm is not None else "Slurm is not reachable"))
    broken: set[str] = set()
    for action in actions:
        key = chain(action)
        if key is not None and key in broken:
            out.skipped.append(action)
            continue
        try:
            if isinstance(action, STEPS):
                if out.unreachable is not None:
                    raise RuntimeError(f"Slurm did not answer earlier this round: {out.unreachable}")
                assert slurm is not None
                apply_step(slurm, action, out)
            elif other is not None:
                other(action)
            else:
                raise TypeError(f"no runner for {type(action).__name__}")
        except Exception as exc:  # noqa: BLE001 - a failed action stops its node's chain
            if isinstance(action, STEPS) and is_unreachable(exc):
                out.unreachable = str(exc)
            out.failed.append((action, str(exc)))
            if key is not None:
                broken.add(key)
            continue
        out.applied.append(action)
    return out
