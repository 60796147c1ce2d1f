"""End to end, the way a researcher works: SSH into the login pod, put unchanged
sbatch scripts on shared storage, and use plain sbatch/squeue/scancel/scontrol.

One sandbox (examples/slurmcluster.yaml) serves the whole module; the two slow
jobs (a checkpoint/requeue cycle and a time limit) are submitted first and
checked last, so they run while the other tests do. The cluster also reads
researchers from a site's directory (e2e/directory.py): a directory user logs
in and runs a job on every release, the rest of the directory's tests run on
the default one.

Over 500 lines because one sandbox serves all of a researcher's work here,
directory users included: a module of its own would start a second sandbox
per release, over a minute of the test command's time each.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from sandbox import Sandbox
from slurmk8s.api import load_cluster
from slurmk8s.serve import Follower
from slurmk8s.slurm.directory import GROUPS_FILE

from ..conftest import EXAMPLE, ROOT
from . import directory
from .common import assert_nothing_forbidden, wait_for
from .conftest import default_release_only
from .researcher import Researcher

pytestmark = pytest.mark.slurm
JOBS = Path(__file__).parent / "jobs"
SLURMK8S = str(Path(sys.executable).parent / "slurmk8s")
SUBNET = "10.253.77.0/24"  # apart from a sandbox someone runs by hand (10.253.0.0/24)


@pytest.fixture(scope="module")
def ldap(tmp_path_factory) -> tuple[directory.Directory, list[dict], Path]:
    """The site's directory (OpenLDAP, TLS from the site's own CA) and its objects; a work directory."""
    work = tmp_path_factory.mktemp("directory")
    d, docs = directory.make(work)
    return d, docs, work


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory, release, ldap):
    """The example cluster, which reads researchers from the site's directory as well
    (spec.identity.ldap: members of the group physics may log in, and the accounts physics
    and chemistry follow their groups)."""
    assert os.geteuid() == 0, "the sandbox needs root (namespaces, mounts, veths)"
    state = tmp_path_factory.mktemp("sandbox")
    env = {**os.environ, "SLURMK8S_SANDBOX_DIR": str(state)}
    d, directory_docs, work = ldap
    cluster = yaml.safe_load(EXAMPLE.read_text())
    docs = [cluster]
    # Researchers from the site's directory too, on every release (each has its own sssd image).
    cluster["spec"]["identity"] = directory.identity(["physics"])
    cluster["spec"]["accounting"]["accounts"] += directory.ACCOUNTS
    docs = directory_docs + directory.cluster_objects(d, cluster["metadata"]["namespace"]) + docs
    manifest = work / "cluster.yaml"
    manifest.write_text(yaml.safe_dump_all(docs))
    up = subprocess.run([SLURMK8S, "sandbox", "up", "-f", str(manifest), "--slurm-version", release,
                         "--subnet", SUBNET, "--timeout", "150"],
                        capture_output=True, text=True, env=env, timeout=210)
    box = Sandbox(state)
    try:
        assert up.returncode == 0, f"sandbox up failed:\n{up.stderr}"
        assert "all 3 Slurm nodes idle" in up.stderr  # progress output
        # Health checks every 10 s, for the faults' test: reconfigured while the tests before it run.
        box.kubectl("patch", "slurmcluster", "demo", "--type", "merge", "-p",
                    json.dumps({"spec": {"healthCheck": {"intervalSeconds": 10}}}))
        yield box, env
        assert_nothing_forbidden(box)
    finally:
        if up.returncode != 0 or os.environ.get("SLURMK8S_KEEP_LOGS"):
            for log in sorted((state / "pods").glob("*/containers/*/log")):
                print(f"--- {log.parent.parent.parent.name}/{log.parent.name}\n{log.read_text(errors='replace')[-3000:]}")
        down = subprocess.run([SLURMK8S, "sandbox", "down"], capture_output=True, text=True, env=env, timeout=120)
        assert down.returncode == 0, down.stderr


@pytest.fixture(scope="module")
def status(sandbox) -> dict:
    _, env = sandbox
    out = subprocess.run([SLURMK8S, "sandbox", "status", "-o", "json"], capture_output=True, text=True,
                         env=env, check=True)
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def researcher(status):
    login = status["login"]
    r = Researcher(login["host"], login["port"], login["user"], login["identityFile"],
                   str(Path(login["identityFile"]).parent / "known_hosts"))
    yield r
    r.close()


@pytest.fixture(scope="module")
def workdir(researcher, status) -> str:
    """The researcher's directory on shared storage, with every job script in it."""
    home = f"{status['sharedStorage']['mountPath']}/{researcher.user}"
    for script in sorted(JOBS.glob("*.sh")):
        researcher.put(script.read_text(), f"{home}/{script.name}")
    return home


#: The --export values of test_jobs_run_whatever_environment_they_export.
EXPORTS = ["NONE", "ALL,GREETING=hello", "GREETING=hello"]


@pytest.fixture(scope="module")
def slow_jobs(researcher, workdir) -> dict[str, int]:
    """Jobs submitted at the start, checked by later tests: those that take minutes, and
    those queued behind them on the CPU node (the export jobs), so no test waits for them alone."""
    return {
        "checkpoint": researcher.sbatch("checkpoint.sh", cwd=workdir),
        "time_limit": researcher.sbatch("time_limit.sh", cwd=workdir),
        **{f"export={e}": researcher.sbatch("single.sh", "--partition=cpu", f"--export={e}", cwd=workdir)
           for e in EXPORTS},
    }


def test_the_login_pods_slurm_is_the_release_the_cluster_asked_for(researcher, release):
    out = researcher.check("sinfo -V")  # e.g. "slurm-wlm 24.11.5"
    assert out.split()[-1].startswith(f"{release}."), out


def test_status_reports_pods_login_and_shared_storage(status, slow_jobs):
    cluster = load_cluster(yaml.safe_load(EXAMPLE.read_text()))
    expected = {f"demo-{ns.name}-{i}" for ns in cluster.spec.node_sets for i in range(ns.replicas)}
    assert set(status["slurmNodes"]) == expected
    assert all(p["phase"] == "Running" and p["ready"] for p in status["pods"]), status["pods"]
    login = status["login"]
    assert login["user"] == "researcher" and login["port"] == 22 and Path(login["identityFile"]).exists()
    assert status["sharedStorage"]["mountPath"] == "/shared"
    assert Path(status["sharedStorage"]["hostPath"]).is_dir()


def test_files_copied_to_shared_storage_belong_to_the_researcher(researcher, workdir, status):
    host = Path(status["sharedStorage"]["hostPath"]) / researcher.user / "single.sh"
    assert host.stat().st_uid == 2001
    assert researcher.check("id -u").strip() == "2001"


def test_single_node_job(researcher, workdir):
    job = researcher.sbatch("single.sh", "--partition=gpu", cwd=workdir)
    info = researcher.wait_state(job, {"COMPLETED", "FAILED"})
    assert info["JobState"] == "COMPLETED"
    out = researcher.read(f"{workdir}/single-{job}.out")
    assert re.search(rf"job {job} on demo-gpu-\d as researcher", out)


@pytest.mark.parametrize("export", EXPORTS)
def test_jobs_run_whatever_environment_they_export(researcher, workdir, slow_jobs, export):
    """--export=NONE or a list makes slurmd load the user's login environment
    (--get-user-env), which it does in namespaces from 23.11: the job still runs,
    and slurmd stays up."""
    job = slow_jobs[f"export={export}"]
    assert researcher.wait_state(job, {"COMPLETED", "FAILED"})["JobState"] == "COMPLETED"
    assert re.search(rf"job {job} on demo-cpu-0 as researcher", researcher.read(f"{workdir}/single-{job}.out"))


def test_two_node_job_runs_one_rank_per_node_with_a_master_address(researcher, workdir):
    job = researcher.sbatch("two_nodes.sh", cwd=workdir)
    assert researcher.wait_state(job, {"COMPLETED", "FAILED"})["JobState"] == "COMPLETED"
    out = researcher.read(f"{workdir}/two-nodes-{job}.out")
    # Every rank, on either node, gets the job's checkpoint directory from the TaskProlog.
    ranks = dict(re.findall(r"^rank=(\d) host=(\S+) master=\S+ world=2 ckpt=/shared/checkpoints/researcher/two-nodes$",
                            out, re.M))
    assert set(ranks) == {"0", "1"} and ranks["0"] != ranks["1"], out
    assert set(re.findall(r"master=(\S+)", out)) == {ranks["0"]}  # every rank finds rank 0's node


def test_job_array(researcher, workdir):
    job = researcher.sbatch("array.sh", "--partition=gpu", cwd=workdir)
    for task in range(4):
        text = researcher.wait_file(f"{workdir}/array-{job}_{task}.out", r"checkpoints in")
        # Each task of the array has a checkpoint directory of its own.
        assert text.splitlines() == [f"task {task} of array {job}",
                                     f"checkpoints in /shared/checkpoints/researcher/array_{task}"]


def test_afterok_dependency_chain(researcher, workdir):
    first = researcher.sbatch("chain_first.sh", "--partition=gpu", cwd=workdir)
    second = researcher.sbatch("chain_second.sh", "--partition=gpu", f"--dependency=afterok:{first}", cwd=workdir)
    assert researcher.job(second)["JobState"] == "PENDING"
    assert researcher.wait_state(second, {"COMPLETED", "FAILED"})["JobState"] == "COMPLETED"
    done = float(researcher.read(f"{workdir}/chain-first.done"))
    started = float(researcher.read(f"{workdir}/chain-second.started"))
    assert started > done


def test_two_gpu_jobs_share_a_node_with_disjoint_devices(researcher, workdir):
    jobs = [researcher.sbatch("gpus.sh", "--nodelist=demo-gpu-1", cwd=workdir) for _ in range(2)]
    devices = []
    for job in jobs:
        assert researcher.wait_state(job, {"COMPLETED", "FAILED"})["JobState"] == "COMPLETED"
        out = researcher.read(f"{workdir}/gpus-{job}.out")
        host, cvd = re.fullmatch(r"host=(\S+) CUDA_VISIBLE_DEVICES=(\S+)\n", out).groups()
        assert host == "demo-gpu-1"
        devices.append(set(cvd.split(",")))
    assert all(len(d) == 2 for d in devices)
    assert devices[0].isdisjoint(devices[1])
    assert devices[0] | devices[1] == {"0", "1", "2", "3"}


def test_two_4_gpu_workers_share_an_8_gpu_node_each_with_the_devices_it_was_given(sandbox, researcher, workdir):
    box, _ = sandbox
    pods = json.loads(box.kubectl("get", "pods", "-l", "slurmk8s.dev/nodeset=gpu", "-o", "json").stdout)["items"]
    assert len({p["spec"]["nodeName"] for p in pods}) == 1 and len(pods) == 2  # one 8-GPU node
    rc, sinfo, _ = researcher.run("sinfo -h -N -p gpu -o '%N %G'")
    assert sorted(line for line in sinfo.splitlines() if line) == ["demo-gpu-0 gpu:h100:4", "demo-gpu-1 gpu:h100:4"]
    seen = {}
    for host in ("demo-gpu-0", "demo-gpu-1"):
        job = researcher.sbatch("devices.sh", f"--nodelist={host}", cwd=workdir)
        assert researcher.wait_state(job, {"COMPLETED", "FAILED"})["JobState"] == "COMPLETED"
        out = researcher.read(f"{workdir}/devices-{job}.out")
        got, cvd, devices = re.fullmatch(r"host=(\S+) CUDA_VISIBLE_DEVICES=(\S+) devices=(\S+)\n", out).groups()
        assert got == host and cvd == "0,1,2,3"  # Slurm's numbering, as CUDA numbers the pod's devices
        seen[host] = set(devices.split(","))
    assert all(len(d) == 4 for d in seen.values())
    assert seen["demo-gpu-0"].isdisjoint(seen["demo-gpu-1"])
    assert seen["demo-gpu-0"] | seen["demo-gpu-1"] == {f"nvidia{i}" for i in range(8)}


def test_scancel_stops_a_running_job(researcher, workdir):
    job = researcher.sbatch("long.sh", "--partition=gpu", cwd=workdir)
    researcher.wait_file(f"{workdir}/long-{job}.out", "started")
    researcher.check(f"scancel {job}")
    assert researcher.wait_state(job, {"CANCELLED"}, timeout=60)["JobState"] == "CANCELLED"
    assert "should never" not in researcher.read(f"{workdir}/long-{job}.out")
    rc, out, _ = researcher.run(f"squeue -h -j {job} -t running")
    assert out.strip() == ""


def test_a_request_larger_than_any_node_is_refused_by_slurm(researcher, workdir):
    # Eight GPUs on one node: every node of the partition has four.
    rc, _, err = researcher.run(f"cd {workdir} && sbatch --partition=gpu --gpus-per-node=8 single.sh")
    assert rc != 0
    assert "Requested node configuration is not available" in err


def test_checkpoint_requeue_and_resume(researcher, workdir, slow_jobs, status):
    job = slow_jobs["checkpoint"]
    out = researcher.wait_file(f"{workdir}/ckpt-{job}.out", r"done step=\d+", timeout=240)
    # The TaskProlog's SLURMK8S_CHECKPOINT_DIR, the same before and after the requeue,
    # created for the researcher.
    ckpt = f"/shared/checkpoints/{researcher.user}/ckpt"
    assert re.findall(r"^start restart=\d step=\d+ dir=(\S+)$", out, re.M) == [ckpt, ckpt], out
    host = Path(status["sharedStorage"]["hostPath"]) / ckpt.removeprefix("/shared/")
    assert host.stat().st_uid == 2001
    first, saved, resumed, done = (
        re.search(r"start restart=0 step=0", out),
        re.search(r"checkpoint step=(\d+)", out),
        re.search(r"start restart=1 step=(\d+)", out),
        re.search(r"done step=(\d+)", out),
    )
    assert first and saved and resumed and done, out
    step = int(saved.group(1))
    assert step > 0
    assert int(resumed.group(1)) == step  # the step counter continues from the checkpoint
    assert int(done.group(1)) == step + 5
    assert researcher.read(f"/shared/checkpoints/{researcher.user}/ckpt/step").strip() == str(step)
    assert researcher.wait_state(job, {"COMPLETED"})["Restarts"] == "1"


@pytest.fixture(scope="module")
def trained(researcher, workdir, status) -> Path:
    """examples/train.sh run to the end on two GPU nodes; its model directory on the host."""
    researcher.put((ROOT / "examples/train.sh").read_text(), f"{workdir}/train.sh")
    job = researcher.sbatch("train.sh", "--export=ALL,TRAIN_STEPS=6", cwd=workdir)
    assert researcher.wait_state(job, {"COMPLETED", "FAILED"})["JobState"] == "COMPLETED"
    out = researcher.read(f"{workdir}/train-{job}.out")
    assert f"model version step-000006 in /shared/checkpoints/{researcher.user}/train" in out, out
    return Path(status["sharedStorage"]["hostPath"]) / "checkpoints" / researcher.user / "train"


def test_the_example_training_job_publishes_versions_a_server_loads(trained):
    follower = Follower(trained)
    assert follower.refresh(), follower.error
    assert (follower.model.version, follower.model.step) == ("step-000006", 6)


@default_release_only
def test_the_example_serving_deployment_serves_what_training_published(sandbox, trained):
    """examples/serving.yaml, less its GPU request (the slurmd pods hold every GPU
    of the sandbox), serves the model from the shared claim mounted read-only."""
    box, _ = sandbox
    docs = [d for d in yaml.safe_load_all((ROOT / "examples/serving.yaml").read_text()) if d]
    for d in docs:
        if d["kind"] == "Deployment":
            for section in d["spec"]["template"]["spec"]["containers"][0]["resources"].values():
                section.pop("nvidia.com/gpu")
    manifest = yaml.safe_dump_all(docs)
    applied = box.kubectl("apply", "-f", "-", input=manifest)
    assert applied.returncode == 0, applied.stderr
    try:
        def ready_ip():
            pods = json.loads(box.kubectl("get", "pods", "-l", "app.kubernetes.io/name=train-serve",
                                          "-o", "json").stdout)["items"]
            ready = [p for p in pods if any(c["type"] == "Ready" and c["status"] == "True"
                                            for c in p["status"].get("conditions", []))]
            return ready[0]["status"]["podIP"] if ready else None

        deadline = time.monotonic() + 60
        while (ip := ready_ip()) is None:
            assert time.monotonic() < deadline, box.kubectl("describe", "pods", "-l",
                                                            "app.kubernetes.io/name=train-serve").stdout
            time.sleep(1)
        with urllib.request.urlopen(f"http://{ip}:8080/", timeout=10) as r:
            body = json.load(r)
        assert body["version"] == "step-000006" and body["step"] == 6
        assert body["path"] == "/shared/checkpoints/researcher/train/step-000006"
    finally:
        box.kubectl("delete", "-f", "-", "--wait=false", input=manifest)


def test_time_limit_is_enforced(researcher, workdir, slow_jobs):
    job = slow_jobs["time_limit"]
    info = researcher.wait_state(job, {"TIMEOUT", "COMPLETED", "FAILED"}, timeout=180)
    assert info["JobState"] == "TIMEOUT"
    assert "should never" not in researcher.read(f"{workdir}/time-limit-{job}.out")


@default_release_only
def test_a_killed_api_server_or_kubelet_is_restarted_and_the_cluster_carries_on(sandbox, researcher, workdir):
    """As systemd restarts a node's kubelet: each control-plane process killed
    outright is started again by its supervisor; no pod restarts, and the
    researcher's next job runs."""
    box, env = sandbox
    client, api = box.api()
    core = client.CoreV1Api(api)

    def pods() -> dict[str, tuple]:
        return {p.metadata.name: (p.metadata.uid, sum(c.restart_count for c in p.status.container_statuses or []))
                for p in core.list_namespaced_pod("default", label_selector="app.kubernetes.io/instance=demo").items}

    before = pods()
    for process in ("apiserver", "kubelet"):
        old = wait_for(f"the {process} running", lambda: box.process_pid(process), timeout=30)  # noqa: B023 - called within this iteration
        os.kill(old, signal.SIGKILL)
        wait_for(f"the {process} to be started again", lambda: box.process_pid(process) not in (None, old), timeout=30)  # noqa: B023 - called within this iteration
    wait_for("the new kubelet's first round", lambda: box._kubelet_synced(box.state()))
    status = json.loads(subprocess.run([SLURMK8S, "sandbox", "status", "-o", "json"], capture_output=True,
                                       text=True, env=env, check=True).stdout)
    assert all(status["processes"][p]["restarts"] >= 1 for p in ("apiserver", "kubelet")), status["processes"]
    assert pods() == before  # the same pods, none restarted
    job = researcher.sbatch("single.sh", "--partition=gpu", cwd=workdir)
    assert researcher.wait_state(job, {"COMPLETED", "FAILED"})["JobState"] == "COMPLETED"


def _cluster(name: str, release: str, repository: str, secret: str, policy: str = "IfNotPresent") -> dict:
    """The smallest SlurmCluster: one CPU node, no login pod; its images from ``repository``."""
    return {"apiVersion": "slurmk8s.dev/v1alpha1", "kind": "SlurmCluster",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"slurm": {"version": release, "image": {"repository": repository, "pullPolicy": policy}},
                     "imagePullSecrets": [secret],
                     "nodeSets": [{"name": "cpu", "replicas": 1, "cpus": 1, "memory": "1Gi"}],
                     "partitions": [{"name": "cpu", "nodeSets": ["cpu"], "default": True}],
                     "login": {"replicas": 0}}}


@default_release_only
def test_a_cluster_pulls_from_a_registry_that_asks_for_credentials_as_the_install_guide_says(sandbox, release,
                                                                                            tmp_path):
    """docs/install.md, steps 2, 4 and 5, against the sandbox's registry (TLS, a password):
    push the release's images under a site prefix, make the pull Secret with kubectl, and a
    cluster naming them comes up; with a wrong password its status names the image and the
    registry's 401, and its pod is in ImagePullBackOff."""
    box, env = sandbox
    reg = box.registry()
    site = f"{reg.address}/site"
    push = subprocess.run([SLURMK8S, "images", "push", "--registry", site, "--release", release, "--authfile",
                           str(reg.write_authfile(tmp_path / "auth.json")), "--ca-file", str(reg.ca_cert)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert push.returncode == 0, push.stderr
    assert re.search(rf"^{re.escape(site)}/slurmctld:{release}@sha256:[0-9a-f]{{64}}$", push.stdout, re.M), push.stdout
    for name, password in (("regcred", reg.password), ("badcred", "not-the-password")):
        made = box.kubectl("create", "secret", "docker-registry", name, f"--docker-server={reg.address}",
                           f"--docker-username={reg.username}", f"--docker-password={password}")
        assert made.returncode == 0, made.stderr
    # Always: under IfNotPresent a node runs an image it already holds whatever the pod's
    # secret, as Kubernetes does (unless KubeletEnsureSecretPulledImages): "site" pulls the
    # same images.
    docs = [_cluster("site", release, site, "regcred"), _cluster("badpass", release, site, "badcred", "Always")]
    applied = box.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    assert applied.returncode == 0, applied.stderr

    def cluster(name: str) -> dict:
        return json.loads(box.kubectl("get", "slurmcluster", name, "-o", "json").stdout or "{}")

    def ready_message(name: str) -> str:
        conds = (cluster(name).get("status") or {}).get("conditions") or []
        return next((c.get("message", "") for c in conds if c["type"] == "Ready"), "")

    try:
        refused = wait_for("badpass's status to name the image it cannot pull",
                           lambda: "401 Unauthorized" in (m := ready_message("badpass")) and m, timeout=180,
                           show=lambda: ready_message("badpass"))
        assert f"cannot pull image {site}/slurmctld:{release}" in refused, refused
        pod = wait_for("badpass-controller-0 in ImagePullBackOff", lambda: (p := json.loads(
            box.kubectl("get", "pod", "badpass-controller-0", "-o", "json").stdout or "{}")) and any(
            ((cs.get("state") or {}).get("waiting") or {}).get("reason") == "ImagePullBackOff"
            for cs in (p.get("status") or {}).get("containerStatuses") or []) and p, timeout=120)
        assert pod["spec"]["imagePullSecrets"] == [{"name": "badcred"}]
        events = box.kubectl("get", "events", "--field-selector", "involvedObject.name=badpass-controller-0",
                             "-o", "json").stdout
        assert "401 Unauthorized" in events and "BackOff" in events
        wait_for("cluster site Ready", lambda: (cluster("site").get("status") or {}).get("phase") == "Ready",
                 timeout=300, show=lambda: ready_message("site"))
        ids = {cs["imageID"] for cs in json.loads(box.kubectl("get", "pod", "site-cpu-0", "-o", "json").stdout)[
            "status"]["containerStatuses"]}
        assert ids and all(i.startswith(f"{site}/slurmd@sha256:") for i in ids), ids
    finally:
        box.kubectl("delete", "slurmcluster", "site", "badpass", "--wait=false")
        box.kubectl("delete", "secret", "regcred", "badcred")


@default_release_only
def test_each_injected_fault_drains_its_node_with_the_checks_reason_and_it_comes_back(sandbox):
    """The health check (images/slurmd/healthcheck.sh, every 10 s here): a GPU
    device gone and the shared storage read-only each drain the node with
    `slurmk8s: health: <check>` and an Event on the SlurmCluster; once the
    fault is cleared the node takes jobs again. (The module's fixture set the
    interval.)"""
    box, env = sandbox

    def config(key: str) -> str:
        out = subprocess.run(box.exec("demo-controller-0", ["scontrol", "show", "config"]), capture_output=True,
                             text=True, timeout=60).stdout
        return next((line.split("=", 1)[1].strip() for line in out.splitlines()
                     if line.split("=", 1)[0].strip() == key), "")
    wait_for("slurmctld to run the checks every 10 s", lambda: config("HealthCheckInterval") == "10 sec",
             timeout=90, show=lambda: config("HealthCheckInterval"))
    worker = "demo-gpu-1"

    def node():
        return next(n for n in box.slurm().nodes() if n.name == worker)
    for kind, check in (("gpu", "gpus"), ("shared-readonly", "sharedStorage")):
        wait_for(f"{worker} healthy", lambda: not node().drain_set, timeout=60, show=lambda: node())
        fault = subprocess.run([SLURMK8S, "sandbox", "fault", kind, worker], capture_output=True, text=True,
                               env=env, timeout=60)
        assert fault.returncode == 0, fault.stderr
        t0 = time.monotonic()
        try:
            wait_for(f"{worker} drained by the {check} check", lambda: node().drain_set and node().reason.startswith(
                f"slurmk8s: health: {check}"), timeout=60, show=lambda: node())  # noqa: B023 - called within this iteration
            print(f"\n{kind} fault: drained after {time.monotonic() - t0:.1f}s")
            events = json.loads(box.kubectl("get", "events", "--field-selector",
                                            "involvedObject.name=demo,reason=NodeUnhealthy", "-o", "json").stdout)
            wait_for("the NodeUnhealthy Event", lambda: any(
                worker in e["message"] and check in e["message"] for e in json.loads(box.kubectl(  # noqa: B023 - called within this iteration
                    "get", "events", "--field-selector", "involvedObject.name=demo,reason=NodeUnhealthy",
                    "-o", "json").stdout)["items"]), timeout=30, show=lambda: events)  # noqa: B023 - called within this iteration
        finally:
            cleared = subprocess.run([SLURMK8S, "sandbox", "fault", kind, worker, "--clear"], capture_output=True,
                                     text=True, env=env, timeout=60)
            assert cleared.returncode == 0, cleared.stderr
        t0 = time.monotonic()
        wait_for(f"{worker} resumed", lambda: not node().drain_set, timeout=60, show=lambda: node())
        print(f"{kind} fault cleared: resumed after {time.monotonic() - t0:.1f}s")


# --- researchers from the site's directory (spec.identity.ldap) ------------------------------------

@pytest.fixture(scope="module")
def seeded(sandbox, ldap, status):
    """The directory as the site had it when the cluster came up (directory.make); its users' keys."""
    box, _ = sandbox
    wait_for("the directory's pod", lambda: "1/1" in box.kubectl("get", "pods", "-n", directory.NAMESPACE,
                                                                  "--no-headers").stdout, timeout=60)
    return ldap[0].keys


def _slurmctld(box, *argv: str) -> subprocess.CompletedProcess:
    return box.kubectl("exec", "-n", "default", "demo-controller-0", "-c", "slurmctld", "--", *argv)


def _associations(box, user: str) -> dict[str, str]:
    """account -> MaxSubmitJobs of the user's associations ("" no limit, "0" closed)."""
    proc = _slurmctld(box, "sacctmgr", "-n", "-P", "show", "assoc", f"user={user}", "format=account,maxsubmit")
    assert proc.returncode == 0, proc.stderr
    return dict(line.split("|")[:2] for line in proc.stdout.splitlines() if line.strip())


def _accounts_seen(box, user: str) -> str:
    """What the agent reads: the members the probe listed from the directory, and ``user``
    through sssd; and AccountingReady: why an association does not come."""
    seen = [box.kubectl("exec", "-n", "default", "demo-controller-0", "-c", "agent", "--", *argv)
            for argv in (("cat", GROUPS_FILE), ("getent", "passwd", user))]
    return "; ".join([*(f"{p.args[-2:]}: {p.returncode} {p.stdout.strip()}" for p in seen),
                      str(_condition(box, "AccountingReady"))])


def _default_account(box, user: str) -> str:
    return _slurmctld(box, "sacctmgr", "-n", "-P", "show", "user", user, "format=defaultaccount").stdout.strip()


def _as(box, user: str, script: str) -> subprocess.CompletedProcess:
    """``script`` as ``user`` in the login pod, whose sssd resolves them (as root there would)."""
    return box.kubectl("exec", "-n", "default", "deploy/demo-login", "-c", "login", "--",
                       "runuser", "-u", user, "--", "bash", "-c", script)


def _condition(box, kind: str) -> dict:
    """The SlurmCluster's condition of type ``kind``, {} while it has none."""
    obj = json.loads(box.kubectl("get", "slurmcluster", "demo", "-o", "json").stdout)
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == kind), {})


def _directory_ready(box) -> tuple[str, str, str]:
    cond = _condition(box, "DirectoryReady")
    return cond.get("status", ""), cond.get("reason", ""), cond.get("message", "")


def _wait_directory(box, status: str, reason: str) -> tuple[str, str, str]:
    return wait_for(f"DirectoryReady {status} ({reason})",
                    lambda: (c := _directory_ready(box))[:2] == (status, reason) and c,
                    timeout=90, every=2, show=lambda: _directory_ready(box))


def _events(box, reason: str) -> list[str]:
    out = box.kubectl("get", "events", "-n", "default", "-o", "json")
    return [e["message"] for e in json.loads(out.stdout)["items"] if e.get("reason") == reason]


def _directory_login(status, keys, work, user) -> Researcher:
    login = status["login"]
    return Researcher(login["host"], login["port"], user, str(keys[user][0]),
                      str(Path(login["identityFile"]).parent / "known_hosts"))


def _refused(status, keys, work, user) -> bool:
    import paramiko
    try:
        _directory_login(status, keys, work, user).close()
    except paramiko.AuthenticationException:
        return True
    return False


def test_a_directory_user_logs_in_with_the_key_in_ldap_and_runs_a_two_node_job_as_their_uid(
        sandbox, status, seeded, ldap, researcher):
    box, work = sandbox[0], ldap[2]
    t0 = time.monotonic()
    alice = wait_for("alice to log in with her key from the directory",
                     lambda: _try_login(status, seeded, work, "alice"), timeout=60)
    login_seconds = time.monotonic() - t0
    # Her association is the directory's: the account physics follows her group.
    wait_for("alice's association in physics", lambda: _associations(box, "alice").get("physics") == "", timeout=60)
    try:
        assert alice.check("id -u").strip() == "5001" and alice.check("id -gn").strip() == "physics"
        assert alice.check("pwd").strip() == "/home/alice"  # made at her first login, hers
        assert alice.check("stat -c %u:%a /home/alice").strip() == "5001:700"
        assert alice.exists("/shared/alice")  # her directory on shared storage, made at first login
        out = alice.check("cd /shared/alice && srun -p gpu -N2 --ntasks-per-node=1 bash -c 'echo $(hostname) $(id -u) $(id -un)'")
        lines = sorted(out.split("\n")[:-1])
        assert len(lines) == 2 and len({ln.split()[0] for ln in lines}) == 2, out
        assert all(ln.split()[1:] == ["5001", "alice"] for ln in lines), out
    finally:
        alice.close()
    print(f"alice, in the directory from the start, logged in {login_seconds:.1f}s after the cluster was up")
    # The spec's own login user still logs in beside the directory.
    assert researcher.check("id -u").strip() == "2001"


def _try_login(status, keys, work, user):
    import paramiko
    try:
        return _directory_login(status, keys, work, user)
    except (paramiko.AuthenticationException, paramiko.SSHException, OSError):
        return None


@default_release_only
def test_a_user_added_to_the_directory_submits_without_a_change_to_the_cluster(sandbox, status, seeded, ldap):
    box, _ = sandbox
    work = ldap[2]
    generation = json.loads(box.kubectl("get", "slurmcluster", "demo", "-o", "json").stdout)["metadata"]["generation"]
    t0 = time.monotonic()
    proc = directory.ldap_apply(box.kubectl, "ldapadd", directory.ldif_user("bob", 5002, 5000, seeded["bob"][1]))
    assert proc.returncode == 0, proc.stderr
    # The group physics listed him already; now that he is a user, the account physics holds him.
    wait_for("bob's association in physics", lambda: "physics" in _associations(box, "bob"), timeout=90, every=2,
             show=lambda: _accounts_seen(box, "bob"))
    associated = time.monotonic() - t0
    bob = wait_for("bob to log in", lambda: _try_login(status, seeded, work, "bob"), timeout=90)
    try:
        job = int(bob.check("cd /shared/bob && sbatch --parsable -o id.out --wrap 'id -un; id -u'").split(";")[0])
        bob.wait_state(job, {"COMPLETED"})
        assert bob.read("/shared/bob/id.out").split() == ["bob", "5002"]
        print(f"bob added to the directory: his association {associated:.1f}s later, his first job ran "
              f"{time.monotonic() - t0:.1f}s later")
    finally:
        bob.close()
    after = json.loads(box.kubectl("get", "slurmcluster", "demo", "-o", "json").stdout)["metadata"]["generation"]
    assert after == generation


@default_release_only
def test_with_the_directory_cut_off_cached_users_log_in_jobs_finish_and_the_status_says_so(
        sandbox, status, seeded, ldap):
    box, work = sandbox[0], ldap[2]
    _wait_directory(box, "True", "Reachable")
    t0 = time.monotonic()
    alice = _directory_login(status, seeded, work, "alice")
    up_login = time.monotonic() - t0
    looked_up = time.monotonic()
    try:
        job = int(alice.check("cd /shared/alice && sbatch --parsable -o cut.out --wrap 'sleep 20; id -un'")
                  .split(";")[0])
        alice.wait_state(job, {"RUNNING"})
    finally:
        alice.close()
    cut = box.kubectl("apply", "-f", "-", input=yaml.safe_dump(directory.isolated()))
    assert cut.returncode == 0, cut.stderr
    try:
        t0 = time.monotonic()
        down = _wait_directory(box, "False", "Unreachable")
        noticed = time.monotonic() - t0
        assert "from sssd's cache" in down[2]
        assert any("no connection" in m for m in _events(box, "DirectoryUnreachable"))
        # Her cached entry older than cacheSeconds (15 s): sssd must ask the directory, and finds it away.
        time.sleep(max(0.0, 16 - (time.monotonic() - looked_up)))
        t0 = time.monotonic()
        alice = _directory_login(status, seeded, work, "alice")
        cached_login = time.monotonic() - t0
        try:
            assert alice.check("id -u").strip() == "5001"
            try:  # its node's sssd knows her from the job's Prolog, before the cut
                alice.wait_state(job, {"COMPLETED"})
            except AssertionError as exc:
                raise AssertionError(f"{exc}; it printed: {alice.read('/shared/alice/cut.out')!r}") from None
            assert alice.read("/shared/alice/cut.out").strip() == "alice"
        finally:
            alice.close()
    finally:
        box.kubectl("delete", "networkpolicy", "-n", directory.NAMESPACE, "directory-down")
    _wait_directory(box, "True", "Reachable")
    assert _events(box, "DirectoryReachable")
    print(f"alice's login: {up_login:.1f}s with the directory up, {cached_login:.1f}s with it cut off "
          f"(sssd's cache); the status said so {noticed:.1f}s after the cut")


@default_release_only
def test_a_wrong_bind_password_or_ca_is_a_clear_condition_and_logins_go_on(sandbox, status, seeded, ldap):
    box, (d, _, work) = sandbox[0], ldap
    _wait_directory(box, "True", "Reachable")

    def patch(kind: str, name: str, data: dict) -> None:
        proc = box.kubectl("patch", kind, name, "-n", "default", "--type", "merge", "-p", json.dumps({"data": data}))
        assert proc.returncode == 0, proc.stderr

    right = directory.cluster_objects(d, "default")
    patch("secret", "ldap-bind", {"password": base64.b64encode(b"not-the-password").decode()})
    try:
        bind = _wait_directory(box, "False", "BindFailed")
        assert "bindPasswordSecret" in bind[2] and "not-the-password" not in bind[2]
        # sssd binds with the password it started with: nothing else breaks.
        _directory_login(status, seeded, work, "alice").close()
        patch("configmap", "ldap-ca", {"ca.crt": directory.other_ca(work)})
        tls = _wait_directory(box, "False", "TLSFailed")
        assert "spec.identity.ldap.ca" in tls[2]
        _directory_login(status, seeded, work, "alice").close()
    finally:
        patch("secret", "ldap-bind", right[1]["data"])
        patch("configmap", "ldap-ca", right[0]["data"])
    _wait_directory(box, "True", "Reachable")
    assert _events(box, "DirectoryBindFailed") and _events(box, "DirectoryTLSFailed")


@default_release_only
def test_a_group_change_moves_a_users_account_and_keeps_their_history(sandbox, seeded, ldap):
    box, _ = sandbox
    assert _associations(box, "bob") == {"physics": ""}  # from the group physics (the test before)
    t0 = time.monotonic()
    proc = directory.ldap_apply(box.kubectl, "ldapmodify", (
        f"dn: cn=physics,{directory.GROUPS}\nchangetype: modify\ndelete: memberUid\nmemberUid: bob\n\n"
        f"dn: cn=chemistry,{directory.GROUPS}\nchangetype: modify\nadd: memberUid\nmemberUid: bob\n"))
    assert proc.returncode == 0, proc.stderr
    wait_for("bob's account to move to chemistry",
             lambda: _associations(box, "bob") == {"physics": "0", "chemistry": ""}
             and _default_account(box, "bob") == "chemistry",
             timeout=90, every=2, show=lambda: (_associations(box, "bob"), _default_account(box, "bob")))
    refused = _as(box, "bob", "sbatch -A physics -D /shared/bob -o /dev/null --wrap true")
    assert refused.returncode != 0 and "policy" in refused.stderr, refused.stderr
    # slurmctld learns the new default from slurmdbd, a moment after sacctmgr shows it.
    submitted = wait_for("bob's job under his new default account", lambda: (
        p := _as(box, "bob", "sbatch --parsable -D /shared/bob -o /dev/null --wrap true")).returncode == 0 and p,
        timeout=30, every=1, show=lambda: _as(box, "bob", "sbatch -D /shared/bob -o /dev/null --wrap true").stderr)
    moved = time.monotonic() - t0
    job = submitted.stdout.strip().split(";")[0]
    assert "Account=chemistry" in _as(box, "bob", f"scontrol show job {job}").stdout
    # His first job, in physics, is still in his history.
    wait_for("bob's history in both accounts",
             lambda: {"physics", "chemistry"} <= set(_as(box, "bob", "sacct -n -X -P -o account").stdout.split()),
             timeout=30, every=1, show=lambda: _as(box, "bob", "sacct -n -X -P -o account").stdout)
    print(f"bob submitted under his new account {moved:.1f}s after his groups changed in the directory")


@default_release_only
def test_a_user_outside_the_login_groups_or_without_their_key_is_refused(sandbox, status, seeded, ldap):
    box, _ = sandbox
    work = ldap[2]
    # carol is in the directory, with a key, but in no group that may log in.
    assert _refused(status, seeded, work, "carol")
    # alice's key removed: refused once her cached entry is older than cacheSeconds (15 s here).
    assert _try_login(status, seeded, work, "alice") is not None
    proc = directory.ldap_apply(box.kubectl, "ldapmodify",
                                f"dn: uid=alice,{directory.PEOPLE}\nchangetype: modify\ndelete: sshPublicKey\n")
    assert proc.returncode == 0, proc.stderr
    wait_for("alice's removed key to be refused", lambda: _refused(status, seeded, work, "alice"), timeout=60,
             every=3)


@default_release_only
def test_after_down_and_up_the_login_pod_answers_as_soon_as_up_returns(sandbox, release, ldap):
    """`sandbox down` (keeping the objects) then `up`: the pods' Ready from
    before the restart is stale, so `up` must wait for the kubelet to probe
    them again. sshd answers the moment `up` returns. (Last in this module:
    the pods get new addresses.)"""
    box, env = sandbox
    down = subprocess.run([SLURMK8S, "sandbox", "down"], capture_output=True, text=True, env=env, timeout=180)
    assert down.returncode == 0, down.stderr
    up = subprocess.run([SLURMK8S, "sandbox", "up", "-f", str(ldap[2] / "cluster.yaml"), "--slurm-version", release,
                         "--subnet", SUBNET, "--timeout", "120"],
                        capture_output=True, text=True, env=env, timeout=180)
    assert up.returncode == 0, up.stderr
    answer = subprocess.run(box.ssh_argv(["sinfo", "-h", "-o", "%P"]), capture_output=True, text=True, timeout=30)
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.split() == ["cpu*", "gpu"]
