"""Accounting decisions of a round. Pure: no I/O.

- :func:`wanted`: the associations and QOS a cluster's spec asks for (every
  login user gets one, in the first account of ``spec.accounting.accounts``
  that lists the user, else in an account named after the user).
- :func:`slurmdbd_first`: on a Slurm version change, slurmctld's new image
  waits until slurmdbd runs the new release and is ready (Slurm's upgrade
  order: slurmdbd, then slurmctld, then the nodes).
- :func:`condition`: the AccountingReady condition from what the round saw.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from slurmk8s.api.cluster import SlurmCluster
from slurmk8s.render import names
from slurmk8s.slurm.accounting import Associations, QosLimits, minutes

__all__ = ["wanted", "slurmdbd_first", "condition", "applies"]

_Cond = tuple[str, str, str]  # status, reason, message


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
    return Associations(cluster=c.name, accounts=accounts, users=users, qos=qos)


def _image(obj: Mapping | None, container: str) -> str | None:
    if obj is None:
        return None
    for ct in (((obj.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers") or []:
        if ct.get("name") == container:
            return ct.get("image")
    return None


def _rolled_out(obj: Mapping) -> bool:
    """A Deployment whose current template's pod is ready (the controller's status for its generation)."""
    st = obj.get("status") or {}
    gen = (obj.get("metadata") or {}).get("generation")
    return (gen is None or st.get("observedGeneration") == gen) and \
        int(st.get("updatedReplicas") or 0) >= 1 and int(st.get("readyReplicas") or 0) >= 1 \
        and int(st.get("replicas") or 0) == int(st.get("updatedReplicas") or 0)


def slurmdbd_first(c: SlurmCluster, desired: Sequence[Mapping], observed: Sequence[Mapping]) -> str | None:
    """Why the controller StatefulSet's update must wait, or None when it may go.

    It waits only when it would change slurmctld's image while slurmdbd does
    not yet run the desired image, ready: a new slurmctld may speak a
    protocol an old slurmdbd does not know, never the other way round.
    """
    if not c.spec.accounting.enabled:
        return None
    by_key = {(o["kind"], o["metadata"]["name"]): o for o in observed}
    want = {(o["kind"], o["metadata"]["name"]): o for o in desired}
    ctld_key = ("StatefulSet", names.controller(c))
    dbd_key = ("Deployment", names.slurmdbd(c))
    have_ctld = _image(by_key.get(ctld_key), "slurmctld")
    want_ctld = _image(want.get(ctld_key), "slurmctld")
    if have_ctld is None or have_ctld == want_ctld:
        return None  # a new cluster, or no image change: nothing to order
    dbd = by_key.get(dbd_key)
    if dbd is None or _image(dbd, "slurmdbd") != _image(want.get(dbd_key), "slurmdbd") or not _rolled_out(dbd):
        return (f"slurmctld stays on {have_ctld} until slurmdbd runs {_image(want.get(dbd_key), 'slurmdbd')} "
                "and is ready (Slurm upgrades slurmdbd first)")
    return None


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
