"""Prometheus metrics of the bridge (served on --metrics-port at /metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from ..slurm.steps import PER_JOB
from .reasons import REASONS

__all__ = ["ROUNDS", "ROUND_SECONDS", "ACTIONS", "NODES", "POLICY_NODES", "LEND_SECONDS", "RECLAIM_SECONDS",
           "JOBS", "RECLAIMS_OVERDUE", "SLURM_READS", "PENDING_GPU_PODS", "ROLLOUTS", "observe_nodes"]

#: Lending and reclaiming take seconds to minutes (a grace period is often 5 minutes).
_LATENCY_BUCKETS = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 3600)

ROUNDS = Counter("slurmk8s_bridge_rounds_total", "Rounds of the bridge's loop, by result (ok; problem: an action "
                 "or a model-version rollout failed and is retried next round; error: a policy's round failed; unsynced: a watch cache was not "
                 "synced, so nothing was decided).", ["result"])
ROUND_SECONDS = Histogram("slurmk8s_bridge_round_seconds", "Duration of one round over every policy.")
ACTIONS = Counter("slurmk8s_bridge_actions_total", "Actions applied, by kind and result (ok, failed).",
                  ["action", "result"])
NODES = Gauge("slurmk8s_bridge_nodes", "GPU nodes by lending state (kubernetes, lending, lent, reclaiming).",
              ["state"])
POLICY_NODES = Gauge("slurmk8s_bridge_policy_nodes", "Nodes a policy holds, by lending state.",
                     ["policy", "state"])
LEND_SECONDS = Histogram("slurmk8s_bridge_lend_seconds", "From the start of lending (node tainted, slurmd pod "
                         "created) to the node registered in Slurm and marked lent.", buckets=_LATENCY_BUCKETS)
RECLAIM_SECONDS = Histogram("slurmk8s_bridge_reclaim_seconds", "From the start of a reclaim to the node handed "
                            "back to Kubernetes, by reason (demand, window, slurmd-lost, ...).", ["reason"],
                            buckets=_LATENCY_BUCKETS)
JOBS = Counter("slurmk8s_bridge_jobs_total", "Slurm jobs on reclaimed nodes that were signalled, requeued, "
               "cancelled, or made eligible at once after they requeued themselves (started-now).", ["outcome"])

RECLAIMS_OVERDUE = Counter("slurmk8s_bridge_reclaims_overdue_total", "Nodes handed back to Kubernetes whatever "
                           "Slurm said, because their reclaim passed gracePeriodSeconds + reclaim.deadlineSeconds "
                           "(the borrower's Slurm did not answer, or still showed jobs), by policy.", ["policy"])
SLURM_READS = Counter("slurmk8s_bridge_slurm_reads_total", "Reads of a cluster's Slurm in a round, by result: ok, "
                      "error (the agent failed), late (no answer within --slurm-timeout; the cluster's policies "
                      "were decided with Slurm unknown), busy (a late read still running: not asked again).",
                      ["result"])


# Every outcome and reclaim reason has its series from the start, at zero: a series born at its
# first event would hide that event from increase() and rate(), and so from the dashboards.
for _outcome in ("signalled", *(counted for _, counted, _ in PER_JOB.values())):
    JOBS.labels(_outcome)
for _reason in REASONS:
    RECLAIM_SECONDS.labels(_reason)

ROLLOUTS = Counter("slurmk8s_bridge_rollouts_total", "Serving Deployments by what a round's model-version rollout "
                   "did: rolled (to a newly published version), failed (LATEST unread or the patch failed: "
                   "retried next round), invalid (a model-dir annotation refused).", ["result"])
for _result in ("rolled", "failed", "invalid"):
    ROLLOUTS.labels(_result)

PENDING_GPU_PODS = Gauge("slurmk8s_bridge_pending_gpu_pods", "Kubernetes pods that ask for GPUs and wait for a "
                         "node (Pending, not yet placed): the demand that reclaims lent nodes.")


def observe_nodes(policy: str, m) -> None:
    """Set the node gauges from :func:`slurmk8s.bridge.nodecounts.lending_metrics`; the
    policy's overdue-reclaim counter exists from here on, at zero until one is overdue."""
    RECLAIMS_OVERDUE.labels(policy)
    for state, count in m.by_state.items():
        NODES.labels(state).set(count)
    PENDING_GPU_PODS.set(m.pending_gpu_pods)
    for state, count in m.by_policy.get(policy, {"lending": 0, "lent": 0, "reclaiming": 0}).items():
        POLICY_NODES.labels(policy, state).set(count)
