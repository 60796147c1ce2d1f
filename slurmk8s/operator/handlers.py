"""The kopf handlers: thin. Every round is :meth:`.round.Operator.reconcile`.

:func:`register` puts the handlers on a kopf registry:

- create / update / resume of a SlurmCluster: one round (render, plan,
  apply, drain-first scale-in, rolling updates, reconfigure, status);
- a daemon per SlurmCluster that runs a round every ``interval`` seconds,
  and every HURRY_SECONDS while a round says so (``Outcome.hurry``: an evacuation
  waits for signalled jobs that may requeue themselves, to start them again
  at once instead of after Slurm's requeue delay); after rounds that failed,
  later and later (:func:`slurmk8s.backoff.round_backoff`: doubling with
  jitter, at most ROUND_BACKOFF_CAP), back to ``interval`` after one that
  did not. A failed round is logged with its cluster, step, exception type
  and traceback, and its Events (those it had found, and a ``RoundFailed``
  Warning) are posted all the same;
- delete: the finalizer ``slurmk8s.dev/teardown`` runs an orderly teardown;
- login: the credentials the operator's own client uses;
- startup: kopf's settings (annotations for its bookkeeping, the finalizer
  name, no peering: the leader election of :mod:`slurmk8s.leader` keeps a
  second replica from running these at all).

Rounds of one cluster never overlap (a lock per cluster uid; kopf's timers
run beside its change handlers). The lock is only that: all state lives in
the API server and in Slurm.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import defaultdict
from typing import Any

import kopf

from slurmk8s import log
from slurmk8s.api.cluster import GROUP, PLURAL, VERSION
from slurmk8s.backoff import ROUND_BACKOFF_CAP, round_backoff
from slurmk8s.events import Event
from slurmk8s.render import names

from . import metrics
from .diffbase import DigestDiffBaseStorage
from .round import Operator, RoundFailed

__all__ = ["register", "Handlers", "FINALIZER", "ROUND_BACKOFF_CAP"]

FINALIZER = f"{GROUP}/teardown"
_log = log.get("slurmk8s.operator")


#: Seconds between rounds while a round asks to hurry.
HURRY_SECONDS = 0.5


class Handlers:
    def __init__(self, op: Operator, interval: float = 10.0):
        self.op = op
        self.interval = interval
        self._locks: dict[str, threading.Lock] = defaultdict(threading.Lock)
        self._guard = threading.Lock()
        #: When each cluster's next round is due (time.monotonic()).
        self._due: dict[str, float] = {}
        #: Rounds of each cluster that failed in a row (its backoff).
        self.failures: dict[str, int] = {}

    @staticmethod
    def _key(body: Any) -> str:
        return body["metadata"].get("uid") or body["metadata"]["name"]

    def _lock(self, body: Any) -> threading.Lock:
        with self._guard:
            return self._locks[self._key(body)]

    def rounds(self, stopped: Any, body: kopf.Body, **_: Any) -> None:
        """The kopf daemon of one SlurmCluster: a round whenever one is due."""
        key = self._key(body)
        self._due.setdefault(key, time.monotonic() + self.interval)  # create/resume ran the first round
        while not stopped:
            if time.monotonic() >= self._due.get(key, 0.0):
                try:
                    self.reconcile(body)
                except kopf.TemporaryError:
                    pass  # reconcile set when the next round is due
            stopped.wait(min(HURRY_SECONDS, self.interval))

    def reconcile(self, body: kopf.Body, **_: Any) -> None:
        if body["metadata"].get("deletionTimestamp"):
            return  # the teardown handler owns a cluster being deleted
        started = time.monotonic()
        key = self._key(body)
        with self._lock(body):
            try:
                outcome = self.op.reconcile(dict(body))
            except Exception as exc:
                raise self._failed(body, exc) from exc
            self.failures.pop(key, None)
            self._due[key] = time.monotonic() + (HURRY_SECONDS if outcome.hurry else self.interval)
        metrics.ROUND_SECONDS.observe(time.monotonic() - started)
        metrics.RECONCILES.labels(result="problem" if outcome.problems else "ok").inc()
        metrics.observe_cluster(body["metadata"].get("namespace", ""), body["metadata"]["name"], outcome)
        self.op.announce(dict(body), outcome.events)
        for what in outcome.applied:
            _log.info("applied", cluster=body["metadata"]["name"], action=what)

    def _failed(self, body: kopf.Body, exc: Exception) -> kopf.TemporaryError:
        """A round that raised: back off, log it with its context, post its
        Events; the error for kopf to retry the handler after the backoff."""
        key = self._key(body)
        meta = body["metadata"]
        cluster = f"{meta.get('namespace', '')}/{meta['name']}"
        step: str = "start"
        cause: BaseException = exc
        if isinstance(exc, RoundFailed):
            step, cause = exc.step, exc.__cause__ or exc
        failures = self.failures.get(key, 0) + 1
        self.failures[key] = failures
        delay = round_backoff(failures, self.interval)
        self._due[key] = time.monotonic() + delay
        metrics.RECONCILES.labels(result="error").inc()
        _log.warning("round failed", cluster=cluster, step=step, error_type=type(cause).__name__,
                     error=str(cause)[:2000], failures=failures, retry_in=round(delay, 1),
                     exc_info=(type(cause), cause, cause.__traceback__))
        events = list(exc.outcome.events) if isinstance(exc, RoundFailed) else []
        # Named by step and exception type: announced once while Kubernetes keeps it.
        events.append(Event("Warning", "RoundFailed",
                            f"the round failed at {step}: {type(cause).__name__}: {cause}; next round in "
                            f"{delay:.0f} s", name=f"{step}: {type(cause).__name__}"))
        try:
            self.op.announce(dict(body), events)
        except Exception:  # noqa: BLE001 - the log line says it all the same
            _log.warning("could not post the failed round's Events", cluster=cluster, exc_info=True)
        return kopf.TemporaryError(f"round failed at {step}: {type(cause).__name__}: {cause}", delay=delay)

    def teardown(self, body: kopf.Body, retry: int = 0, **_: Any) -> None:
        with self._lock(body):
            done, why = self.op.teardown(dict(body), attempt=retry)
        if not done:
            raise kopf.TemporaryError(why, delay=10)
        metrics.forget_cluster(body["metadata"].get("namespace", ""), body["metadata"]["name"])
        kopf.info(body, reason="Deleted", message="Slurm nodes drained and the cluster's objects deleted")


def register(registry: kopf.OperatorRegistry, op: Operator, *, interval: float = 10.0) -> Handlers:
    """Register the SlurmCluster handlers of ``op`` on ``registry``."""
    h = Handlers(op, interval)
    resource: dict[str, Any] = dict(group=GROUP, version=VERSION, plural=PLURAL, registry=registry)
    kopf.on.create(**resource, id="reconcile-create")(h.reconcile)
    kopf.on.update(**resource, id="reconcile-update", field="spec")(h.reconcile)
    kopf.on.resume(**resource, id="reconcile-resume")(h.reconcile)
    kopf.daemon(**resource, id="reconcile-rounds", cancellation_timeout=5.0)(h.rounds)
    kopf.on.delete(**resource, id="teardown")(h.teardown)

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        cfg = op.kube.configuration
        token = op.kube.bearer_token()
        return kopf.ConnectionInfo(
            server=cfg.host, ca_path=cfg.ssl_ca_cert or None, insecure=not cfg.verify_ssl,
            username=cfg.username or None, password=cfg.password or None,
            scheme="Bearer" if token else None, token=token,
            certificate_path=cfg.cert_file or None, private_key_path=cfg.key_file or None,
        )

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        # kopf's own bookkeeping goes to annotations (the status schema is
        # ours), and of the last spec handled only a digest (diffbase.py).
        settings.persistence.finalizer = FINALIZER
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
        settings.persistence.diffbase_storage = DigestDiffBaseStorage()
        settings.posting.level = logging.INFO
        # kopf's own Events say who posted them as the operator's do, not "kopf".
        settings.posting.reporting_component = names.FIELD_MANAGER
        settings.posting.reporting_instance = os.environ.get("HOSTNAME", names.FIELD_MANAGER)
        settings.posting.event_name_prefix = f"{names.FIELD_MANAGER}-"
        settings.execution.max_workers = 8

    return h
