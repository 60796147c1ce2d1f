"""One round of the operator for one SlurmCluster: observe, decide, act.

This is the shell around the pure decisions (:mod:`.plan`, :mod:`.workers`,
:mod:`.reconfigure`, :mod:`.status`): it reads the cluster's objects through
:class:`~.kube.Kube` and Slurm through the cluster's agent
(:class:`~slurmk8s.slurm.SlurmControl`), calls the decisions, and carries out
what they return, in this order:

1. Slurm actions (drain, signal, requeue, undrain) and the pod annotations
   that remember them. If one fails, the round goes on with every node set
   held at its current size, and nothing is deleted.
2. The plan: create, then update (StatefulSets with the replicas the
   scale-in allows).
3. Busy labels on worker pods; pods to restart (rolling update), Slurm
   records of gone pods.
4. Deletes, only in a round where everything before succeeded.
5. ``scontrol reconfigure`` once the agent sees the rendered config.
6. Associations and QOS, through the agent.
7. The site directory's health (DirectoryReady), as the agent reads it.
8. Status.

A step that raises ends the round as :class:`RoundFailed`, which names the
step and carries what the round had found so far (its Events are still
posted: :mod:`.handlers`). The failures of a write or a Slurm step the
round expects (:data:`FAILURES`: the API server's, and every
:class:`~slurmk8s.slurm.AgentError` of the agent's client) are the round's
problems instead, and it goes on as each step says.

Nothing is remembered between rounds in memory: a round starts from what
the API server and Slurm say. What it reads becomes the decisions' input in
:mod:`.observe`; the finalizer's teardown is :mod:`.teardown`.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from slurmk8s import log
from slurmk8s.api import InvalidSpec, load_cluster
from slurmk8s.api.secrets import secret_problem, secret_refs
from slurmk8s.api.cluster import PROJECT_REPOSITORY, SlurmCluster, SlurmClusterStatus
from slurmk8s.render import ClusterKeys, TopologyNode, names, render
from slurmk8s.render.keys import BadKeySecret, ForeignKeySecret, key_secret_names, keys_from_secrets
from slurmk8s.render.manifests import AgentClients
from slurmk8s.events import Event
from slurmk8s.slurm import AgentError, NotOurDrain, SlurmControl, SlurmError, steps
from slurmk8s.slurm.model import Job, Node, SlurmState, unhealthy
from slurmk8s.slurm.remote import agent_url as remote_agent_url, cluster_agent
from slurmk8s.times import format_time

from . import accounting, directory, plan, status, teardown, upgrade, workers
from .observe import observe_nodesets, previous_status
from .reconfigure import decide_reconfigure
from slurmk8s.kube import ApiError, Kube

__all__ = ["Operator", "Outcome", "RoundFailed", "FAILURES", "agent_url"]

_log = log.get("slurmk8s.operator")


@dataclass
class Outcome:
    """What a round did, for the handlers (Events, metrics) and tests."""

    status: SlurmClusterStatus | None = None
    events: list[Event] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)
    applied: list[str] = field(default_factory=list)  # "create ConfigMap/x", "update ...", ...
    nodes: list[Node] | None = None
    #: Run the next round soon (workers.Decision.hurry): signalled jobs may requeue themselves.
    hurry: bool = False
    #: The step the round is at (the last one it reached, in a round that failed).
    step: str = "start"


class RoundFailed(Exception):
    """A round stopped at ``step`` (its cause is ``__cause__``); ``outcome``:
    what it had found and done until then, its Events included."""

    def __init__(self, step: str, outcome: Outcome):
        self.step, self.outcome = step, outcome
        super().__init__(f"the round failed at {step}")


#: What a write or a Slurm step may raise that the round reports as its
#: problem and goes on: the API server's refusal or silence, and every
#: failure of the agent's client (a 400, a refused drain, Slurm's error,
#: no answer).
FAILURES: tuple[type[BaseException], ...] = (ApiError, AgentError, SlurmError, NotOurDrain, OSError)


def agent_url(cluster: SlurmCluster, controller_pod: Mapping | None) -> str | None:
    """The agent's address: the controller pod's IP; None while it has none
    (never a DNS name: the bearer token goes to the pod and nowhere else)."""
    return remote_agent_url(controller_pod, names.AGENT_PORT)


_default_agent = functools.partial(cluster_agent, port=names.AGENT_PORT)


class Operator:
    """Runs rounds for SlurmClusters against one API server.

    ``agent``: makes the Slurm client of a cluster from (cluster, agent
    token, controller pod) — by default :func:`~slurmk8s.slurm.remote.cluster_agent` at
    :func:`agent_url`. ``clock`` and ``fresh_keys`` (the key set that
    missing Secrets take their keys from; by default each missing key is
    generated alone) are injectable for tests.
    ``agent_clients``: the pods a NetworkPolicy admits to each agent;
    ``trusted_repositories``: where a privileged slurmd's image may come from.
    """

    def __init__(self, kube: Kube, *,
                 agent: Callable[[SlurmCluster, bytes, Mapping | None], SlurmControl] = _default_agent,
                 clock: Callable[[], float] = time.time,
                 fresh_keys: Callable[[], ClusterKeys] | None = None,
                 agent_clients: AgentClients | None = None,
                 trusted_repositories: Sequence[str] = (PROJECT_REPOSITORY,),
                 identity: str | None = None):
        self.kube = kube
        #: This replica's name in the Lease, written into status.leader (None: no election).
        self.identity = identity
        #: Image repositories a privileged slurmd may come from (api.validate.load_cluster).
        self.trusted_repositories = tuple(trusted_repositories)
        #: Who the agent's NetworkPolicy admits (None: no policy is rendered).
        self.agent_clients = agent_clients
        self.agent = agent
        self.clock = clock
        self.fresh_keys = fresh_keys

    def new_key(self, name: str) -> bytes:
        """A key for a missing Secret: generated (only that one), or from the injected set."""
        return ClusterKeys.new_key(name) if self.fresh_keys is None else getattr(self.fresh_keys(), name)

    # Observing.

    def observe(self, namespace: str, cluster_name: str) -> list[dict]:
        """The cluster's objects and pods, listed by the cluster's label, and
        its key Secrets, read by name: the operator never lists Secrets (it
        has get on them, not list), so it cannot enumerate anyone else's."""
        selector = f"{names.CLUSTER_LABEL}={cluster_name}"
        objs: list[dict] = []
        for kind in (*plan.MANAGED_KINDS, "Pod"):
            if kind == "Secret":
                objs += self._key_secrets(namespace, cluster_name)
            else:
                objs += self.kube.list(kind, namespace, selector)
        return objs

    def _key_secrets(self, namespace: str, cluster_name: str) -> list[dict]:
        """The cluster's key Secrets that exist (a 404 means missing: the round creates it)."""
        found = (self.kube.get("Secret", namespace, name) for name in key_secret_names(cluster_name))
        return [s for s in found if s is not None]

    def unusable_secrets(self, cluster: SlurmCluster) -> list[str]:
        """Why each Secret the spec names may not be used (slurmk8s.api.secrets), read by name."""
        refs = secret_refs(cluster, used_only=True)
        return [p for p in (secret_problem(r, self.kube.get(r.kind, cluster.namespace, r.name)) for r in refs)
                if p is not None]

    def _worker_nodes(self, pods: Sequence[Mapping]) -> tuple[dict[str, dict | None], list[Exception]]:
        """The Nodes the cluster's worker pods are bound to, each read by name
        once a round (for node maintenance and spec.topology): None for one
        that is gone or could not be read (unknown); and the read failures."""
        out: dict[str, dict | None] = {}
        failed: list[Exception] = []
        for p in pods:
            host = (p.get("spec") or {}).get("nodeName")
            if (p["metadata"].get("labels") or {}).get("app.kubernetes.io/component") != "worker" or not host \
                    or host in out:
                continue
            try:
                out[host] = self.kube.get("Node", None, host)
            except Exception as exc:  # noqa: BLE001 - unknown: nothing is drained for it
                _log.info("node not read", node=host, error=str(exc))
                out[host] = None
                failed.append(exc)
        return out, failed

    @staticmethod
    def _topology(pods: Sequence[Mapping], nodes: Mapping[str, dict | None]) -> list[TopologyNode]:
        out = []
        for p in pods:
            labels = p["metadata"].get("labels") or {}
            host = (p.get("spec") or {}).get("nodeName")
            if labels.get("app.kubernetes.io/component") != "worker" or not host:
                continue
            node = nodes.get(host) or {"metadata": {}}
            out.append(TopologyNode(p["metadata"]["name"], dict(node["metadata"].get("labels") or {})))
        return out

    def _patch_status(self, body: Mapping, before: SlurmClusterStatus | None, after: SlurmClusterStatus) -> None:
        after = after.model_copy(update={"leader": self.identity or (before.leader if before else None)})
        if before is not None and before.dump() == after.dump():
            return
        meta = body["metadata"]
        self.kube.patch("SlurmCluster", meta.get("namespace"), meta["name"], {"status": after.dump()},
                        subresource="status")

    # A round.

    def _refuse(self, body: Mapping, previous: SlurmClusterStatus | None, out: Outcome, message: str,
                reason: str, now: float) -> Outcome:
        """End a round whose spec is refused (``reason``): the status says why (Failed), a
        Warning Event says it once, and nothing else is written."""
        out.status = status.invalid(previous, message, body["metadata"].get("generation"), format_time(now),
                                    reason=reason)
        if previous is None or previous.phase != "Failed" or _ready_message(previous) != message:
            out.events.append(Event("Warning", reason, message))
        out.problems.append(message)
        out.step = "status"
        self._patch_status(body, previous, out.status)
        return out

    def reconcile(self, body: Mapping) -> Outcome:
        """One round; :class:`RoundFailed` when a step raised."""
        out = Outcome()
        try:
            return self._round(body, out)
        except Exception as exc:
            raise RoundFailed(out.step, out) from exc

    def _round(self, body: Mapping, out: Outcome) -> Outcome:
        now = self.clock()
        out.step = "read the spec"
        previous = previous_status(body)
        doc = {k: copy.deepcopy(v) for k, v in body.items() if k != "status"}
        try:
            cluster = load_cluster(doc, trusted_repositories=self.trusted_repositories)
        except InvalidSpec as exc:
            return self._refuse(body, previous, out, str(exc), "InvalidSpec", now)

        out.step = "read the Secrets the spec names"
        unusable = self.unusable_secrets(cluster)
        if unusable:  # nothing is mounted or sent that its owner did not mark for it
            return self._refuse(body, previous, out, "; ".join(unusable), "UnusableSecret", now)

        out.step = "observe"
        observed = self.observe(cluster.namespace, cluster.name)
        pods = [o for o in observed if o["kind"] == "Pod"]
        objects = [o for o in observed if o["kind"] != "Pod"]
        refused = upgrade.refused(cluster, objects)
        if refused:  # the cluster keeps running its release
            return self._refuse(body, previous, out, refused, "UnsupportedUpgrade", now)
        secrets = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Secret"}
        try:
            keys, _missing = keys_from_secrets(cluster, secrets, self.new_key)
        except BadKeySecret as exc:
            # Nothing is created or updated: no pod may mount a key that is not the cluster's.
            reason = "ForeignKeySecret" if isinstance(exc, ForeignKeySecret) else "BadKeySecret"
            out.problems.append(str(exc))
            reported = _ready_message(previous) if previous else ""
            if str(exc) not in reported:
                out.events.append(Event("Warning", reason, str(exc)))
            out.status = status.compute(cluster, previous, observed=objects, nodes=None,
                                        applied_hash=previous.config_hash if previous else None,
                                        rendered_hash="", problems=out.problems, now=format_time(now),
                                        problem_reason=reason)
            out.step = "status"
            self._patch_status(body, previous, out.status)
            return out
        out.step = "read the workers' Nodes"
        worker_nodes, unread = self._worker_nodes(pods)
        if cluster.spec.topology and unread:
            raise unread[0]  # a topology without a node's switch labels would be wrong, not partial
        topology = self._topology(pods, worker_nodes) if cluster.spec.topology else []
        out.step = "render"
        desired = render(cluster, keys, topology, agent_clients=self.agent_clients)
        rendered_hash = desired[0]["metadata"]["annotations"][names.CONFIG_HASH]

        out.step = "read Slurm"
        controller_pod = next((p for p in pods if p["metadata"]["name"] == names.controller_pod(cluster)), None)
        slurm = self.agent(cluster, keys.agent_token, controller_pod)
        nodes: list[Node] | None = None
        seen_hash: str | None = None
        controller_exists = any(o["kind"] == "StatefulSet" and o["metadata"]["name"] == names.controller(cluster)
                                for o in objects)
        if controller_exists:
            try:
                nodes = slurm.nodes()
                seen_hash = slurm.config_hash()
            except Exception as exc:  # noqa: BLE001 - unknown Slurm state: every decision below waits
                out.waiting.append(f"Slurm state unknown: {exc}")
                _log.info("agent not answering", cluster=cluster.name, error=str(exc))
        out.nodes = nodes
        if nodes is not None:
            for node, check in sorted(unhealthy(nodes).items()):
                # Named by node and check: announced once while Kubernetes keeps the Event.
                out.events.append(Event("Warning", "NodeUnhealthy",
                                        f"Slurm node {node} failed its {check} health check: drained until "
                                        "it passes again", kind="SlurmNode", name=f"{node}.{check}"))

        sets = observe_nodesets(cluster, [o for o in objects if o["kind"] == "StatefulSet"], pods, worker_nodes)
        state = SlurmState.nodes_only(nodes)
        decision = workers.decide(sets, state, now)
        if decision.needs_jobs and state.nodes is not None:
            # Once a round, every job: the decision indexes them by node and by id.
            try:
                jobs: tuple[Job, ...] | None = tuple(slurm.jobs())
            except Exception as exc:  # noqa: BLE001 - unknown jobs: the decisions that need them wait
                jobs = None
                _log.info("job lookup failed", error=str(exc))
            decision = workers.decide(sets, state.with_jobs(jobs), now)
        out.waiting += decision.waiting
        out.hurry = decision.hurry

        # 1. Slurm actions and their annotations.
        out.step = "Slurm actions"
        if not self._slurm_actions(cluster, slurm, decision.slurm_actions, out):
            decision = decision.hold(sets)
        held = bool(out.problems)
        out.events += decision.events

        # 2. Creates and updates; removed node sets are scaled through their observed StatefulSet.
        out.step = "create and update"
        keep = {(kind, name) for s in sets if s.name in decision.keep
                for kind, name in (("StatefulSet", s.statefulset), ("PodDisruptionBudget", f"{s.statefulset}-busy"))}
        wanted = plan.with_replicas(desired, decision.replicas)
        changes = plan.plan(wanted, objects, cluster_name=cluster.name, keep=keep)
        updates = changes.updates
        held_keys, held_why = upgrade.held(cluster, desired, objects)
        out.waiting += held_why
        updates = tuple(u for u in updates if u.key not in held_keys)
        writes: tuple[plan.Create | plan.Update, ...] = (*changes.creates, *updates)
        for action in writes:
            if not self._write(action, out) and plan.create_only(action.obj):
                break  # a key Secret that could not be created: nothing may mount what is there
        desired_names = {o["metadata"]["name"] for o in desired if o["kind"] == "StatefulSet"}
        for s in sets:
            if s.statefulset not in desired_names and s.current is not None \
                    and decision.replicas.get(s.statefulset, s.current) != s.current:
                self._try(out, f"scale StatefulSet/{s.statefulset}", lambda s=s: self.kube.patch(  # type: ignore[misc]  # mypy infers no lambda whose loop variable is bound by a default
                    "StatefulSet", cluster.namespace, s.statefulset,
                    {"spec": {"replicas": decision.replicas[s.statefulset]}}))

        # 3. Busy labels (the busy-worker PodDisruptionBudget), restarts and leftover records.
        out.step = "labels, restarts and node records"
        for b in decision.busy_labels:
            self._try(out, f"label Pod/{b.pod} busy={b.busy}", lambda b=b: self.kube.patch(  # type: ignore[misc]  # mypy infers no lambda whose loop variable is bound by a default
                "Pod", cluster.namespace, b.pod,
                {"metadata": {"uid": b.uid, "labels": {names.BUSY_LABEL: "true" if b.busy else None}}}))
        if not held:
            for d in decision.pod_deletions:
                self._try(out, f"delete Pod/{d.pod}", lambda d=d: self.kube.delete(  # type: ignore[misc]  # mypy infers no lambda whose loop variable is bound by a default
                    "Pod", cluster.namespace, d.pod, uid=d.uid))
            for r in decision.record_deletions:
                self._try(out, f"delete Slurm node {r.node}", lambda r=r: slurm.delete_node(r.node))  # type: ignore[misc]  # mypy infers no lambda whose loop variable is bound by a default

        # 4. Deletes, only after a clean round so far.
        out.step = "delete"
        if not out.problems:
            for delete in changes.deletes:
                self._try(out, f"delete {delete.kind}/{delete.name}", lambda delete=delete: self.kube.delete(  # type: ignore[misc]  # as above
                    delete.kind, delete.namespace, delete.name, uid=delete.uid))

        # 5. Reconfigure.
        out.step = "reconfigure"
        applied = previous.config_hash if previous else None
        go, why = decide_reconfigure(rendered_hash, applied, seen_hash)
        if why:
            out.waiting.append(why)
        if go:
            try:
                slurm.reconfigure()
                applied = rendered_hash
                out.applied.append("scontrol reconfigure")
                out.events.append(Event("Normal", "Reconfigured",
                                                f"slurmctld and the nodes read the new config ({rendered_hash})"))
            except Exception as exc:  # noqa: BLE001 - a problem of the round, said in its status
                out.problems.append(f"scontrol reconfigure failed: {exc}")

        # 6. Accounting: every login user's association and the QOS, through the agent.
        out.step = "accounting"
        acct_applied: bool | None = None
        acct_error = ""
        if nodes is not None and accounting.applies(cluster, objects):
            try:
                done = slurm.apply_accounting(accounting.wanted(cluster))
                acct_applied = True
                if done:
                    out.applied += done
                    out.events.append(Event("Normal", "AssociationsApplied", "; ".join(done)[:1024]))
            except Exception as exc:  # noqa: BLE001 - slurmdbd away: records queue in slurmctld, retried next round
                acct_applied, acct_error = False, str(exc)
                out.waiting.append(f"associations not applied: {exc}")

        # 7. The site's directory, as the sssd container beside slurmctld last probed it.
        out.step = "directory"
        directory_ready = None
        if cluster.spec.identity.ldap is not None:
            verdict, why = None, "the agent did not answer this round"
            if nodes is not None:
                try:
                    verdict = slurm.directory()
                except Exception as exc:  # noqa: BLE001 - an agent older than the directory's route: unknown
                    why = str(exc)
            directory_ready = directory.condition(verdict, why)
            before = next((c for c in previous.conditions if c.type == directory.CONDITION), None) \
                if previous else None
            change = directory.event(before, directory_ready)
            if change is not None:
                out.events.append(change)

        # 8. Status. A workload short of pods: its controller's FailedCreate Events say why.
        out.step = "status"
        short = status.short_of_pods(objects, pods)
        refused_pods: list[str] = []
        if short:
            try:
                refused_pods = status.refused_pods(short, self.kube.list("Event", cluster.namespace,
                                                                         fields="reason=FailedCreate"))
            except Exception as exc:  # noqa: BLE001 - the status says what is known; the next round asks again
                _log.warning("could not read FailedCreate events", cluster=cluster.name, error=str(exc))
        out.status = status.compute(cluster, previous, observed=objects, nodes=nodes, applied_hash=applied, pods=pods,
                                    refused=refused_pods,
                                    rendered_hash=rendered_hash, problems=out.problems, waiting=out.waiting,
                                    now=format_time(now),
                                    accounting=accounting.condition(cluster, objects, acct_applied, acct_error),
                                    directory=directory_ready)
        if previous is None or previous.phase != out.status.phase:
            ready = next(c for c in out.status.conditions if c.type == "Ready")
            kind = "Normal" if out.status.phase in ("Ready", "Provisioning", "Pending") else "Warning"
            out.events.append(Event(kind, out.status.phase, ready.message))
        self._patch_status(body, previous, out.status)
        return out

    def _try(self, out: Outcome, what: str, fn: Callable[[], Any]) -> bool:
        """``what``: a verb and the object (``create StatefulSet/x``)."""
        try:
            fn()
        except FAILURES as exc:
            out.problems.append(f"{what}: {exc}")
            out.events.append(Event("Warning", "ActionFailed", f"{what}: {exc}", name=what))
            return False
        out.applied.append(what)
        return True

    def _write(self, action: plan.Create | plan.Update, out: Outcome) -> bool:
        """Create or apply one object; False when that failed (a problem of the round).

        A create-only object (a key Secret) that exists by the time it is
        created (409) is a failure too: something made it between the read
        and the create, and the next round checks whose it is."""
        obj = action.obj
        what = f"{'create' if isinstance(action, plan.Create) else 'update'} {obj['kind']}/{obj['metadata']['name']}"
        write = (lambda: self.kube.create(obj)) if plan.create_only(obj) else (lambda: self.kube.apply(obj))
        ok = self._try(out, what, write)
        if ok and isinstance(action, plan.Update):
            _log.info("updated", object=what, changed=list(action.changed)[:8])
        return ok

    def _slurm_actions(self, cluster: SlurmCluster, slurm: SlurmControl,
                       actions: Sequence[Any], out: Outcome) -> bool:
        """Run the decision's Slurm steps and pod annotations by the one
        executor's rule (:func:`slurmk8s.slurm.steps.execute`: a pod's
        annotations are its node's chain); False when anything failed."""
        def annotate(a: Any) -> None:
            if not isinstance(a, workers.AnnotatePod):  # pragma: no cover - a new action type without a runner
                raise TypeError(f"no runner for {a!r}")
            patch = {"metadata": {"uid": a.uid, "annotations": dict(a.annotations)}}
            self.kube.patch("Pod", cluster.namespace, a.pod, patch)

        def subject(a: Any) -> str:
            return f"{type(a).__name__} {getattr(a, 'node', getattr(a, 'pod', ''))}"

        done = steps.execute(slurm, actions, other=annotate,
                             chain=lambda a: getattr(a, "node", None) or getattr(a, "pod", None))
        out.applied += [subject(a) for a in done.applied]
        out.events += done.refusals
        for a, error in done.failed:
            out.problems.append(f"{subject(a)}: {error}")
            out.events.append(Event("Warning", "SlurmActionFailed", f"{subject(a)}: {error}",
                                    kind=type(a).__name__, name=getattr(a, "node", getattr(a, "pod", ""))))
        return not done.failed and not done.skipped

    def teardown(self, body: Mapping, attempt: int = 0) -> tuple[bool, str]:
        """One step of an orderly teardown (:func:`.teardown.step`); (done, what it waits for)."""
        return teardown.step(self, body, attempt)

    def announce(self, body: Mapping, events: Sequence[Event]) -> None:
        """Post a round's Events about the SlurmCluster, as ``slurmk8s-operator``.

        A Warning about an object (a failed write, a refused Slurm action)
        is named after the cluster, its reason and that object, so posting
        it again while Kubernetes keeps it (an hour by default) is refused
        with 409: a failure that lasts is announced once per reason and
        object, whatever its message says. Other Events are posted as they come.
        """
        for e in events:
            name = _event_name(body, e) if e.type == "Warning" and e.about else None
            try:
                self.kube.event(body, e.type, e.reason, e.message, component=names.FIELD_MANAGER, name=name)
            except ApiError as exc:
                if not exc.conflict:
                    _log.warning("could not post an Event", reason=e.reason, error=str(exc))
            except OSError as exc:
                _log.warning("could not post an Event", reason=e.reason, error=str(exc))

def _event_name(body: Mapping, e: Event) -> str:
    """The one name of a failure Event: cluster, reason and object."""
    meta = body["metadata"]
    digest = hashlib.sha256(f"{meta.get('uid', '')}\0{e.reason}\0{e.about}".encode()).hexdigest()[:16]
    return f"{meta['name']}.{digest}"


def _ready_message(st: SlurmClusterStatus) -> str:
    return next((c.message for c in st.conditions if c.type == "Ready"), "")
