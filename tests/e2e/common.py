"""What the sandbox e2e tests share: a sandbox for the length of a module, and waiting."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import yaml

from slurmk8s.manifest import with_slurm_version
from sandbox import Sandbox, install
from sandbox.apiserver import audit

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
