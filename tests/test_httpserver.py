"""The one HTTP server of every server slurmk8s runs (slurmk8s/httpserver.py),
over real loopback sockets, against each server as the product builds it
(the agent, metrics, the webhook over TLS, /healthz, serve): a request
trickled past its whole-request deadline is cut with a JSON 408; idle and slow
connections beyond the cap never keep a legitimate caller out; oversized
headers and bodies are refused with JSON errors; and 300 slow connections hold
no thread and little memory. Servers come from hack/bench_http_load.py, the
load test, so both start them one way."""

from __future__ import annotations

import importlib.util
import json
import socket
import ssl
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from slurmk8s.httpserver import HttpServer, Limits, Refusal, Response, body_length, error, parse_head

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("bench_http_load", ROOT / "hack/bench_http_load.py")
bench = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("bench_http_load", bench)
_spec.loader.exec_module(bench)

KINDS = bench.KINDS


@pytest.fixture(params=KINDS)
def target(request, tmp_path):
    t = bench.start_local(request.param, tmp_path, deadline=1.0)
    t.kind = request.param
    yield t
    t.stop()


def _raw(t, source: str | None = None) -> socket.socket:
    """A connection to the server, through TLS when it has it."""
    return t.connect(5, (source, 0) if source else None)


def _read_all(sock: socket.socket, limit: float = 5.0) -> bytes:
    sock.settimeout(limit)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (OSError, ssl.SSLError):
        pass
    return data


def _json_error(data: bytes) -> tuple[int, dict]:
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    assert b"content-type: application/json" in head.lower(), head
    return status, json.loads(body)


def test_a_request_trickled_past_its_deadline_is_cut_with_a_json_408(target):
    """One byte every 0.2 s never trips a per-read timeout: the whole request has 1 s."""
    sock = _raw(target)
    try:
        sock.sendall(f"{target.method} {target.path} HTTP/1.1\r\nHost: x\r\n".encode())
        started = time.monotonic()
        answer = b""
        sock.settimeout(0.2)
        while time.monotonic() - started < 4:
            try:
                sock.sendall(b"X")
                answer += sock.recv(65536)
            except (TimeoutError, ssl.SSLWantReadError):
                continue
            except (OSError, ssl.SSLError):
                break
            if answer:
                break
        answer += _read_all(sock, 2)
        assert time.monotonic() - started < 2.5, "the trickle was not cut at the 1 s deadline"
        status, body = _json_error(answer)
        assert status == 408 and body["kind"] == "timeout"
    finally:
        sock.close()


def test_idle_and_slow_connections_beyond_the_cap_never_keep_a_caller_out(target):
    """Twice the cap of silent connections, and slow ones, from another address (another
    pod): the legitimate caller's request is answered, promptly, every time."""
    cap = target.server.limits.max_connections
    held = []
    try:
        for _ in range(2 * cap):
            held.append(socket.create_connection((target.host, target.port), source_address=("127.0.0.2", 0)))
        for _ in range(20):
            try:
                s = _raw(target, "127.0.0.2")
                s.sendall(f"{target.method} {target.path} HTTP/1.1\r\nX-Slow: ".encode())
                held.append(s)
            except (OSError, ssl.SSLError):
                pass  # closed for room at once: 127.0.0.2 holds the most
        times = []
        for _ in range(5):
            status, seconds = target.call(timeout=5)
            assert status in target.ok
            times.append(seconds)
        assert sorted(times)[2] < 0.5, times
        assert target.server.stats()["open"] <= cap
    finally:
        for s in held:
            s.close()


def _oversize(t, what: str) -> bytes:
    limits = t.server.limits
    start = f"{t.method} {t.path} HTTP/1.1\r\nHost: x\r\n"
    if what == "header-bytes":
        return (start + f"X-Big: {'a' * (limits.max_header_bytes + 10)}\r\n\r\n").encode()
    if what == "header-count":
        return (start + "".join(f"X-{i}: v\r\n" for i in range(limits.max_headers + 1)) + "\r\n").encode()
    return (start + f"Content-Length: {limits.max_body + 1}\r\n\r\n").encode()


@pytest.mark.parametrize("what,status", [("header-bytes", 431), ("header-count", 431), ("body", 413)])
def test_oversized_headers_and_bodies_are_refused_with_json(target, what, status):
    sock = _raw(target)
    try:
        sock.sendall(_oversize(target, what))
        got, body = _json_error(_read_all(sock))
        assert got == status and body["kind"] == "too-large" and body["error"]
    finally:
        sock.close()


def _rss_mib() -> float:
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024


@pytest.mark.parametrize("kind", ["healthz", "webhook", "agent"])
def test_300_slow_connections_hold_no_thread_and_little_memory(kind, tmp_path):
    """Each of 300 connections trickles its headers (1 KiB each); the server gains no thread
    beyond its loop and workers, a few MiB at most, and still answers."""
    t = bench.start_local(kind, tmp_path, deadline=30.0)
    before_threads, before_rss = threading.active_count(), _rss_mib()
    held = []
    try:
        for _ in range(300):
            s = socket.create_connection((t.host, t.port), source_address=("127.0.0.2", 0))
            held.append(s)
            try:
                s.sendall(b"GET / HTTP/1.1\r\nX-Slow: " + b"a" * 1024 if kind != "webhook" else b"\x16\x03\x01")
            except OSError:
                pass  # over the cap: closed for room
        time.sleep(0.5)
        for s in held[-50:]:
            try:
                s.sendall(b"b")
            except OSError:
                pass
        status, seconds = t.call(timeout=5)
        assert status in t.ok and seconds < 1.0
        grown_threads = threading.active_count() - before_threads
        grown_rss = _rss_mib() - before_rss
        assert grown_threads <= t.server.limits.workers + 1, grown_threads
        assert grown_rss < 40, f"{grown_rss:.1f} MiB for 300 slow connections"
        assert t.server.stats()["open"] >= min(250, t.server.limits.max_connections - 10)  # held, not refused
    finally:
        for s in held:
            s.close()
        t.stop()


def _plain(handler, **limits) -> HttpServer:
    server = HttpServer(("127.0.0.1", 0), handler, Limits(**limits), name="test")
    server.start()
    return server


def _exchange(server: HttpServer, data: bytes) -> bytes:
    with socket.create_connection(server.server_address[:2], timeout=5) as s:
        s.sendall(data)
        return _read_all(s)


def test_bytes_waiting_in_all_connections_together_are_bounded():
    """Connections holding partial bodies are closed, busiest address first, past max_buffered; the
    legitimate request (from another address) is answered."""
    server = _plain(lambda r: Response(200, b"{}"), max_body=64 * 1024, max_header_bytes=1024,
                    max_buffered=256 * 1024, deadline=30.0)
    held = []
    try:
        for _ in range(12):
            s = socket.create_connection(server.server_address[:2], source_address=("127.0.0.2", 0))
            s.sendall(b"POST / HTTP/1.1\r\nContent-Length: 65536\r\n\r\n" + b"a" * 60000)
            held.append(s)
        time.sleep(0.5)
        assert server.stats()["buffered"] <= 256 * 1024
        answer = _exchange(server, b"POST / HTTP/1.1\r\nContent-Length: 50000\r\nConnection: close\r\n\r\n"
                           + b"b" * 50000)
        assert answer.startswith(b"HTTP/1.1 200")
    finally:
        for s in held:
            s.close()
        server.stop()


def test_a_full_worker_queue_answers_503_and_a_failing_handler_500_in_json():
    release = threading.Event()

    def handler(request):
        if request.path == "/boom":
            raise RuntimeError("broken")
        release.wait(5)
        return Response(200, b"{}")

    server = _plain(handler, workers=1, max_inflight=1)
    first = socket.create_connection(server.server_address[:2])
    try:
        first.sendall(b"GET /slow HTTP/1.1\r\n\r\n")
        time.sleep(0.2)
        status, body = _json_error(_exchange(server, b"GET /other HTTP/1.1\r\n\r\n"))
        assert status == 503 and body["kind"] == "busy"
        release.set()
        assert _read_all(first, 2).startswith(b"HTTP/1.1 200")
        status, body = _json_error(_exchange(server, b"GET /boom HTTP/1.1\r\nConnection: close\r\n\r\n"))
        assert status == 500 and body == {"error": "RuntimeError: broken", "kind": "internal"}
    finally:
        first.close()
        server.stop()


def test_keep_alive_and_pipelined_requests_are_answered_in_order():
    server = _plain(lambda r: Response(200, r.path.encode(), "text/plain"))
    try:
        answer = _exchange(server, b"GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\nConnection: close\r\n\r\n")
        assert answer.count(b"HTTP/1.1 200") == 2 and answer.index(b"\r\n\r\n/a") < answer.index(b"\r\n\r\n/b")
    finally:
        server.stop()


def test_the_access_log_names_the_request_and_never_a_header(target):
    from structlog.testing import capture_logs

    with capture_logs() as logs:
        status, _ = target.call()
        # The server logs once the answer is written, on its own thread: the
        # caller may read the answer first.
        deadline = time.monotonic() + 10
        while not any(e.get("event") == "request" for e in logs) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)  # and no second entry follows
    assert status in target.ok
    [entry] = [e for e in logs if e.get("event") == "request"]
    assert entry["path"] == target.path and entry["status"] == status and entry["method"] == target.method
    assert bench.TOKEN not in json.dumps(logs, default=str) and "Authorization" not in json.dumps(logs, default=str)


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.binary(max_size=300),
                 st.lists(st.sampled_from([b"GET / HTTP/1.1", b"POST /x?y HTTP/1.0", b"Host: a", b"X: \x01",
                                           b"bad line", b" folded", b"Content-Length: 5", b"Content-Length: -1",
                                           b"Content-Length: 5", b"Content-Length: 6", b"Transfer-Encoding: chunked",
                                           b"GET http://x/ HTTP/1.1", b"GET / HTTP/2.0"]),
                          min_size=1, max_size=6).map(b"\r\n".join)))
def test_any_head_is_read_or_refused_never_an_exception(data):
    limits = Limits(max_headers=4, max_body=5)
    try:
        head = parse_head(data, limits)
        body_length(head, limits)
        event("read")
    except Refusal as refusal:
        event(f"refused {refusal.status}")
        assert 400 <= refusal.status < 600 and json.loads(refusal.response().body)["kind"]


def test_refusals_reach_every_status():
    limits = Limits(max_headers=1, max_body=5, max_header_bytes=64)
    cases = {b"GET / HTTP/1.1\r\nA: 1\r\nB: 2": 431, b"GET / HTTP/2.0": 505, b"nonsense": 400,
             b"GET / HTTP/1.1\r\nX" * 40: 431}
    for data, status in cases.items():
        with pytest.raises(Refusal) as info:
            parse_head(data, limits)
        assert info.value.status == status
    for data, status in {b"POST / HTTP/1.1\r\nContent-Length: 6": 413,
                         b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked": 411,
                         b"POST / HTTP/1.1\r\nContent-Length: +5": 400}.items():
        with pytest.raises(Refusal) as info:
            body_length(parse_head(data, limits), limits)
        assert info.value.status == status
    assert error(400, "m", "k").body == b'{"error": "m", "kind": "k"}'
