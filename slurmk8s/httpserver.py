"""The one HTTP server of every server slurmk8s runs: the Slurm agent, the
metrics servers, the operator's webhook, the operator's and the bridge's
``/healthz``, and ``serve`` (decision record 42).

A researcher's job or login shell can reach these ports, so no client may
exhaust the process or keep the caller that matters (the operator and the
bridge with their token, the kubelet's probe, Prometheus, the API server)
out:

- One event-loop thread reads every connection. A request (TLS handshake,
  request line, headers, body) must arrive whole within ``deadline`` seconds
  of the connection, or of the previous reply on it, however slowly it
  trickles. A connection waiting for its request holds a buffer and no
  thread.
- Only a complete request reaches a worker thread: a bounded pool, with a
  bounded number of requests queued or running (``max_inflight``); one more
  is answered 503 at once. Connections whose request carried the token (when
  the server has one: the agent) have a pool of their own.
- The request line and headers are bounded in bytes and count, the body in
  bytes (``Content-Length`` only), and all connections' unread requests
  together in bytes (``max_buffered``). Over a bound: a JSON error (431, 413,
  411, 400, 408) and the connection is closed.
- At most ``max_connections`` are open. One more closes a connection still
  waiting for a request without the token (a slow or idle one: a prompt
  request is already with a worker): the oldest of the client address that
  holds the most, so a flood from one pod closes its own connections and
  never the probe's, nor the newcomer. Over ``max_buffered``, waiting
  connections holding bytes are closed the same way. Connections with the token (at most
  ``max_authenticated``) are never closed for others; without the token there
  is no keep-alive where a token exists.
- A reply must be taken within ``reply_deadline``; it is written from the
  event loop, so a client that does not read holds no thread.
- TLS (the webhook) is done on the same loop, through memory BIOs, so a
  handshake counts in the connection's deadline and cap; the context is asked
  for per connection (a renewed certificate serves the next one).
- Every error is JSON, ``{"error": message, "kind": kind}``. Each answered
  request is logged (method, path without its query, status, milliseconds,
  client address; never a header), ``quiet`` paths at debug; connections
  closed for a bound are counted and logged at most every 10 s.

Standard library only (structlog when installed): the serve image runs this
file beside ``serve.py`` with nothing but ``python3``.

Over 500 lines because the serve image copies it as one file beside
``serve.py``: the pure request-head rules, the TLS layer and the loop's
connection states would otherwise be three files to keep in step there.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

try:
    import structlog

    def _logger(name: str) -> Any:
        return structlog.get_logger(name)
except ImportError:  # the serve image: standard library only
    class _StdLogger:
        def __init__(self, name: str):
            self._log = logging.getLogger(name)

        def _emit(self, level: int, event: str, **kw: Any) -> None:
            if self._log.isEnabledFor(level):
                self._log.log(level, "%s %s", event, " ".join(f"{k}={v}" for k, v in kw.items()))

        def debug(self, event: str, **kw: Any) -> None:
            self._emit(logging.DEBUG, event, **kw)

        def info(self, event: str, **kw: Any) -> None:
            self._emit(logging.INFO, event, **kw)

        def warning(self, event: str, **kw: Any) -> None:
            self._emit(logging.WARNING, event, **kw)

        def exception(self, event: str, **kw: Any) -> None:
            self._log.exception("%s %s", event, " ".join(f"{k}={v}" for k, v in kw.items()))

    def _logger(name: str) -> Any:
        return _StdLogger(name)

__all__ = ["Limits", "Request", "Response", "Refusal", "HttpServer", "Headers", "error", "json_response",
           "parse_head", "body_length"]


@dataclass(frozen=True)
class Limits:
    """What one server allows; each server names its own (every field has a safe default)."""

    #: Seconds a request has, in all (TLS handshake, line, headers, body), from the
    #: connection or the previous reply on it.
    deadline: float = 10.0
    #: Seconds the client has to take a reply.
    reply_deadline: float = 10.0
    #: Bytes of the request line and headers together.
    max_header_bytes: int = 16 * 1024
    #: Header fields.
    max_headers: int = 64
    #: Bytes of a request body.
    max_body: int = 64 * 1024
    #: Bytes of all connections' requests read and not yet handled, together.
    max_buffered: int = 8 * 1024 * 1024
    #: Connections open at once.
    max_connections: int = 128
    #: Connections whose request carried the token (servers with one), at once.
    max_authenticated: int = 32
    #: Worker threads (handlers) for requests without the token.
    workers: int = 2
    #: Requests without the token queued or running at once; one more is answered 503.
    max_inflight: int = 16

    def __post_init__(self) -> None:
        if self.max_header_bytes + self.max_body > self.max_buffered:
            raise ValueError("max_buffered must hold at least one whole request")
        if self.max_connections < 2 or self.workers < 1 or self.max_inflight < self.workers:
            raise ValueError("max_connections >= 2, workers >= 1, max_inflight >= workers")


class Headers:
    """Request header fields: case-insensitive ``get``; never logged."""

    def __init__(self, fields: Iterable[tuple[str, str]]):
        self._fields = list(fields)
        self._map: dict[str, str] = {}
        for name, value in self._fields:
            self._map.setdefault(name.lower(), value)

    def get(self, name: str, default: Any = None) -> Any:
        return self._map.get(name.lower(), default)

    def get_all(self, name: str) -> list[str]:
        return [v for n, v in self._fields if n.lower() == name.lower()]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._map

    def items(self) -> list[tuple[str, str]]:
        return list(self._fields)

    def __repr__(self) -> str:
        return f"Headers({sorted(self._map)})"  # names only: a value may be a token


@dataclass(frozen=True)
class Request:
    method: str
    #: The request target as sent (path and query).
    target: str
    path: str
    query: str
    version: str
    headers: Headers
    body: bytes
    client: str
    #: The server's ``authenticate`` accepted this request (always False on servers without one).
    authenticated: bool = False

    @property
    def params(self) -> dict[str, list[str]]:
        return parse_qs(self.query)


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()


def json_response(status: int, doc: Any, headers: Mapping[str, str] | None = None) -> Response:
    return Response(int(status), json.dumps(doc).encode(), "application/json", tuple((headers or {}).items()))


def error(status: int, message: str, kind: str, headers: Mapping[str, str] | None = None, **extra: Any) -> Response:
    """The one shape of an error: ``{"error": message, "kind": kind, ...}``."""
    return json_response(status, {"error": message, "kind": kind, **extra}, headers)


class Refusal(Exception):
    """A request refused before it reaches a handler: its status, kind and reason."""

    def __init__(self, status: int, kind: str, message: str):
        super().__init__(message)
        self.status, self.kind, self.message = int(status), kind, message

    def response(self) -> Response:
        return error(self.status, self.message, self.kind)


_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_TARGET = re.compile(rb"/[\x21-\x7e]*")
_VERSION = re.compile(rb"HTTP/1\.[01]")


@dataclass(frozen=True)
class Head:
    method: str
    target: str
    version: str
    headers: Headers


def parse_head(head: bytes, limits: Limits) -> Head:
    """A request line and its header fields (without the blank line) -> Head; Refusal if they break a rule."""
    if len(head) > limits.max_header_bytes:
        raise Refusal(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "too-large",
                      f"the request line and headers are over {limits.max_header_bytes} bytes")
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or not _TARGET.fullmatch(parts[1]):
        raise Refusal(HTTPStatus.BAD_REQUEST, "bad-request", "not an HTTP request line (METHOD /path HTTP/1.1)")
    if not _VERSION.fullmatch(parts[2]):
        raise Refusal(HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, "bad-request", "HTTP/1.0 and HTTP/1.1 only")
    if len(lines) - 1 > limits.max_headers:
        raise Refusal(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "too-large",
                      f"more than {limits.max_headers} header fields")
    fields = []
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.fullmatch(name) or any(b < 0x20 and b != 0x09 or b == 0x7f for b in value):
            raise Refusal(HTTPStatus.BAD_REQUEST, "bad-request", "a header field is not 'Name: value'")
        fields.append((name.decode("ascii"), value.strip(b" \t").decode("latin-1")))
    return Head(parts[0].decode("ascii"), parts[1].decode("ascii"), parts[2].decode("ascii"), Headers(fields))


def body_length(head: Head, limits: Limits) -> int:
    """The body's length by ``Content-Length``; Refusal for chunked, ambiguous or too large bodies."""
    if "transfer-encoding" in head.headers:
        raise Refusal(HTTPStatus.LENGTH_REQUIRED, "bad-request", "send the body with Content-Length, not chunked")
    values = {v.strip() for v in head.headers.get_all("content-length")}
    if not values:
        return 0
    if len(values) > 1 or not all(v.isascii() and v.isdigit() for v in values) or len(next(iter(values))) > 12:
        raise Refusal(HTTPStatus.BAD_REQUEST, "bad-request", "Content-Length is not one number")
    length = int(next(iter(values)))
    if length > limits.max_body:
        raise Refusal(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "too-large", f"request bodies are at most {limits.max_body} bytes")
    return length


def _status_line(status: int) -> bytes:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    return f"HTTP/1.1 {status} {phrase}\r\n".encode("ascii")


def encode(response: Response, keep_alive: bool) -> bytes:
    """The bytes of a reply."""
    lines = [f"Date: {formatdate(usegmt=True)}", f"Content-Type: {response.content_type}",
             f"Content-Length: {len(response.body)}"]
    lines += [f"{k}: {v}" for k, v in response.headers]
    if not keep_alive:
        lines.append("Connection: close")
    for line in lines:
        if "\r" in line or "\n" in line:
            raise ValueError("a header value holds a line break")
    return _status_line(response.status) + "".join(f"{line}\r\n" for line in lines).encode("latin-1") + b"\r\n" \
        + response.body


class _Tls:
    """Server-side TLS over memory BIOs: the event loop feeds it bytes."""

    def __init__(self, context: ssl.SSLContext):
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.obj = context.wrap_bio(self.incoming, self.outgoing, server_side=True)
        self.ready = False

    def receive(self, data: bytes) -> bytes:
        """Ciphertext in -> plaintext out (b"" while handshaking). Raises ssl.SSLError, EOFError."""
        self.incoming.write(data)
        if not self.ready:
            try:
                self.obj.do_handshake()
            except ssl.SSLWantReadError:
                return b""
            self.ready = True
        out = []
        while True:
            try:
                chunk = self.obj.read(65536)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:
                raise EOFError from None
            if not chunk:
                break
            out.append(chunk)
        return b"".join(out)

    def send(self, data: bytes) -> None:
        self.obj.write(data)

    def pending(self) -> bytes:
        return self.outgoing.read()


_READING, _BUSY, _WRITING, _CLOSED = "reading", "busy", "writing", "closed"


class _Pool:
    def __init__(self, workers: int, max_inflight: int, name: str):
        self.executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        self.max_inflight = max_inflight
        self.inflight = 0


class _Connection(asyncio.Protocol):
    def __init__(self, server: HttpServer):
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.tls: _Tls | None = None
        self.buf = bytearray()
        self.head: Head | None = None
        self.head_end = 0
        self.need = 0
        self.state = _READING
        self.authenticated = False
        self.keep_alive = False
        self.timer: asyncio.TimerHandle | None = None
        self.client = ""
        self.started = 0.0
        self.request: Request | None = None
        self.status = 0

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = stream = cast(asyncio.Transport, transport)  # what a stream server gives its protocols
        peer = stream.get_extra_info("peername")
        self.client = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        stream.set_write_buffer_limits(high=0)  # told when all is sent
        server = self.server
        if not server._admit(self):
            stream.abort()
            return
        if server.tls_context is not None:
            try:
                self.tls = _Tls(server.tls_context())
            except (OSError, ssl.SSLError, ValueError):
                server._count("tls-context")
                self._drop()
                return
        self._wait(server.limits.deadline)

    def data_received(self, data: bytes) -> None:
        if self.state == _CLOSED:
            return
        if self.tls is not None:
            try:
                data = self.tls.receive(data)
            except (ssl.SSLError, EOFError):
                self.server._count("tls")
                self._flush_tls()
                self._drop()
                return
            self._flush_tls()
            if not data:
                return
        self.buf += data
        self.server._buffered += len(data)
        if self.state != _READING:  # pipelined: kept for after the reply, within one request's bound
            if len(self.buf) > self.server.limits.max_header_bytes + self.server.limits.max_body:
                self._drop()
            return
        self.server._shed(self)
        if self.state == _READING:
            self._consume()

    def eof_received(self) -> bool | None:
        if self.state == _READING:
            self._drop()
        self.keep_alive = False
        return True  # a client may half-close after its request: the reply still goes out

    def connection_lost(self, exc: Exception | None) -> None:
        self._forget()

    def pause_writing(self) -> None:
        pass

    def resume_writing(self) -> None:
        if self.state == _WRITING:
            self._written()

    # the request

    def _wait(self, seconds: float) -> None:
        self._cancel_timer()
        self.timer = self.server._loop.call_later(seconds, self._timed_out)

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _timed_out(self) -> None:
        self.timer = None
        if self.state == _READING:
            self.server._count("deadline")
            if self.buf or self.head is not None:
                self._refuse(Refusal(HTTPStatus.REQUEST_TIMEOUT, "timeout",
                                     f"the request did not arrive whole within {self.server.limits.deadline:g} s"))
            else:  # nothing asked: an idle connection, closed quietly
                self._drop()
        elif self.state == _WRITING:  # the client did not take its reply
            self.server._count("reply-deadline")
            self._drop()

    def _consume(self) -> None:
        limits = self.server.limits
        if self.head is None:
            end = self.buf.find(b"\r\n\r\n", 0, limits.max_header_bytes + 4)
            if end < 0:
                if len(self.buf) > limits.max_header_bytes + 3:
                    self.server._count("too-large")
                    self._refuse(Refusal(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "too-large",
                                         f"the request line and headers are over {limits.max_header_bytes} bytes"))
                return
            try:
                self.head = parse_head(bytes(self.buf[:end]), limits)
                self.need = body_length(self.head, limits)
            except Refusal as refusal:
                self.server._count("refused")
                self._refuse(refusal)
                return
            self.head_end = end + 4
            if self.need and self.head.headers.get("expect", "").lower() == "100-continue" \
                    and len(self.buf) == self.head_end:
                self._write_raw(b"HTTP/1.1 100 Continue\r\n\r\n")
        if len(self.buf) < self.head_end + self.need:
            return
        self._dispatch()

    def _dispatch(self) -> None:
        server, head = self.server, self.head
        assert head is not None
        body = bytes(self.buf[self.head_end:self.head_end + self.need])
        rest = self.buf[self.head_end + self.need:]
        server._buffered -= len(self.buf) - len(rest)
        self.buf, self.head = bytearray(rest), None
        self.state = _BUSY
        self._cancel_timer()
        server._leave_waiting(self)
        if self.transport is not None:
            self.transport.pause_reading()
        url = urlsplit(head.target)
        self.started = time.monotonic()
        request = Request(head.method, head.target, url.path, url.query, head.version, head.headers, body,
                          self.client)
        connection = head.headers.get("connection", "").lower()
        self.keep_alive = head.version == "HTTP/1.1" and "close" not in connection
        if server.authenticate is not None:
            try:
                ok = bool(server.authenticate(request))
            except Exception:  # noqa: BLE001 - a broken check is a refusal, never a pass
                ok = False
            request = replace(request, authenticated=ok)
            if ok and not self.authenticated:
                if server._authenticated >= server.limits.max_authenticated:
                    self.request = request
                    self._reply(error(HTTPStatus.SERVICE_UNAVAILABLE,
                                      f"too many connections (at most {server.limits.max_authenticated})", "busy",
                                      {"Retry-After": "1"}), keep_alive=False)
                    return
                self.authenticated = True
                server._authenticated += 1
            if not self.authenticated:
                self.keep_alive = False  # no keep-alive without the token
        self.request = request
        pool = server._auth_pool if request.authenticated else server._pool
        if pool.inflight >= pool.max_inflight:
            server._count("busy")
            self._reply(error(HTTPStatus.SERVICE_UNAVAILABLE, "too many requests at once; try again", "busy",
                              {"Retry-After": "1"}), keep_alive=False)
            return
        pool.inflight += 1
        future = server._loop.run_in_executor(pool.executor, server._run, request)

        def done(f: asyncio.Future) -> None:
            pool.inflight -= 1
            if self.state != _BUSY:
                return  # closed meanwhile (evicted, or the client left): nobody to answer
            if f.cancelled():  # the server is stopping
                self._drop()
                return
            self._reply(f.result(), keep_alive=self.keep_alive)

        future.add_done_callback(done)

    def _reply(self, response: Response, keep_alive: bool) -> None:
        self.keep_alive = keep_alive
        self.status = response.status
        try:
            data = encode(response, keep_alive)
        except ValueError:
            self.status = 500
            data = encode(error(500, "the reply could not be encoded", "internal"), False)
            self.keep_alive = False
        self.state = _WRITING
        self._wait(self.server.limits.reply_deadline)
        self._write_raw(data)
        if self.transport is not None and self.state == _WRITING and self.transport.get_write_buffer_size() == 0:
            self._written()

    def _refuse(self, refusal: Refusal) -> None:
        """Answer an error before any handler ran, and close."""
        self.server._leave_waiting(self)
        if self.transport is not None:
            self.transport.pause_reading()
        if self.request is None and self.head is not None:
            url = urlsplit(self.head.target)
            self.request = Request(self.head.method, self.head.target, url.path, url.query, self.head.version,
                                   self.head.headers, b"", self.client)
        self.started = self.started or time.monotonic()
        self._reply(refusal.response(), keep_alive=False)

    def _write_raw(self, data: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        if self.tls is not None:
            try:
                self.tls.send(data)
            except ssl.SSLError:
                self._drop()
                return
            self._flush_tls()
        else:
            self.transport.write(data)

    def _flush_tls(self) -> None:
        if self.tls is not None and self.transport is not None and not self.transport.is_closing():
            out = self.tls.pending()
            if out:
                self.transport.write(out)

    def _written(self) -> None:
        server = self.server
        server._access(self)
        self.request = None
        self.started = 0.0
        if not self.keep_alive:
            self._close()
            return
        self.state = _READING
        if not self.authenticated:
            server._enter_waiting(self)  # the newest waiting: the last of its address to be closed for room
        self._wait(server.limits.deadline)
        if self.transport is not None:
            self.transport.resume_reading()
        if self.buf:
            server._shed(self)
            if self.state == _READING:
                self._consume()

    def _close(self) -> None:
        """Close after what is written is sent (bounded by the reply deadline's timer, else now)."""
        transport = self.transport
        self._forget()
        if transport is not None:
            if self.tls is not None:
                try:
                    self.tls.obj.unwrap()
                except (ssl.SSLError, ValueError):
                    pass
                out = self.tls.pending()
                if out and not transport.is_closing():
                    transport.write(out)
            transport.close()
            if transport.get_write_buffer_size():
                self.server._loop.call_later(self.server.limits.reply_deadline, transport.abort)

    def _drop(self) -> None:
        """Close at once, whatever is unsent."""
        transport = self.transport
        self._forget()
        if transport is not None:
            transport.abort()

    def _forget(self) -> None:
        if self.state == _CLOSED:
            return
        server = self.server
        self.state = _CLOSED
        self._cancel_timer()
        server._open.pop(self, None)
        server._leave_waiting(self)
        server._buffered -= len(self.buf)
        self.buf = bytearray()
        if self.authenticated:
            server._authenticated -= 1
            self.authenticated = False


Handler = Callable[[Request], Response]


class HttpServer:
    """Serve ``handler`` on ``address`` under ``limits``.

    ``authenticate(request) -> bool``: where a server has a token (the agent),
    whether this request carries it; called on the event loop, so it must be
    quick (a constant-time compare). ``tls_context()``: a server context per
    connection (None: plain HTTP). ``quiet``: paths logged at debug (probes,
    scrapes)."""

    def __init__(self, address: tuple[str, int], handler: Handler, limits: Limits = Limits(), *,
                 name: str = "http", authenticate: Callable[[Request], bool] | None = None,
                 tls_context: Callable[[], ssl.SSLContext] | None = None, quiet: Iterable[str] = (),
                 logger: Any = None):
        host, port = address[0] or "0.0.0.0", int(address[1])
        self.handler = handler
        self.limits = limits
        self.name = name
        self.authenticate = authenticate
        self.tls_context = tls_context
        self.quiet = frozenset(quiet)
        self.log = logger or _logger(f"slurmk8s.http.{name}")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.create_server((host, port), family=family, backlog=1024, reuse_port=False)
        self.server_address = self.socket.getsockname()
        self._loop = asyncio.new_event_loop()
        self._pool = _Pool(limits.workers, limits.max_inflight, f"{name}-worker")
        # One request at a time per connection: as many workers as connections with the token.
        self._auth_pool = _Pool(limits.max_authenticated, limits.max_authenticated, f"{name}-auth") \
            if authenticate is not None else self._pool
        #: every open connection, oldest first
        self._open: dict[_Connection, None] = {}
        #: connections waiting for a request without the token, oldest first: the ones closed for room
        self._waiting: dict[_Connection, None] = {}
        #: the same by client address
        self._waiting_by: dict[str, dict[_Connection, None]] = {}
        self._authenticated = 0
        self._buffered = 0
        self._closed: dict[str, int] = {}
        self._closed_logged = 0.0
        self._served = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    # what the standard library's servers offered, which the callers use

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    server_port = port

    @property
    def url(self) -> str:
        host = self.server_address[0]
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    def serve_forever(self) -> None:
        """Serve in this thread until :meth:`shutdown`."""
        loop = self._loop
        asyncio.set_event_loop(loop)
        server = loop.run_until_complete(loop.create_server(lambda: _Connection(self), sock=self.socket,
                                                            backlog=1024))
        self._stop_future = loop.create_future()
        self._served.set()
        try:
            loop.run_until_complete(self._stop_future)
        finally:
            server.close()
            for conn in list(self._open):
                conn._drop()
            loop.run_until_complete(asyncio.sleep(0))
            self._stopped.set()

    def start(self) -> threading.Thread:
        """Serve from a thread of its own; returns it."""
        self._thread = threading.Thread(target=self.serve_forever, name=self.name, daemon=True)
        self._thread.start()
        self._served.wait(10)
        return self._thread

    def shutdown(self) -> None:
        if not self._served.is_set():
            return

        def stop() -> None:
            if not self._stop_future.done():
                self._stop_future.set_result(None)
        self._loop.call_soon_threadsafe(stop)
        self._stopped.wait(10)

    def server_close(self) -> None:
        self.socket.close()
        self._pool.executor.shutdown(wait=False, cancel_futures=True)
        self._auth_pool.executor.shutdown(wait=False, cancel_futures=True)
        if self._stopped.is_set() or not self._served.is_set():
            self._loop.close()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()

    # on the event loop

    def _admit(self, conn: _Connection) -> bool:
        """Room for one more connection: a waiting one without the token is closed for it, the
        oldest of the address holding the most (a flood from one pod closes its own first)."""
        while len(self._open) >= self.limits.max_connections:
            victim = self._victim()
            if victim is None:
                self._count("full")
                return False
            self._count("evicted")
            victim._drop()
        self._open[conn] = None
        self._enter_waiting(conn)
        return True

    def _victim(self, holding: bool = False) -> _Connection | None:
        """The oldest waiting connection of the address with the most waiting (``holding``:
        only connections holding bytes count)."""
        best, best_count = None, 0
        for conns in self._waiting_by.values():
            count = sum(1 for c in conns if c.buf) if holding else len(conns)
            if count > best_count:
                best, best_count = conns, count
        if best is None:
            return None
        return next((c for c in best if c.buf or not holding), None)

    def _enter_waiting(self, conn: _Connection) -> None:
        self._leave_waiting(conn)
        self._waiting[conn] = None
        self._waiting_by.setdefault(conn.client, {})[conn] = None

    def _leave_waiting(self, conn: _Connection) -> None:
        if self._waiting.pop(conn, 0) is None:
            mine = self._waiting_by.get(conn.client)
            if mine is not None:
                mine.pop(conn, None)
                if not mine:
                    del self._waiting_by[conn.client]

    def _shed(self, keep: _Connection) -> None:
        """Over max_buffered: close waiting connections that hold bytes, as :meth:`_victim` picks (``keep`` last)."""
        while self._buffered > self.limits.max_buffered:
            victim = self._victim(holding=True)
            if victim is None or victim is keep:
                victim = next((c for c in self._waiting if c is not keep and c.buf), None)
            if victim is None:
                self._count("buffered")
                keep._refuse(Refusal(HTTPStatus.SERVICE_UNAVAILABLE, "busy",
                                     "too many requests being received; try again"))
                return
            self._count("evicted")
            victim._drop()

    def _run(self, request: Request) -> Response:
        """In a worker thread: the handler's answer, or a 500 for its failure."""
        try:
            response = self.handler(request)
            if not isinstance(response, Response):
                raise TypeError(f"the handler returned {type(response).__name__}, not a Response")
            return response
        except Exception as exc:  # noqa: BLE001 - a bug: say so, keep serving
            self.log.exception("request failed", method=request.method, path=request.path)
            return error(HTTPStatus.INTERNAL_SERVER_ERROR, f"{exc.__class__.__name__}: {exc}", "internal")

    def _access(self, conn: _Connection) -> None:
        request = conn.request
        if request is None:
            return
        ms = round((time.monotonic() - conn.started) * 1000) if conn.started else 0
        fields = dict(method=request.method, path=request.path, status=conn.status, ms=ms, client=request.client)
        if request.path in self.quiet and conn.status < 400:
            self.log.debug("request", **fields)
        else:
            self.log.info("request", **fields)

    def _count(self, why: str) -> None:
        """Connections closed for a bound: counted, logged at most every 10 s (a flood must not flood the log)."""
        self._closed[why] = self._closed.get(why, 0) + 1
        now = time.monotonic()
        if now - self._closed_logged >= 10:
            self.log.warning("closed connections over this server's bounds", **self._closed,
                             open=len(self._open), limit=self.limits.max_connections)
            self._closed, self._closed_logged = {}, now

    def stats(self) -> dict[str, int]:
        """Open connections, with the token, and bytes waiting (read from the event loop's state)."""
        return {"open": len(self._open), "authenticated": self._authenticated, "buffered": self._buffered}
