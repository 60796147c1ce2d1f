"""The operator's validating admission webhook: `kubectl apply` of a
SlurmCluster or NodeLendingPolicy that the operator would refuse is refused
at once, with the same field-path messages (decision record 34).

:func:`refusal` and :func:`review` are pure: the same validators as the
operator's rounds and ``slurmk8s validate`` (:func:`load_cluster` with the
operator's trusted repositories, then :func:`with_storage_class` with its
default StorageClass for shared claims; :func:`load_policy`), and, on an update
that changes ``spec.slurm.version``, the rule that refuses a Slurm step
backwards or too wide from the release the cluster runs (its
``status.slurmVersion``; no step is judged before the operator reported one). An update that leaves the spec alone (kopf's
finalizer and annotations, labels) is always allowed, so a cluster that
became invalid can still be deleted. :class:`WebhookServer` is the thin
shell: HTTPS, ``POST /validate`` and ``GET /healthz`` only, served by
:mod:`slurmk8s.httpserver` under :data:`LIMITS`, with the certificate
cert-manager's Secret mounts (``cert_dir``) or the one :mod:`.certkeeper`
hands it (:meth:`WebhookServer.use`; decision record 53).
"""

from __future__ import annotations

import json
import os
import ssl
import tempfile
import threading
from collections.abc import Sequence
from http import HTTPStatus
from pathlib import Path
from typing import Any

from slurmk8s import log, versions
from slurmk8s.api import InvalidSpec, load_cluster, load_policy
from slurmk8s.api.cluster import PROJECT_REPOSITORY
from slurmk8s.api.storageclass import with_storage_class
from slurmk8s.httpserver import HttpServer, Limits, Request, Response, error, json_response

__all__ = ["refusal", "review", "WebhookServer", "PATH", "HEALTH_PATH", "LIMITS"]

PATH = "/validate"
#: Answers 200 over TLS once a certificate is served: the probes of a pod that only serves the webhook.
HEALTH_PATH = "/healthz"
#: The API server sends at most its own request limit; more is not an AdmissionReview.
MAX_BODY = 3 * 1024 * 1024
_log = log.get("slurmk8s.operator.webhook")


def _version(obj: Any) -> str | None:
    try:
        return obj["spec"]["slurm"]["version"]
    except (KeyError, TypeError):
        return None


def _running(obj: Any) -> str | None:
    """The release the cluster runs, as the operator last reported it (None before it did)."""
    try:
        return obj["status"]["slurmVersion"]
    except (KeyError, TypeError):
        return None


def refusal(kind: str, operation: str, obj: Any, old: Any,
            trusted_repositories: Sequence[str] = (PROJECT_REPOSITORY,),
            shared_storage_class: str | None = None) -> str | None:
    """Why the API should refuse this write of a ``kind`` object, or None
    (``shared_storage_class``: the operator's ``--shared-storage-class``)."""
    if operation not in ("CREATE", "UPDATE"):
        return None
    if operation == "UPDATE" and isinstance(obj, dict) and isinstance(old, dict) and obj.get("spec") == old.get("spec"):
        return None
    try:
        if kind == "NodeLendingPolicy":
            load_policy(obj)
            return None
        with_storage_class(load_cluster(obj, trusted_repositories=trusted_repositories), shared_storage_class)
    except InvalidSpec as exc:
        return str(exc)
    running, wanted = _running(old), _version(obj)
    if operation == "UPDATE" and running and wanted and running != wanted:
        problem = versions.upgrade_problem(running, wanted)
        if problem is not None:
            return f"spec.slurm.version: {problem}"
    return None


def review(body: Any, trusted_repositories: Sequence[str] = (PROJECT_REPOSITORY,),
           shared_storage_class: str | None = None) -> dict:
    """An AdmissionReview v1 request -> its response. Raises ValueError for a body that is not one."""
    if not isinstance(body, dict) or body.get("apiVersion") != "admission.k8s.io/v1" \
            or body.get("kind") != "AdmissionReview" or not isinstance(body.get("request"), dict):
        raise ValueError("expected an admission.k8s.io/v1 AdmissionReview with a request")
    request = body["request"]
    kind = (request.get("kind") or {}).get("kind", "")
    if kind not in ("SlurmCluster", "NodeLendingPolicy"):
        raise ValueError(f"this webhook validates SlurmClusters and NodeLendingPolicies, not {kind!r}")
    why = refusal(kind, request.get("operation", ""), request.get("object"), request.get("oldObject"),
                  trusted_repositories, shared_storage_class)
    response: dict = {"uid": request.get("uid", ""), "allowed": why is None}
    if why is not None:
        response["status"] = {"code": 422, "reason": "Invalid", "message": why}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


#: What the webhook's server allows (:mod:`slurmk8s.httpserver`): a review's body up to
#: :data:`MAX_BODY`, a few reviews at once, within the API server's own timeout (10 s by default).
LIMITS = Limits(deadline=10.0, max_header_bytes=16 * 1024, max_headers=64, max_body=MAX_BODY,
                max_buffered=4 * MAX_BODY, max_connections=256, workers=4, max_inflight=8)


def _server_context() -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


class WebhookServer:
    """HTTPS on ``port`` with ``cert_dir``'s tls.crt and tls.key (a kubernetes.io/tls Secret
    mounted), or, without ``cert_dir``, with the certificate :meth:`use` gives it; until then
    every connection is closed unanswered."""

    def __init__(self, port: int, cert_dir: str | Path | None = None,
                 trusted_repositories: Sequence[str] = (PROJECT_REPOSITORY,),
                 addr: str = "0.0.0.0", limits: Limits = LIMITS, shared_storage_class: str | None = None):
        self.trusted = tuple(trusted_repositories)
        self.shared_storage_class = shared_storage_class
        self.cert_dir = Path(cert_dir) if cert_dir is not None else None
        self._loaded: tuple = ()
        self._lock = threading.Lock()
        self.context: ssl.SSLContext | None = None
        if self.cert_dir is not None:
            try:
                self.context = self._load()
            except (OSError, ssl.SSLError) as exc:
                raise RuntimeError(f"the webhook's certificate: cannot load tls.crt and tls.key from {self.cert_dir} "
                                   f"({exc}); mount the webhook's kubernetes.io/tls Secret there, or pass "
                                   "--webhook-cert-dir") from None
        self.server = HttpServer((addr, port), self.answer, limits, name="webhook", tls_context=self._context)
        self.port = self.server.port

    def _context(self) -> ssl.SSLContext:
        self.refresh()
        if self.context is None:
            raise ValueError("no certificate to serve yet")
        return self.context

    def use(self, cert_pem: bytes, key_pem: bytes) -> None:
        """Serve this certificate (PEM) and key from the next connection on; the same
        again changes nothing."""
        stamp = (cert_pem, key_pem)
        with self._lock:
            if stamp == self._loaded:
                return
            ctx = _server_context()
            # ssl loads a chain from files only: a private directory, emptied at once.
            with tempfile.TemporaryDirectory(prefix="webhook-cert-") as tmp:
                crt, key = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
                for path, data in ((crt, cert_pem), (key, key_pem)):
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                    with os.fdopen(fd, "wb") as f:
                        f.write(data)
                ctx.load_cert_chain(crt, key)
            first = self.context is None
            self.context, self._loaded = ctx, stamp
        _log.info("serving the webhook's certificate" if first else "serving the renewed webhook certificate")

    def answer(self, request: Request) -> Response:
        if request.path == HEALTH_PATH and request.method == "GET":
            return json_response(HTTPStatus.OK, {"ok": True})
        if request.path != PATH or request.method != "POST":
            return error(HTTPStatus.NOT_FOUND, f"POST {PATH} or GET {HEALTH_PATH} only", "not-found")
        if not request.body:
            return error(HTTPStatus.BAD_REQUEST, "an AdmissionReview body is required", "invalid")
        try:
            body = json.loads(request.body)
            doc = review(body, self.trusted, self.shared_storage_class)
        except ValueError as exc:  # the request's: not JSON, not a review of our kinds
            return error(HTTPStatus.BAD_REQUEST, str(exc), "invalid")
        except Exception as exc:  # noqa: BLE001 - answered, so the API server applies its failurePolicy
            _log.error("the webhook failed", error=str(exc))
            return error(HTTPStatus.INTERNAL_SERVER_ERROR, "the webhook failed; see the operator's log", "internal")
        if not doc["response"]["allowed"]:
            request_ = body["request"]
            _log.info("refused", kind=(request_.get("kind") or {}).get("kind"),
                      namespace=request_.get("namespace"), name=request_.get("name"),
                      operation=request_.get("operation"))
        return json_response(HTTPStatus.OK, doc)

    def _stamp(self) -> tuple:
        assert self.cert_dir is not None
        return tuple((f.stat().st_mtime_ns, f.stat().st_size)
                     for f in (self.cert_dir / "tls.crt", self.cert_dir / "tls.key"))

    def _load(self) -> ssl.SSLContext:
        assert self.cert_dir is not None
        stamp = self._stamp()
        ctx = _server_context()
        ctx.load_cert_chain(self.cert_dir / "tls.crt", self.cert_dir / "tls.key")
        self._loaded = stamp
        return ctx

    def refresh(self) -> None:
        """Serve the certificate again from its files when they changed (a Secret volume
        replaces them when the Secret is renewed); while they cannot be read whole, the
        loaded one serves. Nothing to do for a certificate :meth:`use` gives."""
        if self.cert_dir is None:
            return
        with self._lock:
            try:
                if self._stamp() == self._loaded:
                    return
                fresh = self._load()
            except (OSError, ssl.SSLError) as exc:
                _log.warning("cannot load the renewed webhook certificate yet", error=str(exc))
                return
            self.context = fresh
            _log.info("serving the renewed webhook certificate")

    def start(self) -> WebhookServer:
        self.server.start()
        _log.info("serving the validating webhook", port=self.port, path=PATH)
        return self

    def stop(self) -> None:
        self.server.stop()
