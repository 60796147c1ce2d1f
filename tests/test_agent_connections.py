"""The agent's connection handling, over real sockets, without Slurm daemons.

Whoever reaches the agent port without the token must not keep the operator
and the bridge out (issue 24, item 3): while the agent is full, the oldest
connection waiting for a request without the token is closed when a newcomer
arrives, and without the token there is no keep-alive; a connection whose
request carries the token is never closed for room (slurmk8s/httpserver.py).
"""

from __future__ import annotations

import http.client
import socket
import subprocess
import threading
import time
from dataclasses import replace

import pytest

from slurmk8s.slurm import SlurmClient
from slurmk8s.slurm.agent import LIMITS, make_server


def _ping_runner(argv, stdin):
    assert list(argv) == ["scontrol", "ping"], argv
    return subprocess.CompletedProcess(argv, 0, "Slurmctld(primary) at ctl is UP\n", "")


@pytest.fixture
def agent(keys):
    server = make_server("127.0.0.1:0", SlurmClient(_ping_runner), keys.agent_token)
    server.start()
    yield server
    server.stop()


def _authenticated_ping(server, token: bytes, conn: http.client.HTTPConnection | None = None) -> dict:
    host, port = server.server_address[:2]
    conn = conn or http.client.HTTPConnection(host, port, timeout=5)
    conn.request("GET", "/v1/ping", headers={"Authorization": f"Bearer {token.decode()}"})
    resp = conn.getresponse()
    body = resp.read()
    assert resp.status == 200, (resp.status, body)
    return {"body": body, "conn": conn, "close": resp.getheader("Connection")}


class _KeepAliveProbers:
    """``n`` clients, each on one keep-alive connection sending ``GET /healthz`` every
    ``period`` seconds and reconnecting ``period`` seconds after the agent closes it, plus
    ``silent`` connections that send nothing and are reopened as soon."""

    def __init__(self, address, n: int, silent: int, period: float = 0.5):
        self.address, self.period = address, period
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._probe, daemon=True) for _ in range(n)]
        self.threads += [threading.Thread(target=self._silent, daemon=True) for _ in range(silent)]
        self.served = 0

    def __enter__(self):
        for t in self.threads:
            t.start()
        time.sleep(1.0)  # every connection open and probing
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(5)

    def _connect(self, pause: float = 0.0):
        while not self.stop.wait(pause):
            try:
                s = socket.create_connection(self.address, timeout=2)
                s.settimeout(2)
                return s
            except OSError:
                pause = self.period
        return None

    def _probe(self):
        s = self._connect()
        while s is not None and not self.stop.is_set():
            try:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: agent\r\n\r\n")
                if not s.recv(4096):
                    raise OSError("closed")
                self.served += 1
                self.stop.wait(self.period)
            except OSError:
                s.close()
                s = self._connect(self.period)
        if s is not None:
            s.close()

    def _silent(self):
        s = self._connect()
        while s is not None and not self.stop.is_set():
            try:
                if not s.recv(1):
                    raise OSError("closed")
            except TimeoutError:
                continue
            except OSError:
                s.close()
                s = self._connect(self.period)
        if s is not None:
            s.close()


def test_authenticated_calls_get_in_while_unauthenticated_clients_hold_every_connection(agent, keys):
    """32 keep-alive /healthz clients (the issue's case) and 32 silent connections: every
    authenticated call still succeeds, promptly."""
    with _KeepAliveProbers(agent.server_address[:2], n=32, silent=32) as probers:
        slowest = 0.0
        for _ in range(20):
            started = time.monotonic()
            reply = _authenticated_ping(agent, keys.agent_token)
            reply["conn"].close()
            slowest = max(slowest, time.monotonic() - started)
            assert b'"up": true' in reply["body"]
        assert probers.served > 0  # the probes were answered meanwhile
    assert slowest < 3.0, f"an authenticated call took {slowest:.2f} s"


def test_an_authenticated_keep_alive_connection_is_never_evicted(agent, keys):
    first = _authenticated_ping(agent, keys.agent_token)
    assert first["close"] is None  # kept alive
    flood = [socket.create_connection(agent.server_address[:2]) for _ in range(3 * agent.limits.max_connections)]
    try:
        time.sleep(0.3)
        again = _authenticated_ping(agent, keys.agent_token, first["conn"])
        assert b'"up": true' in again["body"]
    finally:
        first["conn"].close()
        for s in flood:
            s.close()


def test_without_the_token_there_is_no_keep_alive(agent, keys):
    host, port = agent.server_address[:2]
    s = socket.create_connection((host, port), timeout=5)
    try:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: agent\r\n\r\n")
        data = b""
        while chunk := s.recv(4096):
            data += chunk
        head = data.split(b"\r\n\r\n")[0].lower()
        assert head.startswith(b"http/1.1 200") and b"connection: close" in head
    finally:
        s.close()
    # With the token, the same probe keeps its connection.
    conn = http.client.HTTPConnection(host, port, timeout=5)
    try:
        _authenticated_ping(agent, keys.agent_token, conn)
        conn.request("GET", "/healthz")
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200 and resp.getheader("Connection") is None
    finally:
        conn.close()


def test_idle_unauthenticated_connections_are_bounded(keys):
    """50 silent connections hold no thread, and at most max_connections stay open: the oldest are closed."""
    server = make_server("127.0.0.1:0", SlurmClient(_ping_runner), keys.agent_token,
                         limits=replace(LIMITS, max_connections=8, deadline=30.0))
    before = threading.active_count()
    server.start()
    idle = [socket.create_connection(server.server_address[:2]) for _ in range(50)]
    try:
        time.sleep(0.5)
        assert threading.active_count() - before <= 1  # the event loop's thread alone
        for s in idle[:-8]:  # closed long before request_timeout
            s.settimeout(2)
            assert s.recv(1) == b""
    finally:
        for s in idle:
            s.close()
        server.stop()


def test_slurm_output_the_agent_cannot_read_is_a_502_and_only_the_callers_mistake_a_400(keys):
    """Issue 41, item 9: ``squeue --json`` that does not parse is the agent's (Slurm's) failure,
    never a client's 400; a bad node name or reason still is."""
    from slurmk8s.slurm.remote import AgentError, RemoteSlurm

    def runner(argv, stdin):
        return subprocess.CompletedProcess(argv, 0, '{"jobs": [{"job_id": 1},' if "squeue" in argv else "", "")

    server = make_server("127.0.0.1:0", SlurmClient(runner), keys.agent_token)
    server.start()
    remote = RemoteSlurm(server.url, keys.agent_token)
    try:
        with pytest.raises(AgentError) as info:
            remote.jobs()
        assert info.value.status == 502 and info.value.kind == "slurm-output"
        assert not isinstance(info.value, ValueError)
        with pytest.raises(ValueError, match="not a Slurm node name"):
            remote.drain("bad name!", "slurmk8s: test")
        with pytest.raises(ValueError, match="not a usable drain reason"):
            remote.drain("node-1", "two\nlines")
    finally:
        server.stop()
