"""What a round reads from the API server, each read as narrow as it can be. Shell.

The cluster's objects and pods by the cluster's label, its key Secrets and
the Secrets its spec names by name (the operator has get on Secrets, never
list), the Nodes its workers run on by name, the FailedCreate Events of
a workload short of pods, the claims the spec names (``existingClaim``) by
name, and the claim Events of a namespace where one of its claims is not bound. :mod:`.observe` turns what these return into the
decisions' input; :mod:`.round` runs them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from slurmk8s import log
from slurmk8s.api.cluster import SlurmCluster
from slurmk8s.api.secrets import secret_problem, secret_refs
from slurmk8s.api.status import ConditionStatus
from slurmk8s.kube import Kube
from slurmk8s.render import names
from slurmk8s.render.keys import key_secret_names

from . import claims as claim_rules
from . import plan, status

__all__ = ["observe", "unusable_secrets", "worker_nodes", "refused_pods", "claims", "storage"]

_log = log.get("slurmk8s.operator")


def observe(kube: Kube, namespace: str, cluster_name: str) -> list[dict]:
    """The cluster's objects and pods, listed by the cluster's label, and
    its key Secrets, read by name: the operator never lists Secrets (it
    has get on them, not list), so it cannot enumerate anyone else's."""
    selector = f"{names.CLUSTER_LABEL}={cluster_name}"
    objs: list[dict] = []
    for kind in (*plan.MANAGED_KINDS, "Pod"):
        if kind == "Secret":
            objs += _key_secrets(kube, namespace, cluster_name)
        else:
            objs += kube.list(kind, namespace, selector)
    return objs


def _key_secrets(kube: Kube, namespace: str, cluster_name: str) -> list[dict]:
    """The cluster's key Secrets that exist (a 404 means missing: the round creates it)."""
    found = (kube.get("Secret", namespace, name) for name in key_secret_names(cluster_name))
    return [s for s in found if s is not None]


def unusable_secrets(kube: Kube, cluster: SlurmCluster) -> list[str]:
    """Why each Secret the spec names may not be used (slurmk8s.api.secrets), read by name."""
    refs = secret_refs(cluster, used_only=True)
    return [p for p in (secret_problem(r, kube.get(r.kind, cluster.namespace, r.name)) for r in refs)
            if p is not None]


def worker_nodes(kube: Kube, hosts: Sequence[str]) -> tuple[dict[str, dict | None], list[Exception]]:
    """The Nodes the cluster's worker pods are bound to (:func:`.observe.worker_hosts`),
    each read by name once a round (for node maintenance and spec.topology):
    None for one that is gone or could not be read (unknown); and the read failures."""
    out: dict[str, dict | None] = {}
    failed: list[Exception] = []
    for host in hosts:
        try:
            out[host] = kube.get("Node", None, host)
        except Exception as exc:  # noqa: BLE001 - unknown: nothing is drained for it
            _log.info("node not read", node=host, error=str(exc))
            out[host] = None
            failed.append(exc)
    return out, failed


def refused_pods(kube: Kube, cluster: SlurmCluster, objects: Sequence[Mapping], pods: Sequence[Mapping]) -> list[str]:
    """Why a workload short of pods has none, as its controller's FailedCreate Events
    say (:func:`.status.refused_pods`); none when they cannot be read: the status
    says what is known, and the next round asks again."""
    short = status.short_of_pods(objects, pods)
    if not short:
        return []
    try:
        return status.refused_pods(short, kube.list("Event", cluster.namespace, fields="reason=FailedCreate"))
    except Exception as exc:  # noqa: BLE001 - unknown: the status goes without it
        _log.warning("could not read FailedCreate events", cluster=cluster.name, error=str(exc))
        return []


def claims(kube: Kube, cluster: SlurmCluster, wanted: Sequence[claim_rules.Claim],
           objects: Sequence[Mapping]) -> tuple[dict[str, Mapping], list[dict]] | None:
    """The claims ``wanted`` that exist, by name: those the round listed by the
    cluster's label (``objects``), the spec's ``existingClaim`` read by name (the
    operator lists claims, it does not get them); and, while one is not bound,
    the claim Events of the namespace, which say why (:func:`.claims.condition`).
    None when they cannot be read: StorageReady is unknown, and the next round asks again."""
    found: dict[str, Mapping] = {o["metadata"]["name"]: o for o in objects if o.get("kind") == "PersistentVolumeClaim"}
    try:
        for c in wanted:
            if c.field is not None and c.name not in found:
                for o in kube.list("PersistentVolumeClaim", cluster.namespace, fields=f"metadata.name={c.name}"):
                    found[o["metadata"]["name"]] = o
        events = kube.list("Event", cluster.namespace, fields="involvedObject.kind=PersistentVolumeClaim") \
            if claim_rules.unbound(wanted, found) else []
    except Exception as exc:  # noqa: BLE001 - unknown: the status says so
        _log.warning("could not read the cluster's claims or their events", cluster=cluster.name, error=str(exc))
        return None
    return found, events


def storage(kube: Kube, cluster: SlurmCluster, desired: Sequence[Mapping],
            objects: Sequence[Mapping]) -> tuple[ConditionStatus, str, str]:
    """StorageReady: the claims the rendered workloads (``desired``) mount, as read now,
    and why one that is not bound waits (:func:`.claims.condition`); unknown when unread."""
    wanted = claim_rules.used(cluster, desired)
    found = claims(kube, cluster, wanted, objects)
    if found is None:
        return "Unknown", "NotRead", "the cluster's claims or their Events could not be read this round"
    return claim_rules.condition(wanted, *found)
