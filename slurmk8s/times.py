"""Times as slurmk8s writes them: RFC 3339 in UTC, to the second.

The one helper for every annotation, status field and message that holds a
time (``2025-01-31T23:59:59Z``), and to the millisecond where a decision
waits on the time to under a second (``2025-01-31T23:59:59.250Z``). Times in memory are timezone-aware
``datetime``s; a naive one is taken as UTC.
"""

from __future__ import annotations

from datetime import datetime, timezone

__all__ = ["format_time", "parse_time", "aware", "from_epoch"]


def aware(t: datetime) -> datetime:
    """``t`` with a time zone: a naive time is UTC."""
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def from_epoch(seconds: float) -> datetime:
    """A POSIX timestamp (``time.time()``) as an aware UTC datetime."""
    return datetime.fromtimestamp(seconds, tz=timezone.utc)


def format_time(t: datetime | float, *, millis: bool = False) -> str:
    """RFC 3339 in UTC to the second (``millis``: to the millisecond, rounded
    down); ``t`` a datetime or a POSIX timestamp."""
    if not isinstance(t, datetime):
        t = from_epoch(t if millis else int(t))
    t = aware(t).astimezone(timezone.utc)
    if millis:
        return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str | None) -> datetime | None:
    """The time a string holds (RFC 3339; naive means UTC); None when absent or unreadable."""
    if not value:
        return None
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00") if value.endswith("Z") else value)
    except (ValueError, TypeError):
        return None
    return aware(t)
