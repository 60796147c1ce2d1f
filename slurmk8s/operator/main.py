"""The operator's entry point: :func:`run` (the ``slurmk8s operator`` command calls it)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Collection, Sequence

import kopf

from slurmk8s import log
from slurmk8s.api.cluster import PROJECT_REPOSITORY
from slurmk8s.health import Health
from slurmk8s.kube import Kube
from slurmk8s.leader import Timing, lead, lease_name, legacy_lease_name
from slurmk8s.render.manifests import AgentClients

from . import metrics
from .handlers import register
from .round import Operator
from .webhookmain import DEFAULT_CERT_DIR, KeptCertificate
from .webhookmain import start as start_webhook

__all__ = ["run", "build", "LEASE_NAME", "DEFAULT_CERT_DIR"]
#: The operator's Lease without a release name, in its own namespace: of its replicas, only the holder acts
#: (with one: ``slurmk8s.leader.lease_name("operator", release)``).
LEASE_NAME = legacy_lease_name("operator")


def build(kubeconfig: str | None = None, *, interval: float = 10.0, agent_clients: AgentClients | None = None,
          trusted_repositories: Sequence[str] = (PROJECT_REPOSITORY,),
          identity: str | None = None, shared_storage_class: str | None = None) -> tuple[kopf.OperatorRegistry, Operator]:
    """A registry with the SlurmCluster handlers, and the Operator behind them
    (``identity``: its name in the Lease, for status.leader)."""
    op = Operator(Kube.from_kubeconfig(kubeconfig), agent_clients=agent_clients,
                  trusted_repositories=trusted_repositories, identity=identity,
                  shared_storage_class=shared_storage_class)
    registry = kopf.OperatorRegistry()
    register(registry, op, interval=interval)
    return registry, op


def run(*, namespaces: Collection[str] = (), all_namespaces: bool = False, kubeconfig: str | None = None,
        metrics_port: int | None = None, health_port: int | None = None, interval: float = 10.0,
        agent_clients: AgentClients | None = None,
        trusted_repositories: Sequence[str] = (PROJECT_REPOSITORY,), webhook_port: int | None = None,
        webhook_cert_dir: str | None = None, webhook_kept: KeptCertificate | None = None,
        lease_namespace: str | None = None, lease_seconds: float = 15, release_name: str | None = None,
        shared_storage_class: str | None = None) -> None:
    """Run the operator until stopped (SIGINT/SIGTERM).

    Watches SlurmClusters in ``namespaces``, or in every namespace with
    ``all_namespaces``. ``lease_namespace``: stand by until this replica
    holds the operator's Lease there (:mod:`slurmk8s.leader`), then run
    kopf (standalone: the Lease, not kopf's peering, keeps a second replica
    out), and exit if the Lease is lost; None runs without an election (one
    replica only). The Lease is ``release_name``'s (:func:`slurmk8s.leader.lease_name`),
    of ``lease_seconds``. ``/healthz`` answers on ``health_port``, from a standby
    too. ``agent_clients``: the operator's and the bridge's pods (from the
    chart), admitted to each cluster's agent by a NetworkPolicy; None
    admits any pod (and says so). ``trusted_repositories``: the image
    repositories a privileged slurmd (``slurmConfig.cgroups``) may come from.
    ``webhook_port``: serve the validating admission webhook there, with the
    certificate in ``webhook_cert_dir``, or with the one it keeps in
    ``webhook_kept`` (:mod:`.webhookmain`); every replica serves it, leading
    or not. ``shared_storage_class``: the StorageClass of a shared claim
    whose spec names none (None: such a spec is refused; the rounds and the
    webhook judge alike, :mod:`slurmk8s.api.storageclass`).
    """
    if not namespaces and not all_namespaces:
        raise ValueError("name the namespaces to watch (--namespace, repeatable) or pass --all-namespaces")
    if kubeconfig:
        # kopf's own API client loads credentials through our login handler;
        # set KUBECONFIG too for anything that reads the default location.
        os.environ["KUBECONFIG"] = kubeconfig
    if agent_clients is None:
        log.get("slurmk8s.operator").warning(
            "no --release-namespace and --release-name: the clusters' NetworkPolicies admit every pod "
            "to their Slurm agents (each request still needs the cluster's token)")
    hook = None
    if webhook_port:
        # First: a replica that answers /healthz (Ready) serves the webhook with a trusted certificate.
        hook = start_webhook(webhook_port, trusted_repositories, kubeconfig=kubeconfig, kept=webhook_kept,
                             cert_dir=None if webhook_kept else (webhook_cert_dir or DEFAULT_CERT_DIR),
                             shared_storage_class=shared_storage_class)
    health = Health()
    if health_port:
        health.serve(health_port)
    if metrics_port is not None:
        metrics.serve(metrics_port)
    elector = None
    try:
        if lease_namespace:
            # Until kopf installs its own, SIGTERM and SIGINT end the wait.
            stop = threading.Event()
            before = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
            elector = lead(kubeconfig, lease_namespace, lease_name("operator", release_name), "operator", health,
                           stop.is_set, timing=Timing.for_lease(lease_seconds), legacy=LEASE_NAME)
            for sig, handler in before.items():
                signal.signal(sig, handler)
            if elector is None:
                return
        registry, _ = build(kubeconfig, interval=interval, agent_clients=agent_clients,
                            trusted_repositories=trusted_repositories, identity=elector.me if elector else None,
                            shared_storage_class=shared_storage_class)
        last_beat = time.monotonic()

        async def beating() -> None:
            nonlocal last_beat
            while True:
                last_beat = time.monotonic()
                await asyncio.sleep(1.0)

        async def operate() -> None:
            beat = asyncio.create_task(beating())
            try:
                await kopf.operator(registry=registry, standalone=True, clusterwide=all_namespaces,
                                    namespaces=() if all_namespaces else list(namespaces))
            finally:
                beat.cancel()

        # Live while kopf's event loop turns (a blocked loop runs no round).
        health.watch("eventLoop", lambda: last_beat, stale=60.0)
        asyncio.run(operate())
    finally:
        if elector is not None:
            elector.stop()
        if hook is not None:
            hook.stop()
