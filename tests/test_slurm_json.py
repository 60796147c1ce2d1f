"""The Slurm facade's parsers over the real JSON of every supported release
(tests/fixtures/slurm-json/, captured from each release's daemons)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from slurmk8s import versions
from slurmk8s.slurm.client import SlurmClient
from slurmk8s.slurm.model import DRAIN_PREFIX, job_from_json, node_from_json, release_of

FIXTURES = Path(__file__).resolve().parent / "fixtures/slurm-json"
#: The file of each command's output.
FILES = {("sinfo", "--json"): "sinfo-drain.json", ("squeue", "--json"): "squeue.json",
         ("scontrol", "--json", "show", "nodes"): "scontrol-nodes.json"}


def load(version: str, name: str) -> dict:
    return json.loads((FIXTURES / version / name).read_text())


def test_every_supported_release_has_its_captured_output():
    assert sorted(p.name for p in FIXTURES.iterdir() if p.is_dir()) == sorted(versions.SUPPORTED)
    for version in versions.SUPPORTED:
        for name in ("squeue.json", "sinfo.json", "sinfo-drain.json"):
            assert release_of(load(version, name)) == version, (version, name)
        has_scontrol_json = (FIXTURES / version / "scontrol-nodes.json").exists()
        assert has_scontrol_json == ("scontrol" in versions.release(version).json_commands)


@pytest.mark.parametrize("version", versions.SUPPORTED)
def test_the_running_job_is_read_alike_on_every_release(version):
    [job] = [job_from_json(j) for j in load(version, "squeue.json")["jobs"]]
    assert (job.job_id, job.name, job.user, job.state, job.partition, job.nodes) == \
        (1, "sleeper", "root", "RUNNING", "cpu", "node-1")
    assert job.requeue is True and job.restart_count == 0 and job.active
    assert job.array_job_id is None and job.array_task_id is None
    assert job.reason == "None"


@pytest.mark.parametrize("version", versions.SUPPORTED)
def test_the_drained_node_is_read_alike_from_the_command_the_table_names(version):
    release = versions.release(version)
    data = load(version, FILES[release.nodes_command])
    [node] = [node_from_json(n) for n in data["nodes"]]
    assert (node.name, node.state, node.reason) == ("node-1", "allocated", f"{DRAIN_PREFIX} test drain")
    assert node.flags == {"DRAIN", release.dynamic_node_flag}
    assert node.drain_set and node.drain_is_ours and not node.drained and node.busy
    assert (node.features, node.partitions, node.cpus, node.alloc_cpus) == (("cpu",), ("cpu",), 1, 1)
    assert node.address == "10.99.0.1" and node.bucket == "drain"


@pytest.mark.parametrize("version", [v for v in versions.SUPPORTED
                                     if versions.release(v).nodes_command[0] != "sinfo"])
def test_sinfo_json_of_later_releases_has_no_node_records(version):
    """Why the table names another command: sinfo --json groups nodes by state."""
    data = load(version, "sinfo-drain.json")
    assert "nodes" not in data and data["sinfo"][0]["nodes"]["nodes"] == ["node-1"]


@pytest.mark.parametrize("version", versions.SUPPORTED)
def test_the_client_learns_the_release_and_reads_nodes_and_jobs(version):
    calls = []

    def runner(argv, stdin):
        calls.append(tuple(argv))
        name = "sinfo.json" if tuple(argv) == ("sinfo", "--json") and len(calls) == 1 else FILES[tuple(argv)]
        return subprocess.CompletedProcess(argv, 0, (FIXTURES / version / name).read_text(), "")

    client = SlurmClient(runner)
    [node] = client.nodes()
    assert node.name == "node-1" and node.drain_is_ours
    assert client.release() is versions.release(version)
    [job] = client.jobs(nodes=["node-1"])
    assert job.job_id == 1
    client.nodes()
    # The release is learnt once, from sinfo --json's meta.
    assert calls == [("sinfo", "--json"), versions.release(version).nodes_command, ("squeue", "--json"),
                     versions.release(version).nodes_command]


def test_an_unsupported_release_is_named():
    data = load("24.11", "sinfo.json")
    data["meta"]["slurm"]["version"].update(major="25", minor="11")
    assert release_of(data) == "25.11"
    with pytest.raises(KeyError, match="Slurm 25.11 is not supported"):
        versions.release(release_of(data))
    with pytest.raises(ValueError, match="no Slurm version"):
        release_of({"meta": {}})


@pytest.mark.parametrize("listed,word", [
    (["PENDING", "COMPLETING"], "COMPLETING"),   # 24.11, a requeued job whose processes still end
    (["PENDING"], "PENDING"),
    (["RUNNING", "SIGNALING"], "SIGNALING"),
    (["PENDING", "REQUEUED", "COMPLETING"], "COMPLETING"),
    ([], "UNKNOWN"),
])
def test_a_listed_job_state_means_what_the_one_word_of_22_05_means(listed, word):
    """The facade waits for a requeued job to leave COMPLETING before making it eligible
    (earlier, the new start time has no effect): the flag must not hide behind the base state."""
    job = job_from_json({"job_id": {"set": True, "infinite": False, "number": 7}, "job_state": listed})
    assert job.state == word
