"""The typed API (SlurmCluster, group slurmk8s.dev/v1alpha1) and its CRD generator."""

from .cluster import API_VERSION, GROUP, KIND, PLURAL, VERSION, SlurmCluster
from .errors import FieldError, InvalidSpec
from .validate import load_cluster

__all__ = [
    "API_VERSION", "GROUP", "KIND", "PLURAL", "VERSION",
    "SlurmCluster", "FieldError", "InvalidSpec", "load_cluster",
]
