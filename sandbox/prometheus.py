"""A Prometheus in the sandbox, as a site runs one: examples/monitoring/prometheus.yaml
applied with kubectl (the image built from Debian's prometheus package, Kubernetes
service discovery), the chart's alert rules as its rules ConfigMap, and its HTTP
API asked from the host, which reaches pods on the sandbox's bridge. For the
e2e tests and the demo (hack/demo_metrics.py)."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from pathlib import Path

from .install import MONITORING_NAMESPACE
from .sandbox import Sandbox, SandboxFailed

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "examples" / "monitoring" / "prometheus.yaml"
RULES = ROOT / "charts" / "slurmk8s" / "files" / "prometheus" / "alerts.yaml"
NAMESPACE = MONITORING_NAMESPACE  # the chart values admit its scrapes (install.values)
SELECTOR = "app.kubernetes.io/name=prometheus"


class Prometheus:
    def __init__(self, box: Sandbox):
        self.box = box
        client, api = box.api()
        self.core = client.CoreV1Api(api)

    def _kubectl(self, *args: str) -> str:
        proc = self.box.kubectl(*args)
        if proc.returncode != 0:
            raise SandboxFailed(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout

    def install(self, timeout: float = 120) -> None:
        """Apply the example and the rules; return once Prometheus is ready (``installed``: when)."""
        self._kubectl("apply", "-f", str(MANIFEST))
        rules = self._kubectl("-n", NAMESPACE, "create", "configmap", "prometheus-rules", f"--from-file={RULES}",
                              "--dry-run=client", "-o", "json")
        proc = self.box.kubectl("apply", "-f", "-", input=rules)
        if proc.returncode != 0:
            raise SandboxFailed(f"the rules ConfigMap: {proc.stderr.strip()}")
        deadline = time.monotonic() + timeout
        while self._pod(ready=True) is None:
            if time.monotonic() > deadline:
                raise SandboxFailed(f"Prometheus was not ready within {timeout:.0f}s: "
                                    f"`kubectl -n {NAMESPACE} describe pod -l {SELECTOR}`")
            time.sleep(0.5)
        self.installed = time.time()

    def _pod(self, ready: bool = False):
        for p in self.core.list_namespaced_pod(NAMESPACE, label_selector=SELECTOR).items:
            if p.status.pod_ip and (not ready or any(c.type == "Ready" and c.status == "True"
                                                     for c in p.status.conditions or [])):
                return p
        return None

    @property
    def url(self) -> str:
        pod = self._pod()
        if pod is None:
            raise SandboxFailed(f"no Prometheus pod in {NAMESPACE} has an address")
        return f"http://{pod.status.pod_ip}:9090"

    def api(self, path: str, **params: str) -> dict:
        url = f"{self.url}/api/v1/{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        with urllib.request.urlopen(url, timeout=30) as resp:
            body = json.load(resp)
        if body.get("status") != "success":
            raise SandboxFailed(f"Prometheus answered {path} with {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        """An instant query's result: [{"metric": {...}, "value": [time, "value"]}, ...]."""
        return self.api("query", query=expr)["result"]

    def query_range(self, expr: str, start: float, end: float, step: float = 15) -> list[dict]:
        """A range query's result, as Grafana asks for a panel's time range:
        [{"metric": {...}, "values": [[time, "value"], ...]}, ...]."""
        return self.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=f"{step:g}")["result"]

    def targets(self) -> list[dict]:
        return self.api("targets", state="active")["activeTargets"]
