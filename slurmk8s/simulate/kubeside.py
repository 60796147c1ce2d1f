"""The simulator's Kubernetes side: GPU nodes, serving pods bound best fit
to nodes without the lending taint, pending (Unschedulable) while none
fits, Running ``pod_start`` seconds after binding.

A mixin of the one simulator state (:class:`.engine._Sim`): its fields are
made by :meth:`KubeSide._init_kube`; it reads the clock (``t``, ``push``,
``changed``, ``advance``) and the accounting counters from that state."""

from __future__ import annotations

from dataclasses import replace

from ..bridge.observed import KubeNode, KubePod
from .params import POD_RUNNING, SERVING_NAMESPACE
from .state import SimState
from .traces import ServingPod


class _Pod:
    __slots__ = ("i", "spec", "node", "bound", "running", "obj", "ended")

    def __init__(self, i: int, spec: ServingPod):
        self.i, self.spec = i, spec
        self.node: str | None = None
        self.bound = self.running = False
        self.obj: KubePod | None = None
        self.ended = False


class KubeSide(SimState):
    def _init_kube(self, pods: list[ServingPod], labels: dict[str, str]) -> None:
        self.knames = [f"gpu-{k:04d}" for k in range(self.shape.kube_nodes)]
        self.kindex = {n: k for k, n in enumerate(self.knames)}
        alloc = {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": str(self.G)}
        self.knodes = [KubeNode(name=n, labels=dict(labels), allocatable=alloc) for n in self.knames]
        self.nodes_tuple: tuple[KubeNode, ...] | None = None
        self.kfree = [self.G] * len(self.knames)  # GPUs not held by serving pods
        self.schedulable_at = [0.0] * len(self.knames)
        self.pods = [_Pod(i, p) for i, p in enumerate(pods)]
        self.pod_objs: dict[tuple[str, str], KubePod] = {}
        self.pods_tuple: tuple[KubePod, ...] | None = None
        self.pending: dict[int, None] = {}  # serving pods waiting, in creation order
        self.k8s_needed = False
        self.slurmd_template: dict[tuple[str, tuple[tuple[str, str], ...]], KubePod] = {}  # by (node, resources)

    def observed_nodes(self) -> tuple[KubeNode, ...]:
        if self.nodes_tuple is None:
            self.nodes_tuple = tuple(self.knodes)
        return self.nodes_tuple

    def observed_pods(self) -> tuple[KubePod, ...]:
        if self.pods_tuple is None:
            self.pods_tuple = tuple(self.pod_objs.values())
        return self.pods_tuple

    def _set_pod(self, key: tuple[str, str], obj: KubePod | None) -> None:
        if obj is None:
            self.pod_objs.pop(key, None)
        else:
            self.pod_objs[key] = obj
        self.pods_tuple = None
        self.changed()

    def _schedulable(self, k: int) -> bool:
        n = self.knodes[k]
        return n.record.taint is None and not n.unschedulable and self.schedulable_at[k] <= self.t

    def _bind(self, p: _Pod) -> bool:
        best = None
        for k in range(len(self.knodes)):
            f = self.kfree[k]
            if f >= p.spec.gpus and (best is None or f < self.kfree[best]) and self._schedulable(k):
                best = k
                if f == p.spec.gpus:
                    break
        if best is None:
            return False
        self.advance(self.t)
        self.kfree[best] -= p.spec.gpus
        p.node = self.knames[best]
        p.bound = True
        self._set_pod(("serving", f"serve-{p.i}"),
                      KubePod(SERVING_NAMESPACE, f"serve-{p.i}", node=p.node, phase="Pending", gpus=p.spec.gpus,
                              owner_kind="ReplicaSet"))
        self.push(self.t + self.lat.pod_start, POD_RUNNING, p.i)
        return True

    def pod_start(self, i: int) -> None:
        p = self.pods[i]
        if self.mode == "oracle":
            self.advance(self.t)
            self.serving_gpus += p.spec.gpus
            p.running = True
            self.res.serving_pending.append(0.0)
            return
        if not self.pending and self._bind(p):
            return
        self.pending[i] = None
        self._set_pod(("serving", f"serve-{i}"),
                      KubePod(SERVING_NAMESPACE, f"serve-{i}", phase="Pending", gpus=p.spec.gpus,
                              owner_kind="ReplicaSet", unschedulable=True))
        self.k8s_needed = True

    def pod_running(self, i: int) -> None:
        p = self.pods[i]
        if p.ended or not p.bound:
            return
        self.advance(self.t)
        p.running = True
        self.serving_gpus += p.spec.gpus
        self.res.serving_pending.append(self.t - p.spec.start)
        self._set_pod(("serving", f"serve-{i}"), replace(self.pod_objs[("serving", f"serve-{i}")], phase="Running"))

    def pod_end(self, i: int) -> None:
        p = self.pods[i]
        p.ended = True
        self.advance(self.t)
        if p.running:
            self.serving_gpus -= p.spec.gpus
        elif self.mode != "oracle":
            self.res.serving_pending.append(self.t - p.spec.start)
        if self.mode == "oracle":
            return
        self.pending.pop(i, None)
        if p.bound:
            assert p.node is not None  # bound to it
            self.kfree[self.kindex[p.node]] += p.spec.gpus
            self.k8s_needed = True
        self._set_pod(("serving", f"serve-{i}"), None)

    def bind_pending(self) -> None:
        self.k8s_needed = False
        for i in list(self.pending):
            if self._bind(self.pods[i]):
                del self.pending[i]
