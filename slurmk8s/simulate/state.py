"""What the simulator's sides (:mod:`.slurmside`, :mod:`.kubeside`,
:mod:`.oracle`) read of the one simulator state, :class:`.engine._Sim`: its
parameters, its clock and accounting, and each other's fields. Declarations
only: the engine and the sides set them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .params import Latencies, Result, Shape
    from .slurmside import _SNode


class SimState:
    # the run's parameters (the engine's)
    shape: Shape
    lat: Latencies
    G: int
    mode: str
    partition: str
    queue_depth: int
    time_limits: bool
    epoch_s: float
    # the clock and the accounting (the engine's)
    t: float
    res: Result
    serving_gpus: int
    own_gpus: int
    lent_gpus: int
    lent_nodes: int
    # the Kubernetes side's node names, the Slurm side's nodes
    knames: list[str]
    snodes: dict[str, _SNode]

    if TYPE_CHECKING:  # defined by the engine and the sides; here only what they look like
        def push(self, t: float, kind: int, a: Any = None, b: Any = None) -> None: ...

        def changed(self) -> None: ...

        def advance(self, t: float) -> None: ...

        def _add_snode(self, name: str, lent: bool) -> _SNode: ...

        def _oracle_free_until(self, s: _SNode) -> float: ...
