"""One round of the operator for one SlurmCluster: observe, decide, act.

This is the shell around the pure decisions (:mod:`.plan`, :mod:`.workers`,
:mod:`.reconfigure`, :mod:`.status`): it reads the cluster's objects through
:class:`~.kube.Kube` and Slurm through the cluster's agent
(:class:`~slurmk8s.slurm.SlurmControl`), calls the decisions, and carries out
what they return, in this order:

1. Slurm actions (drain, signal, requeue, undrain) and the pod annotations
   that remember them. If one fails, the round goes on with every node set
   held at its current size, and nothing is restarted or deleted: the step
   returns that as :class:`SlurmActed` (``may_restart``).
2. The plan: create, then update (StatefulSets with the replicas the
   scale-in allows).
3. Busy labels on worker pods; pods to restart (rolling update), Slurm
   records of gone pods, where ``may_restart``.
4. Deletes, only in a round where everything before succeeded (each step
   returns whether it did).
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
the API server and Slurm say. Its reads are :mod:`.reads`; what they return
becomes the decisions' input in :mod:`.observe`; its Events are posted by
:mod:`.announce`; the finalizer's teardown is :mod:`.teardown`.

Over 500 lines because it holds every step of the round, one method each, in
the order above; what each step reads and decides is already elsewhere.
"""

from __future__ import annotations

import copy
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from slurmk8s import log
from slurmk8s.api import InvalidSpec, load_cluster, with_storage_class
from slurmk8s.api.cluster import PROJECT_REPOSITORY, SlurmCluster, SlurmClusterStatus
from slurmk8s.api.status import ConditionStatus
from slurmk8s.events import Event
from slurmk8s.kube import ApiError, Kube
from slurmk8s.render import ClusterKeys, names, render
from slurmk8s.render.keys import BadKeySecret, ForeignKeySecret, keys_from_secrets
from slurmk8s.render.manifests import AgentClients
from slurmk8s.slurm import AgentError, NotOurDrain, SlurmControl, SlurmError, steps
from slurmk8s.slurm.model import Job, Node, SlurmState
from slurmk8s.slurm.remote import cluster_agent
from slurmk8s.times import format_time

from . import accounting, announce, directory, plan, reads, status, teardown, upgrade, workers
from .observe import observe_nodesets, previous_status, worker_hosts
from .observe import topology as observe_topology
from .reconfigure import decide_reconfigure

__all__ = ["Operator", "Outcome", "RoundFailed", "FAILURES", "SlurmActed"]

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


@dataclass(frozen=True)
class Seen:
    """What a round read before it decides: the spec, the status it had, the
    cluster's objects (but pods), its pods, its keys, and the Nodes its
    workers run on (None: not read)."""

    cluster: SlurmCluster
    previous: SlurmClusterStatus | None
    objects: list[dict]
    pods: list[dict]
    keys: ClusterKeys
    worker_nodes: dict[str, dict | None]


@dataclass(frozen=True)
class SlurmRead:
    """The cluster's agent, and what it said this round: the Slurm nodes and
    the hash of the config Slurm sees (None: unknown, and decisions wait)."""

    control: SlurmControl
    nodes: list[Node] | None = None
    config_hash: str | None = None


@dataclass(frozen=True)
class SlurmActed:
    """What the Slurm-actions step (1) leaves the later steps."""

    #: The decision to carry out: held (every node set at its size) unless ``may_restart``.
    decision: workers.Decision
    #: Every Slurm action and annotation went through: pods may restart and the
    #: Slurm records of gone pods may go (step 3); deletes may follow (step 4).
    may_restart: bool


#: The cluster's Slurm client, at the controller pod's IP
#: (:func:`~slurmk8s.slurm.remote.agent_url`: never a DNS name).
_default_agent = functools.partial(cluster_agent, port=names.AGENT_PORT)


class Operator:
    """Runs rounds for SlurmClusters against one API server.

    ``agent``: makes the Slurm client of a cluster from (cluster, agent
    token, controller pod) — by default :func:`~slurmk8s.slurm.remote.cluster_agent` at
    the controller pod's IP. ``clock`` and ``fresh_keys`` (the key set that
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
                 identity: str | None = None, shared_storage_class: str | None = None):
        self.kube = kube
        #: The class of a shared claim whose spec names none; None: refused (api.storageclass).
        self.shared_storage_class = shared_storage_class
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

    def _patch_status(self, body: Mapping, before: SlurmClusterStatus | None, after: SlurmClusterStatus) -> None:
        after = after.model_copy(update={"leader": self.identity or (before.leader if before else None)})
        if before is not None and before.dump() == after.dump():
            return
        meta = body["metadata"]
        self.kube.patch("SlurmCluster", meta.get("namespace"), meta["name"], {"status": after.dump()},
                        subresource="status")

    # A round.

    def _refuse(self, body: Mapping, previous: SlurmClusterStatus | None, out: Outcome, message: str,
                reason: str, now: float) -> None:
        """End a round whose spec is refused (``reason``): the status says why (Failed), a
        Warning Event says it once, and nothing else is written."""
        out.status = status.invalid(previous, message, body["metadata"].get("generation"), format_time(now),
                                    reason=reason)
        if previous is None or previous.phase != "Failed" or status.ready_message(previous) != message:
            out.events.append(Event("Warning", reason, message))
        out.problems.append(message)
        out.step = "status"
        self._patch_status(body, previous, out.status)

    def reconcile(self, body: Mapping) -> Outcome:
        """One round; :class:`RoundFailed` when a step raised."""
        out = Outcome()
        try:
            return self._round(body, out)
        except Exception as exc:
            raise RoundFailed(out.step, out) from exc

    def _round(self, body: Mapping, out: Outcome) -> Outcome:
        """The steps of the module docstring, each a method; what one allows
        the next (``may_restart``, ``may_delete``) is a value it returns."""
        now = self.clock()
        seen = self._read(body, out, now)
        if seen is None:
            return out
        desired = self._render(seen, out)
        rendered_hash = desired[0]["metadata"]["annotations"][names.CONFIG_HASH]
        slurm = self._read_slurm(seen, out)
        sets, decision = self._decide(seen, slurm, now, out)
        acted = self._act_in_slurm(seen, slurm, sets, decision, out)                  # 1.
        deletes, written = self._create_and_update(seen, desired, sets, acted.decision, out)  # 2.
        relabelled = self._labels_restarts_records(seen, slurm, acted, out)           # 3.
        out.step = "delete"                                                           # 4.
        if acted.may_restart and written and relabelled:  # may delete: everything before went through
            for d in deletes:
                self._try(out, f"delete {d.kind}/{d.name}",
                          functools.partial(self.kube.delete, d.kind, d.namespace, d.name, uid=d.uid))
        applied = self._reconfigure(seen, slurm, rendered_hash, out)                  # 5.
        acct = self._accounting(seen, slurm, out)                                     # 6.
        directory_ready = self._directory(seen, slurm, out)                           # 7.
        out.step = "status"                                                           # 8.
        out.status = status.compute(seen.cluster, seen.previous, observed=seen.objects, nodes=slurm.nodes,
                                    applied_hash=applied, pods=seen.pods,
                                    refused=reads.refused_pods(self.kube, seen.cluster, seen.objects, seen.pods),
                                    rendered_hash=rendered_hash, problems=out.problems, waiting=out.waiting,
                                    now=format_time(now), accounting=acct, directory=directory_ready,
                                    storage=reads.storage(self.kube, seen.cluster, desired, seen.objects))
        change = status.phase_event(seen.previous, out.status)
        if change is not None:
            out.events.append(change)
        self._patch_status(body, seen.previous, out.status)
        return out

    def _read(self, body: Mapping, out: Outcome, now: float) -> Seen | None:
        """The spec, the Secrets it names, the cluster's objects and its keys;
        None when the round ends here (the status says why)."""
        out.step = "read the spec"
        previous = previous_status(body)
        doc = {k: copy.deepcopy(v) for k, v in body.items() if k != "status"}
        try:
            cluster = with_storage_class(load_cluster(doc, trusted_repositories=self.trusted_repositories),
                                         self.shared_storage_class)
        except InvalidSpec as exc:
            self._refuse(body, previous, out, str(exc), "InvalidSpec", now)
            return None

        out.step = "read the Secrets the spec names"
        unusable = reads.unusable_secrets(self.kube, cluster)
        if unusable:  # nothing is mounted or sent that its owner did not mark for it
            self._refuse(body, previous, out, "; ".join(unusable), "UnusableSecret", now)
            return None

        out.step = "observe"
        observed = reads.observe(self.kube, cluster.namespace, cluster.name)
        pods = [o for o in observed if o["kind"] == "Pod"]
        objects = [o for o in observed if o["kind"] != "Pod"]
        refused = upgrade.refused(cluster, objects)
        if refused:  # the cluster keeps running its release
            self._refuse(body, previous, out, refused, "UnsupportedUpgrade", now)
            return None
        secrets = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Secret"}
        try:
            keys, _missing = keys_from_secrets(cluster, secrets, self.new_key)
        except BadKeySecret as exc:
            # Nothing is created or updated: no pod may mount a key that is not the cluster's.
            reason = "ForeignKeySecret" if isinstance(exc, ForeignKeySecret) else "BadKeySecret"
            out.problems.append(str(exc))
            if str(exc) not in status.ready_message(previous):
                out.events.append(Event("Warning", reason, str(exc)))
            out.status = status.compute(cluster, previous, observed=objects, nodes=None,
                                        applied_hash=previous.config_hash if previous else None,
                                        rendered_hash="", problems=out.problems, now=format_time(now),
                                        problem_reason=reason)
            out.step = "status"
            self._patch_status(body, previous, out.status)
            return None

        out.step = "read the workers' Nodes"
        worker_nodes, unread = reads.worker_nodes(self.kube, worker_hosts(pods))
        if cluster.spec.topology and unread:
            raise unread[0]  # a topology without a node's switch labels would be wrong, not partial
        return Seen(cluster, previous, objects, pods, keys, worker_nodes)

    def _render(self, seen: Seen, out: Outcome) -> list[dict]:
        """The cluster's objects as the spec wants them (switches from the workers' Nodes)."""
        out.step = "render"
        topology = observe_topology(seen.pods, seen.worker_nodes) if seen.cluster.spec.topology else []
        return render(seen.cluster, seen.keys, topology, agent_clients=self.agent_clients)

    def _read_slurm(self, seen: Seen, out: Outcome) -> SlurmRead:
        """The Slurm nodes and the config the agent sees, once the controller exists;
        unknown (None) when the agent does not answer, and every decision waits."""
        out.step = "read Slurm"
        cluster = seen.cluster
        controller_pod = next((p for p in seen.pods if p["metadata"]["name"] == names.controller_pod(cluster)),
                              None)
        slurm = self.agent(cluster, seen.keys.agent_token, controller_pod)
        if not any(o["kind"] == "StatefulSet" and o["metadata"]["name"] == names.controller(cluster)
                   for o in seen.objects):
            return SlurmRead(slurm)
        try:
            nodes = slurm.nodes()
            seen_hash = slurm.config_hash()
        except Exception as exc:  # noqa: BLE001 - unknown Slurm state: every decision below waits
            out.waiting.append(f"Slurm state unknown: {exc}")
            _log.info("agent not answering", cluster=cluster.name, error=str(exc))
            return SlurmRead(slurm)
        out.nodes = nodes
        out.events += status.unhealthy_events(nodes)
        return SlurmRead(slurm, nodes, seen_hash)

    def _decide(self, seen: Seen, slurm: SlurmRead, now: float,
                out: Outcome) -> tuple[list[workers.NodeSetState], workers.Decision]:
        """The node sets and what happens to their workers (:func:`.workers.decide`),
        with Slurm's jobs read once when the decision asks for them."""
        sets = observe_nodesets(seen.cluster, [o for o in seen.objects if o["kind"] == "StatefulSet"], seen.pods,
                                seen.worker_nodes)
        state = SlurmState.nodes_only(slurm.nodes)
        decision = workers.decide(sets, state, now)
        if decision.needs_jobs and state.nodes is not None:
            # Once a round, every job: the decision indexes them by node and by id.
            try:
                jobs: tuple[Job, ...] | None = tuple(slurm.control.jobs())
            except Exception as exc:  # noqa: BLE001 - unknown jobs: the decisions that need them wait
                jobs = None
                _log.info("job lookup failed", error=str(exc))
            decision = workers.decide(sets, state.with_jobs(jobs), now)
        out.waiting += decision.waiting
        out.hurry = decision.hurry
        return sets, decision

    def _act_in_slurm(self, seen: Seen, slurm: SlurmRead, sets: Sequence[workers.NodeSetState],
                      decision: workers.Decision, out: Outcome) -> SlurmActed:
        """Step 1: the decision's Slurm steps and pod annotations, by the one
        executor's rule (:func:`slurmk8s.slurm.steps.execute`: a pod's
        annotations are its node's chain). When one did not go through, the
        decision is held (every node set at its size) and nothing may restart."""
        out.step = "Slurm actions"

        def annotate(a: Any) -> None:
            if not isinstance(a, workers.AnnotatePod):  # pragma: no cover - a new action type without a runner
                raise TypeError(f"no runner for {a!r}")
            patch = {"metadata": {"uid": a.uid, "annotations": dict(a.annotations)}}
            self.kube.patch("Pod", seen.cluster.namespace, a.pod, patch)

        def subject(a: Any) -> str:
            return f"{type(a).__name__} {getattr(a, 'node', getattr(a, 'pod', ''))}"

        done = steps.execute(slurm.control, decision.slurm_actions, other=annotate,
                             chain=lambda a: getattr(a, "node", None) or getattr(a, "pod", None))
        out.applied += [subject(a) for a in done.applied]
        out.events += done.refusals
        for a, error in done.failed:
            out.problems.append(f"{subject(a)}: {error}")
            out.events.append(Event("Warning", "SlurmActionFailed", f"{subject(a)}: {error}",
                                    kind=type(a).__name__, name=getattr(a, "node", getattr(a, "pod", ""))))
        out.events += decision.events
        clean = not done.failed and not done.skipped
        return SlurmActed(decision if clean else decision.hold(sets), may_restart=clean)

    def _create_and_update(self, seen: Seen, desired: Sequence[dict], sets: Sequence[workers.NodeSetState],
                           decision: workers.Decision, out: Outcome) -> tuple[tuple[plan.Delete, ...], bool]:
        """Step 2: creates and updates, with the replicas the decision allows;
        node sets gone from the spec scaled through their observed StatefulSet.
        The plan's deletes (for step 4), and whether every write went through."""
        out.step = "create and update"
        cluster = seen.cluster
        changes = plan.plan(plan.with_replicas(desired, decision.replicas), seen.objects,
                            cluster_name=cluster.name, keep=plan.held_objects(sets, decision.keep))
        held_keys, held_why = upgrade.held(cluster, desired, seen.objects)
        out.waiting += held_why
        written = True
        writes: list[plan.Create | plan.Update] = [*changes.creates, *(u for u in changes.updates
                                                                        if u.key not in held_keys)]
        for action in writes:
            if not self._write(action, out):
                written = False
                if plan.create_only(action.obj):
                    break  # a key Secret that could not be created: nothing may mount what is there
        for sts, replicas in plan.removed_scales(sets, desired, decision.replicas):
            written &= self._try(out, f"scale StatefulSet/{sts}", functools.partial(
                self.kube.patch, "StatefulSet", cluster.namespace, sts, {"spec": {"replicas": replicas}}))
        return changes.deletes, written

    def _labels_restarts_records(self, seen: Seen, slurm: SlurmRead, acted: SlurmActed, out: Outcome) -> bool:
        """Step 3: busy labels (the busy-worker PodDisruptionBudget); pod restarts
        and Slurm records of gone pods where ``may_restart``. Whether every
        write went through."""
        out.step = "labels, restarts and node records"
        namespace, decision = seen.cluster.namespace, acted.decision
        ok = True
        for b in decision.busy_labels:
            label = {"metadata": {"uid": b.uid, "labels": {names.BUSY_LABEL: "true" if b.busy else None}}}
            ok &= self._try(out, f"label Pod/{b.pod} busy={b.busy}",
                            functools.partial(self.kube.patch, "Pod", namespace, b.pod, label))
        if acted.may_restart:
            for d in decision.pod_deletions:
                ok &= self._try(out, f"delete Pod/{d.pod}",
                                functools.partial(self.kube.delete, "Pod", namespace, d.pod, uid=d.uid))
            for r in decision.record_deletions:
                ok &= self._try(out, f"delete Slurm node {r.node}", functools.partial(slurm.control.delete_node, r.node))
        return ok

    def _reconfigure(self, seen: Seen, slurm: SlurmRead, rendered_hash: str, out: Outcome) -> str | None:
        """Step 5: ``scontrol reconfigure`` once the agent sees the rendered config;
        the config hash Slurm has applied after it."""
        out.step = "reconfigure"
        applied = seen.previous.config_hash if seen.previous else None
        go, why = decide_reconfigure(rendered_hash, applied, slurm.config_hash)
        if why:
            out.waiting.append(why)
        if go:
            try:
                slurm.control.reconfigure()
                applied = rendered_hash
                out.applied.append("scontrol reconfigure")
                out.events.append(Event("Normal", "Reconfigured",
                                        f"slurmctld and the nodes read the new config ({rendered_hash})"))
            except Exception as exc:  # noqa: BLE001 - said as a problem of the round; tried again next round
                out.problems.append(f"scontrol reconfigure failed: {exc}")
        return applied

    def _accounting(self, seen: Seen, slurm: SlurmRead, out: Outcome) -> tuple[ConditionStatus, str, str]:
        """Step 6: every login user's association and the QOS, through the agent;
        the AccountingReady condition."""
        out.step = "accounting"
        cluster, objects = seen.cluster, seen.objects
        acct_applied: bool | None = None
        acct_error = ""
        if slurm.nodes is not None and accounting.applies(cluster, objects):
            try:
                done = slurm.control.apply_accounting(accounting.wanted(cluster))
                acct_applied = True
                if done:
                    out.applied += done
                    out.events.append(Event("Normal", "AssociationsApplied", "; ".join(done)[:1024]))
            except Exception as exc:  # noqa: BLE001 - slurmdbd away: records queue in slurmctld, retried next round
                acct_applied, acct_error = False, str(exc)
                out.waiting.append(f"associations not applied: {exc}")
        return accounting.condition(cluster, objects, acct_applied, acct_error)

    def _directory(self, seen: Seen, slurm: SlurmRead, out: Outcome) -> tuple[ConditionStatus, str, str] | None:
        """Step 7: the site's directory, as the sssd container beside slurmctld last
        probed it (DirectoryReady; None without one)."""
        out.step = "directory"
        if seen.cluster.spec.identity.ldap is None:
            return None
        verdict, why = None, "the agent did not answer this round"
        if slurm.nodes is not None:
            try:
                verdict = slurm.control.directory()
            except Exception as exc:  # noqa: BLE001 - an agent older than the directory's route: unknown
                why = str(exc)
        ready = directory.condition(verdict, why)
        before = next((c for c in seen.previous.conditions if c.type == directory.CONDITION), None) \
            if seen.previous else None
        change = directory.event(before, ready)
        if change is not None:
            out.events.append(change)
        return ready

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

    def teardown(self, body: Mapping, attempt: int = 0) -> tuple[bool, str]:
        """One step of an orderly teardown (:func:`.teardown.step`); (done, what it waits for)."""
        return teardown.step(self, body, attempt)

    def announce(self, body: Mapping, events: Sequence[Event]) -> None:
        """Post a round's Events about the SlurmCluster, each failure once (:mod:`.announce`)."""
        announce.post(self.kube, body, events)
