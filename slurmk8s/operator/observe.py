"""What a round reads from the API server, as the decisions take it. Pure.

The round (:mod:`.round`) lists the cluster's objects; these functions turn
them into the inputs of the decisions: the node sets with their pods for
:func:`.workers.decide`, the Kubernetes Nodes the workers run on
(:func:`worker_hosts`) and the topology their labels make, and the status
the SlurmCluster had before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from slurmk8s.api.cluster import DrainSpec, SlurmCluster, SlurmClusterStatus
from slurmk8s.render import TopologyNode, names

from . import workers
from .maintenance import maintenance

__all__ = ["observe_nodesets", "previous_status", "worker_hosts", "topology"]


def _ready(pod: Mapping) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def _worker_host(pod: Mapping) -> str | None:
    """The Kubernetes Node a worker pod is bound to; None for another pod or one not bound yet."""
    if (pod["metadata"].get("labels") or {}).get("app.kubernetes.io/component") != "worker":
        return None
    return (pod.get("spec") or {}).get("nodeName") or None


def worker_hosts(pods: Sequence[Mapping]) -> list[str]:
    """The Kubernetes Nodes the worker pods are bound to, each once, in the pods' order."""
    return list(dict.fromkeys(h for h in map(_worker_host, pods) if h is not None))


def topology(pods: Sequence[Mapping], nodes: Mapping[str, Mapping | None]) -> list[TopologyNode]:
    """Each bound worker pod with the labels of its Node (none for a Node not read)."""
    out = []
    for p in pods:
        host = _worker_host(p)
        if host is not None:
            node = nodes.get(host) or {"metadata": {}}
            out.append(TopologyNode(p["metadata"]["name"], dict(node["metadata"].get("labels") or {})))
    return out


def observe_nodesets(cluster: SlurmCluster, statefulsets: Sequence[Mapping], pods: Sequence[Mapping],
                     nodes: Mapping[str, Mapping | None] | None = None) -> list[workers.NodeSetState]:
    """The node sets of the spec, and those still present though gone from it.
    ``nodes``: the Kubernetes Nodes the worker pods are bound to, by name
    (None, or a node missing: unknown, so not under maintenance)."""
    sts_by_set = {}
    for s in statefulsets:
        labels = s["metadata"].get("labels") or {}
        if names.NODESET_LABEL in labels:
            sts_by_set[labels[names.NODESET_LABEL]] = s
    specs = {ns.name: ns for ns in cluster.spec.node_sets}
    out = []
    for set_name in [*specs, *sorted(set(sts_by_set) - set(specs))]:
        ns = specs.get(set_name)
        sts_name = names.nodeset(cluster, set_name)
        sts = sts_by_set.get(set_name)
        drain = ns.drain if ns else DrainSpec()
        set_pods = []
        for p in pods:
            meta = p["metadata"]
            if (meta.get("labels") or {}).get(names.NODESET_LABEL) != set_name:
                continue
            ordinal = names.worker_ordinal(sts_name, meta["name"])
            if ordinal is None:
                continue
            set_pods.append(workers.Pod(
                name=meta["name"], uid=meta.get("uid", ""), ordinal=ordinal, ready=_ready(p),
                deleting=bool(meta.get("deletionTimestamp")),
                revision=(meta.get("labels") or {}).get("controller-revision-hash"),
                annotations=dict(meta.get("annotations") or {}),
                busy_label=(meta.get("labels") or {}).get(names.BUSY_LABEL) == "true",
                restart_hash=(meta.get("annotations") or {}).get(names.RESTART_HASH),
                maintenance=maintenance((nodes or {}).get((p.get("spec") or {}).get("nodeName") or ""),
                                                (p.get("spec") or {}).get("tolerations") or ()),
            ))
        template = ((sts or {}).get("spec") or {}).get("template") or {}
        out.append(workers.NodeSetState(
            name=set_name, statefulset=sts_name, desired=ns.replicas if ns else 0,
            current=None if sts is None else int((sts.get("spec") or {}).get("replicas", 1)),
            update_revision=((sts or {}).get("status") or {}).get("updateRevision"),
            restart_hash=((template.get("metadata") or {}).get("annotations") or {}).get(names.RESTART_HASH),
            pods=tuple(sorted(set_pods, key=lambda p: p.ordinal)),
            grace_period=drain.grace_period, signal=drain.signal,
        ))
    return out


def previous_status(body: Mapping) -> SlurmClusterStatus | None:
    """The status the SlurmCluster carries, as far as it reads; None if none does."""
    raw = body.get("status")
    if not isinstance(raw, Mapping):
        return None
    known = set(SlurmClusterStatus.model_fields) | {f.alias for f in SlurmClusterStatus.model_fields.values() if f.alias}
    try:
        return SlurmClusterStatus.model_validate({k: v for k, v in raw.items() if k in known})
    except ValueError:
        return None
