"""The one way slurmk8s serves Prometheus metrics: the operator's and the
bridge's (``--metrics-port``) and the Slurm agent's (``--metrics-listen``).

``GET /metrics`` in the text format Prometheus asks for (its own, or
OpenMetrics). No token: what is served is counts by partition, account,
state and reason, never a job, user or node name, and the NetworkPolicies
admit only the scrapers (``scrapeFrom``). Served by :mod:`slurmk8s.httpserver`
under :data:`LIMITS`: a request has ``TIMEOUT`` seconds in all however
slowly it trickles, no body, and idle or slow connections are closed, oldest
first, to make room for a scrape, so no number of them keeps Prometheus out.
"""

from __future__ import annotations

from http import HTTPStatus

from prometheus_client import REGISTRY
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry

from .httpserver import HttpServer, Limits, Request, Response, error

__all__ = ["serve_metrics", "metrics_server", "LIMITS", "TIMEOUT"]

#: Seconds a connection has, in all, to send its request.
TIMEOUT = 10.0
#: A scrape is a GET without a body; a few scrapers at once.
LIMITS = Limits(deadline=TIMEOUT, max_header_bytes=8 * 1024, max_headers=48, max_body=0,
                max_buffered=1024 * 1024, max_connections=256, workers=2, max_inflight=8)


def _handler(registry: CollectorRegistry):
    def handle(request: Request) -> Response:
        if request.path != "/metrics":
            return error(HTTPStatus.NOT_FOUND, "only /metrics is served here", "not-found")
        if request.method != "GET":
            return error(HTTPStatus.METHOD_NOT_ALLOWED, "GET /metrics only", "method", {"Allow": "GET"})
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        return Response(HTTPStatus.OK, encoder(registry), content_type)

    return handle


def metrics_server(port: int, host: str = "0.0.0.0", registry: CollectorRegistry = REGISTRY,
                   limits: Limits | None = None) -> HttpServer:
    """The metrics server for ``registry`` on ``host:port``, not started."""
    return HttpServer((host, port), _handler(registry), limits or LIMITS, name="metrics", quiet=("/metrics",))


def serve_metrics(port: int, host: str = "0.0.0.0", registry: CollectorRegistry = REGISTRY) -> HttpServer:
    """Serve ``registry`` on ``host:port`` from a thread of its own; returns the server."""
    server = metrics_server(port, host, registry)
    server.start()
    return server
