"""Desired vs observed objects -> plan (slurmk8s.operator.plan), without I/O."""

from __future__ import annotations

import copy
import itertools

from hypothesis import HealthCheck, assume, given, settings

from slurmk8s import versions
from slurmk8s.api import InvalidSpec, load_cluster
from slurmk8s.operator.plan import (
    MANAGED_KINDS,
    Create,
    Delete,
    Update,
    differences,
    is_ours,
    key,
    plan,
    with_replicas,
)
from slurmk8s.render import ClusterKeys, names, render

from .fakekube import claim_name
from .reach import reached, reaches
from .test_property import specs

KEYS = ClusterKeys.generate()
UID = "0b5e2c6e-1111-4c2b-9c57-3a9a4d3c2e01"
_uids = itertools.count(1)


def cluster_of(doc):
    doc = copy.deepcopy(doc)
    doc["metadata"]["uid"] = UID
    return load_cluster(doc)


def serve(obj: dict, previous: dict | None = None) -> dict:
    """What an API server holds after a write of ``obj``: server fields and defaults added."""
    o = copy.deepcopy(obj)
    meta = o["metadata"]
    old = (previous or {}).get("metadata", {})
    meta["uid"] = old.get("uid") or f"uid-{next(_uids)}"
    meta["resourceVersion"] = str(next(_uids))
    meta["creationTimestamp"] = "2026-11-21T00:00:00Z"
    meta["managedFields"] = [{"manager": names.FIELD_MANAGER, "operation": "Apply"}]
    meta.setdefault("annotations", {})["deployment.kubernetes.io/revision"] = "1"
    spec = o.get("spec", {})
    if o["kind"] == "Service":
        spec.setdefault("clusterIP", "10.0.0.7")
        spec["sessionAffinity"] = "None"
        spec["ipFamilies"] = ["IPv4"]
        for p in spec["ports"]:
            p["protocol"] = "TCP"
    template = spec.get("template")
    if template:
        pod = template["spec"]
        pod.update(restartPolicy="Always", dnsPolicy="ClusterFirst", schedulerName="default-scheduler")
        pod.setdefault("securityContext", {})
        for c in pod["containers"]:
            c.update(terminationMessagePath="/dev/termination-log", terminationMessagePolicy="File")
            for p in c.get("ports", []):
                p["protocol"] = "TCP"
        for v in pod.get("volumes", []):
            if "configMap" in v:
                v["configMap"]["defaultMode"] = 420
        spec["revisionHistoryLimit"] = 10
        o["status"] = {"replicas": spec.get("replicas", 1), "readyReplicas": spec.get("replicas", 1)}
    if o["kind"] == "PersistentVolumeClaim":
        spec["volumeName"] = "pv-1"
        spec["volumeMode"] = "Filesystem"
        o["status"] = {"phase": "Bound"}
    return o


def apply(p, observed: list[dict]) -> list[dict]:
    """The API server after the plan: creates and updates served, deletes gone."""
    by_key = {key(o): o for o in observed}
    for action in p:
        if isinstance(action, Delete):
            by_key.pop(action.key)
        else:
            by_key[action.key] = serve(action.obj, by_key.get(action.key))
    return list(by_key.values())


def test_a_new_cluster_creates_every_object_in_dependency_order(doc):
    c = cluster_of(doc)
    desired = render(c, KEYS)
    p = plan(desired, [], cluster_name=c.name)
    assert [a.obj for a in p.creates] == sorted(desired, key=lambda o: MANAGED_KINDS.index(o["kind"]))
    assert not p.updates and not p.deletes
    kinds = [a.obj["kind"] for a in p.creates]
    assert kinds.index("ConfigMap") < kinds.index("Secret") < kinds.index("StatefulSet")


def test_every_object_is_owned_by_the_cluster_except_retained_claims(doc):
    c = cluster_of(doc)
    for action in plan(render(c, KEYS), [], cluster_name=c.name).creates:
        refs = action.obj["metadata"].get("ownerReferences")
        if action.obj["kind"] == "PersistentVolumeClaim":
            assert refs is None  # deletionPolicy Retain
        else:
            assert refs == [{"apiVersion": "slurmk8s.dev/v1alpha1", "kind": "SlurmCluster", "name": "demo",
                             "uid": UID, "controller": True, "blockOwnerDeletion": True}]


def test_applying_the_plan_yields_an_empty_plan(doc):
    c = cluster_of(doc)
    desired = render(c, KEYS)
    observed = apply(plan(desired, [], cluster_name=c.name), [])
    assert plan(desired, observed, cluster_name=c.name).empty


def valid_or_none(doc):
    try:
        return cluster_of(doc)
    except InvalidSpec:
        return None


@reaches(valid=0.8, updates=0.5, deletes=0.2)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs(clean=True), specs(clean=True))
def test_any_change_of_spec_converges_in_one_plan(first, second):
    """From any valid cluster to any other: one plan, then nothing left to do."""
    second = copy.deepcopy(second)
    second["metadata"]["name"] = first["metadata"]["name"]
    a, b = valid_or_none(first), valid_or_none(second)
    assume(a is not None and b is not None)  # clean specs are valid: test_property.py
    reached("valid")
    observed = apply(plan(render(a, KEYS), [], cluster_name=a.name), [])
    desired = render(b, KEYS)
    p = plan(desired, observed, cluster_name=a.name)
    if p.updates:
        reached("updates")
    if p.deletes:
        reached("deletes")
    after = apply(p, observed)
    assert plan(desired, after, cluster_name=a.name).empty
    # Nothing desired is deleted, no key Secret is rewritten, and every
    # object left is desired or not ours to delete.
    wanted = {key(o) for o in desired}
    assert not any(d.key in wanted for d in p.deletes)
    assert not any(u.obj["kind"] == "Secret" for u in p.updates)
    for o in after:
        assert key(o) in wanted or o["metadata"]["annotations"].get(names.CREATE_ONLY) == "true" or \
            o["kind"] == "PersistentVolumeClaim"


def test_updates_happen_only_when_a_rendered_field_differs(doc):
    c = cluster_of(doc)
    desired = render(c, KEYS)
    observed = apply(plan(desired, [], cluster_name=c.name), [])
    sts = next(o for o in observed if key(o) == ("StatefulSet", "demo-gpu"))
    sts["spec"]["replicas"] = 5  # someone scaled it by hand
    sts["metadata"]["labels"]["team"] = "hpc"  # someone else's label: not ours to judge
    cm = next(o for o in observed if key(o) == ("ConfigMap", "demo-slurm-config"))
    cm["data"]["slurm.conf"] += "# edited by hand\n"
    p = plan(desired, observed, cluster_name=c.name)
    assert {(u.key, u.changed) for u in p.updates} == {
        (("StatefulSet", "demo-gpu"), ("spec.replicas",)),
        (("ConfigMap", "demo-slurm-config"), ("data.slurm.conf",)),
    }
    assert not p.creates and not p.deletes


def test_a_statefulsets_update_keeps_the_claim_templates_it_has(doc):
    """Kubernetes refuses any change of a StatefulSet's volumeClaimTemplates (422): an
    update carries the ones the object has, and a difference there alone is no update."""
    c = cluster_of(doc)
    observed = apply(plan(render(c, KEYS), [], cluster_name=c.name), [])
    ctld = next(o for o in observed if key(o) == ("StatefulSet", "demo-controller"))
    ctld["spec"]["volumeClaimTemplates"][0]["metadata"]["labels"]["app.kubernetes.io/version"] = "old"
    ctld["spec"]["volumeClaimTemplates"][0]["status"] = {"phase": "Pending"}  # as the server echoes it
    assert plan(render(c, KEYS), observed, cluster_name=c.name).empty
    doc = copy.deepcopy(doc)
    doc["spec"]["slurm"]["image"] = {"tag": "patched-2"}
    [u] = [u for u in plan(render(cluster_of(doc), KEYS), observed, cluster_name=c.name).updates
           if u.key == ("StatefulSet", "demo-controller")]
    assert u.obj["spec"]["volumeClaimTemplates"] == ctld["spec"]["volumeClaimTemplates"]
    assert "spec.template.spec.containers[0].image" in u.changed


def test_a_claims_update_keeps_the_spec_it_has_but_its_size(doc):
    """Kubernetes refuses any change of a claim's spec but its size (422): a shared claim
    made with another StorageClass (the spec's or the operator's default changed since)
    keeps it, and only a new size is an update, carrying the class the claim has."""
    from slurmk8s.api.storageclass import with_storage_class

    made = with_storage_class(cluster_of(doc), "nfs")
    observed = apply(plan(render(made, KEYS), [], cluster_name=made.name), [])
    claim = next(o for o in observed if key(o) == ("PersistentVolumeClaim", "demo-shared"))
    assert claim["spec"]["storageClassName"] == "nfs"
    moved = with_storage_class(cluster_of(doc), "efs-sc")
    assert plan(render(moved, KEYS), observed, cluster_name=made.name).empty
    grown = copy.deepcopy(doc)
    grown["spec"]["sharedStorage"]["volumes"][0]["size"] = "200Gi"
    [u] = plan(render(with_storage_class(cluster_of(grown), "efs-sc"), KEYS), observed, cluster_name=made.name).updates
    assert u.key == ("PersistentVolumeClaim", "demo-shared") and u.changed == ("spec.resources.requests.storage",)
    assert u.obj["spec"]["storageClassName"] == "nfs" and u.obj["spec"]["volumeName"] == "pv-1"


def test_claim_templates_do_not_change_with_the_slurm_release(doc):
    def claims(version):
        d = copy.deepcopy(doc)
        d["spec"]["slurm"]["version"] = version
        return {o["metadata"]["name"]: o["spec"]["volumeClaimTemplates"]
                for o in render(cluster_of(d), KEYS) if o["kind"] == "StatefulSet" and "volumeClaimTemplates" in o["spec"]}

    first = claims(versions.SUPPORTED[0])
    assert first and all(claims(v) == first for v in versions.SUPPORTED)


def test_key_secrets_are_never_updated_or_deleted(doc):
    c = cluster_of(doc)
    observed = apply(plan(render(c, KEYS), [], cluster_name=c.name), [])
    other = ClusterKeys.generate()
    p = plan(render(c, other), observed, cluster_name=c.name)
    assert not [u for u in p.updates if u.obj["kind"] == "Secret"]
    # Even when the cluster no longer wants a key Secret, it stays.
    p = plan([], observed, cluster_name=c.name)
    deleted = {d.key for d in p.deletes}
    assert not any(kind == "Secret" for kind, _ in deleted)
    assert ("StatefulSet", "demo-gpu") in deleted


def test_quantities_compare_by_value():
    desired = {"spec": {"resources": {"requests": {"cpu": "0.5", "memory": "1Gi"}, "limits": {"memory": "1024Mi"}}}}
    observed = {"spec": {"resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "1Gi"}}}}
    assert differences(desired, observed) == []
    observed["spec"]["resources"]["requests"]["cpu"] = "1"
    assert differences(desired, observed) == ["spec.resources.requests.cpu"]
    # An emptyDir's sizeLimit (/dev/shm, a pod template's volumes) too, as the API server writes it back.
    shm = {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1024Mi"}}
    assert differences({"volumes": [shm]}, {"volumes": [{**shm, "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}]}) == []
    assert differences({"volumes": [shm]}, {"volumes": [{**shm, "emptyDir": {"medium": "", "sizeLimit": "1Gi"}}]}) == [
        "volumes[0].emptyDir.medium"]
    # Outside requests/limits and emptyDir strings are strings.
    assert differences({"data": {"x": "0.5"}}, {"data": {"x": "500m"}}) == ["data.x"]
    assert differences({"a": [1, 2]}, {"a": [1]}) == ["a"]
    assert differences({"a": True}, {"a": 1}) == ["a"]
    assert differences({"a": {"b": 1}}, {"a": "x"}) == ["a"]


def test_a_removed_node_set_is_deleted_only_when_released(doc):
    c = cluster_of(doc)
    observed = apply(plan(render(c, KEYS), [], cluster_name=c.name), [])
    doc = copy.deepcopy(doc)
    doc["spec"]["nodeSets"] = [ns for ns in doc["spec"]["nodeSets"] if ns["name"] != "gpu"]
    doc["spec"]["partitions"] = [p for p in doc["spec"]["partitions"] if p["name"] != "gpu"]
    smaller = cluster_of(doc)
    desired = render(smaller, KEYS)
    held = plan(desired, observed, cluster_name=c.name,
                keep={("StatefulSet", "demo-gpu"), ("PodDisruptionBudget", "demo-gpu-busy")})
    assert held.deletes == ()
    released = plan(desired, observed, cluster_name=c.name)
    assert [d.key for d in released.deletes] == [("PodDisruptionBudget", "demo-gpu-busy"),
                                                 ("StatefulSet", "demo-gpu")]
    assert all(d.uid and d.namespace == "default" for d in released.deletes)


def test_objects_that_are_not_ours_are_never_deleted(doc):
    c = cluster_of(doc)
    observed = apply(plan(render(c, KEYS), [], cluster_name=c.name), [])
    foreign = serve({"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": "demo-notes", "namespace": "default",
                                  "labels": {names.CLUSTER_LABEL: "demo"}}})  # not managed-by us
    other = serve({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "other-slurm-config", "namespace": "default",
                                "labels": names.labels(load_cluster({**doc, "metadata": {"name": "other"}}),
                                                       "config")}})
    pod = serve({"apiVersion": "v1", "kind": "Pod",
                 "metadata": {"name": "demo-cpu-0", "namespace": "default", "labels": names.labels(c, "worker")}})
    controller = next(o for o in observed if o["kind"] == "StatefulSet" and o["metadata"]["name"] == names.controller(c))
    state_claim = claim_name(controller["spec"]["volumeClaimTemplates"][0], names.controller_pod(c))
    state = serve({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                   "metadata": {"name": state_claim, "namespace": "default",
                                "labels": names.labels(c, "controller")}, "spec": {}})
    p = plan([], observed + [foreign, other, pod, state], cluster_name=c.name)
    deleted = {d.key for d in p.deletes}
    assert not deleted & {key(foreign), key(other), key(pod), key(state)}
    assert is_ours(state, "demo") and not is_ours(other, "demo") and not is_ours(foreign, "demo")
    # The retained shared claim stays; with deletionPolicy Delete it goes.
    assert ("PersistentVolumeClaim", "demo-shared") not in deleted
    doc = copy.deepcopy(doc)
    doc["spec"]["deletionPolicy"] = "Delete"
    c2 = cluster_of(doc)
    observed = apply(plan(render(c2, KEYS), [], cluster_name=c.name), [])
    assert ("PersistentVolumeClaim", "demo-shared") in {d.key for d in plan([], observed, cluster_name="demo").deletes}


def test_objects_being_deleted_are_left_to_finish(doc):
    c = cluster_of(doc)
    desired = render(c, KEYS)
    observed = apply(plan(desired, [], cluster_name=c.name), [])
    for o in observed:
        o["metadata"]["deletionTimestamp"] = "2026-11-21T00:00:00Z"
    observed[0]["data"] = {}
    p = plan(desired, observed, cluster_name=c.name)
    assert p.empty  # neither replaced nor updated while they go; created again once gone
    assert plan([], observed, cluster_name=c.name).deletes == ()


def test_with_replicas_changes_only_the_named_statefulsets(doc):
    c = cluster_of(doc)
    desired = render(c, KEYS)
    out = with_replicas(desired, {"demo-gpu": 7})
    by = {key(o): o for o in out}
    assert by[("StatefulSet", "demo-gpu")]["spec"]["replicas"] == 7
    assert by[("StatefulSet", "demo-cpu")]["spec"]["replicas"] == 1
    assert {key(o): o for o in desired}[("StatefulSet", "demo-gpu")]["spec"]["replicas"] == 2  # not mutated
    assert [Create(o).key for o in out] == [key(o) for o in desired]
    assert Update(out[0], ()).key == key(out[0])
