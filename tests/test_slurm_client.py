"""The Slurm facade against a real slurmctld and slurmd (Debian's 22.05)."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from slurmk8s.api import load_cluster
from slurmk8s.render import config_files, node_conf
from slurmk8s.slurm import DRAIN_PREFIX, NotOurDrain, SlurmClient, SlurmError
from slurmk8s.slurm import client as client_module

from .realslurm import SlurmNamespace, missing_tools


@pytest.fixture(scope="session")
def example_doc(host_example_doc):
    """This module's Slurm daemons are this host's packages (realslurm.py): the example on their release."""
    return host_example_doc


pytestmark = pytest.mark.slurm
NODE = "demo-cpu-0"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, example_doc, keys):
    assert os.geteuid() == 0 and not missing_tools(), "run hack/test.sh: it installs Slurm and runs as root"
    c = load_cluster(example_doc)
    work = tmp_path_factory.mktemp("slurm")
    with SlurmNamespace(config_files(c), keys, work, nodes=[(NODE, node_conf(c, c.spec.node_sets[0]))]) as ns:
        yield ns


@pytest.fixture
def client(cluster) -> SlurmClient:
    return SlurmClient(lambda argv, stdin: cluster.run(argv, input=stdin, check=False))


def wait_until(predicate, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def job_state(client, job_id):
    return next((j.state for j in client.jobs() if j.job_id == job_id), None)


def test_ping_and_nodes(client):
    assert client.ping()
    node = client.node(NODE)
    assert node is not None
    assert (node.state, node.bucket, node.cpus, node.partitions) == ("idle", "idle", 2, ("cpu",))
    assert "cpu" in node.features and "DYNAMIC_NORM" in node.flags
    assert client.node("demo-cpu-9") is None


def test_a_job_runs_is_signalled_requeued_and_resumes(client, cluster, tmp_path):
    marks = tmp_path / "marks"
    script = (
        "#!/bin/bash\n"
        f"trap 'echo USR1 >> {marks}' USR1\n"
        f"echo start >> {marks}\n"
        "for i in $(seq 600); do sleep 0.1; done\n"
    )
    job = client.submit(script, ["--job-name=ckpt", "--requeue", f"--output={tmp_path}/out.txt"])
    wait_until(lambda: job_state(client, job) == "RUNNING", what="job to run")
    assert [j.job_id for j in client.jobs(nodes=[NODE])] == [job]
    assert client.jobs(nodes=["demo-cpu-9"]) == []  # squeue --json ignores --nodelist: we filter
    assert client.node(NODE).busy

    client.signal(job, "USR1")
    wait_until(lambda: marks.exists() and "USR1" in marks.read_text(), what="USR1 in the batch shell")

    client.requeue(job)  # start_now: eligible again at once, not after ~2 minutes
    requeued = wait_until(lambda: next((j for j in client.jobs() if j.job_id == job and j.state == "RUNNING"
                                        and j.restart_count == 1), None), timeout=30, what="requeued job to run")
    assert requeued.requeue
    wait_until(lambda: marks.read_text().count("start") == 2, what="second start")
    client.cancel(job)
    wait_until(lambda: job_state(client, job) in (None, "CANCELLED", "COMPLETING"), what="cancel")


def test_a_requeued_job_is_made_eligible_a_second_after_it_left_completing(monkeypatch):
    """slurmd refuses to launch a job whose credential is of the very second it
    revoked the job's last one ("already killed, do not launch batch job"), and
    the job then fails: start_now waits a whole second after COMPLETING."""
    states = iter(["COMPLETING", "COMPLETING", "PENDING"])
    log: list[tuple[float, str]] = []
    clock = [0.0]
    monkeypatch.setattr(client_module.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    monkeypatch.setattr(client_module.time, "monotonic", lambda: clock[0])

    def runner(argv, stdin):
        log.append((clock[0], argv[0] if argv[0] != "scontrol" else " ".join(argv[:2])))
        if argv[0] == "squeue":
            return subprocess.CompletedProcess(argv, 0, json.dumps(
                {"jobs": [{"job_id": 7, "job_state": next(states), "nodes": "c-cpu-0"}]}), "")
        return subprocess.CompletedProcess(argv, 0, "", "")

    SlurmClient(runner).requeue(7)
    left = [t for t, what in log if what == "squeue"][-1]  # the read that found it PENDING
    [started] = [t for t, what in log if what == "scontrol update"]
    assert started - left + 1e-9 >= client_module.REISSUE_SECONDS >= 1.0, log
    assert [what for _, what in log][0] == "scontrol requeue"


def test_jobs_of_a_node_are_only_those_allocated_there():
    """``squeue --json`` prints every job whatever filter it is given; the
    facade keeps the jobs whose host list names the node. Draining one node
    for a scale-in must never see (and requeue) the jobs of another."""
    jobs = [{"job_id": 1, "job_state": "RUNNING", "nodes": "c-cpu-0"},
            {"job_id": 2, "job_state": "RUNNING", "nodes": "c-cpu-[1-2]"},
            {"job_id": 3, "job_state": "PENDING", "nodes": ""},
            {"job_id": 4, "job_state": "COMPLETING", "nodes": "c-cpu-2,c-gpu-0"}]
    calls = []

    def runner(argv, stdin):
        calls.append(list(argv))
        return subprocess.CompletedProcess(argv, 0, json.dumps({"jobs": jobs}), "")

    client = SlurmClient(runner)
    assert [j.job_id for j in client.jobs(nodes=["c-cpu-2"])] == [2, 4]
    assert [j.job_id for j in client.jobs(nodes=["c-cpu-0", "c-cpu-1"])] == [1, 2]
    assert client.jobs(nodes=["c-cpu-3"]) == []
    assert [j.job_id for j in client.jobs()] == [1, 2, 3, 4]
    client.signal_node_jobs("c-cpu-0", "USR1")  # only job 1 runs there
    assert [c for c in calls if c[0] != "squeue"] == [["scancel", "--signal=USR1", "--batch", "1"]]


def test_drains_are_prefixed_and_only_ours_are_cleared(client, cluster):
    client.drain(NODE, "scale-in")
    node = client.node(NODE)
    assert node.drain_set and node.drain_is_ours and node.reason == f"{DRAIN_PREFIX} scale-in"
    assert node.bucket == "drain"
    client.undrain(NODE)
    assert not client.node(NODE).drain_set

    cluster.run(["scontrol", "update", f"nodename={NODE}", "state=drain", "reason=bad DIMM"])
    with pytest.raises(NotOurDrain):
        client.undrain(NODE)
    assert client.node(NODE).reason == "bad DIMM"  # untouched
    cluster.run(["scontrol", "update", f"nodename={NODE}", "state=resume"])


def test_reconfigure_keeps_the_controller_up(client):
    client.reconfigure()
    assert client.ping()


def test_bad_names_never_reach_a_command(client):
    with pytest.raises(ValueError):
        client.drain("x state=resume", "r")
    with pytest.raises(ValueError):
        client.drain(NODE, "two\nlines")
    with pytest.raises(ValueError):
        client.signal(1, "USR1; reboot")


def test_failures_carry_slurms_message(client):
    with pytest.raises(SlurmError) as info:
        client.requeue(999999)
    assert "Invalid job id" in info.value.stderr


def test_delete_node_removes_the_record_and_is_idempotent(client):
    client.drain(NODE, "removing")
    client.delete_node(NODE)
    assert client.node(NODE) is None
    client.delete_node(NODE)  # already gone: fine
