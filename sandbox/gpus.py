"""GPUs as the NVIDIA device plugin and container toolkit hand them to pods. Pure.

A GPU node of the sandbox has ``count`` devices, ``/dev/nvidia0`` to
``/dev/nvidiaN-1`` (major 195, minor = the GPU's number on the host). The
kubelet gives a pod that asks for ``nvidia.com/gpu: k`` the lowest ``k``
devices no other pod on that node holds, for as long as the pod exists, and
the pod sees them under the host's own numbers, as the device plugin and the
toolkit do on a real node: a pod given GPUs 4-7 of an 8-GPU node has
``/dev/nvidia4``..``/dev/nvidia7`` and no ``/dev/nvidia0``. With them come
the driver's control devices (``/dev/nvidiactl``, ``/dev/nvidia-uvm``,
``/dev/nvidia-uvm-tools``) and ``NVIDIA_VISIBLE_DEVICES``, the GPUs' numbers
as the toolkit sets it.

What a real pod given one H100 saw (``hack/gpu-facts.sh``): ``/dev/nvidia0``
195:0, ``/dev/nvidiactl`` 195:255, ``/dev/nvidia-uvm`` 238:0,
``/dev/nvidia-uvm-tools`` 238:1 and ``NVIDIA_VISIBLE_DEVICES=0``. The
nvidia-uvm major is given out by the kernel when the driver loads (see
/proc/devices); the sandbox uses the one seen there.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["NVIDIA_MAJOR", "UVM_MAJOR", "Unavailable", "allocate", "device_nodes", "cgroup_rules",
           "visible_devices", "VISIBLE_ENV"]

NVIDIA_MAJOR = 195
CTL_MINOR = 255
UVM_MAJOR = 238
VISIBLE_ENV = "NVIDIA_VISIBLE_DEVICES"


class Unavailable(Exception):
    """Fewer free devices than a pod asks for: the kubelet refuses the pod, as a real one does."""


def allocate(total: int, taken: Iterable[int], wanted: int) -> tuple[int, ...]:
    """The ``wanted`` lowest free device numbers of a node of ``total``
    devices, ``taken`` held by its other pods. Raises :class:`Unavailable`
    with the kubelet's own words."""
    held = set(taken)
    free = [i for i in range(total) if i not in held]
    if wanted > len(free):
        raise Unavailable(f"Allocate failed due to requested number of devices unavailable for nvidia.com/gpu. "
                          f"Requested: {wanted}, Available: {len(free)}, which is unexpected")
    return tuple(free[:wanted])


def _char(path: str, major: int, minor: int) -> dict:
    return {"path": path, "type": "c", "major": major, "minor": minor, "fileMode": 0o666, "uid": 0, "gid": 0}


def device_nodes(gpus: Sequence[int]) -> list[dict]:
    """runc's ``linux.devices`` for a container given ``gpus``: each GPU under
    its host number, and the driver's control devices (none without GPUs)."""
    if not gpus:
        return []
    return [*(_char(f"/dev/nvidia{i}", NVIDIA_MAJOR, i) for i in gpus),
            _char("/dev/nvidiactl", NVIDIA_MAJOR, CTL_MINOR),
            _char("/dev/nvidia-uvm", UVM_MAJOR, 0), _char("/dev/nvidia-uvm-tools", UVM_MAJOR, 1)]


def cgroup_rules(gpus: Sequence[int]) -> list[dict]:
    """The devices cgroup rules that let the container use exactly those devices."""
    return [{"allow": True, "type": "c", "major": d["major"], "minor": d["minor"], "access": "rwm"}
            for d in device_nodes(gpus)]


def visible_devices(gpus: Sequence[int]) -> str:
    """``NVIDIA_VISIBLE_DEVICES``: the GPUs' numbers, comma separated."""
    return ",".join(str(i) for i in gpus)
