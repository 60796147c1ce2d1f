"""The simulator's Slurm side: nodes with their free GPUs, the queue, EASY
backfill, gang allocation, and what a requeue or a cancel costs a job
(the engine's module docstring describes the model; what Slurm does to a
job when its node is set DOWN, requeued or cancelled is
:mod:`.slurmrules`, shared with the lending tests).

A mixin of the one simulator state (:class:`.engine._Sim`): the Slurm side's
fields are made by :meth:`SlurmSide._init_slurm`, and it reads the clock
(``t``, ``push``, ``changed``, ``advance``), the accounting counters and the
oracle's :meth:`~.oracle.OracleSide._oracle_free_until` from that state.

:class:`SimSlurm` is this Slurm behind the operations of
:class:`~slurmk8s.slurm.control.SlurmControl` that the one executor of Slurm
steps (:func:`slurmk8s.slurm.steps.execute`) calls: the bridge's rounds take
their steps through it, refused where Slurm refuses."""

from __future__ import annotations

import math

from ..api.cluster import lent_nodeset
from ..slurm.client import NotOurDrain, SlurmError
from ..slurm.model import DRAIN_PREFIX, Job, Node, SlurmState
from ..slurm.reservations import Reservation, lend_reservation_name
from . import slurmrules
from .params import COMPLETED, JOB_END
from .state import SimState
from .traces import TrainingJob


class _Job:
    __slots__ = ("id", "submit", "gpus", "remaining", "first_start", "state", "token", "alloc", "run_start",
                 "overhead", "signalled", "restarts", "record", "end", "bound", "limit", "lent_gpus",
                 "requeue", "unreserved")

    def __init__(self, j: TrainingJob):
        self.id, self.submit, self.gpus, self.remaining, self.limit = j.id, j.submit, j.gpus, j.duration, j.limit
        self.first_start: float | None = None
        self.state = "pending"
        self.token = 0
        self.alloc: list[tuple[str, int]] = []
        self.run_start = 0.0
        self.overhead = 0.0
        self.signalled: float | None = None
        self.restarts = 0
        self.record: Job | None = None
        #: when it ends, and when its time limit ends (what Slurm plans with and shows as EndTime)
        self.end = self.bound = 0.0
        self.lent_gpus = 0
        #: it started on a lent node that had no lending reservation then (no end in sight for it there)
        self.unreserved = False
        #: may Slurm requeue it (no --no-requeue): every trace job may, as training jobs that checkpoint are submitted
        self.requeue = True


class _SNode:
    """A Slurm node."""

    __slots__ = ("name", "lent", "free", "jobs", "drain", "down", "reason", "record", "oracle_index", "reserved")

    def __init__(self, name: str, lent: bool, gpus: int):
        self.name, self.lent, self.free = name, lent, gpus
        #: the lending reservation's start (simulated seconds), or None
        self.reserved: float | None = None
        self.jobs: dict[int, None] = {}
        self.drain = self.down = False
        self.reason = ""
        self.record: Node | None = None
        self.oracle_index = -1


class SlurmSide(SimState):
    def _init_slurm(self, jobs: list[TrainingJob]) -> None:
        self.jobs = [_Job(j) for j in jobs]
        self.queue: list[int] = []
        self.snodes: dict[str, _SNode] = {}
        #: usable nodes by (lent, free GPUs) -> names (dicts as ordered sets)
        self.buckets: dict[tuple[bool, int], dict[str, None]] = {
            (lent, f): {} for lent in (False, True) for f in range(self.G + 1)}
        self.free_total = 0
        self.running: dict[int, _Job] = {}
        self.active_records: dict[int, Job] = {}
        self.slurm_dirty = True
        self.slurm_state: SlurmState | None = None
        self.sched_needed = False
        #: lending reservations: node name -> start (simulated seconds); they outlive a
        #: deleted node, as Slurm's do
        self.reservations: dict[str, float] = {}
        self.gres = f"gpu:sim:{self.G}"
        for k in range(self.shape.slurm_nodes):
            self._add_snode(f"slurm-{k:04d}", lent=False)

    def _usable(self, s: _SNode) -> bool:
        return not s.drain and not s.down

    def _set_free(self, s: _SNode, free: int) -> None:
        if self._usable(s):
            self.buckets[(s.lent, s.free)].pop(s.name, None)
            self.free_total += free - s.free
            self.buckets[(s.lent, free)][s.name] = None
        s.free = free
        s.record = None
        self.slurm_dirty = True

    def _add_snode(self, name: str, lent: bool) -> _SNode:
        s = _SNode(name, lent, self.G)
        self.snodes[name] = s
        self.buckets[(lent, self.G)][name] = None
        self.free_total += self.G
        self.slurm_dirty = True
        self.sched_needed = True
        if lent:
            self.lent_nodes += 1
        return s

    def _unusable(self, s: _SNode) -> None:
        """Drained or down: no new jobs."""
        if self._usable(s):
            self.buckets[(s.lent, s.free)].pop(s.name, None)
            self.free_total -= s.free

    def _remove_snode(self, s: _SNode) -> None:
        self._unusable(s)
        del self.snodes[s.name]
        self.slurm_dirty = True
        if s.lent:
            self.lent_nodes -= 1

    def _node_record(self, s: _SNode) -> Node:
        if s.record is None:
            if s.down:
                state = "down"
            elif s.free == self.G and not s.jobs:
                state = "idle"
            elif s.free == 0:
                state = "allocated"
            else:
                state = "mixed"
            flags = set()
            if s.drain:
                flags.add("DRAIN")
            if any(self.jobs[j].state == "completing" for j in s.jobs):
                flags.add("COMPLETING")
            s.record = Node(name=s.name, state=state, flags=frozenset(flags), reason=s.reason,
                            features=(lent_nodeset(self.partition),) if s.lent else (),
                            partitions=(self.partition,), cpus=64, alloc_cpus=0, gres=self.gres, address="")
        return s.record

    def _job_record(self, j: _Job) -> Job:
        if j.record is None:
            j.record = Job(job_id=j.id + 1, name=f"train-{j.id}", user="trace",
                           state="RUNNING" if j.state == "running" else "COMPLETING", partition=self.partition,
                           nodes=",".join(n for n, _ in j.alloc), requeue=j.requeue, restart_count=j.restarts, reason="",
                           gpus=j.gpus, start_time=int(self.epoch_s + j.run_start),
                           end_time=int(self.epoch_s + j.bound) if j.state == "running" else None)
        return j.record

    def observed_slurm(self) -> SlurmState:
        if self.slurm_dirty or self.slurm_state is None:
            t0 = int(self.epoch_s)
            self.slurm_state = SlurmState(tuple(self._node_record(s) for s in self.snodes.values()),
                                          tuple(self.active_records.values()),
                                          reservations=tuple(Reservation(lend_reservation_name(n), n, t0 + round(t))
                                                             for n, t in self.reservations.items()))
            self.slurm_dirty = False
        return self.slurm_state

    def _place(self, j: _Job, end: float) -> list[tuple[str, int]] | None:
        G = self.G
        if j.gpus <= G:
            for lent in (False, True):
                for f in range(j.gpus, G + 1):
                    names = self.buckets[(lent, f)]
                    if not names:
                        continue
                    if self.mode == "oracle" and lent:
                        for name in names:
                            if self._oracle_free_until(self.snodes[name]) >= end:
                                return [(name, j.gpus)]
                        continue
                    if lent and self.reservations:
                        for name in names:
                            if self._fits_reservation(name, end):
                                return [(name, j.gpus)]
                        continue
                    return [(next(iter(names)), j.gpus)]
            return None
        need = math.ceil(j.gpus / G)
        chosen: list[str] = []
        for lent in (False, True):
            for name in self.buckets[(lent, G)]:
                if len(chosen) == need:
                    break
                if self.mode == "oracle" and lent and self._oracle_free_until(self.snodes[name]) < end:
                    continue
                if lent and not self._fits_reservation(name, end):
                    continue
                chosen.append(name)
        if len(chosen) < need:
            return None
        left = j.gpus
        out = []
        for name in chosen:
            out.append((name, min(G, left)))
            left -= G
        return out

    def _fits_reservation(self, name: str, end: float) -> bool:
        """A job ending at ``end`` may start on the node: it ends before the
        node's lending reservation starts (none: it may)."""
        start = self.reservations.get(name)
        return start is None or end <= start

    def _reservation(self, need: int, free: int) -> tuple[float, int]:
        """EASY backfill's reservation for the first job that cannot start:
        when enough GPUs will be free, and how many are spare then."""
        ends = sorted((j.bound, j.gpus) for j in self.running.values())
        acc = free
        for end, gpus in ends:
            acc += gpus
            if acc >= need:
                return end, acc - need
        return math.inf, 0

    def schedule(self) -> None:
        self.sched_needed = False
        if not self.queue or self.free_total <= 0:
            return
        t = self.t
        free = self.free_total
        shadow: float | None = None
        extra = 0
        started: list[int] = []
        for jid in self.queue[:self.queue_depth]:
            j = self.jobs[jid]
            overhead = self.lat.restart if j.restarts else 0.0
            runtime = overhead + j.remaining
            end = t + overhead + (j.remaining if j.limit is None else j.limit)  # what Slurm plans with
            fits = j.gpus <= free
            if fits and shadow is not None and not (end <= shadow or j.gpus <= extra):
                continue
            alloc = self._place(j, end) if fits else None
            if alloc is None:
                if shadow is None and self.time_limits:
                    shadow, extra = self._reservation(j.gpus, free)
                continue
            if shadow is not None and end > shadow:
                extra -= j.gpus
            self._start(j, alloc, runtime, end)
            free = self.free_total
            started.append(jid)
            if free <= 0:
                break
        if started:
            gone = set(started)
            self.queue = [x for x in self.queue if x not in gone]

    def _start(self, j: _Job, alloc: list[tuple[str, int]], runtime: float, bound: float) -> None:
        t = self.t
        self.advance(t)
        j.state = "running"
        j.alloc = alloc
        j.run_start = t
        j.overhead = self.lat.restart if j.restarts else 0.0
        j.signalled = None
        j.end, j.bound = t + runtime, bound
        j.token += 1
        j.record = None
        if j.first_start is None:
            j.first_start = t
            self.res.queueing.append(t - j.submit)
            self.res.delay_of[j.id] = t - j.submit
        lent = 0
        j.unreserved = False
        for name, g in alloc:
            s = self.snodes[name]
            s.jobs[j.id] = None
            self._set_free(s, s.free - g)
            if s.lent:
                lent += g
                j.unreserved = j.unreserved or name not in self.reservations
        j.lent_gpus = lent
        self.lent_gpus += lent
        self.own_gpus += j.gpus - lent
        self.running[j.id] = j
        self.active_records[j.id] = self._job_record(j)
        self.slurm_dirty = True
        self.push(j.end, JOB_END, j.id, j.token)
        self.changed()

    def _stop_using(self, j: _Job) -> None:
        """The job stops using its GPUs (ended, or requeued): for the accounting."""
        self.advance(self.t)
        self.lent_gpus -= j.lent_gpus
        self.own_gpus -= j.gpus - j.lent_gpus
        j.lent_gpus = 0
        self.running.pop(j.id, None)

    def _release(self, j: _Job) -> None:
        for name, g in j.alloc:
            s = self.snodes.get(name)
            if s is not None:
                s.jobs.pop(j.id, None)
                self._set_free(s, s.free + g)
        j.alloc = []
        self.active_records.pop(j.id, None)
        self.slurm_dirty = True
        self.sched_needed = True
        self.changed()

    def job_end(self, jid: int, token: int) -> None:
        j = self.jobs[jid]
        if j.token != token or j.state != "running":
            return
        self._stop_using(j)
        j.state = "done"
        self.res.jct.append(self.t - j.submit)
        self._release(j)

    def end_job(self, jid: int, cancel: bool) -> None:
        """Requeue (or cancel) a running job: it loses the work since its last completed checkpoint."""
        j = self.jobs[jid]
        if j.state != "running":
            return
        t = self.t
        self._stop_using(j)
        done = min(max(0.0, t - j.run_start - j.overhead), j.remaining)
        saved = 0.0
        if not cancel and j.signalled is not None and t - j.signalled >= self.lat.checkpoint:
            saved = min(max(0.0, j.signalled - j.run_start - j.overhead), j.remaining)
        lost = (done if cancel else done - saved) + min(t - j.run_start, j.overhead)
        self.res.lost_gpu_seconds += lost * j.gpus
        if j.unreserved:
            self.res.lost_gpu_seconds_unreserved += lost * j.gpus
        j.remaining -= saved
        j.state = "cancelling" if cancel else "completing"
        j.token += 1
        j.record = None
        self.active_records[j.id] = self._job_record(j)
        for name, _ in j.alloc:
            s = self.snodes.get(name)
            if s is not None:
                s.record = None
        self.slurm_dirty = True
        if cancel:
            self.res.cancelled += 1
        else:
            self.res.requeued += 1
        self.push(t + self.lat.requeue, COMPLETED, jid, j.token)
        self.changed()

    def completed(self, jid: int, token: int) -> None:
        j = self.jobs[jid]
        if j.token != token:
            return
        cancelled = j.state == "cancelling"
        self._release(j)
        if cancelled:
            j.state = "cancelled"
        else:
            j.state = "pending"
            j.restarts += 1
            j.record = None
            self.queue.append(jid)  # Slurm resets a requeued job's submit time: the back of the queue


class SimSlurm:
    """The simulated Slurm as the executor of Slurm steps sees it: the
    :class:`~slurmk8s.slurm.control.SlurmControl` operations
    :func:`slurmk8s.slurm.steps.apply_step` calls, each changing the
    simulator's state. Where Slurm refuses it raises :class:`SlurmError` with
    Slurm's message (never an unreachable one: the simulated slurmctld
    always answers). Slurm job ids are the trace's index plus one."""

    def __init__(self, sim: SlurmSide):
        self.sim = sim

    def _node(self, name: str, argv: list[str]) -> _SNode:
        s = self.sim.snodes.get(name)
        if s is None:
            raise SlurmError(argv, 1, "Invalid node name specified")
        return s

    def drain(self, name: str, reason: str) -> None:
        s = self._node(name, ["scontrol", "update", f"nodename={name}", "state=drain"])
        if not s.drain:  # someone else's drain is kept
            self.sim._unusable(s)
            s.drain, s.reason, s.record = True, f"{DRAIN_PREFIX} {reason}", None
            self.sim.slurm_dirty = True
            self.sim.changed()

    def set_down(self, name: str, reason: str) -> None:
        s = self._node(name, ["scontrol", "update", f"nodename={name}", "state=down"])
        sim = self.sim
        sim._unusable(s)
        s.down, s.reason, s.record = True, f"{DRAIN_PREFIX} {reason}", None
        sim.slurm_dirty = True
        for jid in list(s.jobs):
            sim.end_job(jid, cancel=slurmrules.on_node_down(sim.jobs[jid].requeue) == slurmrules.ENDED)
        sim.changed()

    def undrain(self, name: str) -> None:
        s = self.sim.snodes.get(name)
        if s is None or not s.drain:
            return
        if not s.reason.startswith(DRAIN_PREFIX):
            raise NotOurDrain(f"node {name} was drained by someone else ({s.reason!r}); leaving it drained")
        sim = self.sim
        s.drain, s.reason, s.record = False, "", None
        if sim._usable(s):  # takes jobs again
            sim.buckets[(s.lent, s.free)][s.name] = None
            sim.free_total += s.free
        sim.slurm_dirty = sim.sched_needed = True
        sim.changed()

    def signal_node_jobs(self, name: str, signal: str) -> list[int]:
        """Each running job on the node remembers when it was first signalled (its checkpoint starts then)."""
        s = self.sim.snodes.get(name)
        if s is None:
            return []
        ids = []
        for jid in s.jobs:
            j = self.sim.jobs[jid]
            if j.state == "running":
                if j.signalled is None:
                    j.signalled = self.sim.t
                ids.append(jid + 1)
        return ids

    def requeue(self, job_id: int) -> None:
        j = self.sim.jobs[job_id - 1]
        if slurmrules.on_requeue(j.requeue) is None:
            raise SlurmError(["scontrol", "requeue", str(job_id)], 1, "Requested operation is presently disabled")
        self.sim.end_job(job_id - 1, cancel=False)

    def start_now(self, job_id: int) -> None:
        """A requeued job is eligible at once here."""

    def cancel(self, job_id: int) -> None:
        self.sim.end_job(job_id - 1, cancel=slurmrules.on_cancel() == slurmrules.ENDED)

    def reserve(self, name: str, start: int) -> None:
        self._node(name, ["scontrol", "create", "reservation", f"Nodes={name}"])
        self.sim.reservations[name] = start - self.sim.epoch_s
        self.sim.slurm_dirty = self.sim.sched_needed = True
        self.sim.changed()

    def unreserve(self, name: str) -> None:
        if self.sim.reservations.pop(name, None) is not None:
            self.sim.slurm_dirty = self.sim.sched_needed = True
            self.sim.changed()

    def delete_node(self, name: str) -> None:
        s = self.sim.snodes.get(name)
        if s is None:
            return  # gone already is fine
        if not slurmrules.may_delete_node(len(s.jobs)):
            raise SlurmError(["scontrol", "delete", f"nodename={name}"], 1, "Requested nodes are busy")
        self.sim._remove_snode(s)
        self.sim.changed()
