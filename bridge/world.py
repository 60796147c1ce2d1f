"""The observed world, indexed for one decision. Pure from the caller's view.

``World(observed)`` answers what the rules ask of every node in O(1): how
many GPU pods run there and how many GPUs they use, which lent slurmd pods
exist, which pods are pending, which Slurm jobs run on a node.

Built once per decision: O(nodes + pods + jobs).
"""

from __future__ import annotations

from typing import Iterable, Sequence

from ..slurm.hostlist import HostlistError, expand
from ..slurm.model import ACTIVE_JOB_STATES, Job, Node
from .nodestate import COMPONENT_LABEL, SLURMD_COMPONENT
from .observed import TERMINAL_PHASES, KubeNode, KubePod, Observed, SlurmState

__all__ = ["World", "PodIndex", "SlurmIndex"]


class PodIndex:
    """What the pods say about each node."""

    __slots__ = ("gpu_pods", "used_gpus", "slurmd_pods", "slurmd_nodes", "pending")

    def __init__(self) -> None:
        #: node -> non-DaemonSet pods requesting GPUs that still hold them (makes a node busy)
        self.gpu_pods: dict[str, int] = {}
        #: node -> GPUs requested by pods that are neither ending nor ours
        self.used_gpus: dict[str, int] = {}
        #: (namespace, name) -> lent slurmd pod
        self.slurmd_pods: dict[tuple[str, str], KubePod] = {}
        #: node -> lent slurmd pods there (in any phase): not idle yet
        self.slurmd_nodes: dict[str, int] = {}
        #: pending, unschedulable pods requesting GPUs (any namespace), by id
        self.pending: dict[int, KubePod] = {}

    @classmethod
    def of(cls, pods: Sequence[KubePod]) -> "PodIndex":
        index = cls()
        index._account(pods, 1)
        return index

    def _account(self, pods: Iterable[KubePod], sign: int) -> None:
        """Add (``sign`` 1) or take out (-1) what ``pods`` say about their nodes.
        One pass; the common cases are tested first."""
        gpu_pods, used_gpus, pending = self.gpu_pods, self.used_gpus, self.pending
        slurmd_pods, slurmd_nodes = self.slurmd_pods, self.slurmd_nodes
        for pod in pods:
            ours = pod.labels.get(COMPONENT_LABEL) == SLURMD_COMPONENT
            if ours:
                key = (pod.namespace, pod.name)
                if sign > 0:
                    slurmd_pods[key] = pod
                elif slurmd_pods.get(key) is pod:
                    del slurmd_pods[key]
                if pod.node is not None:
                    slurmd_nodes[pod.node] = slurmd_nodes.get(pod.node, 0) + sign
            gpus = pod.gpus
            if gpus <= 0 or pod.phase in TERMINAL_PHASES:
                continue
            node = pod.node
            if node is None:
                if (pod.phase == "Pending" and pod.unschedulable and not pod.deleting and not ours
                        and pod.owner_kind != "DaemonSet"):
                    if sign > 0:
                        pending[id(pod)] = pod
                    else:
                        pending.pop(id(pod), None)
                continue
            if pod.owner_kind != "DaemonSet":
                gpu_pods[node] = gpu_pods.get(node, 0) + sign
            if not pod.deleting and not ours:
                used_gpus[node] = used_gpus.get(node, 0) + sign * gpus


def _hosts(hostlist: str) -> list[str]:
    return expand(hostlist)


class SlurmIndex:
    """Slurm's nodes by name and its active jobs by node, or the reason
    Slurm is unknown (fail closed)."""

    __slots__ = ("known", "problem", "nodes", "jobs", "all_jobs", "_by_id")

    def __init__(self, slurm: SlurmState):
        self.known = slurm.known
        self.problem = "" if slurm.known else "the Slurm facade did not answer"
        self.nodes: dict[str, Node] = {n.name: n for n in slurm.nodes} if slurm.known else {}
        #: node -> jobs allocated there (active states only)
        self.jobs: dict[str, list[Job]] = {}
        self.all_jobs: Sequence[Job] = slurm.jobs if slurm.known else ()
        self._by_id: dict[int, list[Job]] | None = None
        if not slurm.known:
            return
        jobs = self.jobs
        active = ACTIVE_JOB_STATES
        for job in slurm.jobs:
            if job.state not in active or not job.nodes:
                continue
            try:
                names = _hosts(job.nodes)
            except HostlistError as exc:
                # Which nodes the job runs on is unknown: fail closed.
                self.known = False
                self.problem = f"job {job.job_id}'s node list could not be read ({exc})"
                self.nodes, self.jobs, self.all_jobs = {}, {}, ()
                return
            for name in names:
                on = jobs.get(name)
                if on is None:
                    jobs[name] = [job]
                else:
                    on.append(job)

    def by_id(self, ids: Iterable[int]) -> list[Job]:
        """Slurm's jobs with these ids (any state), in Slurm's order."""
        if self._by_id is None:
            self._by_id = {}
            for k, j in enumerate(self.all_jobs):
                self._by_id.setdefault(j.job_id, []).append(k)
        return [self.all_jobs[k] for k in sorted(k for i in set(ids) for k in self._by_id.get(i, ()))]


class World:
    """The indexes one decision reads (the same answers however they were built)."""

    def __init__(self, observed: Observed):
        self.observed = observed
        pods = PodIndex.of(observed.pods)
        self.gpu_pods = pods.gpu_pods
        self.used_gpus = pods.used_gpus
        self.slurmd_pods = pods.slurmd_pods
        self.slurmd_nodes = pods.slurmd_nodes
        self.pending: list[KubePod] = list(pods.pending.values())
        self.slurm = slurm = SlurmIndex(observed.slurm)
        self.slurm_known = slurm.known
        self.slurm_problem = slurm.problem
        self.slurm_nodes = slurm.nodes
        self.jobs = slurm.jobs

    def free_gpus(self, node: KubeNode) -> int:
        return node.gpus - self.used_gpus.get(node.name, 0)

    def jobs_on(self, node: str) -> list[Job]:
        return self.jobs.get(node, [])

    def jobs_by_id(self, ids: Sequence[int]) -> list[Job]:
        """Slurm's jobs with these ids (any state); none when Slurm is unknown."""
        if not ids or not self.slurm_known:
            return []
        return self.slurm.by_id(ids)

    def idle(self, node: str) -> bool:
        """No GPU pod (DaemonSets aside) and no lent slurmd pod left on the node."""
        return not self.gpu_pods.get(node) and not self.slurmd_nodes.get(node)

    def has_slurmd(self, node: str) -> bool:
        return bool(self.slurmd_nodes.get(node))
