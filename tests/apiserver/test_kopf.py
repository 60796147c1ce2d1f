"""A tiny kopf operator (create/update/delete handlers, its finalizer, a status
patch, an Event) run against the stand-in, unmodified."""

from __future__ import annotations

import asyncio
import json
import threading

import kopf
import pytest
from kubernetes.client.rest import ApiException

from .conftest import Cluster, wait_for

GROUP, VERSION, PLURAL = "test.slurmk8s.dev", "v1", "gadgets"
FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"


def gadget_crd() -> dict:
    open_object = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {"group": GROUP, "scope": "Namespaced",
                 "names": {"plural": PLURAL, "singular": "gadget", "kind": "Gadget"},
                 "versions": [{"name": VERSION, "served": True, "storage": True, "subresources": {"status": {}},
                               "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                                   "spec": {"type": "object", "properties": {"size": {"type": "integer"}}},
                                   "status": open_object}}}}]},
    }


def logged_in(cluster: Cluster, ns: str) -> kopf.OperatorRegistry:
    """A registry whose kopf logs in with the server's URL, CA and token, in ``ns``."""
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**_):
        return kopf.ConnectionInfo(server=cluster.srv.url, ca_path=str(cluster.srv.ca_path), token=cluster.srv.token,
                                   default_namespace=ns)

    return registry


@pytest.fixture(scope="module")
def operator(cluster: Cluster):
    """kopf in a thread, logged in with the server's URL, CA and token, watching one namespace."""
    cluster.ext.create_custom_resource_definition(gadget_crd())
    ns = cluster.namespace("kopf")
    calls: list[tuple[str, str]] = []
    registry = logged_in(cluster, ns)

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_):
        settings.posting.level = 0
        settings.watching.server_timeout = 30

    @kopf.on.create(GROUP, VERSION, PLURAL, id="created", registry=registry)
    def created(body, spec, name, patch, **_):
        calls.append(("create", name))
        patch.status["phase"] = "Made"
        kopf.info(body, reason="Made", message=f"gadget {name} of size {spec.get('size')}")
        return {"size": spec.get("size")}

    @kopf.on.update(GROUP, VERSION, PLURAL, field="spec.size", id="resized", registry=registry)
    def resized(name, old, new, **_):
        calls.append(("update", f"{name}:{old}->{new}"))

    @kopf.on.delete(GROUP, VERSION, PLURAL, id="deleted", registry=registry)
    def deleted(name, **_):
        calls.append(("delete", name))

    ready, stop = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(kopf.operator(registry=registry, standalone=True, namespaces=[ns], ready_flag=ready, stop_flag=stop))
        except BaseException as e:  # noqa: BLE001 - surfaced by the tests
            errors.append(e)

    thread = threading.Thread(target=run, name="kopf", daemon=True)
    thread.start()
    assert ready.wait(30) and not errors, errors
    yield ns, calls
    stop.set()
    thread.join(30)
    assert not errors, errors


def test_handlers_run_and_the_finalizer_lets_the_object_go(cluster: Cluster, operator) -> None:
    ns, calls = operator
    cluster.custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Gadget", "metadata": {"name": "g1"}, "spec": {"size": 1}})

    def get():
        return cluster.custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "g1")

    def handled():
        obj = get()
        status = obj.get("status") or {}
        return obj if status.get("phase") == "Made" and "created" in status else None

    made = wait_for("the create handler's status patch and result", handled)
    assert ("create", "g1") in calls
    assert made["status"]["created"] == {"size": 1}  # the handler's result, through the status subresource
    assert FINALIZER in made["metadata"]["finalizers"]
    events = wait_for("kopf's event", lambda: cluster.core.list_namespaced_event(
        ns, field_selector="involvedObject.name=g1,reason=Made").items)
    assert events[0].message == "gadget g1 of size 1" and events[0].source.component == "kopf"

    cluster.custom.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "g1", {"spec": {"size": 2}})
    wait_for("the update handler", lambda: ("update", "g1:1->2") in calls)

    cluster.custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "g1")

    def gone() -> bool:
        try:
            get()
            return False
        except ApiException as e:
            return e.status == 404

    wait_for("kopf to remove its finalizer and the object to go", gone)
    assert calls.count(("delete", "g1")) == 1
    assert [c for c in calls if c[0] == "create"] == [("create", "g1")]


def test_a_spec_too_big_for_kopfs_annotation_copy_is_handled_through_the_operators_digest(cluster: Cluster) -> None:
    """kopf's default diff base copies the spec into an annotation: past 256 KiB
    of annotations the stand-in refuses kopf's patch, as Kubernetes does. The
    operator's storage (slurmk8s/operator/diffbase.py) keeps a digest, so a
    spec of 1,000 users is created, handled, updated and handled again."""
    from slurmk8s.operator.diffbase import DIGEST_KEY, DigestDiffBaseStorage

    big = cluster.namespace("kopf-big")
    users = [{"name": f"user{i:04d}", "uid": 10000 + i, "key": "ssh-ed25519 " + "A" * 256} for i in range(1000)]
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Gadget", "metadata": {"name": "many"},
            "spec": {"size": 1, "users": users}}
    try:
        cluster.custom.create_namespaced_custom_object(GROUP, VERSION, big, PLURAL, body)
    except ApiException as e:  # the module's other test may not have made the CRD yet
        assert e.status == 404
        cluster.ext.create_custom_resource_definition(gadget_crd())
        wait_for("the CRD", lambda: cluster.custom.list_namespaced_custom_object(GROUP, VERSION, big, PLURAL))
        cluster.custom.create_namespaced_custom_object(GROUP, VERSION, big, PLURAL, body)
    # What kopf's own storage would write is refused with the field and the limit.
    copy = {"kopf.zalando.org/last-handled-configuration": json.dumps({"spec": body["spec"]})}
    with pytest.raises(ApiException) as refused:
        cluster.custom.patch_namespaced_custom_object(GROUP, VERSION, big, PLURAL, "many",
                                                      {"metadata": {"annotations": copy}})
    assert refused.value.status == 422
    assert "metadata.annotations: Too long: may not be more than 262144 bytes" in refused.value.body

    calls: list[int] = []
    registry = logged_in(cluster, big)

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_):
        settings.posting.enabled = False
        settings.persistence.diffbase_storage = DigestDiffBaseStorage()

    @kopf.on.create(GROUP, VERSION, PLURAL, id="handled", registry=registry)
    @kopf.on.update(GROUP, VERSION, PLURAL, id="updated", field="spec", registry=registry)
    def handled(spec, **_):
        calls.append(spec["size"])

    ready, stop = threading.Event(), threading.Event()
    thread = threading.Thread(target=lambda: asyncio.run(kopf.operator(
        registry=registry, standalone=True, namespaces=[big], ready_flag=ready, stop_flag=stop)), daemon=True)
    thread.start()
    try:
        assert ready.wait(30)

        def annotations() -> dict:
            return cluster.custom.get_namespaced_custom_object(GROUP, VERSION, big, PLURAL, "many")[
                "metadata"].get("annotations") or {}

        digest = wait_for("the create handled and its digest stored",
                          lambda: calls == [1] and annotations().get(f"slurmk8s.dev/{DIGEST_KEY}"))
        assert len(digest) == 64 and sum(len(k) + len(v) for k, v in annotations().items()) < 1024
        cluster.custom.patch_namespaced_custom_object(GROUP, VERSION, big, PLURAL, "many", {"spec": {"size": 2}})
        wait_for("the update handled", lambda: calls == [1, 2] and annotations()[f"slurmk8s.dev/{DIGEST_KEY}"] != digest)
    finally:
        stop.set()
        thread.join(30)
    assert calls == [1, 2]  # once each: an unchanged digest is no change
