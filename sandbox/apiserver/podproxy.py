"""``pods/log`` and ``pods/exec``: the API server's half of ``kubectl logs`` and
``kubectl exec``, as in Kubernetes: check the pod and container, find the
kubelet of the pod's node from the Node object (an address from
``status.addresses`` and ``status.daemonEndpoints.kubeletEndpoint.Port``),
and proxy to it (``/containerLogs/...``, ``/exec/...``), streaming both ways.

The API server authenticates to kubelets with its client certificate
(``tls.ensure_kubelet_client``: signed by its CA, common name
``kube-apiserver-kubelet-client``). Like kube-apiserver without
``--kubelet-certificate-authority``, it does not verify the kubelet's
(self-signed) serving certificate.

``pods/attach``, ``pods/portforward`` and ``pods/proxy`` are refused with a
message that says what to use instead. The choices are pure functions; the
proxying is a thin shell.
"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from urllib.parse import quote, urlencode

import aiohttp
from aiohttp import WSMsgType, web

from .errors import APIError

#: Subresources of pods that go to a kubelet, and those refused.
SERVED = ("log", "exec")
REFUSED = {
    "attach": "pods/attach is not served: the sandbox's containers have no stdin to attach to; "
              "use `kubectl logs -f POD` to watch a container's output or `kubectl exec -it POD -- sh` for a shell",
    "portforward": "pods/portforward is not served: pod addresses are reachable from this host directly; "
                   "connect to the pod's IP (`kubectl get pod POD -o wide`) and port",
    "proxy": "pods/proxy is not served: pod addresses are reachable from this host directly; "
             "connect to the pod's IP (`kubectl get pod POD -o wide`) and port",
}
#: Which Node address to dial, in this order (kube-apiserver's --kubelet-preferred-address-types,
#: with Hostname last: sandbox Node names are not host names).
ADDRESS_TYPES = ("InternalDNS", "InternalIP", "ExternalDNS", "ExternalIP", "Hostname")
LOG_PARAMS = ("tailLines", "limitBytes", "follow", "previous", "timestamps", "sinceSeconds", "sinceTime")
EXEC_PARAMS = ("command", "stdin", "stdout", "stderr", "tty")
CONNECT_TIMEOUT = 10
READ_TIMEOUT = 60  # a log that is not followed must keep coming


def refuse_unserved(sub: str) -> None:
    """Raise for a pod subresource that is not served; return for ``log`` and ``exec``."""
    if sub in REFUSED:
        raise APIError(400, REFUSED[sub], "BadRequest")


def kubelet_location(node: dict) -> tuple[str, int]:
    """Host and port of a Node's kubelet, from its status."""
    name = node.get("metadata", {}).get("name", "")
    status = node.get("status") or {}
    port = ((status.get("daemonEndpoints") or {}).get("kubeletEndpoint") or {}).get("Port")
    addresses = {a.get("type"): a.get("address") for a in status.get("addresses") or [] if a.get("address")}
    host = next((addresses[t] for t in ADDRESS_TYPES if t in addresses), None)
    if not port or not host:
        raise APIError(503, f'node "{name}" does not say where its kubelet listens (status.daemonEndpoints.'
                       "kubeletEndpoint.Port and status.addresses): is its kubelet (`slurmk8s sandbox kubelet`) "
                       "running?", "ServiceUnavailable")
    return host, int(port)


def pod_container(pod: dict, container: str | None, sub: str) -> str:
    """The container a log or exec request is for, checked against the pod (as
    kube-apiserver checks it); raises with Kubernetes' messages."""
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    name = meta["name"]
    names = [c["name"] for c in spec.get("containers", [])]
    if not container:
        if len(names) != 1:
            raise APIError(400, f"a container name must be specified for pod {name}, choose one of: [{' '.join(names)}]")
        container = names[0]
    if container not in names:
        raise APIError(400, f"container {container} is not valid for pod {name}")
    if sub == "exec" and status.get("phase") in ("Succeeded", "Failed"):
        raise APIError(400, f"cannot exec into a container in a completed pod; current phase is {status['phase']}")
    if not spec.get("nodeName"):
        raise APIError(400, f'container "{container}" in pod "{name}" is waiting to start: the pod is not bound '
                       "to a node yet (see its PodScheduled condition: `kubectl describe pod`)")
    return container


def kubelet_path(sub: str, namespace: str, pod: str, container: str, query) -> str:
    """The kubelet's path and query for a ``log`` or ``exec`` request."""
    params = LOG_PARAMS if sub == "log" else EXEC_PARAMS
    getall = query.getall if hasattr(query, "getall") else (lambda k, d=(): query.get(k, d))
    pairs = [(k, v) for k in params for v in getall(k, ())]
    base = "containerLogs" if sub == "log" else "exec"
    path = "/".join(quote(p, safe="") for p in (namespace, pod, container))
    return f"/{base}/{path}" + (f"?{urlencode(pairs)}" if pairs else "")


class PodProxy:
    def __init__(self, api, client_cert: tuple[Path, Path] | None) -> None:
        self.api = api
        self.client_cert = client_cert

    def _ssl(self) -> ssl.SSLContext:
        if self.client_cert is None:
            raise APIError(503, "this API server has no kubelet client certificate, so it cannot reach kubelets",
                           "ServiceUnavailable")
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # kubelets serve self-signed certificates
        ctx.load_cert_chain(str(self.client_cert[0]), str(self.client_cert[1]))
        return ctx

    def _locate(self, namespace: str, name: str, sub: str, container: str | None) -> tuple[str, str, str]:
        """(kubelet base URL, container, node name)."""
        pod = self.api.get(self.api.resource("", "v1", "pods"), namespace, name)
        container = pod_container(pod, container, sub)
        node_name = pod["spec"]["nodeName"]
        node = self.api.raw(self.api.resource("", "v1", "nodes"), None, node_name)
        if node is None:
            raise APIError(503, f'pod {name} is bound to node "{node_name}", which does not exist', "ServiceUnavailable")
        host, port = kubelet_location(node)
        host = f"[{host}]" if ":" in host else host
        return f"https://{host}:{port}", container, node_name

    @staticmethod
    def _unreachable(node: str, base: str, exc: Exception) -> APIError:
        return APIError(503, f'cannot reach the kubelet of node "{node}" at {base}: {exc or type(exc).__name__}; is '
                        "its kubelet (`slurmk8s sandbox kubelet`) running?", "ServiceUnavailable")

    async def serve(self, request: web.Request, namespace: str, name: str, sub: str) -> web.StreamResponse:
        if sub == "log":
            if request.method != "GET":
                raise APIError(405, f"{request.method} is not supported on pods/log (only GET)", "MethodNotAllowed")
            return await self._log(request, namespace, name)
        if request.method not in ("GET", "POST"):
            raise APIError(405, f"{request.method} is not supported on pods/exec (GET or POST)", "MethodNotAllowed")
        return await self._exec(request, namespace, name)

    async def _log(self, request: web.Request, namespace: str, name: str) -> web.StreamResponse:
        from ..podlogs import LogQueryError, log_query

        try:
            q = log_query(request.query)
        except LogQueryError as exc:
            raise APIError(400, str(exc)) from None
        base, container, node = self._locate(namespace, name, "log", request.query.get("container"))
        url = base + kubelet_path("log", namespace, name, container, request.query)
        timeout = aiohttp.ClientTimeout(total=None, connect=CONNECT_TIMEOUT,
                                        sock_read=None if q.follow else READ_TIMEOUT)
        resp = None
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session, session.get(url, ssl=self._ssl()) as r:
                if r.status != 200:
                    return web.Response(body=await r.read(), status=r.status, content_type=r.content_type)
                resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
                await resp.prepare(request)
                async for chunk in r.content.iter_any():
                    await resp.write(chunk)
        except (TimeoutError, aiohttp.ClientError) as exc:
            if resp is None:
                raise self._unreachable(node, base, exc) from None
            # Midway: the status line is sent; the log just ends.
        await resp.write_eof()
        return resp

    async def _exec(self, request: web.Request, namespace: str, name: str) -> web.StreamResponse:
        base, container, node = self._locate(namespace, name, "exec", request.query.get("container"))
        url = base + kubelet_path("exec", namespace, name, container, request.query)
        offered = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()]
        timeout = aiohttp.ClientTimeout(total=None, connect=CONNECT_TIMEOUT, sock_read=None)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            if request.method != "GET" or request.headers.get("Upgrade", "").lower() != "websocket" or not offered:
                # SPDY (kubectl's fallback) or plain HTTP: the kubelet says what is wrong with
                # the container, or that exec needs a WebSocket.
                return await self._plain(session, url, node, base)
            try:
                kws = await session.ws_connect(url, protocols=offered, ssl=self._ssl(), max_msg_size=0,
                                               timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=10))
            except aiohttp.WSServerHandshakeError:
                return await self._plain(session, url, node, base)
            except (TimeoutError, aiohttp.ClientConnectionError) as exc:
                raise self._unreachable(node, base, exc) from None
            async with kws:
                ws = web.WebSocketResponse(protocols=(kws.protocol,) if kws.protocol else (), max_msg_size=0)
                await ws.prepare(request)
                await _relay(ws, kws)
                return ws

    async def _plain(self, session: aiohttp.ClientSession, url: str, node: str, base: str) -> web.Response:
        try:
            async with session.get(url, ssl=self._ssl(), timeout=aiohttp.ClientTimeout(total=READ_TIMEOUT)) as r:
                return web.Response(body=await r.read(), status=r.status, content_type=r.content_type)
        except (TimeoutError, aiohttp.ClientConnectionError) as exc:
            raise self._unreachable(node, base, exc) from None


async def _relay(client: web.WebSocketResponse, kubelet: aiohttp.ClientWebSocketResponse) -> None:
    """Copy messages both ways until either side closes; then close the other."""

    async def copy(src, dst):
        async for msg in src:
            if msg.type == WSMsgType.BINARY:
                await dst.send_bytes(msg.data)
            elif msg.type == WSMsgType.TEXT:
                await dst.send_str(msg.data)

    tasks = [asyncio.create_task(copy(client, kubelet)), asyncio.create_task(copy(kubelet, client))]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await client.close()
        await kubelet.close()
