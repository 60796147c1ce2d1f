"""The kubelet's own HTTPS API, the part of a real kubelet's port 10250 that
``kubectl logs`` and ``kubectl exec`` reach through the API server:

    GET /containerLogs/{namespace}/{pod}/{container}?tailLines=&limitBytes=&follow=&previous=
    GET /exec/{namespace}/{pod}/{container}?command=..&stdin=&stdout=&stderr=&tty=   (WebSocket,
        v5.channel.k8s.io or v4.channel.k8s.io: see ``remotecommand``)
    GET /healthz

It listens on 127.0.0.1 (an ephemeral port) with a self-signed certificate
kept in ``<kubelet dir>/pki/``, and answers only clients that show a
certificate signed by the CA of the API server the kubelet reports to (the
one in its kubeconfig) with the common name ``kube-apiserver-kubelet-client``:
the API server's, which nobody else holds. The kubelet publishes the port on
its Nodes (``status.daemonEndpoints.kubeletEndpoint.Port``) with the address
``InternalDNS: localhost``; the API server dials that.

Logs are what the container wrote (``podlogs`` knows the files); commands run
in the container's namespaces and root through ``runcruntime.exec_argv``, with
the container's environment, under a pseudo-terminal for ``tty=true``.

One module though over 400 lines: logs and exec share its TLS, its client
check and its pod lookup; exec's stream (pipes or a pty) is most of it, and
its wire protocol is already apart (``remotecommand``).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import signal
import ssl
import struct
import termios
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import WSMsgType, web

from . import podlogs, remotecommand, runcruntime, runtime
from .apiserver.errors import APIError
from .apiserver.tls import KUBELET_CLIENT, ensure_self_signed
from .remotecommand import ProtocolError

if TYPE_CHECKING:
    from .kubelet import Kubelet, LocalPod

FOLLOW_POLL = 0.2  # seconds between looks at a followed log
DRAIN_AFTER_EXIT = 2.0  # how long output may still come after an exec'd command ended
EXEC_IDLE_TIMEOUT = 4 * 3600.0  # an exec session with no traffic either way for this long ends
CHUNK = 32 * 1024


def node_status(port: int, host: str = "127.0.0.1") -> dict:
    """What a Node's status says about where its kubelet listens."""
    address = "localhost" if host in ("127.0.0.1", "localhost", "::1") else host
    return {"daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
            "addresses": [{"type": "InternalDNS", "address": address}]}


def _json_error(exc: APIError) -> web.Response:
    return web.json_response(exc.status(), status=exc.code)


def _waiting(container: str, pod: str) -> APIError:
    return APIError(400, f'container "{container}" in pod "{pod}" is waiting to start: ContainerCreating')


class KubeletServer:
    def __init__(self, kubelet: Kubelet, ca_file: str | Path, pki_dir: Path, host: str = "127.0.0.1",
                 port: int = 0):
        self.kubelet = kubelet
        self.ca_file = str(ca_file)
        self.pki_dir = pki_dir
        self.host = host
        self.port = port
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._until: threading.Event | None = None
        self._traffic: dict[web.WebSocketResponse, float] = {}  # exec session -> when data last went either way

    # Lifecycle

    def start(self, until: threading.Event | None = None) -> KubeletServer:
        """Serve (in a thread of its own) until ``stop()``, or until ``until`` is set."""
        self._until = until
        self._thread = threading.Thread(target=self._run, name="kubelet-server", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise runtime.SandboxError(f"the kubelet cannot serve its API on {self.host}:{self.port}: {self._error}")
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)
        self._thread = None

    def node_status(self) -> dict:
        return node_status(self.port, self.host)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # noqa: BLE001 - reported by start()
            self._error = exc
            self._ready.set()

    def _ssl(self) -> ssl.SSLContext:
        crt, key = ensure_self_signed(self.pki_dir, ["127.0.0.1", "localhost", self.host], "slurmk8s-kubelet")
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(str(crt), str(key))
        ctx.load_verify_locations(cafile=self.ca_file)
        ctx.verify_mode = ssl.CERT_REQUIRED  # no certificate, no connection
        return ctx

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        app = web.Application(middlewares=[self._authenticate])
        app.router.add_get("/healthz", _healthz)
        app.router.add_get("/containerLogs/{namespace}/{pod}/{container}", self.logs)
        app.router.add_route("*", "/exec/{namespace}/{pod}/{container}", self.exec)
        runner = web.AppRunner(app, handle_signals=False, handler_cancellation=True, access_log=None,
                               shutdown_timeout=2.0)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, ssl_context=self._ssl(), reuse_address=True)
        try:
            await site.start()
            self.port = runner.addresses[0][1]
            self._ready.set()
            while not self._stop.is_set() and not (self._until is not None and self._until.is_set()):
                try:
                    await asyncio.wait_for(self._stop.wait(), 0.5)
                except TimeoutError:
                    pass
        finally:
            await runner.cleanup()

    @web.middleware
    async def _authenticate(self, request: web.Request, handler):
        cert = request.transport.get_extra_info("peercert") if request.transport else None
        names = {v for rdn in (cert or {}).get("subject", ()) for k, v in rdn if k == "commonName"}
        if KUBELET_CLIENT not in names:
            return _json_error(APIError(403, f"only the API server ({KUBELET_CLIENT}) may call this kubelet: "
                                             "go through the API server (kubectl logs, kubectl exec)"))
        try:
            return await handler(request)
        except APIError as exc:
            return _json_error(exc)

    # Pods

    def _find(self, namespace: str, pod: str, container: str) -> tuple[LocalPod, Path, Path]:
        k = self.kubelet
        with k.lock:  # one being stopped only if there is no other (a StatefulSet's pod coming back)
            named = sorted((p for p in k.pods.values() if p.namespace == namespace and p.name == pod),
                           key=lambda p: p.uid in k.stopping)
        local = named[0] if named else None
        if local is None:
            raise _waiting(container, pod)
        pod_dir = k.pod_dir(local)
        ctrs = podlogs.containers(pod_dir)
        if container not in ctrs:
            if not ctrs:  # being started (again)
                raise _waiting(container, pod)
            raise APIError(404, f'container "{container}" not found in pod "{pod}": it has {", ".join(ctrs)}')
        return local, pod_dir, ctrs[container]

    # Logs

    async def logs(self, request: web.Request) -> web.StreamResponse:
        ns, pod, container = (request.match_info[k] for k in ("namespace", "pod", "container"))
        try:
            q = podlogs.log_query(request.query)
        except podlogs.LogQueryError as exc:
            raise APIError(400, str(exc)) from None
        local, pod_dir, ctr = self._find(ns, pod, container)
        path = podlogs.log_file(ctr, q.previous)
        try:
            f = open(path, "rb")
        except FileNotFoundError:
            if q.previous:
                raise APIError(400, f'previous terminated container "{container}" in pod "{pod}" not found') from None
            raise _waiting(container, pod) from None
        with f:
            resp = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8"})
            await resp.prepare(request)
            budget = q.limit_bytes
            f.seek(podlogs.tail_offset(f, q.tail_lines))
            while (budget is None or budget > 0) and (chunk := f.read(CHUNK)):
                budget = await self._write(resp, chunk, budget)
            if q.follow and not q.previous:
                await self._follow(resp, f, path, local, pod_dir, podlogs.index(ctr), budget)
            await resp.write_eof()
        return resp

    @staticmethod
    async def _write(resp: web.StreamResponse, data: bytes, budget: int | None) -> int | None:
        if budget is not None:
            data, budget = data[:budget], budget - min(budget, len(data))
        if data:
            await resp.write(data)
        return budget

    async def _follow(self, resp, f, path: Path, local: LocalPod, pod_dir: Path, index: int,
                      budget: int | None) -> None:
        """Send what the container writes until it ends (or the pod is started
        again: a new log), the byte budget is spent, or the client goes."""
        inode = os.fstat(f.fileno()).st_ino
        seen = False
        while budget is None or budget > 0:
            data = f.read(CHUNK)
            if data:
                budget = await self._write(resp, data, budget)
                continue
            running = runtime.alive(local.holder) and runcruntime.container_pid(local.holder, pod_dir, index) is not None
            seen = seen or running
            try:
                replaced = os.stat(path).st_ino != inode
            except FileNotFoundError:
                replaced = True
            if replaced or not runtime.alive(local.holder) or (seen and not running):
                await self._write(resp, f.read(), budget)
                return
            await asyncio.sleep(FOLLOW_POLL)

    # Exec

    async def exec(self, request: web.Request) -> web.StreamResponse:
        ns, pod, container = (request.match_info[k] for k in ("namespace", "pod", "container"))
        try:
            opts = remotecommand.exec_options(request.query)
        except ProtocolError as exc:
            raise APIError(400, str(exc)) from None
        local, pod_dir, ctr = self._find(ns, pod, container)
        try:
            argv = runcruntime.exec_argv(local.holder, pod_dir, list(opts.command), self._env(ctr, opts.tty),
                                      container=podlogs.index(ctr), tty=opts.tty)
        except runtime.SandboxError:
            raise APIError(400, f'container "{container}" in pod "{pod}" is not running (it is starting, '
                                "restarting or has ended): see `kubectl get pod` and try again when it is Running") from None
        # Checked after the container: a client that fell back from WebSocket learns what was wrong.
        protocol = remotecommand.chosen_protocol(request.headers.get("Sec-WebSocket-Protocol", ""))
        if request.method != "GET" or request.headers.get("Upgrade", "").lower() != "websocket" or not protocol:
            raise APIError(400, "exec is served over WebSocket with subprotocol "
                           f"{' or '.join(remotecommand.PROTOCOLS)} only (SPDY is not): use kubectl 1.30 or later "
                           "without KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false, or kubernetes.stream.stream")
        ws = web.WebSocketResponse(protocols=(protocol,), max_msg_size=0)
        await ws.prepare(request)
        self._traffic[ws] = asyncio.get_running_loop().time()
        try:
            if opts.tty:
                code = await self._run_tty(ws, argv, opts)
            else:
                code = await self._run_pipes(ws, argv, opts)
        except OSError as exc:
            await self._send(ws, remotecommand.ERROR,
                             _dumps(remotecommand.error_status(f"cannot run {list(opts.command)}: {exc}")))
        else:
            if code is not None:
                await self._send(ws, remotecommand.ERROR, _dumps(remotecommand.exit_status(code, opts.command)))
        finally:
            self._traffic.pop(ws, None)
        await ws.close()
        return ws

    @staticmethod
    def _env(ctr: Path, tty: bool) -> dict[str, str]:
        env = dict(item.split("=", 1) for item in (ctr / "env").read_text().split("\0") if "=" in item)
        if tty:
            env.setdefault("TERM", "xterm")
        return env

    async def _send(self, ws: web.WebSocketResponse, channel: int, data: bytes) -> None:
        self._traffic[ws] = asyncio.get_running_loop().time()
        if not ws.closed:
            try:
                await ws.send_bytes(remotecommand.frame(channel, data))
            except ConnectionResetError:
                pass

    async def _run_pipes(self, ws: web.WebSocketResponse, argv: list[str], opts) -> int | None:
        pipe = asyncio.subprocess.PIPE
        devnull = asyncio.subprocess.DEVNULL
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=pipe if opts.stdin else devnull, stdout=pipe if opts.stdout else devnull,
            stderr=pipe if opts.stderr else devnull, start_new_session=True)

        async def pump(stream, channel):
            while chunk := await stream.read(CHUNK):
                await self._send(ws, channel, chunk)

        async def write(data: bytes) -> None:
            if proc.stdin is not None and not proc.stdin.is_closing():
                proc.stdin.write(data)
                await proc.stdin.drain()

        def close_stdin() -> None:
            if proc.stdin is not None:
                proc.stdin.close()

        pumps = [asyncio.create_task(pump(s, ch)) for s, ch in ((proc.stdout, remotecommand.STDOUT),
                                                                 (proc.stderr, remotecommand.STDERR)) if s]
        return await self._supervise(ws, proc, pumps, write, close_stdin, None)

    async def _run_tty(self, ws: web.WebSocketResponse, argv: list[str], opts) -> int | None:
        master, slave = os.openpty()
        try:
            proc = await asyncio.create_subprocess_exec(*argv, stdin=slave, stdout=slave, stderr=slave,
                                                        start_new_session=True)
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        os.set_blocking(master, False)
        loop = asyncio.get_running_loop()
        out: asyncio.Queue[bytes | None] = asyncio.Queue()

        def readable() -> None:
            try:
                data = os.read(master, CHUNK)
            except BlockingIOError:
                return
            except OSError:  # EIO: every process let go of the terminal
                data = b""
            if not data:
                loop.remove_reader(master)
            out.put_nowait(data or None)

        loop.add_reader(master, readable)

        async def pump():
            while (chunk := await out.get()) is not None:
                await self._send(ws, remotecommand.STDOUT, chunk)

        async def write(data: bytes) -> None:
            while data:
                try:
                    data = data[os.write(master, data):]
                except BlockingIOError:
                    await asyncio.sleep(0.01)

        def resize(cols: int, rows: int) -> None:
            fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

        try:
            return await self._supervise(ws, proc, [asyncio.create_task(pump())], write,
                                         lambda: None, resize)
        finally:
            loop.remove_reader(master)
            os.close(master)

    async def _supervise(self, ws, proc, pumps, write, close_stdin, resize) -> int | None:
        """Feed the client's stdin and resizes to the command until it ends;
        its exit code, or None when the client went first (the command is killed)."""

        async def client():
            async for msg in ws:
                self._traffic[ws] = asyncio.get_running_loop().time()
                if msg.type not in (WSMsgType.BINARY, WSMsgType.TEXT) or not msg.data:
                    continue
                channel, data = remotecommand.parse(msg.data)
                try:
                    if channel == remotecommand.STDIN:
                        await write(data)
                    elif channel == remotecommand.RESIZE and resize is not None:
                        resize(*remotecommand.resize(data))
                    elif channel == remotecommand.CLOSE and data[:1] == bytes([remotecommand.STDIN]):
                        close_stdin()
                except (ProtocolError, BrokenPipeError, ConnectionResetError, OSError):
                    continue

        async def idle():
            loop = asyncio.get_running_loop()
            while (left := self._traffic.get(ws, 0) + EXEC_IDLE_TIMEOUT - loop.time()) > 0:
                await asyncio.sleep(min(left, 60))

        reader = asyncio.create_task(client())
        waiter = asyncio.create_task(proc.wait())
        watchdog = asyncio.create_task(idle())
        try:
            await asyncio.wait({reader, waiter, watchdog}, return_when=asyncio.FIRST_COMPLETED)
            if not waiter.done():  # the client went, or nothing happened for EXEC_IDLE_TIMEOUT
                return None
            if pumps:
                await asyncio.wait(pumps, timeout=DRAIN_AFTER_EXIT)
            code = proc.returncode
            return code if code >= 0 else 128 - code
        finally:
            for task in (reader, watchdog, *pumps):
                task.cancel()
            if proc.returncode is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                await proc.wait()


def _dumps(obj: dict) -> bytes:
    return json.dumps(obj).encode()


async def _healthz(_: web.Request) -> web.Response:
    return web.Response(text="ok")
