"""The sandbox's pod runtime with runc: each container runs from its image's
root file system as an OCI bundle, as a kubelet with containerd runs it.

The kubelet, its API server and ``sandbox down`` run every pod through it
(prepare, start, ready, exec_argv, stop); ``runtime`` holds the host
side it shares with them (network, volume files, network probes).

- ``prepare`` takes each container's image as the kubelet pulled it
  (:mod:`.pulls`: from a registry, never from the build cache), writes the
  volumes' files, and per container an OCI bundle (``oci.container_spec``)
  plus the pod's pause bundle, and ``runc.json`` with every container id,
  all before anything runs;
- ``start`` runs ``runcshim`` (the pod's supervisor, its holder PID) in the
  pod's own mount namespace;
- exec is ``runc exec`` into the running container; stop is SIGTERM to the
  shim (SIGTERM to every container), then SIGINT (SIGKILL to all) after the
  grace period.

Container ids are ``sk8s-<sandbox id>-<pod>-<uid>-<n>``, with ``-pause`` for
the pause; ``leftovers`` finds those of a sandbox (``runc list``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from . import oci, podlogs
from .distribution import Pulled
from .images import ImageError
from .plan import ContainerPlan, Mount, PodPlan
from .runtime import SandboxError, _nul, alive, cmdline, network_probe, write_files

NAME = "runc"


def container_id(netns: str, index: int | str) -> str:
    return f"{netns}-{index}"


def read_in_root(root: Path, rel: str) -> str:
    """A file of an image's root file system, every component opened without
    following links (a link there points into the container, not the host):
    "" when it is missing or is a link."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        parts = [p for p in rel.split("/") if p]
        for part in parts[:-1]:
            nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nfd
        ffd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd)
    except OSError:
        return ""
    finally:
        os.close(fd)
    with os.fdopen(ffd, "rb") as f:
        return f.read().decode(errors="replace")


def prepare(pod: PodPlan, images: Sequence[Pulled], pod_dir: Path, hosts_file: Path, storage: Path,
            netns: str = "", gpus: Sequence[int] = ()) -> None:
    """Write the pod's volumes, bundles and ``runc.json``; raises SandboxError. ``images``: each
    container's, as the kubelet pulled them; ``gpus``: the host numbers of the GPUs the kubelet
    gave the pod (its first container's)."""
    previous = {}
    if pod_dir.exists():
        previous = podlogs.keep_previous(pod_dir)
        subprocess.run(["rm", "-rf", "--one-file-system", str(pod_dir)], check=False)
    write_files(pod, pod_dir)
    (pod_dir / "hostname").write_text(pod.hostname + "\n")
    netns_path = f"/var/run/netns/{netns}"
    # One level under /slurmk8s: runc removes a container's cgroup, and nothing else is left.
    cgroup = "/slurmk8s"
    pause_bundle = pod_dir / "pause"
    pause_bundle.mkdir()
    (pause_bundle / "config.json").write_text(json.dumps(oci.pause_spec(
        root=str(images[0].rootfs), hostname=pod.hostname, net=netns_path, cgroups_path=f"{cgroup}/{container_id(netns, 'pause')}"), indent=1))
    record = {"pause": {"id": container_id(netns, "pause"), "bundle": str(pause_bundle)}, "containers": []}
    for i, (c, image) in enumerate(zip(pod.containers, images, strict=True)):
        ctr = pod_dir / "containers" / str(i)
        bundle = ctr / "bundle"
        bundle.mkdir(parents=True)
        (ctr / "name").write_text(c.name)
        mounts = []
        for m in c.mounts:
            if m.kind == "tmpfs":
                mounts.append(m)
                continue
            if m.source.startswith("/claims/"):
                host = storage / m.source.lstrip("/")
                host.mkdir(parents=True, exist_ok=True)
            elif m.source.startswith("/"):
                host = Path(m.source)
            else:
                host = pod_dir / m.source
                if not host.exists():
                    host.mkdir(parents=True)
            mounts.append(Mount(m.kind, str(host), m.target, m.read_only, m.mode, m.size))
        root = ctr / "rootfs"
        try:
            spec = oci.container_spec(
                c, image.config, root=str(root), hostname=pod.hostname,
                ns=oci.Namespaces(netns_path, oci.PAUSE_PLACEHOLDER), hosts_file=str(hosts_file.resolve()),
                hostname_file=str(pod_dir / "hostname"), mounts=mounts, gpus=gpus if i == 0 else (),
                cgroups_path=f"{cgroup}/{container_id(netns, i)}", passwd=read_in_root(image.rootfs, "etc/passwd"),
                group=read_in_root(image.rootfs, "etc/group"))
        except (oci.SpecError, ImageError) as exc:
            raise SandboxError(f"pod {pod.name}, container {c.name}: {exc}") from None
        (bundle / "config.template.json").write_text(json.dumps(spec, indent=1))
        env = dict(e.split("=", 1) for e in spec["process"]["env"])
        (ctr / "env").write_bytes(_nul([f"{k}={v}" for k, v in env.items()]))
        (ctr / "image").write_text(f"{c.image}\n{image.path}\n")
        record["containers"].append({"id": container_id(netns, i), "name": c.name, "bundle": str(bundle),
                                     "root": str(root), "lower": str(image.rootfs)})
        podlogs.start_instance(ctr, previous.get(str(i)))
    (pod_dir / "runc.json").write_text(json.dumps(record, indent=1))


def start(netns: str, pod_dir: Path) -> int:
    """Start the pod's shim; returns its PID (the pod's holder)."""
    log = open(pod_dir / "log", "ab")
    proc = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "--",
         sys.executable, "-P", "-m", "sandbox.runcshim", str(pod_dir)],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        cwd="/")
    log.close()
    return proc.pid


def _record(pod_dir: Path) -> dict | None:
    try:
        return json.loads((pod_dir / "runc.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def container_pid(holder: int | None, pod_dir: Path, index: int = 0) -> int | None:
    """The host PID of a container's process, while it and its shim run."""
    if not alive(holder):
        return None
    try:
        pid = int((pod_dir / "containers" / str(index) / "pid").read_text())
    except (FileNotFoundError, ValueError):
        return None
    return pid if alive(pid) else None


def exec_argv(holder: int | None, pod_dir: Path, argv: Sequence[str], env: dict[str, str] | None = None,
              container: int = 0, tty: bool = False) -> list[str]:
    """argv that runs a command in a running container (``runc exec``), as the
    container's user, in its working directory and cgroups, with ``env`` over its own.

    With ``tty`` (the caller's stdin is a terminal): runc gives the command a
    terminal of the container's own and copies between the two; it runs as
    the session leader of the caller's terminal (setsid --ctty; --wait for its exit status), so a resize of
    that terminal reaches it (SIGWINCH) and it resizes the container's."""
    record = _record(pod_dir)
    if record is None or container_pid(holder, pod_dir, container) is None:
        raise SandboxError("the pod or its container is not running")
    cid = record["containers"][container]["id"]
    flags = [f"--env={k}={v}" for k, v in (env or {}).items()]
    if tty:
        return ["setsid", "--wait", "--ctty", "runc", "exec", "--tty", *flags, cid, *argv]
    return ["runc", "exec", *flags, cid, *argv]


def stop(holder: int | None, grace: float) -> None:
    """SIGTERM every container (through the shim), SIGKILL after ``grace``
    seconds, and wait until the shim removed them."""
    if not alive(holder):
        return
    pod_dir = _pod_dir_of(holder)
    os.kill(holder, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while alive(holder) and time.monotonic() < deadline:
        time.sleep(0.1)
    if alive(holder):
        os.kill(holder, signal.SIGINT)
        deadline = time.monotonic() + 15
        while alive(holder) and time.monotonic() < deadline:
            time.sleep(0.1)
    if alive(holder):
        os.kill(holder, signal.SIGKILL)
    if pod_dir is not None:
        remove(pod_dir)


def _pod_dir_of(holder: int) -> Path | None:
    argv = cmdline(holder)
    if b"sandbox.runcshim" not in argv:
        return None
    return Path(argv[argv.index(b"sandbox.runcshim") + 1].decode())


def is_holder(holder: int | None) -> bool:
    """Whether ``holder`` is a runc pod's shim."""
    return bool(holder) and alive(holder) and _pod_dir_of(holder) is not None


def remove(pod_dir: Path) -> None:
    """Remove the pod's containers, whatever runs of them (a shim that was killed)."""
    record = _record(pod_dir)
    if record is None:
        return
    for cid in [c["id"] for c in record["containers"]] + [record["pause"]["id"]]:
        subprocess.run(["runc", "delete", "--force", cid], capture_output=True)


def leftovers(sid: str) -> list[str]:
    """The runc containers of sandbox ``sid`` that still exist."""
    if shutil.which("runc") is None:
        return []
    proc = subprocess.run(["runc", "list", "--format", "json"], capture_output=True, text=True)
    items = (json.loads(proc.stdout or "null") or []) if proc.returncode == 0 else []
    return [c["id"] for c in items if c["id"].startswith(f"sk8s-{sid}-")]


def ready(holder: int, pod_dir: Path, pod: PodPlan) -> bool:
    """Run the readiness probe of every container once; the pod is ready when all pass."""
    if not alive(holder):
        return False
    return all(_container_ready(holder, pod_dir, pod, i, c) for i, c in enumerate(pod.containers))


def _container_ready(holder: int, pod_dir: Path, pod: PodPlan, index: int, c: ContainerPlan) -> bool:
    if container_pid(holder, pod_dir, index) is None:
        return False
    if c.readiness:
        try:
            argv = exec_argv(holder, pod_dir, c.readiness, container=index)
            proc = subprocess.run(argv, capture_output=True, timeout=15, stdin=subprocess.DEVNULL)
        except (subprocess.TimeoutExpired, SandboxError):
            return False
        return proc.returncode == 0
    answered = network_probe(pod, c)
    return True if answered is None else answered

