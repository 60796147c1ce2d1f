"""The bridge's loop: observe, decide, act. Thin; the state of every node is on the Node.

Every round reads the NodeLendingPolicies, Nodes and Pods through its view
(:mod:`.view`: watch-fed caches in ``slurmk8s bridge``, or a full read from
the API server) and, per policy, its SlurmCluster and Slurm (through the
cluster's agent), calls :func:`slurmk8s.bridge.decide.decide`, and applies
the actions in order. While a cache is not synced, a round decides nothing.
Rounds run when a watched change may matter and on a timer (Slurm has no
watch). The state of every node lives on the Node (see :mod:`.nodestate`),
so the bridge may be killed at any instant: the next round, by this process
or a new one, picks up where it stopped. After the
policies, it rolls serving Deployments to newly published model versions
(:mod:`.rollout`), reading them through each cluster's agent.

Rules the loop keeps (slurmk8s/bridge/README.md explains why):

- Actions run through the one executor of Slurm steps
  (:func:`slurmk8s.slurm.steps.execute`, the operator's too) and its failure
  rule: actions about one node form a chain, and when one fails the rest of
  that node's actions wait for the next round; after a Slurm call fails as
  unreachable, the policy's later Slurm steps fail at once; a job Slurm
  refuses gets a Warning Event and the rest go on.
- Node patches that change taints carry the Node's resourceVersion, so two
  writers cannot both take a node; a conflict fails the chain.
- No policy is skipped. A SlurmCluster that cannot be loaded (invalid by
  the operator's rule, which the bridge applies with the same trusted
  repositories; unknown to this version; a read that fails) is an
  ``UnreadableCluster``: decide gives it no Slurm, lends it nothing and
  takes its nodes back (decision record 46). A policy that cannot be
  loaded gets its status, and its nodes are decided as a deleted
  policy's (``PolicyGone``); nodes held under a record that names no
  policy and SlurmCluster as ``<namespace>/<name>`` by an ``Unattributed``
  holder, which takes them back too. Slurm that cannot be read is
  ``SlurmState.unknown()`` (decide then fails closed, but for the owner's
  claims, ``maxLentNodes`` and the reclaim deadline).
- One cluster's Slurm does not hold up another's policies: every cluster's
  Slurm is read at once, in threads, and each policy is decided (in this
  thread, in turn) as soon as its cluster answered; one that has not within
  ``slurm_timeout`` is decided with Slurm unknown, and while that read
  still runs the cluster is not asked again (it is unknown at once).

Over 500 lines because the round, its scheduling (the reads of
every cluster's Slurm in threads, each policy decided as its cluster
answers) and the applying of the Kubernetes actions (``_Acting``) are one
shell around ``decide``, and split they would share the round's state; the
decisions, the view, the Node codec and the Slurm steps with their executor
are modules of their own already.
"""

from __future__ import annotations

import base64
import concurrent.futures as cf
import functools
import math
import posixpath
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import structlog
import urllib3

from ..api import load_cluster, load_policy
from ..api.cluster import API_VERSION, PROJECT_REPOSITORY, SlurmCluster
from ..api.errors import InvalidSpec
from ..api.lending import NodeLendingPolicy, NodeLendingPolicyStatus
from ..events import Event
from ..kube import ApiError
from ..render import names
from ..render.manifests import lent_budget, lent_slurmd_pod
from ..render.slurmd import LENT_COMPONENT, LENT_MANAGER, is_lent_slurmd_pod
from ..slurm import SlurmControl, steps
from ..slurm.model import SlurmState
from ..slurm.remote import AgentError, cluster_agent
from ..slurm.reservations import Reservation
from . import actions as A
from . import metrics
from .decide import decide, lending_metrics, orphaned_policies
from .nodestate import LENT, RECLAIMING, TAINT_KEY
from .observed import InvalidPolicy, KubeNode, Observed, PolicyGone, Unattributed, UnreadableCluster, node_from_api
from .patches import NODE_PATCH_ACTIONS, node_patch
from .rollout import apply_rollouts
from .view import Listing

__all__ = ["Bridge", "RoundReport", "FIELD_MANAGER"]

log = structlog.get_logger("slurmk8s.bridge")

FIELD_MANAGER = "slurmk8s-bridge"
COMPONENT = "slurmk8s-bridge"

Policy = NodeLendingPolicy | PolicyGone | Unattributed | InvalidPolicy
#: (cluster, agent token, controller pod or None) -> a Slurm facade.
AgentFactory = Callable[[SlurmCluster, bytes, Mapping | None], SlurmControl]


_default_agent = functools.partial(cluster_agent, port=names.AGENT_PORT, timeout=15)


@dataclass
class RoundReport:
    """What one round did: for logs, tests and the benchmark."""

    applied: list[Any] = field(default_factory=list)
    failed: list[tuple[Any, str]] = field(default_factory=list)
    skipped: list[Any] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    #: Deployments rolled to a new model version: namespace/name -> version.
    rolled: dict[str, str] = field(default_factory=dict)
    #: Deployments that could not be rolled (LATEST unread, the patch failed): namespace/name -> why.
    rollouts_failed: dict[str, str] = field(default_factory=dict)
    #: Caches not synced yet: the round decided nothing.
    waiting: list[str] = field(default_factory=list)


def _key(obj: Mapping) -> str:
    meta = obj["metadata"]
    return f"{meta.get('namespace')}/{meta['name']}"


def _ckey(cluster: SlurmCluster | None) -> str:
    return f"{cluster.namespace}/{cluster.name}" if cluster is not None else ""


def _slurm_ready(cluster: SlurmCluster | UnreadableCluster | None, reads: dict[str, cf.Future | None],
                 due: float) -> bool:
    """A policy can be decided: no Slurm to read, its read is in, late from
    an earlier round, or past this round's wait."""
    if not isinstance(cluster, SlurmCluster):
        return True
    future = reads.get(_ckey(cluster))
    return future is None or future.done() or time.monotonic() >= due


def transient(exc: BaseException) -> bool:
    """A failed read that may pass by itself: the API server busy (429),
    failing (5xx) or not reached. A refusal (403, 400, ...) is lasting."""
    if isinstance(exc, ApiError):
        return exc.status == 429 or exc.status >= 500
    return isinstance(exc, (OSError, TimeoutError, urllib3.exceptions.HTTPError))


def next_tick(now: float, interval: float, offset: float = 0.02) -> float:
    """When the next timed round is due (wall-clock seconds): on the next
    multiple of ``interval``, ``offset`` after it. The times a decision waits
    for (idle since, grace periods) are whole seconds on the Node, so what a
    timed round may newly do becomes possible just after a whole second."""
    return (math.floor((now - offset) / interval) + 1) * interval + offset


class Bridge:
    """One bridge: ``kube`` is a :class:`slurmk8s.kube.Kube` (or anything
    with its ``list/get/create/patch/delete/event``); ``agent`` makes the
    Slurm facade of a cluster; ``clock`` gives the time (UTC). ``view``
    (:mod:`.view`) is where Nodes, Pods, policies and clusters are read:
    by default a full read each round. ``agent_ttl``: reuse a cluster's
    agent client (its token and controller pod, read by name) this many
    seconds, until a call fails; 0: read them each round.
    ``trusted_repositories``: where a privileged slurmd's image may come
    from, as the operator is told (``--trusted-repository``): a SlurmCluster
    is judged by the one rule, :func:`slurmk8s.api.load_cluster`, with the
    same settings in both."""

    def __init__(self, kube: Any, *, agent: AgentFactory = _default_agent,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC),
                 namespaces: Iterable[str] = (), view: Any = None, agent_ttl: float = 0.0,
                 slurm_timeout: float = 5.0, trusted_repositories: Sequence[str] = (PROJECT_REPOSITORY,)):
        self.kube = kube
        self.trusted_repositories = tuple(trusted_repositories)
        self.agent = agent
        self.clock = clock
        #: Watch policies in these namespaces only; empty: every namespace.
        self.namespaces = tuple(namespaces)
        self.view = view if view is not None else Listing(kube, self.namespaces)
        self.agent_ttl = agent_ttl
        self._agents: dict[str, tuple[float, SlurmControl]] = {}
        self._agents_lock = threading.Lock()
        #: How long a round waits for a cluster's Slurm before deciding its
        #: policies with Slurm unknown.
        self.slurm_timeout = slurm_timeout
        self._pool = cf.ThreadPoolExecutor(max_workers=16, thread_name_prefix="slurm-read")
        #: cluster key -> its Slurm read still running from an earlier round
        self._reading: dict[str, cf.Future] = {}
        #: clusters whose Slurm did not answer this round (rollouts skip them)
        self._unanswered: set[str] = set()

    # Observing.

    def _policies(self) -> list[dict]:
        return self.view.policies()

    @staticmethod
    def _parse_policy(obj: dict) -> NodeLendingPolicy | InvalidPolicy:
        try:
            return load_policy(obj)
        except InvalidSpec as exc:
            meta = obj.get("metadata") or {}
            try:
                status = NodeLendingPolicyStatus.model_validate(obj.get("status") or {})
            except ValueError:
                status = None
            return InvalidPolicy(meta.get("namespace", "default"), meta.get("name", ""),
                                 tuple(str(e) for e in exc.errors), meta.get("generation"), status)

    def _load(self, obj: dict) -> SlurmCluster:
        """A SlurmCluster by the operator's rule and settings; raises InvalidSpec."""
        return load_cluster(obj, trusted_repositories=self.trusted_repositories)

    def _cluster(self, namespace: str, name: str) -> SlurmCluster | UnreadableCluster | None:
        """The SlurmCluster; None when there is none; an UnreadableCluster
        when it cannot be read or loaded (never raises: its policies are
        decided all the same, toward Kubernetes)."""
        key = f"{namespace}/{name}"
        try:
            obj = self.view.cluster(namespace, name)
        except Exception as exc:  # noqa: BLE001 - whatever the failure, the policy is decided
            log.warning("slurmcluster unreadable", cluster=key, error=str(exc), transient=transient(exc))
            return UnreadableCluster(key, f"reading it failed: {exc}", transient=transient(exc))
        if obj is None:
            return None
        try:
            return self._load(obj)
        except InvalidSpec as exc:
            problem = "; ".join(str(e) for e in exc.errors)
        except Exception as exc:  # noqa: BLE001 - a loader's own failure is no reason to skip the policy
            problem = f"{type(exc).__name__}: {exc}"
        log.warning("slurmcluster cannot be loaded: its nodes go back", cluster=key, error=problem)
        return UnreadableCluster(key, problem)

    def _agent_of(self, cluster: SlurmCluster) -> SlurmControl:
        key = f"{cluster.namespace}/{cluster.name}"
        with self._agents_lock:
            cached = self._agents.get(key)
        if cached is not None and time.monotonic() - cached[0] < self.agent_ttl:
            return cached[1]
        slurm = self._new_agent(cluster)
        if self.agent_ttl > 0:
            with self._agents_lock:
                self._agents[key] = (time.monotonic(), slurm)
        return slurm

    def _forget_agent(self, cluster: SlurmCluster) -> None:
        """A call failed: read the token and the controller pod again next time."""
        with self._agents_lock:
            self._agents.pop(f"{cluster.namespace}/{cluster.name}", None)

    def _new_agent(self, cluster: SlurmCluster) -> SlurmControl:
        secret = self.kube.get("Secret", cluster.namespace, names.agent_token_secret(cluster))
        if secret is None:
            raise RuntimeError(f"the agent token Secret {names.agent_token_secret(cluster)} is missing")
        token = base64.b64decode((secret.get("data") or {})["token"])
        pod = self.kube.get("Pod", cluster.namespace, names.controller_pod(cluster))
        return self.agent(cluster, token, pod)

    def _slurm(self, cluster: SlurmCluster) -> tuple[SlurmState, SlurmControl | None]:
        """Read a cluster's Slurm (in a worker thread: nothing here touches the round's state)."""
        try:
            slurm = self._agent_of(cluster)
            # Checkpoint times: what a reclaim of each lent node would lose (choose.at_risk).
            state = SlurmState(tuple(slurm.nodes()), tuple(slurm.jobs(checkpoints=True)),
                               reservations=self._reservations(slurm))
            metrics.SLURM_READS.labels("ok").inc()
            return state, slurm
        except Exception as exc:  # noqa: BLE001 - any failure means: Slurm unknown, fail closed
            self._forget_agent(cluster)
            metrics.SLURM_READS.labels("error").inc()
            log.warning("slurm unreadable", cluster=f"{cluster.namespace}/{cluster.name}", error=str(exc))
            return SlurmState.unknown(), None

    @staticmethod
    def _reservations(slurm: SlurmControl) -> tuple[Reservation, ...]:
        """The lending reservations. An agent older than them answers 404: it
        can hold none. Any other failure fails the whole read (fail closed)."""
        try:
            return tuple(slurm.reservations())
        except AgentError as exc:
            if exc.status == 404 and exc.kind == "not-found":
                return ()
            raise

    def _start_reads(self, clusters: Iterable[SlurmCluster]) -> dict[str, cf.Future | None]:
        """Start reading every cluster's Slurm at once. None: a read started in
        an earlier round still runs (it was late then): unknown now, no wait."""
        reads: dict[str, cf.Future | None] = {}
        for c in clusters:
            key = f"{c.namespace}/{c.name}"
            if key in reads:
                continue
            running = self._reading.get(key)
            if running is not None and not running.done():
                metrics.SLURM_READS.labels("busy").inc()
                reads[key] = None
                continue
            reads[key] = self._reading[key] = self._pool.submit(self._slurm, c)
        return reads

    def close(self) -> None:
        """Stop the read threads (those still waiting on an agent end by its deadline)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    # One round.

    def round(self) -> RoundReport:
        """One round. It never raises: an error no policy's own round caught
        (a Node or a policy that could not be read, say) is logged with its
        traceback and reported, and the loop goes on to the next round."""
        try:
            return self._round()
        except Exception as exc:  # noqa: BLE001 - no error stops the loop
            log.exception("round failed")
            metrics.ROUNDS.labels("error").inc()
            return RoundReport(errors=[f"round: {type(exc).__name__}: {exc}"])

    def _round(self) -> RoundReport:
        report = RoundReport()
        started = time.monotonic()
        report.waiting = self.view.not_synced()
        if report.waiting:  # fail closed: no decision from a cache that may have missed changes
            metrics.ROUNDS.labels("unsynced").inc()
            return report
        try:
            policy_objs = self._policies()
        except Exception as exc:  # noqa: BLE001 - any failure to list: an error of the round, reported
            report.errors.append(f"cannot list NodeLendingPolicies: {exc}")
            metrics.ROUNDS.labels("error").inc()
            return report
        policies: list[tuple[Policy, dict | None]] = [(self._parse_policy(o), o) for o in policy_objs]
        world: tuple[dict[str, dict], tuple[KubeNode, ...], tuple] | None
        try:
            world = self._world()
        except Exception as exc:  # noqa: BLE001 - any failure to list: an error of the round, reported
            report.errors.append(f"cannot list Nodes and Pods: {exc}")
            metrics.ROUNDS.labels("error").inc()
            return report
        # A policy that cannot be loaded holds its nodes no more than a deleted one.
        existing = {_key(o) for p, o in policies if o is not None and not isinstance(p, InvalidPolicy)}
        # So does a held node whose record names no policy: it is taken back by an Unattributed
        # holder (of its SlurmCluster, or of none when none can be told: every bridge takes those back).
        policies += [(gone, None) for gone in orphaned_policies(world[1], existing, self.namespaces)
                     if not self.namespaces or gone.namespace in self.namespaces
                     or (isinstance(gone, Unattributed) and gone.cluster is None)]
        # Each policy's SlurmCluster (from the cache), then every cluster's Slurm at once.
        # None is skipped: a cluster that cannot be loaded is decided toward Kubernetes.
        todo = [(policy, obj, self._policy_cluster(policy)) for policy, obj in policies]
        reads = self._start_reads(c for _, _, c in todo if isinstance(c, SlurmCluster))
        self._unanswered = set()
        due = time.monotonic() + self.slurm_timeout
        while todo:
            # Decide, in turn, every policy whose Slurm is in (or late): none waits on another's.
            ready = [t for t in todo if _slurm_ready(t[2], reads, due)]
            if not ready:
                # None of them ready: each has a SlurmCluster whose read is in flight.
                waiting = {f for _, _, c in todo if isinstance(c, SlurmCluster) and (f := reads[_ckey(c)]) is not None}
                cf.wait(waiting, timeout=max(due - time.monotonic(), 0), return_when=cf.FIRST_COMPLETED)
                continue
            for item in ready:
                todo.remove(item)
                policy, obj, cluster = item
                slurm_state, slurm = SlurmState.unknown(), None
                if isinstance(cluster, SlurmCluster):
                    slurm_state, slurm = self._slurm_result(cluster, reads)
                acted = len(report.applied) + len(report.failed)
                try:
                    if world is None:  # the previous policy changed Nodes or Pods: read them again
                        world = self._world()
                    self._policy_round(policy, obj, world, report, cluster, slurm_state, slurm)
                except Exception as exc:  # noqa: BLE001 - one policy's failure must not stop the others
                    report.errors.append(f"{policy.key}: {exc}")
                    log.exception("policy round failed", policy=getattr(policy, "key", "?"))
                if len(report.applied) + len(report.failed) != acted:
                    world = None
        try:
            self._rollouts(report)
        except Exception as exc:  # noqa: BLE001 - rollouts never hold up lending
            report.errors.append(f"model-version rollouts: {exc}")
            log.exception("rollouts failed")
        metrics.ROUND_SECONDS.observe(time.monotonic() - started)
        problem = report.failed or report.rollouts_failed
        metrics.ROUNDS.labels("error" if report.errors else ("problem" if problem else "ok")).inc()
        return report

    def _rollouts(self, report: RoundReport) -> None:
        """Roll serving Deployments to the model versions jobs published
        (slurmk8s/bridge/rollout.py), in the namespaces of SlurmClusters with a
        checkpoint directory; ``LATEST`` is read through each cluster's agent."""
        namespaces = self.namespaces or (None,)
        clusters: dict[str, list[tuple[str, SlurmCluster]]] = {}  # namespace -> (checkpoint directory, cluster)
        for ns in namespaces:
            for obj in self.view.clusters(ns):
                try:
                    c = self._load(obj)
                except InvalidSpec:
                    continue
                if (storage := c.spec.shared_storage) and storage.checkpoint_dir:
                    clusters.setdefault(c.namespace, []).append((storage.checkpoint_dir, c))
        if not clusters:
            return
        agents: dict[str, SlurmControl] = {}  # one per cluster and round, however many Deployments follow it

        def agent(cluster: SlurmCluster) -> SlurmControl:
            key = f"{cluster.namespace}/{cluster.name}"
            if key not in agents:
                agents[key] = self._agent_of(cluster)
            return agents[key]

        for namespace, found in sorted(clusters.items()):
            roots = dict(found)

            def read_file(path: str, roots=roots) -> str:
                model_dir = posixpath.dirname(path)
                owner = next(c for root, c in roots.items() if model_dir == root or model_dir.startswith(root + "/"))
                if _ckey(owner) in self._unanswered:  # its agent did not answer this round: do not wait on it
                    raise OSError(f"the Slurm agent of {_ckey(owner)} did not answer this round")
                try:
                    return agent(owner).published(model_dir)
                except AgentError as exc:  # the agent refused or did not answer: this Deployment waits
                    raise OSError(str(exc)) from None

            done = apply_rollouts(self.kube, read_file, sorted(roots), namespace=namespace)
            report.rolled.update(done.rolled)
            report.rollouts_failed.update(done.failed)
            for result, count in (("rolled", len(done.rolled)), ("failed", len(done.failed)),
                                  ("invalid", len(done.invalid))):
                metrics.ROLLOUTS.labels(result).inc(count)

    def _world(self) -> tuple[dict[str, dict], tuple[KubeNode, ...], tuple]:
        """Nodes (as the API returns them, and parsed) and Pods, as they are now."""
        return self.view.world()

    def _policy_cluster(self, policy: Policy) -> SlurmCluster | UnreadableCluster | None:
        """The SlurmCluster a policy's nodes are lent to (None: there is none,
        or an invalid policy; UnreadableCluster: it cannot be loaded)."""
        if isinstance(policy, NodeLendingPolicy):
            return self._cluster(policy.namespace, policy.spec.cluster_ref.name)
        if isinstance(policy, (PolicyGone, Unattributed)) and policy.cluster:
            namespace, _, name = policy.cluster.partition("/")
            return self._cluster(namespace, name)
        return None

    def _slurm_result(self, cluster: SlurmCluster,
                      reads: dict[str, cf.Future | None]) -> tuple[SlurmState, SlurmControl | None]:
        """The cluster's Slurm as read this round; unknown when it was late."""
        future = reads.get(_ckey(cluster))
        if future is not None and future.done():
            return future.result()
        if future is not None:
            metrics.SLURM_READS.labels("late").inc()
            log.warning("slurm late", cluster=_ckey(cluster), seconds=self.slurm_timeout)
        self._unanswered.add(_ckey(cluster))
        return SlurmState.unknown(), None

    def _budgets(self) -> frozenset[tuple[str, str]] | None:
        """The lent pods' PodDisruptionBudgets; None when they cannot be read
        (decide's budget rule then waits)."""
        try:
            return self.view.budgets()
        except Exception as exc:  # noqa: BLE001 - unknown budgets: nothing about them changes
            log.warning("poddisruptionbudgets unreadable", error=str(exc))
            return None

    def _policy_round(self, policy: Policy, obj: dict | None, world: tuple, report: RoundReport,
                      found: SlurmCluster | UnreadableCluster | None, slurm_state: SlurmState,
                      slurm: SlurmControl | None) -> None:
        node_objs, nodes, pods = dict(world[0]), world[1], world[2]
        cluster = found if isinstance(found, SlurmCluster) else None
        unreadable = found if isinstance(found, UnreadableCluster) else None
        observed = Observed(nodes, pods, cluster, slurm_state, unreadable, self._budgets())
        now = self.clock()
        todo = decide(observed, policy, now)
        ctx = _Acting(self, cluster, slurm, node_objs, {n.name: n for n in nodes}, obj, policy, now, report)
        ctx.run(todo)
        # The gauges show the nodes as this round left them.
        after = Observed(tuple(ctx.nodes.values()), pods, cluster, slurm_state, unreadable)
        metrics.observe_nodes(policy.key, lending_metrics(after))

    def run_forever(self, interval: float, stop: Callable[[], bool] = lambda: False, *,
                    settle: float = 0.05) -> None:
        """Run rounds until ``stop()`` says so: on each multiple of
        ``interval`` seconds (:func:`next_tick`), and when the view reports
        a change that matters, ``settle`` seconds after it (so that a burst
        of events makes one round). A round that acted is followed by
        another ``settle`` seconds later, since what it did may let the next
        step go at once (an idle time recorded with ``idleAfterSeconds`` 0:
        lend), up to ``FOLLOW_UPS`` in a row. After rounds that acted, the
        next timed round comes on the next whole second: what they started
        (a signal's grace period) falls due on a whole second."""
        waiting_since: float | None = None
        follow_ups = 0
        while not stop():
            report = self.round()
            if report.waiting:
                waiting_since = waiting_since or time.monotonic()
                if time.monotonic() - waiting_since > 30:
                    log.warning("caches not synced: deciding nothing", waiting=report.waiting)
            else:
                waiting_since = None
            for error in report.errors:
                log.warning("round error", error=error)
            for action, why in report.failed:
                log.warning("action failed", action=type(action).__name__, node=A.node_of(action), error=why)
            for deployment, why in report.rollouts_failed.items():
                log.warning("rollout failed", deployment=deployment, error=why)
            now = time.time()
            acted = bool(report.applied or report.failed)
            if report.applied and follow_ups < FOLLOW_UPS:
                follow_ups += 1
                time.sleep(settle)
                continue
            step = min(interval, 1.0) if acted or follow_ups else interval
            follow_ups = 0
            if self.view.wait(next_tick(now, step) - now, stop):
                time.sleep(settle)


#: Rounds in a row that come ``settle`` seconds after a round that acted
#: (:meth:`Bridge.run_forever`): enough for lend (record idle, then lend)
#: and bounded, so that a round that acts every time cannot spin.
FOLLOW_UPS = 3


class _Acting:
    """Applies one policy's actions for one round: the Slurm steps and the
    chain rule are the one executor's (:func:`slurmk8s.slurm.steps.execute`);
    the Kubernetes actions are applied here."""

    def __init__(self, bridge: Bridge, cluster: SlurmCluster | None, slurm: SlurmControl | None,
                 node_objs: dict[str, dict], nodes: dict[str, KubeNode], policy_obj: dict | None,
                 policy: Policy, now: datetime, report: RoundReport):
        self.b, self.kube = bridge, bridge.kube
        self.cluster, self.slurm = cluster, slurm
        self.node_objs, self.nodes = node_objs, nodes
        self.policy_obj, self.policy, self.now, self.report = policy_obj, policy, now, report

    def run(self, todo: list) -> None:
        done = steps.execute(self.slurm, todo, other=self.apply, chain=A.node_of)
        for event in done.refusals:  # jobs Slurm refused: their steps count as done
            self.apply_safely(event)
        self.report.applied += done.applied
        self.report.failed += done.failed
        self.report.skipped += done.skipped
        for action in done.applied:
            metrics.ACTIONS.labels(type(action).__name__, "ok").inc()
        for action, _ in done.failed:
            metrics.ACTIONS.labels(type(action).__name__, "failed").inc()
        for outcome, count in done.jobs.items():
            metrics.JOBS.labels(outcome).inc(count)

    def apply_safely(self, event: Event) -> None:
        try:
            self.event(event)
        except Exception as exc:  # noqa: BLE001 - a report that could not be posted
            self.report.failed.append((event, str(exc)))

    def apply(self, action: Any) -> None:
        """One action that is not a Slurm step."""
        if isinstance(action, NODE_PATCH_ACTIONS):
            self.patch_node(action)
        elif isinstance(action, A.CreateSlurmdPod):
            self.create_pod(action)
        elif isinstance(action, A.DeleteSlurmdPod):
            self.kube.delete("Pod", action.namespace, action.name)
        elif isinstance(action, A.CreateBudget):
            self.create_budget(action)
        elif isinstance(action, A.DeleteBudget):
            self.kube.delete("PodDisruptionBudget", action.namespace, action.name)
        elif isinstance(action, Event):
            self.event(action)
        elif isinstance(action, A.PolicyStatus):
            self.kube.patch("NodeLendingPolicy", action.namespace, action.name,
                            {"status": action.status.dump()}, subresource="status")
        else:
            raise TypeError(f"the loop does not know {type(action).__name__}")

    def patch_node(self, action: Any) -> None:
        node = self.nodes[action.node]
        patch = node_patch(action, node)
        if isinstance(action, (A.Taint, A.Untaint)):
            rv = self.node_objs[action.node]["metadata"].get("resourceVersion")
            patch = {**patch, "metadata": {**patch.get("metadata", {}), "resourceVersion": rv}}
        before = node.record
        updated = {**self.kube.patch("Node", None, action.node, patch), "kind": "Node", "apiVersion": "v1"}
        self.b.view.wrote(updated)
        self.node_objs[action.node] = updated
        self.nodes[action.node] = node_from_api(updated)
        self.observe_latency(action, before)
        if isinstance(action, A.RecordDownOwed):
            metrics.RECLAIMS_OVERDUE.labels(action.policy).inc()

    def observe_latency(self, action: Any, before: Any) -> None:
        since = before.since
        if since is None:
            return
        seconds = max((self.now - since).total_seconds(), 0.0)
        if isinstance(action, A.SetLendingState) and action.state == LENT:
            metrics.LEND_SECONDS.observe(seconds)
        elif isinstance(action, A.ClearLending) and before.state == RECLAIMING:
            metrics.RECLAIM_SECONDS.labels(before.reason or "unknown").observe(seconds)

    def _rendering(self) -> tuple[SlurmCluster, str]:
        """The SlurmCluster and its config hash, which what the bridge renders is made from."""
        if self.cluster is None:
            raise RuntimeError("the SlurmCluster is gone")
        return self.cluster, (self.cluster.status.config_hash if self.cluster.status else None) or ""

    def _create_or_adopt(self, obj: dict, ours: Callable[[dict], bool], what: str) -> None:
        """Create ``obj``; one of its name that ``ours`` accepts (a bridge killed mid-round
        made it) is fine, anyone else's fails the action, naming it as ``what``."""
        try:
            created = self.kube.create(obj)
        except Exception as exc:
            if getattr(exc, "status", None) != 409:
                raise
            meta = obj["metadata"]
            if not ours(self.kube.get(obj["kind"], meta["namespace"], meta["name"]) or {}):
                raise RuntimeError(f"{obj['kind'].lower()} {meta['namespace']}/{meta['name']} exists and is not "
                                   f"{what}") from None
            return
        self.b.view.wrote({**created, "kind": obj["kind"], "apiVersion": obj["apiVersion"]})

    def create_pod(self, action: A.CreateSlurmdPod) -> None:
        c, chash = self._rendering()
        node = self.nodes[action.node]
        pod = lent_slurmd_pod(c, chash, node=action.node, resources=dict(action.resources),
                              labels=node.labels, partition=action.partition, shm_size=action.shm_size,
                              taint_key=TAINT_KEY, grace_seconds=action.grace_seconds,
                              pod_template=action.pod_template)
        self._create_or_adopt(pod, lambda existing: is_lent_slurmd_pod(
            (existing.get("metadata") or {}).get("labels") or {}, (existing.get("spec") or {}).get("nodeName"),
            c.name, action.node), f"the slurmd pod of node {action.node} lent to {c.name}")

    def create_budget(self, action: A.CreateBudget) -> None:
        """The lent pod's PodDisruptionBudget, as the renderer makes it. One of
        that name that is already a lent pod's budget (a bridge killed
        mid-round made it) is fine; anyone else's fails the action."""
        c, chash = self._rendering()
        budget = lent_budget(c, chash, node=action.node, pod_uid=action.pod_uid)
        want = (LENT_COMPONENT, LENT_MANAGER, names.lent_node_label(action.node))

        def ours(existing: dict) -> bool:
            labels = (existing.get("metadata") or {}).get("labels") or {}
            return (labels.get("app.kubernetes.io/component"), labels.get("app.kubernetes.io/managed-by"),
                    labels.get(names.LENT_NODE_LABEL)) == want

        self._create_or_adopt(budget, ours, f"the budget of node {action.node}'s lent pod")

    def event(self, action: Event) -> None:
        if action.kind == "Node":
            involved = self.node_objs.get(action.name) or {"kind": "Node", "apiVersion": "v1",
                                                           "metadata": {"name": action.name}}
            involved = {**involved, "kind": "Node", "apiVersion": "v1"}
        elif self.policy_obj is not None and action.name == self.policy_obj["metadata"]["name"]:
            involved = {**self.policy_obj, "kind": "NodeLendingPolicy", "apiVersion": API_VERSION}
        else:
            involved = {"kind": action.kind, "apiVersion": "slurmk8s.dev/v1alpha1",
                        "metadata": {"name": action.name, "namespace": action.namespace}}
        self.kube.event(involved, action.type, action.reason, action.message, component=COMPONENT)
