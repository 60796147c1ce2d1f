#!/usr/bin/env python3
"""Benchmark the bridge's load on the Kubernetes API: prints figures, asserts nothing.

API requests the bridge makes per minute at idle, and per lend and per
reclaim, with 1,000 GPU Node objects (and a CPU pod on each) in the API
stand-in, for two bridges in the same run: "before" (a checkout and its
virtual environment, by default /work/main's) and "after" (this tree). Each
gets a fresh stand-in process with the same objects; only the stand-in runs,
no kubelet and no Slurm:

- this script plays the kubelet for the lent slurmd pods (reports them
  Running, deletes them once they are being deleted) and, through a directory
  of marker files, Slurm's registration of the lent node;
- each bridge runs in its own process, from its own tree, as
  ``slurmk8s bridge`` builds it, with a Slurm facade that reads those marker
  files (``--driver``), logged in as its own ServiceAccount (cluster-admin);
- requests are counted in the stand-in's audit log (one line per request; a
  watch counts once, when it starts), those of the bridge's user only.

One node (``gpu-0000``) is lendable, by a policy with idleAfterSeconds 0.
Idle: windows of ``--idle-window`` seconds with that node lent and nothing
changing. Reclaim: a pod wanting the node's 4 GPUs, pinned to it, is created
-> the node is handed back. Lend: that pod is deleted -> the node is lent
again (Slurm has it). Medians over ``--cycles``.

    hack/bench_bridge_api.py [--before /work/main] [--interval 2] [--cycles 3]   (after hack/setup.sh)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NS = "default"
LENT_NODE = "gpu-0000"
BRIDGE_SA = "bench-bridge"
BRIDGE_USER = f"system:serviceaccount:{NS}:{BRIDGE_SA}"
SERVE_POD = "bench-serve"


# --driver: runs in the bridge's own tree and virtual environment.


def driver(kubeconfig: str, slurm_dir: str, interval: float) -> None:
    import signal

    from slurmk8s.kube import Kube
    from slurmk8s.slurm.model import Node

    class DirSlurm:
        """Slurm as marker files say: one idle node per file; no jobs."""

        def __init__(self, root: Path):
            self.root = root

        def nodes(self):
            return [Node(name=p.name, state="idle", flags=frozenset(), reason="", features=("lent_gpu",),
                         partitions=("gpu",), cpus=8, alloc_cpus=0, gres="gpu:h100:4", address="")
                    for p in sorted(self.root.iterdir())]

        def jobs(self, nodes=()):
            return []

        def drain(self, name, reason):
            pass

        def set_down(self, name, reason):
            pass

        def signal_node_jobs(self, name, signal):
            return []

        def requeue(self, job):
            pass

        def start_now(self, job):
            pass

        def cancel(self, job):
            pass

        def delete_node(self, name):
            (self.root / name).unlink(missing_ok=True)

    slurm = DirSlurm(Path(slurm_dir))

    def agent(cluster, token, pod):
        return slurm

    kube = Kube.from_kubeconfig(kubeconfig, field_manager="slurmk8s-bridge")
    try:
        from slurmk8s.bridge.main import watching_bridge
    except ImportError:  # a bridge from before the watches: one full read per round
        from slurmk8s.bridge.loop import Bridge

        bridge = Bridge(kube, agent=agent, namespaces=[NS])
    else:
        bridge = watching_bridge(kube, [NS], agent=agent)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    bridge.run_forever(interval, stop=stop.is_set)


# The benchmark.


class StandIn:
    """The API stand-in as a process, with the objects of the benchmark."""

    def __init__(self, work: Path, nodes: int):
        from slurmk8s.kube import Kube

        self.work = work
        self.data = work / "api"
        self.admin_config = work / "admin.kubeconfig"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sandbox.apiserver", "--data-dir", str(self.data),
             "--kubeconfig", str(self.admin_config), "--crds", str(ROOT / "charts/slurmk8s/files/crds"),
             "--log-level", "warning"],
            stdout=subprocess.PIPE, stderr=open(work / "apiserver.log", "w"), text=True, cwd=ROOT)
        line = self.proc.stdout.readline()
        if not line.startswith("https://"):
            raise RuntimeError(f"the stand-in did not start: {line!r}; see {work / 'apiserver.log'}")
        self.kube = Kube.from_kubeconfig(str(self.admin_config), timeout=30)
        self.audit = self.data / "audit.log"
        self.populate(nodes)
        self.bridge_config = self.bridge_kubeconfig()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)

    def populate(self, count: int) -> None:
        k = self.kube
        k.create({"apiVersion": "slurmk8s.dev/v1alpha1", "kind": "SlurmCluster",
                  "metadata": {"name": "demo", "namespace": NS},
                  "spec": {"partitions": [{"name": "gpu", "acceptLentNodes": True}]}})
        k.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "demo-agent-token", "namespace": NS},
                  "data": {"token": "dGVzdHRlc3R0ZXN0dGVzdHRlc3R0ZXN0dGVzdHRlc3Q="}})
        alloc = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "4"}
        for i in range(count):
            name = f"gpu-{i:04d}"
            labels = {"kubernetes.io/hostname": name}
            if name == LENT_NODE:
                labels.update({"lendable": "true", "slurmk8s.dev/lendable-to": NS})
            k.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
                      "status": {"allocatable": alloc, "capacity": alloc, "conditions": [
                          {"type": "Ready", "status": "True", "reason": "KubeletReady"}]}})
            k.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"web-{i:04d}", "namespace": NS},
                      "spec": {"nodeName": name, "containers": [{"name": "web", "image": "busybox:1.36",
                                                                  "resources": {"requests": {"cpu": "1"}}}]}})
        k.create({"apiVersion": "slurmk8s.dev/v1alpha1", "kind": "NodeLendingPolicy",
                  "metadata": {"name": "lend", "namespace": NS},
                  "spec": {"clusterRef": {"name": "demo"}, "partition": "gpu", "idleAfterSeconds": 0,
                           "maxLentNodes": 1, "nodeSelector": {"matchLabels": {"lendable": "true"}},
                           "reclaim": {"gracePeriodSeconds": 5}}})

    def bridge_kubeconfig(self) -> Path:
        """A kubeconfig for the bridge's own ServiceAccount (cluster-admin), so
        that its requests are told apart in the audit log."""
        import yaml

        k = self.kube
        k.request("POST", f"api/v1/namespaces/{NS}/serviceaccounts",
                  body={"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": BRIDGE_SA}})
        k.request("POST", "apis/rbac.authorization.k8s.io/v1/clusterrolebindings", body={
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": BRIDGE_SA},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": BRIDGE_SA, "namespace": NS}]})
        answer = k.request("POST", f"api/v1/namespaces/{NS}/serviceaccounts/{BRIDGE_SA}/token", body={
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 7200}})
        config = yaml.safe_load(self.admin_config.read_text())
        config["users"][0]["user"] = {"token": answer["status"]["token"]}
        path = self.work / "bridge.kubeconfig"
        path.touch(mode=0o600)
        path.write_text(yaml.safe_dump(config))
        return path

    def mark(self) -> int:
        return self.audit.stat().st_size

    def requests_since(self, mark: int) -> list[dict]:
        with open(self.audit, "rb") as f:
            f.seek(mark)
            lines = [json.loads(line) for line in f.read().splitlines() if line.strip()]
        return [e for e in lines if e.get("user") == BRIDGE_USER]


class Kubelet:
    """The kubelet of the lent slurmd pods, and Slurm's registration (marker files)."""

    def __init__(self, api: StandIn, slurm_dir: Path):
        self.api, self.slurm_dir = api, slurm_dir
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        k = self.api.kube
        while not self.stop.wait(0.05):
            try:
                for pod in k.list("Pod", NS, selector="app.kubernetes.io/component=lent-slurmd"):
                    meta, spec = pod["metadata"], pod.get("spec") or {}
                    node = spec.get("nodeName")
                    if meta.get("deletionTimestamp"):
                        (self.slurm_dir / node).unlink(missing_ok=True) if node else None
                        k.request("DELETE", k.path("Pod", NS, meta["name"]),
                                  body={"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0})
                    elif node and (pod.get("status") or {}).get("phase") != "Running":
                        k.patch("Pod", NS, meta["name"], {"status": {"phase": "Running", "podIP": "10.0.0.9",
                                "conditions": [{"type": "Ready", "status": "True"}]}}, subresource="status")
                        (self.slurm_dir / node).touch()
            except Exception as exc:  # noqa: BLE001 - a benchmark helper: try again
                print(f"  (kubelet: {exc})", file=sys.stderr)


def node_state(api: StandIn) -> str | None:
    node = api.kube.get("Node", None, LENT_NODE) or {}
    return ((node.get("metadata") or {}).get("labels") or {}).get("slurmk8s.dev/lending")


def wait(what: str, predicate, timeout: float = 120) -> float:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return time.monotonic()


def measure(name: str, tree: Path, python: Path, args) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"idle": [], "lend": [], "reclaim": [], "lend_s": [], "reclaim_s": []}
    with tempfile.TemporaryDirectory(prefix=f"bench-api-{name}-") as tmp:
        work = Path(tmp)
        slurm_dir = work / "slurm"
        slurm_dir.mkdir()
        print(f"{name}: {tree} — starting the stand-in with {args.nodes} Nodes and Pods", flush=True)
        api = StandIn(work, args.nodes)
        kubelet = Kubelet(api, slurm_dir)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KUBECONFIG")}
        bridge = subprocess.Popen([str(python), str(Path(__file__).resolve()), "--driver",
                                   "--kubeconfig", str(api.bridge_config), "--slurm-dir", str(slurm_dir),
                                   "--interval", str(args.interval)],
                                  cwd=tree, env=env, stdout=open(work / "bridge.log", "w"), stderr=subprocess.STDOUT)
        try:
            wait("the first lend", lambda: node_state(api) == "lent", timeout=180)
            time.sleep(args.interval * 2)
            for _ in range(args.idle_windows):
                mark = api.mark()
                time.sleep(args.idle_window)
                out["idle"].append(len(api.requests_since(mark)) * 60 / args.idle_window)
            for _ in range(args.cycles):
                mark, t0 = api.mark(), time.monotonic()
                api.kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": SERVE_POD, "namespace": NS},
                                 "spec": {"nodeSelector": {"kubernetes.io/hostname": LENT_NODE},
                                          "containers": [{"name": "serve", "image": "busybox:1.36",
                                                          "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}})
                t1 = wait("the reclaim", lambda: node_state(api) is None)
                out["reclaim"].append(len(api.requests_since(mark)))
                out["reclaim_s"].append(t1 - t0)
                time.sleep(args.interval)
                mark, t0 = api.mark(), time.monotonic()
                api.kube.request("DELETE", api.kube.path("Pod", NS, SERVE_POD),
                                 body={"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0})
                t1 = wait("the lend", lambda: node_state(api) == "lent")
                out["lend"].append(len(api.requests_since(mark)))
                out["lend_s"].append(t1 - t0)
                time.sleep(args.interval)
        finally:
            bridge.terminate()
            try:
                bridge.wait(timeout=20)
            except subprocess.TimeoutExpired:
                bridge.kill()
            kubelet.stop.set()
            api.stop()
            if args.keep_logs:
                for log in ("bridge.log", "apiserver.log"):
                    (Path(args.keep_logs) / f"{name}-{log}").write_bytes((work / log).read_bytes())
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--driver", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--kubeconfig", help=argparse.SUPPRESS)
    p.add_argument("--slurm-dir", help=argparse.SUPPRESS)
    p.add_argument("--interval", type=float, default=2.0, help="the bridge's --interval (default 2, its default)")
    p.add_argument("--before", type=Path, default=Path("/work/main"),
                   help="the tree of the bridge to compare with (its .venv runs it)")
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--cycles", type=int, default=3, help="reclaim-and-lend cycles")
    p.add_argument("--idle-windows", type=int, default=3)
    p.add_argument("--idle-window", type=float, default=30.0, help="seconds")
    p.add_argument("--only", choices=("before", "after"), help="measure one bridge only")
    p.add_argument("--keep-logs", help="copy the bridges' and stand-ins' logs to this directory")
    args = p.parse_args()
    if args.driver:
        driver(args.kubeconfig, args.slurm_dir, args.interval)
        return
    sys.path.insert(0, str(ROOT))
    results = {}
    for name, tree in (("before", args.before.resolve()), ("after", ROOT)):
        if args.only in (None, name):
            results[name] = measure(name, tree, tree / ".venv/bin/python", args)
    print(f"\nAPI requests by the bridge, {args.nodes} Nodes and {args.nodes} Pods, --interval {args.interval:g}; "
          f"medians (min-max):")

    def fig(values: list[float], unit: str = "") -> str:
        return f"{statistics.median(values):8.1f}{unit} ({min(values):.1f}-{max(values):.1f}, n={len(values)})"

    print(f"{'':<34}" + "".join(f"{name:<30}" for name in results))
    for key, label in (("idle", "idle, requests/minute"), ("lend", "per lend (requests)"),
                       ("reclaim", "per reclaim (requests)"), ("lend_s", "lend: pod gone -> lent (s)"),
                       ("reclaim_s", "reclaim: pod created -> back (s)")):
        print(f"{label:<34}" + "".join(f"{fig(r[key]):<30}" for r in results.values()))


if __name__ == "__main__":
    main()
