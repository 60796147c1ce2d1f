"""Serving demand as the bridge records it, and what it forecasts from it. Pure.

**The record.** Every round the bridge counts the nodes Kubernetes wants of a
policy's selection (:func:`demand_now`): selected nodes that run a GPU pod
and serve Kubernetes, plus the nodes the pending GPU pods that may take
nodes back would fill. :func:`record` keeps the peak of each
:data:`STEP`-second bucket for :data:`HISTORY` seconds (five weeks: what a
weekly forecast needs) in the policy's status (``status.demand``), so it
survives restarts and is bounded: one varint per bucket, 3,360 buckets,
base64. A bucket the bridge did not see (it was down) is unknown, not zero.

**The forecast** answers one question (:func:`wanted`): how many nodes will
Kubernetes want within the next T seconds, at quantile q? It is the higher
of two answers, and says which it gave (:func:`explained`):

- **recent**: the recent peak (the demand now, this bucket's and the last
  one's peaks) plus the q-quantile of the rises the last :data:`RISE_HISTORY`
  of the record shows: for each past bucket whose next T seconds are
  recorded, the highest peak in them less its own. No period is assumed.
  Once the record holds :data:`DAILY_AFTER` of history, only the buckets
  within an hour of now's time of day count (quantiles per time of day).
- **seasonal** (:func:`seasonal_levels`): what the same time of day looked
  like: for each of the last ``days`` days whose window ``[now - d days,
  now - d days + T]``, an hour wider on each side, is recorded, its peak;
  the q-quantile of those (``daily``, once :data:`SEASONAL_SAMPLES` days
  are known), or, higher, the highest of the same windows of time of week
  1 to ``weeks`` weeks ago (``weekly``). Tomorrow at 20:00 looks like
  today at 20:00 even while the trough is quieter than usual: the recent
  answer, measured from a low peak, would say less. Only where the last
  days repeat (:func:`daily_strength`, :data:`SEASONAL_STRENGTH`).

With fewer than :data:`MIN_SAMPLES` rises known over a horizon the forecast
does not know it (None), whatever the seasonal answer: the headroom is then
the demand now (what the bridge did without a forecast), and no lent node is
let to run jobs past the longest horizon it knows (:mod:`.foresight`).
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from typing import Final

from ..api.lending import ForecastBasis
from ..times import format_time
from .nodestate import parse_time

__all__ = ["STEP", "HISTORY", "RISE_HISTORY", "DAILY_AFTER", "MIN_SAMPLES", "SEASONAL_SAMPLES", "Record", "decode",
           "encode", "record", "wanted", "explained", "rise_quantiles", "seasonal_levels", "daily_strength",
           "SEASONAL_STRENGTH", "demand_now",
           "reserve_horizons", "RECENT", "DAILY", "WEEKLY"]

#: Seconds per bucket of the record.
STEP = 900
#: Seconds of history kept: five weeks, 3,360 buckets (a weekly forecast's four weeks and the one it is in).
HISTORY = 35 * 86400
#: The history whose rises the recent answer reads: the last 14 days.
RISE_HISTORY = 14 * 86400
#: History needed before the forecast looks at the time of day.
DAILY_AFTER = 3 * 86400
#: Rises needed for a quantile; fewer: the forecast is the demand now.
MIN_SAMPLES = 12
#: Days recorded at a time of day before the daily answer counts.
SEASONAL_SAMPLES = 3
#: The share of the variation of the last days that their daily cycle must
#: explain for the seasonal answer to count (:func:`daily_strength`): the
#: stretched Azure hours of the headline score 0.51 at most, the daily-cycle
#: model 0.69 or more (decision record 40).
SEASONAL_STRENGTH = 0.6
#: Which answer a forecast gave (:func:`explained`).
RECENT: Final[ForecastBasis] = "recent"
DAILY: Final[ForecastBasis] = "daily"
WEEKLY: Final[ForecastBasis] = "weekly"
_BUCKETS = HISTORY // STEP
_RISE_BUCKETS = RISE_HISTORY // STEP
_DAY = 86400 // STEP
_WEEK = 7 * _DAY
_TOD_WINDOW = 3600 // STEP


@dataclass(frozen=True)
class Record:
    """The peaks of demand from ``start`` (POSIX seconds, a multiple of
    :data:`STEP`), one per bucket; None where the bridge did not look."""

    start: int
    peaks: tuple[int | None, ...]

    @property
    def end(self) -> int:
        return self.start + STEP * len(self.peaks)


@lru_cache(maxsize=32)
def encode(rec: Record) -> tuple[str, str]:
    """(start as RFC 3339, peaks as base64 of LEB128 varints of peak + 1, 0 unknown)."""
    out = bytearray()
    for p in rec.peaks:
        v = 0 if p is None else p + 1
        while True:
            byte = v & 0x7F
            v >>= 7
            out.append(byte | (0x80 if v else 0))
            if not v:
                break
    return format_time(datetime.fromtimestamp(rec.start, UTC)), base64.b64encode(bytes(out)).decode()


@lru_cache(maxsize=32)
def decode(start: str, peaks: str) -> Record | None:
    """The record a status holds; None when it does not read as one (it is
    then started again: a record is a forecast's input, never a reason to act)."""
    when = parse_time(start)
    try:
        raw = base64.b64decode(peaks, validate=True)
    except (binascii.Error, ValueError):
        return None
    if when is None or len(raw) > 4 * _BUCKETS:
        return None
    values: list[int | None] = []
    v = shift = 0
    for byte in raw:
        v |= (byte & 0x7F) << shift
        shift += 7
        if byte & 0x80:
            if shift > 28:
                return None
            continue
        values.append(None if v == 0 else v - 1)
        v = shift = 0
    if shift or len(values) > _BUCKETS:
        return None
    first = int(when.timestamp())
    return Record(first - first % STEP, tuple(values))


def record(rec: Record | None, now: datetime, demand: int) -> Record:
    """``rec`` with ``demand`` seen at ``now``: its bucket keeps the peak,
    buckets not seen since are unknown, and what is older than
    :data:`HISTORY` is dropped. A clock that went back starts a new record."""
    t = int(now.timestamp())
    bucket = t - t % STEP
    if rec is None or bucket < rec.start or bucket - rec.start >= 2 * HISTORY:
        return Record(bucket, (demand,))
    i = (bucket - rec.start) // STEP
    peaks = list(rec.peaks)
    if i < len(peaks):
        old = peaks[i]
        if old is not None and old >= demand:
            return rec
        peaks[i] = demand
    else:
        peaks.extend([None] * (i - len(peaks)))
        peaks.append(demand)
    start = rec.start
    if len(peaks) > _BUCKETS:
        drop = len(peaks) - _BUCKETS
        peaks = peaks[drop:]
        start += drop * STEP
    return Record(start, tuple(peaks))


def _window_maxima(vals: list[int], horizons: Sequence[int]) -> list[list[int]]:
    """Per horizon h (buckets), for each i with ``i + h`` inside ``vals``
    (-1: unknown): the highest known value of ``vals[i+1 .. i+h]`` (-1: none
    known). A sparse table: level k holds the maxima of windows of 2**k, and
    a window of h is the larger of two windows of the largest 2**k <= h."""
    n = len(vals)
    levels = [vals[1:] + [-1]]  # windows of 1: values[i+1]
    top = max(horizons, default=1)
    while (1 << len(levels)) <= top:
        prev, step = levels[-1], 1 << (len(levels) - 1)
        levels.append(list(map(max, prev, prev[step:] + [-1] * step)))
    out = []
    for h in horizons:
        k = h.bit_length() - 1
        level, shift, count = levels[k], h - (1 << k), max(n - h, 0)
        out.append(list(map(max, level[:count], level[shift:shift + count])))
    return out


def _quantile(samples: list[int], q: float) -> int:
    """Nearest rank."""
    samples.sort()
    return samples[min(len(samples) - 1, max(0, math.ceil(q * len(samples)) - 1))]


@lru_cache(maxsize=64)
def rise_quantiles(rec: Record, now_bucket: int, horizons: tuple[int, ...], q: float) -> tuple[int | None, ...]:
    """Per horizon (seconds), the q-quantile of the rises the last
    :data:`RISE_HISTORY` of the record shows over that long (None: fewer
    than :data:`MIN_SAMPLES`). The bucket of
    ``now_bucket`` and later ones are left out: they are still filling.
    Recomputed once per bucket (the cache is keyed on the record)."""
    end = max(0, (now_bucket - rec.start) // STEP)
    begin = max(0, end - (_RISE_BUCKETS - 1))  # 14 days with the bucket now in, as the record of 14 days was
    closed = rec.peaks[begin:end]
    known = [-1 if v is None else v for v in closed]
    values = known  # the buckets whose rises count
    daily = len(closed) - closed.count(None) >= DAILY_AFTER // STEP
    if daily:  # only the buckets within an hour of now's time of day
        tod, first = (now_bucket // STEP) % _DAY, rec.start // STEP + begin
        values = [v if min(d := abs((first + i) % _DAY - tod), _DAY - d) <= _TOD_WINDOW else -1
                  for i, v in enumerate(known)]
    steps = [max(1, math.ceil(horizon / STEP)) for horizon in horizons]
    out: list[int | None] = []
    for peaks in _window_maxima(known, steps):
        rises = [m - v if m > v else 0 for v, m in zip(values, peaks, strict=False) if v >= 0 and m >= 0]
        out.append(_quantile(rises, q) if len(rises) >= MIN_SAMPLES else None)
    # Wanting a node within T means wanting it within any longer time.
    best: int | None = None
    for k, v in enumerate(out):
        if v is not None:
            best = v if best is None else max(best, v)
        out[k] = best if v is not None else None
    return tuple(out)


def _window_peak(peaks: Sequence[int | None], a: int, b: int) -> int | None:
    """The highest known peak of ``peaks[a:b]``; None unless at least half of it is known."""
    if a < 0 or b > len(peaks):
        return None
    known = [v for v in peaks[a:b] if v is not None]
    return max(known) if known and 2 * len(known) >= b - a else None


def daily_strength(peaks: Sequence[int | None], days: int) -> float:
    """How much a daily cycle explains of the last ``days`` whole days of
    ``peaks`` (closed buckets, the newest last): 1 - var(residual) /
    var(deviation), where a bucket's deviation is its peak less its day's
    mean and its residual that less the mean deviation of its time of day
    over the days. 0 with fewer than :data:`SEASONAL_SAMPLES` days or no
    variation. A demand that only drifts from day to day (a level shift
    moves a whole day) and one whose days do not repeat score low."""
    n = min(days, len(peaks) // _DAY)
    if n < SEASONAL_SAMPLES:
        return 0.0
    rows = [peaks[len(peaks) - (d + 1) * _DAY:len(peaks) - d * _DAY] for d in range(n)]
    dev: list[list[float | None]] = []
    for row in rows:
        known = [v for v in row if v is not None]
        if 2 * len(known) < _DAY:
            continue
        mean = sum(known) / len(known)
        dev.append([None if v is None else v - mean for v in row])
    if len(dev) < SEASONAL_SAMPLES:
        return 0.0
    cycle = []
    for b in range(_DAY):
        col = [v for r in dev if (v := r[b]) is not None]
        cycle.append(sum(col) / len(col) if col else 0.0)
    total = sum(v * v for r in dev for v in r if v is not None)
    rest = sum((v - cycle[b]) ** 2 for r in dev for b, v in enumerate(r) if v is not None)
    return 0.0 if total <= 0 else max(0.0, 1.0 - rest / total)


@lru_cache(maxsize=64)
def seasonal_levels(rec: Record, now_bucket: int, horizons: tuple[int, ...], q: float, days: int,
                    weeks: int) -> tuple[tuple[int | None, ForecastBasis | None], ...]:
    """Per horizon T (seconds): what the same time of day and of week looked
    like over the next T, and which (:data:`DAILY` or :data:`WEEKLY`); (None,
    None) when neither is known. Each past window is ``[now - lag, now - lag
    + T]`` widened by an hour on each side (a peak an hour early or late is
    the same peak), counted when it is wholly in the record's closed buckets
    and at least half known: daily, the q-quantile of the windows 1 to
    ``days`` days ago (at least :data:`SEASONAL_SAMPLES` of them); weekly,
    the highest of those 1 to ``weeks`` weeks ago. Neither counts unless
    the last days show a daily cycle (:func:`daily_strength` at least
    :data:`SEASONAL_STRENGTH`): a demand without one, such as slow waves
    over weeks, would only be kept for at its past highs. Recomputed once
    per bucket, as :func:`rise_quantiles`."""
    end = max(0, (now_bucket - rec.start) // STEP)
    closed = rec.peaks[:end]
    out: list[tuple[int | None, ForecastBasis | None]] = []
    if daily_strength(closed, max(days, SEASONAL_SAMPLES)) < SEASONAL_STRENGTH:
        return ((None, None),) * len(horizons)  # no daily cycle shows: the recent answer alone
    for horizon in horizons:
        h = max(1, math.ceil(horizon / STEP))
        daily = [v for d in range(1, days + 1)
                 if (v := _window_peak(closed, end - d * _DAY - _TOD_WINDOW, end - d * _DAY + h + _TOD_WINDOW))
                 is not None]
        weekly = [v for w in range(1, weeks + 1)
                  if (v := _window_peak(closed, end - w * _WEEK - _TOD_WINDOW, end - w * _WEEK + h + _TOD_WINDOW))
                  is not None]
        best: tuple[int | None, ForecastBasis | None] = (None, None)
        if len(daily) >= SEASONAL_SAMPLES:
            best = (_quantile(daily, q), DAILY)
        if weekly and (best[0] is None or max(weekly) > best[0]):
            best = (max(weekly), WEEKLY)
        out.append(best)
    # Wanting a node within T means wanting it within any longer time.
    top: tuple[int | None, ForecastBasis | None] = (None, None)
    for k, (v, why) in enumerate(out):
        if v is not None and (top[0] is None or v > top[0]):
            top = (v, why)
        out[k] = top
    return tuple(out)


def explained(rec: Record | None, now: datetime, demand: int, horizons: tuple[int, ...], q: float,
              days: int = 0, weeks: int = 0) -> list[tuple[int | None, ForecastBasis | None]]:
    """Per horizon (seconds), the nodes Kubernetes will want within it at
    quantile ``q``, and which answer gave them (:data:`RECENT`,
    :data:`DAILY`, :data:`WEEKLY`): the higher of the recent peak (of the
    demand now and the peaks of this bucket and the last: the rises are
    measured from a bucket's peak, not from a moment of it) plus the rise
    the record shows, and what the same time of day (``days`` back) and of
    week (``weeks`` back) looked like (:func:`seasonal_levels`). (None,
    None) where the record is too short for the rises (the caller decides
    what not knowing means)."""
    if rec is None:
        return [(None, None)] * len(horizons)
    t = int(now.timestamp())
    bucket = t - t % STEP
    rises = rise_quantiles(rec, bucket, horizons, q)
    seasonal = seasonal_levels(rec, bucket, horizons, q, days, weeks) if days or weeks \
        else ((None, None),) * len(horizons)
    i = (bucket - rec.start) // STEP
    base = max([demand, *(v for v in rec.peaks[max(0, i - 1):i + 1] if v is not None)])
    out: list[tuple[int | None, ForecastBasis | None]] = []
    for r, (level, why) in zip(rises, seasonal, strict=True):
        if r is None:
            out.append((None, None))
        elif level is not None and level > base + r:
            out.append((level, why))
        else:
            out.append((base + r, RECENT))
    return out


def wanted(rec: Record | None, now: datetime, demand: int, horizons: tuple[int, ...], q: float,
           days: int = 0, weeks: int = 0) -> list[int | None]:
    """Nodes Kubernetes will want within each horizon (seconds), at quantile
    ``q`` (:func:`explained`, without saying which answer)."""
    return [v for v, _ in explained(rec, now, demand, horizons, q, days, weeks)]


def reserve_horizons(first: int, last: int) -> tuple[int, ...]:
    """The times ahead at which a reservation may be placed: ``first``,
    doubling, up to ``last`` (both included)."""
    out = []
    h = max(first, STEP)
    while h < last:
        out.append(h)
        h *= 2
    out.append(last)
    return tuple(out)


def demand_now(busy: int, pending_gpus: int, gpus_per_node: int) -> int:
    """Nodes Kubernetes wants now: ``busy`` selected nodes serving it with a
    GPU pod, and enough nodes of ``gpus_per_node`` for the pending GPUs."""
    return busy + (math.ceil(pending_gpus / gpus_per_node) if pending_gpus and gpus_per_node > 0 else 0)
