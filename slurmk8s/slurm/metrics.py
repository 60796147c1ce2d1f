"""Slurm's own metrics, in Prometheus's text format: what the agent serves on
its metrics port (``GET /metrics``, no token; docs/metrics.md lists every
metric and its labels).

The core is pure: :func:`families` turns one reading of Slurm (:class:`Reading`:
the nodes, the jobs, ``sdiag``'s text and whether slurmdbd answered) into
metric families, and :class:`QueueWait` keeps the one thing that spans
readings, the queue-wait histogram of the jobs seen to start. No job id, user
or node name becomes a label: the labels are partitions, accounts, states and
reasons, which an administrator or Slurm itself defines, so the number of
series does not grow with the jobs or the nodes. An account is a label only
when slurmdbd knows it (``sacctmgr show account``): without accounting, or
without association enforcement, ``sbatch --account`` takes any word, and
those jobs count under ``(other)``. Every label also has a hard cap on its
values (:data:`MAX_LABEL_VALUES`); past it, the rest count under ``(other)``.

:class:`SlurmMetrics` is the thin shell: it reads Slurm through the facade
once per interval in a thread of its own, whoever scrapes (two Prometheus
replicas scraping every 15 s cost slurmctld no more than one does), and keeps
serving the last reading, with ``slurmk8s_slurm_up`` 0, when a read fails.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from .. import log
from ..api.cluster import LENT_PREFIX
from .model import Job, Node

__all__ = ["Reading", "Diagnostics", "QueueWait", "families", "parse_sdiag", "SlurmMetrics",
           "QUEUE_WAIT_BUCKETS", "NODE_STATES", "GPU_STATES", "OTHER", "MAX_LABEL_VALUES"]

#: Queue wait buckets, seconds: from a job that starts at once to one that waited a day.
QUEUE_WAIT_BUCKETS = (10, 30, 60, 300, 900, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 24 * 3600)
#: Node states, as the SlurmCluster's status.nodeCounts counts them (``Node.bucket``).
NODE_STATES = ("idle", "mixed", "allocated", "drain", "down", "other")
#: What a GPU is doing: allocated to a job, idle on a node that takes jobs, or
#: unavailable (on a node that is down or drained, and not allocated).
GPU_STATES = ("allocated", "idle", "unavailable")
#: The label value of what is not shown by name: an account slurmdbd does not know,
#: and any value past a label's cap. Parentheses: no Slurm partition or account is so named.
OTHER = "(other)"
#: The most values each label takes in one reading, ``(other)`` included:
#: partitions (spec.partitions holds at most 64; a pending job's ``-p a,b`` is
#: one more value), Slurm's pending reasons (a few dozen) and accounts
#: (spec.accounting.accounts holds at most 1000, and login users get one each).
MAX_LABEL_VALUES = {"partition": 128, "reason": 128, "account": 1024, "state": 64}
#: Job states of jobs that have started (their start time is a real one; a
#: pending job's start time is Slurm's estimate).
_STARTED = frozenset({"RUNNING", "COMPLETING", "COMPLETED", "FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                      "SUSPENDED", "PREEMPTED", "STOPPED", "CONFIGURING", "SIGNALING", "STAGE_OUT"})


@dataclass(frozen=True)
class Diagnostics:
    """What the metrics take of ``sdiag``; None where this release's sdiag did not print it."""

    server_threads: int | None = None
    agent_queue: int | None = None
    dbd_queue: int | None = None
    #: scheduler (main, backfill) -> value: cycles run, last and mean cycle (microseconds)
    cycles: dict[str, int] = field(default_factory=dict)
    last_cycle_us: dict[str, int] = field(default_factory=dict)
    mean_cycle_us: dict[str, int] = field(default_factory=dict)
    queue_length: int | None = None
    backfilled_jobs: int | None = None
    #: RPCs slurmctld served since it started (the sum over message types)
    rpcs: int | None = None


_KEY = re.compile(r"^\s*([A-Za-z][A-Za-z ()/-]*?):\s+(\d+)\b")
_RPC = re.compile(r"\bcount:\s*(\d+)")


def parse_sdiag(text: str) -> Diagnostics:
    """``sdiag``'s text (every supported release prints the same sections). Pure."""
    values: dict[tuple[str, str], int] = {}  # (section, key) -> value; "" for the top-level lines
    section = ""
    rpcs: int | None = None  # 0 from the RPC section's head on
    for line in text.splitlines():
        if line and not line[0].isspace():  # a top-level line, maybe a section's head
            head = line.strip().lower()
            section = ("main" if head.startswith("main schedule statistics")
                       else "backfill" if head.startswith("backfilling stats")
                       else "rpc" if head.startswith("remote procedure call statistics by message type")
                       else "")
            if section == "rpc":
                rpcs = 0
        if section == "rpc":
            m = _RPC.search(line)
            rpcs = (rpcs or 0) + (int(m[1]) if m else 0)
            continue
        m = _KEY.match(line)
        if m:
            values.setdefault((section if line[0].isspace() else "", m[1].strip().lower()), int(m[2]))
    get = values.get
    schedulers = ("main", "backfill")

    def per(key: str) -> dict[str, int]:
        return {s: v for s in schedulers if (v := get((s, key))) is not None}

    return Diagnostics(
        server_threads=get(("", "server thread count")),
        agent_queue=get(("", "agent queue size")),
        dbd_queue=get(("", "dbd agent queue size")),
        cycles=per("total cycles"),
        last_cycle_us=per("last cycle"),
        mean_cycle_us=per("mean cycle"),
        queue_length=get(("main", "last queue length")),
        backfilled_jobs=get(("backfill", "total backfilled jobs (since last slurm start)")),
        rpcs=rpcs,
    )


@dataclass(frozen=True)
class Reading:
    """One reading of a cluster's Slurm. ``accounting_up`` None: the cluster has no accounting.
    ``accounts``: the accounts slurmdbd knows (None: no accounting, or slurmdbd did not answer)."""

    nodes: tuple[Node, ...]
    jobs: tuple[Job, ...]
    diagnostics: Diagnostics
    accounting_up: bool | None = None
    accounts: frozenset[str] | None = None


def capped(values: Iterable[str], limit: int, always: Iterable[str] = ()) -> dict[str, str]:
    """Each of ``values`` and ``always`` -> its label: itself, or :data:`OTHER` past
    ``always`` and the first of the others in name order (the cap's last place is
    ``OTHER``'s): at most ``limit`` labels. Pure."""
    first = sorted(set(always))
    rest = sorted(set(values) - set(first))
    kept = set(first + rest) if len(first) + len(rest) <= limit else set(first + rest[:limit - 1 - len(first)])
    return {v: v if v in kept else OTHER for v in first + rest}


def account_labels(jobs: Iterable[Job], known: frozenset[str] | None) -> dict[str, str]:
    """Each job's account -> its label: the account where slurmdbd knows it (``known``;
    sacctmgr stores names in lower case), :data:`OTHER` where it does not or where
    there is no accounting (``sbatch --account`` then takes any word), capped. Pure."""
    named = {j.account: j.account.lower() if known is not None and j.account.lower() in known else OTHER
             for j in jobs}
    cap = capped(named.values(), MAX_LABEL_VALUES["account"])
    return {account: cap[label] for account, label in named.items()}


class QueueWait:
    """The histogram of queue wait (submit to start) of the jobs seen to start, by partition.

    A job is counted once per start (a requeued job that starts again counts
    again): it is remembered by id and start time while Slurm still lists it.
    A job that starts and ends between two readings is not seen. Counts start
    from zero when the agent starts, as Prometheus counters may, and its first
    reading counts the started jobs Slurm still lists then (again, after a
    restart).
    """

    def __init__(self, buckets: tuple[float, ...] = QUEUE_WAIT_BUCKETS):
        self.buckets = buckets
        self._seen: set[tuple[int, int]] = set()
        #: partition -> (count per bucket, +Inf last; sum)
        self._by_partition: dict[str, tuple[list[int], float]] = {}

    def observe(self, jobs: Iterable[Job]) -> None:
        listed = set()
        for j in jobs:
            if j.state not in _STARTED or not j.start_time or not j.submit_time:
                continue
            key = (j.job_id, j.start_time)
            listed.add(key)
            if key in self._seen:
                continue
            wait = max(0, j.start_time - j.submit_time)
            partition = j.partition
            if partition not in self._by_partition and \
                    len(self._by_partition.keys() - {OTHER}) >= MAX_LABEL_VALUES["partition"] - 1:
                partition = OTHER  # the cap holds across readings too
            counts, total = self._by_partition.get(partition, ([0] * (len(self.buckets) + 1), 0.0))
            counts[next((i for i, b in enumerate(self.buckets) if wait <= b), len(self.buckets))] += 1
            self._by_partition[partition] = (counts, total + wait)
        self._seen = listed  # what Slurm no longer lists cannot start again under that key

    def family(self, partitions: Iterable[str] = ()) -> HistogramMetricFamily:
        """The histogram, with a series of zeros for each of ``partitions`` no job was seen to
        start in yet: a series that is born at 1 never shows that first start to increase()."""
        h = HistogramMetricFamily("slurmk8s_slurm_queue_wait_seconds", "From submit to start, of the jobs seen "
                                  "to start (by partition).", labels=["partition"])
        zero = ([0] * (len(self.buckets) + 1), 0.0)
        room = max(0, MAX_LABEL_VALUES["partition"] - len(self._by_partition.keys() | {OTHER}))
        rows = {p: zero for p in sorted(set(partitions) - self._by_partition.keys() - {OTHER})[:room]} \
            | self._by_partition
        for partition, (counts, total) in sorted(rows.items()):
            running, cumulative = 0, []
            for bound, n in zip((*map(floatToGoString, self.buckets), "+Inf"), counts, strict=True):
                running += n
                cumulative.append((bound, running))
            h.add_metric([partition], cumulative, total)
        return h


def _gauge(name: str, doc: str, labels: list[str], values: Mapping[tuple[str, ...], float]) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc, labels=labels)
    for key, value in sorted(values.items()):
        g.add_metric(list(key), value)
    return g


def _lent(n: Node) -> str:
    return "true" if any(f.startswith(LENT_PREFIX) for f in n.features) else "false"


def _singles(r: Reading) -> set[str]:
    return {p for n in r.nodes for p in n.partitions} | {p for j in r.jobs for p in j.partition.split(",") if p}


def partition_labels(r: Reading) -> dict[str, str]:
    """Each partition a reading shows (a node's; a job's, ``a,b`` for a job pending in
    ``-p a,b``, and each of those) -> its label, capped. Pure."""
    return capped(_singles(r) | {j.partition for j in r.jobs}, MAX_LABEL_VALUES["partition"])


def partitions_of(r: Reading) -> list[str]:
    """The partitions a reading names: its nodes', and its jobs' (a job pending in ``-p a,b`` names two),
    as labels (:func:`partition_labels`)."""
    labels = partition_labels(r)
    return sorted({labels[p] for p in _singles(r)})


def families(r: Reading) -> Iterator[Metric]:
    """The metric families of one reading. Pure."""
    partitions = partitions_of(r)
    # Labels: each value a reading shows, mapped to itself or OTHER under the caps.
    part = partition_labels(r)
    reason = capped({j.reason for j in r.jobs if j.state == "PENDING"}, MAX_LABEL_VALUES["reason"])
    account = account_labels(r.jobs, r.accounts)
    state = capped({j.state.lower() for j in r.jobs}, MAX_LABEL_VALUES["state"], always=("pending", "running"))
    nodes: Counter = Counter({(p, s): 0 for p in partitions for s in NODE_STATES})
    gpus: Counter = Counter()
    draining: Counter = Counter({(p,): 0 for p in partitions})
    for n in r.nodes:
        usable = n.bucket in ("idle", "mixed", "allocated")
        alloc = min(n.gpus_alloc, n.gpus)
        for p in {part[p] for p in n.partitions}:
            nodes[p, n.bucket] += 1
            draining[(p,)] += n.drain_set and n.busy
            if n.gpus:
                lent = _lent(n)
                gpus[p, lent, "allocated"] += alloc
                gpus[p, lent, "idle" if usable else "unavailable"] += n.gpus - alloc
    yield _gauge("slurmk8s_slurm_nodes", "Slurm nodes by partition and state (a node in two partitions counts "
                 "in both).", ["partition", "state"], nodes)
    yield _gauge("slurmk8s_slurm_draining_nodes", "Nodes drained while jobs still run on them (counted in state "
                 "drain too): a drain that does not end keeps them here.", ["partition"], draining)
    for p, lent in {(p, lent) for p, lent, _ in gpus}:
        for s in GPU_STATES:
            gpus.setdefault((p, lent, s), 0)
    yield _gauge("slurmk8s_slurm_gpus", "GPUs of Slurm nodes by partition, state (allocated; idle: on a node "
                 "that takes jobs; unavailable: on a node down or drained) and whether the node is lent by "
                 "the bridge.", ["partition", "lent", "state"], gpus)
    jobs: Counter = Counter({(p, s): 0 for p in partitions for s in ("pending", "running")})
    pending: Counter = Counter()
    account_gpus: Counter = Counter()
    account_pending: Counter = Counter()
    for j in r.jobs:
        a = account[j.account]
        account_gpus[(a,)] += 0  # every account Slurm lists a job of has a series, 0 too
        account_pending[(a,)] += 0
        jobs[part[j.partition], state[j.state.lower()]] += 1
        if j.state == "PENDING":
            pending[part[j.partition], reason[j.reason]] += 1
            account_pending[(a,)] += 1
        elif j.active:
            account_gpus[(a,)] += j.gpus
    yield _gauge("slurmk8s_slurm_jobs", "Jobs Slurm lists, by partition and state (finished jobs stay listed "
                 "for MinJobAge, 300 s by default).", ["partition", "state"], jobs)
    yield _gauge("slurmk8s_slurm_pending_jobs", "Pending jobs by partition and Slurm's reason (Priority, "
                 "Resources, BeginTime, ...).", ["partition", "reason"], pending)
    yield _gauge("slurmk8s_slurm_account_running_gpus", "GPUs allocated to the running jobs of each account.",
                 ["account"], account_gpus)
    yield _gauge("slurmk8s_slurm_account_pending_jobs", "Pending jobs of each account.", ["account"],
                 account_pending)
    d = r.diagnostics
    for name, value, doc in (
            ("server_threads", d.server_threads, "slurmctld's server threads in use."),
            ("agent_queue", d.agent_queue, "RPCs slurmctld's agent has queued for the nodes."),
            ("scheduler_queue_length", d.queue_length, "Jobs the main scheduler looked at in its last cycle.")):
        if value is not None:
            yield _gauge(f"slurmk8s_slurm_{name}", doc, [], {(): value})
    if d.dbd_queue is not None:
        yield _gauge("slurmk8s_slurm_accounting_queue", "Records slurmctld holds for slurmdbd (DBD Agent queue "
                     "size): they pile up while slurmdbd is unreachable.", [], {(): d.dbd_queue})
    if r.accounting_up is not None:
        yield _gauge("slurmk8s_slurm_accounting_up", "1 when slurmdbd answered (sacctmgr), 0 when it did not.",
                     [], {(): int(r.accounting_up)})
    cycles = CounterMetricFamily("slurmk8s_slurm_scheduler_cycles", "Scheduling cycles run, by scheduler (main, "
                                 "backfill); sdiag starts them again at midnight UTC, as a counter reset.",
                                 labels=["scheduler"])
    for s, v in sorted(d.cycles.items()):
        cycles.add_metric([s], v)
    yield cycles
    yield _gauge("slurmk8s_slurm_scheduler_last_cycle_seconds", "Duration of the scheduler's last cycle.",
                 ["scheduler"], {(s,): v / 1e6 for s, v in d.last_cycle_us.items()})
    yield _gauge("slurmk8s_slurm_scheduler_mean_cycle_seconds", "Mean duration of the scheduler's cycles.",
                 ["scheduler"], {(s,): v / 1e6 for s, v in d.mean_cycle_us.items()})
    if d.backfilled_jobs is not None:
        yield CounterMetricFamily("slurmk8s_slurm_backfilled_jobs", "Jobs the backfill scheduler started since "
                                  "slurmctld started.", value=d.backfilled_jobs)
    if d.rpcs is not None:
        yield CounterMetricFamily("slurmk8s_slurm_rpcs", "RPCs slurmctld served since it started (all message "
                                  "types; its rate is the load on slurmctld).", value=d.rpcs)


class SlurmMetrics(Collector):
    """A prometheus_client collector over the facade (:class:`~.client.SlurmClient`).

    :meth:`run` reads Slurm every ``interval`` seconds in a thread of its own
    and a scrape serves the last reading at once: however many scrape, and
    however slow a read is (a slurmdbd that does not answer costs sacctmgr
    5 s), slurmctld gets one reading per interval and a scrape never waits on
    Slurm."""

    def __init__(self, slurm, interval: float = 15.0, clock=time.time):
        self.slurm = slurm
        self.interval = interval
        self.clock = clock
        self.queue_wait = QueueWait()
        self._lock = threading.Lock()
        #: The last good reading's families, and the partitions it names (None: no reading yet).
        self._families: list[Metric] | None = None
        self._partitions: list[str] = []
        #: The accounts slurmdbd last named (None: none yet).
        self._accounts: frozenset[str] | None = None
        self._up = 0
        self._failing = False  # a failure is logged once, when it starts
        self._read_at = 0.0
        self._seconds = 0.0

    def read(self) -> None:
        """Read Slurm now."""
        started = self.clock()
        try:
            reading = self.slurm.metrics_reading()
        except Exception as exc:  # noqa: BLE001 - slurmctld away, a command failed: said by slurmk8s_slurm_up
            if not self._failing:  # once per outage, not every interval
                self._failing = True
                log.get("slurmk8s.agent").warning("the metrics could not read Slurm; serving the last reading",
                                                  error=f"{exc.__class__.__name__}: {exc}"[:500])
            with self._lock:
                self._up = 0
                self._seconds = self.clock() - started
            return
        self._failing = False
        if reading.accounts is not None:
            self._accounts = reading.accounts
        elif reading.accounting_up is False:  # slurmdbd away: its accounts are those it last named
            reading = replace(reading, accounts=self._accounts)
        computed, partitions = list(families(reading)), partitions_of(reading)  # once per reading, not per scrape
        with self._lock:
            self.queue_wait.observe(reading.jobs)
            self._families, self._partitions, self._up, self._read_at = computed, partitions, 1, started
            self._seconds = self.clock() - started

    def run(self, stop: threading.Event) -> None:
        """Read every ``interval`` seconds until ``stop`` is set."""
        while not stop.is_set():
            self.read()
            stop.wait(self.interval)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            computed, up, read_at, seconds = self._families, self._up, self._read_at, self._seconds
            queue_wait = self.queue_wait.family(self._partitions)
        yield _gauge("slurmk8s_slurm_up", "1 when the last reading of Slurm succeeded (0: slurmctld did not "
                     "answer; the other metrics are then the last good reading's).", [], {(): up})
        yield _gauge("slurmk8s_slurm_read_seconds", "How long the last reading of Slurm took.", [], {(): seconds})
        yield _gauge("slurmk8s_slurm_read_timestamp_seconds", "When the last good reading of Slurm began "
                     "(Unix time; 0: none yet).", [], {(): read_at})
        if computed is not None:
            yield from computed
            yield queue_wait
