"""`slurmk8s operator` as the chart runs it: help, flags, startup against an API server.

The API server here is the smallest one kopf starts against (discovery, an
empty SlurmCluster list, watches that stay open), so these tests show the
operator's startup path: the kubeconfig, kopf's login through the operator's
credentials, the namespaces it watches, /healthz and /metrics.
"""

from __future__ import annotations

import copy
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs

import pytest
import yaml

from sandbox.apiserver.patch import merge_patch

from .jsonhttp import JsonHandler

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


CLUSTER = {
    "apiVersion": "slurmk8s.dev/v1alpha1", "kind": "SlurmCluster",
    "metadata": {"name": "demo", "namespace": "hpc", "uid": "c0ffee00-0000-4000-8000-00000000000a",
                 "resourceVersion": "7", "generation": 1},
    "spec": {"nodeSets": [{"name": "cpu", "replicas": 1}], "partitions": [{"name": "cpu", "nodeSets": ["cpu"]}]},
}


def json_patch(doc: dict, ops: list[dict]) -> dict:
    """RFC 6902, the operations kopf sends (test, add, replace, remove)."""
    doc = copy.deepcopy(doc)
    for op in ops:
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target = doc
        for p in parents:
            target = target.setdefault(p, {})
        if op["op"] == "test" and target.get(last) != op["value"]:
            raise ValueError(f"test failed at {op['path']}")
        if op["op"] in ("add", "replace"):
            target[last] = op["value"]
        elif op["op"] == "remove":
            target.pop(last, None)
    return doc


class _Api(JsonHandler):
    """Discovery, lists (namespaces; the SlurmClusters in ``clusters``, kept and watched;
    nothing else); writes to other objects are recorded and answered with their body."""

    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, str, str]] = []
    writes: list[tuple[str, str, str, str, dict]] = []  # method, path, query, content type, body
    clusters: list[dict] = []
    watchers: list[queue.Queue] = []

    def do_GET(self) -> None:
        path, _, query = self.path.partition("?")
        self.seen.append(("GET", path, self.headers.get("Authorization", "")))
        if path in DISCOVERY:
            return self._answer(200, DISCOVERY[path])
        lists = {"/api/v1/namespaces": ("v1", "NamespaceList", [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "hpc", "uid": "ns-1",
                                                                  "resourceVersion": "1"}}])}
        if path.endswith("/slurmclusters") or path in lists:
            if "watch=true" in query:
                events: queue.Queue = queue.Queue()
                if path.endswith("/slurmclusters"):
                    self.watchers.append(events)
                    # A change made between the client's list and this watch is
                    # sent first, as an API server does from its history.
                    since = int(parse_qs(query).get("resourceVersion", ["0"])[0] or 0)
                    for cluster in self.clusters:
                        if int(cluster["metadata"]["resourceVersion"]) > since:
                            events.put({"type": "MODIFIED", "object": cluster})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.flush()
                try:
                    while True:  # stream the cluster's changes; end after 5 s of quiet (kopf reconnects)
                        line = json.dumps(events.get(timeout=5)).encode() + b"\n"
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                        self.wfile.flush()
                except queue.Empty:
                    self.wfile.write(b"0\r\n\r\n")
                finally:
                    if events in self.watchers:
                        self.watchers.remove(events)
                return
            api_version, kind, items = lists.get(path, ("slurmk8s.dev/v1alpha1", "SlurmClusterList", self.clusters))
            latest = max([1, *(int(i["metadata"]["resourceVersion"]) for i in items)])
            return self._answer(200, {"apiVersion": api_version, "kind": kind,
                                    "metadata": {"resourceVersion": str(latest)}, "items": items})
        if "labelSelector=" in query:  # the operator's observation of a cluster: nothing exists yet
            return self._answer(200, {"kind": "List", "apiVersion": "v1", "metadata": {}, "items": []})
        return self._answer(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                                "message": f"{path} not found", "code": 404})


    def _write(self) -> None:
        path, _, query = self.path.partition("?")
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        self.writes.append((self.command, path, query, self.headers.get("Content-Type", ""), body))
        if "/slurmclusters/demo" in path and self.clusters:  # kopf's bookkeeping, the operator's status
            current = self.clusters[0]
            try:
                changed = json_patch(current, body) if isinstance(body, list) else merge_patch(current, body)
            except ValueError as exc:
                return self._answer(409, {"kind": "Status", "reason": "Conflict", "message": str(exc), "code": 409})
            changed["metadata"]["resourceVersion"] = str(int(current["metadata"]["resourceVersion"]) + 1)
            self.clusters[0] = body = changed
            for events in list(self.watchers):
                events.put({"type": "MODIFIED", "object": changed})
        self._answer(201 if self.command == "POST" else 200, body)

    do_POST = do_PATCH = _write  # noqa: N815 - http.server's handler names


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def api(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    server.daemon_threads = True
    _Api.seen, _Api.writes, _Api.clusters = [], [], []
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


@pytest.mark.parametrize("command", ["operator", "bridge"])
def test_without_a_namespace_for_its_lease_it_says_what_to_pass(command):
    env = {k: v for k, v in os.environ.items() if k != "POD_NAMESPACE"}
    proc = subprocess.run([SLURMK8S, command, "--namespace", "hpc"], capture_output=True, text=True, timeout=60,
                          env=env)
    assert proc.returncode == 2
    assert "--lease-namespace" in proc.stderr and "--no-leader-election" in proc.stderr


def test_it_starts_against_an_api_server_and_serves_health_and_metrics(api):
    health, metrics = free_port(), free_port()
    proc = subprocess.Popen(
        [SLURMK8S, "--log-level", "info", "operator", "--namespace", "hpc", "--kubeconfig", str(api),
         "--health-port", str(health), "--metrics-port", str(metrics), "--no-leader-election"],
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


def test_a_slurmcluster_is_picked_up_and_rendered_with_one_field_manager(api):
    _Api.clusters = [copy.deepcopy(CLUSTER)]
    proc = subprocess.Popen(
        [SLURMK8S, "operator", "--namespace", "hpc", "--kubeconfig", str(api), "--interval", "3600",
         "--no-leader-election"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        def handled() -> bool:
            annotations = _Api.clusters[0]["metadata"].get("annotations") or {}
            return "slurmk8s.dev/last-handled-digest" in annotations and \
                any("/events" in w[1] for w in _Api.writes)

        while not handled():
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, f"the cluster was not handled: {[w[:2] for w in _Api.writes]}"
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    writes = list(_Api.writes)
    finalizers = [w for w in writes if w[1] == "/apis/slurmk8s.dev/v1alpha1/namespaces/hpc/slurmclusters/demo"
                  and "slurmk8s.dev/teardown" in json.dumps(w[4])]
    assert finalizers, "kopf did not add the teardown finalizer"
    applied = {w[1].rsplit("/", 2)[-2:][0] + "/" + w[4]["metadata"]["name"]: w for w in writes
               if w[0] == "PATCH" and w[3] == "application/apply-patch+yaml"}
    assert {"configmaps/demo-slurm-config", "statefulsets/demo-controller", "statefulsets/demo-cpu",
            "services/demo-controller"} <= set(applied)
    for method, path, query, _ctype, _body in writes:
        if "slurmclusters" in path and not path.endswith("/status"):
            continue  # kopf's own bookkeeping patches
        if "/events" in path:
            continue  # kopf posts the Events
        assert "fieldManager=slurmk8s-operator" in query, (method, path, query)
    created = [w for w in writes if w[0] == "POST" and "/secrets" in w[1]]
    assert {w[4]["metadata"]["name"] for w in created} >= {"demo-munge-key", "demo-agent-token"}
    status = next(w for w in writes if w[1].endswith("/status"))
    assert status[3] == "application/merge-patch+json" and status[4]["status"]["phase"] == "Pending"
    # kopf keeps its bookkeeping in our annotations, not in the status (whose schema is ours).
    final = _Api.clusters[0]
    assert final["status"]["phase"] == "Pending" and set(final["status"]) <= {
        "phase", "conditions", "observedGeneration", "nodeCounts", "configHash"}
    assert not [k for k in final["metadata"].get("annotations", {}) if k.startswith("kopf.")]
    events = [w[4] for w in writes if w[0] == "POST" and w[1] == "/api/v1/namespaces/hpc/events"]
    assert any(e.get("reason") == "Pending" and e["involvedObject"]["name"] == "demo" for e in events)
    # `kubectl describe` shows who posted each: the operator, never the framework.
    assert events and all(e["source"]["component"] == "slurmk8s-operator" for e in events), \
        [e.get("source") for e in events]
    assert proc.returncode == 0, err[-3000:]
