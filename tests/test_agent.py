"""The Slurm agent and its client, end to end against real slurmctld + slurmd (Debian's 22.05).

The agent runs here in-process on a loopback port, driving the Slurm commands
inside the test cluster's namespaces; one test runs the installed
``slurmk8s agent`` command inside those namespaces, as the sidecar runs in
the controller pod. The client is the operator's: :class:`RemoteSlurm`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from slurmk8s.api import load_cluster
from slurmk8s.render import config_files, config_hash, node_conf
from slurmk8s.slurm import (
    DRAIN_PREFIX,
    AgentError,
    AgentUnauthorized,
    AgentUnreachable,
    NotOurDrain,
    RemoteSlurm,
    SlurmClient,
    SlurmControl,
    SlurmError,
)
from slurmk8s.slurm.agent import AgentServer, make_server, read_token
from slurmk8s.slurm.control import OPERATIONS

from .realslurm import SlurmNamespace, missing_tools


@pytest.fixture(scope="session")
def example_doc(host_example_doc):
    """This module's Slurm daemons are this host's packages (realslurm.py): the example on their release."""
    return host_example_doc


pytestmark = pytest.mark.slurm
NODE = "demo-cpu-0"
SLURMK8S = str(Path(sys.executable).parent / "slurmk8s")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, example_doc, keys):
    assert os.geteuid() == 0 and not missing_tools(), "run hack/test.sh: it installs Slurm and runs as root"
    c = load_cluster(example_doc)
    work = tmp_path_factory.mktemp("agent")
    with SlurmNamespace(config_files(c), keys, work, nodes=[(NODE, node_conf(c, c.spec.node_sets[0]))]) as ns:
        yield ns


@pytest.fixture(scope="module")
def local(cluster) -> SlurmClient:
    """The facade inside the cluster's namespaces, reading its config directory."""
    return SlurmClient(lambda argv, stdin: cluster.run(argv, input=stdin, check=False),
                       config_dir=cluster.work / "conf")


@pytest.fixture(scope="module")
def agent(local, keys):
    server = AgentServer(("127.0.0.1", 0), local, keys.agent_token)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def remote(agent, keys) -> RemoteSlurm:
    return RemoteSlurm(agent.url, keys.agent_token)


def wait_until(predicate, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def raw(url: str, method: str = "GET", headers: dict | None = None, body: bytes | None = None):
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read())


def test_both_ends_implement_the_same_interface(local, remote):
    for impl in (local, remote):
        assert isinstance(impl, SlurmControl)
        for op in OPERATIONS:
            assert callable(getattr(impl, op)), (type(impl).__name__, op)


def test_requests_without_the_token_get_401(agent, keys, local):
    status, headers, body = raw(agent.url + "/v1/nodes")
    assert status == 401 and body["kind"] == "unauthorized"
    assert headers["WWW-Authenticate"].startswith("Bearer")
    wrong = keys.agent_token[:-1] + (b"0" if keys.agent_token[-1:] != b"0" else b"1")
    for header in (f"Bearer {wrong.decode()}", f"Basic {keys.agent_token.decode()}", "Bearer"):
        status, _, _ = raw(agent.url + "/v1/nodes/x/drain", "POST", {"Authorization": header}, b'{"reason": "r"}')
        assert status == 401, header
    with pytest.raises(AgentUnauthorized, match="refused the token"):
        RemoteSlurm(agent.url, wrong).drain(NODE, "r")
    assert not local.node(NODE).drain_set  # nothing reached Slurm
    # Liveness needs no token and touches nothing.
    assert raw(agent.url + "/healthz")[:3:2] == (200, {"ok": True})


def test_unknown_operations_and_methods_are_refused(agent, keys):
    auth = {"Authorization": f"Bearer {keys.agent_token.decode()}"}
    assert raw(agent.url + "/v1/exec", "POST", auth, b"{}")[0] == 404
    assert raw(agent.url + "/v1/nodes", "POST", auth, b"{}")[0] == 405
    assert raw(agent.url + "/v1/jobs/1;reboot/requeue", "POST", auth, b"{}")[0] == 404
    status, _, body = raw(agent.url + f"/v1/nodes/{NODE}/drain", "POST", auth, b"[1]")
    assert status == 400 and "JSON object" in body["error"]


def test_nodes_and_jobs_cross_the_wire_unchanged(local, remote):
    assert remote.ping()
    assert remote.nodes() == local.nodes()
    node = remote.node(NODE)
    assert node.state == "idle" and "cpu" in node.features and "DYNAMIC_NORM" in node.flags
    assert remote.node("demo-cpu-9") is None
    assert remote.jobs() == local.jobs() == []


def test_drains_are_prefixed_and_a_foreign_drain_is_refused(cluster, local, remote):
    remote.drain(NODE, "scale-in")
    node = local.node(NODE)
    assert node.drain_is_ours and node.reason == f"{DRAIN_PREFIX} scale-in"
    remote.undrain(NODE)
    assert not local.node(NODE).drain_set

    cluster.run(["scontrol", "update", f"nodename={NODE}", "state=drain", "reason=bad DIMM"])
    with pytest.raises(NotOurDrain, match="bad DIMM"):
        remote.undrain(NODE)
    assert local.node(NODE).reason == "bad DIMM"  # untouched
    cluster.run(["scontrol", "update", f"nodename={NODE}", "state=resume"])

    with pytest.raises(ValueError, match="is not a Slurm node name"):
        remote.drain("x state=resume", "r")
    with pytest.raises(ValueError, match="drain reason"):
        remote.drain(NODE, "two\nlines")
    with pytest.raises(ValueError, match="is not a signal"):
        remote.signal_node_jobs(NODE, "USR1; reboot")
    assert not local.node(NODE).drain_set


def test_signal_then_requeue_makes_the_job_eligible_at_once(cluster, local, remote, tmp_path):
    marks = tmp_path / "marks"
    script = (
        "#!/bin/bash\n"
        f"trap 'echo USR1 >> {marks}' USR1\n"
        f"echo start >> {marks}\n"
        "for i in $(seq 600); do sleep 0.1; done\n"
    )
    job = local.submit(script, ["--job-name=ckpt", "--requeue", f"--output={tmp_path}/out.txt"])
    wait_until(lambda: any(j.job_id == job and j.state == "RUNNING" for j in remote.jobs()), what="job to run")
    assert [j.job_id for j in remote.jobs(nodes=[NODE])] == [job]

    assert remote.signal_node_jobs(NODE, "USR1") == [job]
    wait_until(lambda: marks.exists() and "USR1" in marks.read_text(), what="USR1 in the batch shell")

    remote.requeue(job)
    after = time.time()
    queued = json.loads(cluster.run(["squeue", "--json", "--jobs", str(job)]).stdout)["jobs"][0]
    # Without the facade's start-now step Slurm holds a requeued job back
    # (credentialLifetime + 1 s here, ~121 s by default).
    assert queued["restart_cnt"] == 1
    assert queued["eligible_time"] <= after
    wait_until(lambda: marks.read_text().count("start") == 2, what="the requeued job to start again")
    local.cancel(job)
    wait_until(lambda: not any(j.active for j in remote.jobs(nodes=[NODE])), what="the node to be free")


def test_slurm_failures_keep_slurms_message(remote):
    with pytest.raises(SlurmError) as info:
        remote.requeue(999999)
    assert "Invalid job id" in info.value.stderr
    assert not info.value.unreachable


def test_reconfigure_keeps_slurmctld_and_the_dynamic_node(local, remote):
    remote.reconfigure()
    assert remote.ping()
    assert remote.node(NODE).responding


def test_config_hash_is_the_renderers_hash_of_the_files_slurmctld_reads(cluster, remote, example_doc):
    files = config_files(load_cluster(example_doc))
    assert remote.config_hash() == config_hash(files)
    conf = cluster.work / "conf" / "slurm.conf"
    original = conf.read_text()
    try:
        conf.write_text(original + "# changed by a test\n")
        changed = {**files, "slurm.conf": conf.read_text()}
        assert remote.config_hash() == config_hash(changed) != config_hash(files)
        remote.reconfigure()  # slurmctld reads the changed file
        assert remote.ping()
    finally:
        conf.write_text(original)
    assert remote.config_hash() == config_hash(files)


def test_config_hash_reads_a_kubelet_configmap_volume(tmp_path, example_doc):
    """The kubelet mounts keys as links into a hidden, atomically swapped ``..data``."""
    files = config_files(load_cluster(example_doc))
    stamp = tmp_path / "..2026_11_21_00_00_00.000000001"
    stamp.mkdir()
    for name, text in files.items():
        (stamp / name).write_text(text)
        (tmp_path / name).symlink_to(f"..data/{name}")
    (tmp_path / "..data").symlink_to(stamp.name)
    assert SlurmClient(config_dir=tmp_path).config_hash() == config_hash(files)


def test_the_installed_command_serves_the_agent_inside_the_controllers_namespaces(cluster, keys, local):
    token = cluster.work / "agent.token"
    token.write_bytes(keys.agent_token + b"\n")
    assert read_token(token) == keys.agent_token
    proc = subprocess.Popen(
        ["nsenter", "-t", str(cluster.pid), "--mount", "--uts", "--net", "--pid", "--",
         SLURMK8S, "--log-format", "json", "agent", "--listen", "127.0.0.1:6830", "--token-file", str(token),
         "--config-dir", str(cluster.work / "conf"), "--metrics-listen", "127.0.0.1:6831", "--metrics-interval", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    # A client in the same network namespace, as the operator reaches the pod.
    client = (
        "import json, sys, time\n"
        "from slurmk8s.slurm import RemoteSlurm, AgentUnreachable\n"
        "from slurmk8s.slurm.model import node_to_dict\n"
        "r = RemoteSlurm('http://127.0.0.1:6830', sys.argv[1], timeout=5)\n"
        "for _ in range(100):\n"
        "    if r.healthy(): break\n"
        "    time.sleep(0.1)\n"
        "import urllib.request\n"
        "for _ in range(100):\n"  # the metrics, with no token, once the first reading is done
        "    metrics = urllib.request.urlopen('http://127.0.0.1:6831/metrics', timeout=5).read().decode()\n"
        "    if 'slurmk8s_slurm_up 1.0' in metrics: break\n"
        "    time.sleep(0.1)\n"
        "print(json.dumps({'nodes': [node_to_dict(n) for n in r.nodes()], 'hash': r.config_hash(),\n"
        "                  'metrics': metrics}))\n"
    )
    try:
        out = subprocess.run(
            ["nsenter", "-t", str(cluster.pid), "--net", "--", sys.executable, "-c", client,
             keys.agent_token.decode()], capture_output=True, text=True, timeout=60)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert out.returncode == 0, out.stderr + err
    seen = json.loads(out.stdout)
    assert [n["name"] for n in seen["nodes"]] == [n.name for n in local.nodes()] == [NODE]
    assert seen["hash"] == local.config_hash()
    # Slurm's metrics, from the same facade: the node counted in its partition, slurmctld's
    # statistics from sdiag, and no slurmdbd asked where slurm.conf has no accounting.
    [partition] = local.nodes()[0].partitions
    state = local.nodes()[0].bucket
    assert "slurmk8s_slurm_up 1.0" in seen["metrics"]
    assert f'slurmk8s_slurm_nodes{{partition="{partition}",state="{state}"}} 1.0' in seen["metrics"]
    assert re.search(r"^slurmk8s_slurm_rpcs_total [1-9]", seen["metrics"], re.M), seen["metrics"]
    assert "slurmk8s_slurm_accounting_up" not in seen["metrics"]
    logged = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert any(e.get("path") == "/v1/nodes" and e.get("status") == 200 for e in logged)
    assert keys.agent_token.decode() not in err  # the token is never logged


def test_an_agent_that_is_not_there_is_unreachable_not_empty():
    with pytest.raises(AgentUnreachable, match="did not answer"):
        RemoteSlurm("http://127.0.0.1:9", "t" * 32, timeout=2).nodes()


def test_lending_reservations_cross_the_wire_and_only_ours_are_read(cluster, local, remote):
    start = int(time.time()) + 3600
    remote.reserve(NODE, start)
    assert [(r.node, r.start) for r in remote.reservations()] == [(NODE, start)]
    remote.reserve(NODE, start + 600)  # moved, not made twice
    assert [(r.node, r.start) for r in remote.reservations()] == [(NODE, start + 600)]
    # Someone else's reservation is not ours to read or touch.
    cluster.run(["scontrol", "create", "reservation", "ReservationName=admin-maint", f"Nodes={NODE}",
                 "StartTime=now+7200", "Duration=60", "Flags=MAINT,IGNORE_JOBS", "Users=root"])
    try:
        assert [r.name for r in local.reservations()] == [f"slurmk8s-lend-{NODE}"]
        remote.unreserve(NODE)
        remote.unreserve(NODE)  # none there: fine
        assert remote.reservations() == []
        assert "admin-maint" in cluster.run(["scontrol", "-o", "show", "reservation"]).stdout
    finally:
        cluster.run(["scontrol", "delete", "ReservationName=admin-maint"], check=False)
    with pytest.raises(ValueError, match="not a Slurm node name"):
        remote.reserve("node; reboot", start)


def test_a_lending_reservation_that_has_begun_is_moved_later_and_nothing_else_is_left(cluster, local, remote):
    """Slurm refuses to move a started reservation: it is made again, a short
    hold of the node in between, which is gone afterwards."""
    now = int(time.time())
    remote.reserve(NODE, now - 60)  # from a minute ago: it has begun
    assert "State=ACTIVE" in cluster.run(["scontrol", "-o", "show", "reservation"]).stdout
    try:
        remote.reserve(NODE, now + 3600)
        assert [(r.node, r.start) for r in remote.reservations()] == [(NODE, now + 3600)]
        names = re.findall(r"ReservationName=(\S+)", cluster.run(["scontrol", "-o", "show", "reservation"]).stdout)
        assert names == [f"slurmk8s-lend-{NODE}"]
        remote.reserve(NODE, now + 7200)  # a reservation yet to begin moves as before
        assert [(r.node, r.start) for r in remote.reservations()] == [(NODE, now + 7200)]
    finally:
        remote.unreserve(NODE)


def test_delete_node_removes_the_record_and_is_idempotent(local, remote):
    remote.drain(NODE, "removing")
    remote.delete_node(NODE)
    assert remote.node(NODE) is None and local.node(NODE) is None
    remote.delete_node(NODE)  # already gone: fine


def test_published_model_versions_are_read_only_below_the_checkpoint_root(tmp_path, keys):
    """GET /v1/published: what the bridge's rollouts read; nothing outside the root."""

    root = tmp_path / "checkpoints"
    model = root / "researcher" / "train"
    model.mkdir(parents=True)
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "LATEST").write_text("not-for-you\n")
    server = make_server("127.0.0.1:0", SlurmClient(lambda argv, stdin: None), keys.agent_token, str(root))
    server.start()
    try:
        remote = RemoteSlurm(server.url, keys.agent_token)
        with pytest.raises(FileNotFoundError, match="nothing published yet"):
            remote.published(str(model))
        (model / "LATEST").write_text("step-000003\n")
        assert remote.published(str(model)) == "step-000003\n"
        for outside in (str(tmp_path / "secret"), f"{model}/../../../secret", "relative/dir"):
            with pytest.raises(AgentError) as info:
                remote.published(outside)
            assert info.value.status == 403, outside
    finally:
        server.stop()
    # The local end reads the same, by the same rule, below the root it is given.
    local = SlurmClient(lambda argv, stdin: None, checkpoint_root=str(root))
    assert local.published(str(model)) == "step-000003\n"
    for outside in (str(tmp_path / "secret"), f"{model}/../../../secret", "relative/dir"):
        with pytest.raises(PermissionError):
            local.published(outside)
    with pytest.raises(FileNotFoundError, match="nothing published yet"):
        local.published(str(root / "researcher"))
    with pytest.raises(FileNotFoundError, match="no spec.sharedStorage.checkpointDir"):
        SlurmClient(lambda argv, stdin: None).published(str(model))


@pytest.fixture
def published_agent(tmp_path, keys):
    root = tmp_path / "checkpoints"
    (root / "researcher" / "train").mkdir(parents=True)
    os.chmod(tmp_path, 0o755)
    server = make_server("127.0.0.1:0", SlurmClient(lambda argv, stdin: None), keys.agent_token, str(root))
    server.start()
    yield root, RemoteSlurm(server.url, keys.agent_token)
    server.stop()


def test_published_never_follows_a_link_a_job_made(published_agent, tmp_path):
    """A job that makes LATEST, or a directory on the way to it, a symbolic
    link to the agent's token must not get the token back (issue 13, item 6)."""
    root, remote = published_agent
    token = tmp_path / "token"
    token.write_text("the-agent-token-0123456789\n")
    model = root / "researcher" / "train"
    (model / "LATEST").symlink_to(token)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "LATEST").symlink_to(token)
    (root / "researcher" / "linked").symlink_to(elsewhere)
    (root / "linkdir").symlink_to(tmp_path)
    for model_dir in (model, root / "researcher" / "linked", root / "linkdir"):
        with pytest.raises(AgentError) as info:
            remote.published(str(model_dir))
        assert info.value.status == 403, model_dir
        assert "the-agent-token" not in str(info.value)


def test_published_reads_as_an_unprivileged_user(published_agent):
    """What only root may read stays unread, even below the root."""
    root, remote = published_agent
    model = root / "researcher" / "train"
    latest = model / "LATEST"
    latest.write_text("step-000007\n")
    latest.chmod(0o644)
    assert remote.published(str(model)) == "step-000007\n"
    latest.chmod(0o600)
    with pytest.raises(AgentError) as info:
        remote.published(str(model))
    assert info.value.status == 403 and "step-000007" not in str(info.value)


def test_idle_connections_are_capped_and_timed_out(keys):
    """50 idle unauthenticated connections must not hold 50 threads, nor the
    agent for long (issue 13, item 6)."""
    import socket
    import threading
    from dataclasses import replace

    from slurmk8s.slurm.agent import LIMITS

    server = make_server("127.0.0.1:0", SlurmClient(lambda argv, stdin: None), keys.agent_token,
                         limits=replace(LIMITS, max_connections=8, deadline=1.0))
    before = threading.active_count()
    server.start()
    host, port = server.server_address[:2]
    idle = [socket.create_connection((host, port)) for _ in range(50)]
    try:
        time.sleep(0.5)
        assert threading.active_count() - before <= 1  # no thread waits for a request
        # The server closes every idle connection: the oldest at once over the
        # cap, the others after the deadline.
        for s in idle:
            s.settimeout(5)
            assert s.recv(1) == b""
        with urllib.request.urlopen(server.url + "/healthz", timeout=5) as resp:
            assert resp.status == 200
    finally:
        for s in idle:
            s.close()
        server.stop()


def test_a_request_sent_slowly_is_cut_off_after_the_deadline(keys):
    """One byte every 0.3 s never trips a per-read timeout: the whole request
    must arrive within the deadline."""
    import socket
    from dataclasses import replace

    from slurmk8s.slurm.agent import LIMITS

    server = make_server("127.0.0.1:0", SlurmClient(lambda argv, stdin: None), keys.agent_token,
                         limits=replace(LIMITS, deadline=1.0))
    server.start()
    s = socket.create_connection(server.server_address[:2])
    try:
        s.sendall(b"GET /v1/nodes HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        closed = False
        while time.monotonic() - started < 4:
            try:
                s.sendall(b"X")
            except OSError:
                closed = True
                break
            s.settimeout(0.3)
            try:
                if s.recv(1024) == b"":
                    closed = True
                    break
            except TimeoutError:
                pass
            except ConnectionResetError:
                # A close with our trickled byte still unread is a reset.
                closed = True
                break
        assert closed, "the agent kept a trickling request open past its request timeout"
        assert time.monotonic() - started < 3
    finally:
        s.close()
        server.stop()

