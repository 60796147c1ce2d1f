"""The scheduler and the NoExecute taint manager.

Pure part: :func:`filter_node` says why a pod does not fit a node (the reasons
Kubernetes' filter plugins give, in their order: NodeUnschedulable,
TaintToleration, NodeAffinity, NodeResourcesFit; then PodTopologySpread's
``DoNotSchedule`` constraints, :func:`spread`) and :func:`schedule` picks a
node (``ScheduleAnyway`` spreading first, then the least allocated) or
writes the "0/3 nodes are available: ..." message. A pod's claims
come first (the VolumeBinding plugin, ``storage.pod_claims``): a missing or
unbound ``Immediate`` claim makes it unschedulable, and claims that wait for
their first consumer are given the node picked for it before it is bound.
The controllers bind pods, set ``PodScheduled``, record ``Scheduled``/``FailedScheduling`` events,
and delete pods from nodes with NoExecute taints they do not tolerate.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping
from decimal import Decimal

from .. import quantity, storage, timeutil
from ..api import DeleteOptions, Options
from ..errors import APIError
from ..selectors import from_label_selector_object, labels_match
from ..store import Event, meta
from .base import Controller
from .events import Recorder
from .util import NODES, PODS, PVCS, deleting, name, namespace, pod_terminal, set_condition

Resources = dict[str, Decimal]
SCHEDULER_NAME = "default-scheduler"


# --- pure -------------------------------------------------------------------------


def _q(value) -> Decimal:
    try:
        return quantity.parse(value)
    except ValueError:
        return Decimal(0)


def pod_requests(pod: Mapping) -> Resources:
    """Effective requests: the containers' sum, or the largest init container's if larger, plus overhead."""
    spec = pod.get("spec") or {}
    total: Resources = {}
    for c in spec.get("containers") or []:
        for r, v in ((c.get("resources") or {}).get("requests") or {}).items():
            total[r] = total.get(r, Decimal(0)) + _q(v)
    for c in spec.get("initContainers") or []:
        for r, v in ((c.get("resources") or {}).get("requests") or {}).items():
            total[r] = max(total.get(r, Decimal(0)), _q(v))
    for r, v in (spec.get("overhead") or {}).items():
        total[r] = total.get(r, Decimal(0)) + _q(v)
    return total


def tolerates(toleration: Mapping, taint: Mapping) -> bool:
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    op = toleration.get("operator") or "Equal"
    if key and key != taint.get("key"):
        return False
    if op == "Exists":
        return True
    if not key:  # an empty key needs operator Exists
        return False
    return (toleration.get("value") or "") == (taint.get("value") or "")


def untolerated_taint(taints: Iterable[Mapping], tolerations: Iterable[Mapping], effects=("NoSchedule", "NoExecute")) -> Mapping | None:
    tols = list(tolerations or [])
    for t in taints or []:
        if t.get("effect") not in effects:
            continue
        if not any(tolerates(tol, t) for tol in tols):
            return t
    return None


def _expr_ok(expr: Mapping, value: str | None) -> bool:
    op, values = expr.get("operator"), [str(v) for v in expr.get("values") or []]
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and values:
        try:
            a, b = int(value), int(values[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False


def _term_ok(term: Mapping, node: Mapping) -> bool:
    labels = meta(node).get("labels") or {}
    exprs = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not exprs and not fields:
        return False  # an empty term matches nothing
    return all(_expr_ok(e, labels.get(e.get("key"))) for e in exprs) and all(
        _expr_ok(f, name(node) if f.get("key") == "metadata.name" else None) for f in fields
    )


def affinity_ok(pod: Mapping, node: Mapping) -> bool:
    spec = pod.get("spec") or {}
    labels = meta(node).get("labels") or {}
    for k, v in (spec.get("nodeSelector") or {}).items():
        if labels.get(k) != v:
            return False
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms")
    if terms is not None:
        return any(_term_ok(t, node) for t in terms)
    return True


def allocatable(node: Mapping) -> Resources:
    st = node.get("status") or {}
    src = st.get("allocatable") or st.get("capacity") or {}
    return {k: _q(v) for k, v in src.items()}


def filter_node(pod: Mapping, node: Mapping, used: Resources, used_pods: int) -> list[str]:
    """Why ``pod`` cannot go to ``node`` ([] when it can)."""
    spec = pod.get("spec") or {}
    tols = spec.get("tolerations") or []
    nspec = node.get("spec") or {}
    if nspec.get("unschedulable") and not any(
        tolerates(t, {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}) for t in tols
    ):
        return ["node(s) were unschedulable"]
    taint = untolerated_taint(nspec.get("taints") or [], tols)
    if taint is not None:
        return [f"node(s) had untolerated taint {{{taint.get('key', '')}: {taint.get('value', '')}}}"]
    if not affinity_ok(pod, node):
        return ["node(s) didn't match Pod's node affinity/selector"]
    alloc = allocatable(node)
    reasons = []
    if used_pods + 1 > alloc.get("pods", Decimal(0)):
        reasons.append("Too many pods")
    for r, want in sorted(pod_requests(pod).items()):
        if want <= 0:
            continue
        if used.get(r, Decimal(0)) + want > alloc.get(r, Decimal(0)):
            reasons.append(f"Insufficient {r}")
    return reasons


def usage(pods: Iterable[Mapping]) -> dict[str, tuple[Resources, int]]:
    """What bound, non-terminated pods request, per node."""
    out: dict[str, tuple[Resources, int]] = {}
    for p in pods:
        node = (p.get("spec") or {}).get("nodeName")
        if not node or pod_terminal(p):
            continue
        res, count = out.get(node, ({}, 0))
        res = dict(res)
        for r, v in pod_requests(p).items():
            res[r] = res.get(r, Decimal(0)) + v
        out[node] = (res, count + 1)
    return out


def _score(pod: Mapping, node: Mapping, used: Resources) -> Decimal:
    """LeastAllocated over cpu and memory: the share left free after placing the pod."""
    alloc, req = allocatable(node), pod_requests(pod)
    score = Decimal(0)
    for r in ("cpu", "memory"):
        cap = alloc.get(r, Decimal(0))
        if cap > 0:
            score += (cap - used.get(r, Decimal(0)) - req.get(r, Decimal(0))) / cap
    return score


def spread(pod: Mapping, nodes: list[Mapping], candidates: list[Mapping],
           pods: Iterable[Mapping]) -> tuple[dict[str, str], dict[str, int]]:
    """PodTopologySpread over ``candidates`` (the nodes that pass the other
    filters), with domains counted over all ``nodes``: (node -> why a ``DoNotSchedule`` constraint refuses it, node -> how far a
    ``ScheduleAnyway`` constraint's skew would grow there). Domains are the
    values of ``topologyKey`` among the nodes that match the pod's node
    affinity; a constraint counts the bound, running pods of the pod's
    namespace that its ``labelSelector`` matches."""
    refused: dict[str, str] = {}
    penalty: dict[str, int] = {}
    constraints = (pod.get("spec") or {}).get("topologySpreadConstraints") or []
    if not constraints:
        return refused, penalty
    by_name = {name(n): n for n in nodes}
    mine = [p for p in pods if namespace(p) == namespace(pod) and (p.get("spec") or {}).get("nodeName")
            and not pod_terminal(p) and not deleting(p)]  # type: ignore[arg-type]
    for c in constraints:
        key, skew = c.get("topologyKey") or "", int(c.get("maxSkew") or 1)
        sel = from_label_selector_object(c.get("labelSelector"))
        domains: Counter[str] = Counter()
        for n in nodes:
            value = (meta(n).get("labels") or {}).get(key)
            if value is not None and affinity_ok(pod, n):
                domains[value] += 0
        for p in mine:
            node = by_name.get(p["spec"]["nodeName"])
            value = (meta(node).get("labels") or {}).get(key) if node else None
            if value in domains and sel is not None and labels_match(sel, meta(p).get("labels")):
                domains[value] += 1
        low = min(domains.values(), default=0)
        for n in candidates:
            value = (meta(n).get("labels") or {}).get(key)
            over = (domains.get(value, 0) + 1 - low) if value is not None else 0
            if c.get("whenUnsatisfiable", "DoNotSchedule") == "DoNotSchedule":
                if value is None:
                    refused.setdefault(name(n), "node(s) didn't match pod topology spread constraints (missing required label)")
                elif over > skew:
                    refused.setdefault(name(n), "node(s) didn't match pod topology spread constraints")
            else:
                penalty[name(n)] = penalty.get(name(n), 0) + over
    return refused, penalty


def schedule(pod: Mapping, nodes: list[Mapping], use: Mapping[str, tuple[Resources, int]],
             pods: Iterable[Mapping] = ()) -> tuple[str | None, str]:
    """(node name, "") or (None, the FailedScheduling message)."""
    if not nodes:
        return None, "no nodes available to schedule pods"
    feasible = []
    counts: Counter[str] = Counter()
    for node in nodes:
        used, n = use.get(name(node), ({}, 0))
        reasons = filter_node(pod, node, used, n)
        if reasons:
            counts.update(reasons)
        else:
            feasible.append(node)
    refused, penalty = spread(pod, nodes, feasible, pods)
    counts.update(refused.values())
    feasible = [nd for nd in feasible if name(nd) not in refused]
    if feasible:
        best = max(feasible, key=lambda nd: (-penalty.get(name(nd), 0), _score(pod, nd, use.get(name(nd), ({}, 0))[0]),
                                             [-ord(c) for c in name(nd)]))
        return name(best), ""
    parts = sorted(f"{c} {r}" for r, c in counts.items())
    return None, f"0/{len(nodes)} nodes are available: {', '.join(parts)}."


def pending(pod: Mapping) -> bool:
    spec = pod.get("spec") or {}
    return (
        not spec.get("nodeName")
        and not deleting(pod)  # type: ignore[arg-type]
        and not pod_terminal(pod)  # type: ignore[arg-type]
        and (spec.get("schedulerName") or SCHEDULER_NAME) == SCHEDULER_NAME
        and not spec.get("schedulingGates")
    )


# --- controllers ------------------------------------------------------------------


class Scheduler(Controller):
    name = SCHEDULER_NAME
    #: Claims and StorageClasses too: a pod waits for its claims (VolumeBinding, ``storage.pod_claims``).
    watches = (PODS, NODES, PVCS, storage.STORAGECLASSES)

    def __init__(self, api) -> None:
        super().__init__(api)
        self.recorder = Recorder(api, SCHEDULER_NAME)

    def keys_for(self, ev: Event) -> Iterable[Hashable]:
        if ev.storage in (NODES, PVCS, storage.STORAGECLASSES):
            yield "all"
            return
        if ev.type == "DELETED":
            yield "all"
        elif pending(ev.obj):
            yield "all"
        elif ev.old is not None and (pod_terminal(ev.obj) and not pod_terminal(ev.old)):
            yield "all"

    def initial_keys(self) -> Iterable[Hashable]:
        return ["all"]

    def reconcile(self, key) -> float | None:
        api = self.api
        pod_rt = api.resource("", "v1", "pods")
        nodes = api.store.list(NODES)
        pods = api.store.list(PODS)
        use = usage(pods)
        queue = sorted((p for p in pods if pending(p)),
                       key=lambda p: (-int((p.get("spec") or {}).get("priority") or 0), meta(p).get("creationTimestamp", ""), namespace(p), name(p)))
        bound = [p for p in pods if (p.get("spec") or {}).get("nodeName")]
        classes = {name(sc): sc for sc in api.store.list(storage.STORAGECLASSES)}
        for pod in queue:
            ns, pname = namespace(pod), name(pod)
            claims = storage.pod_claims(pod, {name(c): c for c in api.store.list(PVCS, ns)}, classes)
            if claims.waiting:
                continue  # its claims are being provisioned for the node picked for it: bound once they are
            if claims.unschedulable:
                node_name, message = None, f"0/{len(nodes)} nodes are available: {claims.unschedulable}."
            else:
                node_name, message = schedule(pod, nodes, use, bound)
            if node_name and claims.select:
                self._select(ns, claims.select, node_name)
                continue
            if node_name:
                api.bind(ns, pname, {"target": {"kind": "Node", "name": node_name}})
                res, n = use.get(node_name, ({}, 0))
                res = dict(res)
                for r, v in pod_requests(pod).items():
                    res[r] = res.get(r, Decimal(0)) + v
                use[node_name] = (res, n + 1)
                placed = api.raw(pod_rt, ns, pname)
                bound.append(placed or {**pod, "spec": {**(pod.get("spec") or {}), "nodeName": node_name}})
                self.recorder.event(placed or pod, "Normal", "Scheduled", f"Successfully assigned {ns}/{pname} to {node_name}")
                continue
            status = copy.deepcopy(pod.get("status") or {})
            old = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), None)
            if old is not None and old.get("status") == "False" and old.get("message") == message:
                continue
            status["conditions"] = set_condition(status.get("conditions"), {
                "type": "PodScheduled", "status": "False", "lastProbeTime": None,
                "lastTransitionTime": timeutil.rfc3339(), "reason": "Unschedulable", "message": message,
            })
            api.write_status(pod_rt, pod, status, SCHEDULER_NAME)
            self.recorder.event(pod, "Warning", "FailedScheduling", message)
        return None

    def _select(self, ns: str, claims: Iterable[str], node_name: str) -> None:
        """Give the node picked for a pod to its claims that wait for their first
        consumer; the pod is bound once the provisioner has bound them."""
        rt = self.api.resource("", "v1", "persistentvolumeclaims")
        for cname in claims:
            claim = self.api.store.get(PVCS, ns, cname)
            if claim is None or (meta(claim).get("annotations") or {}).get(storage.SELECTED_NODE):
                continue
            body = copy.deepcopy(claim)
            body["metadata"]["annotations"] = {**(body["metadata"].get("annotations") or {}), storage.SELECTED_NODE: node_name}
            self.api.update(rt, ns, cname, body, Options(field_manager=SCHEDULER_NAME), old=claim)


class TaintEviction(Controller):
    """Deletes pods from nodes with NoExecute taints they do not tolerate
    (after ``tolerationSeconds`` when they tolerate it for a while)."""

    name = "taint-eviction-controller"
    watches = (NODES, PODS)

    def __init__(self, api) -> None:
        super().__init__(api)
        self.recorder = Recorder(api, self.name)

    def keys_for(self, ev: Event) -> Iterable[Hashable]:
        if ev.storage == NODES:
            if ev.type != "DELETED":
                yield name(ev.obj)
            return
        node = (ev.obj.get("spec") or {}).get("nodeName")
        old_node = ((ev.old or {}).get("spec") or {}).get("nodeName")
        if node and node != old_node and ev.type != "DELETED":
            yield node

    def initial_keys(self) -> Iterable[Hashable]:
        return [name(n) for n in self.api.store.list(NODES)]

    def reconcile(self, node_name: str) -> float | None:
        api = self.api
        node = api.store.get(NODES, "", node_name)
        if node is None:
            return None
        taints = [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("effect") == "NoExecute"]
        if not taints:
            return None
        now = timeutil.now()
        added = [timeutil.parse(t.get("timeAdded") or "") or now for t in taints]
        since = min(added)
        wake: float | None = None
        pod_rt = api.resource("", "v1", "pods")
        for pod in api.store.list(PODS):
            spec = pod.get("spec") or {}
            if spec.get("nodeName") != node_name or deleting(pod) or pod_terminal(pod):
                continue
            tols = spec.get("tolerations") or []
            if untolerated_taint(taints, tols, ("NoExecute",)) is None:
                seconds = [int(tol["tolerationSeconds"]) for t in taints for tol in tols
                           if tolerates(tol, t) and tol.get("tolerationSeconds") is not None]
                if not seconds:
                    continue
                left = (since - now).total_seconds() + max(0, min(seconds))
                if left > 0:
                    wake = left if wake is None else min(wake, left)
                    continue
            self.recorder.event(pod, "Normal", "TaintManagerEviction", f"Marking for deletion Pod {namespace(pod)}/{name(pod)}")
            try:
                api.delete(pod_rt, namespace(pod), name(pod), DeleteOptions(propagation="Background"))
            except APIError as e:
                if e.code != 404:
                    raise
        return wake
