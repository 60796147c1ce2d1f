"""A platform engineer's view of a sandbox cluster for the e2e suites:
kubectl, and Slurm as its admin sees it (:class:`Platform`); a cluster brought
up from a manifest on a sandbox and subnet of its own (:class:`ManifestPlatform`)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import yaml

from sandbox import Sandbox
from slurmk8s.manifest import with_slurm_version

SLURMK8S = str(Path(sys.executable).parent / "slurmk8s")


class Platform:
    """A platform engineer's view: kubectl, plus Slurm as its admin sees it."""

    def __init__(self, box: Sandbox, name: str = "ops"):
        self.box = box
        self.name = name
        self.controller = f"{name}-controller-0"

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        proc = self.box.kubectl(*args, input=input)
        assert not check or proc.returncode == 0, proc.stderr
        return proc

    def cluster(self) -> dict:
        return json.loads(self.kubectl("get", "slurmcluster", self.name, "-o", "json").stdout)

    def ready(self) -> bool:
        c = self.cluster()
        st = c.get("status", {})
        return st.get("phase") == "Ready" and st.get("observedGeneration") == c["metadata"]["generation"]

    def scontrol(self, *args: str) -> str:
        proc = subprocess.run(self.box.exec(self.controller, ["scontrol", *args]), capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    def sbatch(self, *args: str) -> int:
        proc = subprocess.run(self.box.exec(self.controller, ["sbatch", "--parsable", *args]),
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return int(proc.stdout.strip())

    def job(self, job: int) -> dict[str, str]:
        return dict(f.split("=", 1) for f in self.scontrol("show", "job", "--oneliner", str(job)).split() if "=" in f)

    def ctld_pid(self) -> str:
        proc = subprocess.run(self.box.exec(self.controller, ["pidof", "slurmctld"]), capture_output=True,
                              text=True, timeout=30)
        return proc.stdout.strip()


class ManifestPlatform(Platform):
    """A platform engineer who brings a cluster up from a manifest with
    `sandbox up`, on a sandbox (and subnet) of its own."""

    NAME = ""
    SUBNET = ""
    #: `sandbox up --timeout`, and how long the command may take in all
    UP_TIMEOUT = (150, 200)

    def __init__(self, box: Sandbox, work: Path, env: dict, release: str):
        super().__init__(box, self.NAME)
        self.work, self.env, self.release = work, env, release

    def up(self, doc: dict) -> subprocess.CompletedProcess:
        """`sandbox up` with ``doc`` on the module's Slurm release."""
        path = self.work / f"{self.NAME}.yaml"
        path.write_text(yaml.safe_dump(with_slurm_version([doc], self.release)[0]))
        inner, outer = self.UP_TIMEOUT
        return subprocess.run([SLURMK8S, "sandbox", "up", "-f", str(path), "--subnet", self.SUBNET,
                               "--timeout", str(inner)], capture_output=True, text=True, env=self.env, timeout=outer)

    @classmethod
    @contextlib.contextmanager
    def running(cls, work: Path, release: str, doc: dict) -> Iterator[ManifestPlatform]:
        """Up with ``doc`` (asserted), then down with everything purged."""
        assert os.geteuid() == 0, "the sandbox needs root"
        env = {**os.environ, "SLURMK8S_SANDBOX_DIR": str(work / "state")}
        p = cls(Sandbox(work / "state"), work, env, release)
        try:
            up = p.up(doc)
            assert up.returncode == 0, up.stderr
            yield p
        finally:
            subprocess.run([SLURMK8S, "sandbox", "down", "--purge"], capture_output=True, env=env, timeout=240)
