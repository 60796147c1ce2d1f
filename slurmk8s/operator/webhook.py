"""The operator's validating admission webhook: `kubectl apply` of a
SlurmCluster or NodeLendingPolicy that the operator would refuse is refused
at once, with the same field-path messages (decision record 34).

:func:`refusal` and :func:`review` are pure: the same validators as the
operator's rounds and ``slurmk8s validate`` (:func:`load_cluster` with the
operator's trusted repositories, :func:`load_policy`), and, on an update
that changes ``spec.slurm.version``, the rule that refuses a Slurm step
backwards or too wide from the release the cluster runs (its
``status.slurmVersion``; no step is judged before the operator reported one). An update that leaves the spec alone (kopf's
finalizer and annotations, labels) is always allowed, so a cluster that
became invalid can still be deleted. :class:`WebhookServer` is the thin
shell: HTTPS with the certificate the chart mounts, ``POST /validate``
only, bounded bodies and timeouts.
"""

from __future__ import annotations

import json
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Mapping, Sequence

from slurmk8s import log, versions
from slurmk8s.api import InvalidSpec, load_cluster, load_policy
from slurmk8s.api.cluster import PROJECT_REPOSITORY

__all__ = ["refusal", "review", "WebhookServer", "PATH"]

PATH = "/validate"
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
            trusted_repositories: Sequence[str] = (PROJECT_REPOSITORY,)) -> str | None:
    """Why the API should refuse this write of a ``kind`` object, or None."""
    if operation not in ("CREATE", "UPDATE"):
        return None
    if operation == "UPDATE" and isinstance(obj, dict) and isinstance(old, dict) and obj.get("spec") == old.get("spec"):
        return None
    try:
        if kind == "NodeLendingPolicy":
            load_policy(obj)
            return None
        load_cluster(obj, trusted_repositories=trusted_repositories)
    except InvalidSpec as exc:
        return str(exc)
    running, wanted = _running(old), _version(obj)
    if operation == "UPDATE" and running and wanted and running != wanted:
        problem = versions.upgrade_problem(running, wanted)
        if problem is not None:
            return f"spec.slurm.version: {problem}"
    return None


def review(body: Any, trusted_repositories: Sequence[str] = (PROJECT_REPOSITORY,)) -> dict:
    """An AdmissionReview v1 request -> its response. Raises ValueError for a body that is not one."""
    if not isinstance(body, dict) or body.get("apiVersion") != "admission.k8s.io/v1" \
            or body.get("kind") != "AdmissionReview" or not isinstance(body.get("request"), dict):
        raise ValueError("expected an admission.k8s.io/v1 AdmissionReview with a request")
    request = body["request"]
    kind = (request.get("kind") or {}).get("kind", "")
    if kind not in ("SlurmCluster", "NodeLendingPolicy"):
        raise ValueError(f"this webhook validates SlurmClusters and NodeLendingPolicies, not {kind!r}")
    why = refusal(kind, request.get("operation", ""), request.get("object"), request.get("oldObject"),
                  trusted_repositories)
    response: dict = {"uid": request.get("uid", ""), "allowed": why is None}
    if why is not None:
        response["status"] = {"code": 422, "reason": "Invalid", "message": why}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


class WebhookServer:
    """HTTPS on ``port`` with ``cert_dir``'s tls.crt and tls.key (a kubernetes.io/tls Secret)."""

    def __init__(self, port: int, cert_dir: str | Path, trusted_repositories: Sequence[str] = (PROJECT_REPOSITORY,),
                 addr: str = "0.0.0.0"):
        trusted = tuple(trusted_repositories)
        hook = self

        class Handler(BaseHTTPRequestHandler):
            timeout = 10  # a client gets 10 s per read: no slow-loris holds a thread
            protocol_version = "HTTP/1.1"

            def log_message(self, *_: Any) -> None:
                pass

            def setup(self) -> None:
                super().setup()  # the read timeout, then the TLS handshake under it
                self.connection.do_handshake()

            def _answer(self, code: int, doc: Mapping) -> None:
                data = json.dumps(doc).encode()
                if code != 200:
                    self.close_connection = True  # a body may be left unread
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                if self.path.split("?", 1)[0] != PATH:
                    return self._answer(404, {"error": f"POST {PATH} only"})
                try:
                    length = int(self.headers.get("Content-Length") or 0)
                except ValueError:
                    length = -1
                if not 0 < length <= MAX_BODY:
                    return self._answer(413 if length > MAX_BODY else 400, {"error": "bad Content-Length"})
                try:
                    body = json.loads(self.rfile.read(length))
                    doc = review(body, trusted)
                except ValueError as exc:
                    return self._answer(400, {"error": str(exc)})
                except Exception as exc:  # noqa: BLE001 - answered, so the API server applies its failurePolicy
                    _log.error("the webhook failed", error=str(exc))
                    return self._answer(500, {"error": "the webhook failed; see the operator's log"})
                if not doc["response"]["allowed"]:
                    request = body["request"]
                    _log.info("refused", kind=(request.get("kind") or {}).get("kind"),
                              namespace=request.get("namespace"), name=request.get("name"),
                              operation=request.get("operation"))
                self._answer(200, doc)

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def get_request(self):
                sock, client = self.socket.accept()
                hook.refresh()
                # The handshake happens in the connection's own thread, under its timeout.
                return hook.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), client

            def handle_error(self, request: Any, client_address: Any) -> None:
                _log.debug("a webhook connection failed", client=str(client_address))

        self.server = Server((addr, port), Handler)
        self.cert_dir = Path(cert_dir)
        self._loaded: tuple = ()
        self._lock = threading.Lock()
        try:
            self.context = self._load()
        except (OSError, ssl.SSLError) as exc:
            self.server.server_close()
            raise RuntimeError(f"the webhook's certificate: cannot load tls.crt and tls.key from {self.cert_dir} "
                               f"({exc}); mount the chart's <release>-webhook Secret there, or pass "
                               "--webhook-cert-dir") from None
        self.port = self.server.server_address[1]

    def _stamp(self) -> tuple:
        return tuple((f.stat().st_mtime_ns, f.stat().st_size)
                     for f in (self.cert_dir / "tls.crt", self.cert_dir / "tls.key"))

    def _load(self) -> ssl.SSLContext:
        stamp = self._stamp()
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert_dir / "tls.crt", self.cert_dir / "tls.key")
        self._loaded = stamp
        return ctx

    def refresh(self) -> None:
        """Serve the certificate again from its files when they changed (a Secret volume
        replaces them when the Secret is renewed); while they cannot be read whole, the
        loaded one serves."""
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

    def start(self) -> "WebhookServer":
        threading.Thread(target=self.server.serve_forever, name="webhook", daemon=True).start()
        _log.info("serving the validating webhook", port=self.port, path=PATH)
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
