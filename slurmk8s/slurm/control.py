"""What the operator and the bridge may do to Slurm: one interface, two ends.

:class:`SlurmControl` is the narrow set of operations slurmk8s's controllers
use. :class:`~.client.SlurmClient` implements it by running the Slurm
commands (beside slurmctld, in the agent); :class:`~.remote.RemoteSlurm`
implements it by asking that agent over HTTP. The safety rules (prefixed
drains, never clearing someone else's drain, checked names, reasons and
signals) are enforced once, in ``SlurmClient``, on the agent's side; the
remote end only carries the calls and maps the refusals back to the same
exceptions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from .accounting import Associations
from .directory import Verdict
from .model import Job, Node
from .reservations import Reservation

__all__ = ["SlurmControl", "OPERATIONS", "AGENT_PORT", "METRICS_PORT"]

#: The port the agent serves these operations on, beside slurmctld (the
#: agent, its Service and NetworkPolicy, and `slurmk8s agent --listen`).
AGENT_PORT = 6830
#: The port the agent serves Slurm's metrics on (``GET /metrics``, no token: slurm/metrics.py).
METRICS_PORT = 6831


@runtime_checkable
class SlurmControl(Protocol):
    def ping(self) -> bool:
        """True when slurmctld answers."""

    def nodes(self) -> list[Node]:
        """Every node slurmctld knows, by name. Raises when Slurm cannot be asked."""

    def node(self, name: str) -> Node | None:
        """The node, or None when Slurm has no such node. Raises when Slurm cannot be asked."""

    def jobs(self, nodes: Sequence[str] = (), *, checkpoints: bool = False) -> list[Job]:
        """Jobs Slurm still tracks; with ``nodes``, only those allocated there; with
        ``checkpoints``, each running job's last checkpoint time where the checkpoint
        layer shows one (``Job.checkpoint_time``, for the reclaim order)."""

    def drain(self, name: str, reason: str) -> None:
        """Drain a node; the reason Slurm shows is ``slurmk8s: <reason>``."""

    def set_down(self, name: str, reason: str) -> None:
        """Mark a node DOWN (its slurmd is gone); the reason Slurm shows is ``slurmk8s: <reason>``."""

    def undrain(self, name: str) -> None:
        """Clear a slurmk8s drain; raises NotOurDrain for anyone else's."""

    def signal_node_jobs(self, name: str, signal: str) -> list[int]:
        """Signal the batch shell of every running job on a node; returns their ids."""

    def requeue(self, job_id: int) -> None:
        """Requeue a job and make it eligible to start again at once."""

    def start_now(self, job_id: int) -> None:
        """Make a pending job eligible now (clears a requeue's begin-time delay)."""

    def cancel(self, job_id: int) -> None:
        """Cancel a job (``scancel``): for jobs that may not be requeued."""

    def delete_node(self, name: str) -> None:
        """Remove a dynamic node record (gone already is fine)."""

    def reservations(self) -> list[Reservation]:
        """The lending reservations (``slurmk8s-lend-<node>``); no other is read."""

    def reserve(self, name: str, start: int) -> None:
        """Make or move the lending reservation on node ``name``: from ``start``
        (POSIX seconds) on, no job starts there; running ones go on."""

    def unreserve(self, name: str) -> None:
        """Remove the lending reservation on node ``name`` (none there is fine)."""

    def reconfigure(self) -> None:
        """``scontrol reconfigure``: slurmctld and the slurmd nodes re-read the config."""

    def config_hash(self) -> str:
        """Hash of the config files slurmctld would read now (the renderer's hash)."""

    def apply_accounting(self, want: Associations) -> list[str]:
        """Add the missing accounts, associations and QOS (sacctmgr); returns the commands run."""

    def directory(self) -> Verdict:
        """The site directory's health as the sssd container beside slurmctld last probed
        it (``spec.identity.ldap``); state ``unknown`` without a recent probe."""

    def published(self, model_dir: str) -> str:
        """The text of ``<model_dir>/LATEST`` on the cluster's shared storage, the
        model version a job published (``slurmk8s/published_model.py``), read
        below the checkpoint root only and never through a link. Raises
        FileNotFoundError when nothing is published there (or no root is known)."""


#: The operations, by name: the agent serves exactly these.
OPERATIONS = (
    "ping", "nodes", "node", "jobs", "drain", "set_down", "undrain", "signal_node_jobs",
    "requeue", "start_now", "cancel", "delete_node", "reservations", "reserve", "unreserve",
    "reconfigure", "config_hash",
    "apply_accounting", "directory", "published",
)
