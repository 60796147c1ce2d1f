"""Faults the sandbox injects into a running slurmd pod, for the health
checks to find (`slurmk8s sandbox fault`). Pure: the commands; the sandbox
runs them as the host's root in the container's mount namespace (``nsenter
-m``), where the container itself could not (it has no CAP_MKNOD, and its
mounts are its runtime's).

- ``gpu``: the pod's highest-numbered GPU device node disappears, as when a
  GPU falls off the bus (Xid 79) and the driver drops it. Cleared: every
  device node of the pod's GPUs that is missing is made again (major 195,
  the GPU's number as minor, mode 0666).
- ``shared-readonly``: every shared volume in the pod is remounted
  read-only, as an NFS client does after an I/O error with ``errors=remount-ro``
  or a server that exports it read-only. Cleared: read-write again.
"""

from __future__ import annotations

from collections.abc import Sequence

from .gpus import NVIDIA_MAJOR

__all__ = ["KINDS", "fault_commands"]

KINDS = ("gpu", "shared-readonly")


def fault_commands(kind: str, clear: bool, *, gpus: Sequence[int], present: Sequence[int],
                   shared: Sequence[str]) -> list[list[str]]:
    """The commands, to run in the container's mount namespace, that inject
    (or with ``clear``, remove) a fault. ``gpus``: the GPUs the pod was given
    (its ``NVIDIA_VISIBLE_DEVICES``); ``present``: those whose device node it
    has now; ``shared``: its shared volumes' mount paths."""
    if kind == "gpu":
        if not gpus:
            raise ValueError("this pod was given no GPU")
        if clear:
            return [["mknod", "-m", "0666", f"/dev/nvidia{n}", "c", str(NVIDIA_MAJOR), str(n)]
                    for n in sorted(set(gpus) - set(present))]
        if not present:
            raise ValueError("this pod has no GPU device left to take away")
        return [["rm", "-f", f"/dev/nvidia{max(present)}"]]
    if kind == "shared-readonly":
        if not shared:
            raise ValueError("this pod mounts no shared volume")
        mode = "rw" if clear else "ro"
        return [["mount", "-o", f"remount,bind,{mode}", path] for path in shared]
    raise ValueError(f"unknown fault {kind!r}; one of {', '.join(KINDS)}")
