"""The Event the operator and the bridge report: one shape for both. Pure.

An :class:`Event` says what happened (``type`` Normal or Warning, a
``reason``, a ``message``) and what it is about: ``kind``, ``namespace`` and
``name``. Each side posts it as a Kubernetes Event in its own way:

- the bridge about that object itself (a Node, its NodeLendingPolicy);
- the operator always about its SlurmCluster; ``kind``/``name`` only say
  which part of it a Warning concerns (a Slurm node, an object it writes),
  so that a lasting failure is announced once per reason and object
  (``slurmk8s.operator.announce``). ``kind`` may be empty there: ``name`` then names
  the thing in words (``create StatefulSet/x``).

An Event with no ``name`` is about the poster's own object as a whole.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Event", "NORMAL", "WARNING"]

NORMAL = "Normal"
WARNING = "Warning"


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str
    kind: str = ""
    #: Namespaced objects only; "" for Nodes and for parts of a SlurmCluster.
    namespace: str = ""
    name: str = ""

    @property
    def about(self) -> str:
        """What it is about as one string (``Node//n1``); "" for the poster's own object."""
        return f"{self.kind}/{self.namespace}/{self.name}" if self.name else ""
