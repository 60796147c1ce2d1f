"""The bridge's entry point: :func:`run` (the ``slurmk8s bridge`` command calls it)."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Collection, Sequence
from typing import Any

import structlog

from ..api.cluster import PROJECT_REPOSITORY
from ..health import Health
from ..kube import Kube
from ..leader import Timing, lead, lease_name, legacy_lease_name
from ..metricsserver import serve_metrics
from .loop import FIELD_MANAGER, Bridge
from .view import Watching

__all__ = ["run", "watching_bridge", "LEASE_NAME"]

#: The bridge's Lease without a release name, in its own namespace: of its replicas, only the holder acts
#: (with one: ``slurmk8s.leader.lease_name("bridge", release)``).
LEASE_NAME = legacy_lease_name("bridge")

#: How long a cluster's agent client (its token Secret and controller pod) is reused, until a call fails.
AGENT_TTL = 300.0

log = structlog.get_logger("slurmk8s.bridge")


def watching_bridge(kube: Kube, namespaces: Collection[str] = (), **kwargs: Any) -> Bridge:
    """The bridge as ``slurmk8s bridge`` runs it: watch-fed caches (started
    here), agent clients reused for :data:`AGENT_TTL`. ``namespaces``: empty
    for every namespace. ``kwargs`` go to :class:`Bridge` (e.g. ``agent``)."""
    view = Watching(kube, namespaces).start()
    return Bridge(kube, namespaces=namespaces, view=view, agent_ttl=AGENT_TTL, **kwargs)


def run(*, namespaces: Collection[str] = (), all_namespaces: bool = False, kubeconfig: str | None = None,
        metrics_port: int | None = None, health_port: int | None = None, interval: float = 2.0,
        lease_namespace: str | None = None, lease_seconds: float = 15, release_name: str | None = None,
        trusted_repositories: Sequence[str] = (PROJECT_REPOSITORY,)) -> None:
    """Run the bridge until SIGTERM or SIGINT: a round every ``interval`` seconds, and when a watched change matters.

    ``lease_namespace``: stand by until this replica holds the bridge's Lease
    there (:mod:`slurmk8s.leader`; the Lease is ``release_name``'s, of
    ``lease_seconds``), and exit if it loses it; None runs without an
    election (one replica only). ``trusted_repositories``: the operator's
    (``--trusted-repository``), so that both judge a SlurmCluster alike.
    """
    if not namespaces and not all_namespaces:
        raise ValueError("name the namespaces to watch (--namespace, repeatable) or pass --all-namespaces")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if metrics_port:
        serve_metrics(metrics_port)
    health = Health()
    if health_port:
        health.serve(health_port)
    elector = None
    if lease_namespace:
        elector = lead(kubeconfig, lease_namespace, lease_name("bridge", release_name), "bridge", health, stop.is_set,
                       timing=Timing.for_lease(lease_seconds), legacy=LEASE_NAME)
        if elector is None:
            return
    kube = Kube.from_kubeconfig(kubeconfig, field_manager=FIELD_MANAGER)
    bridge = watching_bridge(kube, () if all_namespaces else tuple(namespaces),
                             trusted_repositories=trusted_repositories)
    last_round = time.monotonic()
    health.watch("lastRound", lambda: last_round, stale=max(60.0, 10 * interval))
    log.info("bridge started", namespaces=list(namespaces) or "all", interval=interval)

    def stopped() -> bool:
        nonlocal last_round
        last_round = time.monotonic()
        return stop.is_set()

    try:
        bridge.run_forever(interval, stop=stopped)
    finally:
        bridge.view.close()
        if elector is not None:
            elector.stop()
    log.info("bridge stopped")
