"""The agent's client: :class:`~.control.SlurmControl` over HTTP.

The operator (and the bridge) hold a :class:`RemoteSlurm` for each cluster.
It carries each call to the cluster's agent (:mod:`.agent`) and turns the
agent's refusals back into the exceptions :class:`~.client.SlurmClient`
raises: ``ValueError`` for a bad name, reason or signal, ``NotOurDrain``,
``SlurmError`` (with ``unreachable`` when slurmctld did not answer). When the
agent itself cannot be reached it raises :class:`AgentUnreachable`. Every
failure raises: callers never get a default that could pass for "no such
node" or "no jobs".
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import socket
import time
from typing import Mapping, Sequence
from urllib.parse import quote, urlencode, urlsplit

from .accounting import Associations
from .directory import Verdict
from .client import NotOurDrain, SlurmError
from .model import Job, Node, job_from_dict, node_from_dict
from .reservations import Reservation, reservation_from_dict

__all__ = ["RemoteSlurm", "AgentError", "AgentUnreachable", "AgentUnauthorized", "agent_url"]


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
                  timeout: float = 30) -> "RemoteSlurm":
    """A cluster's Slurm through its agent: the one way the operator, the bridge
    and the sandbox make that client. ``cluster`` is not used to address it:
    only the controller pod's IP is (:func:`agent_url`; while the pod has
    none, every call fails without sending the token anywhere)."""
    return RemoteSlurm(agent_url(controller_pod, port), token, timeout=timeout)


class AgentError(RuntimeError):
    """The agent answered with an error that has no Slurm equivalent."""

    def __init__(self, message: str, status: int | None = None, kind: str = ""):
        super().__init__(message)
        self.status = status
        self.kind = kind


class AgentUnreachable(AgentError):
    """No answer from the agent (not running yet, wrong address, network)."""


class AgentUnauthorized(AgentError):
    """The agent refused the token."""


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

    def recv_into(self, *args, **kwargs):  # type: ignore[override]
        self._left()
        return super().recv_into(*args, **kwargs)

    def recv(self, *args, **kwargs):  # type: ignore[override]
        self._left()
        return super().recv(*args, **kwargs)

    def sendall(self, *args, **kwargs):  # type: ignore[override]
        self._left()
        return super().sendall(*args, **kwargs)

    def send(self, *args, **kwargs):  # type: ignore[override]
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
    deadline = time.monotonic() + seconds
    url = urlsplit(base_url)
    conn = _DeadlineConnection(url.hostname or "", url.port, deadline)
    try:
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        body = resp.read(MAX_RESPONSE_BYTES + 1)
        if len(body) > MAX_RESPONSE_BYTES:
            raise ValueError(f"the answer is over {MAX_RESPONSE_BYTES} bytes")
        return resp.status, body
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
              query: Sequence[tuple[str, str]] = (), timeout: float | None = None) -> dict:
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
        try:
            status, raw = _request(self.base_url, method, target, data, headers, timeout or self.timeout)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise AgentUnreachable(
                f"the Slurm agent at {self.base_url} did not answer ({exc or type(exc).__name__}): check that "
                "the <cluster>-controller-0 pod runs and its agent container is ready") from None
        if status >= 400:
            raise self._error(_HTTPError(status, raw)) from None
        try:
            return json.loads(raw or b"{}")
        except ValueError:
            raise AgentError(f"the Slurm agent at {self.base_url} answered something that is not JSON",
                             status) from None

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
            return NotOurDrain(message)
        if exc.code == 400:
            return ValueError(message)
        if kind in ("slurm", "slurm-unreachable"):
            return SlurmError(payload.get("argv") or ["(agent)"], int(payload.get("returncode") or 1),
                              payload.get("stderr") or message)
        return AgentError(f"the Slurm agent at {self.base_url} answered {exc.code}: {message}", exc.code, kind)

    # SlurmControl

    def ping(self) -> bool:
        return bool(self._call("GET", "/v1/ping")["up"])

    def nodes(self) -> list[Node]:
        return [node_from_dict(d) for d in self._call("GET", "/v1/nodes")["nodes"]]

    def node(self, name: str) -> Node | None:
        return next((n for n in self.nodes() if n.name == name), None)

    def jobs(self, nodes: Sequence[str] = (), *, checkpoints: bool = False) -> list[Job]:
        out = self._call("GET", "/v1/jobs", query=[("node", n) for n in nodes]
                         + ([("checkpoints", "1")] if checkpoints else []))
        return [job_from_dict(d) for d in out["jobs"]]

    def drain(self, name: str, reason: str) -> None:
        self._call("POST", f"/v1/nodes/{_seg(name)}/drain", {"reason": reason})

    def set_down(self, name: str, reason: str) -> None:
        self._call("POST", f"/v1/nodes/{_seg(name)}/down", {"reason": reason})

    def undrain(self, name: str) -> None:
        self._call("POST", f"/v1/nodes/{_seg(name)}/undrain", {})

    def signal_node_jobs(self, name: str, signal: str) -> list[int]:
        out = self._call("POST", f"/v1/nodes/{_seg(name)}/signal", {"signal": signal})
        return [int(j) for j in out["jobs"]]

    def requeue(self, job_id: int) -> None:
        self._call("POST", f"/v1/jobs/{int(job_id)}/requeue", {}, timeout=self.requeue_timeout)

    def start_now(self, job_id: int) -> None:
        self._call("POST", f"/v1/jobs/{int(job_id)}/start-now", {})

    def cancel(self, job_id: int) -> None:
        self._call("POST", f"/v1/jobs/{int(job_id)}/cancel", {})

    def delete_node(self, name: str) -> None:
        self._call("DELETE", f"/v1/nodes/{_seg(name)}")

    def reservations(self) -> list[Reservation]:
        return [reservation_from_dict(d) for d in self._call("GET", "/v1/reservations")["reservations"]]

    def reserve(self, name: str, start: int) -> None:
        self._call("PUT", f"/v1/reservations/{_seg(name)}", {"start": int(start)})

    def unreserve(self, name: str) -> None:
        self._call("DELETE", f"/v1/reservations/{_seg(name)}")

    def reconfigure(self) -> None:
        self._call("POST", "/v1/reconfigure", {})

    def config_hash(self) -> str:
        return str(self._call("GET", "/v1/config-hash")["hash"])

    def apply_accounting(self, want: Associations) -> list[str]:
        return [str(c) for c in self._call("POST", "/v1/accounting", want.to_json())["applied"]]

    def directory(self) -> Verdict:
        return Verdict.from_json(self._call("GET", "/v1/directory"))

    def published(self, model_dir: str) -> str:
        """The text of ``<model_dir>/LATEST`` on the cluster's shared storage
        (FileNotFoundError when nothing is published there)."""
        try:
            return str(self._call("GET", "/v1/published", query=[("dir", model_dir)])["latest"])
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
