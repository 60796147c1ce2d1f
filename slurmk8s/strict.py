"""Strict readers of the strings Kubernetes objects hold: numbers and times. Pure.

Anyone who may patch a Node (its kubelet, a labelling DaemonSet, an
autoscaler) or a Pod writes its annotations and labels, so every string the
bridge or the operator turns into a number or a time is read here, and only
here, by one rule: ASCII digits only (``str.isdigit`` takes ``²`` and ``٣``,
``int`` takes ``٣``, ``1_000`` and `` 7 ``), within a bound, and RFC 3339
for times. A string that does not read so is ``None`` (or left out of a
list): never an exception. What an unreadable value means is the caller's
decision (decide toward Kubernetes).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

__all__ = ["count", "counts", "parse_time", "not_after", "MAX_JOB_ID"]

#: Slurm's job ids are unsigned 32-bit integers.
MAX_JOB_ID = 2**32 - 1

_DIGITS = re.compile(r"[0-9]+", re.ASCII)

#: RFC 3339 (``2025-01-31T23:59:59Z``, ``2025-01-31T23:59:59.250+02:00``);
#: without an offset the time is UTC, as slurmk8s has always read it.
_TIME = re.compile(
    r"(?P<y>[0-9]{4})-(?P<mo>[0-9]{2})-(?P<d>[0-9]{2})"
    r"(?:T(?P<h>[0-9]{2}):(?P<mi>[0-9]{2}):(?P<s>[0-9]{2})(?:\.(?P<f>[0-9]{1,9}))?"
    r"(?P<z>Z|[+-][0-9]{2}:[0-9]{2})?)?",
    re.ASCII,
)


def count(value: str | None, maximum: int) -> int | None:
    """The whole number ``0..maximum`` that ``value`` spells in ASCII digits
    (no sign, space, underscore or other script's digits); None otherwise."""
    if not isinstance(value, str) or len(value) > len(str(maximum)) or not _DIGITS.fullmatch(value):
        return None
    n = int(value)
    return n if n <= maximum else None


def counts(value: str | None, maximum: int, sep: str = ",") -> tuple[int, ...]:
    """The numbers of a ``sep``-separated list (spaces around each are
    allowed), each read by :func:`count`; unreadable entries are left out."""
    if not isinstance(value, str):
        return ()
    out = []
    for item in value.split(sep):
        n = count(item.strip(" "), maximum)
        if n is not None:
            out.append(n)
    return tuple(out)


def parse_time(value: str | None) -> datetime | None:
    """The time an RFC 3339 string holds, as an aware UTC datetime; a date
    alone is its midnight, no offset means UTC. None when absent,
    unreadable, or out of what a datetime holds once in UTC."""
    if not isinstance(value, str) or len(value) > 40:
        return None
    m = _TIME.fullmatch(value)
    if m is None:
        return None
    try:
        t = datetime(int(m["y"]), int(m["mo"]), int(m["d"]), int(m["h"] or 0), int(m["mi"] or 0),
                     int(m["s"] or 0), int((m["f"] or "0").ljust(6, "0")[:6]), tzinfo=UTC)
        z = m["z"]
        if z and z != "Z":
            hours, minutes = int(z[1:3]), int(z[4:6])
            if hours > 23 or minutes > 59:
                return None
            offset = timedelta(hours=hours, minutes=minutes)
            t = t - offset if z[0] == "+" else t + offset
    except (ValueError, OverflowError):
        return None
    return t


def not_after(t: datetime | None, now: datetime) -> datetime | None:
    """``t``, or ``now`` when ``t`` is later: a time read from an object is
    never in the future, so it can never push a grace period or a deadline
    past what the policy allows from now."""
    return None if t is None else min(t, now)
