"""A SlurmCluster's life with kubectl against the sandbox, real Slurm behind it:
conflicting edits, scaling out and in with a job on the node that goes (its
leading operator killed meanwhile, on the default release), the operator
killed in the middle of a change, a node drained with kubectl, a pod template
given to the workers, slurmctld's pod deleted (its jobs carry on), and deletion.

The tests share one sandbox and run in order; the last one deletes the cluster.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from sandbox import install, runcruntime, runtime
from slurmk8s import versions
from slurmk8s.api import load_cluster
from slurmk8s.render import ClusterKeys, names, render

from .common import assert_one_writer_at_a_time, audit_now, kill_leader, wait_for, writers
from .conftest import default_release_only
from .platform import ManifestPlatform

pytestmark = pytest.mark.slurm
SLURMK8S = str(Path(sys.executable).parent / "slurmk8s")
SUBNET = "10.253.94.0/24"
NAME = "life"
CONTROLLER = f"{NAME}-controller-0"
MANIFEST = {
    "apiVersion": "slurmk8s.dev/v1alpha1", "kind": "SlurmCluster", "metadata": {"name": NAME},
    "spec": {
        "nodeSets": [{"name": "cpu", "replicas": 2, "cpus": 1, "memory": "1Gi", "drain": {"gracePeriod": 5}}],
        "partitions": [{"name": "cpu", "nodeSets": ["cpu"], "default": True}],
    },
}


class Life(ManifestPlatform):
    NAME, SUBNET, UP_TIMEOUT = NAME, SUBNET, (150, 200)

    def run(self, *argv: str, pod: str = CONTROLLER) -> str:
        proc = subprocess.run(self.box.exec(pod, list(argv)), capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    def config(self, key: str) -> str:
        """A setting as slurmctld holds it (`scontrol show config`)."""
        for line in self.scontrol("show", "config").splitlines():
            k, _, v = line.partition("=")
            if k.strip() == key:
                return v.strip()
        raise AssertionError(f"{key} not in scontrol show config")

    def patch(self, spec: dict) -> None:
        self.kubectl("patch", "slurmcluster", NAME, "--type", "merge", "-p", json.dumps({"spec": spec}))

    def names(self, kind: str) -> list[str]:
        out = self.kubectl("get", kind, "-l", f"{names.CLUSTER_LABEL}={NAME}", "-o", "json").stdout
        return sorted(o["metadata"]["name"] for o in json.loads(out)["items"])

    def events(self) -> list[dict]:
        out = self.kubectl("get", "events", "--field-selector", f"involvedObject.name={NAME}", "-o", "json").stdout
        return json.loads(out)["items"]

    def slurm_nodes(self) -> dict[str, str]:
        """Slurm node -> state, as the operator sees them through the agent."""
        return {n.name: self.box._node_state(n) for n in self.box.slurm().nodes()}

    def settled(self, workers: list[str]) -> bool:
        """Ready at the current generation, and exactly ``workers`` in Slurm, all idle."""
        return self.ready() and self.slurm_nodes() == {w: "idle" for w in workers}

    def expected(self, kind: str, doc: dict) -> list[str]:
        """The names of ``kind`` the cluster should have: rendered, and for claims also those
        of the StatefulSets' volumeClaimTemplates (`<template>-<pod>`)."""
        objs = render(load_cluster(copy.deepcopy(doc)), ClusterKeys.generate())
        out = [o["metadata"]["name"] for o in objs if o["kind"] == kind]
        if kind == "PersistentVolumeClaim":
            out += [f"{t['metadata']['name']}-{o['metadata']['name']}-{i}" for o in objs if o["kind"] == "StatefulSet"
                    for t in o["spec"].get("volumeClaimTemplates", []) for i in range(o["spec"]["replicas"])]
        return sorted(out)

    def diagnose(self) -> str:
        """What a timed-out wait shows: pods, Slurm nodes, the status and the operator's last words."""
        status = self.cluster().get("status", {})
        return (f"\npods: {self.names('pods')}\nslurm: {self.slurm_nodes()}\n"
                f"status: {json.dumps(status.get('conditions'))}\n"
                f"operator log:\n{self.box.logs('operator', tail=40)}")

    def pod_processes(self) -> dict[int, str]:
        """Every process of every pod of the cluster (host PID -> its pid namespace), from the
        kubelet's records; not the operator's and bridge's, which outlive it."""
        spaces = set()
        for pod in self.box._local_pods().values():
            if pod["namespace"] == install.RELEASE_NAMESPACE:
                continue
            pid = runcruntime.container_pid(pod["holder"], self.box.pod_dir(pod["name"]))
            if pid:
                spaces.add(os.readlink(f"/proc/{pid}/ns/pid"))
        return {pid: ns for pid, ns in all_pid_namespaces().items() if ns in spaces}

    def wait_for_log(self, process: str, offset: int, needle: str, timeout: float = 60) -> str:
        """The first new line of ``process``'s log (from ``offset``) that holds ``needle``."""
        log = self.box.log_path(process)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(log, "rb") as f:
                f.seek(offset)
                for line in f.read().decode(errors="replace").splitlines():
                    if needle in line:
                        return line
            time.sleep(0.005)
        raise AssertionError(f"no {needle!r} in {log} within {timeout}s")


def all_pid_namespaces() -> dict[int, str]:
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                out[int(entry.name)] = os.readlink(entry / "ns" / "pid")
            except OSError:
                pass  # gone meanwhile
    return out


@pytest.fixture(scope="module")
def life(tmp_path_factory, release):
    with Life.running(tmp_path_factory.mktemp("operator-lifecycle"), release, MANIFEST) as p:
        yield p


@default_release_only
def test_of_two_edits_read_at_the_same_resource_version_the_second_conflicts(life):
    for _ in range(5):  # the operator may write in between: then read again
        seen = life.cluster()
        first, second = copy.deepcopy(seen), copy.deepcopy(seen)
        first["metadata"].setdefault("annotations", {})["example.com/owner"] = "first"
        second["metadata"].setdefault("annotations", {})["example.com/owner"] = "second"
        one = life.kubectl("replace", "-f", "-", input=json.dumps(first), check=False)
        if one.returncode == 0:
            break
        assert "the object has been modified" in one.stderr
    else:
        raise AssertionError(f"the first replace kept conflicting: {one.stderr}")
    two = life.kubectl("replace", "-f", "-", input=json.dumps(second), check=False)
    assert two.returncode != 0
    assert "the object has been modified; please apply your changes to the latest version and try again" \
        in two.stderr
    assert life.cluster()["metadata"]["annotations"]["example.com/owner"] == "first"

    # The same with the official client: 409 Conflict, nothing changed.
    client, api = life.box.api()
    custom = client.CustomObjectsApi(api)
    second["metadata"]["annotations"]["example.com/owner"] = "python"
    with pytest.raises(client.ApiException) as err:
        custom.replace_namespaced_custom_object("slurmk8s.dev", "v1alpha1", "default", "slurmclusters", NAME, second)
    assert err.value.status == 409
    assert json.loads(err.value.body)["reason"] == "Conflict"
    assert life.cluster()["metadata"]["annotations"]["example.com/owner"] == "first"


def test_scaling_2_3_1_requeues_the_job_on_the_node_that_goes(life, release):
    """On the default release the leading operator's pod is killed once the
    scale-in has drained its node: the standby finishes it, requeueing the job
    once, and the audit log shows one writer at a time."""
    cpu = [f"{NAME}-cpu-{i}" for i in range(3)]
    nodeset = MANIFEST["spec"]["nodeSets"][0]
    life.patch({"nodeSets": [{**nodeset, "replicas": 3}]})
    wait_for("three idle nodes", lambda: life.settled(cpu), timeout=90, show=life.diagnose)

    goes = life.sbatch("--requeue", "-w", cpu[2], "-J", "goes", "-o", "/dev/null", "--wrap", "sleep 600")
    stays = life.sbatch("--requeue", "-w", cpu[0], "-J", "stays", "-o", "/dev/null", "--wrap", "sleep 600")
    try:
        wait_for("both jobs to run", lambda: life.job(goes)["JobState"] == life.job(stays)["JobState"] == "RUNNING")
        life.patch({"nodeSets": [{**nodeset, "replicas": 1}]})

        # Drained first: the job is not killed; it runs out its grace period, then is requeued.
        wait_for("the node drained", lambda: "drain" in life.slurm_nodes().get(cpu[2], "drain"))
        killed = None
        if release == versions.DEFAULT:  # leader election is the same on every release
            since = audit_now(life.box)
            killed, took = kill_leader(life.box, life.kubectl, "operator")
            assert took <= 15 + 2 + 5, took  # the lease, a retry, and the sandbox's slack
        # Its node is gone and the one that stays is busy: it waits in the queue.
        wait_for("the job requeued", lambda: (life.job(goes)["JobState"], life.job(goes)["Restarts"]) == (
            "PENDING", "1"), timeout=60, show=life.diagnose)
        assert life.job(goes)["Requeue"] == "1"
        wait_for("the JobsRequeued Event", lambda: any(
            e["reason"] == "JobsRequeued" and str(goes) in e["message"] for e in life.events()), timeout=30,
            show=lambda: [(e["reason"], e["message"]) for e in life.events()])

        login = [p for p in life.names("pods") if p.startswith(f"{NAME}-login-")]
        wait_for("the pods of nodes 1 and 2 gone", lambda: life.names("pods") == sorted(
            [CONTROLLER, cpu[0], *login]), timeout=90, show=life.diagnose)
        wait_for("their Slurm records gone", lambda: set(life.slurm_nodes()) == {cpu[0]}, timeout=90,
                 show=life.diagnose)
        # The job on the node that stays was never touched.
        kept = life.job(stays)
        assert (kept["JobState"], kept["Restarts"], kept["NodeList"]) == ("RUNNING", "0", cpu[0]), kept
        assert life.job(goes)["Restarts"] == "1"
        # Nothing applied twice: one requeue of the job, reported once.
        requeues = [e for e in life.events() if e["reason"] == "JobsRequeued" and str(goes) in e["message"]]
        assert len(requeues) == 1 and requeues[0].get("count", 1) == 1, requeues
        if killed:
            # One writer at a time: the killed leader's writes, then the new leader's, never again the old.
            assert_one_writer_at_a_time(life.box, "slurmk8s", since, killed)
            assert writers(life.box, "slurmk8s", since)[-1] == life.box.leader_pod("operator")  # it finished
    finally:
        life.run("scancel", str(goes), str(stays))
    wait_for("the jobs cancelled", lambda: life.job(goes)["JobState"] == life.job(stays)["JobState"] == "CANCELLED",
             timeout=60)
    wait_for("the node that stays idle, the cluster Ready", lambda: life.settled([cpu[0]]), timeout=60,
             show=life.diagnose)


#: A job that checkpoints on the drain's signal: it notes it in its comment, which outlives the requeue.
CHECKPOINTING = """#!/bin/bash
trap 'scontrol update jobid=$SLURM_JOB_ID comment=checkpointed-on-USR1' USR1
while true; do sleep 1; done
"""


@default_release_only
def test_kubectl_drain_of_a_busy_workers_node_waits_for_slurm_then_completes_and_uncordon_brings_it_back(life):
    """kubectl drain: the busy-worker budget refuses the eviction (429) while the
    job runs; the operator drains the Slurm node ('k8s: cordoned'), signals the
    job, waits the grace period and requeues it; the eviction then passes and
    the drain completes within the documented bound (docs/operations.md). After
    uncordon the worker comes back and the job runs again."""
    worker = f"{NAME}-cpu-0"
    nodeset = {**MANIFEST["spec"]["nodeSets"][0], "replicas": 1}
    grace = nodeset["drain"]["gracePeriod"]
    # The checkpoint signal (not in the pod template: nothing restarts).
    life.patch({"nodeSets": [{**nodeset, "drain": {"gracePeriod": grace, "signal": "USR1"}}]})
    node = json.loads(life.kubectl("get", "pod", worker, "-o", "json").stdout)["spec"]["nodeName"]
    # Not pinned with -w: a required node that leaves Slurm makes a job BadConstraints.
    job = int(life.kubectl("exec", "-i", CONTROLLER, "-c", "slurmctld", "--", "sbatch", "--parsable", "--requeue",
                           "-o", "/dev/null", input=CHECKPOINTING).stdout.strip())
    try:
        wait_for("the job to run", lambda: life.job(job)["JobState"] == "RUNNING", timeout=60)
        wait_for("the busy label", lambda: json.loads(life.kubectl("get", "pod", worker, "-o", "json").stdout)[
            "metadata"]["labels"].get(names.BUSY_LABEL) == "true", timeout=30)
        interval = 3  # the sandbox's operator --interval
        kill_wait = 30  # Slurm's default KillWait
        bound = grace + kill_wait + 2 * interval + 5 + 30  # docs/operations.md: the drain bound, + pod shutdown
        t0 = time.monotonic()
        drain = subprocess.Popen(life.box.kubectl_argv(
            "drain", node, "--pod-selector", f"app.kubernetes.io/instance={NAME},app.kubernetes.io/component=worker",
            "--delete-emptydir-data", "--ignore-daemonsets", f"--timeout={bound * 2}s"),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wait_for("kubectl drain to end", lambda: drain.poll() is not None, timeout=bound * 2, every=0.5,
                 show=lambda: (life.slurm_nodes(), life.job(job), life.diagnose()))
        took = time.monotonic() - t0
        out = drain.stdout.read()
        print(f"\nkubectl drain of a busy worker's node: {took:.1f}s (bound {bound}s)")
        assert drain.returncode == 0, out
        assert "error when evicting pods" in out and "Cannot evict pod" in out  # the budget held it while busy
        assert f"pod/{worker} evicted" in out, out
        assert took <= bound, (took, bound)
        record = life.job(job)
        assert (record["Restarts"], record["Comment"]) == ("1", "checkpointed-on-USR1"), record
        messages = [e["message"] for e in life.events() if e["reason"] == "Draining"]
        assert any(worker in m and "k8s: cordoned" in m for m in messages), messages
        # The evicted worker cannot come back to the cordoned node: Pending, the job waits.
        assert life.job(job)["JobState"] == "PENDING"
    finally:
        life.kubectl("uncordon", node)
    wait_for("the worker back and the job running again", lambda: life.job(job)["JobState"] == "RUNNING",
             timeout=120, show=life.diagnose)
    life.run("scancel", str(job))
    wait_for("the node idle, the cluster Ready", lambda: life.settled([worker]), timeout=60, show=life.diagnose)


GROWN = copy.deepcopy(MANIFEST)
GROWN["spec"]["nodeSets"] = [{**MANIFEST["spec"]["nodeSets"][0], "replicas": 1},
                             {"name": "extra", "replicas": 1, "cpus": 1, "memory": "1Gi", "drain": {"gracePeriod": 5}}]
GROWN["spec"]["partitions"] = [{"name": "cpu", "nodeSets": ["cpu", "extra"], "default": True}]
MANAGED = {"ConfigMap": "configmaps", "Secret": "secrets", "PersistentVolumeClaim": "persistentvolumeclaims",
           "Service": "services", "StatefulSet": "statefulsets", "Deployment": "deployments",
           "PodDisruptionBudget": "poddisruptionbudgets"}


@default_release_only
def test_an_operator_killed_mid_change_converges_without_duplicates(life):
    pod, pid = life.box.component_pod("operator"), life.box.component_pid("operator")
    restarts = life.box.status()["components"]["operator"]["restarts"]
    offset = life.box.log_path("operator").stat().st_size
    path = life.work / "grown.yaml"
    path.write_text(yaml.safe_dump(GROWN))
    life.kubectl("apply", "-f", str(path))
    # The round writes its creates, then its updates; it dies at the first update.
    life.wait_for_log("operator", offset, "updated")
    os.kill(pid, signal.SIGKILL)
    wait_for("the operator gone", lambda: not runtime.alive(pid), timeout=10)
    # The kubelet restarts the pod and keeps the killed instance's log apart (kubectl logs --previous).
    wait_for("the operator restarted", lambda: life.box.status()["components"]["operator"]["restarts"] > restarts,
             timeout=30)
    previous = life.kubectl("-n", install.RELEASE_NAMESPACE, "logs", "--previous", pod).stdout
    log = previous.encode()[offset:].decode(errors="replace")
    assert "Handler 'reconcile-update/spec' succeeded" not in log, f"the round finished before the kill:\n{log}"

    up = life.up(GROWN)  # finds the operator running again
    assert up.returncode == 0, up.stderr
    assert life.box.component_pid("operator") != pid
    workers = [f"{NAME}-cpu-0", f"{NAME}-extra-0"]
    wait_for("the grown cluster settled", lambda: life.settled(workers), timeout=60, show=life.diagnose)
    for kind, plural in MANAGED.items():
        assert life.names(plural) == life.expected(kind, GROWN), kind
    login = [p for p in life.names("pods") if p.startswith(f"{NAME}-login-")]
    assert len(login) == 1 and len(life.names("replicasets")) == 1
    assert life.names("pods") == sorted([CONTROLLER, *workers, *login])
    assert "cpu" in life.scontrol("show", "node", workers[1])  # the partition took the new node set


def test_a_kill_wait_change_is_reconfigured_and_restarts_no_worker(life):
    """killWait sets the workers' termination grace period too; the running
    workers keep theirs (the restart hash leaves it out) and are not restarted."""
    uids = lambda: {p: json.loads(life.kubectl("get", "pod", p, "-o", "json").stdout)["metadata"]["uid"]  # noqa: E731 - a one-line accessor
                    for p in life.names("pods")}
    before, pid = uids(), life.ctld_pid()
    workers = sorted(life.slurm_nodes())  # whichever node sets the tests before this one left
    seen = {e["metadata"]["name"] for e in life.events()}
    grace = lambda: json.loads(life.kubectl("get", "statefulset", f"{NAME}-cpu", "-o", "json").stdout)[  # noqa: E731 - a one-line accessor
        "spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    grace_before = grace()
    life.patch({"slurmConfig": {"killWait": 45}})
    wait_for("slurmctld to read KillWait=45", lambda: life.config("KillWait") == "45 sec", timeout=90)
    assert grace() - grace_before == 45 - 30
    wait_for("the cluster Ready", life.ready, timeout=30)
    time.sleep(7)  # two more rounds of the operator (every 3s) would start a rolling update
    assert uids() == before and life.ctld_pid() == pid
    assert not {"Draining", "Restarting"} & {e["reason"] for e in life.events() if e["metadata"]["name"] not in seen}
    assert life.settled(workers)


def test_a_pod_template_restarts_the_workers_drained_into_its_shape(life):
    """A node set's podTemplate (decision record 48): the operator restarts each worker,
    drained first, and each comes back with the template's label, annotation and scratch
    volume, where a job writes."""
    workers = sorted(life.slurm_nodes())  # whichever node sets the tests before this one left

    def pods() -> dict[str, dict]:
        out = life.kubectl("get", "pods", "-l", names.NODESET_LABEL, "-o", "json").stdout
        return {p["metadata"]["name"]: p for p in json.loads(out)["items"]}

    before = {name: p["metadata"]["uid"] for name, p in pods().items()}
    assert sorted(before) == workers
    seen = {e["metadata"]["name"] for e in life.events()}
    template = {"labels": {"example.com/shaped": "yes"}, "annotations": {"example.com/note": "shaped"},
                "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "64Mi"}}],
                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}
    life.patch({"nodeSets": [{**ns, "podTemplate": template} for ns in life.cluster()["spec"]["nodeSets"]]})

    def shaped() -> bool:
        now = pods()
        return (set(now) == set(before) and life.settled(workers)
                and all(p["metadata"]["uid"] != before[name] and p["status"].get("phase") == "Running"
                        and p["metadata"]["labels"].get("example.com/shaped") == "yes"
                        and p["metadata"]["annotations"].get("example.com/note") == "shaped"
                        for name, p in now.items()))

    wait_for("every worker restarted with the template", shaped, timeout=300, show=life.diagnose)
    reasons = [e["reason"] for e in life.events() if e["metadata"]["name"] not in seen]
    assert "Restarting" in reasons and "Draining" in reasons, reasons
    job = life.sbatch("-N", "1", "-w", workers[0], "-o", "/dev/null", "--wrap", "echo ok > /scratch/ok")
    wait_for("the job to complete", lambda: life.job(job)["JobState"] == "COMPLETED", timeout=90)
    assert life.run("cat", "/scratch/ok", pod=workers[0]).strip() == "ok"


@default_release_only
def test_the_controller_pod_deleted_comes_back_with_its_state_and_jobs_carry_on(life):
    """slurmctld's pod deleted: the StatefulSet makes it again with the state
    claim; the running job keeps running (same id, not restarted) and a
    queued one starts after it. The gap is measured (the sandbox has one
    CPU node, so the pod comes back on the same one)."""
    workers = sorted(life.slurm_nodes())
    assert len(workers) == 2, workers

    def job(j: int) -> dict[str, str] | None:
        try:
            return life.job(j)
        except (AssertionError, KeyError, runtime.SandboxError, subprocess.SubprocessError):
            return None  # slurmctld (or its pod) away
    running = life.sbatch("-w", workers[0], "-o", "/dev/null", "--wrap", "sleep 600")
    wait_for("the first job running", lambda: (job(running) or {}).get("JobState") == "RUNNING", timeout=60)
    queued = life.sbatch("-w", workers[1], "--begin=now+5", "-o", "/dev/null", "--wrap", "sleep 600")
    assert life.job(queued)["JobState"] == "PENDING"
    uid = json.loads(life.kubectl("get", "pod", CONTROLLER, "-o", "json").stdout)["metadata"]["uid"]
    t0 = time.monotonic()
    life.kubectl("delete", "pod", CONTROLLER, "--wait=false")

    def answering() -> bool:
        pod = json.loads(life.kubectl("get", "pod", CONTROLLER, "-o", "json", check=False).stdout or "{}")
        if (pod.get("metadata") or {}).get("uid") in (None, uid):
            return False
        try:
            proc = subprocess.run(life.box.exec(CONTROLLER, ["scontrol", "ping"]), capture_output=True, text=True,
                                  timeout=30)
        except (KeyError, runtime.SandboxError):
            return False  # the new pod's container not running yet
        return proc.returncode == 0 and "UP" in proc.stdout
    wait_for("a new controller pod whose slurmctld answers", answering, timeout=180, every=0.5,
             show=life.diagnose)
    answered = time.monotonic() - t0
    wait_for("the queued job running", lambda: (job(queued) or {}).get("JobState") == "RUNNING", timeout=120,
             show=lambda: job(queued))
    started = time.monotonic() - t0
    print(f"\ncontroller pod deleted: slurmctld answered after {answered:.1f}s, the queued job ran after "
          f"{started:.1f}s")
    kept = life.job(running)
    assert (kept["JobState"], kept["Restarts"], kept["NodeList"]) == ("RUNNING", "0", workers[0]), kept
    life.run("scancel", str(running), str(queued))
    wait_for("the nodes idle, the cluster Ready", lambda: life.settled(workers), timeout=90, show=life.diagnose)


@default_release_only  # the operator's teardown of Kubernetes objects: no Slurm release changes it
def test_deleting_the_cluster_leaves_only_its_state_claim(life):
    assert life.kubectl("get", "slurmcluster", NAME, "-o", "name").stdout.strip() == f"slurmcluster.slurmk8s.dev/{NAME}"
    claims = life.expected("PersistentVolumeClaim", GROWN)
    assert claims and life.names("persistentvolumeclaims") == claims
    processes = life.pod_processes()
    assert len(processes) > 5  # slurmctld, slurmd, munged, sshd... in their pods

    deleted = life.kubectl("delete", "slurmcluster", NAME, "--timeout=150s")
    assert f'slurmcluster.slurmk8s.dev "{NAME}" deleted' in deleted.stdout
    gone = life.kubectl("get", "slurmcluster", NAME, check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr

    # The controller and login pods end gracefully after their owners are gone.
    left = lambda: sorted(life.kubectl("get", "all,cm,secret,pvc", "-o", "name").stdout.split())  # noqa: E731 - a one-line accessor
    # (and, in default, the API server's own Service)
    wait_for("nothing left but the namespace's CA and the claims", lambda: left() == sorted(
        ["configmap/kube-root-ca.crt", "service/kubernetes", *(f"persistentvolumeclaim/{c}" for c in claims)]),
        timeout=60, show=left)
    wait_for("the teardown's Event", lambda: any(e["reason"] == "Deleted" for e in life.events()), timeout=30,
             show=lambda: [(e["reason"], e["message"]) for e in life.events()])
    wait_for("every process of the cluster's pods gone", lambda: not any(
        all_pid_namespaces().get(pid) == ns for pid, ns in processes.items()), timeout=30)
    state = life.box.dir / "storage" / "claims" / "default"
    assert all(any((state / c).iterdir()) for c in claims)  # the retained claims keep their data
