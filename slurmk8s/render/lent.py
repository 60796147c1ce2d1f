"""The Slurm side of a lent node: what its slurmd registers with. Pure.

A Kubernetes GPU node lent to a partition runs one slurmd pod. Its Slurm node
is named like the Kubernetes node, and it joins the partition by registering
with the partition's lent-node feature (``slurmd -Z --conf "... Feature=lent_<partition>"``),
so slurm.conf needs no change per node.

Which devices the node's GPUs are is known only in its pod (the device plugin
hands over the host's own /dev/nvidiaN), and a node whose gres.conf does not
name them reports no GPUs (slurmctld then marks it INVAL). So a GPU slurmd
does not fetch its config (configless): it runs with the cluster's config
files and a gres.conf of its own (:func:`.config.gpu_gres_conf`) that its
entrypoint completes with its devices
(``slurmd -Z -N <node> -f <dir>/slurm.conf --conf <conf>``). Checked against
Slurm 22.05: the node registers with its GPUs and jobs get CUDA_VISIBLE_DEVICES.

A node lent while pods run on it (a policy's ``minFreeGpus``) registers with
what they leave: its free GPUs, and its allocatable cpu and memory less what
they request.

Every value that reaches the command line or gres.conf comes from the
Kubernetes Node and its pods and is checked here; a node that cannot be described safely
raises :class:`UnlendableNode`, and is not lent.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from ..api.cluster import lent_nodeset
from ..api.fields import SLURM_NAME_RE, parse_quantity
from ..slurm.client import NODE_NAME
from .config import dynamic_node_conf, gpu_gres_conf
from .names import is_worker_node_name

__all__ = ["GPU_RESOURCE", "GPU_PRODUCT_LABEL", "MAX_GPUS", "LentNode", "UnlendableNode", "lent_node"]

#: The extended resource the NVIDIA device plugin advertises.
GPU_RESOURCE = "nvidia.com/gpu"
#: The node label (set by NVIDIA's GPU feature discovery) that names the GPU model.
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
#: GRES type when the node does not say which GPU it has.
DEFAULT_GPU_TYPE = "gpu"
MAX_GPUS = 64

_SLURM_NAME = re.compile(SLURM_NAME_RE)


class UnlendableNode(ValueError):
    """The Kubernetes node cannot be described to Slurm; the message says why."""


@dataclass(frozen=True)
class LentNode:
    """How a lent node registers with Slurm."""

    #: Slurm node name: the Kubernetes node's name.
    name: str
    partition: str
    cpus: int
    memory_mib: int
    gpus: int
    #: GRES type users ask for: ``--gpus=<gpu_type>:N``.
    gpu_type: str
    #: ``slurmd -Z --conf`` value.
    conf: str
    #: The gres.conf the node's slurmd reads, its devices left to the entrypoint (:func:`.config.gpu_gres_conf`).
    gres_conf: str


def _whole(resources: Mapping[str, str], key: str, node: str, scale: float = 1) -> int:
    raw = resources.get(key)
    if raw is None:
        raise UnlendableNode(f"node {node} reports no allocatable {key}")
    try:
        value = parse_quantity(str(raw)) / scale
    except (ValueError, KeyError) as exc:
        raise UnlendableNode(f"node {node}: allocatable {key} {raw!r} is not a quantity") from exc
    if not math.isfinite(value) or value < 1:
        raise UnlendableNode(f"node {node}: {key} {raw!r} left for Slurm (allocatable less what its pods request) "
                             "is less than one whole unit")
    return int(value)


def gpu_type(labels: Mapping[str, str], label: str = GPU_PRODUCT_LABEL) -> str:
    """The GRES type of a node: its GPU product label if that is a safe Slurm
    name (e.g. ``NVIDIA-H100-80GB-HBM3``), else ``gpu``."""
    value = labels.get(label, "")
    if value and len(value) <= 64 and _SLURM_NAME.fullmatch(value):
        return value
    return DEFAULT_GPU_TYPE


def lent_node(
    cluster: str,
    node: str,
    resources: Mapping[str, str],
    labels: Mapping[str, str],
    partition: str,
) -> LentNode:
    """Describe Kubernetes node ``node`` to Slurm as a node lent to ``partition``.

    ``resources`` is what of the node is lent (cpu, memory, nvidia.com/gpu:
    the Node's ``status.allocatable`` less what its other pods request,
    :meth:`slurmk8s.bridge.world.World.lendable`); ``labels`` its labels.
    Raises :class:`UnlendableNode`.
    """
    if not NODE_NAME.fullmatch(node):
        raise UnlendableNode(
            f"node name {node!r} cannot be a Slurm node name (letters, digits, '_', '.' and '-', "
            "at most 128 characters)"
        )
    if is_worker_node_name(cluster, node):
        raise UnlendableNode(
            f"node name {node!r} has the shape of the names of cluster {cluster}'s own Slurm nodes "
            f"(<cluster>-<node set>-<ordinal>): two slurmd could register under one name"
        )
    if len(partition) > 64 or not _SLURM_NAME.fullmatch(partition):
        raise UnlendableNode(f"partition {partition!r} is not a Slurm partition name")
    cpus = _whole(resources, "cpu", node)
    memory = _whole(resources, "memory", node, scale=2**20)
    gpus = _whole(resources, GPU_RESOURCE, node)
    if gpus > MAX_GPUS:
        raise UnlendableNode(f"node {node} has {gpus} GPUs; at most {MAX_GPUS} per node are supported")
    kind = gpu_type(labels)
    feature = lent_nodeset(partition)
    conf = dynamic_node_conf(cpus=cpus, memory_mib=memory, gpus=gpus, gpu_type=kind, features=[feature])
    return LentNode(node, partition, cpus, memory, gpus, kind, conf, gpu_gres_conf(cluster, kind))
