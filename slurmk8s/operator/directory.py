"""The DirectoryReady condition and its Events, from the probe's verdict
(slurm/directory.py). Pure: no I/O.

A directory that is down does not make the cluster unready: jobs run, and
users sssd has cached log in. The condition and a Warning Event say what
failed and who waits; a Normal Event says when it answers again.
"""

from __future__ import annotations

from slurmk8s.api.status import Condition, ConditionStatus
from slurmk8s.events import Event
from slurmk8s.slurm.directory import Verdict

__all__ = ["condition", "event", "CONDITION"]

CONDITION = "DirectoryReady"
_Cond = tuple[ConditionStatus, str, str]  # status, reason, message

#: state -> (condition status, reason)
_CONDITION: dict[str, tuple[ConditionStatus, str]] = {
    "ok": ("True", "Reachable"),
    "unreachable": ("False", "Unreachable"),
    "tls": ("False", "TLSFailed"),
    "bind": ("False", "BindFailed"),
    "error": ("False", "ProbeFailed"),
    "unknown": ("Unknown", "Unknown"),
}
_CONSEQUENCE = {
    "unreachable": "users who logged in before still log in, from sssd's cache, and jobs run on; "
                   "users not seen before wait until it answers",
    "tls": "sssd cannot read the directory over TLS: users not cached wait",
    "bind": "sssd keeps the password it started with until it restarts; then users not cached wait",
}


def condition(verdict: Verdict | None, error: str = "") -> _Cond:
    """DirectoryReady (status, reason, message) from the probe's verdict; None: the agent
    did not answer (``error``), and what the directory does is unknown."""
    if verdict is None:
        return "Unknown", "Unknown", f"the Slurm agent did not say: {error}" if error else "not checked this round"
    status, reason = _CONDITION[verdict.state]
    message = verdict.message or verdict.state
    if verdict.state in _CONSEQUENCE:
        message = f"{message}; {_CONSEQUENCE[verdict.state]}"
    return status, reason, message


def event(previous: Condition | None, now: _Cond) -> Event | None:
    """A Warning when the directory turns unhealthy (or fails otherwise than before), a
    Normal Event when it answers again; none while unknown or unchanged."""
    status, reason, message = now
    if status == "Unknown" or (previous is not None and (previous.status, previous.reason) == (status, reason)):
        return None
    if status == "False":
        return Event("Warning", f"Directory{reason}", message)
    if previous is not None and previous.status == "False":
        return Event("Normal", "DirectoryReachable", message)
    return None
