"""The Slurm agent: a small authenticated HTTP server beside slurmctld.

It serves exactly the operations of :class:`~.control.SlurmControl` and runs
each through a local :class:`~.client.SlurmClient`, which holds the safety
rules. Nothing else is reachable: no command execution, no job submission, no
cancel. See docs/decisions/0006-slurm-control-path.md for why it exists.

Every request but ``GET /healthz`` needs ``Authorization: Bearer <token>``,
the cluster's agent token (the ``<cluster>-agent-token`` Secret), compared in
constant time. Connections without the token have their own small pool and
no keep-alive, so they can never keep a caller with the token out
(:class:`AgentServer`). Routes (JSON in and out)::

    GET    /healthz                         liveness; no token, no Slurm call
    GET    /v1/ping                         {"up": bool}
    GET    /v1/nodes                        {"nodes": [node, ...]}
    GET    /v1/jobs[?node=N&node=M]         {"jobs": [job, ...]}; &checkpoints=1: with each running
                                            job's last checkpoint time (the bridge's reclaim order)
    GET    /v1/config-hash                  {"hash": "0123456789abcdef"}
    POST   /v1/nodes/<name>/drain           {"reason": "scale-in"}
    POST   /v1/nodes/<name>/undrain
    POST   /v1/nodes/<name>/down            {"reason": "slurmd lost"}
    POST   /v1/nodes/<name>/signal          {"signal": "USR1"} -> {"jobs": [ids]}
    DELETE /v1/nodes/<name>
    POST   /v1/jobs/<id>/requeue            requeue, then eligible a second after it left COMPLETING
    POST   /v1/jobs/<id>/start-now          a pending job may start at once
    POST   /v1/jobs/<id>/cancel
    GET    /v1/reservations                 {"reservations": [reservation, ...]}: the lending ones
    PUT    /v1/reservations/<node>          {"start": 1764230400}: make or move the node's
    DELETE /v1/reservations/<node>
    POST   /v1/reconfigure
    POST   /v1/accounting                   associations: {"applied": [sacctmgr command, ...]}
    GET    /v1/directory                    {"state": "ok", "message": ..., "uri": ..., "checked": t}:
                                            the sssd container's last probe of the directory
    GET    /v1/published?dir=D              {"latest": "..."}: D/LATEST, the model version a job
                                            published (D inside --checkpoint-root, read-only;
                                            opened one component at a time without following
                                            links, by a child process running as nobody)

Errors are ``{"error": message, "kind": kind}`` with status 400 (invalid
name, reason or signal), 401 (token), 403 (a published path that is a link,
not a plain file, or not readable by others), 404, 405, 409 (not our drain), 502 (a
Slurm command failed: also ``argv``, ``returncode``, ``stderr``) or 503
(slurmctld unreachable, the config directory unreadable, or too many
authenticated connections).
"""

from __future__ import annotations

import hmac
import io
import json
import re
import socket
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qs, unquote, urlsplit

from .. import log
from ..metricsserver import DeadlineReader
from ..strict import count
from .accounting import Associations
from .client import NotOurDrain, SlurmError
from .control import AGENT_PORT
from .control import SlurmControl
from .model import job_to_dict, node_to_dict
from .reservations import reservation_to_dict
from .published import Fail, published

__all__ = ["AgentServer", "make_server", "read_token", "DEFAULT_PORT", "MAX_BODY"]

DEFAULT_PORT = AGENT_PORT
MAX_BODY = 64 * 1024


def read_token(path: Path) -> bytes:
    """The agent token from a file (the mounted Secret), without surrounding whitespace."""
    try:
        token = Path(path).read_bytes().strip()
    except OSError as exc:
        raise ValueError(f"cannot read the agent token file {path}: {exc.strerror}: mount the "
                         "<cluster>-agent-token Secret there (the operator creates it)") from None
    if len(token) < 16:
        raise ValueError(f"the agent token in {path} is {'empty' if not token else 'too short'}: "
                         "it must hold the cluster's token (at least 16 characters)")
    return token


Handler = Callable[[SlurmControl, dict, dict], Any]


def _get_nodes(s: SlurmControl, query: dict, body: dict) -> dict:
    return {"nodes": [node_to_dict(n) for n in s.nodes()]}


def _get_jobs(s: SlurmControl, query: dict, body: dict) -> dict:
    checkpoints = query.get("checkpoints", ["0"]) == ["1"]
    return {"jobs": [job_to_dict(j) for j in s.jobs(nodes=query.get("node", []), checkpoints=checkpoints)]}


def _string(body: dict, key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str):
        raise Fail(HTTPStatus.BAD_REQUEST, "invalid", f"the request body needs a string {key!r}")
    return value


def _time(body: dict) -> int:
    value = body.get("start")
    if type(value) is not int or not 0 <= value < 1 << 40:
        raise Fail(HTTPStatus.BAD_REQUEST, "invalid", "the request body needs POSIX seconds 'start'")
    return value


#: (method, path pattern) -> handler(slurm, query, body, **path groups)
ROUTES: list[tuple[str, re.Pattern, Callable[..., Any]]] = [
    ("GET", re.compile(r"/v1/ping"), lambda s, q, b: {"up": s.ping()}),
    ("GET", re.compile(r"/v1/nodes"), _get_nodes),
    ("GET", re.compile(r"/v1/jobs"), _get_jobs),
    ("GET", re.compile(r"/v1/config-hash"), lambda s, q, b: {"hash": s.config_hash()}),
    ("POST", re.compile(r"/v1/nodes/(?P<name>[^/]+)/drain"),
     lambda s, q, b, name: s.drain(name, _string(b, "reason"))),
    ("POST", re.compile(r"/v1/nodes/(?P<name>[^/]+)/undrain"), lambda s, q, b, name: s.undrain(name)),
    ("POST", re.compile(r"/v1/nodes/(?P<name>[^/]+)/down"),
     lambda s, q, b, name: s.set_down(name, _string(b, "reason"))),
    ("POST", re.compile(r"/v1/nodes/(?P<name>[^/]+)/signal"),
     lambda s, q, b, name: {"jobs": s.signal_node_jobs(name, _string(b, "signal"))}),
    ("DELETE", re.compile(r"/v1/nodes/(?P<name>[^/]+)"), lambda s, q, b, name: s.delete_node(name)),
    ("POST", re.compile(r"/v1/jobs/(?P<job_id>[0-9]{1,10})/requeue"),
     lambda s, q, b, job_id: s.requeue(int(job_id))),
    ("POST", re.compile(r"/v1/jobs/(?P<job_id>[0-9]{1,10})/start-now"),
     lambda s, q, b, job_id: s.start_now(int(job_id))),
    ("POST", re.compile(r"/v1/jobs/(?P<job_id>[0-9]{1,10})/cancel"),
     lambda s, q, b, job_id: s.cancel(int(job_id))),
    ("GET", re.compile(r"/v1/reservations"),
     lambda s, q, b: {"reservations": [reservation_to_dict(r) for r in s.reservations()]}),
    ("PUT", re.compile(r"/v1/reservations/(?P<name>[^/]+)"), lambda s, q, b, name: s.reserve(name, _time(b))),
    ("DELETE", re.compile(r"/v1/reservations/(?P<name>[^/]+)"), lambda s, q, b, name: s.unreserve(name)),
    ("POST", re.compile(r"/v1/reconfigure"), lambda s, q, b: s.reconfigure()),
    ("GET", re.compile(r"/v1/directory"), lambda s, q, b: s.directory().to_json()),
    ("POST", re.compile(r"/v1/accounting"),
     lambda s, q, b: {"applied": s.apply_accounting(Associations.from_json(b))}),
]


class _RequestHandler(BaseHTTPRequestHandler):
    server: "AgentServer"
    protocol_version = "HTTP/1.1"
    server_version = "slurmk8s-agent"

    def setup(self) -> None:
        self.timeout = self.server.request_timeout  # socket timeout for every read and write
        super().setup()
        # Reads go through a deadline: a request (line, headers, body) must
        # arrive within request_timeout in all, however slowly it trickles.
        self._reader = DeadlineReader(self.connection)
        self.rfile = io.BufferedReader(self._reader)

    def handle_one_request(self) -> None:
        self._reader.deadline = time.monotonic() + self.server.request_timeout
        super().handle_one_request()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's name
        pass  # requests are logged by _handle, without headers

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def _send(self, status: HTTPStatus, payload: dict, headers: dict[str, str] = {}) -> None:
        data = json.dumps(payload).encode()
        self.connection.settimeout(self.server.request_timeout)  # the reply gets its own time
        if status != HTTPStatus.OK:
            self.close_connection = True  # the request body may be unread
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        if self.close_connection:
            self.send_header("Connection", "close")
        self.send_header("Content-Length", str(len(data)))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self) -> bool:
        header = self.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(given.strip().encode(), self.server.token)

    def _body(self) -> dict:
        length = self.headers.get("Content-Length")
        if not length:
            return {}
        try:
            size = int(length)
        except ValueError:
            raise Fail(HTTPStatus.BAD_REQUEST, "invalid", "Content-Length is not a number") from None
        if size > MAX_BODY:
            raise Fail(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "invalid", f"request bodies are at most {MAX_BODY} bytes")
        raw = self.rfile.read(size)
        if not raw:
            return {}
        try:
            body = json.loads(raw)
        except ValueError:
            raise Fail(HTTPStatus.BAD_REQUEST, "invalid", "the request body is not JSON") from None
        if not isinstance(body, dict):
            raise Fail(HTTPStatus.BAD_REQUEST, "invalid", "the request body must be a JSON object")
        return body

    def _route(self, method: str, path: str) -> tuple[Callable[..., Any], dict]:
        allowed = False
        for m, pattern, handler in ROUTES:
            match = pattern.fullmatch(path)
            if match:
                if m == method:
                    return handler, {k: unquote(v) for k, v in match.groupdict().items()}
                allowed = True
        if allowed:
            raise Fail(HTTPStatus.METHOD_NOT_ALLOWED, "method", f"{method} is not allowed on {path}")
        raise Fail(HTTPStatus.NOT_FOUND, "not-found", f"no such operation: {path}")

    def _handle(self, method: str) -> None:
        started = time.monotonic()
        url = urlsplit(self.path)
        status = HTTPStatus.OK
        try:
            if method == "GET" and url.path == "/healthz":
                if not self.server.authenticated(self.connection):
                    self.close_connection = True  # no keep-alive without the token
                self._send(status, {"ok": True})
                return
            if not self._authorized():
                status = HTTPStatus.UNAUTHORIZED
                self._send(status, {"error": "a valid 'Authorization: Bearer <token>' header is required "
                                             "(the cluster's <cluster>-agent-token Secret)",
                                    "kind": "unauthorized"}, {"WWW-Authenticate": 'Bearer realm="slurmk8s-agent"'})
                return
            if not self.server.authenticate(self.connection):
                status = HTTPStatus.SERVICE_UNAVAILABLE
                self._send(status, {"error": f"too many connections (at most {self.server.max_connections})",
                                    "kind": "busy"})
                return
            query = parse_qs(url.query)
            if method == "GET" and url.path == "/v1/published":
                self._send(status, published(self.server.checkpoint_root, query))
                return
            handler, groups = self._route(method, url.path)
            body = self._body()
            result = handler(self.server.slurm, query, body, **groups)
            self._send(status, result if isinstance(result, dict) else {})
        except Fail as f:
            status = f.status
            self._send(status, {"error": f.message, "kind": f.kind, **f.extra})
        except NotOurDrain as exc:
            status = HTTPStatus.CONFLICT
            self._send(status, {"error": str(exc), "kind": "not-our-drain"})
        except ValueError as exc:
            status = HTTPStatus.BAD_REQUEST
            self._send(status, {"error": str(exc), "kind": "invalid"})
        except SlurmError as exc:
            status = HTTPStatus.SERVICE_UNAVAILABLE if exc.unreachable else HTTPStatus.BAD_GATEWAY
            self._send(status, {"error": str(exc), "kind": "slurm-unreachable" if exc.unreachable else "slurm",
                                "argv": exc.argv, "returncode": exc.returncode, "stderr": exc.stderr})
        except OSError as exc:
            status = HTTPStatus.SERVICE_UNAVAILABLE
            self._send(status, {"error": f"{exc.__class__.__name__}: {exc}", "kind": "unavailable"})
        except Exception as exc:  # a bug: say so, keep serving
            status = HTTPStatus.INTERNAL_SERVER_ERROR
            log.get("slurmk8s.agent").exception("request failed", method=method, path=url.path)
            self._send(status, {"error": f"{exc.__class__.__name__}: {exc}", "kind": "internal"})
        finally:
            if url.path != "/healthz":
                log.get("slurmk8s.agent").info(
                    "request", method=method, path=url.path, status=int(status),
                    ms=round((time.monotonic() - started) * 1000))


def _close_now(sock: Any) -> None:
    """Wake the thread blocked reading ``sock`` (it then ends and closes it)."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class AgentServer(ThreadingHTTPServer):
    """The HTTP server; one thread per connection (Slurm commands block).

    Connections are counted in two pools, so that no one without the token can
    keep the operator and the bridge out (issue 24, item 3):

    - every new connection is *unauthenticated* until a request on it carries
      the token. At most ``max_unauthenticated`` are open at once; when one
      more arrives, the oldest unauthenticated connection is closed to make
      room (never the new one: it may be the operator's). An unauthenticated
      connection serves one request (``/healthz`` or a 401) and is closed:
      no keep-alive without the token.
    - a request with the token moves its connection to the *authenticated*
      pool (at most ``max_connections``; over it the request gets a 503),
      where keep-alive works and nothing evicts it.

    A request (line, headers, body) must arrive within ``request_timeout``
    seconds of the connection, or of the previous reply on it; otherwise the
    connection is closed."""

    daemon_threads = True
    allow_reuse_address = True
    #: Authenticated connections served at once (the operator and the bridge need a few).
    max_connections = 32
    #: Connections without the token yet (probes, newcomers) open at once; the oldest is
    #: closed when one more arrives.
    max_unauthenticated = 16
    #: Seconds a client may stay silent on a connection.
    request_timeout = 10.0

    def __init__(self, address: tuple[str, int], slurm: SlurmControl, token: bytes):
        if len(token) < 16:
            raise ValueError("the agent token must be at least 16 characters")
        self.slurm = slurm
        self.token = token
        #: The checkpoint directory on the shared storage (mounted read-only):
        #: /v1/published reads model versions below it. None: not served.
        self.checkpoint_root: str | None = None
        self._pools_lock = threading.Lock()
        #: socket -> when it was accepted, oldest first (dicts keep insertion order)
        self._unauthenticated: dict[Any, float] = {}
        self._authenticated: set[Any] = set()
        self._evicted, self._evicted_logged = 0, -1e9
        super().__init__(address, _RequestHandler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._pools_lock:
            evict = []
            while len(self._unauthenticated) >= self.max_unauthenticated:
                oldest = next(iter(self._unauthenticated))
                del self._unauthenticated[oldest]
                evict.append(oldest)
            self._unauthenticated[request] = time.monotonic()
        for sock in evict:
            _close_now(sock)
        if evict:
            self._evicted += len(evict)
            now = time.monotonic()
            if now - self._evicted_logged >= 10:  # a flood must not flood the log too
                log.get("slurmk8s.agent").warning("closed the oldest unauthenticated connections",
                                                  closed=self._evicted, limit=self.max_unauthenticated)
                self._evicted, self._evicted_logged = 0, now
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release(request)
            raise

    def authenticate(self, request: Any) -> bool:
        """Move a connection whose request carried the token to the authenticated pool.
        False: the pool is full, or the connection was evicted meanwhile."""
        with self._pools_lock:
            if request in self._authenticated:
                return True
            if request not in self._unauthenticated or len(self._authenticated) >= self.max_connections:
                return False
            del self._unauthenticated[request]
            self._authenticated.add(request)
            return True

    def authenticated(self, request: Any) -> bool:
        with self._pools_lock:
            return request in self._authenticated

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(request)

    def _release(self, request: Any) -> None:
        with self._pools_lock:
            self._unauthenticated.pop(request, None)
            self._authenticated.discard(request)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> threading.Thread:
        """Serve in a background thread (tests, embedding); stop with :meth:`stop`."""
        thread = threading.Thread(target=self.serve_forever, name="slurmk8s-agent", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) -> (host, port)."""
    host, sep, port = value.rpartition(":")
    number = count(port, 65535)
    if not sep or number is None:
        raise ValueError(f"--listen {value!r}: use HOST:PORT, e.g. 0.0.0.0:{DEFAULT_PORT}")
    return host.strip("[]") or "0.0.0.0", number


def make_server(listen: str, slurm: SlurmControl, token: bytes, checkpoint_root: str | None = None) -> AgentServer:
    server = AgentServer(parse_listen(listen), slurm, token)
    server.checkpoint_root = checkpoint_root
    return server
