"""A simulated world for the lending decision: Nodes, Pods, Slurm nodes and jobs.

``World.apply`` does what the bridge's loop does with a round's actions: it
runs them through the loop's executor, ``slurmk8s.slurm.steps.execute``, and
so by its failure rule (a node's chain of actions stops at the first one that
fails; a job Slurm refuses to requeue is passed over): Slurm's steps against
``WorldSlurm`` (drains, jobs requeued, nodes deleted), the rest (Node patches
through ``slurmk8s.bridge.patches.node_patch``, pods and the lent pods'
disruption budgets created and deleted) by ``World._apply``. A world observes
budgets only when ``budgets`` is not None (a set of their keys); a budget
goes with the pod that owns it, as Kubernetes' garbage collector has it. What
Slurm does to the jobs is :mod:`slurmk8s.simulate.slurmrules`, the model the
simulator uses too.
``World.step`` is everything else moving: pods start and stop, slurmd
registers, jobs finish ending.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from slurmk8s.api import NodeLendingPolicy, SlurmCluster, load_cluster, load_policy
from slurmk8s.api.cluster import lent_nodeset
from slurmk8s.bridge import actions as A
from slurmk8s.bridge.decide import decide
from slurmk8s.bridge.nodestate import COMPONENT_LABEL, SLURMD_COMPONENT, TAINT_KEY
from slurmk8s.bridge.observed import KubeNode, KubePod, Observed, PolicyGone, UnreadableCluster, pod_from_api
from slurmk8s.bridge.patches import NODE_PATCH_ACTIONS, node_patch
from slurmk8s.bridge.patches import applied as patched  # noqa: F401 (the tests name it so)
from slurmk8s.render.manifests import lent_budget, lent_slurmd_pod
from slurmk8s.render.names import lent_slurmd
from slurmk8s.simulate import slurmrules
from slurmk8s.slurm import steps
from slurmk8s.slurm.client import NotOurDrain, SlurmError
from slurmk8s.slurm.model import DRAIN_PREFIX, Job, Node, SlurmState
from slurmk8s.slurm.reservations import Reservation, lend_reservation_name

T0 = datetime(2025, 3, 3, 12, 0, 0, tzinfo=UTC)  # a Monday
#: A GPU node its owner allows the policies of namespace hpc to lend (decision record 15).
GPU_LABELS = {"slurmk8s.dev/lendable": "true", "slurmk8s.dev/lendable-to": "hpc",
              "nvidia.com/gpu.product": "NVIDIA-H100-80GB"}
ALLOCATABLE = {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": "8"}


def cluster(accept: bool = True, namespace: str = "hpc") -> SlurmCluster:
    return load_cluster({
        "apiVersion": "slurmk8s.dev/v1alpha1", "kind": "SlurmCluster",
        "metadata": {"name": "demo", "namespace": namespace},
        "spec": {"partitions": [{"name": "cpu"}, {"name": "gpu", "acceptLentNodes": accept}]},
    })


def policy(namespace: str = "hpc", **spec) -> NodeLendingPolicy:
    base = {"clusterRef": {"name": "demo"}, "partition": "gpu",
            "nodeSelector": {"matchLabels": {"slurmk8s.dev/lendable": "true"}}, "idleAfterSeconds": 120}
    reclaim = spec.pop("reclaim", {})
    return load_policy({
        "apiVersion": "slurmk8s.dev/v1alpha1", "kind": "NodeLendingPolicy",
        "metadata": {"name": "lend", "namespace": namespace, "generation": 1},
        "spec": {**base, **spec, "reclaim": reclaim},
    })


def gpu_node(name: str, **kw) -> KubeNode:
    return KubeNode(name=name, labels=dict(kw.pop("labels", GPU_LABELS)),
                    allocatable=dict(kw.pop("allocatable", ALLOCATABLE)), **kw)


def gpu_pod(name: str, node: str | None = None, gpus: int = 1, **kw) -> KubePod:
    phase = kw.pop("phase", "Running" if node else "Pending")
    return KubePod(namespace=kw.pop("namespace", "apps"), name=name, node=node, phase=phase, gpus=gpus,
                   unschedulable=kw.pop("unschedulable", node is None), **kw)


def slurm_node(name: str, partition: str = "gpu", state: str = "idle", flags=(), reason: str = "") -> Node:
    return Node(name=name, state=state, flags=frozenset(flags), reason=reason,
                features=(lent_nodeset(partition),), partitions=(partition,), cpus=32,
                alloc_cpus=0, gres="gpu:NVIDIA-H100-80GB:8", address="")


def job(job_id: int, nodes: str, state: str = "RUNNING", requeue: bool = True) -> Job:
    return Job(job_id=job_id, name=f"job{job_id}", user="researcher", state=state, partition="gpu",
               nodes=nodes, requeue=requeue, restart_count=0, reason="")


@dataclass
class World:
    nodes: dict[str, KubeNode] = field(default_factory=dict)
    pods: dict[tuple[str, str], KubePod] = field(default_factory=dict)
    snodes: dict[str, Node] = field(default_factory=dict)
    jobs: dict[int, Job] = field(default_factory=dict)
    cluster: SlurmCluster | None = field(default_factory=cluster)
    slurm_known: bool = True
    #: the bridge cannot load the cluster (it observes none, and no Slurm, then)
    unreadable: UnreadableCluster | None = None
    #: what was done to Slurm jobs: (kind, job id, extra)
    log: list[tuple] = field(default_factory=list)
    #: the policy's status as last written
    status: object = None
    #: jobs Slurm ended (cancelled, or NODE_FAIL): gone once COMPLETING is over
    ended: set[int] = field(default_factory=set)
    #: lending reservations: node -> start (POSIX seconds)
    reserved: dict[str, int] = field(default_factory=dict)
    #: Slurm's reservations could be read
    reservations_known: bool = True
    #: the lent pods' disruption budgets: (namespace, name) -> the pod that owns
    #: it (namespace, name); None: not observed (decide's budget rule waits)
    budgets: dict[tuple[str, str], tuple[str, str]] | None = None
    #: the nodes whose chain of actions stopped (an action failed) in the last ``apply``
    stopped: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, nodes=(), pods=(), snodes=(), jobs=(), **kw) -> World:
        return cls(nodes={n.name: n for n in nodes}, pods={(p.namespace, p.name): p for p in pods},
                   snodes={s.name: s for s in snodes}, jobs={j.job_id: j for j in jobs}, **kw)

    def copy(self) -> World:
        return copy.deepcopy(self)

    def observed(self) -> Observed:
        reservations = tuple(Reservation(lend_reservation_name(n), n, t) for n, t in self.reserved.items()) \
            if self.reservations_known else None
        slurm = SlurmState(tuple(self.snodes.values()), tuple(self.jobs.values()), reservations=reservations) \
            if self.slurm_known and self.unreadable is None else SlurmState.unknown()
        return Observed(tuple(self.nodes.values()), tuple(self.pods.values()),
                        self.cluster if self.unreadable is None else None, slurm, self.unreadable,
                        None if self.budgets is None else frozenset(self.budgets))

    def summary(self) -> str:
        """A compact picture of the world, for failure messages."""
        lines = []
        for n in self.nodes.values():
            ann = {k.split("/")[-1]: v for k, v in n.annotations.items()}
            lines.append(f"node {n.name} state={n.labels.get('slurmk8s.dev/lending')} "
                         f"sel={n.labels.get('slurmk8s.dev/lendable')} to={n.labels.get('slurmk8s.dev/lendable-to')} gpus={n.gpus} ready={n.ready} "
                         f"cordoned={n.unschedulable} taint={[t.key for t in n.taints]} {ann}")
        for p in self.pods.values():
            lines.append(f"pod {p.namespace}/{p.name} node={p.node} {p.phase} gpus={p.gpus} prio={p.priority} "
                         f"owner={p.owner_kind} deleting={p.deleting} sel={dict(p.node_selector)} "
                         f"labels={dict(p.labels)}")
        for sn in self.snodes.values():
            lines.append(f"slurm {sn.name} {sn.state} {sorted(sn.flags)} {sn.reason!r} {sn.partitions}")
        for j in self.jobs.values():
            lines.append(f"job {j.job_id} {j.state} on {j.nodes!r} requeue={j.requeue}")
        lines.append(f"cluster={'yes' if self.cluster else 'none'} slurm_known={self.slurm_known} "
                     f"unreadable={self.unreadable} budgets={self.budgets}")
        return "\n".join(lines)

    def decide(self, pol, now: datetime) -> list:
        if isinstance(pol, NodeLendingPolicy) and self.status is not None:
            pol = pol.model_copy(update={"status": self.status})
        return decide(self.observed(), pol, now)

    def active_jobs(self, node: str) -> list[Job]:
        from slurmk8s.slurm.hostlist import expand
        return [j for j in self.jobs.values() if j.active and j.nodes and node in expand(j.nodes)]

    # -- what the loop does ---------------------------------------------------

    def apply(self, actions) -> int:
        """Run a round's actions through the loop's executor, :func:`slurmk8s.slurm.steps.execute`
        (Slurm's steps against :class:`WorldSlurm`, the rest by :meth:`_apply`). Returns how many were applied."""
        out = steps.execute(WorldSlurm(self), actions, other=self._apply,
                            chain=lambda a: None if isinstance(a, A.Event) else A.node_of(a))
        self.stopped = {n for a, _ in out.failed if (n := A.node_of(a)) is not None}
        return len(out.applied)

    def _apply(self, a) -> None:
        """What the loop does to Kubernetes (and the policy's status); raises where the loop fails."""
        if isinstance(a, NODE_PATCH_ACTIONS):
            self.nodes[a.node] = patched(self.nodes[a.node], node_patch(a, self.nodes[a.node]))
        elif isinstance(a, A.CreateSlurmdPod):
            if self.cluster is None:
                raise RuntimeError("the SlurmCluster is gone")
            node = self.nodes[a.node]
            # The pod as the loop has it rendered, so decide must find what the renderer makes.
            pod = pod_from_api(lent_slurmd_pod(self.cluster, "", node=a.node, resources=dict(a.resources),
                                               labels=node.labels, partition=a.partition, shm_size=a.shm_size,
                                               taint_key=TAINT_KEY, grace_seconds=a.grace_seconds,
                                               pod_template=a.pod_template))
            self.pods.setdefault((pod.namespace, pod.name), pod)
        elif isinstance(a, A.CreateBudget):
            if self.cluster is None:
                raise RuntimeError("the SlurmCluster is gone")
            # As the loop has it rendered: named and placed by the renderer, owned by the node's pod.
            obj = lent_budget(self.cluster, "", node=a.node, pod_uid=a.pod_uid)
            owner = (obj["metadata"]["namespace"], obj["metadata"]["ownerReferences"][0]["name"])
            if self.budgets is not None and owner in self.pods:
                self.budgets.setdefault((obj["metadata"]["namespace"], obj["metadata"]["name"]), owner)
        elif isinstance(a, A.DeleteBudget):
            if self.budgets is not None:
                self.budgets.pop((a.namespace, a.name), None)
        elif isinstance(a, A.DeleteSlurmdPod):
            pod = self.pods.get((a.namespace, a.name))
            if pod is not None:
                self.pods[(a.namespace, a.name)] = replace(pod, deleting=True)
        elif isinstance(a, A.PolicyStatus):
            self.status = a.status

    def _end(self, j: Job, outcome: str) -> None:
        """Slurm ends a running job as :mod:`slurmk8s.simulate.slurmrules` says: COMPLETING,
        then (``step``) pending again when requeued, gone when it ended."""
        self.jobs[j.job_id] = replace(j, state="COMPLETING")
        if outcome == slurmrules.ENDED:
            self.ended.add(j.job_id)

    # -- the world moving -----------------------------------------------------

    def lying_step(self, lie: int) -> None:
        """Slurm as the properties have it lie, then :meth:`step`: with ``lie`` every
        job shown stays RUNNING, whatever it was told; with ``lie == 3`` Slurm is
        also unknown."""
        if lie:
            self.jobs = {k: replace(j, state="RUNNING") for k, j in self.jobs.items()}
        if lie == 3:
            self.slurm_known = False
        self.step()

    def step(self) -> None:
        """Pods start and end, slurmd registers, ending jobs end."""
        for key, pod in list(self.pods.items()):
            if pod.deleting:
                del self.pods[key]
                if self.budgets is not None:  # its budget goes with it (garbage collection)
                    self.budgets = {k: owner for k, owner in self.budgets.items() if owner != key}
            elif pod.labels.get(COMPONENT_LABEL) == SLURMD_COMPONENT and pod.phase == "Pending" and pod.node:
                self.pods[key] = replace(pod, phase="Running")
                # Only the bridge's own pod runs a slurmd with the cluster's
                # munge key (a tenant's pod with that label registers nothing).
                if (pod.node not in self.snodes and self.cluster is not None
                        and key == (self.cluster.namespace, lent_slurmd(self.cluster.name, pod.node))):
                    self.snodes[pod.node] = slurm_node(pod.node)
        for j in list(self.jobs.values()):
            if j.state == "COMPLETING":
                if j.job_id in self.ended:
                    del self.jobs[j.job_id]
                else:
                    self.jobs[j.job_id] = replace(j, state="PENDING", nodes="")


class WorldSlurm:
    """The world's Slurm behind the :class:`~slurmk8s.slurm.control.SlurmControl` operations the
    executor calls, refusing (``SlurmError``) where Slurm does. Logs what was done to jobs in ``world.log``."""

    def __init__(self, world: World):
        self.w = world

    def _node(self, name: str, state: str) -> Node:
        s = self.w.snodes.get(name)
        if s is None:
            raise SlurmError(["scontrol", "update", f"nodename={name}", f"state={state}"], 1,
                             "Invalid node name specified")
        return s

    def drain(self, name: str, reason: str) -> None:
        s = self._node(name, "drain")
        if not s.drain_set:
            self.w.snodes[name] = replace(s, flags=s.flags | {"DRAIN"}, reason=f"{DRAIN_PREFIX} {reason}")

    def set_down(self, name: str, reason: str) -> None:
        w, s = self.w, self._node(name, "down")
        w.snodes[name] = replace(s, state="down", reason=f"{DRAIN_PREFIX} {reason}")
        for j in list(w.jobs.values()):  # Slurm ends them: requeued, or gone when they may not be
            if name in j.nodes.split(",") and j.state == "RUNNING":
                w.log.append(("node-fail", j.job_id, name))
                w._end(j, slurmrules.on_node_down(j.requeue))

    def undrain(self, name: str) -> None:
        s = self.w.snodes.get(name)
        if s is None or not s.drain_set:
            return
        if not s.drain_is_ours:
            raise NotOurDrain(f"node {name} was drained by someone else ({s.reason!r})")
        self.w.snodes[name] = replace(s, flags=s.flags - {"DRAIN"}, reason="")

    def signal_node_jobs(self, name: str, signal: str) -> list[int]:
        ids = [j.job_id for j in self.w.active_jobs(name) if j.state == "RUNNING"]
        self.w.log.extend(("signal", j, signal) for j in ids)
        return ids

    def _job_node(self, job_id: int) -> str:
        j = self.w.jobs.get(job_id)
        return j.nodes if j is not None else ""

    def requeue(self, job_id: int) -> None:
        w = self.w
        if job_id in w.jobs and slurmrules.on_requeue(w.jobs[job_id].requeue) is None:
            raise SlurmError(["scontrol", "requeue", str(job_id)], 1, "Requested operation is presently disabled")
        w.log.append(("requeue", job_id, self._job_node(job_id)))
        if job_id in w.jobs and w.jobs[job_id].state == "RUNNING":
            w._end(w.jobs[job_id], slurmrules.REQUEUED)

    def cancel(self, job_id: int) -> None:
        w = self.w
        w.log.append(("cancel", job_id, self._job_node(job_id)))
        if job_id in w.jobs and w.jobs[job_id].state == "RUNNING":
            w._end(w.jobs[job_id], slurmrules.on_cancel())

    def start_now(self, job_id: int) -> None:
        self.w.log.append(("start-now", job_id, self._job_node(job_id)))

    def delete_node(self, name: str) -> None:
        if not slurmrules.may_delete_node(len(self.w.active_jobs(name))):
            raise SlurmError(["scontrol", "delete", f"nodename={name}"], 1, "Requested nodes are busy")
        self.w.snodes.pop(name, None)

    def reserve(self, name: str, start: int) -> None:
        self._node(name, "reserve")
        self.w.log.append(("reserve", start, name))
        self.w.reserved[name] = start

    def unreserve(self, name: str) -> None:
        self.w.log.append(("unreserve", 0, name))
        self.w.reserved.pop(name, None)


def settle(world: World, pol, now: datetime, rounds: int = 20, step: timedelta = timedelta(seconds=10)):
    """Decide, apply and let the world move until nothing more happens."""
    for _ in range(rounds):
        acts = [a for a in world.decide(pol, now) if not isinstance(a, (A.Event, A.PolicyStatus))]
        world.apply(acts)
        world.step()
        now += step
    return now


__all__ = ["T0", "World", "cluster", "policy", "gpu_node", "gpu_pod", "slurm_node", "job", "settle",
           "PolicyGone"]
