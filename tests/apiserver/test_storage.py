"""Storage as a managed cluster has it (issue 43): the stand-in's StorageClasses,
its default class that refuses ReadWriteMany as block storage does, an RWX class
a claim must name, WaitForFirstConsumer, a class that does not exist, and the
scheduler's wait for claims. The rules alone (``sandbox.apiserver.storage``),
then a server, through the kubernetes client and kubectl."""

from __future__ import annotations

import json

from sandbox.apiserver import storage

from .conftest import Cluster, wait_for

# -- the rules -----------------------------------------------------------------------------


def claim(name: str = "data", modes=("ReadWriteOnce",), cls: str | None = None, annotations: dict | None = None,
          phase: str = "Pending") -> dict:
    spec: dict = {"accessModes": list(modes), "resources": {"requests": {"storage": "1Gi"}}}
    if cls is not None:
        spec["storageClassName"] = cls
    return {"metadata": {"name": name, "namespace": "ns", "uid": "u1", "annotations": annotations or {}},
            "spec": spec, "status": {"phase": phase}}


CLASSES = {storage.meta(sc)["name"]: sc for sc in storage.bootstrap_classes()}


def reasons(step: storage.Provision) -> list[tuple[str, str]]:
    return [(n.type, n.reason) for n in step.notes]


def test_a_claim_without_a_class_gets_the_default_and_an_empty_class_stays_empty():
    c = claim()
    storage.admit_claim(c, CLASSES.values())
    assert c["spec"]["storageClassName"] == storage.DEFAULT_CLASS
    empty = claim(cls="")
    storage.admit_claim(empty, CLASSES.values())
    assert empty["spec"]["storageClassName"] == ""
    none = claim()
    storage.admit_claim(none, [CLASSES[storage.SHARED_CLASS]])  # no class is the default
    assert "storageClassName" not in none["spec"]


def test_of_several_default_classes_the_newest_wins():
    old = {"metadata": {"name": "old", "creationTimestamp": "2025-01-01T00:00:00Z",
                        "annotations": {storage.DEFAULT_ANNOTATION: "true"}}}
    new = {"metadata": {"name": "new", "creationTimestamp": "2026-01-01T00:00:00Z",
                        "annotations": {storage.DEFAULT_ANNOTATION: "true"}}}
    assert storage.default_class([old, new]) == storage.default_class([new, old]) == "new"


def test_the_default_class_refuses_read_write_many_in_the_words_of_a_block_storage_driver():
    c = claim(modes=("ReadWriteMany",), cls=storage.DEFAULT_CLASS, annotations={storage.SELECTED_NODE: "n1"})
    step = storage.provision(c, CLASSES)
    assert step.volume is None
    assert reasons(step)[-1] == ("Warning", "ProvisioningFailed")
    assert step.notes[-1].message == (
        'failed to provision volume with StorageClass "standard": rpc error: code = InvalidArgument desc = '
        "Volume capabilities MULTI_NODE_MULTI_WRITER not supported. Only AccessModes[ReadWriteOnce] supported.")
    assert step.notes[-1].component.startswith(storage.BLOCK + "_")


def test_the_shared_class_binds_read_write_many_at_once():
    step = storage.provision(claim(modes=("ReadWriteMany",), cls=storage.SHARED_CLASS), CLASSES)
    assert step.volume == "pvc-u1"
    assert reasons(step)[-1] == ("Normal", "ProvisioningSucceeded")
    assert step.annotations["volume.kubernetes.io/storage-provisioner"] == storage.SHARED
    assert storage.bound_status(claim(modes=("ReadWriteMany",))) == {
        "phase": "Bound", "accessModes": ["ReadWriteMany"], "capacity": {"storage": "1Gi"}}


def test_wait_for_first_consumer_binds_on_the_node_picked_for_the_first_pod():
    waiting = storage.provision(claim(cls=storage.DEFAULT_CLASS), CLASSES)
    assert (waiting.volume, reasons(waiting)) == (None, [("Normal", "WaitForFirstConsumer")])
    assert waiting.notes[0].message == "waiting for first consumer to be created before binding"
    picked = storage.provision(claim(cls=storage.DEFAULT_CLASS, annotations={storage.SELECTED_NODE: "n1"}), CLASSES)
    assert picked.volume == "pvc-u1"
    # A pod bound to a node without the scheduler gives the claim its node.
    direct = storage.provision(claim(cls=storage.DEFAULT_CLASS), CLASSES, consumer_node="n2")
    assert direct.volume == "pvc-u1" and direct.annotations[storage.SELECTED_NODE] == "n2"


def test_a_class_that_does_not_exist_or_no_class_leaves_the_claim_pending_saying_why():
    missing = storage.provision(claim(cls="efs-sc"), CLASSES)
    assert missing.volume is None
    assert [(n.type, n.reason, n.message) for n in missing.notes] == [
        ("Warning", "ProvisioningFailed", 'storageclass.storage.k8s.io "efs-sc" not found')]
    nothing = storage.provision(claim(cls=""), CLASSES)
    assert nothing.volume is None and reasons(nothing) == [("Normal", "FailedBinding")]


def test_a_provisioner_that_is_not_the_stand_ins_is_waited_for():
    sc = {"metadata": {"name": "efs"}, "provisioner": "efs.csi.aws.com", "volumeBindingMode": "Immediate"}
    step = storage.provision(claim(modes=("ReadWriteMany",), cls="efs"), {"efs": sc})
    assert step.volume is None and reasons(step) == [("Normal", "ExternalProvisioning")]
    assert "'efs.csi.aws.com'" in step.notes[0].message


def test_a_pod_waits_for_its_claims_as_the_scheduler_says():
    pod = {"spec": {"volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]}}
    assert storage.pod_claims(pod, {}, CLASSES).unschedulable == 'persistentvolumeclaim "data" not found'
    immediate = claim(modes=("ReadWriteMany",), cls=storage.SHARED_CLASS)
    assert storage.pod_claims(pod, {"data": immediate}, CLASSES).unschedulable == \
        "pod has unbound immediate PersistentVolumeClaims"
    unknown = claim(cls="nope")
    assert storage.pod_claims(pod, {"data": unknown}, CLASSES).unschedulable == \
        "pod has unbound immediate PersistentVolumeClaims"
    first = claim(cls=storage.DEFAULT_CLASS)
    assert storage.pod_claims(pod, {"data": first}, CLASSES) == storage.PodClaims(select=("data",))
    picked = claim(cls=storage.DEFAULT_CLASS, annotations={storage.SELECTED_NODE: "n1"})
    assert storage.pod_claims(pod, {"data": picked}, CLASSES) == storage.PodClaims(waiting=("data",))
    assert storage.pod_claims(pod, {"data": claim(phase="Bound")}, CLASSES) == storage.PodClaims()


# -- a server --------------------------------------------------------------------------------


def _claim(cluster: Cluster, ns: str, name: str, modes: list[str], cls: str | None = None):
    spec: dict = {"accessModes": modes, "resources": {"requests": {"storage": "1Gi"}}}
    if cls is not None:
        spec["storageClassName"] = cls
    return cluster.core.create_namespaced_persistent_volume_claim(ns, {"metadata": {"name": name}, "spec": spec})


def _phase(cluster: Cluster, ns: str, name: str) -> str:
    return cluster.core.read_namespaced_persistent_volume_claim(name, ns).status.phase


def _events(cluster: Cluster, ns: str, name: str) -> list[tuple[str, str, str]]:
    items = cluster.core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items
    return [(e.type, e.reason, e.message) for e in items]


def _with_volume(name: str, claim_name: str) -> dict:
    return {"metadata": {"name": name}, "spec": {
        "containers": [{"name": "main", "image": "busybox:1.36"}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim_name}}]}}


def test_the_stand_in_has_a_default_block_class_and_a_shared_one(cluster: Cluster):
    table = cluster.kubectl("get", "storageclass").stdout
    assert "standard (default)" in table and "WaitForFirstConsumer" in table
    shared = cluster.kubectl_json("get", "sc", storage.SHARED_CLASS)
    assert (shared["provisioner"], shared["volumeBindingMode"]) == (storage.SHARED, "Immediate")
    refused = cluster.kubectl("patch", "sc", storage.SHARED_CLASS, "--type", "merge", "-p",
                              json.dumps({"volumeBindingMode": "WaitForFirstConsumer"}), check=False)
    assert refused.returncode != 0 and "volumeBindingMode: Invalid value" in refused.stderr, refused.stderr
    assert "field is immutable" in refused.stderr


def test_read_write_many_on_the_default_class_stays_pending_with_the_provisioners_refusal(cluster: Cluster, ns: str):
    """The rendered shared claim of old (RWX, no class) on a managed cluster: its pod
    is placed, the claim given the node, and the block storage driver refuses it."""
    cluster.node("storage-node", ready=True)
    created = _claim(cluster, ns, "shared", ["ReadWriteMany"])
    assert created.spec.storage_class_name == storage.DEFAULT_CLASS  # DefaultStorageClass admission
    wait_for("the claim to wait for its first consumer",
             lambda: ("Normal", "WaitForFirstConsumer", "waiting for first consumer to be created before binding")
             in _events(cluster, ns, "shared"))
    cluster.core.create_namespaced_pod(ns, _with_volume("user", "shared"))
    failed = wait_for("the provisioner's refusal", lambda: [e for e in _events(cluster, ns, "shared")
                                                           if e[1] == "ProvisioningFailed"])
    assert failed[0][0] == "Warning" and "MULTI_NODE_MULTI_WRITER not supported" in failed[0][2]
    claimed = cluster.core.read_namespaced_persistent_volume_claim("shared", ns)
    assert claimed.metadata.annotations[storage.SELECTED_NODE] == "storage-node"
    assert claimed.status.phase == "Pending"
    assert not cluster.core.read_namespaced_pod("user", ns).spec.node_name  # waits for its claim


def test_a_claim_naming_the_shared_class_binds_at_once_and_its_pod_is_scheduled(cluster: Cluster, ns: str):
    cluster.node("storage-node-2", ready=True)
    _claim(cluster, ns, "shared", ["ReadWriteMany"], storage.SHARED_CLASS)
    wait_for("the claim bound", lambda: _phase(cluster, ns, "shared") == "Bound")
    c = cluster.core.read_namespaced_persistent_volume_claim("shared", ns)
    assert c.spec.volume_name == f"pvc-{c.metadata.uid}" and c.status.access_modes == ["ReadWriteMany"]
    assert ("Normal", "ProvisioningSucceeded", f"Successfully provisioned volume pvc-{c.metadata.uid}") in \
        _events(cluster, ns, "shared")
    cluster.core.create_namespaced_pod(ns, _with_volume("user", "shared"))
    wait_for("the pod scheduled", lambda: cluster.core.read_namespaced_pod("user", ns).spec.node_name)


def test_a_read_write_once_claim_on_the_default_class_binds_when_its_first_pod_is_scheduled(cluster: Cluster, ns: str):
    cluster.node("storage-node-3", ready=True)
    _claim(cluster, ns, "state", ["ReadWriteOnce"])
    wait_for("the claim to wait for its first consumer",
             lambda: any(e[1] == "WaitForFirstConsumer" for e in _events(cluster, ns, "state")))
    assert _phase(cluster, ns, "state") == "Pending"
    cluster.core.create_namespaced_pod(ns, _with_volume("db", "state"))
    node = wait_for("the pod scheduled after its claim is bound",
                    lambda: cluster.core.read_namespaced_pod("db", ns).spec.node_name)
    c = cluster.core.read_namespaced_persistent_volume_claim("state", ns)
    assert c.status.phase == "Bound" and c.metadata.annotations[storage.SELECTED_NODE] == node


def test_a_claim_naming_a_class_that_does_not_exist_stays_pending_and_its_pod_unschedulable(cluster: Cluster, ns: str):
    _claim(cluster, ns, "shared", ["ReadWriteMany"], "efs-sc")
    wait_for("ProvisioningFailed", lambda: ("Warning", "ProvisioningFailed",
                                            'storageclass.storage.k8s.io "efs-sc" not found') in _events(cluster, ns, "shared"))
    cluster.core.create_namespaced_pod(ns, _with_volume("user", "shared"))
    scheduled = wait_for("the pod's PodScheduled condition", lambda: next(
        (c for c in cluster.core.read_namespaced_pod("user", ns).status.conditions or [] if c.type == "PodScheduled"), None))
    assert scheduled.status == "False" and scheduled.message.endswith(
        "nodes are available: pod has unbound immediate PersistentVolumeClaims.")
    assert _phase(cluster, ns, "shared") == "Pending"
    # The class appears (a site installs its NFS provisioner's class): the claim binds, the pod runs.
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "efs-sc"},
        "provisioner": storage.SHARED}))
    try:
        wait_for("the claim bound once its class exists", lambda: _phase(cluster, ns, "shared") == "Bound")
        wait_for("the pod scheduled", lambda: cluster.core.read_namespaced_pod("user", ns).spec.node_name)
    finally:
        cluster.kubectl("delete", "storageclass", "efs-sc")


def test_a_pod_whose_claim_is_missing_is_unschedulable(cluster: Cluster, ns: str):
    cluster.core.create_namespaced_pod(ns, _with_volume("orphan", "nowhere"))
    wait_for("FailedScheduling", lambda: any(
        e[1] == "FailedScheduling" and e[2].endswith('persistentvolumeclaim "nowhere" not found.')
        for e in _events(cluster, ns, "orphan")))
