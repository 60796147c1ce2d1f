"""Serving demand as the bridge records it, and what it forecasts from it. Pure.

**The record.** Every round the bridge counts the nodes Kubernetes wants of a
policy's selection (:func:`demand_now`): selected nodes that run a GPU pod
and serve Kubernetes, plus the nodes the pending GPU pods that may take
nodes back would fill. :func:`record` keeps the peak of each
:data:`STEP`-second bucket for :data:`HISTORY` seconds in the policy's
status (``status.demand``), so it survives restarts and is bounded: one
varint per bucket, 1,344 buckets, base64. A bucket the bridge did not see
(it was down) is unknown, not zero.

**The forecast** answers one question (:func:`wanted`): how many nodes will
Kubernetes want within the next T seconds, at quantile q? It is the recent
peak (the demand now, this bucket's and the last one's peaks) plus the
q-quantile of the rises the record shows: for each past bucket whose next T
seconds are recorded, the highest peak in them less its own.
No period is assumed. Once the record holds :data:`DAILY_AFTER` of history,
only the buckets within an hour of now's time of day count (quantiles per
time of day): a daily cycle shows up there, and a demand without one loses
nothing but samples. With fewer than :data:`MIN_SAMPLES` rises known over a
horizon the forecast does not know it (None): the headroom is then the
demand now (what the bridge did without a forecast), and no lent node is
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

from ..times import format_time
from .nodestate import parse_time

__all__ = ["STEP", "HISTORY", "DAILY_AFTER", "MIN_SAMPLES", "Record", "decode", "encode", "record", "wanted",
           "rise_quantiles", "demand_now", "reserve_horizons"]

#: Seconds per bucket of the record.
STEP = 900
#: Seconds of history kept: 14 days, 1,344 buckets.
HISTORY = 14 * 86400
#: History needed before the forecast looks at the time of day.
DAILY_AFTER = 3 * 86400
#: Rises needed for a quantile; fewer: the forecast is the demand now.
MIN_SAMPLES = 12
_BUCKETS = HISTORY // STEP
_DAY = 86400 // STEP
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
    """Per horizon (seconds), the q-quantile of the rises the record shows
    over that long (None: fewer than :data:`MIN_SAMPLES`). The bucket of
    ``now_bucket`` and later ones are left out: they are still filling.
    Recomputed once per bucket (the cache is keyed on the record)."""
    closed = rec.peaks[:max(0, (now_bucket - rec.start) // STEP)]
    known = [-1 if v is None else v for v in closed]
    values = known  # the buckets whose rises count
    daily = len(closed) - closed.count(None) >= DAILY_AFTER // STEP
    if daily:  # only the buckets within an hour of now's time of day
        tod, first = (now_bucket // STEP) % _DAY, rec.start // STEP
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


def wanted(rec: Record | None, now: datetime, demand: int, horizons: tuple[int, ...],
           q: float) -> list[int | None]:
    """Nodes Kubernetes will want within each horizon (seconds), at quantile
    ``q``: the recent peak (of the demand now and the peaks of this bucket
    and the last: the rises are measured from a bucket's peak, not from a
    moment of it) plus the rise the record shows; None where the record is
    too short to tell (the caller decides what not knowing means)."""
    if rec is None:
        return [None] * len(horizons)
    t = int(now.timestamp())
    bucket = t - t % STEP
    rises = rise_quantiles(rec, bucket, horizons, q)
    i = (bucket - rec.start) // STEP
    base = max([demand, *(v for v in rec.peaks[max(0, i - 1):i + 1] if v is not None)])
    return [None if r is None else base + r for r in rises]


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
