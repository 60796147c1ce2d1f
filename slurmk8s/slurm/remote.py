"""The agent's client: :class:`~.control.SlurmControl` over HTTP.

The operator (and the bridge) hold a :class:`RemoteSlurm` for each cluster.
It carries each call to the cluster's agent (:mod:`.agent`). Every failure
it raises is an :class:`AgentError` (one hierarchy for its callers to
handle), and each also is the exception :class:`~.client.SlurmClient`
raises for the same failure, so that a caller of either facade reads it
alike:

- :class:`AgentRefused` (also a ``ValueError``): the agent refused the
  request (400: a bad name, reason or signal);
- :class:`AgentNotOurDrain` (also :class:`~.client.NotOurDrain`);
- :class:`AgentSlurmError` (also :class:`~.client.SlurmError`, with
  ``unreachable`` when slurmctld did not answer);
- :class:`AgentUnreachable`: the agent itself did not answer;
- :class:`AgentUnauthorized`: it refused the token;
- :class:`AgentBadAnswer`: its answer is not what the call reads;
- :class:`AgentError` itself for any other refusal (``status``, ``kind``).

An agent that answers busy (429, or a 5xx with ``Retry-After``) is asked
again after what it asks for, within the call's deadline
(:func:`slurmk8s.backoff.patiently`). Callers never get a default that
could pass for "no such node" or "no jobs".
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar
from urllib.parse import quote, urlencode, urlsplit

from ..backoff import busy, patiently, retry_after
from .accounting import Associations
from .client import NotOurDrain, SlurmError
from .directory import Verdict
from .model import Job, Node, job_from_dict, node_from_dict
from .reservations import Reservation, reservation_from_dict

__all__ = ["RemoteSlurm", "AgentError", "AgentUnreachable", "AgentUnauthorized", "AgentRefused", "AgentBadAnswer",
           "AgentSlurmError", "AgentNotOurDrain", "agent_url"]

T = TypeVar("T")


def agent_url(controller_pod: Mapping | None, port: int) -> str | None:
    """``http://<pod IP>:<port>`` of the agent in the controller pod, or None
    while the pod has no IP. Only the IP the kubelet reported: never a DNS
    name (one built from spec.clusterDomain could send the bearer token to
    another host), and nothing that does not parse as an IP address."""
    raw = ((controller_pod or {}).get("status") or {}).get("podIP")
    try:
        ip = ipaddress.ip_address(raw) if isinstance(raw, str) else None
    except ValueError:
        return None
    if ip is None:
        return None
    return f"http://[{ip}]:{int(port)}" if ip.version == 6 else f"http://{ip}:{int(port)}"


def cluster_agent(cluster: object, token: bytes | str, controller_pod: Mapping | None, *, port: int,
                  timeout: float = 30) -> RemoteSlurm:
    """A cluster's Slurm through its agent: the one way the operator, the bridge
    and the sandbox make that client. ``cluster`` is not used to address it:
    only the controller pod's IP is (:func:`agent_url`; while the pod has
    none, every call fails without sending the token anywhere)."""
    return RemoteSlurm(agent_url(controller_pod, port), token, timeout=timeout)


class AgentError(RuntimeError):
    """Every failure of the agent's client; itself: the agent answered with an
    error that has no Slurm equivalent."""

    def __init__(self, message: str, status: int | None = None, kind: str = ""):
        super().__init__(message)
        self.status = status
        self.kind = kind


class AgentUnreachable(AgentError):
    """No answer from the agent (not running yet, wrong address, network)."""


class AgentUnauthorized(AgentError):
    """The agent refused the token."""


class AgentRefused(AgentError, ValueError):
    """The agent refused the request as malformed (400): a bad node name,
    reason or signal, as :class:`~.client.SlurmClient`'s ``ValueError``."""


class AgentBadAnswer(AgentError):
    """The agent's answer is not JSON, or not the shape the call reads."""


class AgentSlurmError(SlurmError, AgentError):
    """A Slurm command the agent ran failed (a :class:`~.client.SlurmError`)."""

    def __init__(self, argv: Sequence[str], returncode: int, stderr: str, status: int | None = None,
                 kind: str = ""):
        SlurmError.__init__(self, argv, returncode, stderr)
        self.status = status
        self.kind = kind


class AgentNotOurDrain(NotOurDrain, AgentError):
    """Someone else drained the node (a :class:`~.client.NotOurDrain`)."""

    def __init__(self, message: str, status: int | None = None, kind: str = ""):
        AgentError.__init__(self, message, status, kind)


def _time_left(deadline: float) -> float:
    """Seconds until ``deadline`` (``time.monotonic``); TimeoutError once it passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the call's deadline passed")
    return left


class _DeadlineSocket(socket.socket):
    """A socket whose every operation ends by one deadline (``time.monotonic``):
    before each read or write its timeout is set to the time left, so a peer
    that trickles one byte at a time cannot stretch a call past it (a plain
    socket timeout bounds each read, not their sum)."""

    deadline: float = 0.0

    def _left(self) -> None:
        self.settimeout(_time_left(self.deadline))

    def recv_into(self, *args, **kwargs):
        self._left()
        return super().recv_into(*args, **kwargs)

    def recv(self, *args, **kwargs):
        self._left()
        return super().recv(*args, **kwargs)

    def sendall(self, *args, **kwargs):
        self._left()
        return super().sendall(*args, **kwargs)

    def send(self, *args, **kwargs):
        self._left()
        return super().send(*args, **kwargs)


class _DeadlineConnection(http.client.HTTPConnection):
    """Plain HTTP to the agent (its address is a pod IP), connect, request
    and response all within one deadline."""

    def __init__(self, host: str, port: int | None, deadline: float):
        super().__init__(host, port, timeout=max(deadline - time.monotonic(), 0.001))
        self.deadline = deadline

    def connect(self) -> None:
        raw = socket.create_connection((self.host, self.port), timeout=_time_left(self.deadline))
        sock = _DeadlineSocket(raw.family, raw.type, raw.proto, fileno=raw.detach())
        sock.deadline = self.deadline
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock


class _HTTPError(Exception):
    def __init__(self, code: int, body: bytes):
        super().__init__(f"HTTP {code}")
        self.code = code
        self.body = body


#: The most an agent's answer may hold (10,000 jobs are a few MiB).
MAX_RESPONSE_BYTES = 256 << 20


def _request(base_url: str, method: str, path: str, data: bytes | None, headers: dict[str, str],
             seconds: float) -> tuple[int, bytes]:
    """One HTTP request, the whole exchange within ``seconds``: (status, body)."""
    status, body, _ = _exchange(base_url, method, path, data, headers, time.monotonic() + seconds)
    return status, body


def _exchange(base_url: str, method: str, path: str, data: bytes | None, headers: dict[str, str],
              deadline: float) -> tuple[int, bytes, str | None]:
    """One HTTP request, the whole exchange by ``deadline`` (``time.monotonic``):
    (status, body, its Retry-After header)."""
    _time_left(deadline)
    url = urlsplit(base_url)
    conn = _DeadlineConnection(url.hostname or "", url.port, deadline)
    try:
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        body = resp.read(MAX_RESPONSE_BYTES + 1)
        if len(body) > MAX_RESPONSE_BYTES:
            raise ValueError(f"the answer is over {MAX_RESPONSE_BYTES} bytes")
        return resp.status, body, resp.getheader("Retry-After")
    finally:
        conn.close()


class RemoteSlurm:
    """Slurm, reached through the agent at ``base_url`` with ``token``.

    ``timeout`` bounds each call as a whole (connecting, sending, and reading
    the whole answer: a deadline, not a limit per read); a requeue may take
    up to ``requeue_timeout`` (the agent waits for the job to leave
    COMPLETING).
    """

    def __init__(self, base_url: str | None, token: bytes | str, *, timeout: float = 30,
                 requeue_timeout: float = 75):
        #: None: the controller pod has no IP yet; every call raises
        #: AgentUnreachable and nothing is sent.
        self.base_url = base_url.rstrip("/") if base_url else None
        self._token = token.decode() if isinstance(token, bytes) else token
        self.timeout = timeout
        self.requeue_timeout = requeue_timeout

    def __repr__(self) -> str:
        return f"RemoteSlurm({self.base_url!r})"  # never the token

    def _call(self, method: str, path: str, body: dict | None = None, *,
              query: Sequence[tuple[str, str]] = (), timeout: float | None = None,
              read: Callable[[Any], T] = lambda answer: answer) -> T:
        """One call; ``read`` takes what the call returns from the answer
        (a KeyError, TypeError or ValueError there: :class:`AgentBadAnswer`)."""
        if self.base_url is None:
            raise AgentUnreachable("the <cluster>-controller-0 pod has no IP yet, so its Slurm agent cannot be "
                                   "reached; wait for the pod to be scheduled and started")
        target = path + (f"?{urlencode(list(query))}" if query else "")
        data = json.dumps(body).encode() if body is not None else None
        headers = {
            "Authorization": f"Bearer {self._token}",
            "Accept": "application/json",
            **({"Content-Type": "application/json"} if data is not None else {}),
        }
        seconds = timeout or self.timeout
        deadline = time.monotonic() + seconds
        base_url = self.base_url

        def send() -> tuple[int, bytes, str | None]:
            return _exchange(base_url, method, target, data, headers, deadline)

        def wait_of(answer: tuple[int, bytes, str | None]) -> float | None:
            # Busy: ask again after what it asks, if that leaves time for the answer.
            return retry_after(answer[2], cap=seconds / 3) if busy(answer[0], answer[2]) else None

        try:
            status, raw, _ = patiently(send, wait_of, budget=seconds / 2)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise AgentUnreachable(
                f"the Slurm agent at {self.base_url} did not answer ({exc or type(exc).__name__}): check that "
                "the <cluster>-controller-0 pod runs and its agent container is ready") from None
        if status >= 400:
            raise self._error(_HTTPError(status, raw)) from None
        try:
            return read(json.loads(raw or b"{}"))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise AgentBadAnswer(f"the Slurm agent at {self.base_url} answered what {method} {path} cannot "
                                 f"read ({type(exc).__name__}: {str(exc)[:200]})", status) from None

    def _error(self, exc: _HTTPError) -> Exception:
        try:
            payload = json.loads(exc.body or b"{}")
        except ValueError:
            payload = {}
        if not isinstance(payload, dict):
            payload = {}
        message = payload.get("error") or f"HTTP {exc.code}"
        kind = payload.get("kind", "")
        if exc.code == 401:
            return AgentUnauthorized(
                f"the Slurm agent at {self.base_url} refused the token: the operator reads it from the "
                "<cluster>-agent-token Secret, which must be the one mounted in the controller pod",
                exc.code, kind)
        if exc.code == 409 and kind == "not-our-drain":
            return AgentNotOurDrain(str(message), exc.code, kind)
        if exc.code == 400:
            return AgentRefused(str(message), exc.code, kind)
        if kind in ("slurm", "slurm-unreachable"):
            argv = payload.get("argv")
            try:
                code = int(payload.get("returncode") or 1)
            except (TypeError, ValueError):
                code = 1
            return AgentSlurmError([str(a) for a in argv] if isinstance(argv, list) and argv else ["(agent)"],
                                   code, str(payload.get("stderr") or message), exc.code, kind)
        return AgentError(f"the Slurm agent at {self.base_url} answered {exc.code}: {message}", exc.code, kind)

    # SlurmControl

    def ping(self) -> bool:
        return self._call("GET", "/v1/ping", read=lambda a: bool(a["up"]))

    def nodes(self) -> list[Node]:
        return self._call("GET", "/v1/nodes", read=lambda a: [node_from_dict(d) for d in a["nodes"]])

    def node(self, name: str) -> Node | None:
        return next((n for n in self.nodes() if n.name == name), None)

    def jobs(self, nodes: Sequence[str] = (), *, checkpoints: bool = False) -> list[Job]:
        return self._call("GET", "/v1/jobs", query=[("node", n) for n in nodes]
                          + ([("checkpoints", "1")] if checkpoints else []),
                          read=lambda a: [job_from_dict(d) for d in a["jobs"]])

    def drain(self, name: str, reason: str) -> None:
        self._call("POST", f"/v1/nodes/{_seg(name)}/drain", {"reason": reason})

    def set_down(self, name: str, reason: str) -> None:
        self._call("POST", f"/v1/nodes/{_seg(name)}/down", {"reason": reason})

    def undrain(self, name: str) -> None:
        self._call("POST", f"/v1/nodes/{_seg(name)}/undrain", {})

    def signal_node_jobs(self, name: str, signal: str) -> list[int]:
        return self._call("POST", f"/v1/nodes/{_seg(name)}/signal", {"signal": signal},
                          read=lambda a: [int(j) for j in a["jobs"]])

    def requeue(self, job_id: int) -> None:
        self._call("POST", f"/v1/jobs/{int(job_id)}/requeue", {}, timeout=self.requeue_timeout)

    def start_now(self, job_id: int) -> None:
        self._call("POST", f"/v1/jobs/{int(job_id)}/start-now", {})

    def cancel(self, job_id: int) -> None:
        self._call("POST", f"/v1/jobs/{int(job_id)}/cancel", {})

    def delete_node(self, name: str) -> None:
        self._call("DELETE", f"/v1/nodes/{_seg(name)}")

    def reservations(self) -> list[Reservation]:
        return self._call("GET", "/v1/reservations",
                          read=lambda a: [reservation_from_dict(d) for d in a["reservations"]])

    def reserve(self, name: str, start: int) -> None:
        self._call("PUT", f"/v1/reservations/{_seg(name)}", {"start": int(start)})

    def unreserve(self, name: str) -> None:
        self._call("DELETE", f"/v1/reservations/{_seg(name)}")

    def reconfigure(self) -> None:
        self._call("POST", "/v1/reconfigure", {})

    def config_hash(self) -> str:
        return self._call("GET", "/v1/config-hash", read=lambda a: str(a["hash"]))

    def apply_accounting(self, want: Associations) -> list[str]:
        return self._call("POST", "/v1/accounting", want.to_json(), read=lambda a: [str(c) for c in a["applied"]])

    def directory(self) -> Verdict:
        return self._call("GET", "/v1/directory", read=Verdict.from_json)

    def published(self, model_dir: str) -> str:
        """The text of ``<model_dir>/LATEST`` on the cluster's shared storage
        (FileNotFoundError when nothing is published there)."""
        try:
            return self._call("GET", "/v1/published", query=[("dir", model_dir)], read=lambda a: str(a["latest"]))
        except AgentError as exc:
            if exc.status == 404:
                raise FileNotFoundError(f"{model_dir}/LATEST: {exc}") from None
            raise

    def healthy(self) -> bool:
        """The agent answers /healthz (no token needed); says nothing about Slurm."""
        if self.base_url is None:
            return False
        try:
            return _request(self.base_url, "GET", "/healthz", None, {}, self.timeout)[0] == 200
        except (OSError, http.client.HTTPException, ValueError):
            return False


def _seg(name: str) -> str:
    """A node name as one path segment; the agent checks it."""
    return quote(name, safe="")
