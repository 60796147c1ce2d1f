"""The sandbox's kubelet and its runc runtime, against the Kubernetes stand-in: pods run from the built images, pulled from the sandbox's registry,
not from this host's root; volumes, env, exec, logs, stop with grace and
restart work; an image no registry has is ImagePullBackOff; nothing of a
pod is left when the kubelet stops its pods.

Needs root, runc and the slurmctld image (built here if missing, with
`slurmk8s images build`; cached after)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from sandbox import runcruntime, runtime
from sandbox.imagestore import CACHE_ENV
from sandbox.kubelet import SandboxNode

from .kubeletworld import KubeletWorld
from .test_kubelet import wait_for
from .tiers import needs

CTLD = "ghcr.io/slurmk8s/slurmctld:22.05"
NODES = [SandboxNode("runc-0", gpus=2)]
SID = "krunc"
MAIN = ("slurmctld -V; echo \"greeting=$GREETING\"; cat /cfg/motd; id -u; "
        "trap 'echo got TERM; sleep 1; echo bye; exit 0' TERM; "
        "i=0; while :; do i=$((i+1)); echo tick $i; sleep 0.5; done")


def pod(name: str, image: str, script: str, gpus: int = 2) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"terminationGracePeriodSeconds": 5,
                     "volumes": [{"name": "cfg", "configMap": {"name": "motd"}},
                                 {"name": "scratch", "emptyDir": {}},
                                 {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Mi"}}],
                     "containers": [{"name": "main", "image": image, "command": ["sh", "-c", script],
                                     "env": [{"name": "GREETING", "value": "hello from the pod"}],
                                     "resources": {"limits": {"nvidia.com/gpu": str(gpus), "memory": "256Mi"}},
                                     "readinessProbe": {"exec": {"command": ["test", "-d", "/scratch"]}},
                                     "volumeMounts": [{"name": "cfg", "mountPath": "/cfg", "readOnly": True},
                                                      {"name": "scratch", "mountPath": "/scratch"},
                                                      {"name": "shm", "mountPath": "/dev/shm"}]}]}}


class World(KubeletWorld):
    def __init__(self, tmp: Path):
        super().__init__(tmp, SID, "10.253.95.0/24", NODES, images=[CTLD])

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        return self.run_kubectl(*args, input=input, check=check)

    def local(self, name: str):
        return next(p for p in self.kubelet.pods.values() if p.name == name)

    def ready(self, name: str) -> bool:
        return any(c.type == "Ready" and c.status == "True" for c in self.pod(name).status.conditions or [])



@pytest.fixture(scope="module")
@needs("root")
def world(tmp_path_factory):
    w = World(tmp_path_factory.mktemp("runc"))
    # The images are in the registry now: the build cache moved away (an empty one), the
    # pods still come up, since a node pulls and never reads it.
    moved = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(tmp_path_factory.mktemp("no-build-cache"))
    try:
        docs = [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "motd", "namespace": "default"},
                 "data": {"motd": "from a ConfigMap\n"}},
                pod("ctld", CTLD, MAIN),
                pod("ghost", "ghcr.io/slurmk8s/nosuchimage:22.05", MAIN, gpus=0),
                pod("badvol", CTLD, MAIN, gpus=0)]
        docs[-1]["spec"]["volumes"].append({"name": "nfs", "nfs": {"server": "x", "path": "/"}})
        docs[-1]["spec"]["containers"][0]["volumeMounts"].append({"name": "nfs", "mountPath": "/nfs"})
        w.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
        wait_for("pod ctld ready", lambda: w.ready("ctld"), timeout=60)
        yield w
    finally:
        if moved is None:
            os.environ.pop(CACHE_ENV, None)
        else:
            os.environ[CACHE_ENV] = moved
        if not w.stop.is_set():
            w.close()


def test_the_pod_runs_from_its_image_not_from_this_hosts_root(world):
    assert not any(Path(os.environ[CACHE_ENV]).iterdir())  # pulled: nothing built, nothing read there
    local = world.local("ctld")
    pod_dir = world.kubelet.pod_dir(local)
    pid = runcruntime.container_pid(local.holder, pod_dir)
    assert pid is not None
    root = os.stat(f"/proc/{pid}/root")
    assert (root.st_dev, root.st_ino) != (os.stat("/").st_dev, os.stat("/").st_ino)
    # The entrypoint the Dockerfile copies is there; the image's own Slurm answered.
    assert os.path.exists(f"/proc/{pid}/root/usr/local/bin/slurmk8s-entrypoint")
    log = wait_for("the first lines", lambda: (out := world.kubectl("logs", "ctld").stdout).count("\n") > 4 and out)
    assert log.splitlines()[:4] == ["slurm-wlm 22.05.8", "greeting=hello from the pod", "from a ConfigMap", "0"]
    ids = {c["id"] for c in json.loads(subprocess.run(["runc", "list", "--format", "json"], capture_output=True,
                                                      text=True, check=True).stdout)}
    key = world.kubelet._netns_key(local)
    assert {f"sk8s-{SID}-{key}-0", f"sk8s-{SID}-{key}-pause"} <= ids  # recorded as the pod's in runc.json
    assert {c["id"] for c in json.loads((world.kubelet.pod_dir(local) / "runc.json").read_text())["containers"]} == \
        {f"sk8s-{SID}-{key}-0"}


def test_exec_sees_volumes_devices_limits_and_the_pods_namespaces(world):
    out = world.kubectl("exec", "ctld", "--", "sh", "-c",
                        "echo $GREETING; hostname; ls /dev/nvidia0 /dev/nvidia1; cat /proc/1/cmdline | tr '\\0' ' ';"
                        " echo; df -k /dev/shm | tail -1; touch /cfg/x 2>/dev/null || echo cfg-ro;"
                        " echo data > /scratch/f && cat /scratch/f;"
                        " cat /sys/fs/cgroup/memory/memory.limit_in_bytes; exit 3", check=False)
    assert out.returncode == 3, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "hello from the pod" and lines[1] == "ctld"
    assert lines[2:4] == ["/dev/nvidia0", "/dev/nvidia1"]
    assert lines[4].startswith("/bin/sh -c trap")  # PID 1 is the pod's pause
    assert lines[5].split()[1] == "8192"  # the emptyDir's sizeLimit
    assert lines[6:] == ["cfg-ro", "data", str(256 * 2**20)]


def test_exec_with_a_terminal(world):
    text, code = world.exec_in_terminal(["ctld"], b"stty size; tty -s && echo has-a-tty; echo $((6*7)); exit 5\n")
    assert "33 97" in text and "has-a-tty" in text and "42" in text, text
    assert code == 5, text


def test_an_image_no_registry_has_is_image_pull_back_off_with_the_registrys_answer_and_the_kubelet_goes_on(world):
    def waiting():
        statuses = world.pod("ghost").status.container_statuses or []
        return statuses and statuses[0].state.waiting and statuses[0].state.waiting.reason
    assert wait_for("ghost waiting", waiting, timeout=30) in ("ErrImagePull", "ImagePullBackOff")
    message = world.pod("ghost").status.container_statuses[0].state.waiting.message
    # Pulled through the node's mirror of ghcr.io/slurmk8s: the sandbox's registry says it has none.
    assert 'Failed to pull image "ghcr.io/slurmk8s/nosuchimage:22.05"' in message, message
    assert "404 Not Found: MANIFEST_UNKNOWN" in message and world.registry.address in message, message
    events = world.core.list_namespaced_event("default").items
    assert any(e.involved_object.name == "ghost" and e.type == "Warning" and "nosuchimage" in e.message
               for e in events)
    assert world.ready("ctld")  # the other pod runs on


def test_a_pod_the_kubelet_cannot_make_waits_with_a_reason_and_an_event(world):
    def waiting():
        statuses = world.pod("badvol").status.container_statuses or []
        return statuses and statuses[0].state.waiting and statuses[0].state.waiting.message
    assert "volume nfs has a type the sandbox does not run" in wait_for("badvol waiting", waiting, timeout=30)
    assert any(e.involved_object.name == "badvol" and e.reason == "Failed"
               for e in world.core.list_namespaced_event("default").items)
    assert world.ready("ctld")


def test_a_container_that_ends_is_restarted_with_its_previous_log(world):
    local = world.local("ctld")
    before = local.restarts
    pid = runcruntime.container_pid(local.holder, world.kubelet.pod_dir(local))
    os.kill(pid, 9)
    wait_for("a restart", lambda: world.local("ctld").restarts > before and world.ready("ctld"), timeout=60)
    assert "tick" in world.kubectl("logs", "ctld", "--previous").stdout
    # Ready comes from the probe, which may answer before the new container has written its first line.
    wait_for("the new container's first line", lambda: world.kubectl("logs", "ctld").stdout.startswith(
        "slurm-wlm 22.05.8\n"), timeout=30)


def test_a_killed_shims_containers_go_when_the_pod_starts_again(world):
    local = world.local("ctld")
    pod_dir = world.kubelet.pod_dir(local)
    shim, old = local.holder, runcruntime.container_pid(local.holder, pod_dir)
    os.kill(shim, 9)  # the containers run on without their shim
    wait_for("ctld started again", lambda: world.local("ctld").holder != shim and world.ready("ctld"), timeout=60)
    assert not runtime.alive(old)
    assert runcruntime.container_pid(world.local("ctld").holder, pod_dir) != old


def test_deletion_sends_term_and_waits_then_nothing_of_the_pod_is_left(world):
    local = world.local("ctld")
    pod_dir = world.kubelet.pod_dir(local)
    key = world.kubelet._netns_key(local)
    start = time.monotonic()
    world.kubectl("delete", "pod", "ctld", "--wait=true")
    took = time.monotonic() - start
    log = (pod_dir / "containers" / "0" / "log").read_text()
    assert "got TERM" in log and "bye" in log and took < 5, (took, log)  # its own exit, within the grace
    assert not runtime.alive(local.holder)
    assert not [i for i in runcruntime.leftovers(SID) if i.startswith(f"sk8s-{SID}-{key}")]
    assert str(pod_dir) not in Path("/proc/self/mountinfo").read_text()


def test_a_container_that_ignores_term_is_killed_after_the_grace_period(world):
    world.kubectl("apply", "-f", "-", input=yaml.safe_dump(pod("stubborn", CTLD, "trap '' TERM; sleep 1000")))
    wait_for("stubborn ready", lambda: world.ready("stubborn"), timeout=60)
    start = time.monotonic()
    world.kubectl("delete", "pod", "stubborn", "--wait=true")
    assert 5 <= time.monotonic() - start < 20  # terminationGracePeriodSeconds: 5


def test_stop_all_leaves_no_container_mount_or_namespace(world):
    world.kubectl("apply", "-f", "-", input=yaml.safe_dump(pod("last", CTLD, MAIN)))
    wait_for("last ready", lambda: world.ready("last"), timeout=60)
    assert runcruntime.leftovers(SID)
    world.close()
    assert runcruntime.leftovers(SID) == []
    assert str(world.dir) not in Path("/proc/self/mountinfo").read_text()
    assert world.net.leftovers() == ([], [])
    for hierarchy in ("memory", "devices", "pids"):
        assert not list(Path(f"/sys/fs/cgroup/{hierarchy}/slurmk8s").glob(f"sk8s-{SID}-*"))
