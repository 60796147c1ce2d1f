"""The one facade that talks to Slurm (see :mod:`.client`) and the records it returns."""

from .client import DRAIN_PREFIX, NotOurDrain, Runner, SlurmClient, SlurmError, local_runner
from .model import Job, Node

__all__ = ["SlurmClient", "SlurmError", "NotOurDrain", "Runner", "local_runner", "Node", "Job", "DRAIN_PREFIX"]
