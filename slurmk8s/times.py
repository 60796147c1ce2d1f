"""Times as slurmk8s writes them: RFC 3339 in UTC, to the second.

The one helper for every annotation, status field and message that holds a
time (``2025-01-31T23:59:59Z``), and to the millisecond where a decision
waits on the time to under a second (``2025-01-31T23:59:59.250Z``). Times in memory are timezone-aware
``datetime``s; a naive one is taken as UTC. Times are read by
:func:`slurmk8s.strict.parse_time` (re-exported here): strictly, and never
raising.
"""

from __future__ import annotations

from datetime import UTC, datetime

from .strict import parse_time  # the one strict reader of times (RFC 3339)

__all__ = ["format_time", "parse_time", "aware", "from_epoch"]


def aware(t: datetime) -> datetime:
    """``t`` with a time zone: a naive time is UTC."""
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def from_epoch(seconds: float) -> datetime:
    """A POSIX timestamp (``time.time()``) as an aware UTC datetime."""
    return datetime.fromtimestamp(seconds, tz=UTC)


def format_time(t: datetime | float, *, millis: bool = False) -> str:
    """RFC 3339 in UTC to the second (``millis``: to the millisecond, rounded
    down); ``t`` a datetime or a POSIX timestamp."""
    if not isinstance(t, datetime):
        t = from_epoch(t if millis else int(t))
    t = aware(t).astimezone(UTC)
    # Not strftime: its %Y writes the year 1 as "1", which no reader takes.
    text = f"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t.hour:02d}:{t.minute:02d}:{t.second:02d}"
    return text + (f".{t.microsecond // 1000:03d}Z" if millis else "Z")
