"""The operator's and the bridge's ``/healthz`` (liveness and readiness).

Live while every registered heartbeat is fresh: the lease elector's tries
(:mod:`slurmk8s.leader`), and while leading the component's own work (the
bridge's rounds, the operator's event loop). A standby is healthy: it serves
the webhook and stands by. The answer says who leads, for people reading it
with ``curl``.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

__all__ = ["Health"]


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

    def serve(self, port: int, host: str = "0.0.0.0") -> ThreadingHTTPServer:
        health = self

        class Handler(BaseHTTPRequestHandler):
            timeout = 10

            def log_message(self, format: str, *args) -> None:  # noqa: A002 - http.server's name
                pass

            def do_GET(self) -> None:
                if self.path != "/healthz":
                    code, body = 404, {"ok": False, "error": "only /healthz is served here"}
                else:
                    ok, body = health.check()
                    code = 200 if ok else 503
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        server = ThreadingHTTPServer((host, port), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True, name="healthz").start()
        return server
