"""A SlurmCluster's status from what was observed. Pure: the time is an input.

Conditions: one per component (ControllerReady, WorkersReady, LoginReady,
RestApiReady, AccountingReady), StorageReady (the claims the pods mount,
:mod:`.claims`) and Ready, which holds when every one of them is ready, the
config is applied and the last round had no problems; a claim that is not
bound comes first in Ready, with its provisioner's words. The phase summarises:
Pending (no controller yet), Provisioning (never ready yet), Ready, Degraded
(was ready, is not), Deleting, Failed (the spec is invalid).

The Events a status change makes: a new phase (:func:`phase_event`), a
Slurm node failing a health check (:func:`unhealthy_events`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from slurmk8s.api.cluster import SlurmCluster
from slurmk8s.api.status import Condition, ConditionStatus, NodeCounts, Phase, SlurmClusterStatus
from slurmk8s.events import Event
from slurmk8s.render import names
from slurmk8s.slurm.model import Node, unhealthy

from .claims import CONDITION as STORAGE_CONDITION
from .directory import CONDITION as DIRECTORY_CONDITION
from .directory import condition as directory_condition
from .upgrade import running_release

__all__ = ["COMPONENTS", "compute", "invalid", "node_counts", "image_pull_failures", "short_of_pods",
           "refused_pods", "ready_message", "phase_event", "unhealthy_events"]

COMPONENTS = ("ControllerReady", "WorkersReady", "LoginReady", "RestApiReady", "AccountingReady")

_Cond = tuple[ConditionStatus, str, str]  # status, reason, message


def _workloads(observed: Sequence[Mapping]) -> dict[tuple[str, str], Mapping]:
    return {(o["kind"], o["metadata"]["name"]): o for o in observed
            if o.get("kind") in ("StatefulSet", "Deployment")}


def _count(obj: Mapping, field: str) -> int:
    return int((obj.get("status") or {}).get(field) or 0)


def _controller(c: SlurmCluster, w: Mapping, agent_ok: bool) -> _Cond:
    sts = w.get(("StatefulSet", names.controller(c)))
    if sts is None:
        return "False", "NotCreated", "the slurmctld StatefulSet does not exist yet"
    if _count(sts, "readyReplicas") < 1:
        return "False", "NotReady", f"pod {names.controller_pod(c)} (slurmctld and its agent) is not ready"
    if not agent_ok:
        return ("False", "AgentUnreachable",
                f"the Slurm agent in {names.controller_pod(c)} does not answer the operator")
    return "True", "Running", "slurmctld and its agent are ready"


def _workers(c: SlurmCluster, w: Mapping, nodes: Sequence[Node] | None) -> _Cond:
    if not c.spec.node_sets:
        return "True", "NoNodeSets", "the spec has no node sets"
    problems, notes = [], []
    registered = {n.name for n in nodes if n.responding} if nodes is not None else set()
    for ns in c.spec.node_sets:
        name = names.nodeset(c, ns.name)
        sts = w.get(("StatefulSet", name))
        if sts is None:
            problems.append(f"node set {ns.name}: StatefulSet {name} does not exist yet")
            continue
        ready = _count(sts, "readyReplicas")
        if ready < ns.replicas:
            problems.append(f"node set {ns.name}: {ready}/{ns.replicas} pods ready")
        current = int((sts.get("spec") or {}).get("replicas") or 0)
        if current > ns.replicas:
            notes.append(f"node set {ns.name}: scaling in from {current} to {ns.replicas}")
        if nodes is not None:
            joined = sum(1 for o in range(ns.replicas) if f"{name}-{o}" in registered)
            if joined < ns.replicas:
                problems.append(f"node set {ns.name}: {joined}/{ns.replicas} Slurm nodes registered and responding")
    if problems:
        return "False", "NodesNotReady", "; ".join(problems)
    if nodes is None:
        return "Unknown", "SlurmUnknown", "pods are ready; the Slurm node states are unknown (the agent did not answer)"
    total = sum(ns.replicas for ns in c.spec.node_sets)
    return "True", "Running", "; ".join([f"{total} Slurm nodes registered", *notes])


def _deployment(w: Mapping, name: str, replicas: int, what: str) -> _Cond:
    if replicas == 0:
        return "True", "NoReplicas", f"{what}: replicas is 0"
    dep = w.get(("Deployment", name))
    if dep is None:
        return "False", "NotCreated", f"Deployment {name} does not exist yet"
    available = _count(dep, "availableReplicas")
    if available < replicas:
        return "False", "NotReady", f"{what}: {available}/{replicas} pods available"
    return "True", "Running", f"{what}: {available} pods available"


#: Waiting reasons of a container whose image the kubelet could not get.
PULL_FAILURES = ("ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName")


def image_pull_failures(pods: Sequence[Mapping]) -> list[str]:
    """Which image each of the cluster's pods cannot get, with the kubelet's words (the
    registry's answer): what a site whose registry, pull secret or push is wrong must read."""
    out = []
    for p in sorted(pods, key=lambda p: p["metadata"]["name"]):
        for cs in (p.get("status") or {}).get("containerStatuses") or []:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in PULL_FAILURES:
                spec: dict = next((c for c in (p.get("spec") or {}).get("containers") or []
                             if c.get("name") == cs.get("name")), {})
                out.append(f"pod {p['metadata']['name']} cannot pull image {spec.get('image') or cs.get('image')} "
                           f"({waiting['reason']}): {(waiting.get('message') or '')[:512]}")
    return out


def short_of_pods(observed: Sequence[Mapping], pods: Sequence[Mapping]) -> list[tuple[str, str]]:
    """The cluster's StatefulSets and Deployments that have fewer pods than
    their replicas, as (the kind of object their controller reports on, its
    name or, for a Deployment's ReplicaSets, their name prefix)."""
    owners = [r for p in pods for r in (p.get("metadata") or {}).get("ownerReferences") or []]
    out = []
    for w in sorted(observed, key=lambda o: (o["kind"], o["metadata"]["name"])):
        name = w["metadata"]["name"]
        if w["kind"] == "StatefulSet":
            have = sum(1 for r in owners if r.get("kind") == "StatefulSet" and r.get("name") == name)
            reporter = ("StatefulSet", name)
        elif w["kind"] == "Deployment":
            have = sum(1 for r in owners if r.get("kind") == "ReplicaSet" and r.get("name", "").startswith(f"{name}-"))
            reporter = ("ReplicaSet", f"{name}-")
        else:
            continue
        if have < int((w.get("spec") or {}).get("replicas", 1)):
            out.append(reporter)
    return out


def refused_pods(short: Sequence[tuple[str, str]], events: Sequence[Mapping]) -> list[str]:
    """Why each workload ``short`` of pods (:func:`short_of_pods`) cannot
    create them: the latest FailedCreate Event its controller recorded, in the
    API's words (a namespace's Pod Security level, its quota, a LimitRange)."""
    out = []
    for kind, name in short:
        mine = [e for e in events if e.get("reason") == "FailedCreate"
                and (e.get("involvedObject") or {}).get("kind") == kind
                and ((obj := (e.get("involvedObject") or {}).get("name") or "") == name
                     or (name.endswith("-") and obj.startswith(name)))]
        if mine:
            latest = max(mine, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
            what = f"{kind} {name}" if not name.endswith("-") else f"Deployment {name[:-1]}"
            out.append(f"{what} cannot create its pods: {(latest.get('message') or '')[:1024]}")
    return out


def node_counts(nodes: Sequence[Node]) -> NodeCounts:
    counts = {k: 0 for k in ("idle", "mixed", "allocated", "drain", "down", "other")}
    for n in nodes:
        counts[n.bucket] += 1
    return NodeCounts(total=len(nodes), **counts)


def _merge(previous: Sequence[Condition], new: Mapping[str, _Cond], generation: int | None,
           now: str) -> list[Condition]:
    before = {c.type: c for c in previous}
    out = []
    for type_, (status, reason, message) in new.items():
        old = before.get(type_)
        since = old.last_transition_time if old is not None and old.status == status else now
        out.append(Condition(type=type_, status=status, reason=reason, message=message[:32768],
                             last_transition_time=since, observed_generation=generation))
    return out


def compute(
    cluster: SlurmCluster,
    previous: SlurmClusterStatus | None,
    *,
    observed: Sequence[Mapping],
    nodes: Sequence[Node] | None,
    applied_hash: str | None,
    rendered_hash: str,
    problems: Sequence[str] = (),
    waiting: Sequence[str] = (),
    now: str,
    deleting: bool = False,
    problem_reason: str = "ReconcileFailed",
    accounting: _Cond | None = None,
    pods: Sequence[Mapping] = (),
    refused: Sequence[str] = (),
    directory: _Cond | None = None,
    storage: _Cond | None = None,
) -> SlurmClusterStatus:
    """The status after a round.

    ``observed``: the cluster's objects (workload statuses are read from
    them); ``nodes``: the agent's node list, None when it did not answer;
    ``applied_hash``: the config last reconfigured; ``problems``: what failed
    this round (shown in Ready, with ``problem_reason``); ``waiting``: what
    waits (shown in Ready); ``accounting``: AccountingReady
    (``operator.accounting.condition``), unknown when not given; ``pods``: the
    cluster's pods, whose image pull failures Ready names first
    (reason ``ImagePullFailed``); ``refused``: why workloads cannot create
    their pods (:func:`refused_pods`), named before those (reason
    ``PodsRefused``); ``directory``: DirectoryReady (``operator.directory.condition``)
    with spec.identity.ldap, apart from Ready: the cluster runs while the site's
    directory is away; ``storage``: StorageReady (``operator.claims.condition``),
    first of the parts Ready waits for (none when not given).
    """
    c = cluster
    w = _workloads(observed)
    components: dict[str, _Cond] = {
        **({STORAGE_CONDITION: storage} if storage is not None else {}),
        "ControllerReady": _controller(c, w, nodes is not None),
        "WorkersReady": _workers(c, w, nodes),
        "LoginReady": _deployment(w, names.login(c), c.spec.login.replicas, "login"),
        "RestApiReady": (_deployment(w, names.restapi(c), c.spec.rest_api.replicas, "slurmrestd")
                         if c.spec.rest_api.enabled else ("True", "Disabled", "spec.restApi.enabled is false")),
        "AccountingReady": accounting or (
            ("False", "Unknown", "not checked this round") if c.spec.accounting.enabled
            else ("True", "Disabled", "spec.accounting.enabled is false")),
    }
    not_ready = [f"{t}: {m}" for t, (s, _, m) in components.items() if s != "True"]
    pulls = image_pull_failures(pods)
    if deleting:
        ready: _Cond = ("False", "Deleting", "the cluster is being deleted: nodes drained, objects removed")
    elif problems:
        ready = ("False", problem_reason, "; ".join(problems))
    elif refused:
        ready = ("False", "PodsRefused", "; ".join([*refused, *pulls, *not_ready]))
    elif pulls:
        ready = ("False", "ImagePullFailed", "; ".join([*pulls, *not_ready]))
    elif not_ready:
        first = next(t for t, (s, _, _) in components.items() if s != "True")
        ready = ("False", first.replace("Ready", "NotReady"), "; ".join(not_ready))
    elif applied_hash != rendered_hash:
        ready = ("False", "ConfigPending", "; ".join(waiting) or "the new Slurm config is not applied yet")
    else:
        ready = ("True", "Ready", "; ".join(["every component is ready", *waiting]))
    prev_conditions = previous.conditions if previous else []
    extra = {DIRECTORY_CONDITION: directory or directory_condition(None)} if c.spec.identity.ldap is not None else {}
    conditions = _merge(prev_conditions, {"Ready": ready, **components, **extra}, c.metadata.generation, now)
    previous_phase = previous.phase if previous else "Pending"
    phase: Phase
    if deleting:
        phase = "Deleting"
    elif ready[0] == "True":
        phase = "Ready"
    elif previous_phase in ("Ready", "Degraded"):
        phase = "Degraded"
    elif ("StatefulSet", names.controller(c)) not in w:
        phase = "Pending"
    else:
        phase = "Provisioning"
    counts = node_counts(nodes) if nodes is not None else (previous.node_counts if previous else NodeCounts())
    return SlurmClusterStatus(
        phase=phase, conditions=conditions, observed_generation=c.metadata.generation,
        node_counts=counts, config_hash=applied_hash,
        slurm_version=running_release(c, observed) or (previous.slurm_version if previous else None),
        # A round computes its status only once every ConfigMap and Secret the spec names passed
        # slurmk8s.api.secrets' rule: the site checks' ConfigMap among them.
        site_checks=c.spec.health_check.site_checks if c.spec.health_check.enabled else None,
    )


def invalid(previous: SlurmClusterStatus | None, message: str, generation: int | None,
            now: str, reason: str = "InvalidSpec") -> SlurmClusterStatus:
    """The status of a cluster whose spec was refused (``reason``): Failed, nothing changed."""
    prev_conditions = previous.conditions if previous else []
    ready: dict[str, _Cond] = {"Ready": ("False", reason, message)}
    kept = [c for c in prev_conditions if c.type != "Ready"]
    return SlurmClusterStatus(
        phase="Failed",
        conditions=_merge(prev_conditions, ready, generation, now) + kept,
        observed_generation=generation,
        node_counts=previous.node_counts if previous else NodeCounts(),
        config_hash=previous.config_hash if previous else None,
        slurm_version=previous.slurm_version if previous else None,
    )


def ready_message(st: SlurmClusterStatus | None) -> str:
    """What the Ready condition of ``st`` says; "" without one."""
    return next((c.message for c in st.conditions if c.type == "Ready"), "") if st is not None else ""


def phase_event(previous: SlurmClusterStatus | None, after: SlurmClusterStatus) -> Event | None:
    """The Event of a new phase, with the Ready condition's message; None when the phase stays."""
    if previous is not None and previous.phase == after.phase:
        return None
    kind = "Normal" if after.phase in ("Ready", "Provisioning", "Pending") else "Warning"
    return Event(kind, after.phase, ready_message(after))


def unhealthy_events(nodes: Sequence[Node]) -> list[Event]:
    """A Warning per Slurm node and failed health check, named by both: announced
    once while Kubernetes keeps the Event."""
    return [Event("Warning", "NodeUnhealthy",
                  f"Slurm node {node} failed its {check} health check: drained until it passes again",
                  kind="SlurmNode", name=f"{node}.{check}")
            for node, check in sorted(unhealthy(nodes).items())]
