"""Node lending end to end: the bridge in the sandbox, with real Slurm.

The cluster, nodes and tools are in tests/e2e/lending.py. The tests run in
order, and each leaves both lendable nodes lent again.

Over 500 lines because the lending story is told in one sandbox, in order:
a module of its own would bring a second sandbox up.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from sandbox.prometheus import Prometheus
from slurmk8s import versions

from ..dashboards import queries
from .common import assert_one_writer_at_a_time, audit_now
from .conftest import default_release_only
from .lending import CHECKPOINT_JOB, CLUSTER, GRACE, LEND, SERVE_IMAGE, Lending, lending_sandbox, policy, wait_for

pytestmark = pytest.mark.slurm
SUBNET = "10.253.96.0/24"


@pytest.fixture(scope="module")
def world(tmp_path_factory, release) -> Lending:
    with lending_sandbox(tmp_path_factory.mktemp("bridge-e2e"), SUBNET, release) as w:
        if release == versions.DEFAULT:  # the last test reads the story from it
            w.prometheus = Prometheus(w.box)
            w.prometheus.install()
        yield w


def test_nothing_is_lent_below_the_minimum_or_while_a_gpu_pod_runs(world):
    world.gpu_pod("busy", LEND[0], gpus=1)
    wait_for("the GPU pod to run", lambda: world.pod_node("busy"))
    world.apply(policy(minKubernetesNodes=2))
    wait_for("the policy's status", lambda: world.condition().get("reason"))
    time.sleep(5)  # more than idleAfterSeconds and several rounds
    assert world.states() == {LEND[0]: None, LEND[1]: None}
    # The minimum drops: only the node without a GPU pod is lent.
    world.apply(policy(minKubernetesNodes=0))
    wait_for(f"{LEND[1]} lent", lambda: world.lent(LEND[1]), show=world.states)
    time.sleep(3)
    assert world.state(LEND[0]) is None
    annotations = world.node(LEND[0]).metadata.annotations or {}
    assert "slurmk8s.dev/idle-since" not in annotations  # a GPU pod runs there: not idle
    world.delete_pod("busy")
    wait_for(f"{LEND[0]} lent once idle", lambda: world.lent(LEND[0]), show=world.states)


def test_lent_nodes_join_the_partition_and_run_a_job_across_them(world):
    wait_for("both nodes lent", world.all_lent, show=world.states)
    slurm = {n.name: n for n in world.slurm.nodes()}
    for name in LEND:
        assert slurm[name].state == "idle" and "gpu" in slurm[name].partitions
    assert world.condition()["status"] == "True"
    status = world.policy()["status"]
    assert sorted(status["lentNodes"]) == list(LEND) and status["counts"]["lent"] == 2
    assert {e.involved_object.name for e in world.events("Lent")} >= set(LEND)
    # `sandbox status` shows both worlds' view of a lent node.
    st = world.box.status()
    nodes = {n["name"]: n for n in st["kubernetesNodes"]}
    assert all((nodes[n]["lending"], nodes[n]["gpus"], nodes[n]["slurmState"]) == ("lent", 4, "idle") for n in LEND)
    assert sorted(p["node"] for p in st["pods"] if p["slurmState"] == "idle" and p["node"] in LEND) == list(LEND)
    out = world.researcher.check(
        "srun -p gpu -N2 --gpus-per-node=4 --job-name=probe "
        "bash -c 'echo $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES $SLURMK8S_CHECKPOINT_DIR' | sort")
    # Each lent node runs its task with its GPUs, and the cluster's TaskProlog
    # gives it the same checkpoint directory as on the cluster's own nodes.
    ckpt = "/shared/checkpoints/researcher/probe"
    assert out.split("\n")[:2] == [f"{LEND[0]} 0,1,2,3 {ckpt}", f"{LEND[1]} 0,1,2,3 {ckpt}"]
    lent = ("slurmk8s_bridge_nodes", (("state", "lent"),))
    wait_for("the metrics to show 2 lent nodes", lambda: world.metrics().get(lent) == 2, timeout=20)
    assert world.metrics()[("slurmk8s_bridge_lend_seconds_count", ())] >= 2


def test_an_idle_lent_node_is_reclaimed_for_a_gpu_pod_and_lent_again_after(world):
    wait_for("both nodes lent", world.all_lent, show=world.states)
    world.gpu_pod("serve-idle", LEND[0])
    node = wait_for("the GPU pod to run on the reclaimed node", lambda: world.pod_node("serve-idle"),
                    show=world.states)
    assert node == LEND[0]
    assert LEND[0] not in world.slurm_nodes()  # its Slurm node is gone
    assert world.lent(LEND[1])  # the other one was not needed
    assert [e.message for e in world.events("Reclaiming", LEND[0])]
    world.delete_pod("serve-idle")
    wait_for("the node lent again", world.all_lent, show=world.states)


def _checkpointing_job_on_a_lent_node(world):
    """Both nodes lent, the checkpointing job running on one of them: the researcher,
    the job, its node and the other lent node."""
    wait_for("both nodes lent", world.all_lent, show=world.states)
    r = world.researcher
    r.put(CHECKPOINT_JOB, "/shared/researcher/ckpt.sh")
    job = r.sbatch("/shared/researcher/ckpt.sh", cwd="/shared/researcher")
    node = wait_for("the job to run", lambda: r.job(job)["JobState"] == "RUNNING" and r.job(job)["NodeList"])
    return r, job, node, next(n for n in LEND if n != node)


def test_a_busy_node_is_reclaimed_the_job_checkpoints_and_resumes(world):
    r, job, first, other = _checkpointing_job_on_a_lent_node(world)
    # The job's periodic checkpoint (its second step) as the agent reads it for the reclaim
    # order: a write in its checkpoint directory after it started.
    running = wait_for("the agent to see the job's checkpoint", lambda: next(
        (j for j in world.slurm.jobs(checkpoints=True) if j.job_id == job and j.checkpoint_time and j.start_time
         and j.checkpoint_time > j.start_time), None), timeout=30,
        show=lambda: [j for j in world.slurm.jobs(checkpoints=True) if j.job_id == job])
    assert running.checkpoint_time <= time.time() + 1
    reclaims = len(world.events("Reclaiming", first))
    world.gpu_pod("serve-busy", first)  # a serving pod that needs exactly that node
    # The bridge acts on the pod's event: signal, checkpoint, requeue and hand-back
    # may all be over within a second, between two looks at the node.
    wait_for("the reclaim", lambda: len(world.events("Reclaiming", first)) > reclaims, show=world.states)
    node = wait_for("the GPU pod to run on the reclaimed node", lambda: world.pod_node("serve-busy"),
                    timeout=GRACE + 60, show=world.states)
    assert node == first
    log = r.read(f"/shared/researcher/ckpt-{job}.out")
    assert "USR1 at step" in log, log
    saved = int(r.read(f"/shared/researcher/ckpt-{job}.step"))
    # It requeued itself; the bridge makes it eligible at once (Slurm would
    # hold it for its requeue delay), and it resumes on the other lent node.
    wait_for("the job to resume", lambda: r.job(job)["JobState"] == "RUNNING", timeout=60,
             show=lambda: r.job(job))
    assert int(r.job(job)["Restarts"]) >= 1 and r.job(job)["NodeList"] == other
    wait_for("the resumed job's output", lambda: f"resumed at step {saved} on {other}"
             in r.read(f"/shared/researcher/ckpt-{job}.out"), timeout=30)
    # Accounted like any job: sacct shows the run the reclaim requeued on the lent node
    # it left, and the resumed run on the other.
    runs = wait_for("both runs in sacct", lambda: (lambda rows: rows if len(rows) >= 2 else None)(
        r.check(f"sacct -D -X -n -P -j {job} --format=State,NodeList").split()), timeout=30)
    assert runs[:2] == [f"REQUEUED|{first}", f"RUNNING|{other}"], runs
    metrics = world.metrics()
    assert metrics[("slurmk8s_bridge_jobs_total", (("outcome", "signalled"),))] >= 1, metrics
    assert metrics[("slurmk8s_bridge_jobs_total", (("outcome", "started-now"),))] >= 1, metrics
    r.check(f"scancel {job}")
    world.delete_pod("serve-busy")
    wait_for("the node lent again", world.all_lent, show=world.states)


def test_a_node_lost_while_lent_leaves_slurm_safe_and_requeues_its_job(world):
    wait_for("both nodes lent", world.all_lent, show=world.states)
    r = world.researcher
    job = r.sbatch("/shared/researcher/ckpt.sh", "-w", LEND[1], cwd="/shared/researcher")
    wait_for("the job to run", lambda: r.job(job)["JobState"] == "RUNNING")
    pod = next(p.metadata.name for p in world.slurmd_pods() if p.spec.node_name == LEND[1])
    world.kubectl("delete", "pod", pod, "--grace-period=0", "--force", "--wait=false")
    wait_for("the job requeued", lambda: r.job(job)["JobState"] == "PENDING" or int(r.job(job)["Restarts"]) >= 1,
             timeout=60, show=lambda: r.job(job))
    # While it is gone, Slurm never offers the node as usable: drained, down, or removed.
    node = next((n for n in world.slurm.nodes() if n.name == LEND[1]), None)
    assert node is None or node.drain_set or node.state == "down", node
    wait_for("the node reclaimed", lambda: world.state(LEND[1]) in ("reclaiming", None, "lending"))
    messages = [e.message for e in world.events("Reclaiming", LEND[1])]
    assert any("slurmd pod is gone" in m for m in messages), messages
    r.check(f"scancel {job}")
    wait_for("the node lent again", world.all_lent, timeout=120, show=world.states)


@default_release_only
def test_a_node_briefly_not_ready_is_reclaimed_gracefully_never_set_down(world):
    """Kubernetes reporting a lent node Unknown for a moment (the kubelet's
    next heartbeat, within 10 s, says Ready again) must not end its job: the
    job gets the policy's signal and checkpoints; Slurm never sees the node
    DOWN (issue 13, item 7)."""
    world.apply(policy(minKubernetesNodes=0))
    wait_for("both nodes lent", world.all_lent, timeout=120, show=world.states)
    r = world.researcher
    r.put(CHECKPOINT_JOB, "/shared/researcher/ckpt.sh")
    job = r.sbatch("/shared/researcher/ckpt.sh", "-w", LEND[1], cwd="/shared/researcher")
    wait_for("the job to run", lambda: r.job(job)["JobState"] == "RUNNING", timeout=60)
    time.sleep(3)  # a few steps
    seen: set[str] = set()  # the Slurm node's states
    lending: set[str | None] = set()  # the Kubernetes node's lending states

    def watching(predicate):
        def check():
            node = next((n for n in world.slurm.nodes() if n.name == LEND[1]), None)
            if node is not None:
                seen.add(node.state)
            lending.add(world.state(LEND[1]))
            return predicate()
        return check

    # Unknown for about three seconds (several bridge rounds), whenever the
    # kubelet's heartbeat would say Ready again: a blip, far below the
    # policy's notReadyTimeoutSeconds. Watched from its start: a job that
    # checkpoints at once lets the node go back and be lent again within it.
    blip_end = time.monotonic() + 3
    while time.monotonic() < blip_end:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        world.core.patch_node_status(LEND[1], {"status": {"conditions": [
            {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
             "message": "Kubelet stopped posting node status.", "lastHeartbeatTime": now,
             "lastTransitionTime": now}]}}, _content_type="application/merge-patch+json")
        watching(lambda: True)()
        time.sleep(0.1)

    # The job is signalled, checkpoints and requeues itself (-w: it waits for
    # this node); the node goes back to Kubernetes and is lent again.
    wait_for("the job requeued by itself", watching(lambda: int(r.job(job)["Restarts"]) >= 1),
             timeout=GRACE + 60, every=0.2, show=lambda: (world.states(), r.job(job), seen))
    wait_for("the node lent again", watching(world.all_lent), timeout=120, every=0.2,
             show=lambda: (world.states(), seen))
    assert "down" not in seen, seen
    assert None in lending, lending  # handed back to Kubernetes before it was lent again
    # The graceful path (a sampled state can miss so short a reclaim; its Event cannot).
    messages = [e.message for e in world.events("Reclaiming", LEND[1])]
    assert any("not Ready" in m and "SIGUSR1" in m for m in messages), messages
    log = r.read(f"/shared/researcher/ckpt-{job}.out")
    assert "USR1 at step" in log, log  # it had its chance to checkpoint
    r.check(f"scancel {job}")


@default_release_only
@pytest.mark.parametrize("stage", ["lending", "reclaiming"])
def test_the_leading_bridge_killed_while_lending_or_reclaiming_the_standby_converges(world, stage):
    """The leader's pod is killed at once (no release of its Lease); the
    standby takes over within the lease duration and finishes what the
    leader began: nothing doubled, the job signalled once, one writer at a
    time in the audit log."""
    wait_for("both nodes lent", world.all_lent, show=world.states)
    r = world.researcher
    job = None
    since = audit_now(world.box)
    if stage == "lending":
        # Take a node back by a GPU pod, then let it be lent again: kill the
        # bridge as soon as it marks the node lending, likely mid-round.
        world.gpu_pod("serve-kill", LEND[0])
        wait_for("the pod placed", lambda: world.pod_node("serve-kill"), show=world.states)
        world.kubectl("delete", "pod", "serve-kill", "--wait=false")
        world.until_state(LEND[0], "lending")
    else:
        job = r.sbatch("/shared/researcher/ckpt.sh", "-w", LEND[0], cwd="/shared/researcher")
        wait_for("the job to run", lambda: r.job(job)["JobState"] == "RUNNING")
        before = len(world.events("Reclaiming", LEND[0]))
        world.gpu_pod("serve-kill", LEND[0])
        world.until_state(LEND[0], "reclaiming")
    # Killed at once: the leader must not finish the stage first.
    at_kill = world.states()[LEND[0]]
    killed = world.kill_bridge()
    assert at_kill == stage
    try:
        if stage == "reclaiming":
            wait_for("the pod on the reclaimed node", lambda: world.pod_node("serve-kill"), timeout=GRACE + 60,
                     show=world.states)
            # Signalled once: it checkpointed and requeued itself once (-w: it waits for that node).
            wait_for("the job requeued", lambda: r.job(job)["Restarts"] != "0", timeout=30, show=lambda: r.job(job))
            assert r.job(job)["Restarts"] == "1", r.job(job)
            # One reclaim: the standby took up the leader's, it did not start another (the
            # leader may have died between marking the node and posting its Event).
            assert len(world.events("Reclaiming", LEND[0])) in (before, before + 1)
    finally:
        if stage == "reclaiming":
            r.check(f"scancel {job}")
            world.delete_pod("serve-kill")
    wait_for("both nodes lent again", world.all_lent, timeout=90, show=world.states)
    # Exactly one slurmd pod and one Slurm node per lent node: nothing doubled.
    pods = sorted(p.spec.node_name for p in world.slurmd_pods())
    assert pods == list(LEND)
    assert sorted(n for n in world.slurm_nodes() if n.startswith("sandbox-lend")) == list(LEND)
    assert_one_writer_at_a_time(world.box, "slurmk8s-bridge", since, killed)


def _two_days(spikes: set[int]) -> list[int]:
    """Two days of demand (192 buckets) with one node wanted in the buckets
    ``spikes``: a rise counts for the buckets whose window ahead lies wholly
    in the record."""
    return [1 if i in spikes else 0 for i in range(2 * 86400 // 900)]


def _reserved(world: Lending, ok) -> dict[str, int] | None:
    """Slurm's lending reservations once ``ok`` says they show what is awaited."""
    have = world.reservations()
    return have if ok(have) else None


@default_release_only
def test_lending_with_foresight_reserves_a_lent_node_moves_it_and_leaves_no_reservation_behind(world):
    """A forecast that wants one node back within two hours, not one: the
    cheapest lent node (idle, the other runs a long job) gets a reservation
    an hour ahead (the other one a day ahead, the policy's reach: it is
    not lent past what the forecast looks at), so a job of 90
    minutes waits while one of 30 starts there; the forecast moves (within
    four hours, not two) and the reservation moves two hours ahead, so the
    90-minute job starts. The node reclaimed with the bridge killed at a
    random moment, then the policy deleted: no reservation is left on a
    node that is not lent."""
    import random

    wait_for("both nodes lent", world.all_lent, show=world.states)
    r = world.researcher
    jobs = {}

    def sbatch(name: object, node: str, minutes: int) -> int:
        jobs[name] = int(r.check(f"sbatch --parsable -p gpu -w {node} --time={minutes} -J resv-{name} "
                                 f"-o /dev/null --wrap 'sleep 30000'").split(";")[0])
        return jobs[name]

    # A long job on the second node: the first, idle, is the cheapest to give back.
    sbatch("filler", LEND[1], 600)
    wait_for("the filler to run", lambda: r.job(jobs["filler"])["JobState"] == "RUNNING")
    world.apply(policy(forecast={"quantilePercent": 95, "headroomSeconds": 0, "reserveSeconds": 86400}))
    since = time.time()
    # Spikes in buckets 95 and 191: a rise within 1 h in 3% of the past (under
    # the 95th percentile), within 2 h in 5.4% (over it).
    first = world.seeded(_two_days({95, 191}), lambda _: _reserved(world, lambda have: len(have) == 2))
    # The cheapest (idle) within the hour; the other is not lent past the policy's reach, a day.
    assert since + 3600 - 5 <= first[LEND[0]] <= time.time() + 3600 + 5, (first, since)
    assert since + 86400 - 5 <= first[LEND[1]] <= time.time() + 86400 + 5, (first, since)
    sbatch(90, LEND[0], 90)
    sbatch(30, LEND[0], 30)
    try:
        wait_for("the 30-minute job to run", lambda: r.job(jobs[30])["JobState"] == "RUNNING",
                 show=lambda: r.job(jobs[30]))
        time.sleep(3)
        long = r.job(jobs[90])
        assert long["JobState"] == "PENDING", (long, world.reservations())
        # Slurm's words for it vary by release: "Reserved for maintenance", "May be reserved for other job".
        assert long.get("Reason", "").startswith("ReqNodeNotAvail"), long
        # The forecast moves: one spike, in bucket 95: a rise within 2 h in 4.3% of
        # the past, within 4 h in 9%: the node is wanted in 2 to 4 hours.
        since = time.time()
        moved = world.seeded(_two_days({95}), lambda _: _reserved(
            world, lambda have: have.get(LEND[0], 0) > first[LEND[0]] + 1800))
        assert since + 7200 - 5 <= moved[LEND[0]] <= time.time() + 7200 + 5, moved
        wait_for("the 90-minute job to run", lambda: r.job(jobs[90])["JobState"] == "RUNNING",
                 show=lambda: r.job(jobs[90]))
        # A serving pod takes the node back; the bridge is killed at a random moment of it.
        world.gpu_pod("serve-resv", LEND[0])
        time.sleep(random.uniform(0, 1.5))
        world.kill_bridge()
        wait_for("the pod on the reclaimed node", lambda: world.pod_node("serve-resv"), timeout=GRACE + 90,
                 show=world.states)
        assert LEND[0] not in world.reservations(), world.reservations()
        assert all(world.lent(n) for n in world.reservations()), (world.reservations(), world.states())
    finally:
        r.check(f"scancel {' '.join(map(str, jobs.values()))}")
        world.kubectl("delete", "pod", "serve-resv", "--ignore-not-found")
    # The policy deleted: its nodes go back, and with them every reservation.
    world.kubectl("delete", "nodelendingpolicy", "lend-gpus")
    wait_for("both nodes back", lambda: all(world.returned(n) for n in LEND), timeout=GRACE + 90,
             show=world.states)
    wait_for("no reservation left", lambda: not world.reservations(), timeout=30, show=lambda: world.reservations())
    world.apply(policy())
    wait_for("both nodes lent again", world.all_lent, timeout=90, show=world.states)
    assert not world.reservations()


@default_release_only
def test_a_policy_that_selects_nothing_or_names_no_partition_says_so_and_touches_nothing(world):
    wait_for("both nodes lent", world.all_lent, show=world.states)
    before = {n: (world.node(n).metadata.labels, world.node(n).metadata.annotations) for n in LEND}
    bad = policy(nodeSelector={"matchLabels": {"no-such": "label"}})
    bad["metadata"]["name"] = "selects-nothing"
    world.apply(bad)
    cond = wait_for("a condition", lambda: world.condition("selects-nothing"))
    assert (cond["status"], cond["reason"]) == ("False", "NoMatchingNodes")
    assert "no-such=label" in cond["message"]
    wrong = policy(partition="nope")
    wrong["metadata"]["name"] = "wrong-partition"
    wrong["spec"]["nodeSelector"] = {"matchLabels": {"kubernetes.io/hostname": "sandbox-node-0"}}
    world.apply(wrong)
    cond = wait_for("a condition", lambda: world.condition("wrong-partition"))
    assert (cond["status"], cond["reason"]) == ("False", "PartitionNotFound")
    time.sleep(2)
    assert {n: (world.node(n).metadata.labels, world.node(n).metadata.annotations) for n in LEND} == before
    assert world.state("sandbox-node-0") is None
    world.kubectl("delete", "nodelendingpolicy", "selects-nothing", "wrong-partition")


@default_release_only
def test_a_published_model_version_rolls_the_serving_deployment(world):
    """Train on Slurm, serve on Kubernetes: the bridge reads LATEST through the
    cluster's agent (read-only) and rolls the Deployment that follows it."""
    model_dir = "/shared/checkpoints/researcher/model"

    def deployment(name: str, follows: str) -> dict:
        return {"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": name, "namespace": "default",
                             "annotations": {"slurmk8s.dev/model-dir": follows}},
                "spec": {"replicas": 0, "selector": {"matchLabels": {"app": name}},
                         "template": {"metadata": {"labels": {"app": name}},
                                      "spec": {"containers": [{"name": "serve", "image": SERVE_IMAGE}]}}}}

    def version(name: str) -> str | None:
        dep = world.kubectl("get", "deployment", name, "-o", "json")
        return (json.loads(dep)["spec"]["template"]["metadata"].get("annotations") or {}).get(
            "slurmk8s.dev/model-version")

    world.apply(deployment("serve-model", model_dir))
    world.apply(deployment("serve-elsewhere", "/etc"))
    r = world.researcher
    for step in (1, 2):
        # What a training job does: the version first, then LATEST by a rename.
        r.check(f"mkdir -p {model_dir}/step-{step:06d} && echo {step} > {model_dir}/step-{step:06d}/step && "
                f"echo step-{step:06d} > {model_dir}/.LATEST.new && mv {model_dir}/.LATEST.new {model_dir}/LATEST")
        wait_for(f"the Deployment rolled to step-{step:06d}", lambda: version("serve-model") == f"step-{step:06d}",  # noqa: B023 - called within this iteration
                 timeout=30)
    warnings = world.events("InvalidModelDir", "serve-elsewhere")
    assert warnings and "outside the checkpoint directories" in warnings[0].message
    assert version("serve-elsewhere") is None
    world.kubectl("delete", "deployment", "serve-model", "serve-elsewhere")


@default_release_only
def test_a_node_serving_on_one_gpu_lends_its_other_three_and_jobs_there_get_only_those(world):
    """minFreeGpus: a pod takes one GPU of a lent node back (demand), and the
    node's other three are lent again beside it; a job there sees the three
    devices the device plugin gave the lent pod, never the serving pod's."""
    world.apply(policy(minFreeGpus=2))
    wait_for("both nodes lent", world.all_lent, show=world.states)
    world.gpu_pod("serve-one", LEND[0], gpus=1)
    assert wait_for("the serving pod to run", lambda: world.pod_node("serve-one"), show=world.states) == LEND[0]
    uid = world.core.read_namespaced_pod("serve-one", "default").metadata.uid
    wait_for(f"{LEND[0]} lent beside it", lambda: world.lent(LEND[0]), show=world.states)
    gres = wait_for("Slurm to have it", lambda: (n := world.slurm.node(LEND[0])) and n.state == "idle" and n.gres)
    assert gres.split("(")[0].rsplit(":", 1)[1] == "3", gres
    lending = [e.message for e in world.events("Lending", LEND[0])]
    assert any(" 3 " in m and "GPU(s)" in m for m in lending), lending
    out = world.researcher.check(
        f"srun -p gpu -w {LEND[0]} --gpus=3 bash -c 'echo $CUDA_VISIBLE_DEVICES; cd /dev && echo nvidia[0-9]*'")
    cvd, job_devices = out.strip().split("\n")[:2]
    serve_devices = world.kubectl("exec", "serve-one", "--", "sh", "-c", "cd /dev && echo nvidia[0-9]*").split()
    assert cvd == "0,1,2" and len(serve_devices) == 1
    assert set(job_devices.split()).isdisjoint(serve_devices)
    assert set(job_devices.split()) | set(serve_devices) == {f"nvidia{i}" for i in range(4)}
    pod = world.core.read_namespaced_pod("serve-one", "default")
    assert (pod.metadata.uid, pod.status.phase) == (uid, "Running")  # lending left it alone
    world.delete_pod("serve-one")
    world.apply(policy())


@default_release_only
def test_kubectl_drain_of_a_lent_node_running_a_job_checkpoints_and_requeues_it_within_the_bound(world):
    """Issue 44, item 4 (decision record 49): while the job runs, the lent pod has a
    PodDisruptionBudget, and a termination grace of the policy's grace + KillWait + 60 s.
    kubectl drain cordons the node; its evictions are refused (429) while the bridge
    takes the node back through Slurm (signal, checkpoint, requeue); the drain then
    completes within the bound docs/operations.md states, the job REQUEUED (never
    NODE_FAIL) and running again on the other lent node."""
    from slurmk8s.render import names
    from slurmk8s.render.slurmd import termination_grace

    r, job, node, other = _checkpointing_job_on_a_lent_node(world)
    pod = world.lent_pod(node)
    assert pod is not None
    # The budget while the job runs (made by the next round that sees it), on that pod only.
    budget = wait_for("the lent pod's budget", lambda: world.budgets().get(pod.metadata.name), timeout=30,
                      show=world.budgets)
    assert [(o.kind, o.uid) for o in budget.metadata.owner_references] == [("Pod", pod.metadata.uid)]
    assert budget.spec.max_unavailable == 0
    assert names.lent_budget(world.cluster(), other) not in world.budgets()  # idle: none
    # The bound, as docs/operations.md states it: the pod's own termination grace.
    bound = termination_grace(world.cluster(), GRACE)
    assert pod.spec.termination_grace_period_seconds == bound
    out_file = f"/shared/researcher/ckpt-{job}.out"
    wait_for("the job's first steps", lambda: r.exists(out_file) and "running on" in r.read(out_file), timeout=30)
    t0 = time.monotonic()
    drain = subprocess.Popen(world.box.kubectl_argv(
        "drain", node, "--delete-emptydir-data", "--ignore-daemonsets", f"--timeout={bound * 2}s"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for("kubectl drain to end", lambda: drain.poll() is not None, timeout=bound * 2, every=0.5,
                 show=lambda: (world.states(), r.job(job), world.budgets()))
        took = time.monotonic() - t0
        out = drain.stdout.read() if drain.stdout else ""
        print(f"\nkubectl drain of a lent node running a job: {took:.1f}s (bound {bound}s)")
        assert drain.returncode == 0, out
        assert "error when evicting pods" in out and "Cannot evict pod" in out, out  # the budget held it
        assert took <= bound, (took, bound)
        # The graceful path: the cordon was the reclaim, the job had its signal and checkpointed.
        messages = [e.message for e in world.events("Reclaiming", node)]
        assert any("cordoned" in m and "SIGUSR1" in m for m in messages), messages
        assert "USR1 at step" in r.read(out_file)
        assert world.state(node) is None and pod.metadata.name not in world.budgets()
        # Requeued (never NODE_FAIL), and running again on the other lent node from its checkpoint.
        wait_for("the job to resume", lambda: r.job(job)["JobState"] == "RUNNING", timeout=60,
                 show=lambda: r.job(job))
        assert int(r.job(job)["Restarts"]) >= 1 and r.job(job)["NodeList"] == other
        runs = wait_for("both runs in sacct", lambda: (lambda rows: rows if len(rows) >= 2 else None)(
            r.check(f"sacct -D -X -n -P -j {job} --format=State,NodeList").split()), timeout=30)
        assert runs[:2] == [f"REQUEUED|{node}", f"RUNNING|{other}"], runs
        assert not any(row.startswith("NODE_FAIL") for row in runs), runs
    finally:
        if drain.poll() is None:
            drain.kill()
        world.kubectl("uncordon", node)
        r.check(f"scancel {job}")
    wait_for("both nodes lent again", world.all_lent, timeout=120, show=world.states)


@default_release_only
def test_a_worker_of_the_cluster_on_an_untainted_gpu_node_keeps_it_from_being_lent_and_keeps_its_jobs_when_lent(
        world):
    """Issue 44, item 4 (decision record 49), on a GPU node without the
    nvidia.com/gpu taint (EKS, AKS and kubeadm pools have none; the sandbox taints
    its GPU nodes, so the test takes the taint off one): a worker of the cluster
    lands there. The bridge does not lend the node while the cluster's own pod runs
    there, and says why. A worker it did not count (a race with the scheduler, which
    the test stands for by taking the pod's managed-by label off: the bridge then
    does not take it for the cluster's, while the operator, which finds its pods by
    their cluster label, still watches over it) sees the node lent beside it: the
    lending taint is no maintenance, the worker keeps its job, its Slurm node is
    not drained."""
    from slurmk8s.api.lending import LENDABLE_TO_LABEL
    from slurmk8s.render import names

    wait_for("both nodes lent", world.all_lent, show=world.states)
    node, r = LEND[1], world.researcher
    spec = CLUSTER["spec"]
    beside = {"name": "beside", "replicas": 1, "cpus": 1, "memory": "1Gi",
              "nodeSelector": {"kubernetes.io/hostname": node}}
    worker = f"{names.nodeset(world.cluster(), 'beside')}-0"
    job = None
    # Kubernetes' again (its owner withdraws it for a moment), and untainted, as most GPU pools are.
    world.kubectl("label", "node", node, f"{LENDABLE_TO_LABEL}-")
    wait_for(f"{node} back", lambda: world.returned(node), timeout=60, show=world.states)
    world.kubectl("taint", "node", node, "nvidia.com/gpu-")
    try:
        world.kubectl("patch", "slurmcluster", "lend", "--type", "merge", "-p", json.dumps({"spec": {
            "nodeSets": [*spec["nodeSets"], beside],
            "partitions": [{**spec["partitions"][0], "nodeSets": ["cpu", "beside"]}, *spec["partitions"][1:]]}}))
        wait_for("the worker on the GPU node, in Slurm", lambda: world.slurm_nodes().get(worker) in ("idle", "mixed"),
                 timeout=120, show=world.slurm_nodes)
        assert world.core.read_namespaced_pod(worker, "default").spec.node_name == node
        world.kubectl("label", "node", node, f"{LENDABLE_TO_LABEL}=default")
        # The cluster's own pod runs there: not lent, and the policy says why.
        wait_for("the policy to say why", lambda: f"{node} (runs 1 pod(s) of SlurmCluster default/lend"
                 in world.condition().get("message", ""), timeout=30, show=world.condition)
        time.sleep(3)  # more than idleAfterSeconds, several rounds
        assert world.state(node) is None
        job = int(r.check(f"sbatch --parsable -p cpu -w {worker} -o /dev/null --wrap 'sleep 30000'").split(";")[0])
        wait_for("the job to run", lambda: r.job(job)["JobState"] == "RUNNING", timeout=60)
        # A worker the bridge did not count: the node is lent beside it.
        world.kubectl("label", "pod", worker, "app.kubernetes.io/managed-by-")
        wait_for(f"{node} lent beside the worker", lambda: world.lent(node), timeout=60, show=world.states)
        assert any(t.key == "slurmk8s.dev/lent" for t in world.node(node).spec.taints)
        # Several operator rounds (its --interval is 3 s here): the worker keeps its job.
        end = time.monotonic() + 15
        while time.monotonic() < end:
            snode = next(n for n in world.slurm.nodes() if n.name == worker)
            assert not snode.drain_set, snode
            assert r.job(job)["JobState"] == "RUNNING", r.job(job)
            assert world.core.read_namespaced_pod(worker, "default").metadata.deletion_timestamp is None
            time.sleep(1)
        drains = [e.message for e in world.events("Draining") if worker in e.message]
        assert not drains, drains
    finally:
        if job is not None:
            r.check(f"scancel {job}")
        world.box.kubectl("label", "pod", worker, "--overwrite",  # if it came
                          f"app.kubernetes.io/managed-by={names.OPERATOR_MANAGER}")
        world.kubectl("patch", "slurmcluster", "lend", "--type", "merge", "-p", json.dumps({"spec": {
            "nodeSets": spec["nodeSets"], "partitions": spec["partitions"]}}))
        wait_for("the worker gone", lambda: worker not in {p.metadata.name for p in world.core.list_namespaced_pod(
            "default").items}, timeout=120)
        world.kubectl("label", "node", node, "--overwrite", f"{LENDABLE_TO_LABEL}=default")
        world.kubectl("taint", "node", node, "--overwrite", "nvidia.com/gpu=present:NoSchedule")
    wait_for("both nodes lent again", world.all_lent, timeout=120, show=world.states)


@default_release_only
def test_an_unrelated_node_with_unreadable_annotations_stops_neither_bridge_and_a_lent_node_is_still_reclaimed(world):
    """Issue 41, item 2: whoever may patch a Node (its kubelet, a labelling
    DaemonSet) wrote ``free-gpus: "²"`` on a node no policy selects, and both
    bridge replicas died in turn: nothing was lent or reclaimed anywhere.
    Both keep running (no restart, the same pods, the same leader) while a
    lent node is reclaimed for a GPU pod, and lent again after."""
    from sandbox import install

    wait_for("both nodes lent", world.all_lent, show=world.states)
    selector = f"app.kubernetes.io/instance={install.RELEASE},app.kubernetes.io/component=bridge"

    def bridges() -> dict[str, int]:
        return {p.metadata.name: sum(c.restart_count for c in p.status.container_statuses or [])
                for p in world.core.list_namespaced_pod(install.RELEASE_NAMESPACE, label_selector=selector).items}

    before, leader = bridges(), world.box.leader_pod("bridge")
    assert len(before) == 2 and leader in before, (before, leader)
    unrelated = "sandbox-node-0"  # runs the cluster's own pods; no policy selects it
    garbage = {"slurmk8s.dev/free-gpus": "²", "slurmk8s.dev/free-since": "2026-01-01T00:00:00Z",
               "slurmk8s.dev/reclaim-jobs": "²,x,٣", "slurmk8s.dev/lending-since": "9999-12-31T23:59:59-01:00",
               "slurmk8s.dev/reclaim-signalled": "0001-01-01T00:00:00+01:00", "slurmk8s.dev/idle-since": "٢٠٢٦"}
    world.kubectl("annotate", "node", unrelated, "--overwrite", *(f"{k}={v}" for k, v in garbage.items()))
    world.kubectl("label", "node", unrelated, "--overwrite", "slurmk8s.dev/lending=reclaiming")
    try:
        time.sleep(3)  # the change wakes the leader at once; several rounds run with it
        world.gpu_pod("serve-garbage", LEND[0])
        node = wait_for("the GPU pod to run on the reclaimed node", lambda: world.pod_node("serve-garbage"),
                        timeout=GRACE + 60, show=world.states)
        assert node == LEND[0] and world.lent(LEND[1])
        assert [e.message for e in world.events("Reclaiming", LEND[0])]
        time.sleep(3)
        assert bridges() == before, (before, bridges())  # the same pods, no restart since
        assert world.box.leader_pod("bridge") == leader
        # No policy holds the unrelated node: it is taken back by the defaults' deadline (decision
        # record 46), long after this test; meanwhile only its lending time is read as now.
        annotations = world.node(unrelated).metadata.annotations or {}
        assert annotations.get("slurmk8s.dev/reclaim-jobs") == "²,x,٣"
        assert not annotations["slurmk8s.dev/lending-since"].startswith("9999"), annotations
    finally:
        world.kubectl("label", "node", unrelated, "slurmk8s.dev/lending-")
        world.kubectl("annotate", "node", unrelated, *(f"{k}-" for k in garbage))
        world.delete_pod("serve-garbage")
    wait_for("the node lent again", world.all_lent, timeout=90, show=world.states)


@default_release_only
def test_a_lent_node_whose_record_names_no_policy_goes_back_through_slurm_and_is_lent_again(world):
    """Issue 41: whoever may patch a Node spoils its lending-policy annotation
    (here: no namespace), so no policy holds it. It is not kept for ever: the
    SlurmCluster its record still names is asked, and the node, idle there,
    is Kubernetes' again at once (its lent slurmd pod deleted, untainted,
    `record-unreadable`); then the policy lends it again."""
    wait_for("both nodes lent", world.all_lent, show=world.states)
    world.kubectl("annotate", "node", LEND[0], "--overwrite", "slurmk8s.dev/lending-policy=lend-gpus")
    wait_for("the node back", lambda: world.returned(LEND[0]), timeout=60, every=0.5, show=world.states)
    assert world.lent(LEND[1])
    assert any("cannot be read" in e.message for e in world.events("Reclaiming", LEND[0]))
    assert LEND[0] not in {p.spec.node_name for p in world.slurmd_pods() if p.metadata.deletion_timestamp is None}
    wait_for("the node lent again", world.all_lent, timeout=120, show=world.states)


@default_release_only
def test_prometheus_scrapes_every_target_and_every_dashboard_query_returns_data(world):
    """After the lending story above, the sandbox's Prometheus (examples/monitoring/,
    Kubernetes service discovery) scrapes the operator, the bridge and the Slurm
    agent, all up; every panel of the dashboards has data; the alert rules are loaded."""
    prom = world.prometheus

    def scraped() -> dict[str, list[dict]] | None:
        targets = prom.targets()
        by = {}
        for t in targets:
            by.setdefault(t["labels"].get("component") or t["labels"]["job"], []).append(t)
        healthy = all(t["health"] == "up" for t in targets)
        return by if healthy and {"operator", "bridge", "controller", "prometheus"} <= set(by) else None

    by = wait_for("every target scraped and up", scraped, timeout=60,
                  show=lambda: [(t["labels"], t["health"], t["lastError"]) for t in prom.targets()])
    assert [t["labels"]["cluster"] for t in by["controller"]] == ["lend"]
    assert len(by["operator"]) == 2 and len(by["bridge"]) == 2  # both replicas, standby too
    assert all(float(r["value"][1]) == 1 for r in prom.query("up"))
    # Each panel as Grafana draws it: a range query over the story, since Prometheus started.
    start, end = prom.installed, time.time()
    # A panel's "or on () vector(0)" (0 when nothing waits) must not make its own query pass.
    empty = [(board, panel, expr) for board, panel, expr in queries()
             if not prom.query_range(expr.split(" or on () vector(")[0], start, end)]
    assert not empty, empty
    groups = prom.api("rules")["groups"]
    assert {r["name"] for g in groups for r in g["rules"]} >= {"SlurmctldUnreachable", "SlurmK8sLendingStuck"}
    lent = prom.query('max_over_time(slurmk8s_slurm_gpus{cluster="lend",lent="true"}[1h])')
    assert lent and max(float(r["value"][1]) for r in lent) > 0  # the lent nodes' GPUs, seen by Slurm


@default_release_only
def test_a_cluster_the_bridge_cannot_load_hands_its_lent_nodes_back_within_grace_plus_the_deadline(world):
    """Issue 41, item 1: the SlurmCluster turns invalid while it holds lent
    nodes (as a rule tightened by an upgrade leaves a stored spec: the
    webhook is stepped around for the write), one of them running a job.
    The bridge does not skip the policy: nothing is lent, the policy says
    ClusterUnreadable, and both nodes are Kubernetes' again within
    gracePeriodSeconds + deadlineSeconds whatever Slurm runs there. Fixed
    again, the owed DOWN is settled and the nodes are lent again."""
    deadline = 30  # the least a policy may give
    world.apply(policy(reclaim={"gracePeriodSeconds": GRACE, "signal": "USR1", "deadlineSeconds": deadline}))
    wait_for("both nodes lent", world.all_lent, show=world.states)
    r = world.researcher
    job = int(r.check(f"sbatch --parsable -p gpu -w {LEND[0]} -o /dev/null --wrap 'sleep 30000'").split(";")[0])
    wait_for("the job to run", lambda: r.job(job)["JobState"] == "RUNNING")
    hooks = json.loads(world.kubectl("get", "validatingwebhookconfigurations", "-o", "json"))["items"]
    [(hook, index)] = [(h["metadata"]["name"], i) for h in hooks for i, w in enumerate(h["webhooks"])
                       if w["name"] == "slurmclusters.validate.slurmk8s.dev"]

    def operations(ops: list[str]) -> None:
        world.kubectl("patch", "validatingwebhookconfiguration", hook, "--type", "json", "-p", json.dumps(
            [{"op": "replace", "path": f"/webhooks/{index}/rules/0/operations", "value": ops}]))

    operations(["DELETE"])
    try:
        # Valid for the schema and its CEL rules, not for the rule the operator and the bridge
        # share (a slurm.conf key outside the extraLines allowlist: a parse no CEL rule states).
        world.kubectl("patch", "slurmcluster", "lend", "--type", "merge",
                      "-p", json.dumps({"spec": {"slurmConfig": {"extraLines": ["SlurmUser=root"]}}}))
    finally:
        operations(["CREATE", "UPDATE"])
    made_invalid = time.monotonic()
    try:
        cond = wait_for("the policy to say so", lambda: (c := world.condition()).get("reason") == "ClusterUnreadable"
                        and c, timeout=30, show=world.condition)
        assert "spec.slurmConfig.extraLines" in cond["message"], cond
        wait_for("both nodes back", lambda: all(world.returned(n) for n in LEND), timeout=GRACE + deadline + 30,
                 every=0.5, show=world.states)
        took = time.monotonic() - made_invalid
        assert took <= GRACE + deadline + 15, took  # a few rounds of slack
        assert {e.involved_object.name for e in world.events("ReclaimDeadline")} >= {LEND[0]}
        # The lent slurmd pods end as the kubelet stops them; nothing is lent to it meanwhile.
        wait_for("the lent slurmd pods gone", lambda: not world.slurmd_pods(), timeout=60,
                 show=lambda: [p.metadata.name for p in world.slurmd_pods()])
        assert world.states() == {LEND[0]: None, LEND[1]: None}
    finally:
        world.kubectl("patch", "slurmcluster", "lend", "--type", "merge",
                      "-p", json.dumps({"spec": {"slurmConfig": {"extraLines": None}}}))
        world.apply(policy())
    # Readable again: the DOWN the deadline owed ends the job, and lending resumes.
    wait_for("the job ended by the DOWN", lambda: r.job(job)["JobState"] != "RUNNING", timeout=60,
             show=lambda: r.job(job))
    r.check(f"scancel {job}")
    wait_for("both nodes lent again", world.all_lent, timeout=120, show=world.states)
