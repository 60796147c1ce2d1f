"""The one way slurmk8s serves Prometheus metrics: the operator's and the
bridge's (``--metrics-port``) and the Slurm agent's (``--metrics-listen``).

``GET /metrics`` in the text format Prometheus asks for (its own, or
OpenMetrics). No token: what is served is counts by partition, account,
state and reason, never a job, user or node name, and the cluster's
NetworkPolicy admits only the scrapers the spec names
(``spec.monitoring.scrapeFrom``). Every connection has a deadline, and at
most ``MAX_CONNECTIONS`` are served at once; one more gets a 503 and is
closed, so a flood cannot hold threads.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import REGISTRY
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry

__all__ = ["serve_metrics", "MAX_CONNECTIONS", "TIMEOUT"]

MAX_CONNECTIONS = 8
#: Seconds a connection may take to send its request, and to take the reply.
TIMEOUT = 10


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], registry: CollectorRegistry):
        self.registry = registry
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = TIMEOUT
    protocol_version = "HTTP/1.0"  # one request per connection: no idle keep-alive holds a slot

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - http.server's name
        pass

    def _reply(self, code: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if not self.server.slots.acquire(blocking=False):
            self._reply(503, b"too many scrapes at once\n")
            return
        try:
            if self.path.split("?", 1)[0] != "/metrics":
                self._reply(404, b"only /metrics is served here\n")
                return
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            self._reply(200, encoder(self.server.registry), content_type)
        finally:
            self.server.slots.release()


def serve_metrics(port: int, host: str = "0.0.0.0", registry: CollectorRegistry = REGISTRY) -> ThreadingHTTPServer:
    """Serve ``registry`` on ``host:port`` from a thread of its own; returns the server."""
    server = _Server((host, port), registry)
    threading.Thread(target=server.serve_forever, daemon=True, name="metrics").start()
    return server
