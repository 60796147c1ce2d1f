"""The webhook's certificate, kept by the process that serves the webhook
(decision record 53): read the Secret by name, make what :func:`.certs.plan`
says is due, write it back with the resourceVersion it was read at, set the
ValidatingWebhookConfiguration's ``caBundle`` to the Secret's ``ca.crt``,
and hand the serving certificate to the webhook server. Every replica does
this; a write that another's came between is refused (409) and the round
starts again from what that one wrote, so they agree on one CA.

It needs, through the API: get and update of its one Secret in its own
namespace, get and update of its one ValidatingWebhookConfiguration
(:data:`PERMISSIONS`; the chart narrows both to those names). Nothing else.
"""

from __future__ import annotations

import base64
import datetime as dt
import threading
import time
from collections.abc import Callable

from slurmk8s import log
from slurmk8s.kube import ApiError, Kube
from slurmk8s.permissions import CLUSTER, RELEASE, Permission

from . import certs

__all__ = ["CertKeeper", "CertProblem", "PERMISSIONS", "PERIOD", "RETRY"]

#: What keeping the certificate does through the API (the chart adds resourceNames).
PERMISSIONS = (
    Permission("get", "", "secrets", RELEASE),
    Permission("update", "", "secrets", RELEASE),
    Permission("get", "admissionregistration.k8s.io", "validatingwebhookconfigurations", CLUSTER),
    Permission("update", "admissionregistration.k8s.io", "validatingwebhookconfigurations", CLUSTER),
)
#: Seconds between checks once all is in place, and after a check that could not finish.
PERIOD = 60.0
RETRY = 5.0
_log = log.get("slurmk8s.operator.certkeeper")


class CertProblem(RuntimeError):
    """What keeps the certificate from being kept, in words for the log."""


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _writable(obj: dict) -> dict:
    """``obj`` as read, to be written back whole: its resourceVersion kept (the
    precondition), the server's field bookkeeping left out."""
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
    return {**obj, "metadata": meta}


class CertKeeper:
    """Keeps Secret ``namespace/secret`` and configuration ``configuration`` for the
    webhook's Service ``namespace/service``; ``serve(cert_pem, key_pem)`` gets the
    serving certificate each time it is read."""

    def __init__(self, kube: Kube, namespace: str, secret: str, configuration: str, service: str,
                 serve: Callable[[bytes, bytes], None], *, clock: Callable[[], dt.datetime] = _now,
                 period: float = PERIOD, retry: float = RETRY):
        self.kube, self.namespace, self.secret, self.configuration = kube, namespace, secret, configuration
        self.names = certs.service_names(service, namespace)
        self.common = f"{service}.{namespace} webhook CA"
        self.serve, self.clock, self.period, self.retry = serve, clock, period, retry
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def once(self) -> None:
        """One check: the Secret and the caBundle as they should be, and served. Raises
        CertProblem (the Secret or the configuration missing, or writes kept colliding)
        and kube.ApiError (the API refused or did not answer)."""
        for _ in range(5):
            if self._attempt():
                return
        raise CertProblem("other writers kept changing the webhook's Secret or configuration; trying again later")

    def _attempt(self) -> bool:
        secret = self.kube.get("Secret", self.namespace, self.secret)
        if secret is None:
            raise CertProblem(f"the Secret {self.namespace}/{self.secret} does not exist (the Helm chart makes it, "
                              "empty, with webhook.enabled and webhook.certManager.enabled=false)")
        config = self.kube.get("ValidatingWebhookConfiguration", None, self.configuration)
        if config is None:
            raise CertProblem(f"the ValidatingWebhookConfiguration {self.configuration} does not exist")
        hooks = config.get("webhooks") or []
        bundles = [certs.bundle_certs(base64.b64decode(((h.get("clientConfig") or {}).get("caBundle")) or ""))
                   for h in hooks]
        trusted_by_all = tuple(c for c in (bundles[0] if bundles else ()) if all(c in b for b in bundles))
        now = self.clock()
        stored = certs.read(secret.get("data"))
        due = certs.plan(stored, self.names, now, trusted_by_all)
        if due.writes:
            data = certs.renew(stored, due, self.names, now, self.common)
            try:
                self.kube.replace({**_writable(secret), "data": data})
            except ApiError as exc:
                if exc.conflict:
                    return False
                raise
            _log.info("renewed the webhook's certificate", secret=self.secret, new_ca=due.new_ca,
                      new_serving_certificate=due.new_leaf)
            stored = certs.read(data)
        want = base64.b64encode(certs.pem_bundle(stored.trusted)).decode()
        if any((h.get("clientConfig") or {}).get("caBundle") != want for h in hooks):
            for h in hooks:
                h.setdefault("clientConfig", {})["caBundle"] = want
            try:
                self.kube.replace(_writable(config))
            except ApiError as exc:
                if exc.conflict:
                    return False
                raise
            _log.info("set the webhook configuration's caBundle", configuration=self.configuration,
                      authorities=len(stored.trusted))
        if stored.leaf is not None and stored.leaf_key is not None:
            cert_pem, key_pem = certs.leaf_pems(stored)
            self.serve(cert_pem, key_pem)
        return True

    def first(self, wait: float) -> bool:
        """Check until one check goes through, for at most ``wait`` seconds (a second
        apart); whether it did."""
        deadline = time.monotonic() + wait
        while True:
            try:
                self.once()
                return True
            except (CertProblem, ApiError) as exc:
                if time.monotonic() + 1 >= deadline:
                    _log.warning("no webhook certificate yet; trying again in the background", error=str(exc))
                    return False
            if self._stop.wait(1.0):
                return False

    def run(self) -> None:
        """Check every :attr:`period` seconds until :meth:`stop`; every :attr:`retry`
        seconds while a check fails."""
        while not self._stop.is_set():
            wait = self.period
            try:
                self.once()
            except (CertProblem, ApiError) as exc:
                _log.warning("cannot keep the webhook's certificate yet", error=str(exc))
                wait = self.retry
            self._stop.wait(wait)

    def start(self) -> CertKeeper:
        self._thread = threading.Thread(target=self.run, name="webhook-certs", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
