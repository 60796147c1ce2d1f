"""Lending windows: is lending allowed at a given instant? Pure."""

from __future__ import annotations

import zoneinfo
from collections.abc import Sequence
from datetime import datetime, timedelta
from functools import lru_cache

from ..api.lending import WEEKDAYS, LendingWindow

__all__ = ["in_window"]


def _minutes(hhmm: str) -> int:
    hours, minutes = hhmm.split(":")
    return int(hours) * 60 + int(minutes)


@lru_cache(maxsize=64)
def _zone(name: str) -> zoneinfo.ZoneInfo:
    return zoneinfo.ZoneInfo(name)


def in_window(windows: Sequence[LendingWindow], time_zone: str, now: datetime) -> bool:
    """Whether ``now`` (timezone-aware) falls in any window; no windows: always.

    Windows are read in ``time_zone``'s wall-clock time. A window whose end is
    at or before its start runs from its start on one of its days to its end
    on the next day; ``24:00`` is the end of the day.
    """
    if not windows:
        return True
    local = now.astimezone(_zone(time_zone))
    minute = local.hour * 60 + local.minute
    today = WEEKDAYS[local.weekday()]
    yesterday = WEEKDAYS[(local - timedelta(days=1)).weekday()]
    for w in windows:
        start, end = _minutes(w.start), _minutes(w.end)
        if start < end:
            if today in w.days and start <= minute < end:
                return True
        else:  # past midnight
            if today in w.days and minute >= start:
                return True
            if yesterday in w.days and minute < end:
                return True
    return False
