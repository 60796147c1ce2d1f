"""What the sandbox e2e tests share: a sandbox for the length of a module, and waiting."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import yaml

from sandbox import Sandbox, install
from sandbox.apiserver import audit
from slurmk8s.manifest import with_slurm_version

SLURMK8S = str(Path(sys.executable).parent / "slurmk8s")


def wait_for(what: str, predicate, timeout: float = 120, show=lambda: "", every: float = 0.3):
    """Poll ``predicate`` until it returns something true, and return that;
    ``show`` adds context to the timeout's message."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what} {show()}")
        time.sleep(every)


def product_identity(user: str) -> bool:
    """The operator's and bridge's ServiceAccounts, and the kubelet's node identity."""
    return user.startswith((f"system:serviceaccount:{install.RELEASE_NAMESPACE}:", "system:node:"))


def assert_nothing_forbidden(box: Sandbox) -> None:
    """No request of the product's identities was refused (403) by the API server's RBAC,
    all the while the sandbox ran: what a real cluster would refuse fails here too."""
    lines = audit.read(box.dir / "api" / "audit.log")
    assert any(product_identity(ln.get("user", "")) for ln in lines), "the audit log has no product request"
    refused = [ln for ln in audit.forbidden(lines) if product_identity(ln.get("user", ""))]
    assert refused == [], "requests the chart's RBAC does not allow:\n" + "\n".join(map(str, refused[:20]))


@contextlib.contextmanager
def running_sandbox(work: Path, doc: dict, subnet: str, release: str) -> Iterator[tuple[Sandbox, dict, Path]]:
    """`sandbox up` with the SlurmCluster ``doc`` on Slurm ``release`` in a state
    directory under ``work``; yields the sandbox, the environment that names
    it, and the manifest's path (which names the release). `sandbox down
    --purge` afterwards."""
    assert os.geteuid() == 0, "the sandbox needs root"
    manifest = work / f"{doc['metadata']['name']}.yaml"
    manifest.write_text(yaml.safe_dump(with_slurm_version([doc], release)[0]))
    env = {**os.environ, "SLURMK8S_SANDBOX_DIR": str(work / "state")}
    up = subprocess.run([SLURMK8S, "sandbox", "up", "-f", str(manifest), "--subnet", subnet, "--timeout", "180"],
                        capture_output=True, text=True, env=env, timeout=240)
    try:
        assert up.returncode == 0, up.stderr
        yield Sandbox(work / "state"), env, manifest
        assert_nothing_forbidden(Sandbox(work / "state"))
    finally:
        subprocess.run([SLURMK8S, "sandbox", "down", "--purge"], capture_output=True, env=env, timeout=240)


#: Requests that change something.
WRITES = frozenset({"create", "update", "patch", "delete", "deletecollection"})


def writers(box: Sandbox, account: str, since: str = "") -> list[str]:
    """The pods whose ServiceAccount ``account`` (in the release namespace) wrote
    through the API from ``since`` (an audit time) on, in order, each run of
    writes by one pod once: leader election's Lease renewals left out. The pod
    comes from the bound token's ``authentication.kubernetes.io/pod-name``."""
    user = f"system:serviceaccount:{install.RELEASE_NAMESPACE}:{account}"
    out: list[str] = []
    for line in audit.read(box.dir / "api" / "audit.log"):
        if line.get("user") != user or line.get("verb") not in WRITES or line.get("time", "") < since \
                or line.get("resource") == "leases":
            continue
        pod = (line.get("extra") or {}).get("authentication.kubernetes.io/pod-name", ["?"])[0]
        if not out or out[-1] != pod:
            out.append(pod)
    return out


def assert_one_writer_at_a_time(box: Sandbox, account: str, since: str, killed: str) -> None:
    """From ``since`` on, the account's writes came from the killed leader, then
    from the one leader after it, never again from the killed one (either may
    have had nothing to write)."""
    new = box.leader_pod(account.removeprefix("slurmk8s-") if account != "slurmk8s" else "operator")
    seen = writers(box, account, since)
    assert seen in ([], [killed], [new], [killed, new]), (seen, killed, new)


def audit_now(box: Sandbox) -> str:
    """The time of the audit log's last line (read from its end): what comes after it is new."""
    path = box.dir / "api" / "audit.log"
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 65536))
        lines = [line for line in f.read().splitlines() if line.strip()]
    return json.loads(lines[-1])["time"] if lines else ""


def kill_leader(box: Sandbox, kubectl, component: str) -> tuple[str, float]:
    """Delete the leading replica's pod at once (``--grace-period=0 --force``:
    no release of its Lease, as a crash or a lost node); then wait for a
    standby to lead. Returns the killed pod and the seconds from the kill to
    the new holder of the Lease."""
    leader = box.leader_pod(component)
    assert leader, f"no {component} leads"
    t0 = time.monotonic()
    kubectl("-n", install.RELEASE_NAMESPACE, "delete", "pod", leader, "--grace-period=0", "--force")
    new = wait_for(f"a standby {component} to lead", lambda: (lambda p: p if p and p != leader else None)(
        box.leader_pod(component)), timeout=60, every=0.2)
    took = time.monotonic() - t0
    print(f"\n{component} takeover: {took:.1f}s ({leader} killed, {new} leads)")
    return leader, took
