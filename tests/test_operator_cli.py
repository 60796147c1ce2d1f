"""`slurmk8s operator` as the chart runs it: help, flags, startup against an API server.

The API server here is the smallest one kopf starts against (discovery, an
empty SlurmCluster list, watches that stay open), so these tests show the
operator's startup path: the kubeconfig, kopf's login through the operator's
credentials, the namespaces it watches, /healthz and /metrics.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

SLURMK8S = str(Path(sys.executable).parent / "slurmk8s")

DISCOVERY = {
    "/api": {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []},
    "/apis": {"kind": "APIGroupList", "apiVersion": "v1", "groups": [{
        "name": "slurmk8s.dev",
        "versions": [{"groupVersion": "slurmk8s.dev/v1alpha1", "version": "v1alpha1"}],
        "preferredVersion": {"groupVersion": "slurmk8s.dev/v1alpha1", "version": "v1alpha1"}}]},
    "/api/v1": {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
        {"name": "events", "singularName": "event", "namespaced": True, "kind": "Event",
         "verbs": ["create", "get", "list"]},
        {"name": "namespaces", "singularName": "namespace", "namespaced": False, "kind": "Namespace",
         "verbs": ["get", "list", "watch"]}]},
    "/apis/slurmk8s.dev/v1alpha1": {"kind": "APIResourceList", "groupVersion": "slurmk8s.dev/v1alpha1", "resources": [
        {"name": "slurmclusters", "singularName": "slurmcluster", "namespaced": True, "kind": "SlurmCluster",
         "verbs": ["get", "list", "watch", "patch", "update"], "shortNames": ["slurm"]},
        {"name": "slurmclusters/status", "singularName": "", "namespaced": True, "kind": "SlurmCluster",
         "verbs": ["get", "patch", "update"]}]},
}


class _Api(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, str, str]] = []

    def log_message(self, *args) -> None:
        pass

    def _json(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        path, _, query = self.path.partition("?")
        self.seen.append(("GET", path, self.headers.get("Authorization", "")))
        if path in DISCOVERY:
            return self._json(200, DISCOVERY[path])
        lists = {"/api/v1/namespaces": ("v1", "NamespaceList", [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "hpc", "uid": "ns-1",
                                                                  "resourceVersion": "1"}}])}
        if path.endswith("/slurmclusters") or path in lists:
            if "watch=true" in query:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.flush()
                time.sleep(5)  # an idle watch; kopf reconnects
                self.wfile.write(b"0\r\n\r\n")
                return
            api_version, kind, items = lists.get(path, ("slurmk8s.dev/v1alpha1", "SlurmClusterList", []))
            return self._json(200, {"apiVersion": api_version, "kind": kind,
                                    "metadata": {"resourceVersion": "1"}, "items": items})
        return self._json(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                                "message": f"{path} not found", "code": 404})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def api(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    server.daemon_threads = True
    _Api.seen = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": f"http://127.0.0.1:{server.server_address[1]}"}}],
        "users": [{"name": "test", "user": {"token": "operator-token"}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
    }))
    yield kubeconfig
    server.shutdown()


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def test_help_explains_the_operator_and_its_flags():
    proc = subprocess.run([SLURMK8S, "operator", "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("Usage: slurmk8s operator")
    for flag in ("--namespace", "--all-namespaces", "--kubeconfig", "--metrics-port", "--health-port"):
        assert flag in proc.stdout
    assert "drain" in proc.stdout and "/healthz" in proc.stdout
    proc = subprocess.run([SLURMK8S, "agent", "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "--token-file" in proc.stdout and "bearer token" in proc.stdout


def test_it_needs_namespaces_or_all_namespaces():
    for args in ([], ["--namespace", "a", "--all-namespaces"]):
        proc = subprocess.run([SLURMK8S, "operator", *args], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and "--all-namespaces" in proc.stderr


def test_it_starts_against_an_api_server_and_serves_health_and_metrics(api):
    health, metrics = free_port(), free_port()
    proc = subprocess.Popen(
        [SLURMK8S, "--log-level", "info", "operator", "--namespace", "hpc", "--kubeconfig", str(api),
         "--health-port", str(health), "--metrics-port", str(metrics)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**os.environ, "KUBECONFIG": "/nonexistent"},  # the flag wins
    )
    try:
        deadline = time.monotonic() + 60
        while get(f"http://127.0.0.1:{health}/healthz")[0] != 200:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no /healthz within 60 s"
            time.sleep(0.3)
        status, text = get(f"http://127.0.0.1:{metrics}/metrics")
        assert status == 200 and "slurmk8s_operator_rounds_total" in text
        while not any(p == "/apis/slurmk8s.dev/v1alpha1/namespaces/hpc/slurmclusters" for _, p, _ in _Api.seen):
            assert time.monotonic() < deadline, f"SlurmClusters in hpc were never listed: {_Api.seen}"
            time.sleep(0.2)
        assert all(auth == "Bearer operator-token" for _, _, auth in _Api.seen)
        # Only namespace hpc is watched.
        assert not any("/namespaces/" in p and "/namespaces/hpc/" not in p for _, p, _ in _Api.seen)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            _, err = proc.communicate()
    assert proc.returncode == 0, err[-3000:]
