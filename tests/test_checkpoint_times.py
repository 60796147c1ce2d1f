"""When a running job last wrote its checkpoint (slurmk8s/slurm/checkpoints.py), as
the agent's facade reads it for the bridge's reclaim order: the newest modification
of the job's checkpoint directory and its entries, never through a link, and "not
known" for anything amiss. The directory's name is the TaskProlog's
(tests/test_render.py holds the two rules to the same cases)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from slurmk8s.slurm import SlurmClient, checkpoints
from slurmk8s.slurm.checkpoints import job_dir, last_write, user_dir


def _dir(root, *parts, mtime):
    d = root.joinpath(*parts)
    d.mkdir(parents=True)
    os.utime(d, (mtime, mtime))
    return d


def test_the_newest_write_of_the_directory_or_an_entry_counts(tmp_path):
    d = _dir(tmp_path, "alice", "train", mtime=1000)
    assert last_write(str(tmp_path), ("alice", "train")) == 1000
    (d / "step-1").mkdir()
    os.utime(d / "step-1", (1500, 1500))
    (d / "ckpt.pt").write_text("weights")
    os.utime(d / "ckpt.pt", (2500, 2500))  # overwritten in place: only the file's time moves
    os.utime(d, (1200, 1200))
    assert last_write(str(tmp_path), ("alice", "train")) == 2500


def test_no_link_is_followed_and_anything_amiss_is_not_known(tmp_path):
    elsewhere = _dir(tmp_path, "elsewhere", mtime=9000)
    (elsewhere / "new").write_text("x")
    os.utime(elsewhere / "new", (9999, 9999))
    _dir(tmp_path, "root", "alice", mtime=100)
    (tmp_path / "root" / "alice" / "link").symlink_to(elsewhere)
    (tmp_path / "root" / "mallory").symlink_to(tmp_path / "root" / "alice")
    root = str(tmp_path / "root")
    assert last_write(root, ("alice", "link")) is None  # the job's directory is a link
    assert last_write(root, ("mallory", "alice")) is None  # the user's directory is a link
    d = _dir(tmp_path, "root", "alice", "train", mtime=100)
    (d / "to-elsewhere").symlink_to(elsewhere / "new")  # an entry that is a link: its target's time is not read
    os.utime(d, (100, 100))
    assert last_write(root, ("alice", "train")) == 100
    assert last_write(root, ("alice", "missing")) is None
    (d / "file").write_text("x")
    assert last_write(root, ("alice", "train", "file")) is None  # not a directory
    for bad in ((), ("alice", ".."), ("alice/train",), ("",)):
        assert last_write(root, bad) is None, bad


def test_a_directory_with_very_many_entries_is_judged_on_some(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoints, "MAX_ENTRIES", 3)
    d = _dir(tmp_path, "alice", "sweep", mtime=100)
    for i in range(10):
        (d / f"f{i}").write_text("x")
        os.utime(d / f"f{i}", (200 + i, 200 + i))
    os.utime(d, (100, 100))
    assert 200 <= last_write(str(tmp_path), ("alice", "sweep")) <= 209


@pytest.mark.root
def test_the_facade_gives_running_jobs_their_last_checkpoint(tmp_path):
    """By the job's uid: the agent may not know the user's name (squeue then reports none)."""
    _dir(tmp_path, "alice", "train", mtime=5000)
    _dir(tmp_path, "alice", "sweep_3", mtime=6000)
    _dir(tmp_path, "alice", "queued", mtime=7000)
    bob = _dir(tmp_path, "bob", "train", mtime=8000)
    os.chown(bob, 4242, 4242)
    os.chown(bob.parent, 4242, 4242)
    uid = os.getuid()

    def job(i, state, name, user="alice", user_id=uid, **more):
        return {"job_id": i, "job_state": state, "name": name, "user_name": user, "user_id": user_id,
                "nodes": "n1" if state == "RUNNING" else "", **more}

    jobs = [job(1, "RUNNING", "train"), job(2, "RUNNING", "sweep", array_task_id=3, array_job_id=9),
            job(3, "PENDING", "queued"), job(4, "RUNNING", "fresh"),
            job(5, "RUNNING", "train", user=""),  # a user the agent cannot name: found by uid
            job(6, "RUNNING", "train", user="bob"),  # named bob, but of this uid: its own directory
            job(7, "RUNNING", "train", user="bob", user_id=4242), job(8, "RUNNING", "train", user_id=None)]

    def runner(argv, stdin):
        return subprocess.CompletedProcess(argv, 0, json.dumps({"jobs": jobs}), "")

    client = SlurmClient(runner, checkpoint_root=str(tmp_path))
    found = {j.job_id: j.checkpoint_time for j in client.jobs(checkpoints=True)}
    assert found == {1: 5000, 2: 6000, 3: None, 4: None, 5: 5000, 6: 5000, 7: 8000, 8: None}
    # Only when asked (the bridge): the metrics and the facade's own waits read no directory.
    assert {j.checkpoint_time for j in client.jobs()} == {None}
    # Without a checkpoint root (a cluster without spec.sharedStorage.checkpointDir), none is known.
    assert {j.checkpoint_time for j in SlurmClient(runner).jobs(checkpoints=True)} == {None}
    assert job_dir("alice", "sweep", 3) == ("alice", "sweep_3")


def test_a_uid_that_owns_two_user_directories_is_matched_by_name_or_not_at_all():
    owners = {1000: ["alice", "alice-old"], 1001: ["bob"]}
    assert user_dir(owners, 1000, "alice") == "alice"
    assert user_dir(owners, 1000, "") is None
    assert user_dir(owners, 1001, "") == "bob" and user_dir(owners, 1001, "alice") == "bob"
    assert user_dir(owners, 1002, "carol") is None and user_dir(owners, None, "bob") is None


def test_the_agent_reads_checkpoint_times_only_when_the_request_asks():
    """``GET /v1/jobs?checkpoints=1`` (what RemoteSlurm.jobs(checkpoints=True) sends) and nothing else."""
    from slurmk8s.slurm.agent import _get_jobs

    asked = []

    class Slurm:
        def jobs(self, nodes=(), checkpoints=False):
            asked.append((list(nodes), checkpoints))
            return []

    _get_jobs(Slurm(), {"node": ["n1"], "checkpoints": ["1"]}, {})
    _get_jobs(Slurm(), {}, {})
    _get_jobs(Slurm(), {"checkpoints": ["yes"]}, {})
    assert asked == [(["n1"], True), ([], False), ([], False)]
