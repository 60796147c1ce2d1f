"""The one facade that talks to Slurm (see :mod:`.client`), the interface the
controllers use (:mod:`.control`), the agent that serves it beside slurmctld
(:mod:`.agent`) and its client (:mod:`.remote`)."""

from .client import DRAIN_PREFIX, NotOurDrain, Runner, SlurmClient, SlurmError, local_runner
from .control import SlurmControl
from .model import Job, Node
from .remote import AgentError, AgentUnauthorized, AgentUnreachable, RemoteSlurm

__all__ = [
    "SlurmClient", "SlurmError", "NotOurDrain", "Runner", "local_runner", "Node", "Job", "DRAIN_PREFIX",
    "SlurmControl", "RemoteSlurm", "AgentError", "AgentUnreachable", "AgentUnauthorized",
]
