"""Where a node's lending state lives: its own labels, annotations and taint.

The bridge keeps nothing in memory between rounds. Everything ``decide``
needs to remember about a Kubernetes Node is written on that Node by the
actions it returns, and read back here the next round, so the bridge may be
killed at any instant and pick up where it left off.

| key | kind | value |
| --- | --- | --- |
| ``slurmk8s.dev/lending`` | label | ``lending``, ``lent`` or ``reclaiming``; absent: the node serves Kubernetes |
| ``slurmk8s.dev/lending-policy`` | annotation | ``<namespace>/<name>`` of the NodeLendingPolicy that lent it |
| ``slurmk8s.dev/lending-cluster`` | annotation | ``<namespace>/<name>`` of the SlurmCluster |
| ``slurmk8s.dev/lending-partition`` | annotation | the partition it joined |
| ``slurmk8s.dev/lending-since`` | annotation | when it entered its current state (RFC 3339, UTC) |
| ``slurmk8s.dev/reclaim-reason`` | annotation | why it is being reclaimed |
| ``slurmk8s.dev/reclaim-signalled`` | annotation | when its jobs were signalled |
| ``slurmk8s.dev/reclaim-jobs`` | annotation | the jobs signalled (comma-separated ids) |
| ``slurmk8s.dev/reclaim-forced`` | annotation | when its remaining jobs were requeued or cancelled |
| ``slurmk8s.dev/idle-since`` | annotation | when it was first seen without GPU pods (Kubernetes state only) |
| ``slurmk8s.dev/free-gpus``, ``slurmk8s.dev/free-since`` | annotations | at least this many of its GPUs have been free (held by no pod) since then (Kubernetes state only; the clock of policies with ``minFreeGpus``) |
| ``slurmk8s.dev/lent`` | taint | ``<cluster>:NoSchedule`` while it is not serving Kubernetes |
| ``slurmk8s.dev/down-owed`` | annotation | ``<namespace>/<name>`` of the SlurmCluster that must still set the node DOWN: it was taken back past the reclaim deadline (kept when the node returns to Kubernetes) |
| ``slurmk8s.dev/down-owed-policy`` | annotation | ``<namespace>/<name>`` of the policy that took it back so |

A node is *held* while it carries the state label (any value) or the taint.
Who holds it is its record's :attr:`LendingRecord.holder`: the policy its
annotations name, when they name a policy and a SlurmCluster as
``<namespace>/<name>``; otherwise no policy can be told, and the node is
held by :func:`unattributed` (of the SlurmCluster, when that one can be
read), which takes it back (decision record 46).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TypeGuard

from ..api.cluster import GROUP
from ..api.fields import DNS_LABEL_RE, DNS_SUBDOMAIN_RE
from ..evacuation import format_job_ids, parse_job_ids  # noqa: F401 (re-exported)
from ..render.names import LENT_TAINT_EFFECT, LENT_TAINT_KEY
from ..strict import count
from ..times import format_time, parse_time  # noqa: F401 (re-exported: the one RFC 3339 helper)

__all__ = [
    "STATE_LABEL", "LENDING", "LENT", "RECLAIMING", "STATES",
    "POLICY_ANNOTATION", "CLUSTER_ANNOTATION", "PARTITION_ANNOTATION", "SINCE_ANNOTATION",
    "REASON_ANNOTATION", "SIGNALLED_ANNOTATION", "JOBS_ANNOTATION", "FORCED_ANNOTATION", "IDLE_SINCE_ANNOTATION",
    "FREE_GPUS_ANNOTATION", "FREE_SINCE_ANNOTATION", "LENDING_ANNOTATIONS", "HEALTH_FAILED_ANNOTATION",
    "DOWN_OWED_ANNOTATION", "DOWN_OWED_POLICY_ANNOTATION", "TAINT_KEY", "TAINT_EFFECT", "SLURMD_COMPONENT", "COMPONENT_LABEL",
    "LendingRecord", "format_time", "parse_time", "readable_key", "unattributed", "UNATTRIBUTED",
]

STATE_LABEL = f"{GROUP}/lending"
LENDING = "lending"
LENT = "lent"
RECLAIMING = "reclaiming"
STATES = (LENDING, LENT, RECLAIMING)

POLICY_ANNOTATION = f"{GROUP}/lending-policy"
CLUSTER_ANNOTATION = f"{GROUP}/lending-cluster"
PARTITION_ANNOTATION = f"{GROUP}/lending-partition"
SINCE_ANNOTATION = f"{GROUP}/lending-since"
REASON_ANNOTATION = f"{GROUP}/reclaim-reason"
SIGNALLED_ANNOTATION = f"{GROUP}/reclaim-signalled"
JOBS_ANNOTATION = f"{GROUP}/reclaim-jobs"
FORCED_ANNOTATION = f"{GROUP}/reclaim-forced"
IDLE_SINCE_ANNOTATION = f"{GROUP}/idle-since"
FREE_GPUS_ANNOTATION = f"{GROUP}/free-gpus"
FREE_SINCE_ANNOTATION = f"{GROUP}/free-since"
#: Every annotation the lending state machine writes; a node returned to
#: Kubernetes carries none of them.
LENDING_ANNOTATIONS = (
    POLICY_ANNOTATION, CLUSTER_ANNOTATION, PARTITION_ANNOTATION, SINCE_ANNOTATION,
    REASON_ANNOTATION, SIGNALLED_ANNOTATION, JOBS_ANNOTATION, FORCED_ANNOTATION, IDLE_SINCE_ANNOTATION,
    FREE_GPUS_ANNOTATION, FREE_SINCE_ANNOTATION,
)

#: A node taken back past the reclaim deadline owes its SlurmCluster a DOWN:
#: these outlive the lending record (ClearLending keeps them), so that a
#: restarted bridge still sets it once that Slurm answers.
DOWN_OWED_ANNOTATION = f"{GROUP}/down-owed"
DOWN_OWED_POLICY_ANNOTATION = f"{GROUP}/down-owed-policy"
#: The health check a lent node last failed (``slurmk8s: health: <check>``):
#: the bridge took it back and never lends it again while this is there.
#: ClearLending keeps it; whoever mends the node removes it
#: (``kubectl annotate node <node> slurmk8s.dev/health-failed-``).
HEALTH_FAILED_ANNOTATION = f"{GROUP}/health-failed"

#: Keeps new Kubernetes pods off a node while Slurm has it; the lent slurmd
#: pod tolerates it. The value is the SlurmCluster's name (render.names, where
#: the operator also reads it).
TAINT_KEY = LENT_TAINT_KEY
TAINT_EFFECT = LENT_TAINT_EFFECT

#: The lent slurmd pods carry app.kubernetes.io/component=lent-slurmd.
COMPONENT_LABEL = "app.kubernetes.io/component"
SLURMD_COMPONENT = "lent-slurmd"


#: A ``<namespace>/<name>`` key as the bridge writes it (a namespace, a name).
_KEY = re.compile(rf"{DNS_LABEL_RE}/{DNS_SUBDOMAIN_RE}")

#: The holder of a node whose record names no policy or SlurmCluster that can
#: be read; never a policy's key (it has no '/' before its first space).
UNATTRIBUTED = "(unattributed)"


def readable_key(value: str | None) -> TypeGuard[str]:
    """``value`` names an object as ``<namespace>/<name>``."""
    return value is not None and len(value) <= 317 and _KEY.fullmatch(value) is not None


def unattributed(cluster: str | None) -> str:
    """The holder of the held nodes that no policy can be told for, lent to
    ``cluster`` (None: no SlurmCluster can be read either)."""
    return f"{UNATTRIBUTED} {cluster}" if cluster else UNATTRIBUTED


def _holder(state: str | None, taint: str | None, policy: str | None, cluster: str | None) -> str | None:
    if state is None and taint is None:
        return None
    if readable_key(policy) and readable_key(cluster):
        return policy
    return unattributed(cluster if readable_key(cluster) else None)


@dataclass(frozen=True)
class LendingRecord:
    """What a Node says about its lending: read from its label, annotations and taint."""

    #: lending, lent or reclaiming; None: no label (the node serves
    #: Kubernetes, unless it carries the taint: see ``holder``). Any
    #: other label value is kept as is: a state that cannot be read, which its
    #: holder takes back (``record-unreadable``).
    state: str | None
    policy: str | None
    cluster: str | None
    partition: str | None
    since: datetime | None
    reason: str | None
    signalled: datetime | None
    #: The jobs signalled when the reclaim started.
    signalled_jobs: tuple[int, ...]
    forced: datetime | None
    idle_since: datetime | None
    #: (since when, how many): at least that many GPUs have been free since
    #: then; None when not recorded or unreadable (the clock starts again).
    free_since: tuple[datetime, int] | None
    #: The value of our taint, or None when the node does not carry it.
    taint: str | None
    #: The SlurmCluster (namespace/name) that must still set the node DOWN,
    #: and the policy that took it back past the reclaim deadline.
    down_owed: str | None = None
    down_owed_policy: str | None = None
    #: The health check the node failed while lent; None: none did.
    health_failed: str | None = None
    #: Who holds the node (it carries the state label, any value, or the
    #: taint): the policy its annotations name, or :func:`unattributed` when
    #: they do not name a policy and a SlurmCluster; None: nobody, the node
    #: serves Kubernetes.
    holder: str | None = None

    @classmethod
    def read(cls, labels: Mapping[str, str], annotations: Mapping[str, str],
             taints: tuple = ()) -> LendingRecord:
        ann = annotations.get
        taint = next((t.value for t in taints if t.key == TAINT_KEY and t.effect == TAINT_EFFECT), None)
        state, policy, cluster = labels.get(STATE_LABEL) or None, ann(POLICY_ANNOTATION), ann(CLUSTER_ANNOTATION)
        return cls(
            state=state,
            policy=policy,
            cluster=cluster,
            partition=ann(PARTITION_ANNOTATION),
            since=parse_time(ann(SINCE_ANNOTATION)),
            reason=ann(REASON_ANNOTATION),
            signalled=parse_time(ann(SIGNALLED_ANNOTATION)),
            signalled_jobs=parse_job_ids(ann(JOBS_ANNOTATION)),
            forced=parse_time(ann(FORCED_ANNOTATION)),
            idle_since=parse_time(ann(IDLE_SINCE_ANNOTATION)),
            free_since=_free_since(ann(FREE_SINCE_ANNOTATION), ann(FREE_GPUS_ANNOTATION)),
            taint=taint,
            down_owed=ann(DOWN_OWED_ANNOTATION) or None,
            down_owed_policy=ann(DOWN_OWED_POLICY_ANNOTATION) or None,
            health_failed=ann(HEALTH_FAILED_ANNOTATION) or None,
            holder=_holder(state, taint, policy, cluster),
        )


#: The most free GPUs a record may name (four digits).
MAX_FREE_GPUS = 9999


def _free_since(since: str | None, gpus: str | None) -> tuple[datetime, int] | None:
    at, free = parse_time(since), count(gpus, MAX_FREE_GPUS)
    return None if at is None or free is None else (at, free)
