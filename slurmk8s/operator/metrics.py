"""Prometheus metrics of the operator (served on --metrics-port at /metrics)."""

from __future__ import annotations

from collections import Counter as Tally
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from slurmk8s.metricsserver import serve_metrics
from slurmk8s.slurm.model import unhealthy

__all__ = ["RECONCILES", "ROUND_SECONDS", "CLUSTER_READY", "CLUSTER_NODES", "CLUSTER_UNHEALTHY", "observe_cluster",
           "forget_cluster", "serve"]

RECONCILES = Counter("slurmk8s_operator_rounds_total", "Rounds run for SlurmClusters, by result "
                     "(ok, problem: something could not be applied, error: the round failed).", ["result"])
ROUND_SECONDS = Histogram("slurmk8s_operator_round_seconds", "Duration of one round for one SlurmCluster.")
for _result in ("ok", "problem", "error"):  # each from the start, at zero: increase() sees the first
    RECONCILES.labels(_result)
CLUSTER_READY = Gauge("slurmk8s_cluster_ready", "1 when the SlurmCluster's Ready condition is True.",
                      ["namespace", "cluster"])
CLUSTER_NODES = Gauge("slurmk8s_cluster_nodes", "Slurm nodes of the SlurmCluster by state (status.nodeCounts).",
                      ["namespace", "cluster", "state"])
CLUSTER_UNHEALTHY = Gauge("slurmk8s_cluster_unhealthy_nodes", "Slurm nodes the health check drained, by the check "
                          "they failed (gpus, munge, sharedStorage, disk, memory, or a site check's name).",
                          ["namespace", "cluster", "check"])
_STATES = ("idle", "mixed", "allocated", "drain", "down", "other")
#: The checks each cluster's unhealthy-node gauge has a series for, to zero them once they pass.
_CHECKS: dict[tuple[str, str], set[str]] = {}


def observe_cluster(namespace: str, cluster: str, outcome: Any) -> None:
    st = outcome.status
    if st is None:
        return
    CLUSTER_READY.labels(namespace, cluster).set(1 if st.phase == "Ready" else 0)
    counts = st.node_counts
    for state in _STATES:
        CLUSTER_NODES.labels(namespace, cluster, state).set(getattr(counts, state))
    if outcome.nodes is not None:
        failing = Tally(unhealthy(outcome.nodes).values())
        known = _CHECKS.setdefault((namespace, cluster), set())
        known |= set(failing)
        for check in known:
            CLUSTER_UNHEALTHY.labels(namespace, cluster, check).set(failing.get(check, 0))


def forget_cluster(namespace: str, cluster: str) -> None:
    checks = [(c,) for c in _CHECKS.pop((namespace, cluster), ())]
    for gauge, extra in ((CLUSTER_READY, [()]), (CLUSTER_NODES, [(s,) for s in _STATES]),
                         (CLUSTER_UNHEALTHY, checks)):
        for labels in extra:
            try:
                gauge.remove(namespace, cluster, *labels)
            except KeyError:
                pass


def serve(port: int, addr: str = "0.0.0.0") -> None:
    serve_metrics(port, addr)
