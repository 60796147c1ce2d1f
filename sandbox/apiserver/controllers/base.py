"""The controller loop: store events -> keys -> reconcile, one asyncio task per
controller, each key reconciled at most once per wake-up, with delayed requeues."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Iterable

from slurmk8s.log import get as get_logger

from ..api import API
from ..errors import APIError
from ..store import Event, Storage

log = get_logger("slurmk8s.apiserver.controllers")

ANY: Storage = ("*", "*")


class Controller:
    """Subclasses set ``watches`` and implement ``keys_for`` and ``reconcile``."""

    name = "controller"
    watches: tuple[Storage, ...] = ()

    def __init__(self, api: API) -> None:
        self.api = api
        self._dirty: dict[Hashable, None] = {}
        self._wake = asyncio.Event()
        self._timers: dict[Hashable, asyncio.TimerHandle] = {}

    # what to reconcile --------------------------------------------------------
    def keys_for(self, ev: Event) -> Iterable[Hashable]:
        return ()

    def initial_keys(self) -> Iterable[Hashable]:
        return ()

    def reconcile(self, key: Hashable) -> float | None:
        """Bring ``key`` closer to its desired state; return seconds to requeue after, or None."""
        raise NotImplementedError

    # plumbing -------------------------------------------------------------------
    def add(self, key: Hashable) -> None:
        self._dirty[key] = None
        self._wake.set()

    def add_after(self, key: Hashable, delay: float) -> None:
        old = self._timers.get(key)
        loop = asyncio.get_running_loop()
        due = loop.time() + delay
        if old is not None and old.when() <= due:
            return
        if old is not None:
            old.cancel()
        self._timers[key] = loop.call_at(due, self._fire, key)

    def _fire(self, key: Hashable) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def on_event(self, ev: Event) -> None:
        if ANY in self.watches or ev.storage in self.watches:
            for key in self.keys_for(ev):
                self.add(key)

    async def run(self) -> None:
        for key in self.initial_keys():
            self.add(key)
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch = list(self._dirty)
            self._dirty.clear()
            for key in batch:
                try:
                    again = self.reconcile(key)
                except APIError as e:
                    if e.code == 409:
                        again = 0.05
                    elif e.code == 404:
                        again = None
                    else:
                        log.warning("reconcile refused", controller=self.name, key=str(key), code=e.code, error=e.message)
                        again = 1.0
                except Exception:
                    log.exception("reconcile failed", controller=self.name, key=str(key))
                    again = 1.0
                if again is not None:
                    if again <= 0:
                        self.add(key)
                    else:
                        self.add_after(key, again)
                await asyncio.sleep(0)

    def cancel_timers(self) -> None:
        for t in self._timers.values():
            t.cancel()
        self._timers.clear()


class Manager:
    """Runs every controller against one API."""

    def __init__(self, api: API, controllers: Iterable[type[Controller]] | None = None) -> None:
        from . import ALL

        self.api = api
        self.controllers = [cls(api) for cls in (controllers or ALL)]
        self._tasks: list[asyncio.Task] = []

    def _on_event(self, ev: Event) -> None:
        for c in self.controllers:
            c.on_event(ev)

    def start(self) -> None:
        self.api.store.listeners.append(self._on_event)
        for c in self.controllers:
            self._tasks.append(asyncio.get_running_loop().create_task(c.run(), name=f"controller:{c.name}"))

    async def stop(self) -> None:
        if self._on_event in self.api.store.listeners:
            self.api.store.listeners.remove(self._on_event)
        for c in self.controllers:
            c.cancel_timers()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
