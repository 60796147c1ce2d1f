"""The validating webhook as a process runs it: the server (:mod:`.webhook`)
with its certificate either mounted (cert-manager's Secret) or kept by this
process (:mod:`.certkeeper`; decision record 53). The operator serves it on
every replica (``slurmk8s operator --webhook-port``); with the chart's
``webhook.hostNetwork`` a Deployment of its own does (``slurmk8s webhook``),
so that the operator itself stays on the pod network.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from slurmk8s import log
from slurmk8s.api.cluster import PROJECT_REPOSITORY
from slurmk8s.kube import Kube

from .certkeeper import CertKeeper
from .webhook import WebhookServer

__all__ = ["KeptCertificate", "Webhook", "start", "run", "DEFAULT_CERT_DIR"]

#: Where a mounted certificate (tls.crt, tls.key) is by default: where the chart mounts cert-manager's Secret.
DEFAULT_CERT_DIR = "/etc/slurmk8s/webhook"

_log = log.get("slurmk8s.operator.webhook")


@dataclass(frozen=True)
class KeptCertificate:
    """Where the process keeps the webhook's certificate: its Secret and Service in
    ``namespace`` (the release's), and the ValidatingWebhookConfiguration."""

    namespace: str
    secret: str
    configuration: str
    service: str


class Webhook:
    """A started webhook server and, when it keeps its certificate, its keeper."""

    def __init__(self, server: WebhookServer, keeper: CertKeeper | None):
        self.server, self.keeper = server, keeper

    @property
    def port(self) -> int:
        return self.server.port

    def stop(self) -> None:
        if self.keeper is not None:
            self.keeper.stop()
        self.server.stop()


def start(port: int, trusted_repositories: Sequence[str] = (PROJECT_REPOSITORY,), *, cert_dir: str | None = None,
          kept: KeptCertificate | None = None, kubeconfig: str | None = None, kube: Kube | None = None,
          addr: str = "0.0.0.0", first_wait: float = 30.0, shared_storage_class: str | None = None) -> Webhook:
    """Serve the webhook on ``port`` with the certificate in ``cert_dir``, or with the one
    kept in ``kept`` (exactly one of them). A kept certificate is in place, and served,
    when this returns, unless that took longer than ``first_wait`` seconds (then it goes
    on trying in the background): so a replica that reports Ready serves the webhook.
    ``shared_storage_class``: as the operator's (:mod:`slurmk8s.api.storageclass`)."""
    if (cert_dir is None) == (kept is None):
        raise ValueError("the webhook's certificate: give either the directory it is mounted in or the Secret "
                         "this process keeps it in, not both and not neither")
    server = WebhookServer(port, cert_dir, trusted_repositories, addr=addr, shared_storage_class=shared_storage_class)
    keeper = None
    if kept is not None:
        keeper = CertKeeper(kube or Kube.from_kubeconfig(kubeconfig), kept.namespace, kept.secret,
                            kept.configuration, kept.service, server.use)
    server.start()
    if keeper is not None:
        keeper.first(first_wait)
        keeper.start()
    return Webhook(server, keeper)


def run(port: int, trusted_repositories: Sequence[str], *, cert_dir: str | None = None,
        kept: KeptCertificate | None = None, kubeconfig: str | None = None,
        shared_storage_class: str | None = None) -> None:
    """``slurmk8s webhook``: serve until SIGTERM or SIGINT."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    hook = start(port, trusted_repositories, cert_dir=cert_dir, kept=kept, kubeconfig=kubeconfig,
                 shared_storage_class=shared_storage_class)
    try:
        stop.wait()
    finally:
        _log.info("stopping the webhook")
        hook.stop()
