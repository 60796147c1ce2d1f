"""The times on a held Node, as decide may trust them: never later than now. Pure.

The grace period, the force retry, the registration timeout and the reclaim
deadline all count from times written on the Node
(``slurmk8s.dev/lending-since``, ``reclaim-signalled``, ``reclaim-forced``),
and anyone who may patch the Node may write them. A time in the future
(year 9999, say) would keep a node lent or reclaiming for ever, and one
that cannot be read where the state machine needs it (a held node's
``lending-since``) would stop its clock. So, before a policy's round
(:func:`present`): on the nodes the policy holds, such a time reads as the
round's now, and :class:`~.actions.ClampTimes` writes now in its place,
first in the node's chain, with a Warning Event. The bridge keeps nothing in
memory, so the time written is what the next rounds count from: a grace
period or deadline runs at most as long as the policy allows from the first
round that saw the time, never longer.

Times in the past are taken as they are: they only make a node go back
sooner. Nodes serving Kubernetes are left alone: their times
(``idle-since``, ``free-since``) only delay lending when they are late.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from ..times import format_time
from .actions import Action, ClampTimes
from .nodestate import FORCED_ANNOTATION, SIGNALLED_ANNOTATION, SINCE_ANNOTATION, STATES
from .observed import KubeNode, Observed
from .patches import applied, node_patch
from .transitions import node_event

__all__ = ["present", "late_times"]

_ANNOTATION = {"since": SINCE_ANNOTATION, "signalled": SIGNALLED_ANNOTATION, "forced": FORCED_ANNOTATION}


def late_times(node: KubeNode, now: datetime) -> tuple[str, ...]:
    """The lending times of a held ``node`` that may not be trusted at
    ``now``: later than now, or (``since``) missing or unreadable."""
    rec = node.record
    late = []
    if rec.since is None or rec.since > now:
        late.append("since")
    if rec.signalled is not None and rec.signalled > now:
        late.append("signalled")
    if rec.forced is not None and rec.forced > now:
        late.append("forced")
    return tuple(late)


def _shown(value: str | None) -> str:
    """An annotation's value for a message: quoted, and cut short."""
    return repr(value if value is None or len(value) <= 40 else value[:40] + "...")


def present(observed: Observed, policy_key: str, now: datetime) -> tuple[Observed, list[Action]]:
    """``observed`` with the late times of the nodes ``policy_key`` holds
    (:attr:`~.nodestate.LendingRecord.holder`: a policy, or a holder of nodes no policy can be told for)
    read as ``now`` (to the second, as written), and the actions that write
    them so. ``observed`` itself when there are none."""
    fixed: dict[str, KubeNode] = {}
    acts: list[Action] = []
    for n in observed.nodes:
        rec = n.record
        if rec.state not in STATES or rec.holder != policy_key:
            continue
        late = late_times(n, now)
        if not late:
            continue
        action = ClampTimes(n.name, now, late)
        fixed[n.name] = applied(n, node_patch(action, n))
        was = ", ".join(f"{_ANNOTATION[f]}={_shown(n.annotations.get(_ANNOTATION[f]))}" for f in late)
        acts += [action, node_event(
            n.name, "TimeCorrected",
            f"{was}: a lending time may not be in the future or unreadable; read as {format_time(now)}, "
            "the grace period and the reclaim deadline count from then", warning=True)]
    if not fixed:
        return observed, []
    nodes: tuple[KubeNode, ...] = tuple(fixed.get(n.name, n) for n in observed.nodes)
    return replace(observed, nodes=nodes), acts
