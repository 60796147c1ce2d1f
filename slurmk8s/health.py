"""The operator's and the bridge's ``/healthz`` (liveness and readiness).

Live while every registered heartbeat is fresh: the lease elector's tries
(:mod:`slurmk8s.leader`), and while leading the component's own work (the
bridge's rounds, the operator's event loop). A standby is healthy: it serves
the webhook and stands by. The answer says who leads, for people reading it
with ``curl``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from .httpserver import HttpServer, Limits, Request, Response, error, json_response

__all__ = ["Health", "LIMITS"]

#: A probe is a GET without a body; the kubelet's, and people's with curl.
LIMITS = Limits(deadline=10.0, max_header_bytes=8 * 1024, max_headers=48, max_body=0,
                max_buffered=1024 * 1024, max_connections=256, workers=2, max_inflight=8)


class Health:
    """Heartbeats by name: each a function giving the ``time.monotonic()`` of
    its last beat, and the seconds after which it is stale."""

    def __init__(self) -> None:
        self._beats: dict[str, tuple[Callable[[], float], float]] = {}
        self._info: Callable[[], dict[str, Any]] = dict
        self._lock = threading.Lock()

    def watch(self, name: str, last: Callable[[], float], stale: float) -> None:
        with self._lock:
            self._beats[name] = (last, stale)

    def describe(self, info: Callable[[], dict[str, Any]]) -> None:
        """What the answer adds (who leads)."""
        self._info = info

    def check(self) -> tuple[bool, dict[str, Any]]:
        now = time.monotonic()
        with self._lock:
            beats = dict(self._beats)
        ages = {name: (now - last(), stale) for name, (last, stale) in beats.items()}
        ok = all(age < stale for age, stale in ages.values())
        body = {"ok": ok, **{f"secondsSince{k[:1].upper()}{k[1:]}": round(a, 1) for k, (a, _) in ages.items()}, **self._info()}
        return ok, body

    def answer(self, request: Request) -> Response:
        if request.path != "/healthz":
            return error(HTTPStatus.NOT_FOUND, "only /healthz is served here", "not-found")
        if request.method != "GET":
            return error(HTTPStatus.METHOD_NOT_ALLOWED, "GET /healthz only", "method", {"Allow": "GET"})
        ok, body = self.check()
        return json_response(HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE, body)

    def serve(self, port: int, host: str = "0.0.0.0", limits: Limits = LIMITS) -> HttpServer:
        """Serve ``GET /healthz`` on ``host:port`` from a thread of its own (:mod:`slurmk8s.httpserver`)."""
        server = HttpServer((host, port), self.answer, limits, name="healthz", quiet=("/healthz",))
        server.start()
        return server
