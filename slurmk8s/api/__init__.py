"""The typed API (SlurmCluster and NodeLendingPolicy, group slurmk8s.dev/v1alpha1) and its CRD generator."""

from .cluster import API_VERSION, GROUP, KIND, PLURAL, VERSION, SlurmCluster
from .errors import FieldError, InvalidSpec
from .lending import NodeLendingPolicy
from .policy import load_policy
from .storageclass import with_storage_class
from .validate import load_cluster

__all__ = [
    "API_VERSION", "GROUP", "KIND", "PLURAL", "VERSION",
    "SlurmCluster", "NodeLendingPolicy", "FieldError", "InvalidSpec", "load_cluster", "load_policy",
    "with_storage_class",
]
