"""What Slurm does to a job when its node is set DOWN, requeued, cancelled or
deleted: the one model of it, used by the simulator (:mod:`.engine`,
:mod:`.slurmside`) and by the lending tests' world (``tests/lending_sim.py``).

``tests/test_accounting_images.py`` pins every rule here against the real
slurmctld and slurmd of each supported release: each outcome it observes is
the one these functions predict.
"""

from __future__ import annotations

#: The job is pending again under its own id: Slurm requeued it (REQUEUED in
#: sacct, its restart count one higher), and it runs again when scheduled.
REQUEUED = "requeued"
#: The job ended and will not run again (CANCELLED, NODE_FAIL).
ENDED = "ended"


def on_node_down(requeue: bool) -> str:
    """A node set DOWN (``scontrol update state=down``) under a running batch
    job: Slurm kills the job, and requeues it when it may be requeued
    (``JobRequeue=1``, Slurm's default, and not submitted with
    ``--no-requeue``); a job that may not be requeued ends in NODE_FAIL."""
    return REQUEUED if requeue else ENDED


def on_requeue(requeue: bool) -> str | None:
    """``scontrol requeue`` of a running batch job: requeued; None where Slurm
    refuses, for a job submitted with ``--no-requeue`` (the evacuation rule
    cancels such jobs instead, :mod:`slurmk8s.evacuation`)."""
    return REQUEUED if requeue else None


def on_cancel() -> str:
    """``scancel`` of a running job: it ends (CANCELLED)."""
    return ENDED


def may_delete_node(active_jobs: int) -> bool:
    """``scontrol delete nodename=`` of a dynamic node: refused while a job
    is on it ("Requested nodes are busy")."""
    return active_jobs == 0
