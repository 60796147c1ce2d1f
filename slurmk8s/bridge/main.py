"""The bridge's entry point: :func:`run` (the ``slurmk8s bridge`` command calls it)."""

from __future__ import annotations

import json
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Collection

import structlog
from prometheus_client import start_http_server

from ..kube import Kube
from .loop import FIELD_MANAGER, Bridge
from .view import Watching

__all__ = ["run", "watching_bridge"]

#: How long a cluster's agent client (its token Secret and controller pod) is reused, until a call fails.
AGENT_TTL = 300.0

log = structlog.get_logger("slurmk8s.bridge")


class _Health:
    """Live while rounds keep finishing: /healthz answers 503 once none has for ``stale`` seconds."""

    def __init__(self, stale: float):
        self.stale = stale
        self.last = time.monotonic()

    def serve(self, port: int) -> ThreadingHTTPServer:
        health = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args) -> None:  # noqa: A002 - http.server's name
                pass

            def do_GET(self) -> None:
                age = time.monotonic() - health.last
                ok = self.path == "/healthz" and age < health.stale
                body = json.dumps({"ok": ok, "secondsSinceLastRound": round(age, 1)}).encode()
                self.send_response(200 if ok else (404 if self.path != "/healthz" else 503))
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        server = ThreadingHTTPServer(("0.0.0.0", port), Handler)
        threading.Thread(target=server.serve_forever, daemon=True, name="healthz").start()
        return server


def watching_bridge(kube: Kube, namespaces: Collection[str] = (), **kwargs: Any) -> Bridge:
    """The bridge as ``slurmk8s bridge`` runs it: watch-fed caches (started
    here), agent clients reused for :data:`AGENT_TTL`. ``namespaces``: empty
    for every namespace. ``kwargs`` go to :class:`Bridge` (e.g. ``agent``)."""
    view = Watching(kube, namespaces).start()
    return Bridge(kube, namespaces=namespaces, view=view, agent_ttl=AGENT_TTL, **kwargs)


def run(*, namespaces: Collection[str] = (), all_namespaces: bool = False, kubeconfig: str | None = None,
        metrics_port: int | None = None, health_port: int | None = None, interval: float = 2.0) -> None:
    """Run the bridge until SIGTERM or SIGINT: a round every ``interval`` seconds, and when a watched change matters."""
    if not namespaces and not all_namespaces:
        raise ValueError("name the namespaces to watch (--namespace, repeatable) or pass --all-namespaces")
    kube = Kube.from_kubeconfig(kubeconfig, field_manager=FIELD_MANAGER)
    bridge = watching_bridge(kube, () if all_namespaces else tuple(namespaces))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if metrics_port:
        start_http_server(metrics_port)
    health = _Health(stale=max(60.0, 10 * interval))
    if health_port:
        health.serve(health_port)
    log.info("bridge started", namespaces=list(namespaces) or "all", interval=interval)

    def stopped() -> bool:
        health.last = time.monotonic()
        return stop.is_set()

    bridge.run_forever(interval, stop=stopped)
    bridge.view.close()
    log.info("bridge stopped")
