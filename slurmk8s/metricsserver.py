"""The one way slurmk8s serves Prometheus metrics: the operator's and the
bridge's (``--metrics-port``) and the Slurm agent's (``--metrics-listen``).

``GET /metrics`` in the text format Prometheus asks for (its own, or
OpenMetrics). No token: what is served is counts by partition, account,
state and reason, never a job, user or node name, and the cluster's
NetworkPolicy admits only pods (of the namespaces ``spec.metrics.scrapeFrom``
names). A connection gets one request and ``TIMEOUT`` seconds in all to send
it and take the reply, however slowly it trickles; at most
``MAX_CONNECTIONS`` are open at once, and one more is closed at once,
before a thread is started for it, so a flood cannot hold threads.

:class:`DeadlineReader` is also how the Slurm agent puts a deadline on a
whole request.
"""

from __future__ import annotations

import io
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import REGISTRY
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry

__all__ = ["serve_metrics", "DeadlineReader", "MAX_CONNECTIONS", "TIMEOUT"]

MAX_CONNECTIONS = 8
#: Seconds a connection has, in all, to send its request and take the reply.
TIMEOUT = 10


class DeadlineReader(io.RawIOBase):
    """A socket, read with one deadline (``deadline``, ``time.monotonic()``) for
    everything read from it, however slowly it arrives."""

    def __init__(self, sock: Any):
        self.sock = sock
        self.deadline = time.monotonic()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request did not arrive in time")
        self.sock.settimeout(left)
        return self.sock.recv_into(buffer)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], registry: CollectorRegistry):
        self.registry = registry
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(address, _Handler)

    def process_request(self, request: socket.socket, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):  # full: closed before any thread is started
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: socket.socket, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.0"  # one request per connection: no idle keep-alive holds a slot

    def setup(self) -> None:
        super().setup()
        self._reader = DeadlineReader(self.connection)
        self._reader.deadline = time.monotonic() + TIMEOUT
        self.rfile = io.BufferedReader(self._reader)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - http.server's name
        pass

    def _reply(self, code: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
        self.connection.settimeout(max(self._reader.deadline - time.monotonic(), 0.1))
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] != "/metrics":
            self._reply(404, b"only /metrics is served here\n")
            return
        encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
        self._reply(200, encoder(self.server.registry), content_type)


def serve_metrics(port: int, host: str = "0.0.0.0", registry: CollectorRegistry = REGISTRY) -> ThreadingHTTPServer:
    """Serve ``registry`` on ``host:port`` from a thread of its own; returns the server."""
    server = _Server((host, port), registry)
    threading.Thread(target=server.serve_forever, daemon=True, name="metrics").start()
    return server
