"""The lending reservations: Slurm holds a lent node from the time it is
forecast to be wanted back (decision record 40). The record, its name, how
``scontrol -o show reservation`` reads (every release prints it so; 22.05
has no ``--json`` for reservations) and the agent's wire form."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["LEND_RESERVATION_PREFIX", "HOLD_RESERVATION_PREFIX", "Reservation", "lend_reservation_name", "reservations_from_text",
           "reservation_to_dict", "reservation_from_dict"]

#: The reservations the bridge makes on lent nodes start with this
#: (``slurmk8s-lend-<node>``); it touches no other (decision record 40).
LEND_RESERVATION_PREFIX = "slurmk8s-lend-"
#: A short reservation (two minutes) that holds a node while its lending
#: reservation, already begun, is made again later (Slurm does not move a
#: started one); never read, it ends by itself.
HOLD_RESERVATION_PREFIX = "slurmk8s-hold-"


@dataclass(frozen=True)
class Reservation:
    """A lending reservation: from ``start`` (POSIX seconds) on, Slurm starts
    no job on ``node`` (``Flags=MAINT,IGNORE_JOBS``), so backfill starts there
    only jobs whose time limit ends before it; the jobs already running keep running."""

    name: str
    node: str
    start: int


def lend_reservation_name(node: str) -> str:
    """The name of the lending reservation on ``node``."""
    return LEND_RESERVATION_PREFIX + node


def reservations_from_text(text: str, parse_time: Callable[[str], int | None]) -> list[Reservation]:
    """The lending reservations in ``scontrol -o show reservation`` (one line
    each, ``Key=Value`` fields). ``parse_time`` reads a StartTime
    (``2026-11-27T07:35:40``, in the command's time zone). Others' reservations,
    and ours on more than one node, are left out."""
    out = []
    for line in text.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        name, nodes = fields.get("ReservationName", ""), fields.get("Nodes", "")
        start = parse_time(fields.get("StartTime", ""))
        if (name.startswith(LEND_RESERVATION_PREFIX) and name == lend_reservation_name(nodes)
                and start is not None):
            out.append(Reservation(name, nodes, start))
    return out


def reservation_to_dict(r: Reservation) -> dict:
    return {"name": r.name, "node": r.node, "start": r.start}


def reservation_from_dict(d: dict) -> Reservation:
    return Reservation(str(d["name"]), str(d["node"]), int(d["start"]))
