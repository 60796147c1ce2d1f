"""Fixtures for the Kubernetes stand-in tests: one real server per test module
on 127.0.0.1 (HTTPS, bearer token), the official kubernetes client, kubectl,
and a "kubelet" that reports pod status through the API as a kubelet would."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from sandbox.apiserver import APIServer

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "charts" / "slurmk8s" / "files" / "crds"
EXAMPLE = ROOT / "examples" / "slurmcluster.yaml"


def wait_for(what: str, fn: Callable[[], Any], timeout: float = 20.0, interval: float = 0.05) -> Any:
    """Poll ``fn`` until it returns something truthy; fail naming ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"gave up waiting for {what}; last value: {last!r}")


class Cluster:
    """A started stand-in and the clients the tests use against it."""

    def __init__(self, srv: APIServer, workdir: Path) -> None:
        self.srv = srv
        self.workdir = workdir
        self.kubeconfig = srv.write_kubeconfig(workdir / "kubeconfig")
        self.api_client = config.new_client_from_config(config_file=str(self.kubeconfig))
        self.core = client.CoreV1Api(self.api_client)
        self.apps = client.AppsV1Api(self.api_client)
        self.policy = client.PolicyV1Api(self.api_client)
        self.custom = client.CustomObjectsApi(self.api_client)
        self.ext = client.ApiextensionsV1Api(self.api_client)
        self.events = client.EventsV1Api(self.api_client)

    def kubectl(self, *args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess:
        cmd = ["kubectl", "--kubeconfig", str(self.kubeconfig), "--cache-dir", str(self.workdir / "kcache"), *args]
        env = dict(os.environ, HOME=str(self.workdir))
        proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True, env=env, timeout=60)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return proc

    def kubectl_json(self, *args: str) -> dict:
        return json.loads(self.kubectl(*args, "-o", "json").stdout)

    # -- helpers ------------------------------------------------------------------

    def install_crds(self) -> dict[str, dict]:
        """The project's CRDs (charts/slurmk8s/files/crds), created through the API as a
        client would, those not there yet; by name."""
        import yaml

        there = {c.metadata.name for c in self.ext.list_custom_resource_definition().items}
        docs = {}
        for f in sorted(CRDS.glob("*.yaml")):
            for doc in yaml.safe_load_all(f.read_text()):
                if doc:
                    if doc["metadata"]["name"] not in there:
                        self.ext.create_custom_resource_definition(doc)
                    docs[doc["metadata"]["name"]] = doc
        return docs

    def namespace(self, prefix: str = "t") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        self.core.create_namespace({"metadata": {"name": name}})
        return name

    def node(self, name: str, cpu: str = "4", memory: str = "8Gi", pods: str = "110", labels: dict | None = None,
             taints: list | None = None, extra: dict | None = None, ready: bool = False) -> dict:
        alloc = {"cpu": cpu, "memory": memory, "pods": pods, **(extra or {})}
        body: dict = {
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
            "spec": {"taints": taints or []},
            "status": {"allocatable": alloc, "capacity": alloc},
        }
        if ready:
            body["status"]["conditions"] = [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]
        return self.api_client.sanitize_for_serialization(self.core.create_node(body))

    def pod(self, ns: str, name: str, labels: dict | None = None, **spec) -> Any:
        container = {"name": "main", "image": "busybox:1.36"}
        if "requests" in spec:
            container["resources"] = {"requests": spec.pop("requests")}
        body = {"metadata": {"name": name, "labels": labels or {}}, "spec": {"containers": [container], **spec}}
        return self.core.create_namespaced_pod(ns, body)

    def report_running(self, ns: str, name: str, ready: bool = True, ip: str = "10.0.0.1") -> None:
        """What a kubelet writes once a pod's containers run."""
        pod = self.core.read_namespaced_pod(name, ns)
        status = {
            "phase": "Running",
            "podIP": ip,
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Initialized", "status": "True"},
                {"type": "ContainersReady", "status": "True" if ready else "False"},
                {"type": "Ready", "status": "True" if ready else "False"},
            ],
            "containerStatuses": [
                {"name": c.name, "image": c.image, "imageID": "", "ready": ready, "restartCount": 0,
                 "started": True, "state": {"running": {"startedAt": "2025-01-01T00:00:00Z"}}}
                for c in pod.spec.containers
            ],
        }
        self.core.patch_namespaced_pod_status(name, ns, {"status": status}, _content_type="application/merge-patch+json")


def start_server(tmp: Path, **kw) -> Cluster:
    srv = APIServer(tmp / "data", **kw)
    srv.start()
    return Cluster(srv, tmp)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Cluster:
    c = start_server(tmp_path_factory.mktemp("apiserver"))
    yield c
    c.api_client.close()
    c.srv.stop()


@pytest.fixture
def ns(cluster: Cluster) -> str:
    return cluster.namespace()
