"""Watch-driven caches of Kubernetes objects (informers): list once, then
watch from the list's resourceVersion; relist on 410 Gone; after any other
error, wait (growing back-off) and relist; relist every ``resync`` seconds
for safety.

The cache logic is pure and lives in :class:`Store` (no I/O, no clock):
``replace`` after a list, ``apply`` per watch event, ``write_through`` for
the caller's own writes. :class:`Informer` is the thin shell, one thread,
around a ``source`` with the two calls of :class:`slurmk8s.kube.Kube`:
``list_versioned(kind, namespace) -> (items, resourceVersion)`` and
``watch(kind, namespace, resourceVersion, timeout_seconds=) -> events``.

A store is *synced* once a list has filled it, and stops being synced when
events may have been missed (410, a broken watch) until the next list has
filled it again. Callers decide nothing from a store that is not synced.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import structlog

__all__ = ["Store", "Change", "Gone", "WatchFailed", "Informer", "backoff", "object_key", "Source"]

log = structlog.get_logger("slurmk8s.informer")

T = TypeVar("T")


class Gone(Exception):
    """The resourceVersion is too old for the server (410): events were lost; relist."""


class WatchFailed(Exception):
    """The server sent an ERROR event other than 410."""


def object_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name``, or ``name`` for a cluster-scoped object."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta['name']}" if ns else meta["name"]


def _version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


@dataclass(frozen=True)
class Change(Generic[T]):
    """What one event changed: the parsed object before and after (None: absent)."""

    key: str
    old: T | None
    new: T | None


def backoff(failures: int, *, base: float = 0.5, cap: float = 30.0, jitter: float = 0.0) -> float:
    """Seconds to wait after ``failures`` failures in a row (1, 2, ...):
    ``base`` doubled each time up to ``cap``, then stretched by ``jitter``
    (a fraction in [0, 1), drawn by the caller) so that many clients do not
    come back at once."""
    if failures <= 0:
        return 0.0
    return min(cap, base * 2 ** (failures - 1)) * (1 + jitter)


class Store(Generic[T]):
    """The cache of one kind: key -> (raw object or None, parsed object).

    ``parse`` turns an API object into what callers read (e.g. a frozen
    record); ``keep_raw`` keeps the API object too (for writes that need its
    resourceVersion). Thread-safe: the informer writes, rounds read."""

    def __init__(self, parse: Callable[[Mapping[str, Any]], T], *, keep_raw: bool = True):
        self.parse = parse
        self.keep_raw = keep_raw
        self._lock = threading.Lock()
        self._items: dict[str, tuple[Mapping[str, Any] | None, T, str]] = {}
        #: key -> the resourceVersion of our own write, until its event arrives.
        self._pins: dict[str, str] = {}
        self.version = ""
        self.synced = False

    def _entry(self, obj: Mapping[str, Any]) -> tuple[Mapping[str, Any] | None, T, str]:
        return (obj if self.keep_raw else None, self.parse(obj), _version(obj))

    def replace(self, items: Iterable[Mapping[str, Any]], version: str) -> None:
        """A list's result: the whole content, and synced."""
        fresh = {object_key(o): self._entry(o) for o in items}
        with self._lock:
            self._items, self._pins = fresh, {}
            self.version, self.synced = version, True

    def unsync(self) -> None:
        """Events may have been missed: callers must not decide from this store until the next list."""
        with self._lock:
            self.synced = False

    def apply(self, event: Mapping[str, Any]) -> Change[T] | None:
        """One watch event. Returns what changed (None for a bookmark, or for
        an event older than our own write of that object, which is ignored
        until the write's own event arrives). Raises :class:`Gone` for a 410
        and :class:`WatchFailed` for other ``ERROR`` events."""
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Gone(obj.get("message") or "resource version too old")
            raise WatchFailed(f"{obj.get('code')} {obj.get('reason')}: {obj.get('message')}")
        version = _version(obj)
        if kind == "BOOKMARK":
            with self._lock:
                self.version = version or self.version
            return None
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            raise WatchFailed(f"unknown watch event type {kind!r}")
        key = object_key(obj)
        entry = None if kind == "DELETED" else self._entry(obj)
        with self._lock:
            self.version = version or self.version
            pin = self._pins.get(key)
            if pin is not None:
                if pin != version:
                    return None  # older than what we wrote; ours is on its way
                del self._pins[key]
            before = self._items.get(key)
            if entry is None:
                self._items.pop(key, None)
            else:
                self._items[key] = entry
        return Change(key, before[1] if before else None, entry[1] if entry else None)

    def write_through(self, obj: Mapping[str, Any]) -> None:
        """An object as the server returned it after our own write: the cache
        shows it at once, and events older than it are ignored until its own
        arrives (a write that changed nothing has no event: nothing is pinned)."""
        key, version = object_key(obj), _version(obj)
        entry = self._entry(obj)
        with self._lock:
            before = self._items.get(key)
            if before is not None and before[2] == version:
                return
            self._items[key] = entry
            if version:
                self._pins[key] = version

    def values(self) -> list[T]:
        with self._lock:
            return [e[1] for e in self._items.values()]

    def raw(self) -> dict[str, Mapping[str, Any]]:
        with self._lock:
            return {k: e[0] for k, e in self._items.items() if e[0] is not None}

    def get(self, key: str) -> T | None:
        with self._lock:
            entry = self._items.get(key)
        return entry[1] if entry else None


class Source(Protocol):
    def list_versioned(self, kind: str, namespace: str | None = None) -> tuple[list[dict], str]: ...

    def watch(self, kind: str, namespace: str | None, resource_version: str, *,
              timeout_seconds: int = 300) -> Iterator[dict]: ...


class Informer(Generic[T]):
    """Keeps a :class:`Store` of ``kind`` (in ``namespace``; None: all)
    current from ``source``, on its own daemon thread. ``on_change(change)``
    is called (on that thread) after each event that changed the store, and
    with ``None`` after each list."""

    def __init__(self, source: Source, kind: str, namespace: str | None, store: Store[T], *,
                 on_change: Callable[[Change[T] | None], None] = lambda change: None,
                 resync: float = 600.0, watch_timeout: int = 300,
                 sleep: Callable[[float], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 jitter: Callable[[], float] = lambda: random.uniform(0, 0.5)):
        self.source, self.kind, self.namespace, self.store = source, kind, namespace, store
        self.on_change = on_change
        self.resync, self.watch_timeout = resync, watch_timeout
        self.clock, self.jitter = clock, jitter
        self._stop = threading.Event()
        self.sleep = sleep or self._stop.wait
        self.failures = 0
        self.lists = 0
        self._thread: threading.Thread | None = None

    @property
    def name(self) -> str:
        return f"{self.kind}/{self.namespace}" if self.namespace else self.kind

    def start(self) -> Informer[T]:
        self._thread = threading.Thread(target=self.run, daemon=True, name=f"informer-{self.name}")
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop after the current event or wait (a silent watch ends within ``watch_timeout``)."""
        self._stop.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def run(self) -> None:
        while not self.stopped:
            self.step()

    def step(self) -> None:
        """One list and the watches that follow it, until a resync is due or
        something fails; a failure leaves the store unsynced and waits."""
        try:
            self.list()
            listed = self.clock()
            while not self.stopped and self.clock() - listed < self.resync:
                left = self.resync - (self.clock() - listed)
                self.watch(max(1, min(self.watch_timeout, int(left + 0.999))))
        except Exception as exc:  # noqa: BLE001 - any failure: unsynced, back off, relist
            self.store.unsync()
            self.failures += 1
            if isinstance(exc, Gone) or getattr(exc, "status", None) == 410:
                # The server compacted past our version: relist at once (the
                # first time; repeated 410s back off like errors).
                wait = backoff(self.failures - 1, jitter=self.jitter())
                log.info("watch expired, relisting", informer=self.name, reason=str(exc))
            else:
                wait = backoff(self.failures, jitter=self.jitter())
                log.warning("informer failed, relisting after back-off", informer=self.name,
                            error=str(exc), retry_in=round(wait, 2))
            if wait:
                self.sleep(wait)

    def list(self) -> None:
        items, version = self.source.list_versioned(self.kind, self.namespace)
        self.store.replace(items, version)
        self.lists += 1
        self.on_change(None)

    def watch(self, timeout: int) -> None:
        """Watch from the store's version until the server ends the stream (or
        we stop); raises on errors and on 410."""
        for event in self.source.watch(self.kind, self.namespace, self.store.version, timeout_seconds=timeout):
            if self.stopped:
                return
            change = self.store.apply(event)
            self.failures = 0  # the watch works again
            if change is not None:
                self.on_change(change)
        self.failures = 0  # a stream the server ended on time
