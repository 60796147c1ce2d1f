"""Prometheus metrics of the operator (served on --metrics-port at /metrics)."""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Gauge, Histogram, start_http_server

__all__ = ["RECONCILES", "ROUND_SECONDS", "CLUSTER_READY", "CLUSTER_NODES", "observe_cluster", "forget_cluster",
           "serve"]

RECONCILES = Counter("slurmk8s_operator_rounds_total", "Rounds run for SlurmClusters, by result "
                     "(ok, problem: something could not be applied, error: the round failed).", ["result"])
ROUND_SECONDS = Histogram("slurmk8s_operator_round_seconds", "Duration of one round for one SlurmCluster.")
CLUSTER_READY = Gauge("slurmk8s_cluster_ready", "1 when the SlurmCluster's Ready condition is True.",
                      ["namespace", "cluster"])
CLUSTER_NODES = Gauge("slurmk8s_cluster_nodes", "Slurm nodes of the SlurmCluster by state (status.nodeCounts).",
                      ["namespace", "cluster", "state"])
_STATES = ("idle", "mixed", "allocated", "drain", "down", "other")


def observe_cluster(namespace: str, cluster: str, outcome: Any) -> None:
    st = outcome.status
    if st is None:
        return
    CLUSTER_READY.labels(namespace, cluster).set(1 if st.phase == "Ready" else 0)
    counts = st.node_counts
    for state in _STATES:
        CLUSTER_NODES.labels(namespace, cluster, state).set(getattr(counts, state))


def forget_cluster(namespace: str, cluster: str) -> None:
    for gauge, extra in ((CLUSTER_READY, [()]), (CLUSTER_NODES, [(s,) for s in _STATES])):
        for labels in extra:
            try:
                gauge.remove(namespace, cluster, *labels)
            except KeyError:
                pass


def serve(port: int, addr: str = "0.0.0.0") -> None:
    start_http_server(port, addr=addr)
