"""How slurmk8s empties a Slurm node: the one evacuation rule. Pure.

Whoever must take a node away from Slurm calls :func:`evacuate` each round:
the operator for scale-in, rolling updates and worker pods being deleted
(``slurmk8s/operator/workers.py``), the bridge for a lent node it takes back
(``slurmk8s/bridge/transitions.py``). The rule, in order:

1. **Drain** the node (``slurmk8s: <reason>``) unless a drain is set; someone
   else's drain is never overwritten, and the node is emptied all the same.
2. **Signal** the running jobs once (``policy.signal``), and remember when
   and which: the signal is their cue to checkpoint. A round that signals
   ends there, unless the grace period is 0.
3. **Grace period**: the jobs may run ``policy.grace_seconds`` from the
   signal (from the start of the evacuation when there is no signal).
4. **Requeue** what still runs (eligible again at once), or **cancel** it
   when it may not be requeued (``--no-requeue``) or the policy says
   ``cancel``. Jobs still running ``policy.retry_seconds`` after that get it
   again.
5. **Start at once**: a signalled job that requeued itself (a checkpoint
   handler's ``scontrol requeue $SLURM_JOB_ID``) waits Slurm's requeue delay
   (its eligible time, later reason ``BeginTime``; about two minutes by
   default); it is made eligible now. The node is not given up while such a
   job is still on it or still held, so the record that names it lives until
   a round sees it eligible.
6. When the node's slurmd is gone (``slurmd_gone``), nothing answers for its
   jobs: the node is set **DOWN**, which makes slurmctld end them at once and
   requeue those that may be; they are started again at once as in 5.

What the rule must remember between rounds is a :class:`Record`. It is
returned, changed or not, and the caller stores it where it keeps state
(the operator: annotations on the worker pod; the bridge: annotations on the
Kubernetes Node); each side has only that codec. Times are aware datetimes,
written as RFC 3339 by :mod:`slurmk8s.times`.

Unknown state means wait: jobs that could not be listed (``jobs=None``) give
nothing but the drain.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from .slurm.model import Job, Node
from .slurm.steps import Cancel, Drain, Requeue, SetDown, Signal, StartNow
from .strict import MAX_JOB_ID, counts
from .times import aware

__all__ = [
    "Policy", "Record", "Drain", "SetDown", "Signal", "Requeue", "StartNow", "Cancel", "Action",
    "Evacuation", "evacuate", "sets_down", "held", "job_ids", "format_job_ids", "parse_job_ids", "REQUEUE", "CANCEL", "DEFAULT_RETRY_SECONDS",
]

REQUEUE = "requeue"
CANCEL = "cancel"
#: Jobs still running this long after their requeue/cancel get it again.
DEFAULT_RETRY_SECONDS = 30


@dataclass(frozen=True)
class Policy:
    """How to empty a node, and why."""

    #: Why the node is emptied (scale-in, rolling update, demand, ...). A
    #: record made for another purpose is started over.
    purpose: str
    #: The drain reason, without the ``slurmk8s:`` prefix the facade adds.
    drain_reason: str
    #: Sent to the batch shell of each running job first; None: no signal.
    signal: str | None
    grace_seconds: int
    #: What happens to jobs still running after the grace period: requeue
    #: (those that refuse a requeue are cancelled) or cancel.
    job_action: str = REQUEUE
    retry_seconds: int = DEFAULT_RETRY_SECONDS


@dataclass(frozen=True)
class Record:
    """What an evacuation remembers between rounds."""

    purpose: str | None = None
    #: When the evacuation started: the grace period runs from here without a signal.
    started: datetime | None = None
    #: When the running jobs were signalled (or were found to need none).
    signalled: datetime | None = None
    #: The jobs signalled (or set DOWN): started again at once once they requeue.
    jobs: tuple[int, ...] = ()
    #: When the jobs left after the grace period were requeued or cancelled.
    forced: datetime | None = None


# What the caller does to Slurm, in order: the steps of slurmk8s.slurm.steps,
# which the caller runs with its executor (slurmk8s.slurm.steps.execute).


Action = Drain | SetDown | Signal | Requeue | StartNow | Cancel


@dataclass(frozen=True)
class Evacuation:
    """One round of :func:`evacuate`."""

    #: Run in order by the executor's rule: a failure stops the node's chain
    #: (and the record is then not stored).
    actions: tuple[Action, ...]
    #: Store once the actions succeeded (it may equal the one passed in).
    record: Record
    #: Slurm shows no job on the node and it completes none: its node record
    #: may be deleted now (Slurm refuses should a job have slipped in since).
    empty: bool
    #: The node may be given up (its pod deleted) once the actions succeed:
    #: it was drained when Slurm was read, so nothing can have started since,
    #: and every job left there is ending (requeued or cancelled by these
    #: actions, or completing and not one the rule waits for to start again).
    released: bool
    #: Why it is not released yet, for people; None when it is.
    waiting: str | None


def _not_after(t: datetime | None, now: datetime) -> datetime | None:
    return None if t is None else min(t, now)


def job_ids(jobs: Iterable[Job]) -> tuple[int, ...]:
    return tuple(sorted({j.job_id for j in jobs}))


def format_job_ids(ids: Sequence[int]) -> str:
    """Job ids as an annotation holds them: comma-separated."""
    return ",".join(str(j) for j in ids)


def parse_job_ids(value: str | None) -> tuple[int, ...]:
    """Job ids an annotation holds (:func:`slurmk8s.strict.counts`); unreadable entries are dropped."""
    return counts(value, MAX_JOB_ID)


def held(job: Job, now: datetime) -> bool:
    """A pending job Slurm holds back for a begin time (a requeue's delay)."""
    if job.state != "PENDING":
        return False
    return job.reason == "BeginTime" or (job.eligible_time is not None and job.eligible_time > now.timestamp())


def sets_down(node: Node | None, jobs: Sequence[Job], slurmd_gone: bool) -> bool:
    """Whether the rule sets ``node`` DOWN now: its slurmd is gone and Slurm still
    shows active jobs there, which slurmctld then ends (requeueing those that may be)."""
    return slurmd_gone and node is not None and node.state != "down" and any(j.active for j in jobs)


def evacuate(name: str, node: Node | None, jobs: Sequence[Job] | None, record: Record, policy: Policy,
             now: datetime, *, recorded: Sequence[Job] = (), slurmd_gone: bool = False) -> Evacuation:
    """This round's step in emptying the Slurm node ``name``.

    ``node``: that node as Slurm shows it, None when Slurm has none of that
    name (then only jobs whose node list still names it are dealt with).
    ``jobs``: the jobs allocated to it (any state; None: they could not be
    listed). ``record``: what earlier rounds stored
    (``Record()`` when nothing). ``recorded``: the jobs ``record.jobs``
    names, as Slurm has them now, wherever they are. ``slurmd_gone``: no
    slurmd answers for the node any more.
    """
    now = aware(now).replace(microsecond=0)
    # Whoever may patch the object the record lives on may write its times:
    # one later than now reads as now (and is stored so, being returned),
    # so no grace period runs longer than the policy allows from this round.
    record = replace(record, started=_not_after(record.started, now), signalled=_not_after(record.signalled, now),
                     forced=_not_after(record.forced, now))
    if record.purpose != policy.purpose or record.started is None:
        record = Record(purpose=policy.purpose, started=now)
    if node is None and not jobs:
        # Not a Slurm node (never registered, or removed): nothing of Slurm's runs there.
        jobs = []
        if not any(held(j, now) for j in recorded if j.job_id in record.jobs):
            return Evacuation((), record, empty=True, released=True, waiting=None)
    acts: list[Action] = []
    drained = node is None or node.drain_set
    if not drained:
        acts.append(Drain(name, policy.drain_reason))

    def waits(why: str) -> Evacuation:
        return Evacuation(tuple(acts), record, empty=False, released=False, waiting=why)

    if jobs is None:
        return waits("the jobs on it could not be listed; waiting")
    active = [j for j in jobs if j.active]
    running = [j for j in active if j.state != "COMPLETING"]

    if sets_down(node, active, slurmd_gone):
        acts.append(SetDown(name, policy.drain_reason))
        if record.signalled is None:
            record = replace(record, signalled=now, jobs=job_ids(active))
        return waits(f"its slurmd is gone: set DOWN, Slurm ends jobs {format_job_ids(job_ids(active))}")

    if policy.signal and record.signalled is None:
        record = replace(record, signalled=now, jobs=job_ids(running))
        if running:
            acts.append(Signal(name, job_ids(running), policy.signal))
            if policy.grace_seconds > 0:
                return waits(f"sent SIG{policy.signal} to jobs {format_job_ids(job_ids(running))}; they have "
                             f"{policy.grace_seconds}s to checkpoint")

    # Signalled jobs that requeued themselves: eligible again at once.
    wanted = set(record.jobs)
    delayed = [j for j in recorded if j.job_id in wanted and held(j, now)]
    if delayed:
        acts.append(StartNow(name, job_ids(delayed)))

    forced: set[int] = set()
    if running:
        since = record.signalled or record.started
        assert since is not None  # a record without started was made anew above
        grace_left = since + timedelta(seconds=policy.grace_seconds) - now
        verb = "requeued" if policy.job_action == REQUEUE else "cancelled"
        if grace_left > timedelta(0):
            seconds = int(grace_left.total_seconds() + 0.999)
            return waits(f"jobs {format_job_ids(job_ids(active))} may run {seconds}s more before they are {verb}")
        if record.forced is not None and now < record.forced + timedelta(seconds=policy.retry_seconds):
            return waits(f"jobs {format_job_ids(job_ids(running))} were {verb}; waiting for them to leave")
        requeue = [j for j in running if policy.job_action == REQUEUE and j.requeue]
        cancel = [j for j in running if j not in requeue]
        if requeue:
            acts.append(Requeue(name, job_ids(requeue)))
        if cancel:
            acts.append(Cancel(name, job_ids(cancel)))
        record = replace(record, forced=now)
        forced = set(job_ids(running))

    remaining = [j for j in active if j.job_id not in forced]
    empty = not active and (node is None or "COMPLETING" not in node.flags)
    left = [j for j in remaining if j.state != "COMPLETING" or j.job_id in wanted]
    if left:
        return waits(f"waiting for jobs {format_job_ids(job_ids(left))} to leave and be started again")
    if wanted and node is not None and "COMPLETING" in node.flags:
        # A job that requeued itself shows PENDING while Slurm still completes its
        # last run here; Slurm sets the requeue's hold when that ends. Seen next round.
        return Evacuation(tuple(acts), record, empty=False, released=False,
                          waiting="Slurm is completing the last run of the jobs signalled here")
    if delayed:
        # Confirmed next round: a start moved while Slurm still completes the
        # job's last run is undone when it finishes, and the hold comes back.
        return Evacuation(tuple(acts), record, empty=empty, released=False,
                          waiting=f"jobs {format_job_ids(job_ids(delayed))} requeued themselves; starting them again at once")
    if not drained:
        return Evacuation(tuple(acts), record, empty=empty, released=False,
                          waiting="drained now; looking again before it is given up")
    return Evacuation(tuple(acts), record, empty=empty, released=True, waiting=None)
