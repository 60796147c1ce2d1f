"""Controllers for the rest of what slurmk8s' objects expect from a cluster:
Services get Endpoints, PodDisruptionBudgets get a status (which evictions
consult), ResourceQuotas their usage. Claims are provisioned in
:mod:`.volumes`."""

from __future__ import annotations

import copy
from collections.abc import Hashable, Iterable
from datetime import timedelta

from .. import timeutil
from ..api import DeleteOptions, Options
from ..errors import APIError
from ..quota import usage
from ..selectors import from_label_selector_object, labels_match
from ..store import Event, meta
from .base import ANY, Controller
from .util import (
    ENDPOINTS,
    PDBS,
    PODS,
    SERVICES,
    name,
    namespace,
    pod_active,
    pod_ready,
    resolve_int_or_percent,
    set_condition,
)


class Endpoints(Controller):
    name = "endpoint-controller"
    watches = (SERVICES, PODS, ENDPOINTS)

    def keys_for(self, ev: Event) -> Iterable[Hashable]:
        ns = namespace(ev.obj)
        if ev.storage in (SERVICES, ENDPOINTS):
            yield (ns, name(ev.obj))
            return
        for svc in self.api.store.list(SERVICES, ns):
            if (svc.get("spec") or {}).get("selector"):
                yield (ns, name(svc))

    def initial_keys(self) -> Iterable[Hashable]:
        return [(namespace(s), name(s)) for s in self.api.store.list(SERVICES)]

    def reconcile(self, key) -> float | None:
        ns, sname = key
        api = self.api
        ep_rt = api.resource("", "v1", "endpoints")
        svc = api.store.get(SERVICES, ns, sname)
        current = api.store.get(ENDPOINTS, ns, sname)
        if svc is None:
            if current is not None and (meta(current).get("labels") or {}).get("endpoints.kubernetes.io/managed-by") == self.name:
                api.delete(ep_rt, ns, sname, DeleteOptions())
            return None
        spec = svc.get("spec") or {}
        selector = spec.get("selector")
        if not selector:
            return None
        subsets: dict[str, dict] = {}
        for pod in api.store.list(PODS, ns):
            if not pod_active(pod) or not all((meta(pod).get("labels") or {}).get(k) == v for k, v in selector.items()):
                continue
            ip = (pod.get("status") or {}).get("podIP")
            if not ip:
                continue
            pspec = pod.get("spec") or {}
            ports = []
            for sp in spec.get("ports") or []:
                target = sp.get("targetPort", sp.get("port"))
                if isinstance(target, str):
                    found = [p.get("containerPort") for c in pspec.get("containers") or [] for p in c.get("ports") or [] if p.get("name") == target]
                    if not found:
                        continue
                    target = found[0]
                entry = {"port": target, "protocol": sp.get("protocol", "TCP")}
                if sp.get("name"):
                    entry["name"] = sp["name"]
                ports.append(entry)
            address = {"ip": ip, "targetRef": {"kind": "Pod", "namespace": ns, "name": name(pod), "uid": meta(pod).get("uid")}}
            if pspec.get("nodeName"):
                address["nodeName"] = pspec["nodeName"]
            if pspec.get("hostname") and pspec.get("subdomain") == sname:
                address["hostname"] = pspec["hostname"]
            ident = repr(ports)
            subset = subsets.setdefault(ident, {"ports": ports} if ports else {})
            ready = pod_ready(pod) or spec.get("publishNotReadyAddresses")
            subset.setdefault("addresses" if ready else "notReadyAddresses", []).append(address)
        body_subsets = []
        for s in subsets.values():
            for k in ("addresses", "notReadyAddresses"):
                if k in s:
                    s[k].sort(key=lambda a: a["ip"])
            body_subsets.append(s)
        labels = dict(meta(svc).get("labels") or {})
        labels["endpoints.kubernetes.io/managed-by"] = self.name
        opts = Options(field_manager=self.name)
        if current is None:
            api.create(ep_rt, ns, {"metadata": {"name": sname, "namespace": ns, "labels": labels}, "subsets": body_subsets}, opts)
        elif (current.get("subsets") or []) != body_subsets or meta(current).get("labels") != labels:
            body = copy.deepcopy(current)
            body["subsets"] = body_subsets
            body["metadata"]["labels"] = labels
            api.update(ep_rt, ns, sname, body, opts, old=current)
        return None


class DisruptionBudgets(Controller):
    name = "disruption-controller"
    watches = (PDBS, PODS)

    def keys_for(self, ev: Event) -> Iterable[Hashable]:
        ns = namespace(ev.obj)
        if ev.storage == PDBS:
            if ev.type != "DELETED":
                yield (ns, name(ev.obj))
            return
        for pdb in self.api.store.list(PDBS, ns):
            yield (ns, name(pdb))

    def initial_keys(self) -> Iterable[Hashable]:
        return [(namespace(p), name(p)) for p in self.api.store.list(PDBS)]

    def reconcile(self, key) -> float | None:
        ns, pname = key
        api = self.api
        pdb = api.store.get(PDBS, ns, pname)
        if pdb is None:
            return None
        spec = pdb.get("spec") or {}
        sel = from_label_selector_object(spec.get("selector"))
        pods = [] if not sel else [p for p in api.store.list(PODS, ns) if pod_active(p) and labels_match(sel, meta(p).get("labels"))]
        old = pdb.get("status") or {}
        now = timeutil.now()
        names = {name(p) for p in pods}
        disrupted = {k: v for k, v in (old.get("disruptedPods") or {}).items()
                     if k in names and (timeutil.parse(v) or now) > now - timedelta(minutes=2)}
        expected = len(pods)
        healthy = sum(1 for p in pods if pod_ready(p) and name(p) not in disrupted)
        if "minAvailable" in spec:
            desired = resolve_int_or_percent(spec["minAvailable"], expected, True)
        elif "maxUnavailable" in spec:
            desired = max(0, expected - resolve_int_or_percent(spec["maxUnavailable"], expected, True))
        else:
            desired = expected
        allowed = max(0, healthy - desired)
        status = {
            "observedGeneration": meta(pdb).get("generation", 1),
            "disruptionsAllowed": allowed,
            "currentHealthy": healthy,
            "desiredHealthy": desired,
            "expectedPods": expected,
            "conditions": set_condition(old.get("conditions"), {
                "type": "DisruptionAllowed",
                "status": "True" if allowed > 0 else "False",
                "reason": "SufficientPods" if allowed > 0 else "InsufficientPods",
                "message": "",
                "observedGeneration": meta(pdb).get("generation", 1),
                "lastTransitionTime": timeutil.rfc3339(now),
            }),
        }
        if disrupted:
            status["disruptedPods"] = disrupted
        try:
            api.write_status(api.resource("policy", "v1", "poddisruptionbudgets"), pdb, status, self.name)
        except APIError as e:
            if e.code != 404:
                raise
        return 120.0 if disrupted else None


RESOURCEQUOTAS = ("", "resourcequotas")


class ResourceQuotas(Controller):
    """The resource quota controller: each quota's status.hard and status.used
    (what the namespace's objects are charged, ``quota.usage``)."""

    name = "resourcequota-controller"
    watches = (ANY,)
    #: Written all the time and counted by no quota here.
    _UNCOUNTED = {("", "events"), ("events.k8s.io", "events"), ("coordination.k8s.io", "leases")}

    def keys_for(self, ev: Event) -> Iterable[Hashable]:
        ns = namespace(ev.obj)
        if ns and ev.storage not in self._UNCOUNTED and self.api.store.list(RESOURCEQUOTAS, ns):
            yield ns

    def initial_keys(self) -> Iterable[Hashable]:
        return {namespace(q) for q in self.api.store.list(RESOURCEQUOTAS)}

    def reconcile(self, key) -> float | None:
        quotas = self.api.store.list(RESOURCEQUOTAS, key)
        if not quotas:
            return None
        store = self.api.store
        objects = [(s, o) for s in store.storages() if s not in self._UNCOUNTED
                   for o in store.list(s, key) if namespace(o) == key]
        rt = self.api.resource("", "v1", "resourcequotas")
        for q in quotas:
            hard = dict((q.get("spec") or {}).get("hard") or {})
            self.api.write_status(rt, q, {"hard": hard, "used": usage(objects, hard)}, self.name)
        return None
