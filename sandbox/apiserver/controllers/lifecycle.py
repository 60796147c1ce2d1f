"""Object life cycle: the garbage collector (ownerReferences, with background,
foreground and orphan propagation), namespace deletion and its default
contents, CustomResourceDefinition cleanup, and the pod garbage collector."""

from __future__ import annotations

import copy
from collections.abc import Hashable, Iterable

from ..api import CRD_CLEANUP, DeleteOptions, Options, node_ready
from ..errors import APIError
from ..store import Event, Storage, meta
from .base import ANY, Controller
from .util import CRDS, NAMESPACES, NODES, PODS, deleting, name, namespace, uid


def _remove_finalizer(api, storage: Storage, obj: dict, finalizer: str) -> None:
    rt = api.registry.by_storage(storage)
    current = api.store.get(storage, namespace(obj), name(obj))
    if rt is None or current is None or finalizer not in (meta(current).get("finalizers") or []):
        return
    body = copy.deepcopy(current)
    body["metadata"]["finalizers"] = [f for f in meta(current)["finalizers"] if f != finalizer]
    api.update(rt, namespace(current), name(current), body, Options(field_manager="garbage-collector"), old=current)


def _delete(api, storage: Storage, obj: dict, policy: str = "Background", grace: int | None = None) -> None:
    rt = api.registry.by_storage(storage)
    if rt is None:
        return
    try:
        api.delete(rt, namespace(obj), name(obj), DeleteOptions(propagation=policy, grace_period=grace))
    except APIError as e:
        if e.code != 404:
            raise


class GarbageCollector(Controller):
    """Deletes objects whose owners are all gone; runs foreground and orphan deletion."""

    name = "garbage-collector"
    watches = (ANY,)

    def keys_for(self, ev: Event) -> Iterable[Hashable]:
        m = meta(ev.obj)
        refs = m.get("ownerReferences") or []
        if ev.type == "DELETED":
            yield ("dependents", m.get("uid"))
            for ref in refs:
                yield ("owner", ref.get("uid"))
            return
        fins = set(m.get("finalizers") or [])
        if m.get("deletionTimestamp") and fins & {"orphan", "foregroundDeletion"}:
            yield ("owner", m.get("uid"))
        old_refs = (meta(ev.old).get("ownerReferences") or []) if ev.old is not None else []
        if refs and (ev.type == "ADDED" or refs != old_refs):
            yield ("dependent", ev.storage, m.get("namespace") or "", m.get("name"))

    def reconcile(self, key) -> float | None:
        store = self.api.store
        if key[0] == "dependents":
            for storage, obj in store.dependents(key[1]):
                self._check(storage, obj)
        elif key[0] == "dependent":
            obj = store.get(key[1], key[2], key[3])
            if obj is not None:
                self._check(key[1], obj)
        elif key[0] == "owner":
            self._owner(key[1])
        return None

    def _check(self, storage: Storage, obj: dict) -> None:
        if deleting(obj):
            return
        solid, dangling, waiting = [], [], []
        for ref in meta(obj).get("ownerReferences") or []:
            found = self.api.store.by_uid(ref.get("uid", ""))
            if found is None:
                dangling.append(ref)
                continue
            owner = found[1]
            if deleting(owner) and "foregroundDeletion" in (meta(owner).get("finalizers") or []) and ref.get("blockOwnerDeletion"):
                waiting.append(ref)
            else:
                solid.append(ref)
        if not dangling and not waiting:
            return
        if solid:
            rt = self.api.registry.by_storage(storage)
            if rt is None:
                return
            body = copy.deepcopy(obj)
            body["metadata"]["ownerReferences"] = solid
            self.api.update(rt, namespace(obj), name(obj), body, Options(field_manager="garbage-collector"), old=obj)
            return
        policy = "Foreground" if waiting and self.api.store.dependents(uid(obj)) else "Background"
        _delete(self.api, storage, obj, policy)

    def _owner(self, owner_uid: str) -> None:
        found = self.api.store.by_uid(owner_uid)
        if found is None:
            return
        storage, owner = found
        if not deleting(owner):
            return
        fins = meta(owner).get("finalizers") or []
        deps = self.api.store.dependents(owner_uid)
        if "orphan" in fins:
            for dstorage, dep in deps:
                rt = self.api.registry.by_storage(dstorage)
                if rt is None:
                    continue
                body = copy.deepcopy(dep)
                body["metadata"]["ownerReferences"] = [r for r in meta(dep).get("ownerReferences") or [] if r.get("uid") != owner_uid]
                if not body["metadata"]["ownerReferences"]:
                    del body["metadata"]["ownerReferences"]
                self.api.update(rt, namespace(dep), name(dep), body, Options(field_manager="garbage-collector"), old=dep)
            _remove_finalizer(self.api, storage, owner, "orphan")
        elif "foregroundDeletion" in fins:
            for dstorage, dep in deps:
                if not deleting(dep):
                    policy = "Foreground" if self.api.store.dependents(uid(dep)) else "Background"
                    _delete(self.api, dstorage, dep, policy)
            blocking = [
                dep for dstorage, dep in self.api.store.dependents(owner_uid)
                if any(r.get("uid") == owner_uid and r.get("blockOwnerDeletion") for r in meta(dep).get("ownerReferences") or [])
            ]
            if not blocking:
                _remove_finalizer(self.api, storage, owner, "foregroundDeletion")


class Namespaces(Controller):
    """Gives every namespace its ``default`` ServiceAccount and ``kube-root-ca.crt``
    ConfigMap; empties a deleted namespace, then lets it go."""

    name = "namespace-controller"
    watches = (ANY,)
    DEFAULTS = {("", "serviceaccounts"): "default", ("", "configmaps"): "kube-root-ca.crt"}

    def keys_for(self, ev: Event) -> Iterable[Hashable]:
        if ev.storage == NAMESPACES:
            yield name(ev.obj)
            return
        ns = namespace(ev.obj)
        if not ns or ev.type != "DELETED":
            return
        if self.DEFAULTS.get(ev.storage) == name(ev.obj):
            yield ns
            return
        nsobj = self.api.store.get(NAMESPACES, "", ns)
        if nsobj is not None and deleting(nsobj):
            yield ns

    def initial_keys(self) -> Iterable[Hashable]:
        return [name(n) for n in self.api.store.list(NAMESPACES)]

    def reconcile(self, ns: str) -> float | None:
        api = self.api
        nsobj = api.store.get(NAMESPACES, "", ns)
        if nsobj is None:
            return None
        if not deleting(nsobj):
            self._defaults(ns)
            return None
        storages = {rt.storage for rt in api.registry.all() if rt.namespaced}
        for storage in sorted(storages):
            for obj in api.store.list(storage, ns):
                if not deleting(obj):
                    _delete(api, storage, obj)
        if any(api.store.count(s, ns) for s in storages):
            return None  # DELETED events bring us back
        current = api.store.get(NAMESPACES, "", ns)
        if current is None or "kubernetes" not in ((current.get("spec") or {}).get("finalizers") or []):
            return None
        body = copy.deepcopy(current)
        body["spec"]["finalizers"] = [f for f in body["spec"]["finalizers"] if f != "kubernetes"]
        api.update(api.resource("", "v1", "namespaces"), None, ns, body, Options(field_manager="namespace-controller"), old=current)
        return None

    def _defaults(self, ns: str) -> None:
        api = self.api
        sa_rt = api.resource("", "v1", "serviceaccounts")
        if api.raw(sa_rt, ns, "default") is None:
            api.create(sa_rt, ns, {"metadata": {"name": "default"}}, Options(field_manager="serviceaccount-controller"))
        cm_rt = api.resource("", "v1", "configmaps")
        if api.ca_pem and api.raw(cm_rt, ns, "kube-root-ca.crt") is None:
            api.create(cm_rt, ns, {"metadata": {"name": "kube-root-ca.crt", "annotations": {"kubernetes.io/description": "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters."}},
                                   "data": {"ca.crt": api.ca_pem}}, Options(field_manager="root-ca-cert-publisher"))


class CRDCleanup(Controller):
    """Deleting a CustomResourceDefinition deletes its custom resources first."""

    name = "crd-finalizer"
    watches = (ANY,)

    def keys_for(self, ev: Event) -> Iterable[Hashable]:
        if ev.storage == CRDS:
            yield name(ev.obj)
            return
        if ev.type == "DELETED":
            rt = self.api.registry.by_storage(ev.storage)
            if rt is not None and rt.custom:
                crd = self.api.store.get(CRDS, "", rt.crd_name or "")
                if crd is not None and deleting(crd):
                    yield rt.crd_name

    def reconcile(self, crd_name: str) -> float | None:
        api = self.api
        crd = api.store.get(CRDS, "", crd_name)
        if crd is None or not deleting(crd) or CRD_CLEANUP not in (meta(crd).get("finalizers") or []):
            return None
        storage = (crd["spec"]["group"], crd["spec"]["names"]["plural"])
        for obj in api.store.list(storage):
            if not deleting(obj):
                _delete(api, storage, obj)
        if api.store.count(storage):
            return None
        _remove_finalizer(api, CRDS, crd, CRD_CLEANUP)
        return None


class PodGC(Controller):
    """Pods on a deleted node go; pods being deleted on a node that is not Ready
    (no kubelet to finish the job) are deleted at once."""

    name = "pod-garbage-collector"
    watches = (NODES, PODS)

    def keys_for(self, ev: Event) -> Iterable[Hashable]:
        if ev.storage == NODES:
            yield name(ev.obj)
        elif deleting(ev.obj) and (ev.obj.get("spec") or {}).get("nodeName") and ev.type != "DELETED":
            yield ev.obj["spec"]["nodeName"]

    def reconcile(self, node_name: str) -> float | None:
        api = self.api
        node = api.store.get(NODES, "", node_name)
        ready = node_ready(node)
        if ready:
            return None
        for pod in api.store.list(PODS):
            if (pod.get("spec") or {}).get("nodeName") != node_name:
                continue
            if node is None or deleting(pod):
                _delete(api, PODS, pod, grace=0)
        return None
