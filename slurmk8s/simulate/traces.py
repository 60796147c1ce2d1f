"""The simulator's inputs, read from CSV: training jobs and serving demand. Pure but for reading files.

Times inside the simulator are seconds from the start of the simulated
window. Readers take either seconds or timestamps (``2017-10-09 07:01:55``,
read as UTC) and return records sorted by time.

- Training jobs: ``submit_time,duration,num_gpus`` (``timestamp`` is taken
  for ``submit_time``, as the Philly trace names it); other columns are ignored.
- Serving pods: ``start,end,gpus``: a pod asking for ``gpus`` from ``start``
  until it is deleted at ``end``.
- Serving requests (the Azure LLM inference traces,
  ``TIMESTAMP,ContextTokens,GeneratedTokens``): turned into serving pods by
  :func:`replicas_from_requests`, the model documented there.
- Serving request rates (ServeGen's aggregates, ``t_s,rate_rps``: requests
  per second per window): turned into serving pods by
  :func:`replicas_from_rates`, the model documented there.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

__all__ = ["TrainingJob", "ServingPod", "TraceError", "RequestModel", "read_jobs", "read_serving_pods",
           "read_requests", "replicas_from_requests", "parse_when", "window", "DAILY_PROFILE", "RateSeries",
           "GAP_SHARE", "read_rates", "replicas_from_rates"]


class TraceError(ValueError):
    """A trace that cannot be read: names the file, the line and the field."""


@dataclass(frozen=True)
class TrainingJob:
    """A training job: submitted at ``submit`` (seconds), runs ``duration`` seconds on ``gpus`` GPUs.
    ``limit``: its time limit (``--time``, seconds), what Slurm plans with; None: its duration (the
    traces know no limits: each job asks for exactly what it runs)."""

    id: int
    submit: float
    duration: float
    gpus: int
    limit: float | None = None


@dataclass(frozen=True)
class ServingPod:
    """A serving pod that exists from ``start`` to ``end`` (seconds) and asks for ``gpus`` GPUs."""

    start: float
    end: float
    gpus: int


def parse_when(value: str) -> float:
    """Seconds (a number) or a timestamp as POSIX seconds (naive is UTC)."""
    text = value.strip()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{value!r} is neither seconds nor a timestamp such as 2017-10-09 07:01:55") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return t.timestamp()


def _rows(path: Path, columns: dict[str, tuple[str, ...]]) -> Iterable[tuple[int, dict[str, str]]]:
    """Each data row with the wanted columns (each found under one of its names)."""
    try:
        f = open(path, newline="")
    except OSError as exc:
        raise TraceError(f"{path}: cannot read it ({exc.strerror})") from None
    with f:
        reader = csv.reader(f)
        header = [h.strip() for h in next(reader, [])]
        where = {}
        for want, names in columns.items():
            found = next((header.index(n) for n in names if n in header), None)
            if found is None:
                raise TraceError(f"{path}: no column {' or '.join(names)} in the header {','.join(header)!r}")
            where[want] = found
        for line, row in enumerate(reader, start=2):
            if not row or not any(c.strip() for c in row):
                continue
            try:
                yield line, {k: row[i] for k, i in where.items()}
            except IndexError:
                raise TraceError(f"{path}:{line}: {len(row)} fields, the header has {len(header)}") from None


def _number(path: Path, line: int, field: str, value: str, *, minimum: float = 0.0) -> float:
    try:
        x = float(value)
    except ValueError:
        raise TraceError(f"{path}:{line}: {field} {value!r} is not a number") from None
    if not math.isfinite(x) or x < minimum:
        raise TraceError(f"{path}:{line}: {field} {value!r} must be a number >= {minimum:g}")
    return x


def _when(path: Path, line: int, field: str, value: str) -> float:
    try:
        return parse_when(value)
    except ValueError as exc:
        raise TraceError(f"{path}:{line}: {field}: {exc}") from None


def read_jobs(path: Path) -> list[TrainingJob]:
    """Training jobs with absolute submit times (POSIX seconds, or the numbers given), by submit time."""
    out = []
    for line, row in _rows(path, {"submit": ("submit_time", "timestamp"), "duration": ("duration",),
                                  "gpus": ("num_gpus",)}):
        gpus = _number(path, line, "num_gpus", row["gpus"], minimum=1)
        if gpus != int(gpus):
            raise TraceError(f"{path}:{line}: num_gpus {row['gpus']!r} must be a whole number")
        out.append((_when(path, line, "submit_time", row["submit"]),
                    _number(path, line, "duration", row["duration"]), int(gpus), line))
    out.sort()
    return [TrainingJob(i, s, d, g) for i, (s, d, g, _) in enumerate(out)]


def read_serving_pods(path: Path) -> list[ServingPod]:
    """Serving pods (``start,end,gpus``), by start time."""
    out = []
    for line, row in _rows(path, {"start": ("start",), "end": ("end",), "gpus": ("gpus",)}):
        start, end = _when(path, line, "start", row["start"]), _when(path, line, "end", row["end"])
        gpus = _number(path, line, "gpus", row["gpus"], minimum=1)
        if end < start:
            raise TraceError(f"{path}:{line}: end {row['end']!r} is before start {row['start']!r}")
        if gpus != int(gpus):
            raise TraceError(f"{path}:{line}: gpus {row['gpus']!r} must be a whole number")
        out.append(ServingPod(start, end, int(gpus)))
    out.sort(key=lambda p: (p.start, p.end))
    return out


def read_requests(path: Path) -> list[tuple[float, int]]:
    """LLM requests as (POSIX seconds, tokens = context + generated), by time."""
    out = []
    for line, row in _rows(path, {"t": ("TIMESTAMP", "timestamp"), "ctx": ("ContextTokens",),
                                  "gen": ("GeneratedTokens",)}):
        out.append((_when(path, line, "TIMESTAMP", row["t"]),
                    int(_number(path, line, "ContextTokens", row["ctx"]) + _number(path, line, "GeneratedTokens",
                                                                                      row["gen"]))))
    out.sort()
    return out


@dataclass(frozen=True)
class RequestModel:
    """How requests become GPU replicas (documented in :func:`replicas_from_requests`)."""

    #: tokens (prompt + generated) one GPU processes per second
    tokens_per_gpu_second: float = 2500.0
    #: the fraction of that throughput a replica is run at (autoscaler target)
    target_utilisation: float = 0.6
    #: GPUs each serving replica (pod) asks for
    gpus_per_replica: int = 1
    #: the autoscaler's averaging window, in the request trace's own seconds
    bucket_seconds: float = 60.0
    #: the peak number of GPUs serving may use; the request rate is scaled so
    #: that the trace's busiest window needs exactly this many (None: no scaling)
    peak_gpus: int | None = None
    #: repeat the trace's hour every hour, times this profile of the day
    #: (:data:`DAILY_PROFILE`), instead of stretching it over the window
    daily: bool = False
    #: requests one GPU serves per second, for a rate series (:func:`replicas_from_rates`)
    requests_per_gpu_second: float = 5.0


#: A day's shape of serving demand for the daily-cycle model: the load of
#: each hour (UTC) relative to the day's peak. It is this project's
#: assumption, not a measurement: a raised cosine with its trough at 04:00
#: (0.35 of the peak) and its peak at 16:00, the shape of a service used in
#: the working day of one region. No hourly profile of an LLM service can be
#: read from here (the week-long Azure 2024 traces are not reachable), so the
#: daily-cycle runs say what a forecast does with a cycle of this shape, not
#: with a measured one.
DAILY_PROFILE = tuple(round(0.35 + 0.65 * (1 - math.cos(2 * math.pi * ((h - 4) % 24) / 24)) / 2, 4)
                      for h in range(24))


def _profile(t: float) -> float:
    """:data:`DAILY_PROFILE` at ``t`` seconds after midnight, linear between the hours."""
    h = (t / 3600) % 24
    i = int(h)
    return DAILY_PROFILE[i] + (DAILY_PROFILE[(i + 1) % 24] - DAILY_PROFILE[i]) * (h - i)


def replicas_from_requests(requests: list[tuple[float, int]], span: float, model: RequestModel
                           ) -> tuple[list[ServingPod], float, float]:
    """Serving pods from a request trace, stretched over ``span`` seconds.

    The model, in order:

    1. The trace is cut into windows of ``bucket_seconds`` of its own time
       (an autoscaler's averaging window); each window's load is its tokens
       (prompt + generated) per second.
    2. A window needs ``ceil(load * scale / (tokens_per_gpu_second *
       target_utilisation) / gpus_per_replica)`` replicas. ``scale`` is 1,
       or, with ``peak_gpus``, the factor that makes the busiest window need
       ``peak_gpus`` GPUs: the serving fleet is sized for its peak, the
       shape of the demand is the trace's.
    3. Time is stretched: the trace's span (one hour for the Azure traces)
       is laid over the simulated ``span``, so each window lasts
       ``bucket_seconds * span / trace span`` simulated seconds. With
       ``daily``, time is not stretched: the trace is repeated back to back
       over ``span``, each window's load times :data:`DAILY_PROFILE` at the
       window's time of day (the simulated clock starts at midnight), and
       ``scale`` sizes the busiest window of that.
    4. Replica counts become pods: when the count rises, new pods start;
       when it falls, the newest pods end (last in, first out).

    Returns (pods, the time stretch factor, the rate scale).
    """
    if not requests:
        return [], 1.0, 1.0
    t0 = requests[0][0]
    trace_span = max(requests[-1][0] - t0, model.bucket_seconds)
    buckets = max(1, math.ceil(trace_span / model.bucket_seconds))
    tokens = [0] * buckets
    for t, n in requests:
        tokens[min(int((t - t0) / model.bucket_seconds), buckets - 1)] += n
    per_gpu = model.tokens_per_gpu_second * model.target_utilisation
    load = [x / model.bucket_seconds for x in tokens]
    stretch = span / (buckets * model.bucket_seconds)
    if model.daily:
        stretch = 1.0
        load = [load[i % buckets] * _profile(i * model.bucket_seconds)
                for i in range(max(1, math.ceil(span / model.bucket_seconds)))]
    scale = 1.0
    if model.peak_gpus is not None and max(load) > 0:
        scale = model.peak_gpus * per_gpu / max(load)
    counts = _replicas(load, scale, per_gpu, model)
    return _pods(counts, [i * model.bucket_seconds * stretch for i in range(len(counts) + 1)],
                 model.gpus_per_replica), stretch, scale


def _replicas(load: list[float], scale: float, per_gpu: float, model: RequestModel) -> list[int]:
    """Replicas per window: ``ceil(load * scale / per_gpu / gpus_per_replica)``, at most the peak's."""
    cap = (model.peak_gpus // model.gpus_per_replica) if model.peak_gpus is not None else 1 << 30
    return [min(math.ceil(x * scale / per_gpu / model.gpus_per_replica - 1e-9), cap) for x in load]


def _pods(counts: list[int], starts: list[float], gpus: int) -> list[ServingPod]:
    """Pods from replica counts, window i from ``starts[i]`` to ``starts[i + 1]``:
    when the count rises, new pods start; when it falls, the newest end
    (last in, first out). All end at the last window's end."""
    pods: list[ServingPod] = []
    alive: list[float] = []  # start times of running replicas, oldest first
    for want, t in zip([*counts, 0], starts, strict=True):
        while len(alive) > want:
            pods.append(ServingPod(alive.pop(), t, gpus))
        while len(alive) < want:
            alive.append(t)
    pods.sort(key=lambda p: (p.start, p.end))
    return pods


#: A rate-series window under this share of the series' median rate is a gap (:func:`read_rates`).
GAP_SHARE = 0.01


@dataclass(frozen=True)
class RateSeries:
    """A request-rate series as :func:`read_rates` reads it: window i starts
    ``starts[i]`` seconds after the simulated clock's zero (a midnight) and
    lasts until the next one; the last lasts ``step``, the series' usual
    window. ``rates`` in requests per second, gaps filled (``gaps``: how
    many windows were)."""

    starts: tuple[float, ...]
    rates: tuple[float, ...]
    step: float
    gaps: int

    @property
    def end(self) -> float:
        return self.starts[-1] + self.step if self.starts else 0.0


def read_rates(path: Path) -> RateSeries:
    """A rate series, CSV of a time (``t_s``, ``time`` or ``timestamp``) and
    requests per second (``rate_rps`` or ``rate``), one row per window.

    - Times in seconds are from the window's start, which is a midnight on
      the simulated clock (ServeGen's ``t_s`` counts from a local midnight);
      timestamps (UTC) are placed by their time of day: the first one's
      midnight is the window's start.
    - A window lasts until the next row; the last one lasts as long as the
      series' usual window (the median gap between rows).
    - **A gap in the record is not a service with no requests**: a window
      of rate 0, or under :data:`GAP_SHARE` of the series' median rate (where
      a gap ends in ServeGen's series, one client of the 109 has reported
      again: 14 requests/s against some 2,000), takes the rate of the window
      before it (leading gaps that of the first window after them). A series
      with no request at all is refused.
    """
    rows = []
    for line, row in _rows(path, {"t": ("t_s", "time", "timestamp"), "rate": ("rate_rps", "rate")}):
        rows.append((_when(path, line, "time", row["t"]), _number(path, line, "rate", row["rate"]), line))
    if not rows:
        raise TraceError(f"{path}: no rows")
    rows.sort()
    for (a, _, _), (b, _, line) in zip(rows, rows[1:], strict=False):
        if b == a:
            raise TraceError(f"{path}:{line}: a second row for time {b:g}")
    timestamps = rows[0][0] > 1e8
    zero = rows[0][0] - rows[0][0] % 86400 if timestamps else 0.0
    starts = [t - zero for t, _, _ in rows]
    if starts[0] < 0:
        raise TraceError(f"{path}:{rows[0][2]}: time {rows[0][0]:g} is before the window's start (0)")
    rates = [r for _, r, _ in rows]
    if not any(rates):
        raise TraceError(f"{path}: every window's rate is 0: no demand to replay")
    nonzero = sorted(r for r in rates if r > 0)
    floor = GAP_SHARE * nonzero[len(nonzero) // 2]
    gaps = sum(1 for r in rates if r < floor or r == 0)
    held, last = [], next(r for r in rates if r >= floor)
    for r in rates:
        last = r if r >= floor and r > 0 else last
        held.append(last)
    steps = sorted(b - a for a, b in zip(starts, starts[1:], strict=False))
    step = steps[len(steps) // 2] if steps else 600.0
    return RateSeries(tuple(starts), tuple(held), step, gaps)


def replicas_from_rates(series: RateSeries, span: float, model: RequestModel) -> tuple[list[ServingPod], float]:
    """Serving pods from a rate series, replayed at its own clock over ``span`` seconds.

    As :func:`replicas_from_requests` with the series' windows for the
    autoscaler's: window i needs ``ceil(rate * scale /
    (requests_per_gpu_second * target_utilisation) / gpus_per_replica)``
    replicas, ``scale`` making the busiest window (of those in ``span``)
    need ``peak_gpus``. Time is not stretched; before the first row the
    first window's rate holds. The series must cover ``span`` (a ValueError
    otherwise: nothing is invented past its end). Returns (pods, the rate scale).
    """
    if series.end < span - 1e-6:
        raise ValueError(f"the rate series covers {series.end / 86400:.2f} days, the window {span / 86400:.2f}")
    keep = [i for i, t in enumerate(series.starts) if t < span] or [0]
    starts = [0.0] + [series.starts[i] for i in keep[1:]] + [span]
    load = [series.rates[i] for i in keep]
    per_gpu = model.requests_per_gpu_second * model.target_utilisation
    scale = 1.0
    if model.peak_gpus is not None and max(load) > 0:
        scale = model.peak_gpus * per_gpu / max(load)
    return _pods(_replicas(load, scale, per_gpu, model), starts, model.gpus_per_replica), scale


def window(jobs: list[TrainingJob], start: float | None, days: float | None) -> tuple[list[TrainingJob], float, float]:
    """The jobs submitted in [start, start + days), with submit times made
    relative to ``start`` (default: the first submission); and (start, span).
    The span runs to the last submission when ``days`` is not given."""
    if not jobs:
        return [], start or 0.0, 0.0
    t0 = jobs[0].submit if start is None else start
    end = t0 + days * 86400 if days is not None else jobs[-1].submit + 1
    kept = [TrainingJob(i, j.submit - t0, j.duration, j.gpus)
            for i, j in enumerate(j for j in jobs if t0 <= j.submit < end)]
    return kept, t0, end - t0
