"""The oracle run's foresight: serving's node demand over the whole trace,
so that a Kubernetes node is given to a Slurm job only when serving will not
need it before the job ends (an upper bound for any lending policy).

A mixin of the one simulator state (:class:`.engine._Sim`), read by the Slurm
side's placement."""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right

from .params import ORACLE
from .state import SimState
from .traces import ServingPod


class OracleSide(SimState):
    def _init_oracle(self) -> None:
        # serving GPU demand as a step function, and per Kubernetes node when serving wants it
        self.oracle_busy: list[list[tuple[float, float]]] = []
        self.oracle_starts: list[list[float]] = []

    def oracle_setup(self, pods: list[ServingPod]) -> None:
        """Serving's node demand D(t) = ceil(GPUs / G); node k serves while D > k."""
        steps: dict[float, int] = {}
        for p in pods:
            steps[p.start] = steps.get(p.start, 0) + p.gpus
            steps[p.end] = steps.get(p.end, 0) - p.gpus
        K = len(self.knames)
        busy: list[list[tuple[float, float]]] = [[] for _ in range(K)]
        opened: list[float | None] = [None] * K
        gpus = 0
        for t in sorted(steps):
            gpus += steps[t]
            d = min(K, math.ceil(gpus / self.G - 1e-9))
            for k in range(K):
                start = opened[k]
                if k < d and start is None:
                    opened[k] = t
                elif k >= d and start is not None:
                    busy[k].append((start, t))
                    opened[k] = None
            self.push(t, ORACLE)
        for k, start in enumerate(opened):
            if start is not None:
                busy[k].append((start, math.inf))
        self.oracle_busy = busy
        self.oracle_starts = [[a for a, _ in b] for b in busy]
        for k, name in enumerate(self.knames):
            s = self._add_snode(name, lent=True)
            s.oracle_index = k
        self.lent_nodes = 0

    def _oracle_free_until(self, s) -> float:
        """Until when serving leaves this node alone (now: -inf if it serves now)."""
        k, t = s.oracle_index, self.t
        busy, starts = self.oracle_busy[k], self.oracle_starts[k]
        i = bisect_right(starts, t) - 1
        if i >= 0 and busy[i][1] > t:
            return -math.inf
        j = bisect_left(starts, t)
        if j < len(starts) and starts[j] == t:
            return -math.inf
        return starts[j] if j < len(starts) else math.inf

    def oracle_lent_nodes(self) -> None:
        self.advance(self.t)
        self.lent_nodes = sum(1 for n in self.knames if self.snodes[n].jobs)
