#!/usr/bin/env python3
"""Load-test one of slurmk8s's HTTP servers with hundreds of slow and idle
connections, and measure what a legitimate caller sees meanwhile.

Opens ``--slow`` connections that trickle a request one byte every
``--trickle`` seconds (reopened when the server closes them) and ``--idle``
connections that send nothing (reopened likewise), and every ``--every``
seconds times ``--samples`` legitimate requests (the median and the worst).
Prints, per report: the open slow and idle connections, the server's threads
and RSS (when it runs in this process, or ``--pid`` names it on this host),
and the legitimate requests' answer times and failures. Stops by itself after
``--seconds``; every count is bounded.

In this process (the default): ``--server agent|metrics|webhook|healthz|serve``
starts that server on loopback with its product limits (the agent over a fake
Slurm that answers ``scontrol ping``, the webhook with a throw-away
certificate) and the legitimate request is its caller's: the agent's
``GET /v1/ping`` with the token (and ``GET /healthz``), Prometheus's
``GET /metrics``, the API server's ``POST /validate`` of a SlurmCluster, the
kubelet's ``GET /healthz``, and ``GET /healthz`` of ``serve``.

Against a running server: ``--address HOST:PORT --path /healthz`` (``--tls``
for the webhook, ``--token-file`` for the agent's bearer token), e.g. from a
pod in the sandbox::

    python3 hack/bench_http_load.py --server healthz
    python3 hack/bench_http_load.py --address 10.0.0.12:8081 --path /healthz --slow 300 --idle 300
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import selectors
import socket
import ssl
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TOKEN = "bench-agent-token-0123456789abcdef"
KINDS = ("agent", "metrics", "webhook", "healthz", "serve")


@dataclass
class Target:
    """A server to load, and its legitimate caller's request."""

    host: str
    port: int
    method: str = "GET"
    path: str = "/healthz"
    body: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    tls: ssl.SSLContext | None = None
    #: Statuses the legitimate caller expects.
    ok: tuple[int, ...] = (200,)
    server: Any = None
    stop: Callable[[], None] = lambda: None

    def connect(self, timeout: float, source: tuple[str, int] | None = None) -> socket.socket:
        sock = socket.create_connection((self.host, self.port), timeout=timeout, source_address=source)
        if self.tls is not None:
            sock = self.tls.wrap_socket(sock, server_hostname="localhost")
        return sock

    def call(self, timeout: float = 10.0) -> tuple[int, float]:
        """One legitimate request: (status, seconds); status 0 for no answer."""
        started = time.monotonic()
        if self.tls is not None:
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(self.host, self.port, timeout=timeout,
                                                                           context=self.tls)
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            conn.request(self.method, self.path, body=self.body, headers=self.headers)
            resp = conn.getresponse()
            resp.read()
            return resp.status, time.monotonic() - started
        except (OSError, http.client.HTTPException):
            return 0, time.monotonic() - started
        finally:
            conn.close()


def start_local(kind: str, workdir: Path, **limits: Any) -> Target:
    """Start server ``kind`` on loopback in this process with its product limits (``limits``
    overrides some, e.g. ``deadline``); returns its Target (``stop()`` ends it)."""
    if kind == "agent":
        import subprocess

        from slurmk8s.slurm import SlurmClient
        from slurmk8s.slurm.agent import LIMITS, make_server

        def runner(argv, stdin):
            return subprocess.CompletedProcess(argv, 0, "Slurmctld(primary) at ctl is UP\n", "")
        server = make_server("127.0.0.1:0", SlurmClient(runner), TOKEN.encode(), limits=replace(LIMITS, **limits))
        server.start()
        return Target("127.0.0.1", server.port, path="/v1/ping", headers={"Authorization": f"Bearer {TOKEN}"},
                      server=server, stop=server.stop)
    if kind == "metrics":
        from prometheus_client.registry import CollectorRegistry

        from slurmk8s.metricsserver import LIMITS, metrics_server
        from slurmk8s.slurm.metrics import SlurmMetrics

        class Slurm:
            def metrics_reading(self):
                from slurmk8s.slurm.metrics import Diagnostics, Reading
                return Reading((), (), Diagnostics(rpcs=1))

        registry = CollectorRegistry(auto_describe=False)
        try:
            collector = SlurmMetrics(Slurm())
            collector.read()
            registry.register(collector)
        except Exception:  # noqa: BLE001 - an empty registry serves as well for a load test
            pass
        server = metrics_server(0, "127.0.0.1", registry, replace(LIMITS, **limits))
        server.start()
        return Target("127.0.0.1", server.port, path="/metrics", server=server, stop=server.stop)
    if kind == "webhook":
        from sandbox.apiserver import tls
        from slurmk8s.operator.webhook import LIMITS, PATH, WebhookServer

        pki = tls.ensure(workdir / "pki", ["localhost", "127.0.0.1"], "webhook")
        certs = workdir / "certs"
        certs.mkdir(parents=True, exist_ok=True)
        (certs / "tls.crt").write_bytes(pki.server_cert.read_bytes())
        (certs / "tls.key").write_bytes(pki.server_key.read_bytes())
        hook = WebhookServer(0, certs, addr="127.0.0.1", limits=replace(LIMITS, **limits)).start()
        doc = _example_cluster()
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": "u-1", "kind": {"group": "slurmk8s.dev", "version": "v1alpha1", "kind": "SlurmCluster"},
            "operation": "CREATE", "object": doc, "namespace": "hpc", "name": "demo"}}
        return Target("127.0.0.1", hook.port, method="POST", path=PATH, body=json.dumps(review).encode(),
                      headers={"Content-Type": "application/json"},
                      tls=ssl.create_default_context(cafile=str(pki.ca_cert)), server=hook.server, stop=hook.stop)
    if kind == "healthz":
        from slurmk8s.health import LIMITS, Health

        health = Health()
        health.watch("lastRound", time.monotonic, stale=60)
        server = health.serve(0, "127.0.0.1", replace(LIMITS, **limits))
        return Target("127.0.0.1", server.port, server=server, stop=server.stop)
    if kind == "serve":
        from slurmk8s.serve import LIMITS, make_server

        model = workdir / "model"
        (model / "v1").mkdir(parents=True, exist_ok=True)
        (model / "v1" / "step").write_text("1\n")
        (model / "LATEST").write_text("v1\n")
        server, follower = make_server(model, "127.0.0.1", 0, replace(LIMITS, **limits))
        follower.refresh()
        server.start()
        return Target("127.0.0.1", server.port, server=server, stop=server.stop)
    raise ValueError(f"--server: one of {', '.join(KINDS)}")


def _example_cluster() -> dict:
    import yaml

    for path in sorted((ROOT / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "SlurmCluster":
                return doc
    return {"apiVersion": "slurmk8s.dev/v1alpha1", "kind": "SlurmCluster", "metadata": {"name": "demo"}, "spec": {}}


class Load:
    """``slow`` trickling and ``idle`` silent connections, kept open (reopened when closed)
    from one thread with non-blocking sockets, until ``stop``."""

    def __init__(self, target: Target, slow: int, idle: int, trickle: float, source: str | None = None):
        self.target, self.slow, self.idle, self.trickle = target, slow, idle, trickle
        self.source = (source, 0) if source else None
        self.conns: dict[socket.socket, dict] = {}
        self.opened = self.closed = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="bench-load", daemon=True)

    def counts(self) -> tuple[int, int]:
        conns = list(self.conns.values())
        return sum(c["slow"] for c in conns), sum(not c["slow"] for c in conns)

    def _open(self, slow: bool) -> None:
        try:
            if slow:
                sock = self.target.connect(5, self.source)  # the TLS handshake too, when there is one
                prefix = f"{self.target.method} {self.target.path} HTTP/1.1\r\nHost: bench\r\nX-Slow: ".encode()
                sock.sendall(prefix)
            else:
                sock = socket.create_connection((self.target.host, self.target.port), timeout=5,
                                                source_address=self.source)
            sock.setblocking(False)
        except (OSError, ssl.SSLError):
            return
        self.opened += 1
        self.conns[sock] = {"slow": slow, "next": time.monotonic() + self.trickle}
        self.selector.register(sock, selectors.EVENT_READ)

    def _drop(self, sock: socket.socket) -> None:
        self.closed += 1
        self.conns.pop(sock, None)
        try:
            self.selector.unregister(sock)
        except (KeyError, ValueError):
            pass
        sock.close()

    def _run(self) -> None:
        self.selector = selectors.DefaultSelector()
        try:
            while not self.done.is_set():
                slow, idle = self.counts()
                for _ in range(min(self.slow - slow, 50)):  # at most 50 opened per turn: the loop stays bounded
                    self._open(True)
                for _ in range(min(self.idle - idle, 50)):
                    self._open(False)
                for key, _ in self.selector.select(timeout=0.05):
                    sock = key.fileobj
                    try:
                        if not sock.recv(65536):  # type: ignore[union-attr]
                            self._drop(sock)  # type: ignore[arg-type]
                    except ssl.SSLWantReadError:
                        pass
                    except (OSError, ssl.SSLError):
                        self._drop(sock)  # type: ignore[arg-type]
                now = time.monotonic()
                for sock, c in list(self.conns.items()):
                    if c["slow"] and now >= c["next"]:
                        c["next"] = now + self.trickle
                        try:
                            sock.send(b"a")
                        except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
                            pass
                        except (OSError, ssl.SSLError):
                            self._drop(sock)
        finally:
            for sock in list(self.conns):
                self._drop(sock)
            self.selector.close()

    def __enter__(self) -> Load:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.done.set()
        self.thread.join(10)


class _LoadProcess:
    """:class:`Load` in a child process (its own interpreter: the load does not share the
    server's lock), from another loopback address when the server is on loopback (another pod)."""

    def __init__(self, target: Target, slow: int, idle: int, trickle: float, seconds: float):
        import subprocess

        argv = [sys.executable, __file__, "--load-only", "--address", f"{target.host}:{target.port}",
                "--path", target.path, "--slow", str(slow), "--idle", str(idle), "--trickle", str(trickle),
                "--seconds", str(seconds + 5)]
        if target.tls is not None:
            argv.append("--tls")
        if target.host.startswith("127."):
            argv += ["--source", "127.0.0.2"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        self.last = (0, 0, 0)
        self.lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            parts = line.split()
            if len(parts) == 3 and all(p.isdigit() for p in parts):
                with self.lock:
                    self.last = (int(parts[0]), int(parts[1]), int(parts[2]))

    def counts(self) -> tuple[int, int, int]:
        with self.lock:
            return self.last

    def __enter__(self) -> _LoadProcess:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except Exception:  # noqa: BLE001 - killed however the wait failed
            self.proc.kill()


def _load_only(args: argparse.Namespace, target: Target) -> int:
    """The child's side: hold the load, print "slow idle opened" every 0.5 s."""
    with Load(target, args.slow, args.idle, args.trickle, args.source) as load:
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            time.sleep(0.5)
            slow, idle = load.counts()
            print(slow, idle, load.opened, flush=True)
    return 0


def process_figures(pid: int | None) -> tuple[int | None, float | None]:
    """(threads, RSS MiB) of ``pid`` (this process when None), from /proc."""
    try:
        status = Path(f"/proc/{pid or 'self'}/status").read_text()
    except OSError:
        return None, None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    threads = int(fields["Threads"].strip()) if "Threads" in fields else None
    rss = int(fields["VmRSS"].split()[0]) / 1024 if "VmRSS" in fields else None
    return threads, rss


def measure(target: Target, *, slow: int, idle: int, seconds: float, every: float, samples: int, trickle: float,
            pid: int | None, local: bool, out: Callable[[str], None] = print) -> dict:
    """Run the load; report every ``every`` seconds; returns the figures."""
    threads0, rss0 = process_figures(pid)
    base = sorted(target.call()[1] for _ in range(samples))
    out(f"before: threads {threads0}  rss {rss0 and round(rss0, 1)} MiB  legitimate median "
        f"{statistics.median(base) * 1000:.1f} ms")
    worst_threads, worst_rss, times, failures = threads0 or 0, rss0 or 0.0, [], 0
    with _LoadProcess(target, slow, idle, trickle, seconds) as load:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(min(every, max(end - time.monotonic(), 0)))
            answers = [target.call() for _ in range(samples)]
            failed = sum(status not in target.ok for status, _ in answers)
            failures += failed
            spent = sorted(t for _, t in answers)
            times += spent
            threads, rss = process_figures(pid)
            worst_threads = max(worst_threads, threads or 0)
            worst_rss = max(worst_rss, rss or 0.0)
            s, i, opened = load.counts()
            out(f"t={seconds - (end - time.monotonic()):5.1f}s  slow {s:4d}  idle {i:4d}  opened {opened:5d}  "
                f"threads {threads}  rss {rss and round(rss, 1)} MiB  legitimate median "
                f"{statistics.median(spent) * 1000:.1f} ms  worst {spent[-1] * 1000:.1f} ms  failed {failed}/{samples}")
    figures = {"threads_before": threads0, "threads_max": worst_threads, "rss_before_mib": rss0,
               "rss_max_mib": worst_rss, "median_ms": statistics.median(times) * 1000 if times else None,
               "worst_ms": max(times) * 1000 if times else None, "failures": failures, "requests": len(times),
               "opened": load.counts()[2]}
    out("figures: " + json.dumps({k: round(v, 1) if isinstance(v, float) else v for k, v in figures.items()}))
    return figures


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", choices=KINDS + ("all",), default="all", help="start this server here (default all)")
    p.add_argument("--address", help="HOST:PORT of a running server instead")
    p.add_argument("--path", default="/healthz", help="with --address: the legitimate request's path")
    p.add_argument("--tls", action="store_true", help="with --address: HTTPS, certificate not verified")
    p.add_argument("--body-file", type=Path, help="with --address: POST this file (JSON) as the legitimate request")
    p.add_argument("--ok", type=int, action="append", help="with --address: a status the legitimate caller expects "
                   "(repeatable; default 200)")
    p.add_argument("--token-file", type=Path, help="with --address: send this bearer token")
    p.add_argument("--pid", type=int, help="with --address: the server's process on this host, for threads and RSS")
    p.add_argument("--slow", type=int, default=300, help="slow connections (at most 2000)")
    p.add_argument("--idle", type=int, default=300, help="idle connections (at most 2000)")
    p.add_argument("--trickle", type=float, default=1.0, help="seconds between a slow connection's bytes")
    p.add_argument("--seconds", type=float, default=20.0, help="how long the load runs (at most 600)")
    p.add_argument("--load-only", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--source", help=argparse.SUPPRESS)
    p.add_argument("--every", type=float, default=2.0, help="seconds between reports")
    p.add_argument("--samples", type=int, default=5, help="legitimate requests per report")
    args = p.parse_args(argv)
    args.slow, args.idle = min(max(args.slow, 0), 2000), min(max(args.idle, 0), 2000)
    args.seconds = min(max(args.seconds, 1.0), 600.0)
    args.samples = min(max(args.samples, 1), 50)
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 2 * (args.slow + args.idle) + 256)), hard))
    if args.address:
        host, _, port = args.address.rpartition(":")
        headers = {}
        if args.token_file:
            headers["Authorization"] = f"Bearer {args.token_file.read_text().strip()}"
        context = None
        if args.tls:
            context = ssl.create_default_context()
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        body = args.body_file.read_bytes() if args.body_file else None
        if body is not None:
            headers["Content-Type"] = "application/json"
        target = Target(host.strip("[]"), int(port), method="POST" if body is not None else "GET", path=args.path,
                        body=body, headers=headers, tls=context, ok=tuple(args.ok or (200,)))
        if args.load_only:
            return _load_only(args, target)
        measure(target, slow=args.slow, idle=args.idle, seconds=args.seconds, every=args.every, samples=args.samples,
                trickle=args.trickle, pid=args.pid, local=False)
        return 0
    from slurmk8s import log

    log.configure("warning")
    for kind in (KINDS if args.server == "all" else (args.server,)):
        with tempfile.TemporaryDirectory() as tmp:
            target = start_local(kind, Path(tmp))
            print(f"== {kind} on 127.0.0.1:{target.port} {target.method} {target.path}: {args.slow} slow, "
                  f"{args.idle} idle, {args.seconds:g} s")
            try:
                measure(target, slow=args.slow, idle=args.idle, seconds=args.seconds, every=args.every,
                        samples=args.samples, trickle=args.trickle, pid=None, local=True)
            finally:
                target.stop()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
