"""Pure rendering: a SlurmCluster in, Slurm config text and Kubernetes objects out."""

from .config import TopologyNode, config_files, config_hash
from .keys import ClusterKeys
from .manifests import node_conf, render

__all__ = ["render", "config_files", "config_hash", "node_conf", "ClusterKeys", "TopologyNode"]
