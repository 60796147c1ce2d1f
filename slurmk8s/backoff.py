"""How long to wait before trying again: the one rule for every client and loop.

- :func:`retry_after`: the seconds a ``Retry-After`` header asks for (delta
  seconds or an HTTP date), bounded by a cap; a header that does not parse
  gets the default. Pure.
- :func:`patiently`: send a request again while the server answers "busy"
  (``429``, or a ``5xx`` with ``Retry-After``: client-go's rule), waiting
  what it asks, within a bounded number of tries and a time budget; the
  last answer is returned once the budget or the tries run out, so a busy
  server becomes the caller's error, never an endless wait. The Kubernetes
  client (:mod:`slurmk8s.kube`, and through it leader election) and the
  agent's client (:mod:`slurmk8s.slurm.remote`) use it.
- :func:`round_backoff`: how long a loop waits after ``failures`` failed
  rounds in a row: exponential from the loop's interval, with jitter, up to
  a cap (the operator's rounds per cluster, :mod:`slurmk8s.operator.handlers`).

The waiting itself is tenacity's.
"""

from __future__ import annotations

import email.utils
import re
import time
from collections.abc import Callable
from typing import TypeVar

import tenacity

__all__ = ["retry_after", "busy", "patiently", "round_backoff", "RETRY_AFTER_CAP", "ROUND_BACKOFF_CAP"]

T = TypeVar("T")

#: The longest one ``Retry-After`` is waited for, whatever the server asks.
RETRY_AFTER_CAP = 10.0
#: The longest wait between two rounds of a cluster whose rounds keep failing.
ROUND_BACKOFF_CAP = 300.0

_DELTA = re.compile(r"[0-9]{1,9}")


def retry_after(value: str | None, *, default: float = 1.0, cap: float = RETRY_AFTER_CAP,
                now: Callable[[], float] = time.time) -> float:
    """The seconds ``value`` (a ``Retry-After`` header) asks to wait, within
    ``[0, cap]``; ``default`` (also capped) when it is absent or does not parse."""
    seconds: float = default
    text = (value or "").strip()
    if _DELTA.fullmatch(text):
        seconds = float(text)
    elif text:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError, OverflowError):
            when = None
        if when is not None and when.tzinfo is not None:
            seconds = when.timestamp() - now()
    return min(max(seconds, 0.0), cap)


def busy(status: int, header: str | None) -> bool:
    """A server's "not now, again later": 429, or a 5xx that says when (``Retry-After``)."""
    return status == 429 or (status >= 500 and header is not None)


def patiently(send: Callable[[], T], wait_of: Callable[[T], float | None], *, budget: float, tries: int = 4,
              sleep: Callable[[float], None] = time.sleep) -> T:
    """``send()``, again after ``wait_of(answer)`` seconds while that is not
    None (the answer said busy), at most ``tries`` times and never starting a
    try ``budget`` seconds or more after the first: then the last answer."""
    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_result(lambda answer: wait_of(answer) is not None),
        wait=lambda state: wait_of(state.outcome.result()) or 0.0,  # type: ignore[union-attr]  # set once a try ended
        stop=tenacity.stop_after_attempt(max(1, tries)) | tenacity.stop_before_delay(budget),
        retry_error_callback=lambda state: state.outcome.result(),  # type: ignore[union-attr]  # as above
        sleep=sleep, reraise=True)
    return retrying(send)


_ROUND_WAITS: dict[tuple[float, float], tenacity.wait.wait_base] = {}


def round_backoff(failures: int, interval: float, cap: float = ROUND_BACKOFF_CAP) -> float:
    """Seconds before the next round after ``failures`` (1 or more) failed in a
    row: ``interval`` doubled per failure, plus up to one ``interval`` of
    jitter (so the clusters of one outage do not retry in step), at most
    ``cap``. No failure: ``interval``."""
    if failures <= 0:
        return interval
    wait = _ROUND_WAITS.setdefault((interval, cap), tenacity.wait_exponential_jitter(
        multiplier=interval, max=cap, exp_base=2, jitter=interval))
    state = tenacity.RetryCallState(None, None, (), {})  # type: ignore[arg-type]  # for the wait's arithmetic alone
    state.attempt_number = failures
    return float(wait(state))
