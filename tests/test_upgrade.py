"""Moving a running cluster to another Slurm release (slurmk8s.operator.upgrade), without I/O."""

from __future__ import annotations

import copy

import pytest

from slurmk8s import versions
from slurmk8s.api import load_cluster
from slurmk8s.operator import upgrade
from slurmk8s.render import ClusterKeys, names, render

KEYS = ClusterKeys.generate()


def cluster(doc, version, accounting=True):
    d = copy.deepcopy(doc)
    d["spec"]["slurm"]["version"] = version
    if not accounting:
        d["spec"].pop("accounting", None)
    return load_cluster(d)


def running(c, ready=True):
    """The cluster's workloads as the API server shows them once rolled out (``ready``)."""
    out = []
    for o in render(c, KEYS):
        if o["kind"] not in ("StatefulSet", "Deployment"):
            continue
        o = copy.deepcopy(o)
        o["metadata"]["generation"] = 3
        n = o["spec"].get("replicas", 1)
        o["status"] = {"observedGeneration": 3, "replicas": n, "readyReplicas": n if ready else 0,
                       "updatedReplicas": n, "currentRevision": "r1", "updateRevision": "r1"}
        out.append(o)
    return out


def replace(objs, new):
    """``objs`` with the workloads of ``new`` put in their place."""
    names_ = {(o["kind"], o["metadata"]["name"]) for o in new}
    return [o for o in objs if (o["kind"], o["metadata"]["name"]) not in names_] + new


def pick(objs, kind, name):
    return [o for o in objs if (o["kind"], o["metadata"]["name"]) == (kind, name)]


@pytest.mark.parametrize("old", versions.SUPPORTED)
@pytest.mark.parametrize("new", versions.SUPPORTED)
def test_only_the_steps_slurm_upgrades_in_place_are_accepted(doc, old, new):
    c = cluster(doc, new)
    why = upgrade.refused(c, running(cluster(doc, old)))
    if old == new or old in versions.release(new).upgrades_from:
        assert why is None
    else:
        assert why.startswith("spec.slurm.version: ") and f"runs {old}" in why and f"Set it back to {old}" in why
        assert ("does not downgrade" in why) == (new < old)
    assert upgrade.refused(c, []) is None  # a new cluster takes any release


def test_a_release_label_that_is_no_release_moves_nothing(doc):
    before = running(cluster(doc, "24.11"))
    for o in before:
        o["metadata"]["labels"]["app.kubernetes.io/version"] = "latest"
    why = upgrade.refused(cluster(doc, "26.05"), before)
    assert why.startswith("spec.slurm.version: ") and "'latest'" in why and "restore the label" in why


def test_24_11_to_26_05_is_an_upgrade_slurm_supports():
    # The matrix offers one in-place step; the e2e lifecycle test makes it with real daemons.
    assert versions.upgrade_problem("24.11", "26.05") is None
    assert "24.11" in versions.release("26.05").upgrades_from


def test_the_daemons_move_in_slurms_order(doc):
    old, new = cluster(doc, "24.11"), cluster(doc, "26.05")
    desired = render(new, KEYS)
    ctld = ("StatefulSet", names.controller(new))
    later = {("StatefulSet", "demo-cpu"), ("StatefulSet", "demo-gpu"), ("Deployment", "demo-login")}
    before = running(old)

    # Everything still on 24.11: slurmdbd (and MariaDB) go; slurmctld waits for slurmdbd; the rest for slurmctld.
    keys, why = upgrade.held(new, desired, before)
    assert keys == {ctld} | later
    assert "slurmdbd first" in why[0] and "24.11" in why[0]
    assert "slurmctld before the nodes" in why[1] and "24.11" in why[1]

    # slurmdbd updated, its new pod not ready yet: the same.
    dbd_rolling = running(new, ready=False)
    now = replace(before, pick(dbd_rolling, "Deployment", names.slurmdbd(new)))
    assert upgrade.held(new, desired, now)[0] == {ctld} | later

    # slurmdbd updated, but its controller has not seen the new generation yet: the same.
    [dbd_stale] = pick(running(new), "Deployment", names.slurmdbd(new))
    dbd_stale["status"]["observedGeneration"] = 2
    assert upgrade.held(new, desired, replace(before, [dbd_stale]))[0] == {ctld} | later

    # slurmdbd runs 26.05, ready: slurmctld goes; the rest still wait.
    now = replace(before, pick(running(new), "Deployment", names.slurmdbd(new)))
    assert upgrade.held(new, desired, now)[0] == later

    # The controller StatefulSet is written for 26.05 but its pod is not replaced yet.
    [ctld_new] = pick(running(new), *ctld)
    ctld_new["status"]["updateRevision"] = "r2"
    assert upgrade.held(new, desired, replace(now, [ctld_new]))[0] == later

    # slurmctld runs 26.05, ready: nothing waits.
    now = replace(now, pick(running(new), *ctld))
    assert upgrade.held(new, desired, now) == (frozenset(), [])


def test_without_accounting_slurmctld_goes_first(doc):
    old, new = cluster(doc, "24.11", accounting=False), cluster(doc, "26.05", accounting=False)
    keys, why = upgrade.held(new, render(new, KEYS), running(old))
    assert ("StatefulSet", names.controller(new)) not in keys and ("StatefulSet", "demo-gpu") in keys


def test_nothing_waits_without_a_release_change(doc):
    c = cluster(doc, "26.05")
    assert upgrade.held(c, render(c, KEYS), running(c)) == (frozenset(), [])
    assert upgrade.held(c, render(c, KEYS), []) == (frozenset(), [])  # a new cluster
    # A worker StatefulSet rolling for another reason waits for nothing here (the operator rolls it).
    assert upgrade.held(c, render(c, KEYS), running(c, ready=False)) == (frozenset(), [])
