"""Moving a running cluster to another Slurm release (spec.slurm.version). Pure: no I/O.

Slurm's rules (its upgrade guide and release notes), in one place:

- :func:`refused`: a release reads the state files and accounting records of
  the few releases before it (``versions.upgrade_problem``) and of no newer
  one. A wider step or a downgrade is refused with the field path, and the
  round changes nothing: the cluster keeps running its release.
- :func:`held`: the daemons move in order, slurmdbd, then slurmctld, then
  slurmd, the commands (the login pods) and slurmrestd. A daemon may talk to
  an older one only from above, so each waits until the one before it runs
  the new image and is ready.

The release a cluster runs is the ``app.kubernetes.io/version`` label of its
controller StatefulSet, which the operator writes together with its template.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from slurmk8s import versions
from slurmk8s.api.cluster import SlurmCluster
from slurmk8s.render import names
from slurmk8s.render.names import VERSION_LABEL

from .plan import Key, key

__all__ = ["running_release", "refused", "held"]

#: Workloads that move after slurmctld (their app.kubernetes.io/component).
_AFTER_SLURMCTLD = ("worker", "login", "restapi")


def _labels(obj: Mapping | None) -> Mapping[str, str]:
    return ((obj or {}).get("metadata") or {}).get("labels") or {}


def _image(obj: Mapping | None, container: str) -> str | None:
    for ct in ((((obj or {}).get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers") or []:
        if ct.get("name") == container:
            return ct.get("image")
    return None


def _rolled_out(obj: Mapping) -> bool:
    """A StatefulSet or Deployment whose every pod runs its current template and is ready."""
    st = obj.get("status") or {}
    gen = (obj.get("metadata") or {}).get("generation")
    want = int((obj.get("spec") or {}).get("replicas", 1))
    if gen is not None and st.get("observedGeneration") != gen:
        return False
    if obj.get("kind") == "StatefulSet" and st.get("updateRevision") and \
            st.get("currentRevision") != st.get("updateRevision"):
        return False
    return int(st.get("updatedReplicas") or 0) >= want and int(st.get("readyReplicas") or 0) >= max(want, 1) \
        and int(st.get("replicas") or 0) == int(st.get("updatedReplicas") or 0)


def _controller(c: SlurmCluster, observed: Sequence[Mapping]) -> Mapping | None:
    return next((o for o in observed if o["kind"] == "StatefulSet" and o["metadata"]["name"] == names.controller(c)),
                None)


def running_release(c: SlurmCluster, observed: Sequence[Mapping]) -> str | None:
    """The release the cluster's controller StatefulSet was last written for; None for a new cluster."""
    return _labels(_controller(c, observed)).get(VERSION_LABEL)


def refused(c: SlurmCluster, observed: Sequence[Mapping]) -> str | None:
    """Why the spec's release cannot replace the running one in place, or None."""
    running = running_release(c, observed)
    if running is None:
        return None
    problem = versions.upgrade_problem(running, c.spec.slurm.version)
    return None if problem is None else f"spec.slurm.version: {problem}"


def held(c: SlurmCluster, desired: Sequence[Mapping], observed: Sequence[Mapping]) -> tuple[frozenset[Key], list[str]]:
    """The workload updates that wait this round, and why."""
    have = {key(o): o for o in observed}
    want = {key(o): o for o in desired}
    keys: set[Key] = set()
    why: list[str] = []
    ctld_key = ("StatefulSet", names.controller(c))
    dbd_key = ("Deployment", names.slurmdbd(c))

    # 1. slurmctld after slurmdbd: a new slurmctld may speak a protocol an old slurmdbd does not know.
    have_ctld, want_ctld = _image(have.get(ctld_key), "slurmctld"), _image(want.get(ctld_key), "slurmctld")
    if c.spec.accounting.enabled and have_ctld is not None and have_ctld != want_ctld:
        dbd = have.get(dbd_key)
        want_dbd = _image(want.get(dbd_key), "slurmdbd")
        if dbd is None or _image(dbd, "slurmdbd") != want_dbd or not _rolled_out(dbd):
            keys.add(ctld_key)
            why.append(f"slurmctld stays on {have_ctld} until slurmdbd runs {want_dbd} and is ready "
                       "(Slurm upgrades slurmdbd first)")

    # 2. slurmd, the commands and slurmrestd after slurmctld, on a release change.
    ctld = have.get(ctld_key)
    release = c.spec.slurm.version
    if ctld is not None and (_labels(ctld).get(VERSION_LABEL) != release or ctld_key in keys or not _rolled_out(ctld)):
        stale = sorted(k for k, o in want.items() if k in have and k[0] in ("StatefulSet", "Deployment")
                       and _labels(o).get("app.kubernetes.io/component") in _AFTER_SLURMCTLD
                       and _labels(have[k]).get(VERSION_LABEL) != release)
        if stale:
            keys.update(stale)
            old = sorted({_labels(have[k]).get(VERSION_LABEL) or "?" for k in stale})
            why.append(f"{', '.join(f'{k}/{n}' for k, n in stale)} stay on Slurm {', '.join(old)} until slurmctld "
                       f"runs {release} and is ready (Slurm upgrades slurmctld before the nodes and commands)")
    return frozenset(keys), why
