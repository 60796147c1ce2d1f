"""A live Slurm upgrade through the operator, with accounting (slurmk8s/operator/upgrade.py).

A cluster on the older release of the one in-place step the release matrix
offers records a job and queues a held one; the manifest is applied again
with the newer release, as a platform engineer would. slurmdbd moves first,
then slurmctld, then the node; the finished job stays in sacct and the queued
one survives in slurmctld's state and runs on the new release. A step back is
refused at the API by the operator's webhook, and the cluster keeps running.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from sandbox.runtime import SandboxError
from slurmk8s import versions

from .common import wait_for
from .test_accounting_e2e import KEY, Accounting

pytestmark = pytest.mark.slurm
#: The oldest in-place step between supported releases.
FROM, TO = next((a, b) for a in versions.SUPPORTED for b in versions.SUPPORTED
                if a != b and versions.upgrade_problem(a, b) is None)
NAME = "upg"
UID = 2201
MANIFEST = {
    "apiVersion": "slurmk8s.dev/v1alpha1", "kind": "SlurmCluster", "metadata": {"name": NAME},
    "spec": {
        "nodeSets": [{"name": "cpu", "replicas": 1, "cpus": 1, "memory": "1Gi", "drain": {"gracePeriod": 5}}],
        "partitions": [{"name": "cpu", "nodeSets": ["cpu"], "default": True}],
        "login": {"replicas": 0, "users": [{"name": "carol", "uid": UID, "sshPublicKeys": [KEY]}]},
        "accounting": {"enabled": True, "database": {"managed": {"volume": {"size": "1Gi"}}}},
    },
}


class Upgrade(Accounting):
    NAME, SUBNET = NAME, "10.253.97.0/24"

    def pods(self) -> dict[str, dict]:
        return {p["metadata"]["name"]: p for p in json.loads(self.kubectl("get", "pods", "-o", "json").stdout)["items"]}

    def ready_since(self, pod: dict) -> str:
        return next(c["lastTransitionTime"] for c in pod["status"]["conditions"] if c["type"] == "Ready")

    def run(self, *argv: str) -> str:
        """A command's output in the controller pod; nothing while the pod is being replaced."""
        try:
            argv_ = self.box.exec(self.controller, list(argv))
        except (KeyError, SandboxError):
            return ""
        return subprocess.run(argv_, capture_output=True, text=True, timeout=60).stdout

    def ctld_version(self) -> str:
        """slurmctld's release as its pod's scontrol prints it ("slurm-wlm 26.05.5" from Debian)."""
        out = self.run("scontrol", "--version").split()
        return out[-1] if out else ""

    def node_version(self) -> str:
        fields = dict(f.split("=", 1) for f in self.run("scontrol", "show", "node", f"{NAME}-cpu-0",
                                                        "--oneliner").split() if "=" in f)
        return fields.get("Version", "")


@pytest.fixture(scope="module")
def upg(tmp_path_factory):
    with Upgrade.running(tmp_path_factory.mktemp("upgrade"), FROM, MANIFEST) as p:
        yield p


def test_a_live_upgrade_moves_slurmdbd_then_slurmctld_then_the_nodes_and_loses_nothing(upg):
    wait_for("AccountingReady", lambda: upg.condition("AccountingReady")[0] == "True", timeout=180,
             show=upg.diagnose)
    assert upg.ctld_version().startswith(f"{FROM}.")
    done = upg.submit_and_finish(UID)
    queued = upg.as_user(UID, "sbatch", "--parsable", "--hold", "-D", "/tmp", "-o", "/dev/null", "--wrap", "true")
    assert queued.returncode == 0, queued.stderr
    queued_job = int(queued.stdout.strip().split(";")[0])
    wait_for(f"sacct shows job {done}", lambda: any("|COMPLETED|" in x for x in upg.sacct(done)), timeout=60)
    before = {n: p["metadata"]["uid"] for n, p in upg.pods().items()}

    upg.release = TO  # the same manifest, the newer release: `sandbox up` applies it as kubectl would
    up = upg.up(MANIFEST)
    assert up.returncode == 0, up.stderr
    wait_for(f"slurmctld on {TO}", lambda: upg.ctld_version().startswith(f"{TO}."),
             timeout=300, show=upg.diagnose)
    wait_for(f"the node's slurmd on {TO}", lambda: upg.node_version().startswith(f"{TO}."), timeout=300,
             show=upg.diagnose)
    wait_for("Ready", lambda: upg.condition("Ready")[0] == "True", timeout=180, show=upg.diagnose)

    # Slurm's order: each daemon's new pod was created once the one before it was ready on the new release.
    pods = upg.pods()
    dbd = next(p for n, p in pods.items() if n.startswith(f"{NAME}-slurmdbd-"))
    ctld, node = pods[f"{NAME}-controller-0"], pods[f"{NAME}-cpu-0"]
    assert all(p["metadata"]["uid"] not in before.values() for p in (dbd, ctld, node))
    assert upg.ready_since(dbd) <= ctld["metadata"]["creationTimestamp"], (dbd["status"], ctld["metadata"])
    assert upg.ready_since(ctld) <= node["metadata"]["creationTimestamp"], (ctld["status"], node["metadata"])
    events = upg.kubectl("get", "events", "--field-selector", f"involvedObject.name={NAME}").stdout
    assert "UnsupportedUpgrade" not in events

    # Nothing lost: the finished job is in sacct, the queued one is still queued and runs on the new release.
    assert any("|COMPLETED|" in x for x in upg.sacct(done)), upg.sacct(done)
    assert upg.job(queued_job)["JobState"] == "PENDING"
    upg.run("scontrol", "release", str(queued_job))
    wait_for(f"the queued job {queued_job} done", lambda: any("|COMPLETED|" in x for x in upg.sacct(queued_job)),
             timeout=120, show=lambda: upg.job(queued_job))


def test_a_step_back_is_refused_and_the_cluster_keeps_running(upg):
    ctld_uid = upg.pods()[f"{NAME}-controller-0"]["metadata"]["uid"]
    assert upg.cluster()["status"]["slurmVersion"] == TO
    # The operator's webhook refuses it at the API, with the operator's own words.
    proc = upg.kubectl("patch", "slurmcluster", NAME, "--type", "merge",
                       "-p", json.dumps({"spec": {"slurm": {"version": FROM}}}), check=False)
    assert proc.returncode != 0
    assert 'admission webhook "slurmclusters.validate.slurmk8s.dev" denied the request' in proc.stderr
    assert "spec.slurm.version: " in proc.stderr and f"Set it back to {TO}" in proc.stderr
    assert upg.cluster()["spec"]["slurm"]["version"] == TO
    # The cluster keeps running its release: the same slurmctld, and jobs run.
    assert upg.pods()[f"{NAME}-controller-0"]["metadata"]["uid"] == ctld_uid
    assert upg.ctld_version().startswith(f"{TO}.")
    upg.submit_and_finish(UID)
