"""A container of a sandbox pod as an OCI runtime bundle's ``config.json``, for runc. Pure.

``container_spec`` turns what the kubelet planned for a container
(``plan.ContainerPlan``), the image's config (``images.ImageConfig``) and
what the runtime set up on the host (the pod's network namespace, its pause
container's namespaces, the overlay root, the volumes' host paths) into the
runtime spec runc runs; ``pause_spec`` is the pod's pause container, which
holds the UTS, IPC and PID namespaces its containers share. Nothing here
touches the file system: the image's /etc/passwd and /etc/group come in as
text.

What Kubernetes (with containerd) gives a container, and so this does:
- process: ``command``/``args`` over the image's Entrypoint/Cmd, the image's
  Env then the container's, WorkingDir, and the user from
  ``runAsUser``/``runAsGroup`` else the image's ``User``, with the groups
  /etc/group gives that user plus ``supplementalGroups``/``fsGroup``;
- capabilities: containerd's default set, ``add``/``drop`` over it, all of
  them when ``privileged``; ``allowPrivilegeEscalation: false`` sets
  noNewPrivileges;
- mounts: /proc, /sys (read-only unless privileged), the container's own
  cgroups at /sys/fs/cgroup (read-only), /dev with the usual devices,
  devpts, /dev/shm, mqueue, the sandbox's /etc/hosts, the pod's
  /etc/hostname, and the pod's volumes as bind mounts (runc resolves every
  destination inside the root, never through a link into the host);
- devices: the pod's GPUs under their host numbers, with the driver's
  control devices and ``NVIDIA_VISIBLE_DEVICES`` (:mod:`.gpus`), allowed in
  the devices cgroup, everything else denied but runc's defaults (all
  allowed when privileged);
- resources: the memory limit, and the CPU limit as a CFS quota.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

from . import gpus as gpu_devices
from .apiserver.quantity import parse as parse_quantity
from .images import ImageConfig, ImageError, Process, container_process, resolve_user
from .plan import ContainerPlan, Mount

OCI_VERSION = "1.0.2-dev"
CPU_PERIOD = 100_000
SHM_SIZE = 64 * 2**20

#: containerd's default capabilities (what a Kubernetes container gets unless it adds or drops).
DEFAULT_CAPS = ("CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
                "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
                "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE")
#: Every capability Linux 5.9+ knows: what a privileged container gets.
ALL_CAPS = ("CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
            "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE", "CAP_NET_BIND_SERVICE",
            "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK", "CAP_IPC_OWNER",
            "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE", "CAP_SYS_PACCT",
            "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE", "CAP_SYS_RESOURCE", "CAP_SYS_TIME",
            "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE", "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL",
            "CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG", "CAP_WAKE_ALARM",
            "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE")
#: Paths of /proc and /sys a container does not see or cannot write (runc's and containerd's defaults).
MASKED_PATHS = ("/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
                "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware")
READONLY_PATHS = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")
#: runc creates null, zero, full, random, urandom, tty, ptmx itself and allows them.
#: What stands in ``container_spec``'s namespace paths for the pause's PID until it runs (``runcshim``).
PAUSE_PLACEHOLDER = "@PAUSE@"
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class SpecError(ValueError):
    """A container this runtime cannot run as specified; the message says what to change."""


@dataclass(frozen=True)
class Namespaces:
    """Where a container's namespaces come from: the pod's network namespace (a
    bind mount under /var/run/netns) and the pause container's process, whose
    UTS, IPC and PID namespaces the pod's containers share."""

    net: str  # /var/run/netns/<pod>
    pause_pid: int | str  # a PID, or a placeholder the runtime fills in once the pause runs


def capability(name: str) -> str:
    """``NET_ADMIN`` or ``CAP_NET_ADMIN`` -> ``CAP_NET_ADMIN``; refuses names Linux does not have."""
    cap = name.upper()
    cap = cap if cap.startswith("CAP_") else f"CAP_{cap}"
    if cap not in ALL_CAPS and name.upper() != "ALL":
        raise SpecError(f"securityContext.capabilities names {name!r}, which is not a Linux capability "
                        "(use names such as NET_ADMIN or SYS_PTRACE)")
    return cap


def capabilities(security: Mapping, uid: int) -> dict[str, list[str]]:
    """The capability sets: containerd's defaults with ``add``/``drop``, all when privileged.
    A non-root process keeps them only in its bounding set, as with containerd."""
    if security.get("privileged"):
        caps = list(ALL_CAPS)
    else:
        spec = security.get("capabilities") or {}
        drop = [c.upper() for c in spec.get("drop") or []]
        add = [c.upper() for c in spec.get("add") or []]
        caps = [] if "ALL" in drop else [c for c in DEFAULT_CAPS if c not in {capability(d) for d in drop}]
        added = list(ALL_CAPS) if "ALL" in add else [capability(a) for a in add]
        caps += [c for c in added if c not in caps]
    effective = caps if uid == 0 else []
    return {"bounding": caps, "effective": effective, "permitted": effective, "inheritable": [],
            "ambient": []}


def groups_of(user: str, uid: int, gid: int, group_text: str, extra: Sequence[int] = ()) -> list[int]:
    """Supplementary groups: those /etc/group lists ``user`` (the name ``uid`` has) in, then ``extra``."""
    out: list[int] = []
    for line in group_text.splitlines():
        fields = line.split(":")
        if len(fields) >= 4 and user and user in fields[3].split(",") and fields[2].isdigit():
            out.append(int(fields[2]))
    out += [int(g) for g in extra]
    return [g for i, g in enumerate(out) if g != gid and g not in out[:i]]


def user_name(uid: int, passwd_text: str) -> str:
    for line in passwd_text.splitlines():
        fields = line.split(":")
        if len(fields) >= 3 and fields[2] == str(uid):
            return fields[0]
    return ""


def process(c: ContainerPlan, image: ImageConfig, hostname: str, passwd: str, group: str
            ) -> tuple[Process, int, int, list[int]]:
    """The container's process with its user resolved to numbers: (process, uid, gid, extra groups)."""
    sec = c.security
    env = [("HOSTNAME", hostname), *c.env.items()]
    try:
        proc = container_process(image, command=c.command, args=c.container_args, env=env,
                                 run_as_user=sec.get("runAsUser"), run_as_group=sec.get("runAsGroup"))
        uid, gid = resolve_user(proc.user, passwd, group)
    except ImageError as exc:
        raise SpecError(f"container {c.name}: {exc}") from None
    if sec.get("runAsNonRoot") and uid == 0:
        raise SpecError(f"container {c.name} has runAsNonRoot but would run as root (uid 0): set runAsUser, "
                        "or give the image a non-root USER")
    if not any(e.startswith("PATH=") for e in proc.env):
        proc = Process(proc.argv, (PATH_ENV, *proc.env), proc.cwd, proc.user)
    extra = [*(sec.get("supplementalGroups") or []), *([sec["fsGroup"]] if "fsGroup" in sec else [])]
    return proc, uid, gid, groups_of(user_name(uid, passwd), uid, gid, group, extra)


def _quantity(value, what: str) -> Decimal:
    try:
        return parse_quantity(value)
    except ValueError as exc:
        raise SpecError(f"{what}: {exc}") from None


def resources(res: Mapping) -> dict:
    """``linux.resources`` of the container's limits: memory in bytes, CPU as a CFS quota per period."""
    limits = res.get("limits") or {}
    out: dict = {}
    if "memory" in limits:
        out["memory"] = {"limit": int(_quantity(limits["memory"], "resources.limits.memory"))}
    if "cpu" in limits:
        quota = int(_quantity(limits["cpu"], "resources.limits.cpu") * CPU_PERIOD)
        out["cpu"] = {"quota": max(quota, 1000), "period": CPU_PERIOD}
    return out


def _bind(source: str, target: str, read_only: bool) -> dict:
    return {"destination": target, "type": "bind", "source": source,
            "options": ["rbind", "rprivate", "ro" if read_only else "rw"]}


def base_mounts(privileged: bool, shm_size: int = SHM_SIZE) -> list[dict]:
    return [
        {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
         "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
         "options": ["nosuid", "noexec", "nodev", "mode=1777", f"size={shm_size}"]},
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs",
         "options": ["nosuid", "noexec", "nodev", "rw" if privileged else "ro"]},
        # The container's own cgroups (runc mounts each hierarchy of cgroup v1):
        # slurmd looks for a cgroup file system here even with proctrack/linuxproc.
        {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
         "options": ["nosuid", "noexec", "nodev", "relatime", "rw" if privileged else "ro"]},
    ]


def volume_mounts(mounts: Sequence[Mount]) -> list[dict]:
    """The pod's volumes: sources are host paths the runtime made absolute; a Memory emptyDir is a tmpfs."""
    out = []
    for m in mounts:
        if m.kind == "tmpfs":
            opts = ["nosuid", "nodev", f"mode={m.mode or '1777'}"]
            if m.size:
                opts.append(f"size={m.size}")
            if m.read_only:
                opts.append("ro")
            out.append({"destination": m.target, "type": "tmpfs", "source": "tmpfs", "options": opts})
        elif m.kind in ("bind", "file"):
            if not m.source.startswith("/"):
                raise SpecError(f"volume source {m.source!r} for {m.target} is not an absolute host path")
            out.append(_bind(m.source, m.target, m.read_only))
        else:
            raise SpecError(f"mount kind {m.kind!r} for {m.target} is not one the runc runtime runs")
    return out


def _merge_mounts(base: list[dict], extra: list[dict]) -> list[dict]:
    """``extra`` after ``base``; an extra at the same destination replaces the base one (an emptyDir at /dev/shm)."""
    targets = {m["destination"].rstrip("/") for m in extra}
    return [m for m in base if m["destination"] not in targets] + extra


def devices(gpus: Sequence[int], privileged: bool) -> tuple[list[dict], list[dict]]:
    """(``linux.devices``, ``linux.resources.devices``): the GPUs' nodes under
    their host numbers (:mod:`.gpus`) and the devices cgroup rules."""
    nodes = gpu_devices.device_nodes(gpus)
    if privileged:
        return nodes, [{"allow": True, "access": "rwm"}]
    return nodes, [{"allow": False, "access": "rwm"}, *gpu_devices.cgroup_rules(gpus)]


def container_spec(c: ContainerPlan, image: ImageConfig, *, root: str, hostname: str, ns: Namespaces,
                   hosts_file: str, hostname_file: str, mounts: Sequence[Mount], gpus: Sequence[int],
                   cgroups_path: str, passwd: str = "", group: str = "") -> dict:
    """runc's config.json for one container of a pod.

    ``root`` is the merged directory of the container's overlay (image
    rootfs below, the container's writable layer above); ``mounts`` are the
    container's volumes with absolute host sources; ``passwd``/``group`` the
    text of the image's /etc/passwd and /etc/group; ``gpus`` the host numbers
    of the GPUs the kubelet gave the container."""
    sec = c.security
    privileged = bool(sec.get("privileged"))
    proc, uid, gid, extra = process(c, image, hostname, passwd, group)
    nodes, rules = devices(gpus, privileged)
    shm = next((m.size or SHM_SIZE for m in mounts if m.target.rstrip("/") == "/dev/shm"), SHM_SIZE)
    own = [_bind(hosts_file, "/etc/hosts", True), _bind(hostname_file, "/etc/hostname", True)]
    linux: dict = {
        "namespaces": [
            {"type": "network", "path": ns.net},
            {"type": "uts", "path": f"/proc/{ns.pause_pid}/ns/uts"},
            {"type": "ipc", "path": f"/proc/{ns.pause_pid}/ns/ipc"},
            {"type": "pid", "path": f"/proc/{ns.pause_pid}/ns/pid"},
            {"type": "mount"},
        ],
        "devices": nodes,
        "resources": {"devices": rules, **resources(c.resources)},
        "cgroupsPath": cgroups_path,
    }
    if not privileged:
        linux["maskedPaths"] = list(MASKED_PATHS)
        linux["readonlyPaths"] = list(READONLY_PATHS)
    return {
        "ociVersion": OCI_VERSION,
        "process": {
            "terminal": False,
            "user": {"uid": uid, "gid": gid, **({"additionalGids": extra} if extra else {})},
            "args": list(proc.argv),
            "env": _with_gpus(proc.env, gpus),
            "cwd": proc.cwd,
            "capabilities": capabilities(sec, uid),
            "noNewPrivileges": sec.get("allowPrivilegeEscalation") is False and not privileged,
        },
        "root": {"path": root, "readonly": bool(sec.get("readOnlyRootFilesystem"))},
        "mounts": _merge_mounts(base_mounts(privileged, shm), [*own, *volume_mounts(mounts)]),
        "linux": linux,
    }


def _with_gpus(env: Sequence[str], gpus: Sequence[int]) -> list[str]:
    """``env`` with the device plugin's ``NVIDIA_VISIBLE_DEVICES``, which wins over the image's and the pod's."""
    if not gpus:
        return list(env)
    name = gpu_devices.VISIBLE_ENV
    return [*(e for e in env if not e.startswith(f"{name}=")), f"{name}={gpu_devices.visible_devices(gpus)}"]


def pause_spec(*, root: str, hostname: str, net: str, cgroups_path: str) -> dict:
    """The pod's pause container: PID 1 of the pod's PID namespace (it reaps
    what the containers orphan), in new UTS and IPC namespaces with the pod's
    host name, on the pod's network; unprivileged, on the image's root read-only."""
    return {
        "ociVersion": OCI_VERSION,
        "process": {
            "terminal": False, "user": {"uid": 0, "gid": 0}, "cwd": "/", "env": [PATH_ENV],
            # dash waits with waitpid(-1): every orphan that ends is reaped.
            "args": ["/bin/sh", "-c", 'trap "exit 0" TERM INT; while :; do sleep 86400 & wait $!; done'],
            "capabilities": {k: ["CAP_KILL"] if k in ("bounding", "effective", "permitted") else []
                             for k in ("bounding", "effective", "permitted", "inheritable", "ambient")},
            "noNewPrivileges": True,
        },
        "root": {"path": root, "readonly": True},
        "hostname": hostname,
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "mode=755"]},
        ],
        "linux": {
            "namespaces": [{"type": "network", "path": net}, {"type": "uts"}, {"type": "ipc"}, {"type": "pid"},
                           {"type": "mount"}],
            "resources": {"devices": [{"allow": False, "access": "rwm"}]},
            "cgroupsPath": cgroups_path,
            "maskedPaths": list(MASKED_PATHS),
            "readonlyPaths": list(READONLY_PATHS),
        },
    }
