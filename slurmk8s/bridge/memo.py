"""Remembering work across decisions, keyed on unchanged inputs. Pure from the caller's view.

The bridge decides every round, for every policy, on a world that mostly did
not change. What it observes are immutable snapshots (frozen records in
tuples), so a result computed from an object holds as long as that object is
the one observed: a cache keyed on identity, holding its key so that the id
cannot be reused, gives the same answers as computing afresh. A watch cache
rebuilds its tuples every round but keeps the objects that did not change,
in their order: :func:`changed_spans` finds what did, at C speed, so that
only that is computed again.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from itertools import compress, count
from operator import is_not
from typing import Generic, TypeVar

__all__ = ["Recent", "changed_spans", "respliced", "forget", "forgettable"]

V = TypeVar("V")
T = TypeVar("T")
R = TypeVar("R")


_FORGET: list[Callable[[], None]] = []


def forgettable(clear: Callable[[], None]) -> None:
    """Have :func:`forget` call ``clear``."""
    _FORGET.append(clear)


def forget() -> None:
    """Drop everything remembered, as a new process starts (for benchmarks)."""
    for clear in _FORGET:
        clear()


class Recent(Generic[V]):
    """The last value made under each key (at most ``size`` keys, the oldest
    forgotten first), with the object it was made from. That object is held,
    so that its id cannot be reused while it is remembered, and only the
    last one per key: what is kept alive is one generation of inputs."""

    def __init__(self, size: int):
        self.size = size
        self.entries: dict[Hashable, tuple[object, V]] = {}
        forgettable(self.clear)

    def get(self, source: object, key: Hashable = None) -> V | None:
        """The value made from ``source`` itself under ``key``, if it is the last."""
        entry = self.entries.get(key)
        return entry[1] if entry is not None and entry[0] is source else None

    def latest(self, key: Hashable = None) -> tuple[object, V] | None:
        """The (source, value) remembered last under ``key``."""
        return self.entries.get(key)

    def put(self, source: object, value: V, key: Hashable = None) -> V:
        self.entries.pop(key, None)
        while len(self.entries) >= self.size:
            del self.entries[next(iter(self.entries))]
        self.entries[key] = (source, value)
        return value

    def clear(self) -> None:
        self.entries = {}


def changed_spans(old: Sequence[T], new: Sequence[T], limit: int) -> list[tuple[int, int, int]] | None:
    """Where ``new`` differs from ``old``, as spans ``(start, old_stop,
    new_stop)``: ``new[start:new_stop]`` stands where ``old[start:old_stop]``
    stood. Objects replaced in place, or one stretch removed or inserted
    (what a cache in insertion order does between two rounds); None when
    more than ``limit`` objects would be recomputed."""
    n = min(len(old), len(new))
    differ = list(compress(range(n), map(is_not, old, new)))
    if len(old) == len(new):
        return [(i, i + 1, i + 1) for i in differ] if len(differ) <= limit else None
    head = differ[0] if differ else n
    tail = min(next(compress(count(), map(is_not, reversed(old), reversed(new))), n), n - head)
    old_stop, new_stop = len(old) - tail, len(new) - tail
    return [(head, old_stop, new_stop)] if old_stop + new_stop - 2 * head <= limit else None


def respliced(values: Sequence[R], spans: list[tuple[int, int, int]], new: Sequence[T],
              f: Callable[[T], R]) -> list[R]:
    """``values`` (``f`` of each object of the old sequence) made the values
    of ``new``, computing ``f`` only on the objects in ``spans``."""
    out = list(values)
    for start, old_stop, new_stop in reversed(spans):
        out[start:old_stop] = [f(x) for x in new[start:new_stop]]
    return out
