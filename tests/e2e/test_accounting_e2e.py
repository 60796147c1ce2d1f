"""Accounting through the operator in the sandbox (decision record 24): the
SlurmCluster's spec.accounting brings up MariaDB and slurmdbd as pods from
their images; jobs are recorded; a user added to login.users gets an
association and can submit; deleting the SlurmCluster keeps the database's
claim, and a cluster created again with the same name finds its old jobs.

The tests share one sandbox and run in order. The daemons' own behaviour
(records while slurmdbd or MariaDB is down, QOS, sreport) is
tests/test_accounting_images.py's, on every release.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from slurmk8s.render.keys import ssh_keypair

from .common import wait_for
from .conftest import default_release_only
from .lending import SERVE_IMAGE
from .platform import ManifestPlatform

pytestmark = [pytest.mark.slurm, default_release_only]
SLURMK8S = str(Path(sys.executable).parent / "slurmk8s")
SUBNET = "10.253.98.0/24"
NAME = "acct"
KEY = ssh_keypair()[1]
MANIFEST = {
    "apiVersion": "slurmk8s.dev/v1alpha1", "kind": "SlurmCluster", "metadata": {"name": NAME},
    "spec": {
        "nodeSets": [{"name": "cpu", "replicas": 1, "cpus": 1, "memory": "1Gi"}],
        "partitions": [{"name": "cpu", "nodeSets": ["cpu"], "default": True}],
        "login": {"replicas": 0, "users": [{"name": "alice", "uid": 2101, "sshPublicKeys": [KEY]}]},
        "accounting": {"enabled": True, "database": {"managed": {"volume": {"size": "1Gi"}}},
                       "accounts": [{"name": "ml", "users": ["alice"]}]},
        # The sandbox's namespace then denies egress too (sandbox/site.py): every flow of
        # slurmctld, slurmd, slurmdbd and MariaDB passes through the rendered policies.
        "network": {"egress": True},
    },
}
#: A pod of no cluster, in a namespace without policies, tries each address (a dropped
#: connection times out) and prints which it reached.
PROBE = """
import socket, sys
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
        print(target, "reached")
    except OSError as exc:
        print(target, type(exc).__name__)
"""
DB_CLAIM = f"data-{NAME}-mariadb-0"


class Accounting(ManifestPlatform):
    NAME, SUBNET, UP_TIMEOUT = NAME, SUBNET, (240, 300)

    def as_user(self, uid: int, *argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(self.box.exec(self.controller, ["setpriv", f"--reuid={uid}", f"--regid={uid}",
                                                              "--clear-groups", *argv]),
                              capture_output=True, text=True, timeout=60)

    def sacct(self, job: int) -> list[str]:
        proc = subprocess.run(self.box.exec(self.controller, [
            "sacct", "-n", "-X", "-P", "-j", str(job), "--format=JobID,User,Account,State,ExitCode,NodeList"]),
            capture_output=True, text=True, timeout=60)
        return proc.stdout.split()

    def condition(self, type_: str) -> tuple[str, str]:
        for c in (self.cluster().get("status") or {}).get("conditions") or []:
            if c["type"] == type_:
                return c["status"], c.get("message", "")
        return "Unknown", ""

    def claims(self) -> list[str]:
        return sorted(o["metadata"]["name"] for o in json.loads(self.kubectl("get", "pvc", "-o", "json").stdout)["items"])

    def submit_and_finish(self, uid: int) -> int:
        proc = self.as_user(uid, "sbatch", "--parsable", "-D", "/tmp", "-o", "/dev/null", "--wrap", "true")
        assert proc.returncode == 0, proc.stderr
        job = int(proc.stdout.strip().split(";")[0])
        wait_for(f"job {job} completed", lambda: self.job(job).get("JobState") == "COMPLETED", timeout=90,
                 show=lambda: self.job(job))
        return job

    def diagnose(self) -> str:
        return (f"\nstatus: {json.dumps((self.cluster().get('status') or {}).get('conditions'))}\n"
                f"operator log:\n{self.box.logs('operator', tail=30)}")


@pytest.fixture(scope="module")
def acct(tmp_path_factory, release):
    with Accounting.running(tmp_path_factory.mktemp("accounting"), release, MANIFEST) as p:
        yield p


JOBS: dict[str, int] = {}


def test_the_operator_runs_mariadb_and_slurmdbd_and_jobs_are_recorded(acct):
    wait_for("AccountingReady", lambda: acct.condition("AccountingReady")[0] == "True", timeout=180,
             show=acct.diagnose)
    assert DB_CLAIM in acct.claims()
    job = acct.submit_and_finish(2101)
    wait_for(f"sacct shows job {job}", lambda: any(line.startswith(f"{job}|alice|ml|COMPLETED|0:0|")
                                                   for line in acct.sacct(job)), timeout=60,
             show=lambda: acct.sacct(job))
    JOBS["alice"] = job


def test_a_pod_outside_the_cluster_reaches_neither_slurmd_the_agent_slurmdbd_nor_mariadb(acct):
    client, api = acct.box.api()
    core = client.CoreV1Api(api)
    ips = {p.metadata.labels["app.kubernetes.io/component"]: p.status.pod_ip
           for p in core.list_namespaced_pod("default", label_selector=f"app.kubernetes.io/instance={NAME}").items}
    state = acct.box.state()
    targets = {"slurmd": f"{ips['worker']}:6818", "slurmctld": f"{ips['controller']}:6817",
               "agent": f"{ips['controller']}:6830", "slurmdbd": f"{ips['slurmdbd']}:6819",
               "mariadb": f"{ips['database']}:3306",
               # what it does reach: the API server, on the node
               "node": f"{state.gateway}:{state.api_port}"}
    acct.kubectl("create", "namespace", "elsewhere")
    acct.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "outsider", "namespace": "elsewhere"},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "probe", "image": SERVE_IMAGE, "command": ["python3", "-c", PROBE, *targets.values()]}]}}))
    wait_for("the outsider's probe", lambda: core.read_namespaced_pod("outsider", "elsewhere").status.phase
             in ("Succeeded", "Failed"), timeout=90)
    out = dict(line.split() for line in acct.kubectl("logs", "-n", "elsewhere", "outsider").stdout.splitlines())
    assert {name: out[t] for name, t in targets.items()} == {
        "slurmd": "TimeoutError", "slurmctld": "TimeoutError", "agent": "TimeoutError",
        "slurmdbd": "TimeoutError", "mariadb": "TimeoutError", "node": "reached"}


def test_a_user_added_to_login_users_gets_an_association_and_can_submit(acct):
    spec = copy.deepcopy(MANIFEST["spec"])
    spec["login"]["users"].append({"name": "bob", "uid": 2102, "sshPublicKeys": [KEY]})
    acct.kubectl("patch", "slurmcluster", NAME, "--type", "merge", "-p", json.dumps({"spec": {"login": spec["login"]}}))
    def assoc() -> str:
        return subprocess.run(acct.box.exec(acct.controller, ["sacctmgr", "-n", "-P", "show", "assoc", "where",
                                                              "user=bob", "format=account,user"]),
                              capture_output=True, text=True, timeout=60).stdout
    wait_for("bob's association", lambda: "bob|bob" in assoc(), timeout=120, show=acct.diagnose)
    # slurmctld's pod learns bob's name from the users ConfigMap within its merge period.
    wait_for("bob can submit", lambda: acct.as_user(2102, "sbatch", "--test-only", "-D", "/tmp",
                                                    "--wrap", "true").returncode == 0, timeout=120,
             show=lambda: acct.as_user(2102, "sbatch", "--test-only", "--wrap", "true").stderr)
    job = acct.submit_and_finish(2102)
    wait_for(f"sacct shows bob's job {job}", lambda: any(line.startswith(f"{job}|bob|bob|COMPLETED")
                                                         for line in acct.sacct(job)), timeout=60)


def test_deleting_the_cluster_keeps_the_database_and_a_new_one_sees_the_old_jobs(acct):
    deleted = acct.kubectl("delete", "slurmcluster", NAME, "--timeout=180s")
    assert f'slurmcluster.slurmk8s.dev "{NAME}" deleted' in deleted.stdout
    wait_for("the MariaDB pod gone", lambda: f"{NAME}-mariadb-0" not in acct.kubectl(
        "get", "pods", "-o", "name").stdout, timeout=120)
    assert DB_CLAIM in acct.claims()
    up = acct.up(MANIFEST)
    assert up.returncode == 0, up.stderr
    wait_for("AccountingReady again", lambda: acct.condition("AccountingReady")[0] == "True", timeout=180,
             show=acct.diagnose)
    job = JOBS["alice"]
    wait_for(f"the old job {job} in sacct", lambda: any(line.startswith(f"{job}|alice|ml|COMPLETED")
                                                        for line in acct.sacct(job)), timeout=60,
             show=lambda: acct.sacct(job))
