"""The observed world, indexed for one decision. Pure from the caller's view.

``World(observed)`` answers what the rules ask of every node in O(1): how
many GPU pods run there and how many GPUs they use, which lent slurmd pods
exist, which pods are pending, how many pods of each SlurmCluster run
there, which Slurm jobs run on a node.

A label says nothing about who made a pod: any tenant may label a pod
``app.kubernetes.io/component=lent-slurmd``. So the index treats every pod
alike (a labelled pod requesting GPUs holds them; a pending one is demand),
and a pod is the bridge's own lent slurmd only where a rule finds it by what
a tenant cannot forge: the exact name the bridge gives it
(``names.lent_slurmd``) in the namespace of the policy, on the node, and for a
held node the SlurmCluster its record (on the cluster-scoped Node) names
(:meth:`World.own_pod`, :meth:`World.has_slurmd`).

Building the index is O(nodes + pods + jobs), and at 50,000 pods and jobs
it is much of a decision's time. The bridge decides every round, and for
every policy, on a world that mostly did not change, so the indexes are
remembered (:mod:`.memo`) on the identity of what they were built from: the
same ``pods`` tuple, or the same ``SlurmState``, gives the same index. A new
``pods`` tuple that keeps most of the previous one's objects (a watch cache
rebuilds its tuple but keeps the pods that did not change) updates a copy of
the previous index by the difference: the pods gone are taken out and the
new ones put in, both by the one rule in :meth:`PodIndex._account`. Slurm is
read anew every round, so its index is rebuilt, but the expansion of each
host list is remembered by its text.
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from itertools import compress
from operator import attrgetter

from ..api.fields import parse_quantity
from ..render import names as _names
from ..render.lent import GPU_RESOURCE
from ..render.slurmd import is_lent_slurmd_pod
from ..slurm.hostlist import HostlistError, expand
from ..slurm.model import ACTIVE_JOB_STATES, Job, Node, SlurmState
from .memo import Recent, changed_spans, forgettable
from .nodestate import COMPONENT_LABEL, SLURMD_COMPONENT
from .observed import TERMINAL_PHASES, KubeNode, KubePod, Observed

__all__ = ["World", "PodIndex", "SlurmIndex"]


class PodIndex:
    """What the pods say about each node."""

    __slots__ = ("gpu_pods", "used_gpus", "used_cpu", "used_memory", "slurmd_pods", "pending", "cluster_pods",
                 "_busy")

    def __init__(self) -> None:
        #: node -> non-DaemonSet pods requesting GPUs that still hold them (makes a node busy)
        self.gpu_pods: defaultdict[str, int] = defaultdict(int)
        #: node -> GPUs requested by pods that are not ending (lent slurmd pods
        #: included: :meth:`World.free_gpus` gives back the node's own one)
        self.used_gpus: defaultdict[str, int] = defaultdict(int)
        #: node -> cpu (millicores) and memory (bytes) requested by pods that
        #: are not ending (every pod; lent slurmd pods included, as above)
        self.used_cpu: defaultdict[str, int] = defaultdict(int)
        self.used_memory: defaultdict[str, int] = defaultdict(int)
        #: (namespace, name) -> pod labelled as a lent slurmd: a candidate,
        #: which the rules look up by the exact name they expect
        self.slurmd_pods: dict[tuple[str, str], KubePod] = {}
        #: pending, unschedulable pods requesting GPUs (any namespace, any label), by id
        self.pending: dict[int, KubePod] = {}
        #: (node, namespace, cluster) -> pods there that are not ended and are
        #: that SlurmCluster's own by their labels (``names.rendered_for``;
        #: lent slurmd pods are not): :mod:`.ownpods`
        self.cluster_pods: defaultdict[tuple[str, str, str], int] = defaultdict(int)
        self._busy: frozenset[str] | None = None

    @property
    def busy(self) -> frozenset[str]:
        """Nodes with a GPU pod (DaemonSets aside; whatever its labels): not idle."""
        if self._busy is None:
            self._busy = frozenset(k for k, v in self.gpu_pods.items() if v)
        return self._busy

    @classmethod
    def of(cls, pods: Sequence[KubePod]) -> PodIndex:
        index = cls()
        index._account(pods, 1)
        return index

    def updated(self, old: Sequence[KubePod], new: Sequence[KubePod]) -> PodIndex | None:
        """The index of ``new``, from this one (the index of ``old``) and the
        difference; None when they differ too much (build it afresh then)."""
        spans = changed_spans(old, new, limit=max(len(new) // 4, 16))
        if spans is None:
            return None
        index = PodIndex()
        index.gpu_pods, index.used_gpus = self.gpu_pods.copy(), self.used_gpus.copy()
        index.used_cpu, index.used_memory = self.used_cpu.copy(), self.used_memory.copy()
        index.slurmd_pods = dict(self.slurmd_pods)
        index.pending = dict(self.pending)
        index.cluster_pods = self.cluster_pods.copy()
        index._account([p for start, stop, _ in spans for p in old[start:stop]], -1)
        index._account([p for start, _, stop in spans for p in new[start:stop]], 1)
        return index

    def _account(self, pods: Iterable[KubePod], sign: int) -> None:
        """Add (``sign`` 1) or take out (-1) what ``pods`` say about their nodes.
        One pass; the common cases are tested first."""
        gpu_pods, used_gpus, pending = self.gpu_pods, self.used_gpus, self.pending
        used_cpu, used_memory, slurmd_pods = self.used_cpu, self.used_memory, self.slurmd_pods
        cluster_pods = self.cluster_pods
        for pod in pods:
            if pod.node is not None and pod.phase not in TERMINAL_PHASES \
                    and (cluster := _names.rendered_for(pod.labels)) is not None:
                cluster_pods[(pod.node, pod.namespace, cluster)] += sign
            if pod.labels.get(COMPONENT_LABEL) == SLURMD_COMPONENT:
                key = (pod.namespace, pod.name)
                if sign > 0:
                    slurmd_pods[key] = pod
                elif slurmd_pods.get(key) is pod:
                    del slurmd_pods[key]
            if (pod.cpu_millis or pod.memory) and pod.node is not None and not pod.deleting \
                    and pod.phase not in TERMINAL_PHASES:
                used_cpu[pod.node] += sign * pod.cpu_millis
                used_memory[pod.node] += sign * pod.memory
            gpus = pod.gpus
            if gpus <= 0 or pod.phase in TERMINAL_PHASES:
                continue
            node = pod.node
            if node is None:
                # The bridge's own pods are created on their node: an
                # unscheduled pod is demand, whatever its labels say.
                if (pod.phase == "Pending" and pod.unschedulable and not pod.deleting
                        and pod.owner_kind != "DaemonSet"):
                    if sign > 0:
                        pending[id(pod)] = pod
                    else:
                        pending.pop(id(pod), None)
                continue
            if pod.owner_kind != "DaemonSet":
                gpu_pods[node] += sign
            if not pod.deleting:
                used_gpus[node] += sign * gpus


_STATE = attrgetter("state")


@functools.lru_cache(maxsize=1 << 16)
def _hosts(hostlist: str) -> tuple[str, ...]:
    return tuple(expand(hostlist))


forgettable(_hosts.cache_clear)


class SlurmIndex:
    """Slurm's nodes by name and its active jobs by node, or the reason
    Slurm is unknown (fail closed)."""

    __slots__ = ("known", "problem", "nodes", "jobs", "all_jobs", "_by_id")

    def __init__(self, slurm: SlurmState):
        self.known = slurm.known
        self.problem = "" if slurm.known else "the Slurm facade did not answer"
        self.nodes: Mapping[str, Node] = slurm.nodes_by_name if slurm.known else {}
        #: node -> jobs allocated there (active states only)
        self.jobs: defaultdict[str, list[Job]] = defaultdict(list)
        self.all_jobs: Sequence[Job] = slurm.jobs if slurm.known and slurm.jobs is not None else ()
        self._by_id: dict[int, list[int]] | None = None  # job id -> indices in all_jobs
        if not self.all_jobs:
            return
        jobs = self.jobs
        for job in compress(self.all_jobs, map(ACTIVE_JOB_STATES.__contains__, map(_STATE, self.all_jobs))):
            if not job.nodes:
                continue
            try:
                names = _hosts(job.nodes)
            except HostlistError as exc:
                # Which nodes the job runs on is unknown: fail closed.
                self.known = False
                self.problem = f"job {job.job_id}'s node list could not be read ({exc})"
                self.nodes, self.jobs, self.all_jobs = {}, defaultdict(list), ()
                return
            for name in names:
                jobs[name].append(job)

    def by_id(self, ids: Iterable[int]) -> list[Job]:
        """Slurm's jobs with these ids (any state), in Slurm's order."""
        if self._by_id is None:
            self._by_id = {}
            for k, j in enumerate(self.all_jobs):
                self._by_id.setdefault(j.job_id, []).append(k)
        return [self.all_jobs[k] for k in sorted(k for i in set(ids) for k in self._by_id.get(i, ()))]


#: The last pods' index (every policy of a round observes the same pods) and Slurm's.
_POD_INDEXES: Recent[PodIndex] = Recent(1)
_SLURM_INDEXES: Recent[SlurmIndex] = Recent(1)


def _pod_index(pods: Sequence[KubePod]) -> PodIndex:
    found = _POD_INDEXES.get(pods)
    if found is not None:
        return found
    last = _POD_INDEXES.latest()
    index = last[1].updated(last[0], pods) if last is not None else None  # type: ignore[arg-type]  # put() with pods
    return _POD_INDEXES.put(pods, index if index is not None else PodIndex.of(pods))


def _slurm_index(slurm: SlurmState) -> SlurmIndex:
    found = _SLURM_INDEXES.get(slurm)
    return found if found is not None else _SLURM_INDEXES.put(slurm, SlurmIndex(slurm))


class World:
    """The indexes one decision reads (the same answers however they were built)."""

    def __init__(self, observed: Observed):
        self.observed = observed
        pods = _pod_index(observed.pods)
        self.gpu_pods = pods.gpu_pods
        self.used_gpus = pods.used_gpus
        self.used_cpu, self.used_memory = pods.used_cpu, pods.used_memory
        self.slurmd_pods = pods.slurmd_pods
        self.cluster_pods = pods.cluster_pods
        #: nodes with a GPU pod: not idle (:meth:`idle`)
        self.busy = pods.busy
        self.pending: list[KubePod] = list(pods.pending.values())
        self.slurm = slurm = _slurm_index(observed.slurm)
        self.slurm_known = slurm.known
        self.slurm_problem = slurm.problem
        self.slurm_nodes = slurm.nodes
        self.jobs = slurm.jobs

    def _holding(self, node: KubeNode) -> KubePod | None:
        """The node's own lent slurmd pod while it still holds what it asked for."""
        own = self.own_pod(node)
        return own if own is not None and not own.deleting and not own.terminal else None

    def free_gpus(self, node: KubeNode) -> int:
        """GPUs no pod holds, once the node's own lent slurmd pod (if any) is gone."""
        own = self._holding(node)
        return node.gpus - self.used_gpus.get(node.name, 0) + (own.gpus if own else 0)

    def lendable(self, node: KubeNode) -> dict[str, str]:
        """What Slurm may have of ``node``: its allocatable cpu, memory and
        GPUs less what the pods on it request (its own lent slurmd pod, if
        any, given back), as a resource list. A quantity the Node does not
        give, or that is no quantity, is passed on as it is, for
        :func:`~slurmk8s.render.lent.lent_node` to say why the node cannot
        be lent."""
        own = self._holding(node)
        out = {k: v for k, v in node.allocatable.items() if k in ("cpu", "memory", GPU_RESOURCE)}
        for key, used, back, scale, unit in (
                ("cpu", self.used_cpu, own.cpu_millis if own else 0, 1000, "m"),
                ("memory", self.used_memory, own.memory if own else 0, 1, "")):
            raw = out.get(key)
            try:
                total = parse_quantity(raw) * scale if raw is not None else math.nan
            except (ValueError, KeyError):
                continue
            if math.isfinite(total):
                out[key] = f"{math.floor(total) - used.get(node.name, 0) + back}{unit}"
        if GPU_RESOURCE in out:
            out[GPU_RESOURCE] = str(self.free_gpus(node))
        return out

    def slurmd_pod(self, namespace: str, cluster: str, node: str) -> KubePod | None:
        """The lent slurmd pod the bridge makes for ``node`` lent to SlurmCluster
        ``cluster`` of ``namespace``: found by its exact name, in that
        namespace, on that node; a pod a tenant labels elsewhere is not it."""
        pod = self.slurmd_pods.get((namespace, _names.lent_slurmd(cluster, node)))
        if pod is None:  # lent before pods were named <cluster>-lent.<node>: only if it says it is this one
            pod = self.slurmd_pods.get((namespace, _names.legacy_lent_slurmd(cluster, node)))
            if pod is not None and not is_lent_slurmd_pod(pod.labels, pod.node, cluster, node):
                pod = None
        return pod if pod is not None and pod.node == node else None

    def own_pod(self, node: KubeNode) -> KubePod | None:
        """The lent slurmd pod of a held node, as its record (on the Node,
        which tenants cannot write) names the SlurmCluster."""
        cluster = node.record.cluster
        if node.record.state is None or not cluster or "/" not in cluster:
            return None
        namespace, _, name = cluster.partition("/")
        return self.slurmd_pod(namespace, name, node.name)

    def lent_pods_on(self, node: str, namespaces: Collection[str] = ()) -> list[KubePod]:
        """The pods on ``node`` that are the lent slurmd pod of some
        SlurmCluster by :meth:`slurmd_pod`'s rule (the exact name, in its
        namespace, on the node), in ``namespaces`` (empty: any): for a held
        node whose record names no SlurmCluster that can be read."""
        found = []
        for (namespace, name), pod in self.slurmd_pods.items():
            if pod.node != node or (namespaces and namespace not in namespaces):
                continue
            clusters = {name.partition(_names.LENT_SEPARATOR)[0] if _names.LENT_SEPARATOR in name else None,
                        pod.labels.get("app.kubernetes.io/instance")}
            if any(c and self.slurmd_pod(namespace, c, node) is pod for c in clusters):
                found.append(pod)
        return sorted(found, key=lambda p: (p.namespace, p.name))

    def reserved(self, node: str) -> bool:
        """Slurm may hold a lending reservation on the node: it has one, or
        its reservations could not be read."""
        have = self.observed.slurm.reservations
        return have is None or any(res.node == node for res in have)

    def jobs_on(self, node: str) -> list[Job]:
        return self.jobs.get(node, [])

    def jobs_by_id(self, ids: Sequence[int]) -> list[Job]:
        """Slurm's jobs with these ids (any state); none when Slurm is unknown."""
        if not ids or not self.slurm_known:
            return []
        return self.slurm.by_id(ids)

    def idle(self, node: str, namespace: str, cluster: str) -> bool:
        """No GPU pod (DaemonSets aside) and no lent slurmd pod of the
        policy's ``namespace`` and ``cluster`` left on the node."""
        return node not in self.busy and not self.has_slurmd(node, namespace, cluster)

    def serving(self, node: str, namespace: str, cluster: str) -> bool:
        """The node runs a GPU pod (DaemonSets aside) other than the lent
        slurmd pod of the policy's ``namespace`` and ``cluster``: Kubernetes
        uses it. A node just handed back, whose slurmd pod is still ending,
        is not in use (it is still busy: :meth:`idle`)."""
        own = self.slurmd_pod(namespace, cluster, node)
        counted = (own is not None and own.gpus > 0 and own.phase not in TERMINAL_PHASES
                   and own.owner_kind != "DaemonSet")  # as PodIndex counts it
        return self.gpu_pods.get(node, 0) > (1 if counted else 0)

    def has_free(self, node: KubeNode, namespace: str, cluster: str, at_least: int = 1) -> bool:
        """At least ``at_least`` GPUs of the node are free and no lent slurmd
        pod of the policy's ``namespace`` and ``cluster`` is left on it."""
        return self.free_gpus(node) >= at_least and not self.has_slurmd(node.name, namespace, cluster)

    def has_slurmd(self, node: str, namespace: str, cluster: str) -> bool:
        """The node runs the lent slurmd pod of ``cluster`` (in any phase)."""
        return self.slurmd_pod(namespace, cluster, node) is not None
