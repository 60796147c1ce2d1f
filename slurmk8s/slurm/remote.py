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

import ipaddress
import json
import socket
import urllib.error
import urllib.request
from typing import Mapping, Sequence
from urllib.parse import quote, urlencode

from .accounting import Associations
from .client import NotOurDrain, SlurmError
from .model import Job, Node, job_from_dict, node_from_dict

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


class RemoteSlurm:
    """Slurm, reached through the agent at ``base_url`` with ``token``.

    ``timeout`` bounds each request; a requeue may take up to
    ``requeue_timeout`` (the agent waits for the job to leave COMPLETING).
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
        url = self.base_url + path + (f"?{urlencode(list(query))}" if query else "")
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, method=method, headers={
            "Authorization": f"Bearer {self._token}",
            "Accept": "application/json",
            **({"Content-Type": "application/json"} if data is not None else {}),
        })
        try:
            with urllib.request.urlopen(request, timeout=timeout or self.timeout) as resp:
                return json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as exc:
            raise self._error(exc) from None
        except (urllib.error.URLError, socket.timeout, ConnectionError, TimeoutError) as exc:
            reason = getattr(exc, "reason", exc)
            raise AgentUnreachable(
                f"the Slurm agent at {self.base_url} did not answer ({reason}): check that the "
                "<cluster>-controller-0 pod runs and its agent container is ready") from None

    def _error(self, exc: urllib.error.HTTPError) -> Exception:
        try:
            payload = json.loads(exc.read() or b"{}")
        except ValueError:
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

    def jobs(self, nodes: Sequence[str] = ()) -> list[Job]:
        out = self._call("GET", "/v1/jobs", query=[("node", n) for n in nodes])
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

    def reconfigure(self) -> None:
        self._call("POST", "/v1/reconfigure", {})

    def config_hash(self) -> str:
        return str(self._call("GET", "/v1/config-hash")["hash"])

    def apply_accounting(self, want: Associations) -> list[str]:
        return [str(c) for c in self._call("POST", "/v1/accounting", want.to_json())["applied"]]

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
            with urllib.request.urlopen(self.base_url + "/healthz", timeout=self.timeout) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False


def _seg(name: str) -> str:
    """A node name as one path segment; the agent checks it."""
    return quote(name, safe="")
