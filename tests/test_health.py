"""Node health checks without daemons: what spec.healthCheck renders (the
slurm.conf keys and the `#slurmk8s:Health` lines the program reads, the site
checks' volume), refusals by field path, the drains the health check sets
read back, and the operator's Event and metric for them; the program's own
checks (site checks, disk, memory) run by bash here, in namespaces of their
own. The whole program runs against real Slurm in the sandbox
(tests/e2e/test_sandbox_e2e.py)."""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from sandbox.faults import fault_commands
from slurmk8s.api import load_cluster
from slurmk8s.api.errors import InvalidSpec
from slurmk8s.api.status import SlurmClusterStatus
from slurmk8s.operator import metrics
from slurmk8s.render import ClusterKeys, config_files, render
from slurmk8s.render.config import HEALTH_CHECK_PROGRAM
from slurmk8s.render.manifests import lent_slurmd_pod
from slurmk8s.render.slurmd import SITE_CHECKS_DIR
from slurmk8s.slurm.model import HEALTH_PREFIX, Node, unhealthy

from .conftest import ROOT, minimal

SHARED = {"volumes": [{"name": "shared", "mountPath": "/shared", "size": "1Gi"},
                      {"name": "data", "mountPath": "/data", "size": "1Gi"}]}


def conf(**spec) -> str:
    return config_files(load_cluster(minimal(partitions=[{"name": "p"}], **spec)))["slurm.conf"]


def test_by_default_every_slurmd_runs_the_three_checks_every_two_minutes():
    lines = conf(sharedStorage=SHARED).splitlines()
    assert f"HealthCheckProgram={HEALTH_CHECK_PROGRAM}" in lines
    assert "HealthCheckInterval=120" in lines and "HealthCheckNodeState=ANY" in lines
    assert "#slurmk8s:HealthChecks=gpus munge sharedStorage" in lines
    assert "#slurmk8s:HealthSharedPaths=/shared /data" in lines
    assert not [line for line in lines if "HealthMin" in line]


def test_thresholds_add_their_checks_in_bytes_and_disabled_renders_nothing():
    lines = conf(healthCheck={"minFreeDisk": "10Gi", "minAvailableMemory": "512Mi", "checks": ["munge"],
                              "intervalSeconds": 30, "nodeStates": ["IDLE", "MIXED", "CYCLE"]}).splitlines()
    assert "#slurmk8s:HealthChecks=munge disk memory" in lines
    assert f"#slurmk8s:HealthMinFreeDisk={10 * 2**30}" in lines
    assert f"#slurmk8s:HealthMinAvailableMemory={512 * 2**20}" in lines
    assert "HealthCheckNodeState=IDLE,MIXED,CYCLE" in lines and "HealthCheckInterval=30" in lines
    assert "HealthCheck" not in conf(healthCheck={"enabled": False})


@pytest.mark.parametrize("health,path,why", [
    ({"intervalSeconds": 5}, "spec.healthCheck.intervalSeconds", "the least allowed is 10"),
    ({"checks": ["gpus", "gpus"]}, "spec.healthCheck.checks", "listed twice"),
    ({"checks": ["nvidia-smi"]}, "spec.healthCheck.checks[0]", "gpus"),
    ({"nodeStates": ["NONDRAINED_IDLE"]}, "spec.healthCheck.nodeStates[0]", "ANY"),
    ({"minFreeDisk": "-1Gi"}, "spec.healthCheck.minFreeDisk", ""),
    ({"siteChecks": "Bad_Name"}, "spec.healthCheck.siteChecks", ""),
])
def test_bad_health_settings_are_refused_by_field_path(health, path, why):
    with pytest.raises(InvalidSpec) as err:
        load_cluster(minimal(partitions=[{"name": "p"}], healthCheck=health))
    found = {e.path: e.message for e in err.value.errors}
    assert path in found, found
    assert why in found[path]


def test_site_checks_are_mounted_read_only_on_workers_and_on_lent_nodes_once_verified():
    """Workers mount the site checks' ConfigMap (the operator renders them only once it
    found the ConfigMap labelled for that use), never optional: a pod does not start
    to run whatever ConfigMap of that name someone makes later. A lent pod, which the
    bridge renders, mounts it only while status.siteChecks (the operator's verdict)
    names the ConfigMap the spec names."""
    doc = minimal(nodeSets=[{"name": "cpu", "replicas": 1}], partitions=[{"name": "p", "nodeSets": ["cpu"]},
                  {"name": "gpu", "acceptLentNodes": True}], healthCheck={"siteChecks": "site-health"})
    doc["metadata"]["uid"] = "0b5e2c6e-1111-4c2b-9c57-3a9a4d3c2e01"
    cluster = load_cluster(doc)
    worker = next(o for o in render(cluster, ClusterKeys.generate()) if o["kind"] == "StatefulSet"
                  and o["metadata"]["name"] == "c1-cpu")["spec"]["template"]["spec"]

    def lent(status: dict | None) -> dict:
        c = load_cluster({**doc, "status": status}) if status is not None else cluster
        return lent_slurmd_pod(c, "h", node="n", resources={"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"},
                               labels={}, partition="gpu", shm_size="1Gi", taint_key="slurmk8s.dev/lent")["spec"]

    volume = {"name": "site-checks", "configMap": {"name": "site-health", "defaultMode": 0o444}}
    mount = {"name": "site-checks", "mountPath": SITE_CHECKS_DIR, "readOnly": True}
    for spec in (worker, lent({"siteChecks": "site-health"})):
        assert volume in spec["volumes"] and mount in spec["containers"][0]["volumeMounts"]
    for status in (None, {}, {"siteChecks": "other-checks"}):  # not verified, or verified under another name
        spec = lent(status)
        assert all(v["name"] != "site-checks" for v in spec["volumes"])
        assert mount not in spec["containers"][0]["volumeMounts"]


def node(name: str, reason: str = "", drained: bool = True) -> Node:
    return Node(name=name, state="idle", flags=frozenset({"DRAIN"} if drained else ()), reason=reason, features=(),
                partitions=(), cpus=1, alloc_cpus=0, gres="", address="")


def test_only_the_health_checks_own_drains_read_as_unhealthy():
    nodes = [node("a", "slurmk8s: health: gpus"), node("b", "slurmk8s: health: site-nfs.sh [root@2026-01-01]"),
             node("c", "slurmk8s: scale-in"), node("d", "health: gpus"), node("e", "slurmk8s: health: gpus", False)]
    assert unhealthy(nodes) == {"a": "gpus", "b": "site-nfs.sh"}


def test_a_drain_that_names_the_gpu_and_its_problem_reads_as_the_gpus_check():
    """The gpus check's reason names the GPU after the check (``gpus: GPU ...``); the
    check is still ``gpus`` for the Event, the metric and the bridge's annotation."""
    nodes = [node("a", "slurmk8s: health: gpus: GPU /dev/nvidia1 (00000000:2A:00.0): 3 uncorrectable ECC errors"),
             node("b", "slurmk8s: health: gpus: nvidia-smi did not answer within 15 s")]
    assert unhealthy(nodes) == {"a": "gpus", "b": "gpus"}


def test_the_metric_counts_unhealthy_nodes_by_check_and_falls_back_to_zero():
    class Outcome:
        def __init__(self, nodes):
            self.nodes, self.status = nodes, SlurmClusterStatus()

    def value(check: str) -> float | None:
        return REGISTRY.get_sample_value("slurmk8s_cluster_unhealthy_nodes",
                                         {"namespace": "hpc", "cluster": "h1", "check": check})
    metrics.observe_cluster("hpc", "h1", Outcome([node("a", "slurmk8s: health: gpus"),
                                                  node("b", "slurmk8s: health: gpus")]))
    assert value("gpus") == 2
    metrics.observe_cluster("hpc", "h1", Outcome([node("a")]))
    assert value("gpus") == 0
    metrics.forget_cluster("hpc", "h1")
    assert value("gpus") is None


def test_the_sandbox_takes_away_the_highest_gpu_and_gives_back_every_missing_one():
    assert fault_commands("gpu", False, gpus=[4, 5, 6, 7], present=[4, 5, 6, 7], shared=[]) == [
        ["rm", "-f", "/dev/nvidia7"]]
    assert fault_commands("gpu", True, gpus=[4, 5, 6, 7], present=[4, 5], shared=[]) == [
        ["mknod", "-m", "0666", "/dev/nvidia6", "c", "195", "6"], ["mknod", "-m", "0666", "/dev/nvidia7", "c", "195", "7"]]
    assert fault_commands("shared-readonly", False, gpus=[], present=[], shared=["/shared", "/data"]) == [
        ["mount", "-o", "remount,bind,ro", "/shared"], ["mount", "-o", "remount,bind,ro", "/data"]]
    assert fault_commands("shared-readonly", True, gpus=[], present=[], shared=["/shared"]) == [
        ["mount", "-o", "remount,bind,rw", "/shared"]]
    with pytest.raises(ValueError, match="given no GPU"):
        fault_commands("gpu", False, gpus=[], present=[], shared=[])


# -- the program itself (images/slurmd/healthcheck.sh), its checks run by bash as slurmd runs it ---------------
#
# Each runs in private mount and PID namespaces (unshare): a tmpfs of its own is the
# disk, its processes are the pod's, and whatever it kills or leaves dies with it.

PROGRAM = ROOT / "images/slurmd/healthcheck.sh"
JOB_UID = 2001  # a job user's uid (spec users are 1000 to 60000)


def program(body: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run ``body`` in bash after sourcing the program (its functions, no checks run), in
    private mount and PID namespaces with a 64 MiB tmpfs at $D (spool/ and tmp/ in it)."""
    assert os.geteuid() == 0, "the namespaces, the tmpfs and the uids of jobs and checks need root"
    script = f"""
set -u
D=$(mktemp -d)
mount -t tmpfs -o size=64m slurmk8s-health "$D"
mkdir -p "$D/spool" "$D/tmp" && chmod 1777 "$D/tmp"
source {shlex.quote(str(PROGRAM))}
LOG=$D/log SPOOL=$D/spool SCRATCH=$D/tmp
as() {{ setpriv --reuid="$1" --regid="$1" --clear-groups -- "${{@:2}}"; }}
alive() {{  # the processes of uid $1 that have not ended (zombies aside)
  cat /proc/[0-9]*/status 2>/dev/null | awk -v u="$1" '$1 == "State:" {{ z = $2 == "Z" }} $1 == "Uid:" && $2 == u && !z {{ n++ }} END {{ print n + 0 }}'
}}
{body}
"""
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "--pid", "--fork", "--mount-proc",
                           "bash", "-c", script], capture_output=True, text=True, timeout=timeout)


def result(proc: subprocess.CompletedProcess) -> dict[str, str]:
    assert proc.returncode == 0, proc.stderr
    return dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)


@pytest.mark.root
def test_a_site_check_that_setsids_a_sleeper_leaves_nothing_running():
    """Issue 41: a check that put a process in a session of its own (`setsid`) left
    the 10 s timeout's process group and ran on after it, as nobody, in every
    slurmd pod. Now every process of the checks' uid is killed when a check ends:
    one that exits at once, one still running at the timeout, one that forks on."""
    proc = program("""
CHECK_SECONDS=2
printf 'setsid sleep 300 >/dev/null 2>&1 &\\nexit 0\\n' >"$D/quick.sh"
printf 'setsid sleep 300\\nexit 0\\n' >"$D/slow.sh"
printf 'setsid sh -c "while :; do sleep 1 & wait; done" >/dev/null 2>&1 &\\nsetsid sleep 300 >/dev/null 2>&1 &\\nsleep 1\\nexit 0\\n' >"$D/forks.sh"
chmod 0444 "$D"/*.sh
for s in quick slow forks; do
  start=$SECONDS
  run_site_check "$D/$s.sh"; rc=$?
  sleep 0.5  # SIGKILL is delivered at once; the parent reaps a moment later
  echo "$s=$rc $(alive "$CHECK_UID") $((SECONDS - start))"
done
""")
    found = result(proc)
    assert found["quick"].split()[:2] == ["0", "0"], found  # it passed, and its sleeper is gone
    rc, left, seconds = found["slow"].split()
    assert rc != "0" and left == "0" and int(seconds) <= 2 + 2 + 1, found  # timed out, killed, within -k 2
    assert found["forks"].split()[:2] == ["0", "0"], found


@pytest.mark.root
def test_an_ordinary_check_still_runs_as_nobody_and_its_exit_status_counts():
    proc = program("""
printf 'test "$(id -u)" = 65534 && test "$(id -g)" = 65534\\n' >"$D/who.sh"
printf 'exit 3\\n' >"$D/fails.sh"
run_site_check "$D/who.sh"; echo "who=$?"
run_site_check "$D/fails.sh"; echo "fails=$?"
""")
    assert result(proc) == {"who": "0", "fails": "3"}


@pytest.mark.root
def test_a_job_filling_its_scratch_does_not_trip_the_disk_check_and_the_nodes_own_use_does():
    """Issue 41: the disk check read /tmp's free space, so a job writing scratch
    there drained its node (and a lent node was reclaimed and marked for good).
    Now what the running jobs' users hold in the scratch directories counts as
    free; the spool's file system filling otherwise (slurmd's state, a daemon,
    the litter of users with no job running) still fails the check."""
    mib = 1 << 20
    proc = program(f"""
MIN={32 * mib}
as {JOB_UID} sleep 300 &  # the job, running
as {JOB_UID} dd if=/dev/zero of="$D/tmp/scratch" bs=1M count=40 status=none
check_disk $MIN; echo "job=$? $why"
rm "$D/tmp/scratch"; why=''
dd if=/dev/zero of="$D/spool/state" bs=1M count=40 status=none
check_disk $MIN; echo "daemon=$? $why"
rm "$D/spool/state"; why=''
as {JOB_UID + 1} dd if=/dev/zero of="$D/tmp/litter" bs=1M count=40 status=none  # no job of theirs runs
check_disk $MIN; echo "litter=$? $why"
""")
    found = result(proc)
    assert found["job"] == "0 ", found
    assert found["daemon"].startswith("1 ") and "under" in found["daemon"], found
    assert found["litter"].startswith("1 "), found


def _fake_pod(root: Path, processes: dict[int, tuple[int, int]], limit: int | str, stat: dict[str, int]) -> None:
    """A /proc (pid -> (uid, RssAnon bytes)) and a cgroup (memory.max, .stat, .current) under ``root``."""
    for pid, (uid, anon) in processes.items():
        (root / "proc" / str(pid)).mkdir(parents=True)
        (root / "proc" / str(pid) / "status").write_text(
            f"Name:\tp{pid}\nState:\tS (sleeping)\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nVmRSS:\t{anon // 1024} kB\n"
            f"RssAnon:\t{anon // 1024} kB\nRssFile:\t0 kB\n")
    (root / "proc" / "meminfo").write_text(f"MemTotal:\t{64 << 20} kB\nMemAvailable:\t{1 << 20} kB\n")
    (root / "cgroup").mkdir()
    (root / "cgroup" / "memory.max").write_text(f"{limit}\n")
    (root / "cgroup" / "memory.stat").write_text("".join(f"{k} {v}\n" for k, v in stat.items()))
    (root / "cgroup" / "memory.current").write_text(f"{stat['anon'] + stat.get('file', 0)}\n")


@pytest.mark.parametrize("limit,minimum,processes,stat,passes", [
    # A job using nearly all the pod's memory, with page cache and /dev/shm files of its own: healthy.
    (4 << 30, 512 << 20, {1: (0, 100 << 20), 40: (JOB_UID, 3 << 30), 41: (JOB_UID + 7, 400 << 20)},
     {"anon": (100 << 20) + (3 << 30) + (400 << 20), "file": 300 << 20, "shmem": 200 << 20}, True),
    # The same on a node of terabytes (no figure is cut at 2^31 on the way).
    (4 << 40, 64 << 30, {1: (0, 50 << 30), 40: (JOB_UID, (4 << 40) - (60 << 30))},
     {"anon": (4 << 40) - (10 << 30), "file": 0}, True),
    # A daemon (root, SlurmUser, nobody: not a job's) holding the memory: the node's fault.
    (4 << 30, 512 << 20, {1: (0, 3700 << 20), 40: (JOB_UID, 200 << 20)},
     {"anon": (3700 << 20) + (200 << 20), "file": 0}, False),
    (4 << 30, 512 << 20, {1: (64030, 1 << 30), 2: (65534, 2600 << 20)},
     {"anon": (1 << 30) + (2600 << 20), "file": 0}, False),
])
def test_the_memory_check_counts_what_is_not_the_jobs(tmp_path, limit, minimum, processes, stat, passes):
    """Issue 41: the memory check failed when the pod's limit left too little
    unused, so a job using the memory it was given drained its node. Now only
    the anonymous memory of what is not a job counts against the limit."""
    _fake_pod(tmp_path, processes, limit, stat)
    proc = subprocess.run(["bash", "-c", f"""
source {shlex.quote(str(PROGRAM))}
PROC={tmp_path}/proc CGROUP={tmp_path}/cgroup SLURM_UID=64030
check_memory {minimum}; echo "rc=$?"; echo "why=$why"
"""], capture_output=True, text=True, timeout=30)
    found = result(proc)
    assert (found["rc"] == "0") == passes, found
    if not passes:
        assert "besides the jobs'" in found["why"]


def test_without_a_limit_the_memory_check_adds_the_jobs_memory_to_what_the_node_has_available(tmp_path):
    _fake_pod(tmp_path, {40: (JOB_UID, 2 << 30)}, "max", {"anon": 2 << 30})  # MemAvailable: 1 GiB
    body = f"source {shlex.quote(str(PROGRAM))}; PROC={tmp_path}/proc CGROUP={tmp_path}/cgroup; "
    for minimum, rc in ((2 << 30, "0"), (4 << 30, "1")):
        proc = subprocess.run(["bash", "-c", body + f'check_memory {minimum}; echo "rc=$?"'], capture_output=True,
                              text=True, timeout=30)
        assert result(proc)["rc"] == rc


@pytest.mark.root
def test_the_jobs_memory_is_read_from_the_real_proc():
    """The job's anonymous memory as the program reads it from this kernel's /proc."""
    proc = program(f"""
as {JOB_UID} python3 -c 'import time; b = bytearray(200 << 20); print("up", flush=True); time.sleep(60)' >"$D/up" &
for _ in $(seq 100); do [ -s "$D/up" ] && break; sleep 0.1; done
echo "jobs=$(jobs_anon_bytes)"
echo "uids=$(job_uids | tr '\\n' ' ')"
""")
    found = result(proc)
    assert int(found["jobs"]) >= 200 << 20 and found["uids"].split() == [str(JOB_UID)], found



# -- the gpus check: the device nodes, and the driver where nvidia-smi is there ---------------------------------
#
# A fake /dev (character devices made by mknod) and a fake nvidia-smi printing what the
# real one prints: `--query-gpu=minor_number,pci.bus_id,ecc.errors.uncorrected.volatile.total,
# retired_pages.pending --format=csv,noheader,nounits` rows, the line a GPU fallen off the bus
# gets instead of its row (and the exit status then), `--query-remapped-rows` rows. sinfo
# and scontrol are fakes too: the drain is read from scontrol's arguments.

HEALTHY = "0, 00000000:18:00.0, 0, No\n1, 00000000:2A:00.0, 0, No\n"
ROWS = "00000000:18:00.0, 0, 0\n00000000:2A:00.0, 0, 0\n"
GPU1 = "GPU /dev/nvidia1 (00000000:2A:00.0)"


def gpu_check(root: Path, query: str | None, rows: str = ROWS, rc: int = 0, devices: tuple[int, ...] = (0, 1),
              gpus: int = 2, seconds: int = 20) -> dict[str, str]:
    """The gpus check on a pod with /dev/nvidiaN for ``devices`` and ``gpus`` in its gres, and
    then the drain or resume it leads to. ``query``: what nvidia-smi prints for the GPU query
    (exiting ``rc``), "hang" for one that never answers, None for no nvidia-smi on PATH."""
    (root / "dev").mkdir()
    for n in devices:
        os.mknod(root / "dev" / f"nvidia{n}", 0o600 | stat.S_IFCHR, os.makedev(195, n))
    os.mknod(root / "dev" / "nvidiactl", 0o600 | stat.S_IFCHR, os.makedev(195, 255))
    (root / "bin").mkdir()
    (root / "gpus").write_text(query or "")
    (root / "rows").write_text(rows)
    fakes = {
        "sinfo": 'case "$*" in *%T*) echo idle ;; *%E*) echo none ;; esac',
        "scontrol": f'printf "%s\\n" "$@" >{root}/scontrol',
        "nvidia-smi": ("exec sleep 300" if query == "hang" else
                       f'case "$*" in *--query-gpu=*) cat {root}/gpus; exit {rc} ;; '
                       f'*--query-remapped-rows=*) cat {root}/rows ;; *) exit 2 ;; esac'),
    }
    for name, body in fakes.items():
        if name == "nvidia-smi" and query is None:
            continue
        (root / "bin" / name).write_text(f"#!/bin/bash\n{body}\n")
        (root / "bin" / name).chmod(0o755)
    proc = subprocess.run(["bash", "-c", f"""
source {shlex.quote(str(PROGRAM))}
PATH={root}/bin:$PATH DEV={root}/dev LOG={root}/log SMI_SECONDS={seconds} gpus={gpus}
start=$SECONDS
if check_gpus; then failed=''; else failed=gpus; fi
echo "seconds=$((SECONDS - start))"
settle n1 "$failed" "$detail" "$why"
"""], capture_output=True, text=True, timeout=60)
    found = result(proc)
    drain = root / "scontrol"
    found["scontrol"] = drain.read_text() if drain.exists() else ""
    return found


def drained_for(found: dict[str, str]) -> str | None:
    """The reason the check drained the node with, after the prefix; None when it did not."""
    args = found["scontrol"].splitlines()
    if "state=drain" not in args:
        return None
    reason = next(a for a in args if a.startswith("reason="))[len("reason="):]
    assert reason.startswith(HEALTH_PREFIX), reason
    return reason[len(HEALTH_PREFIX):]


@pytest.mark.root
@pytest.mark.parametrize("query,rows", [
    (HEALTHY, ROWS),
    # ECC off or not reported, no retired pages on a GPU that remaps rows, no row remapping: unknown, not failures.
    ("0, 00000000:18:00.0, [N/A], [N/A]\n1, 00000000:2A:00.0, [Not Supported], [Not Supported]\n",
     "00000000:18:00.0, [N/A], [N/A]\n00000000:2A:00.0, [N/A], [N/A]\n"),
    (HEALTHY, "No devices support row remapping.\n"),
    # A privileged pod sees the host's GPUs: a broken one that is not the pod's is not judged.
    (HEALTHY + "7, 00000000:DB:00.0, 12, Yes\n", ROWS + "00000000:DB:00.0, 1, 1\n"),
])
def test_healthy_gpus_pass_the_driver_check(tmp_path, query, rows):
    found = gpu_check(tmp_path, query, rows)
    assert drained_for(found) is None and found["scontrol"] == "", found


@pytest.mark.root
@pytest.mark.parametrize("query,rows,rc,reason", [
    # A GPU fallen off the bus keeps its device node; nvidia-smi prints a line for it, no row.
    ("Unable to determine the device handle for GPU 0000:2A:00.0: GPU is lost.  Reboot the system to recover this GPU\n"
     "0, 00000000:18:00.0, 0, No\n", ROWS, 15,
     "gpus: GPU /dev/nvidia1 does not answer nvidia-smi (00000000:2A:00.0: GPU is lost)"),
    ("Unable to determine the device handle for GPU0000:2a:00.0: Unknown Error\n0, 00000000:18:00.0, 0, No\n", ROWS, 255,
     "gpus: GPU /dev/nvidia1 does not answer nvidia-smi (00000000:2A:00.0: no device handle)"),
    ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA "
     "driver is installed and running.\n", ROWS, 9,
     "gpus: GPUs /dev/nvidia0, /dev/nvidia1 do not answer nvidia-smi"),
    ("0, 00000000:18:00.0, 0, No\n1, 00000000:2A:00.0, 3, No\n", ROWS, 0, f"gpus: {GPU1}: 3 uncorrectable ECC errors"),
    ("0, 00000000:18:00.0, 0, No\n1, 00000000:2A:00.0, 0, Yes\n", ROWS, 0, f"gpus: {GPU1}: retired pages pending"),
    (HEALTHY, "00000000:18:00.0, 0, 0\n00000000:2A:00.0, 1, 0\n", 0, f"gpus: {GPU1}: row remapping pending"),
    (HEALTHY, "00000000:18:00.0, No, No\n00000000:2A:00.0, No, Yes\n", 0, f"gpus: {GPU1}: row remapping failed"),
    ("0, 00000000:18:00.0, 1, Yes\n1, 00000000:2A:00.0, 0, No\n", ROWS, 0,
     "gpus: GPU /dev/nvidia0 (00000000:18:00.0): 1 uncorrectable ECC errors (and 1 more)"),
])
def test_each_gpu_failure_the_driver_reports_drains_the_node_naming_the_gpu(tmp_path, query, rows, rc, reason):
    """Issue 44: the gpus check counted /dev/nvidiaN, and a GPU fallen off the bus or with
    uncorrectable ECC errors keeps its device node. Now the driver answers for each GPU."""
    assert drained_for(gpu_check(tmp_path, query, rows, rc)) == reason


@pytest.mark.root
def test_an_nvidia_smi_that_hangs_drains_the_node_within_its_bound(tmp_path):
    found = gpu_check(tmp_path, "hang", seconds=1)
    assert drained_for(found) == "gpus: nvidia-smi did not answer within 1 s", found
    assert int(found["seconds"]) <= 1 + 4 + 1, found  # SMI_SECONDS, the kill's grace, the poll


@pytest.mark.root
@pytest.mark.parametrize("devices,drained", [((0, 1), False), ((0,), True)])
def test_without_nvidia_smi_the_device_nodes_are_counted(tmp_path, devices, drained):
    found = gpu_check(tmp_path, None, devices=devices)
    assert drained_for(found) == ("gpus" if drained else None), found
