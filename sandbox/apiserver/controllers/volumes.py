"""The persistent volume controller and the stand-in's provisioners: each
unbound claim is provisioned as its StorageClass says (``storage.provision``,
pure), with the Events Kubernetes' controller and a CSI provisioner record.

A claim is looked at again when it changes, when a StorageClass appears,
changes or goes, and when a pod that uses it is bound to a node without the
scheduler (a ``WaitForFirstConsumer`` claim then takes that node). The
scheduler picks the node of the others (``scheduler.py``)."""

from __future__ import annotations

import copy
from collections.abc import Hashable, Iterable

from .. import storage
from ..api import Options
from ..store import Event, meta
from .base import Controller
from .events import Recorder
from .util import PODS, PVCS, deleting, name, namespace


class PersistentVolumes(Controller):
    name = storage.CONTROLLER
    watches = (PVCS, storage.STORAGECLASSES, PODS)

    def __init__(self, api) -> None:
        super().__init__(api)
        self._recorders: dict[str, Recorder] = {}
        #: What was said about each claim (by uid) last time, so that a claim's
        #: every change does not repeat its Events.
        self._said: dict[str, tuple[storage.Note, ...]] = {}

    def _unbound(self, ns: str | None = None) -> list[dict]:
        return [c for c in self.api.store.list(PVCS, ns) if not storage.bound(c) and not deleting(c)]

    def keys_for(self, ev: Event) -> Iterable[Hashable]:
        if ev.storage == PVCS:
            if ev.type == "DELETED":
                self._said.pop(meta(ev.obj).get("uid", ""), None)
            elif not storage.bound(ev.obj):
                yield (namespace(ev.obj), name(ev.obj))
        elif ev.storage == storage.STORAGECLASSES:
            yield from ((namespace(c), name(c)) for c in self._unbound())
        elif ev.type != "DELETED" and (ev.obj.get("spec") or {}).get("nodeName") \
                and not ((ev.old or {}).get("spec") or {}).get("nodeName"):
            ns = namespace(ev.obj)
            for claim in storage.claim_names(ev.obj):
                yield (ns, claim)

    def initial_keys(self) -> Iterable[Hashable]:
        return [(namespace(c), name(c)) for c in self._unbound()]

    def _recorder(self, component: str) -> Recorder:
        if component not in self._recorders:
            self._recorders[component] = Recorder(self.api, component)
        return self._recorders[component]

    def reconcile(self, key) -> float | None:
        ns, cname = key
        api = self.api
        rt = api.resource("", "v1", "persistentvolumeclaims")
        claim = api.store.get(PVCS, ns, cname)
        if claim is None or deleting(claim) or storage.bound(claim):
            return None
        classes = {name(sc): sc for sc in api.store.list(storage.STORAGECLASSES)}
        step = storage.provision(claim, classes, storage.consumer_node(claim, api.store.list(PODS, ns)))
        uid = meta(claim).get("uid", "")
        if self._said.get(uid) != step.notes:
            for note in step.notes:
                self._recorder(note.component).event(claim, note.type, note.reason, note.message)
            self._said[uid] = step.notes
        if not step.annotations and step.volume is None:
            return None
        body = copy.deepcopy(claim)
        body["metadata"]["annotations"] = {**(body["metadata"].get("annotations") or {}), **step.annotations}
        if step.volume is not None:
            body["spec"]["volumeName"] = step.volume
        if body != claim:
            api.update(rt, ns, cname, body, Options(field_manager=self.name), old=claim)
            claim = api.store.get(PVCS, ns, cname) or claim
        if step.volume is not None:
            api.write_status(rt, claim, storage.bound_status(claim), self.name)
        return None
