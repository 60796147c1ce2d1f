"""The host side of the sandbox's pods, whatever runs their containers
(``runcruntime``): the private bridge and each pod's network namespace and
veth, the files of its ConfigMap, Secret and other volumes, and the network
readiness probes run against its address.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .plan import ContainerPlan, PodPlan


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

    @property
    def table(self) -> str:
        """The nftables table (family inet) that enforces NetworkPolicies on this network."""
        return f"sk8s{self.sid}"

    def netns(self, pod: str) -> str:
        return f"sk8s-{self.sid}-{pod}"

    def veth(self, index: int) -> str:
        return f"sk{self.sid}v{index}"

    def create(self) -> list[str]:
        """Make the bridge; returns the empty bridges of dead sandboxes it removed on the way."""
        removed = []
        for line in sh("ip", "-o", "-4", "addr", "show").stdout.splitlines():
            dev, addr = line.split()[1], line.split()[3].split("/")[0]
            if dev == self.bridge or ipaddress.ip_address(addr) not in ipaddress.ip_network(self.subnet):
                continue
            if not abandoned_bridge(dev, addr):
                raise SandboxError(f"subnet {self.subnet} is already in use on {dev} ({addr}), by another "
                                   "sandbox or network: stop that one, or choose another with --subnet")
            Network(dev.removeprefix("sk8s"), self.subnet, addr).delete()
            removed.append(dev)
        if not Path(f"/sys/class/net/{self.bridge}").exists():
            sh("ip", "link", "add", self.bridge, "type", "bridge")
        addr = f"{self.gateway}/{self.prefix}"
        if addr not in sh("ip", "-o", "addr", "show", "dev", self.bridge).stdout:
            sh("ip", "addr", "add", addr, "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        # Bridged IPv4 through the host's netfilter hooks, as CNIs on a bridge need,
        # so that the NetworkPolicy table sees pod-to-pod traffic (sandbox/netpol.py).
        nf_call = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
        if not nf_call.exists():
            sh("modprobe", "br_netfilter")
        nf_call.write_text("1\n")
        return removed

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
        sh("nft", "delete", "table", "inet", self.table, check=False)

    def leftovers(self) -> tuple[list[str], list[str]]:
        """Namespaces and links of this sandbox that still exist."""
        spaces = [line.split()[0] for line in sh("ip", "netns", "list").stdout.splitlines()
                  if line.startswith(f"sk8s-{self.sid}-")]
        links = [name for name in os.listdir("/sys/class/net")
                 if name == self.bridge or name.startswith(f"sk{self.sid}v")]
        return spaces, links


def abandoned_bridge(dev: str, address: str | None = None) -> bool:
    """Whether ``dev`` is a sandbox's bridge that nothing uses any more: named as
    ``Network`` names bridges, with no port, no pod network namespace of its id,
    and nothing listening on its ``address`` (a sandbox that is starting serves
    its registry there before its first pod). Such a bridge is what a sandbox
    leaves when it is killed and its state directory removed (pytest prunes old
    temporary directories), so its ``down`` can never run; removing it cuts
    nothing off. Anything else is left alone."""
    sid = dev.removeprefix("sk8s")
    if not (dev.startswith("sk8s") and len(sid) == 6 and all(c in "0123456789abcdef" for c in sid)):
        return False
    ports = Path(f"/sys/class/net/{dev}/brif")
    if not ports.is_dir() or any(ports.iterdir()):
        return False
    if address is not None and address in listening_addresses():
        return False
    return not any(line.startswith(f"sk8s-{sid}-") for line in sh("ip", "netns", "list").stdout.splitlines())


def listening_addresses() -> set[str]:
    """The IPv4 addresses this network namespace has TCP sockets listening on (/proc/net/tcp)."""
    out = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A":  # LISTEN
            out.add(str(ipaddress.IPv4Address(bytes(reversed(bytes.fromhex(fields[1].split(":")[0]))))))
    return out


def _nul(items: Sequence[str]) -> bytes:
    return b"".join(i.encode() + b"\0" for i in items)


def _own(path: Path, mode: int, fs_group: int | None) -> None:
    """A volume file's mode; with the pod's ``fsGroup``, that group owns it and may read it,
    as the kubelet's volume ownership management does for read-only volumes (mode | 0440)."""
    if fs_group is not None:
        os.chown(path, 0, fs_group)
        mode |= 0o440
    path.chmod(mode)


def write_files(pod: PodPlan, pod_dir: Path) -> None:
    """Make ``pod_dir`` with the files of the pod's ConfigMap, Secret and other volumes.

    An emptyDir is a directory of mode 0777, as the kubelet makes it (any user
    of the pod may write there); with ``fsGroup`` that group owns it, with the
    setgid bit, as the kubelet's volume ownership management sets it."""
    pod_dir.mkdir(parents=True)
    for f in pod.files:
        path = pod_dir / f.path
        if f.directory:
            path.mkdir(parents=True, exist_ok=True)
            if pod.fs_group is not None:
                os.chown(path, 0, pod.fs_group)
            path.chmod(f.mode | (0o2000 if pod.fs_group is not None else 0))
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f.content)
        _own(path, f.mode, pod.fs_group)


def refresh_volumes(pod: PodPlan, pod_dir: Path) -> None:
    """Bring ConfigMap and Secret volume files up to date in a running pod.

    Each file is replaced by a rename inside its directory: the containers
    bind-mount the directory, so they see the new file whole, never half.
    """
    for f in pod.files:
        if f.directory:  # an emptyDir: its content is the pod's
            continue
        path = pod_dir / f.path
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.new")
        tmp.write_bytes(f.content)
        _own(tmp, f.mode, pod.fs_group)
        tmp.replace(path)


def processes() -> list[tuple[int, list[str]]]:
    """Every process of this host as (pid, argv), kernel threads (no argv) and processes that
    ended while being read left out."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if raw:
            out.append((int(entry.name), raw.decode(errors="surrogateescape").split("\0")[:-1]))
    return out


def tree_bytes(root: Path) -> int:
    """The bytes of the regular files under ``root`` (links not followed)."""
    return sum(f.lstat().st_size for f in root.rglob("*") if not f.is_symlink() and f.is_file())


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (the state first), or None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat.rsplit(")", 1)[1].split()


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z"


#: /proc/PID/stat's flags: a kernel thread, which has no command line at all.
PF_KTHREAD = 0x00200000
#: How long a live process's command line may read empty while it execs.
EXEC_SETTLE = 2.0


def cmdline(pid: int, settle: float = EXEC_SETTLE) -> list[bytes]:
    """The arguments of a process, [] once it has exited.

    A process that has just been started reads with an empty command line for
    a moment: execve switches the process to the new program's memory (its
    parent's fork or vfork returns then, and its close-on-exec pipe closes)
    before it places the arguments there, and /proc/PID/cmdline reads them
    from that memory. A live process other than a kernel thread that reads
    empty is read again, for up to ``settle`` seconds, rather than taken for
    one that is not what it was started as."""
    deadline = time.monotonic() + settle
    while True:
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError):
            return []
        if raw:
            return raw.split(b"\0")[:-1] if raw.endswith(b"\0") else raw.split(b"\0")
        stat = _stat(pid)
        if stat is None or stat[0] in ("Z", "X") or int(stat[6]) & PF_KTHREAD or time.monotonic() >= deadline:
            return []
        time.sleep(0.005)


def network_probe(pod: PodPlan, c: ContainerPlan) -> bool | None:
    """A container's tcpSocket or httpGet readiness probe, run once against the
    pod's address; None when it has neither."""
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
