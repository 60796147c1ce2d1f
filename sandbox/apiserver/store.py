"""The object store: current objects, the resourceVersion sequence, watch history.

Every write gets the next resourceVersion (one global, monotonic counter, as
etcd's revision), is written to SQLite in the data directory, appended to a
bounded history, and handed to watchers and in-process listeners. A watch that
resumes from a version older than the history gets 410 Gone.

All methods run on the server's event loop thread; stored objects are never
modified in place (writers store new dicts), so readers may keep references.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .errors import APIError

#: etcd's default --max-request-bytes (1.5 MiB): no stored object may be larger.
MAX_OBJECT_BYTES = 1536 * 1024

Storage = tuple[str, str]  # (group, plural)
Key = tuple[str, str]  # (namespace or "", name)


@dataclass(frozen=True)
class Event:
    rv: int
    type: str  # ADDED | MODIFIED | DELETED
    storage: Storage
    obj: dict  # the new object; for DELETED, its last state
    old: dict | None = None


def meta(obj: dict) -> dict:
    return obj.get("metadata") or {}


def key_of(obj: dict) -> Key:
    m = meta(obj)
    return (m.get("namespace") or "", m.get("name") or "")


@dataclass(eq=False)
class Watcher:
    storage: Storage
    namespace: str | None
    predicate: Callable[[dict], bool]
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    closed: bool = False

    def offer(self, ev: Event) -> None:
        kind = translate(ev, self.namespace, self.predicate)
        if kind:
            self.queue.put_nowait((kind, ev.obj, ev.rv))

    def close(self) -> None:
        self.closed = True
        self.queue.put_nowait(None)


def translate(ev: Event, namespace: str | None, predicate: Callable[[dict], bool]) -> str | None:
    """The event a filtered watcher sees: an object moving into its selection is
    ADDED, one moving out is DELETED, as Kubernetes does."""
    if namespace is not None and key_of(ev.obj)[0] != namespace:
        return None
    new = predicate(ev.obj)
    if ev.type == "ADDED":
        return "ADDED" if new else None
    if ev.type == "DELETED":
        return "DELETED" if new else None
    old = ev.old is not None and predicate(ev.old)
    if old and new:
        return "MODIFIED"
    if new:
        return "ADDED"
    if old:
        return "DELETED"
    return None


class TooOld(Exception):
    def __init__(self, requested: int, oldest: int) -> None:
        super().__init__(f"too old resource version: {requested} ({oldest})")
        self.requested = requested
        self.oldest = oldest


class Store:
    def __init__(self, db_path: Path | None, history_limit: int = 10000) -> None:
        self.rv = 0
        self.history_limit = max(1, history_limit)
        self.history: deque[Event] = deque()
        self.compacted = 0  # events with rv <= compacted are no longer in history
        self._objects: dict[Storage, dict[Key, dict]] = {}
        self._uids: dict[str, tuple[Storage, Key]] = {}
        self._dependents: dict[str, set[tuple[Storage, Key]]] = {}
        self.watchers: set[Watcher] = set()
        self.listeners: list[Callable[[Event], None]] = []
        self._db: sqlite3.Connection | None = None
        if db_path is not None:
            self._open(db_path)

    # --- persistence ---------------------------------------------------------

    def _open(self, path: Path) -> None:
        db = sqlite3.connect(str(path), isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute(
            "CREATE TABLE IF NOT EXISTS objects (grp TEXT, plural TEXT, ns TEXT, name TEXT, data TEXT,"
            " PRIMARY KEY (grp, plural, ns, name))"
        )
        db.execute("CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT)")
        row = db.execute("SELECT v FROM meta WHERE k='rv'").fetchone()
        rv = int(row[0]) if row else 0
        for grp, plural, ns, name, data in db.execute("SELECT grp, plural, ns, name, data FROM objects"):
            obj = json.loads(data)
            self._index((grp, plural), (ns, name), obj)
            rv = max(rv, int(meta(obj).get("resourceVersion") or 0))
        self.rv = rv
        self.compacted = rv  # history does not survive a restart: older watches get 410
        self._db = db

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
        for w in list(self.watchers):
            w.close()

    def _persist(self, storage: Storage, key: Key, obj: dict | None) -> None:
        if self._db is None:
            return
        db = self._db
        db.execute("BEGIN")
        if obj is None:
            db.execute("DELETE FROM objects WHERE grp=? AND plural=? AND ns=? AND name=?", (*storage, *key))
        else:
            db.execute(
                "INSERT OR REPLACE INTO objects VALUES (?, ?, ?, ?, ?)",
                (*storage, *key, json.dumps(obj, separators=(",", ":"))),
            )
        db.execute("INSERT OR REPLACE INTO meta VALUES ('rv', ?)", (str(self.rv),))
        db.execute("COMMIT")

    # --- indexes ------------------------------------------------------------

    def _index(self, storage: Storage, key: Key, obj: dict) -> None:
        self._objects.setdefault(storage, {})[key] = obj
        uid = meta(obj).get("uid")
        if uid:
            self._uids[uid] = (storage, key)
        for ref in meta(obj).get("ownerReferences") or []:
            if ref.get("uid"):
                self._dependents.setdefault(ref["uid"], set()).add((storage, key))

    def _unindex(self, storage: Storage, key: Key, obj: dict) -> None:
        self._objects.get(storage, {}).pop(key, None)
        uid = meta(obj).get("uid")
        if uid and self._uids.get(uid) == (storage, key):
            del self._uids[uid]
        for ref in meta(obj).get("ownerReferences") or []:
            deps = self._dependents.get(ref.get("uid") or "")
            if deps is not None:
                deps.discard((storage, key))
                if not deps:
                    del self._dependents[ref["uid"]]

    # --- reads --------------------------------------------------------------

    def get(self, storage: Storage, namespace: str, name: str) -> dict | None:
        return self._objects.get(storage, {}).get((namespace or "", name))

    def list(self, storage: Storage, namespace: str | None = None) -> list[dict]:
        items = self._objects.get(storage, {})
        keys = sorted(k for k in items if namespace is None or k[0] == namespace)
        return [items[k] for k in keys]

    def count(self, storage: Storage, namespace: str | None = None) -> int:
        items = self._objects.get(storage, {})
        if namespace is None:
            return len(items)
        return sum(1 for k in items if k[0] == namespace)

    def storages(self) -> list[Storage]:
        return [s for s, items in self._objects.items() if items]

    def by_uid(self, uid: str) -> tuple[Storage, dict] | None:
        where = self._uids.get(uid)
        if where is None:
            return None
        obj = self._objects.get(where[0], {}).get(where[1])
        return (where[0], obj) if obj is not None else None

    def dependents(self, owner_uid: str) -> list[tuple[Storage, dict]]:
        out = []
        for storage, key in sorted(self._dependents.get(owner_uid, ())):
            obj = self._objects.get(storage, {}).get(key)
            if obj is not None:
                out.append((storage, obj))
        return out

    # --- writes -------------------------------------------------------------

    def next_rv(self) -> int:
        self.rv += 1
        return self.rv

    def put(self, storage: Storage, obj: dict) -> Event:
        """Create or replace ``obj`` (the store takes ownership of the dict).

        An object larger than etcd's request limit is refused, as etcd refuses it."""
        if len(json.dumps(obj, separators=(",", ":"))) > MAX_OBJECT_BYTES:
            raise APIError(413, "etcdserver: request is too large", "RequestEntityTooLarge")
        key = key_of(obj)
        old = self.get(storage, *key)
        rv = self.next_rv()
        obj["metadata"]["resourceVersion"] = str(rv)
        if old is not None:
            self._unindex(storage, key, old)
        self._index(storage, key, obj)
        self._persist(storage, key, obj)
        ev = Event(rv, "MODIFIED" if old is not None else "ADDED", storage, obj, old)
        self._emit(ev)
        return ev

    def remove(self, storage: Storage, obj: dict) -> Event:
        key = key_of(obj)
        old = self.get(storage, *key)
        if old is None:
            raise KeyError(key)
        rv = self.next_rv()
        last = dict(old)
        last["metadata"] = dict(meta(old), resourceVersion=str(rv))
        self._unindex(storage, key, old)
        self._persist(storage, key, None)
        ev = Event(rv, "DELETED", storage, last, old)
        self._emit(ev)
        return ev

    def _emit(self, ev: Event) -> None:
        self.history.append(ev)
        while len(self.history) > self.history_limit:
            self.compacted = self.history.popleft().rv
        for w in list(self.watchers):
            if w.storage == ev.storage and not w.closed:
                w.offer(ev)
        for listener in list(self.listeners):
            listener(ev)

    # --- watch --------------------------------------------------------------

    def since(self, rv: int, storage: Storage) -> Iterator[Event]:
        """History after ``rv``; raises TooOld if part of it was compacted away."""
        if rv < self.compacted:
            raise TooOld(rv, self.compacted + 1)
        return (ev for ev in list(self.history) if ev.rv > rv and ev.storage == storage)

    def watch(self, storage: Storage, namespace: str | None, predicate: Callable[[dict], bool],
              since: int | None, initial: Iterable[dict] = ()) -> Watcher:
        """A watcher primed with ``initial`` objects (as ADDED) or the history after ``since``."""
        backlog = list(self.since(since, storage)) if since is not None else []
        w = Watcher(storage, namespace, predicate)
        for obj in initial:
            w.queue.put_nowait(("ADDED", obj, int(meta(obj).get("resourceVersion") or 0)))
        for ev in backlog:
            w.offer(ev)
        self.watchers.add(w)
        return w

    def unwatch(self, w: Watcher) -> None:
        self.watchers.discard(w)
        w.closed = True
