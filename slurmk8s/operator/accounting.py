"""Accounting decisions of a round. Pure: no I/O.

- :func:`wanted`: the associations and QOS a cluster's spec asks for (every
  login user gets one, in the first account of ``spec.accounting.accounts``
  that lists the user, else in an account named after the user), and the
  directory groups whose members the agent adds.
- :func:`condition`: the AccountingReady condition from what the round saw.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from slurmk8s.api.cluster import SlurmCluster
from slurmk8s.api.status import ConditionStatus
from slurmk8s.render import names
from slurmk8s.slurm.accounting import Associations, QosLimits, minutes

__all__ = ["wanted", "condition", "applies"]

_Cond = tuple[ConditionStatus, str, str]  # status, reason, message


def wanted(c: SlurmCluster) -> Associations:
    acct = c.spec.accounting
    default: dict[str, str] = {}
    for account in acct.accounts:
        for user in account.users:
            default.setdefault(user, account.name)
    users = tuple((u.name, default.get(u.name, u.name)) for u in c.spec.login.users)
    accounts = tuple(dict.fromkeys([*(a.name for a in acct.accounts), *(a for _, a in users)]))
    qos = tuple(QosLimits(q.name, q.priority, minutes(q.max_wall) if q.max_wall else None,
                          q.max_jobs_per_user, q.max_submit_jobs_per_user) for q in acct.qos)
    # Their members are the directory's to say: the agent asks it (slurm/accounting.with_members).
    groups = tuple((a.name, tuple(a.groups)) for a in acct.accounts if a.groups) \
        if c.spec.identity.ldap is not None else ()
    return Associations(cluster=c.name, accounts=accounts, users=users, qos=qos, groups=groups)


def applies(c: SlurmCluster, observed: Sequence[Mapping]) -> bool:
    """Whether associations can be applied now: accounting on and slurmdbd ready."""
    if not c.spec.accounting.enabled:
        return False
    dbd = next((o for o in observed if o["kind"] == "Deployment" and o["metadata"]["name"] == names.slurmdbd(c)),
               None)
    return dbd is not None and int((dbd.get("status") or {}).get("readyReplicas") or 0) >= 1


def condition(c: SlurmCluster, observed: Sequence[Mapping], applied: bool | None, error: str = "") -> _Cond:
    """AccountingReady. ``applied``: the associations were applied this round
    (True), failed (False, ``error``), or were not tried (None)."""
    if not c.spec.accounting.enabled:
        return "True", "Disabled", "spec.accounting.enabled is false"
    w = {(o["kind"], o["metadata"]["name"]): o for o in observed}
    if c.spec.accounting.database.external is None:
        db = w.get(("StatefulSet", names.database(c)))
        if db is None or int((db.get("status") or {}).get("readyReplicas") or 0) < 1:
            return "False", "DatabaseNotReady", f"the MariaDB pod {names.database(c)}-0 is not ready"
    if not applies(c, observed):
        return "False", "SlurmdbdNotReady", f"the slurmdbd pod of Deployment {names.slurmdbd(c)} is not ready"
    if applied is None:
        return "False", "AssociationsPending", "the associations wait for the Slurm agent"
    if not applied:
        return "False", "AssociationsFailed", f"sacctmgr failed: {error}"
    return "True", "Recording", "slurmdbd records jobs; every login user has an association"
