"""The Slurm agent: a small authenticated HTTP server beside slurmctld.

It serves exactly the operations of :class:`~.control.SlurmControl` and runs
each through a local :class:`~.client.SlurmClient`, which holds the safety
rules. Nothing else is reachable: no command execution, no job submission, no
cancel. See docs/decisions/0006-slurm-control-path.md for why it exists.

Every request but ``GET /healthz`` needs ``Authorization: Bearer <token>``,
the cluster's agent token (the ``<cluster>-agent-token`` Secret), compared in
constant time. Connections without the token get no keep-alive and are the
ones closed for room, so they can never keep a caller with the token out
(:class:`AgentServer`, on :mod:`slurmk8s.httpserver`). Routes (JSON in and out)::

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
name, reason, signal or body: the caller's mistake, and only that), 401
(token), 403 (a published path that is a link, not a plain file, or not
readable by others), 404, 405, 409 (not our drain), 502 (a Slurm command
failed: also ``argv``, ``returncode``, ``stderr``; or kind ``slurm-output``:
what Slurm printed could not be read) or 503 (slurmctld unreachable, the
config directory unreadable, or too many authenticated connections); the
server's own bounds (:mod:`slurmk8s.httpserver`) answer 408, 411, 413, 431
and 503 in the same shape.
"""

from __future__ import annotations

import hmac
import json
import re
from collections.abc import Callable
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote

from .. import log
from ..httpserver import HttpServer, Limits, Request, Response, error, json_response
from ..strict import count
from .accounting import Associations
from .client import InvalidArgument, NotOurDrain, SlurmError
from .control import AGENT_PORT, SlurmControl
from .model import job_to_dict, node_to_dict
from .published import Fail, published
from .reservations import reservation_to_dict

__all__ = ["AgentServer", "answer", "make_server", "read_token", "DEFAULT_PORT", "MAX_BODY", "LIMITS"]

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


def _body(request: Request) -> dict:
    if not request.body:
        return {}
    try:
        body = json.loads(request.body)
    except ValueError:
        raise Fail(HTTPStatus.BAD_REQUEST, "invalid", "the request body is not JSON") from None
    if not isinstance(body, dict):
        raise Fail(HTTPStatus.BAD_REQUEST, "invalid", "the request body must be a JSON object")
    return body


def _route(method: str, path: str) -> tuple[Callable[..., Any], dict]:
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


def answer(slurm: SlurmControl, checkpoint_root: str | None, request: Request) -> Response:
    """One request -> its answer. Only what the caller sent wrong is a 4xx: Slurm's
    failures, and answers of Slurm the agent cannot read, are 5xx."""
    if request.method == "GET" and request.path == "/healthz":
        return json_response(HTTPStatus.OK, {"ok": True})
    if not request.authenticated:
        return error(HTTPStatus.UNAUTHORIZED, "a valid 'Authorization: Bearer <token>' header is required "
                     "(the cluster's <cluster>-agent-token Secret)", "unauthorized",
                     {"WWW-Authenticate": 'Bearer realm="slurmk8s-agent"'})
    try:
        query = parse_qs(request.query)
        if request.method == "GET" and request.path == "/v1/published":
            return json_response(HTTPStatus.OK, published(checkpoint_root, query))
        handler, groups = _route(request.method, request.path)
        body = _body(request)
        result = handler(slurm, query, body, **groups)
        return json_response(HTTPStatus.OK, result if isinstance(result, dict) else {})
    except Fail as f:
        return error(f.status, f.message, f.kind, **f.extra)
    except NotOurDrain as exc:
        return error(HTTPStatus.CONFLICT, str(exc), "not-our-drain")
    except InvalidArgument as exc:  # a name, reason, signal or association the caller sent
        return error(HTTPStatus.BAD_REQUEST, str(exc), "invalid")
    except SlurmError as exc:
        return error(HTTPStatus.SERVICE_UNAVAILABLE if exc.unreachable else HTTPStatus.BAD_GATEWAY, str(exc),
                     "slurm-unreachable" if exc.unreachable else "slurm",
                     argv=exc.argv, returncode=exc.returncode, stderr=exc.stderr)
    except ValueError as exc:  # what Slurm (or the config directory) gave could not be read: not the caller's
        log.get("slurmk8s.agent").warning("cannot read Slurm's answer", method=request.method, path=request.path,
                                          error=str(exc)[:500])
        return error(HTTPStatus.BAD_GATEWAY, f"the agent could not read Slurm's answer: {str(exc)[:500]}",
                     "slurm-output")
    except OSError as exc:
        return error(HTTPStatus.SERVICE_UNAVAILABLE, f"{exc.__class__.__name__}: {exc}", "unavailable")


#: What the agent's server allows (:mod:`slurmk8s.httpserver`). Connections with the token
#: (the operator's and the bridge's, a few each) have 32 places that no one else can take.
LIMITS = Limits(deadline=10.0, max_header_bytes=16 * 1024, max_headers=64, max_body=MAX_BODY,
                max_buffered=4 * 1024 * 1024, max_connections=512, max_authenticated=32, workers=2,
                max_inflight=16)


class AgentServer(HttpServer):
    """The agent on :mod:`slurmk8s.httpserver`: a request whose ``Authorization``
    carries the token (compared in constant time) moves its connection to the
    pool of authenticated ones, where keep-alive works and nothing closes it for
    room; without the token, a connection serves one request (``/healthz`` or a
    401) and may be closed for a newcomer while it waits. Slurm commands run in
    the authenticated pool's threads, one per connection."""

    def __init__(self, address: tuple[str, int], slurm: SlurmControl, token: bytes, limits: Limits = LIMITS):
        if len(token) < 16:
            raise ValueError("the agent token must be at least 16 characters")
        self.slurm = slurm
        self.token = token
        #: The checkpoint directory on the shared storage (mounted read-only):
        #: /v1/published reads model versions below it. None: not served.
        self.checkpoint_root: str | None = None
        super().__init__(address, lambda request: answer(self.slurm, self.checkpoint_root, request), limits,
                         name="agent", authenticate=self._authorized, quiet=("/healthz",),
                         logger=log.get("slurmk8s.agent"))

    def _authorized(self, request: Request) -> bool:
        scheme, _, given = (request.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(given.strip().encode("latin-1", errors="replace"), self.token)


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) -> (host, port)."""
    host, sep, port = value.rpartition(":")
    number = count(port, 65535)
    if not sep or number is None:
        raise ValueError(f"--listen {value!r}: use HOST:PORT, e.g. 0.0.0.0:{DEFAULT_PORT}")
    return host.strip("[]") or "0.0.0.0", number


def make_server(listen: str, slurm: SlurmControl, token: bytes, checkpoint_root: str | None = None,
                limits: Limits = LIMITS) -> AgentServer:
    server = AgentServer(parse_listen(listen), slurm, token, limits)
    server.checkpoint_root = checkpoint_root
    return server
