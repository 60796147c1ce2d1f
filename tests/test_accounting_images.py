"""Accounting with the real daemons from our images, on every supported
release: MariaDB (Debian's mariadb-server), slurmdbd, slurmctld and slurmd,
each started by its entrypoint in an overlay root over the exported image
(tests/fixtures/accounting-cluster.sh), with the renderer's config. The
associations come from the Slurm facade of the controller image.

What researchers and sites rely on: sacct shows finished, failed, array and
requeued jobs with exit code, state, node list and elapsed time; QOS limits
hold; sreport answers; and no record is lost while slurmdbd or MariaDB is
killed and comes back, nor when slurmctld restarts while slurmdbd is away."""

from __future__ import annotations

import base64
import copy
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from sandbox.imagestore import ImageStore
from slurmk8s import versions
from slurmk8s.api import load_cluster
from slurmk8s.render import ClusterKeys, render
from slurmk8s.render.slurmd import TERMINATING_DRAIN_REASON

pytestmark = [pytest.mark.images, pytest.mark.slurm, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ("slurmctld", "slurmd", "slurmdbd", "mariadb", "controller")


def _data(objects: list[dict], name: str) -> dict[str, str]:
    return next(o["data"] for o in objects if o["metadata"]["name"] == name)


def _line(out: str, key: str) -> str:
    m = re.search(rf"^{re.escape(key)}: (.*)$", out, re.M)
    assert m, f"no {key!r} line in:\n{out}"
    return m[1].strip()


def _cluster(version: str, extra_lines: list[str] = ()):
    doc = yaml.safe_load((ROOT / "examples/slurmcluster.yaml").read_text())
    doc = copy.deepcopy(doc)
    doc["spec"]["slurm"]["version"] = version
    doc["spec"]["login"]["users"].append(
        {"name": "alice", "uid": 2002, "sshPublicKeysFrom": {"name": "alice-ssh", "key": "authorized_keys"}})
    doc["spec"]["accounting"] = {
        "enabled": True,
        "accounts": [{"name": "ml", "users": ["alice"]}],
        "qos": [{"name": "short", "priority": 10, "maxWall": "1"}],
        "fairShare": {},
    }
    doc["spec"]["slurmConfig"]["extraLines"] = list(extra_lines)
    return load_cluster(doc)


def run_accounting_cluster(version: str, tmp: Path, *, env: dict | None = None, extra_lines: list[str] = (),
                           timeout: float = 840, stream: bool = False) -> tuple[str, Path, str]:
    """fixtures/accounting-cluster.sh on ``version``'s images with the rendered config
    (hack/bench_accounting.py runs it too, with SLURMK8S_BENCH_JOBS in ``env``).
    Returns its output, the work directory and everything (output and logs) for messages."""
    cluster = _cluster(version, extra_lines)
    built = {i.name: i for i in ImageStore().build(list(IMAGES), version)}
    objects = render(cluster, ClusterKeys.generate())
    conf = tmp / "etc-slurm"
    conf.mkdir()
    for name, text in _data(objects, f"{cluster.name}-slurm-config").items():
        (conf / name).write_text(text)
    (tmp / "slurmdbd.conf").write_text(_data(objects, f"{cluster.name}-slurmdbd-config")["slurmdbd.conf"])
    users = tmp / "users"
    users.mkdir()
    for name, text in _data(objects, f"{cluster.name}-users").items():
        (users / name).write_text(text)
    (tmp / "munge.key").write_bytes(base64.b64decode(_data(objects, f"{cluster.name}-munge-key")["munge.key"]))
    (tmp / "password").write_bytes(base64.b64decode(_data(objects, f"{cluster.name}-db-password")["password"]))
    roots = tmp / "roots"
    roots.mkdir()
    for name in IMAGES:
        (roots / name).symlink_to(built[name].rootfs)
    work = tmp / "run"
    work.mkdir()
    proc = subprocess.run([str(ROOT / "tests/fixtures/accounting-cluster.sh"), str(roots), str(conf),
                           str(tmp / "slurmdbd.conf"), str(tmp / "munge.key"), str(users), str(tmp / "password"),
                           str(work)], stdout=subprocess.PIPE, stderr=None if stream else subprocess.PIPE,
                          text=True, timeout=timeout,
                          env={**os.environ, "SLURMK8S_DB_BUFFER_POOL_MIB": _db_env(objects)["SLURMK8S_DB_BUFFER_POOL_MIB"],
                               "SLURMK8S_DRAIN_REASON": TERMINATING_DRAIN_REASON,
                               **(env or {})})
    logs = "\n".join(f"--- {f.name}\n{f.read_text()[-6000:]}" for f in sorted(work.glob("*.log")))
    return proc.stdout, work, f"{proc.stdout}\n{(proc.stderr or '')[-4000:]}\n{logs}"


def _db_env(objects: list[dict]) -> dict[str, str]:
    [db] = [o for o in objects if o["kind"] == "StatefulSet" and o["metadata"]["name"].endswith("-mariadb")]
    return {e["name"]: e["value"] for e in db["spec"]["template"]["spec"]["containers"][0]["env"] if "value" in e}


@pytest.fixture(scope="module", params=versions.SUPPORTED)
def run(request, tmp_path_factory):
    version = request.param
    out, work, everything = run_accounting_cluster(version, tmp_path_factory.mktemp(f"acct-{version}"))
    return version, out, work, everything


def _sacct(work: Path) -> dict[str, list[dict[str, str]]]:
    """sacct records by job id (a requeued job has one per run)."""
    fields = ["JobID", "JobName", "User", "Account", "State", "ExitCode", "NodeList", "Elapsed"]
    out: dict[str, list[dict[str, str]]] = {}
    for line in (work / "sacct.txt").read_text().splitlines():
        rec = dict(zip(fields, line.split("|"), strict=False))
        if "." in rec["JobID"]:
            continue  # steps (batch, extern)
        out.setdefault(rec["JobID"], []).append(rec)
    return out


def test_the_daemons_start_and_slurmctld_waits_for_slurmdbd_only_on_its_first_start(run):
    version, out, work, everything = run
    assert _line(out, "mariadb ready") == "yes", everything
    assert _line(out, "slurmctld ready before slurmdbd on first start") == "no", everything
    assert "first start with accounting: slurmctld needs slurmdbd" in (work / "ctld.log").read_text(), everything
    assert _line(out, "slurmdbd ready") == "yes", everything
    assert _line(out, "slurmctld ready") == "yes", everything
    assert _line(out, "node ready") == "yes", everything
    assert f"slurmctld version {version}." in (work / "ctld.log").read_text()
    for log in ("ctld.log", "slurmdbd.log", "mariadb.log"):
        assert "fatal" not in (work / log).read_text().lower().replace("fatal: you are running", ""), everything
    # The rendered buffer pool is one slurmdbd finds large enough.
    assert "slurmdbd version" in (work / "slurmdbd.log").read_text(), everything
    assert "not recommended values" not in (work / "slurmdbd.log").read_text(), everything


def test_associations_come_from_the_facade_and_a_second_run_changes_nothing(run):
    _, out, _, everything = run
    assert int(_line(out, "facade applied")) > 0, everything
    assert _line(out, "facade applied again") == "0", everything
    assoc = _line(out, "assoc").split("|")
    assert assoc[:2] == ["ml", "alice"] and set(assoc[2].split(",")) == {"normal", "short"}, everything


def test_sacct_shows_finished_failed_array_and_requeued_jobs(run):
    _, out, work, everything = run
    ids = dict(kv.split("=") for kv in _line(out, "jobs").split())
    jobs = _sacct(work)
    [ok] = jobs[ids["ok"]]
    assert (ok["JobName"], ok["User"], ok["Account"], ok["State"], ok["ExitCode"], ok["NodeList"]) == \
        ("ok", "alice", "ml", "COMPLETED", "0:0", "node-1"), everything
    assert re.fullmatch(r"00:00:0[1-9]", ok["Elapsed"]), ok
    [failed] = jobs[ids["failed"]]
    assert (failed["State"], failed["ExitCode"]) == ("FAILED", "3:0"), failed
    tasks = sorted(j for j in jobs if j.startswith(ids["array"] + "_"))
    assert tasks == [f"{ids['array']}_{i}" for i in (1, 2, 3)], sorted(jobs)
    assert all(jobs[t][-1]["State"] == "COMPLETED" for t in tasks)
    runs = [r["State"] for r in jobs[ids["requeued"]]]
    assert runs[0] == "REQUEUED" and runs[-1] == "COMPLETED", runs
    # A researcher sees their own jobs.
    assert ids["ok"] in (work / "sacct-alice.txt").read_text()


def test_qos_limits_are_enforced(run):
    _, out, _, everything = run
    state = _line(out, "qos job")
    assert state.startswith("PENDING") and "QOSMaxWall" in state, everything
    assert "Invalid qos" in _line(out, "unknown qos"), everything


def test_no_record_is_lost_while_slurmdbd_is_killed_and_slurmctld_restarts(run):
    _, out, work, everything = run
    assert _line(out, "slurmctld ready again without slurmdbd") == "yes", everything
    states = dict(kv.split("=") for kv in _line(out, "jobs while slurmdbd was down").split())
    assert sorted(states.values()) == ["COMPLETED", "COMPLETED", "COMPLETED", "FAILED"], everything
    assert _line(out, "slurmdbd ready again") == "yes", everything
    assert _line(out, "records after slurmdbd returned") == "yes", everything
    jobs = _sacct(work)
    for job_id in states:
        assert jobs[job_id][-1]["State"] in ("COMPLETED", "FAILED"), (job_id, jobs.get(job_id))


def test_no_record_is_lost_while_mariadb_is_killed(run):
    _, out, work, everything = run
    assert _line(out, "mariadb ready again") == "yes", everything
    assert _line(out, "records after mariadb returned") == "yes", everything
    names = [r["JobName"] for recs in _sacct(work).values() for r in recs]
    assert {"while-db-down-1", "while-db-down-2"} <= set(names), everything
    assert "using the database files" in (work / "mariadb.log").read_text()


def test_sreport_answers(run):
    _, out, work, everything = run
    reports = (work / "sreport.txt").read_text() + (work / "sreport-jobs.txt").read_text()
    assert _line(out, "sreport rc") == "0", everything + reports
    assert "Cluster|" in (work / "sreport.txt").read_text(), reports
    # sreport reads whole hours up to the last one slurmdbd rolled up: a run within its first
    # hour may have no rows yet, only the report's columns. Rows that are there are this cluster's.
    rows = [line.split("|") for line in (work / "sreport-jobs.txt").read_text().splitlines()]
    assert all(r[0] == "demo" for r in rows), reports


def _outcome(state: str) -> str:
    """A job's state as :mod:`slurmk8s.simulate.slurmrules` names what happened to it."""
    from slurmk8s.simulate import slurmrules

    name, _, restarts = state.partition(":")
    if name in ("PENDING", "REQUEUED") and restarts not in ("", "0"):
        return slurmrules.REQUEUED
    if name in ("CANCELLED", "NODE_FAIL"):
        return slurmrules.ENDED
    raise AssertionError(f"no rule of the model explains the job state {state!r}")


def test_slurm_does_to_jobs_what_the_simulators_model_says(run):
    """The one model of Slurm (slurmrules) that the simulator and the lending
    tests use, against this release's slurmctld and slurmd: a cancelled job
    ends; a node set DOWN requeues its requeueable job and ends (NODE_FAIL)
    one submitted with --no-requeue; scontrol requeue refuses that one; a
    busy dynamic node cannot be deleted."""
    from slurmk8s.simulate import slurmrules

    _, out, _, everything = run
    seen = dict(kv.split("=", 1) for kv in _line(out, "slurm rules").split())
    assert _outcome(seen["cancel"]) == slurmrules.on_cancel(), everything
    assert _outcome(seen["down-requeue"]) == slurmrules.on_node_down(requeue=True), everything
    assert _outcome(seen["down-no-requeue"]) == slurmrules.on_node_down(requeue=False), everything
    assert (seen["requeue-no-requeue-accepted"] == "yes") == (slurmrules.on_requeue(requeue=False) is not None), seen
    assert (seen["delete-busy-accepted"] == "yes") == slurmrules.may_delete_node(active_jobs=2), seen


def test_a_lending_reservation_lets_only_jobs_that_end_before_it_start(run):
    """The mechanism lending with foresight tells Slurm when a node is wanted
    back by (decision record 40), through the facade, on this release: a
    reservation from start on (Flags=MAINT,IGNORE_JOBS) keeps a job whose time
    limit reaches past it from starting while a shorter one starts; moved
    later, the longer job starts; removed, it is gone, and removing it again
    is fine. The facade reads back the start it set."""
    _, out, work, everything = run
    seen = dict(kv.split("=", 1) for kv in _line(out, "reservation").split())
    everything += (work / "reservation.log").read_text() if (work / "reservation.log").exists() else ""
    assert seen["read"] == f"node-1@{seen['start']}", everything
    assert seen["short"] == "RUNNING" and seen["long-before"] == "PENDING", everything
    assert seen["long-after"] == "RUNNING", everything
    assert seen["left"] == "[]" and seen["unreserve-again"] == "yes", everything


def test_a_lending_reservation_that_has_begun_is_moved_later(run):
    """Slurm does not move a reservation that has begun; the facade makes it
    again at its new start (a short hold of the node in between, gone after)."""
    _, out, work, everything = run
    seen = dict(kv.split("=", 1) for kv in _line(out, "started reservation").split())
    everything += (work / "reservation.log").read_text() if (work / "reservation.log").exists() else ""
    assert seen["active"] == "1", everything
    assert seen["later"] and seen["read"] == f"node-1@{seen['later']}", everything
    assert seen["names"] == "[slurmk8s-lend-node-1,]", everything
