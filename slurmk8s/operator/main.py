"""The operator's entry point: :func:`run` (the ``slurmk8s operator`` command calls it)."""

from __future__ import annotations

import asyncio
import os
from typing import Collection, Sequence

import kopf

from slurmk8s import log
from slurmk8s.api.cluster import PROJECT_REPOSITORY
from slurmk8s.render.manifests import AgentClients

from .round import Operator
from .handlers import register
from .webhook import WebhookServer

#: Where the chart mounts the webhook's certificate (tls.crt, tls.key).
DEFAULT_CERT_DIR = "/etc/slurmk8s/webhook"
from slurmk8s.kube import Kube

__all__ = ["run", "build"]


def build(kubeconfig: str | None = None, *, interval: float = 10.0, metrics_port: int | None = None,
          agent_clients: AgentClients | None = None,
          trusted_repositories: Sequence[str] = (PROJECT_REPOSITORY,)) -> tuple[kopf.OperatorRegistry, Operator]:
    """A registry with the SlurmCluster handlers, and the Operator behind them."""
    op = Operator(Kube.from_kubeconfig(kubeconfig), agent_clients=agent_clients,
                  trusted_repositories=trusted_repositories)
    registry = kopf.OperatorRegistry()
    register(registry, op, interval=interval, metrics_port=metrics_port)
    return registry, op


def run(*, namespaces: Collection[str] = (), all_namespaces: bool = False, kubeconfig: str | None = None,
        metrics_port: int | None = None, health_port: int | None = None, interval: float = 10.0,
        stop_flag=None, ready_flag=None, agent_clients: AgentClients | None = None,
        trusted_repositories: Sequence[str] = (PROJECT_REPOSITORY,), webhook_port: int | None = None,
        webhook_cert_dir: str | None = None) -> None:
    """Run the operator until stopped (SIGINT/SIGTERM, or ``stop_flag``).

    Watches SlurmClusters in ``namespaces``, or in every namespace with
    ``all_namespaces``. Standalone: no peering objects are needed. kopf's
    liveness endpoint answers on ``health_port`` at ``/healthz``.
    ``agent_clients``: the operator's and the bridge's pods (from the
    chart), admitted to each cluster's agent by a NetworkPolicy; None
    admits any pod (and says so). ``trusted_repositories``: the image
    repositories a privileged slurmd (``slurmConfig.cgroups``) may come from.
    ``webhook_port``: serve the validating admission webhook there, with the
    certificate in ``webhook_cert_dir`` (:mod:`.webhook`).
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
    registry, _ = build(kubeconfig, interval=interval, metrics_port=metrics_port, agent_clients=agent_clients,
                        trusted_repositories=trusted_repositories)
    liveness = f"http://0.0.0.0:{health_port}/healthz" if health_port else None
    hook = None
    if webhook_port:
        hook = WebhookServer(webhook_port, webhook_cert_dir or DEFAULT_CERT_DIR, trusted_repositories).start()
    try:
        asyncio.run(kopf.operator(
        registry=registry, standalone=True, clusterwide=all_namespaces,
            namespaces=() if all_namespaces else list(namespaces), liveness_endpoint=liveness,
            stop_flag=stop_flag, ready_flag=ready_flag,
        ))
    finally:
        if hook is not None:
            hook.stop()
