#!/usr/bin/env python3
"""Load the HTTP servers of slurmk8s's own pods in a running sandbox, from
where their callers and an attacker would stand: prints figures, asserts
nothing.

For each server, ``hack/bench_http_load.py --address`` runs in a pod's
network namespace (``--slow`` slow and ``--idle`` idle connections, reopened
when closed, for ``--seconds``) while it times the legitimate caller's
request, and reads the server process's threads and RSS on this host (the
sandbox's pods are processes here):

- the operator's webhook (9443), ``POST /validate`` of the example
  SlurmCluster, from the cluster's login pod: a researcher's shell;
- the operator's and the bridge's ``/healthz`` (8081, 8091) and ``/metrics``
  (8080, 8090), from the host's network, where the kubelet's probes come from
  (the chart's NetworkPolicies admit no pod there);
- the Slurm agent (6830, ``GET /v1/ping`` with the cluster's token), from the
  operator's pod, the one its NetworkPolicy admits.

Then it tries each port from the login pod once (what the NetworkPolicies let
a researcher reach) and prints every slurmk8s pod's restarts and last
termination reason (OOMKilled shows there).

    hack/bench_http_sandbox.py [--state-dir D] [--slow 300] [--idle 300] [--seconds 30]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = ROOT / ".venv" / "bin" / "python"
LOAD = ROOT / "hack" / "bench_http_load.py"
SYSTEM = "slurmk8s-system"


def sh(*argv: str, input: str | None = None) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, input=input, timeout=120).stdout


def kubectl(kubeconfig: str, *argv: str) -> dict:
    return json.loads(sh("kubectl", "--kubeconfig", kubeconfig, *argv, "-o", "json"))


def netns_of(pod: str) -> str:
    """The sandbox's network namespace of ``pod`` (``sk8s-<sid>-<pod>``)."""
    names = [line.split()[0] for line in sh("ip", "netns", "list").splitlines() if line.strip()]
    found = [n for n in names if n.rsplit("-", 1)[0].endswith("-" + pod)]
    if len(found) != 1:
        raise SystemExit(f"no single network namespace for pod {pod}: {found}")
    return found[0]


def server_pid(netns: str, word: str) -> int | None:
    """The process in ``netns`` whose command line has ``word`` (the largest by RSS)."""
    best: tuple[int, int] | None = None
    for pid in sh("ip", "netns", "pids", netns).split():
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            rss = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
        except (OSError, ValueError):
            continue
        if word in cmd and (best is None or rss > best[1]):
            best = (int(pid), rss)
    return best[0] if best else None


def load(netns: str | None, address: str, path: str, pid: int | None, args: argparse.Namespace,
         *extra: str) -> dict | None:
    argv = [str(PYTHON), str(LOAD), "--address", address, "--path", path, "--slow", str(args.slow),
            "--idle", str(args.idle), "--seconds", str(args.seconds), "--every", "3", *extra]
    if pid:
        argv += ["--pid", str(pid)]
    if netns:
        argv = ["nsenter", f"--net=/var/run/netns/{netns}", *argv]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=args.seconds + 120)
    lines = proc.stdout.splitlines()
    for line in lines[:1] + lines[-2:-1]:
        print("   ", line)
    figures = next((json.loads(line.split(":", 1)[1]) for line in lines if line.startswith("figures:")), None)
    if figures is None:
        print("    no figures:", proc.stderr[-400:])
    return figures


def reaches(netns: str, host: str, port: int) -> str:
    code = (f"import socket\ntry:\n socket.create_connection(({host!r}, {port}), timeout=3).close(); print('open')\n"
            "except OSError as e:\n print(type(e).__name__)")
    return sh("nsenter", f"--net=/var/run/netns/{netns}", str(PYTHON), "-c", code).strip()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--state-dir", default="/var/lib/slurmk8s/sandbox")
    p.add_argument("--slow", type=int, default=300)
    p.add_argument("--idle", type=int, default=300)
    p.add_argument("--seconds", type=float, default=30)
    args = p.parse_args()
    st = json.loads(sh(str(ROOT / ".venv/bin/slurmk8s"), "sandbox", "status", "--state-dir", args.state_dir,
                       "-o", "json"))
    kc = st["kubeconfig"]
    pods = kubectl(kc, "get", "pods", "-A")["items"]

    def pod(namespace: str | None, component: str):
        return next(x for x in pods if (namespace is None or x["metadata"]["namespace"] == namespace)
                    and (x["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == component
                    and x.get("status", {}).get("podIP"))

    operator, bridge = pod(SYSTEM, "operator"), pod(SYSTEM, "bridge")
    login = pod(None, "login")
    ctld = pod(login["metadata"]["namespace"], "controller")
    ns = login["metadata"]["namespace"]
    op_ip, br_ip, ctld_ip = operator["status"]["podIP"], bridge["status"]["podIP"], ctld["status"]["podIP"]
    op_ns, br_ns, login_ns = (netns_of(x["metadata"]["name"]) for x in (operator, bridge, login))
    op_pid, br_pid = server_pid(op_ns, "operator"), server_pid(br_ns, "bridge")
    agent_pid = server_pid(netns_of(ctld["metadata"]["name"]), "agent")
    print(f"cores {os.cpu_count()}; operator {operator['metadata']['name']} {op_ip} (pid {op_pid}), bridge "
          f"{bridge['metadata']['name']} {br_ip} (pid {br_pid}), agent {ctld_ip} (pid {agent_pid}), "
          f"from {login['metadata']['name']}")
    doc = kubectl(kc, "get", "slurmcluster", "-n", ns, login["metadata"]["labels"]["slurmk8s.dev/cluster"])
    doc.pop("status", None)
    for k in ("managedFields", "resourceVersion", "uid", "creationTimestamp", "generation"):
        doc["metadata"].pop(k, None)
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "load-1", "kind": {"group": "slurmk8s.dev", "version": "v1alpha1", "kind": "SlurmCluster"},
        "operation": "UPDATE", "object": doc, "oldObject": doc, "namespace": ns, "name": doc["metadata"]["name"]}}
    secrets = kubectl(kc, "get", "secrets", "-n", ns)["items"]
    token = next((base64.b64decode(v).decode().strip() for s in secrets for v in (s.get("data") or {}).values()
                  if s["metadata"]["name"].endswith("-agent-token")), None)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        body, tok = Path(tmp, "review.json"), Path(tmp, "token")
        body.write_text(json.dumps(review))
        tok.write_text(token or "")
        os.chmod(tmp, 0o700)
        print(f"== webhook {op_ip}:9443 from the login pod")
        results["webhook"] = load(login_ns, f"{op_ip}:9443", "/validate", op_pid, args, "--tls",
                                  "--body-file", str(body))
        for name, ip, port, path, pid in (("operator /healthz", op_ip, 8081, "/healthz", op_pid),
                                           ("operator /metrics", op_ip, 8080, "/metrics", op_pid),
                                           ("bridge /healthz", br_ip, 8091, "/healthz", br_pid),
                                           ("bridge /metrics", br_ip, 8090, "/metrics", br_pid)):
            print(f"== {name} {ip}:{port} from the host (the kubelet's side)")
            results[name] = load(None, f"{ip}:{port}", path, pid, args)
        if token:
            print(f"== agent {ctld_ip}:6830 from the operator's pod")
            results["agent"] = load(op_ns, f"{ctld_ip}:6830", "/v1/ping", agent_pid, args, "--token-file", str(tok))
    print("== what the login pod reaches")
    for name, ip, port in (("webhook", op_ip, 9443), ("operator health", op_ip, 8081),
                           ("operator metrics", op_ip, 8080), ("bridge health", br_ip, 8091),
                           ("bridge metrics", br_ip, 8090), ("agent", ctld_ip, 6830)):
        print(f"   {name} {ip}:{port}: {reaches(login_ns, ip, port)}")
    print("== restarts and last terminations of slurmk8s's pods")
    for x in kubectl(kc, "get", "pods", "-A")["items"]:
        if x["metadata"]["namespace"] in (SYSTEM, ns):
            for c in x.get("status", {}).get("containerStatuses", []):
                last = (c.get("lastState") or {}).get("terminated", {}).get("reason", "-")
                print(f"   {x['metadata']['name']}/{c['name']}: restarts {c.get('restartCount', 0)}, last {last}")
    print("summary: " + json.dumps(results))
    return 0


if __name__ == "__main__":
    socket.setdefaulttimeout(10)
    sys.exit(main())
