"""The sandbox's pod runtime: run a planned pod as processes in Linux namespaces.

Each pod gets a network namespace with its own address on a private bridge,
a UTS namespace for its host name, a PID namespace, and a mount namespace in
which ``pod-init.sh`` builds the container's root file system (an overlay of
the host's root and a private writable layer, plus /dev, /proc, /run, /tmp
and the pod's volumes), switches into it and execs the image's entrypoint
from ``images/<component>/``. ``nsenter --net`` is used, not
``ip netns exec``: the latter remounts /sys, and slurmd then finds no cgroup
file system.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from . import podlogs
from .image import ImageError, image_env, install
from .plan import ENTRYPOINT, ContainerPlan, Mount, PodPlan

POD_INIT = Path(__file__).with_name("pod-init.sh")

class SandboxError(RuntimeError):
    """Something on this host kept the sandbox from doing its work; says what."""


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(argv), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise SandboxError(f"`{' '.join(argv)}` failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def short_id(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:6]


@dataclass(frozen=True)
class Network:
    """The sandbox's private bridge and the names derived from its id."""

    sid: str  # short id of the sandbox: keeps names of parallel sandboxes apart
    subnet: str
    gateway: str

    @property
    def bridge(self) -> str:
        return f"sk8s{self.sid}"

    @property
    def prefix(self) -> int:
        return int(self.subnet.split("/")[1])

    def netns(self, pod: str) -> str:
        return f"sk8s-{self.sid}-{pod}"

    def veth(self, index: int) -> str:
        return f"sk{self.sid}v{index}"

    def create(self) -> None:
        for line in sh("ip", "-o", "-4", "addr", "show").stdout.splitlines():
            dev, addr = line.split()[1], line.split()[3].split("/")[0]
            if dev != self.bridge and ipaddress.ip_address(addr) in ipaddress.ip_network(self.subnet):
                raise SandboxError(f"subnet {self.subnet} is already in use on {dev} ({addr}), by another "
                                   "sandbox or network: stop that one, or choose another with --subnet")
        if not Path(f"/sys/class/net/{self.bridge}").exists():
            sh("ip", "link", "add", self.bridge, "type", "bridge")
        addr = f"{self.gateway}/{self.prefix}"
        if addr not in sh("ip", "-o", "addr", "show", "dev", self.bridge).stdout:
            sh("ip", "addr", "add", addr, "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")

    def attach(self, pod: str, index: int, ip: str) -> None:
        ns, veth = self.netns(pod), self.veth(index)
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        sh("ip", "link", "set", veth, "master", self.bridge, "up")
        sh("ip", "-n", ns, "addr", "add", f"{ip}/{self.prefix}", "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")
        sh("ip", "-n", ns, "route", "add", "default", "via", self.gateway)

    def detach(self, pod: str, index: int) -> None:
        sh("ip", "link", "del", self.veth(index), check=False)
        sh("ip", "netns", "del", self.netns(pod), check=False)

    def delete(self) -> None:
        sh("ip", "link", "del", self.bridge, check=False)

    def leftovers(self) -> tuple[list[str], list[str]]:
        """Namespaces and links of this sandbox that still exist."""
        spaces = [line.split()[0] for line in sh("ip", "netns", "list").stdout.splitlines()
                  if line.startswith(f"sk8s-{self.sid}-")]
        links = [name for name in os.listdir("/sys/class/net")
                 if name == self.bridge or name.startswith(f"sk{self.sid}v")]
        return spaces, links


def _nul(items: Sequence[str]) -> bytes:
    return b"".join(i.encode() + b"\0" for i in items)


BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}


def container_env(pod: PodPlan, container: ContainerPlan) -> dict[str, str]:
    """What the container's process sees: the image's ENV, then the pod spec's."""
    return {**BASE_ENV, **image_env(container.component, BASE_ENV), "HOSTNAME": pod.hostname, "HOME": "/root",
            **container.env}


#: Directories container-init.sh mounts privately in every container.
PRIVATE_DIRS = ("/tmp", "/run")


def hidden_software() -> list[str]:
    """The sandbox's own Python environment (what stands in for the controller
    image's /opt/slurmk8s) and repository (an editable install imports from
    it), when they lie under a directory each container gets a private copy
    of: bind-mounted at the same path, read-only, so the containers find them."""
    here = [Path(sys.prefix).resolve(), Path(__file__).resolve().parents[2]]
    out: list[str] = []
    for path in here:
        if any(path.is_relative_to(d) for d in PRIVATE_DIRS) and str(path) not in out:
            out.append(str(path))
    return out


def prepare(pod: PodPlan, pod_dir: Path, hosts_file: Path, storage: Path) -> None:
    """Write everything the pod needs into ``pod_dir``; a restarted pod keeps the
    last instance's logs as each container's previous log (``podlogs``)."""
    previous = {}
    if pod_dir.exists():
        previous = podlogs.keep_previous(pod_dir)
        shutil.rmtree(pod_dir)
    write_files(pod, pod_dir)
    (pod_dir / "hostname").write_text(pod.hostname)
    (pod_dir / "gpus").write_text(str(pod.gpus))
    for i, container in enumerate(pod.containers):
        ctr = pod_dir / "containers" / str(i)
        image = ctr / "image"
        ctr.mkdir(parents=True)
        try:
            install(container.component, image)
        except ImageError as exc:
            raise SandboxError(f"pod {pod.name}, container {container.name}: {exc}") from None
        (image / "etc").mkdir(parents=True, exist_ok=True)
        (image / "etc/hostname").write_text(pod.hostname + "\n")
        # /etc/hosts is the sandbox's one file, bind-mounted: a rewrite reaches every pod.
        mounts = [Mount("bind", str(hosts_file.resolve()), "/etc/hosts", read_only=True)]
        for m in container.mounts:
            if m.source.startswith("/claims/"):
                host = storage / m.source.lstrip("/")
                host.mkdir(parents=True, exist_ok=True)
                m = Mount(m.kind, str(host), m.target, m.read_only, m.mode)
            mounts.append(m)
        # Last: a pod's own volume at /tmp (the controller's emptyDir) must not hide them.
        mounts += [Mount("bind", path, path, read_only=True) for path in hidden_software()]
        (ctr / "name").write_text(container.name)
        (ctr / "mounts").write_text("".join(
            f"{m.kind}\t{m.source}\t{m.target}\t{'ro' if m.read_only else 'rw'}\t{m.mode}\n" for m in mounts))
        env = container_env(pod, container)
        (ctr / "env").write_bytes(_nul([f"{k}={v}" for k, v in env.items()]))
        (ctr / "argv").write_bytes(_nul([ENTRYPOINT, *container.args]))
        podlogs.start_instance(ctr, previous.get(str(i)))


def write_files(pod: PodPlan, pod_dir: Path) -> None:
    """Make ``pod_dir`` with the files of the pod's ConfigMap, Secret and other volumes (both runtimes)."""
    pod_dir.mkdir(parents=True)
    for f in pod.files:
        path = pod_dir / f.path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f.content)
        path.chmod(f.mode)


def refresh_volumes(pod: PodPlan, pod_dir: Path) -> None:
    """Bring ConfigMap and Secret volume files up to date in a running pod.

    Each file is replaced by a rename inside its directory: the containers
    bind-mount the directory, so they see the new file whole, never half.
    """
    for f in pod.files:
        path = pod_dir / f.path
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.new")
        tmp.write_bytes(f.content)
        tmp.chmod(f.mode)
        tmp.replace(path)


def start(netns: str, pod_dir: Path) -> int:
    """Start the pod; returns the host PID of its namespace holder (unshare)."""
    log = open(pod_dir / "log", "ab")
    proc = subprocess.Popen(
        ["nsenter", f"--net=/var/run/netns/{netns}", "--",
         "unshare", "--uts", "--mount", "--pid", "--fork", "--mount-proc", "--propagation", "private",
         "--", "bash", str(POD_INIT), str(pod_dir)],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    log.close()
    return proc.pid


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def init_pid(holder: int) -> int | None:
    """The pod's PID 1, as the host numbers it (unshare's only child)."""
    try:
        children = Path(f"/proc/{holder}/task/{holder}/children").read_text().split()
    except FileNotFoundError:
        return None
    return int(children[0]) if children else None


def container_pid(holder: int, pod_dir: Path, index: int = 0) -> int | None:
    """The host PID of a container's main process (a child of the pod's PID 1)."""
    pid1 = init_pid(holder)
    try:
        nspid = (pod_dir / "containers" / str(index) / "nspid").read_text().strip()
        children = Path(f"/proc/{pid1}/task/{pid1}/children").read_text().split() if pid1 else []
    except FileNotFoundError:
        return None
    for child in children:
        try:
            status = Path(f"/proc/{child}/status").read_text()
        except FileNotFoundError:
            continue
        ids = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
        if ids and ids[-1] == nspid:
            return int(child)
    return None


def exec_argv(holder: int, pod_dir: Path, argv: Sequence[str], env: dict[str, str] | None = None,
              container: int = 0, tty: bool = False) -> list[str]:
    """argv that runs a command inside a running pod's container, with the given environment.

    With ``tty`` (the caller's stdin is a terminal): a session of its own inside
    the pod's PID namespace (setsid -c), with the terminal as its controlling
    terminal, so shells do job control as in a container."""
    pid = container_pid(holder, pod_dir, container)
    if pid is None:
        raise SandboxError("the pod or its container is not running")
    if tty:
        argv = ["setsid", "-c", *argv]
    prefix = ["nsenter", "-t", str(pid), "--net", "--uts", "--mount", "--pid", "--"]
    if env is not None:
        prefix += ["env", "-i", *(f"{k}={v}" for k, v in env.items())]
    return prefix + list(argv)


def stop(holder: int | None, grace: float) -> None:
    """SIGTERM the pod's PID 1 (its entrypoint), then SIGKILL after ``grace`` seconds.

    When PID 1 of a PID namespace dies, the kernel kills everything in it.
    """
    if not alive(holder):
        return
    pid1 = init_pid(holder)
    if pid1:
        try:
            os.kill(pid1, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while alive(holder) and time.monotonic() < deadline:
        time.sleep(0.1)
    if alive(holder):
        for pid in (init_pid(holder), holder):
            if pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        while alive(holder) and time.monotonic() < deadline:
            time.sleep(0.05)


def ready(holder: int, pod_dir: Path, pod: PodPlan) -> bool:
    """Run the readiness probe of every container once; the pod is ready when all pass."""
    if not alive(holder):
        return False
    return all(_container_ready(holder, pod_dir, pod, i, c) for i, c in enumerate(pod.containers))


def _container_ready(holder: int, pod_dir: Path, pod: PodPlan, index: int, c: ContainerPlan) -> bool:
    if c.readiness:
        try:
            argv = exec_argv(holder, pod_dir, c.readiness, container_env(pod, c), container=index)
            proc = subprocess.run(argv, capture_output=True, timeout=15)
        except (subprocess.TimeoutExpired, SandboxError):
            return False
        return proc.returncode == 0
    answered = network_probe(pod, c)
    return answered if answered is not None else container_pid(holder, pod_dir, index) is not None


def network_probe(pod: PodPlan, c: ContainerPlan) -> bool | None:
    """A container's tcpSocket or httpGet readiness probe, run once against the
    pod's address (both runtimes); None when it has neither."""
    if c.tcp_ready_port:
        try:
            with socket.create_connection((pod.ip, c.tcp_ready_port), timeout=2):
                return True
        except OSError:
            return False
    if c.http_ready:
        port, path = c.http_ready
        try:
            with urllib.request.urlopen(f"http://{pod.ip}:{port}{path}", timeout=2) as resp:
                return 200 <= resp.status < 400
        except OSError:
            return False
    return None
