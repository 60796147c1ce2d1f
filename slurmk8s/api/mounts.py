"""Where a spec may mount a volume in a Slurm pod: not at, inside or over a system directory
the images use, and not one mount inside another. Pure; shared storage
(``spec.sharedStorage``) and the pod templates (:mod:`.podtemplate`) are judged by it.
"""

from __future__ import annotations

__all__ = ["RESERVED_MOUNTS", "system_mount_problem", "nested", "overlap"]

#: System directories: a volume may be mounted neither over one, nor
#: under one, nor over a parent of one (a mount at /var hides /var/spool).
#: /opt holds the agent's own install (/opt/slurmk8s). The mounts slurmk8s
#: makes itself are all inside one (/etc/slurm, /run/slurmk8s/..., /dev/shm,
#: /var/lib/sss/...).
RESERVED_MOUNTS = (
    "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/proc",
    "/root", "/run", "/sbin", "/sys", "/usr", "/var/cache", "/var/lib", "/var/log", "/var/run",
    "/var/spool",
)


def system_mount_problem(path: str) -> str | None:
    """Why a volume may not be mounted at ``path`` (an absolute path in normal form), or None."""
    for reserved in RESERVED_MOUNTS:
        if path == "/" or path == reserved or path.startswith(reserved + "/"):
            return "is a system directory the images use" if path in ("/", reserved) else \
                f"is inside the system directory {reserved}"
        if reserved.startswith(path + "/"):
            return f"contains the system directory {reserved}, which the mount would hide"
    return None


def nested(a: str, b: str) -> bool:
    """Whether one of two mount paths is inside the other (not the same)."""
    return a.startswith(b + "/") or b.startswith(a + "/")


def overlap(a: str, b: str) -> bool:
    """Whether two mount paths are the same or one is inside the other: the later mount hides
    the earlier, or what it holds."""
    return a == b or nested(a, b)
