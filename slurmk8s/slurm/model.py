"""What slurmk8s reads from Slurm: nodes and jobs, parsed from ``--json`` output.

Pure functions from Slurm's JSON to small frozen records, for every supported
release: 22.05's openapi shape (``sinfo --json`` nodes with ``state`` and
``state_flags``; plain numbers) and the data_parser shapes of later releases
(``scontrol --json show nodes`` with ``state`` a list; numbers wrapped as
``{"set", "number"}``; job states as lists). Which command gives the node
records is the version table's ``nodes_command``; ``tests/fixtures/slurm-json/``
holds each release's real output.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from ..strict import count
from .reservations import Reservation

#: The most GPUs a gres or TRES string may name (more reads as none).
MAX_GPUS = 1 << 20

#: Every drain slurmk8s sets starts with this; drains without it belong to an
#: administrator and are never cleared by slurmk8s.
DRAIN_PREFIX = "slurmk8s:"
#: A worker pod someone deleted (kubectl delete, an eviction): the slurmd
#: entrypoint drains its node with this reason (``SLURMK8S_DRAIN_REASON``, set
#: by the renderer), and the operator empties it by the one evacuation rule
#: before the entrypoint's last resort would fire.
POD_TERMINATING = "pod terminating"
#: The health check (images/slurmd/healthcheck.sh) drains a failing node with
#: ``slurmk8s: health: <check>`` and resumes it once it passes; only it does.
HEALTH_PREFIX = f"{DRAIN_PREFIX} health: "


def unhealthy(nodes: Iterable[Node]) -> dict[str, str]:
    """Node -> the health check it failed, for the nodes the health check drained: the name
    that starts the reason's rest (``gpus`` of ``slurmk8s: health: gpus: GPU /dev/nvidia1
    (...): 3 uncorrectable ECC errors``; check names have no space, colon or bracket). Pure."""
    return {n.name: re.split(r"[\s:\[]", n.reason[len(HEALTH_PREFIX):].strip(), maxsplit=1)[0] or "unknown"
            for n in nodes if n.drain_set and n.reason.startswith(HEALTH_PREFIX)}


@dataclass(frozen=True)
class Node:
    name: str
    #: Base state, lower case: idle, mixed, allocated, down, unknown, future, ...
    state: str
    #: State flags, upper case: DRAIN, NOT_RESPONDING, DYNAMIC_NORM, COMPLETING, ...
    flags: frozenset[str]
    reason: str
    features: tuple[str, ...]
    partitions: tuple[str, ...]
    cpus: int
    alloc_cpus: int
    gres: str
    address: str
    #: Its GRES allocated to jobs, as Slurm prints them (``gpu:h100:1(IDX:0)``).
    gres_used: str = ""

    @property
    def gpus(self) -> int:
        """GPUs the node has (its ``gres``)."""
        return gres_gpus(self.gres)

    @property
    def gpus_alloc(self) -> int:
        """GPUs allocated to jobs (its ``gres_used``)."""
        return gres_gpus(self.gres_used)

    @property
    def drain_set(self) -> bool:
        return "DRAIN" in self.flags

    @property
    def drained(self) -> bool:
        """Drain set and nothing left running: safe to remove."""
        return self.drain_set and self.state in ("idle", "down") and "COMPLETING" not in self.flags

    @property
    def drain_is_ours(self) -> bool:
        return self.drain_set and self.reason.startswith(DRAIN_PREFIX)

    @property
    def responding(self) -> bool:
        return "NOT_RESPONDING" not in self.flags and self.state not in ("down", "unknown")

    @property
    def busy(self) -> bool:
        return self.state in ("mixed", "allocated") or "COMPLETING" in self.flags

    @property
    def bucket(self) -> str:
        """The status.nodeCounts field this node is counted in."""
        if self.state == "down" or "NOT_RESPONDING" in self.flags:
            return "down"
        if self.drain_set:
            return "drain"
        if self.state in ("idle", "mixed", "allocated"):
            return self.state
        return "other"


#: Job states in which a job holds its nodes.
ACTIVE_JOB_STATES = frozenset({"RUNNING", "COMPLETING", "SUSPENDED", "CONFIGURING", "STOPPED"})


@dataclass(frozen=True, slots=True)
class Job:
    job_id: int
    name: str
    #: Its user's name, as the reading host resolves its uid ("" where it cannot).
    user: str
    #: PENDING, RUNNING, COMPLETING, COMPLETED, FAILED, CANCELLED, TIMEOUT, ...
    state: str
    partition: str
    nodes: str
    requeue: bool
    restart_count: int
    reason: str
    array_job_id: int | None = None
    array_task_id: int | None = None
    #: When a pending job may start (POSIX seconds; None: not reported). A
    #: requeued job is held here for Slurm's requeue delay, reported as
    #: reason BeginTime only once it has left COMPLETING.
    eligible_time: int | None = None
    account: str = ""
    #: When it was submitted and started (POSIX seconds; None: not reported, or not started).
    submit_time: int | None = None
    start_time: int | None = None
    #: GPUs allocated to it (``tres_alloc_str``); while pending, those it asks for.
    gpus: int = 0
    #: When a running job's time limit ends (POSIX seconds; None: not reported, or no limit).
    end_time: int | None = None
    #: When the job last wrote a checkpoint (POSIX seconds; None: not known).
    checkpoint_time: int | None = None
    #: Its user's uid (None: not reported).
    user_id: int | None = None

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_JOB_STATES


@dataclass(frozen=True)
class SlurmState:
    """What was read of one cluster's Slurm this round, by the operator and the bridge alike.

    ``nodes`` None: Slurm could not be read; every decision that depends on
    it changes nothing (fail closed). ``jobs`` None: the jobs are not known,
    either because their read failed (fail closed) or, where ``jobs_read``
    is False, because nobody asked yet: the operator reads nodes every round
    and jobs only once a decision needs them (``Decision.needs_jobs``), and
    a decision on a state whose jobs were not asked for asks instead of
    acting. The bridge reads both every round. An empty tuple means Slurm
    answered and has none.

    The records are immutable and the tuples are kept as given, so the same
    state gives the same answers: the bridge's indexes are remembered on its
    identity (``bridge/world.py``).
    """

    nodes: tuple[Node, ...] | None
    jobs: tuple[Job, ...] | None = None
    #: False: the jobs were not asked for yet (``jobs`` is then None).
    jobs_read: bool = True
    #: The lending reservations (:data:`.reservations.LEND_RESERVATION_PREFIX`), as read;
    #: None: not read (the operator never asks), or the read failed.
    reservations: tuple[Reservation, ...] | None = None

    @classmethod
    def unknown(cls) -> SlurmState:
        """Slurm could not be read."""
        return cls(None, None)

    @classmethod
    def nodes_only(cls, nodes: Iterable[Node] | None) -> SlurmState:
        """The nodes as read (None: the read failed), the jobs not asked for yet."""
        return cls(None if nodes is None else tuple(nodes), None, jobs_read=False)

    def with_jobs(self, jobs: Iterable[Job] | None) -> SlurmState:
        """These nodes, and the jobs as read once asked for (None: the read failed)."""
        return SlurmState(self.nodes, None if jobs is None else tuple(jobs), reservations=self.reservations)

    @property
    def known(self) -> bool:
        """Both the nodes and the jobs were read."""
        return self.nodes is not None and self.jobs is not None

    @cached_property
    def nodes_by_name(self) -> Mapping[str, Node]:
        """The nodes by name; empty when they could not be read."""
        return {n.name: n for n in self.nodes or ()}

    def node(self, name: str) -> Node | None:
        """The node called ``name``; None when Slurm has none by that name (or could not be read)."""
        return self.nodes_by_name.get(name)


def gres_gpus(text: str) -> int:
    """The GPUs a node's ``gres`` or ``gres_used`` names: ``gpu:4``, ``gpu:a100:2(S:0-1)``,
    ``gpu:a100:1(IDX:0),gpu:h100:2(IDX:1-2)``; a plain ``gpu`` is one. Pure."""
    total, depth = 0, 0
    item: list[str] = []
    for ch in (text or "") + ",":
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts = "".join(item).split("(", 1)[0].split(":")
            if parts[0] == "gpu":
                total += (count(parts[-1], MAX_GPUS) or 0) if len(parts) > 1 else 1
            item = []
        else:
            item.append(ch)
    return total


def tres_gpus(text: str) -> int:
    """``gres/gpu=N`` of a TRES string (``cpu=2,mem=1G,gres/gpu=2,gres/gpu:a100=2``). Pure."""
    for part in (text or "").split(","):
        key, _, value = part.partition("=")
        if key == "gres/gpu" and (gpus := count(value, MAX_GPUS)) is not None:
            return gpus
    return 0


def _split(value: Any) -> tuple[str, ...]:
    if isinstance(value, list):
        return tuple(str(v) for v in value)
    return tuple(v for v in str(value or "").split(",") if v)


def release_of(data: dict) -> str:
    """The Slurm release (``YY.MM``) whose command printed ``data``, from its ``meta``."""
    meta = data.get("meta") or {}
    slurm = meta.get("slurm") or meta.get("Slurm") or {}
    version = slurm.get("version") or {}
    try:
        return f"{int(version['major']):02d}.{int(version['minor']):02d}"
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"no Slurm version in the JSON's meta: {json.dumps(meta)[:200]}") from None


def node_from_json(d: dict) -> Node:
    state = d.get("state", "unknown")
    if isinstance(state, list):  # data_parser (23.02+): the base state, then its flags
        base, *rest = state or ["unknown"]
        state, flags = str(base).lower(), {str(f).upper() for f in rest}
    else:
        state = str(state).lower()
        flags = {str(f).upper() for f in d.get("state_flags", [])}
    return Node(
        name=d["name"],
        state=state,
        flags=frozenset(flags),
        reason=d.get("reason") or "",
        features=_split(d.get("active_features") or d.get("features")),
        partitions=_split(d.get("partitions")),
        cpus=int(d.get("cpus") or 0),
        alloc_cpus=int(d.get("alloc_cpus") or 0),
        gres=d.get("gres") or "",
        address=d.get("address") or "",
        gres_used=d.get("gres_used") or "",
    )


def _number(value: Any) -> int | None:
    """Slurm >= 23.02 wraps numbers as {"set": bool, "number": n}."""
    if isinstance(value, dict):
        return int(value["number"]) if value.get("set") else None
    return None if value is None else int(value)


#: Job state flags that Slurm's job_state_string() reports instead of the base state, in its
#: order: 22.05's job_state is that one word. The data_parser shapes (24.11, 26.05) list the base
#: state first and the flags after it (a requeued job still ending is ["PENDING", "COMPLETING"]),
#: so the same word is picked from the list: one meaning of Job.state on every release.
JOB_STATE_FLAGS = ("COMPLETING", "STAGE_OUT", "CONFIGURING", "RESIZING", "REQUEUED", "REQUEUE_FED",
                   "REQUEUE_HOLD", "SPECIAL_EXIT", "STOPPED", "REVOKED", "RESV_DEL_HOLD", "SIGNALING")


def _job_state(value: Any) -> str:
    if not isinstance(value, list):
        return str(value)
    states = [str(v) for v in value]
    return next((f for f in JOB_STATE_FLAGS if f in states), states[0] if states else "UNKNOWN")


def job_from_json(d: dict) -> Job:
    state = _job_state(d.get("job_state", "UNKNOWN"))
    array_job = _number(d.get("array_job_id"))
    intern = sys.intern  # users, states, partitions and reasons repeat over thousands of jobs
    job_id = _number(d["job_id"])
    if job_id is None:
        raise TypeError(f"a job without its id: job_id is {d['job_id']!r}")
    return Job(
        job_id=job_id,
        name=d.get("name", ""),
        user=intern(str(d.get("user_name", ""))),
        state=intern(str(state)),
        partition=intern(str(d.get("partition", ""))),
        nodes=intern(str(d.get("nodes", ""))),
        requeue=bool(d.get("requeue", False)),
        restart_count=int(_number(d.get("restart_cnt")) or 0),
        reason=intern(str(d.get("state_reason", ""))),
        array_job_id=array_job or None,
        array_task_id=_number(d.get("array_task_id")),
        eligible_time=_number(d.get("eligible_time")) or None,
        account=intern(str(d.get("account") or "")),
        submit_time=_number(d.get("submit_time")) or None,
        start_time=_number(d.get("start_time")) or None,
        gpus=tres_gpus(d.get("tres_alloc_str") or "") or tres_gpus(d.get("tres_req_str") or ""),
        end_time=_number(d.get("end_time")) or None,
        user_id=_number(d.get("user_id")),
    )


class JsonItems:
    """The items of the array ``data[key]`` of one JSON object that arrives as text
    chunks, one item at a time: a command's output is never held whole, nor its
    whole parse tree (``squeue --json`` at Slurm's MaxJobCount is hundreds of MiB
    parsed). Only the top-level object is walked by hand; every value in it is
    parsed by :mod:`json` itself. The other members of the object are read whole
    (``meta``, ``errors``: small) and kept in :attr:`others`, once iterated. A missing
    ``key`` gives no items. Raises ValueError for what is not such JSON, or a ``key``
    that is not an array.
    """

    def __init__(self, chunks: Iterable[str], key: str):
        self._chunks = iter(chunks)
        self._key = key
        self._buf = ""
        self._pos = 0
        self._eof = False
        self._decoder = json.JSONDecoder()
        self.others: dict[str, Any] = {}

    def _more(self) -> None:
        """Read at least as much again as is buffered (linear however large one value is)."""
        if self._eof:
            raise ValueError("the JSON ends too early")
        want = max(len(self._buf) - self._pos, 1)
        got = [self._buf[self._pos:]]
        size = 0
        while size < want:
            chunk = next(self._chunks, None)
            if chunk is None:
                self._eof = True
                break
            got.append(chunk)
            size += len(chunk)
        self._buf, self._pos = "".join(got), 0

    def _char(self) -> str:
        """The next character that is not white space (not consumed)."""
        while True:
            buf, pos = self._buf, self._pos
            while pos < len(buf) and buf[pos] in " \t\r\n":
                pos += 1
            self._pos = pos
            if pos < len(buf):
                return buf[pos]
            self._more()

    def _expect(self, chars: str) -> str:
        c = self._char()
        if c not in chars:
            raise ValueError(f"expected one of {chars!r} in the JSON at offset {self._pos}, not {c!r}")
        self._pos += 1
        return c

    def _value(self) -> Any:
        self._char()
        while True:
            try:
                value, end = self._decoder.raw_decode(self._buf, self._pos)
            except json.JSONDecodeError:
                if self._eof:
                    raise ValueError("the JSON is not valid") from None
                self._more()
                continue
            if (not self._eof and isinstance(value, (int, float)) and not isinstance(value, bool)
                    and (end == len(self._buf) or self._buf[end] not in " \t\r\n,]}")):
                self._more()  # a number may go on in the next chunk ("0" of "0.5")
                continue
            self._pos = end
            return value

    def __iter__(self) -> Iterator[Any]:
        self._expect("{")
        if self._char() == "}":
            self._pos += 1
            return
        while True:
            name = self._value()
            if not isinstance(name, str):
                raise ValueError("a JSON object key is not a string")
            self._expect(":")
            if name == self._key:
                self._expect("[")
                if self._char() == "]":
                    self._pos += 1
                else:
                    while True:
                        yield self._value()
                        if self._expect(",]") == "]":
                            break
            else:
                self.others[name] = self._value()
            if self._expect(",}") == "}":
                break
        while True:  # nothing but white space after the object
            if self._buf[self._pos:].strip(" \t\r\n"):
                raise ValueError(f"more than one JSON value (at offset {self._pos})")
            if self._eof:
                return
            self._buf, self._pos = "", 0
            self._more()


# The agent's wire form (JSON) of the records: lists for tuples and sets.


def node_to_dict(n: Node) -> dict:
    return {
        "name": n.name, "state": n.state, "flags": sorted(n.flags), "reason": n.reason,
        "features": list(n.features), "partitions": list(n.partitions), "cpus": n.cpus,
        "alloc_cpus": n.alloc_cpus, "gres": n.gres, "address": n.address,
        "gres_used": n.gres_used,
    }


def node_from_dict(d: dict) -> Node:
    return Node(
        name=str(d["name"]), state=str(d["state"]), flags=frozenset(map(str, d["flags"])),
        reason=str(d["reason"]), features=tuple(map(str, d["features"])),
        partitions=tuple(map(str, d["partitions"])), cpus=int(d["cpus"]),
        alloc_cpus=int(d["alloc_cpus"]), gres=str(d["gres"]), address=str(d["address"]),
        gres_used=str(d.get("gres_used", "")),  # absent from an older agent
    )


def job_to_dict(j: Job) -> dict:
    return {
        "job_id": j.job_id, "name": j.name, "user": j.user, "state": j.state,
        "partition": j.partition, "nodes": j.nodes, "requeue": j.requeue,
        "restart_count": j.restart_count, "reason": j.reason,
        "array_job_id": j.array_job_id, "array_task_id": j.array_task_id, "eligible_time": j.eligible_time,
        "account": j.account, "submit_time": j.submit_time, "start_time": j.start_time, "gpus": j.gpus,
        "end_time": j.end_time, "checkpoint_time": j.checkpoint_time, "user_id": j.user_id,
    }


def job_from_dict(d: dict) -> Job:
    def opt(v):
        return None if v is None else int(v)

    return Job(
        job_id=int(d["job_id"]), name=str(d["name"]), user=str(d["user"]), state=str(d["state"]),
        partition=str(d["partition"]), nodes=str(d["nodes"]), requeue=bool(d["requeue"]),
        restart_count=int(d["restart_count"]), reason=str(d["reason"]),
        array_job_id=opt(d.get("array_job_id")), array_task_id=opt(d.get("array_task_id")),
        eligible_time=opt(d.get("eligible_time")),
        account=str(d.get("account", "")), submit_time=opt(d.get("submit_time")),  # absent from an older agent
        start_time=opt(d.get("start_time")), gpus=int(d.get("gpus", 0)), end_time=opt(d.get("end_time")),
        checkpoint_time=opt(d.get("checkpoint_time")), user_id=opt(d.get("user_id")),
    )


def config_hash(files: Mapping[str, str]) -> str:
    """A short, stable digest of config files (order-independent): the operator
    renders it, the agent reports what slurmctld reads; equal when they agree."""
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + files[name].encode() + b"\0")
    return h.hexdigest()[:16]
