"""The official kubernetes Python client against the stand-in: CRUD, optimistic
concurrency, watches, selectors, subresources, finalizers, garbage collection,
patches, CRD validation and defaults.

Over 500 lines because it is one client's view of every API behaviour the product relies
on, against one server fixture.
"""

from __future__ import annotations

import copy
import json

import pytest
import urllib3
import yaml
from kubernetes import watch
from kubernetes.client.rest import ApiException

from slurmk8s import versions

from .conftest import EXAMPLE, Cluster, start_server, wait_for

GROUP, VERSION, PLURAL = "slurmk8s.dev", "v1alpha1", "slurmclusters"


def status_of(e: ApiException) -> dict:
    return json.loads(e.body)


def cm(name: str, data: dict | None = None, **meta) -> dict:
    return {"metadata": {"name": name, **meta}, "data": data or {}}


@pytest.fixture(scope="module")
def crds(cluster: Cluster) -> dict:
    """The project's CRDs, created through the API as a client would."""
    return cluster.install_crds()


def example() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


# --- CRUD -------------------------------------------------------------------------


def test_crud_of_a_configmap(cluster: Cluster, ns: str) -> None:
    created = cluster.core.create_namespaced_config_map(ns, cm("a", {"k": "v"}))
    assert created.metadata.uid and created.metadata.resource_version and created.metadata.creation_timestamp
    got = cluster.core.read_namespaced_config_map("a", ns)
    assert got.data == {"k": "v"} and got.metadata.uid == created.metadata.uid
    got.data["k2"] = "v2"
    replaced = cluster.core.replace_namespaced_config_map("a", ns, got)
    assert int(replaced.metadata.resource_version) > int(created.metadata.resource_version)
    listed = cluster.core.list_namespaced_config_map(ns)
    assert [i.metadata.name for i in listed.items if i.metadata.name == "a"] == ["a"]
    assert int(listed.metadata.resource_version) >= int(replaced.metadata.resource_version)
    cluster.core.delete_namespaced_config_map("a", ns)
    with pytest.raises(ApiException) as e:
        cluster.core.read_namespaced_config_map("a", ns)
    assert e.value.status == 404
    assert status_of(e.value)["reason"] == "NotFound"
    assert status_of(e.value)["message"] == 'configmaps "a" not found'


def test_create_twice_is_already_exists(cluster: Cluster, ns: str) -> None:
    cluster.core.create_namespaced_config_map(ns, cm("dup"))
    with pytest.raises(ApiException) as e:
        cluster.core.create_namespaced_config_map(ns, cm("dup"))
    assert e.value.status == 409 and status_of(e.value)["reason"] == "AlreadyExists"


def test_generate_name(cluster: Cluster, ns: str) -> None:
    a = cluster.core.create_namespaced_config_map(ns, {"metadata": {"generateName": "job-"}})
    b = cluster.core.create_namespaced_config_map(ns, {"metadata": {"generateName": "job-"}})
    assert a.metadata.name.startswith("job-") and b.metadata.name.startswith("job-")
    assert len(a.metadata.name) == len("job-") + 5 and a.metadata.name != b.metadata.name
    assert a.metadata.generate_name == "job-"


def test_creating_in_a_missing_namespace_fails(cluster: Cluster) -> None:
    with pytest.raises(ApiException) as e:
        cluster.core.create_namespaced_config_map("no-such-ns", cm("x"))
    assert e.value.status == 404
    assert status_of(e.value)["message"] == 'namespaces "no-such-ns" not found'


def test_default_namespaces_exist(cluster: Cluster) -> None:
    names = {n.metadata.name for n in cluster.core.list_namespace().items}
    assert {"default", "kube-system", "kube-public"} <= names
    with pytest.raises(ApiException) as e:
        cluster.core.delete_namespace("default")
    assert e.value.status == 403


def test_namespaced_and_cluster_scoped_lists(cluster: Cluster) -> None:
    a, b = cluster.namespace(), cluster.namespace()
    cluster.core.create_namespaced_config_map(a, cm("x", labels={"scope": "all-ns"}))
    cluster.core.create_namespaced_config_map(b, cm("x", labels={"scope": "all-ns"}))
    everywhere = cluster.core.list_config_map_for_all_namespaces(label_selector="scope=all-ns")
    assert sorted(i.metadata.namespace for i in everywhere.items) == sorted([a, b])
    assert len(cluster.core.list_namespaced_config_map(a, label_selector="scope=all-ns").items) == 1


def test_deleting_a_namespace_deletes_its_contents(cluster: Cluster) -> None:
    n = cluster.namespace()
    cluster.core.create_namespaced_config_map(n, cm("x"))
    cluster.core.delete_namespace(n)
    wait_for("the namespace to go", lambda: n not in {i.metadata.name for i in cluster.core.list_namespace().items})
    with pytest.raises(ApiException) as e:
        cluster.core.read_namespaced_config_map("x", n)
    assert e.value.status == 404


def test_every_namespace_gets_a_default_service_account(cluster: Cluster, ns: str) -> None:
    sa = wait_for("the default ServiceAccount", lambda: [s for s in cluster.core.list_namespaced_service_account(ns).items if s.metadata.name == "default"])
    assert sa[0].metadata.namespace == ns
    root_ca = wait_for("kube-root-ca.crt", lambda: [c for c in cluster.core.list_namespaced_config_map(ns).items if c.metadata.name == "kube-root-ca.crt"])
    assert root_ca[0].data["ca.crt"] == cluster.srv.ca_pem


# --- optimistic concurrency -----------------------------------------------------------


def test_update_with_a_stale_resource_version_is_a_conflict(cluster: Cluster, ns: str) -> None:
    cluster.core.create_namespaced_config_map(ns, cm("c", {"n": "0"}))
    stale = cluster.core.read_namespaced_config_map("c", ns)
    fresh = copy.deepcopy(stale)
    fresh.data["n"] = "1"
    cluster.core.replace_namespaced_config_map("c", ns, fresh)
    stale.data["n"] = "2"
    with pytest.raises(ApiException) as e:
        cluster.core.replace_namespaced_config_map("c", ns, stale)
    st = status_of(e.value)
    assert e.value.status == 409
    assert st["kind"] == "Status" and st["reason"] == "Conflict" and st["details"]["name"] == "c"
    assert "the object has been modified" in st["message"]
    assert cluster.core.read_namespaced_config_map("c", ns).data["n"] == "1"


def test_two_conflicting_edits_are_resolved_by_resource_version(cluster: Cluster, ns: str) -> None:
    cluster.core.create_namespaced_config_map(ns, cm("shared", {}))

    def edit(key: str, first_read=None) -> int:
        attempts = 0
        obj = first_read
        while True:
            attempts += 1
            obj = obj or cluster.core.read_namespaced_config_map("shared", ns)
            obj.data = dict(obj.data or {}, **{key: "set"})
            try:
                cluster.core.replace_namespaced_config_map("shared", ns, obj)
                return attempts
            except ApiException as e:
                assert e.status == 409
                obj = None

    alice_view = cluster.core.read_namespaced_config_map("shared", ns)
    bob_view = cluster.core.read_namespaced_config_map("shared", ns)
    assert edit("alice", alice_view) == 1
    assert edit("bob", bob_view) == 2  # bob's first write was refused, his retry re-read
    assert cluster.core.read_namespaced_config_map("shared", ns).data == {"alice": "set", "bob": "set"}


def test_delete_preconditions(cluster: Cluster, ns: str) -> None:
    obj = cluster.core.create_namespaced_config_map(ns, cm("p"))
    with pytest.raises(ApiException) as e:
        cluster.core.delete_namespaced_config_map("p", ns, body={"preconditions": {"uid": "not-the-uid"}})
    assert e.value.status == 409
    cluster.core.delete_namespaced_config_map("p", ns, body={"preconditions": {"uid": obj.metadata.uid}})


# --- watch ----------------------------------------------------------------------------


def test_watch_resumes_from_a_resource_version(cluster: Cluster, ns: str) -> None:
    cluster.core.create_namespaced_config_map(ns, cm("first"))
    rv = cluster.core.list_namespaced_config_map(ns).metadata.resource_version
    cluster.core.create_namespaced_config_map(ns, cm("second"))
    cluster.core.patch_namespaced_config_map("first", ns, {"data": {"x": "1"}})
    cluster.core.delete_namespaced_config_map("second", ns)
    seen = []
    w = watch.Watch()
    for ev in w.stream(cluster.core.list_namespaced_config_map, ns, resource_version=rv, timeout_seconds=10):
        seen.append((ev["type"], ev["object"].metadata.name))
        if len(seen) == 3:
            w.stop()
    assert seen == [("ADDED", "second"), ("MODIFIED", "first"), ("DELETED", "second")]


def test_watch_without_a_version_starts_with_the_current_objects(cluster: Cluster, ns: str) -> None:
    cluster.core.create_namespaced_config_map(ns, cm("now", labels={"w": "1"}))
    w = watch.Watch()
    for ev in w.stream(cluster.core.list_namespaced_config_map, ns, label_selector="w=1", timeout_seconds=10):
        assert (ev["type"], ev["object"].metadata.name) == ("ADDED", "now")
        w.stop()


def test_watch_with_a_selector_sees_objects_enter_and_leave(cluster: Cluster, ns: str) -> None:
    cluster.core.create_namespaced_config_map(ns, cm("mover", labels={"team": "a"}))
    rv = cluster.core.list_namespaced_config_map(ns).metadata.resource_version
    cluster.core.patch_namespaced_config_map("mover", ns, {"metadata": {"labels": {"team": "b"}}})
    cluster.core.patch_namespaced_config_map("mover", ns, {"metadata": {"labels": {"team": "a"}}})
    seen = []
    w = watch.Watch()
    for ev in w.stream(cluster.core.list_namespaced_config_map, ns, label_selector="team=a", resource_version=rv, timeout_seconds=10):
        seen.append(ev["type"])
        if len(seen) == 2:
            w.stop()
    assert seen == ["DELETED", "ADDED"]


@pytest.fixture(scope="module")
def short_history(tmp_path_factory) -> Cluster:
    c = start_server(tmp_path_factory.mktemp("short-history"), history_limit=5)
    yield c
    c.api_client.close()
    c.srv.stop()


def test_watch_from_a_compacted_version_is_gone(short_history: Cluster) -> None:
    c = short_history
    n = c.namespace()
    old_rv = c.core.list_namespaced_config_map(n).metadata.resource_version
    for i in range(10):
        c.core.create_namespaced_config_map(n, cm(f"m{i}"))
    with pytest.raises(ApiException) as e:
        for _ in watch.Watch().stream(c.core.list_namespaced_config_map, n, resource_version=old_rv, timeout_seconds=5):
            pass
    assert e.value.status == 410
    assert "too old resource version" in str(e.value.reason)
    # a watch from a version still in the history works
    recent = c.core.list_namespaced_config_map(n).metadata.resource_version
    c.core.create_namespaced_config_map(n, cm("after"))
    w = watch.Watch()
    for ev in w.stream(c.core.list_namespaced_config_map, n, resource_version=recent, timeout_seconds=5):
        assert (ev["type"], ev["object"].metadata.name) == ("ADDED", "after")
        w.stop()


def test_bookmarks_and_initial_events_end(cluster: Cluster, ns: str) -> None:
    cluster.core.create_namespaced_config_map(ns, cm("b1"))
    resp = cluster.core.list_namespaced_config_map(
        ns, watch=True, allow_watch_bookmarks=True, send_initial_events=True, resource_version_match="NotOlderThan",
        resource_version="", timeout_seconds=1, _preload_content=False)
    lines = [json.loads(line) for line in resp.read().decode().splitlines() if line]
    kinds = [(ev["type"], ev["object"]["metadata"].get("name")) for ev in lines]
    assert ("ADDED", "b1") in kinds
    end = [ev for ev in lines if ev["type"] == "BOOKMARK"][0]
    assert end["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    assert int(end["object"]["metadata"]["resourceVersion"]) > 0


# --- selectors ---------------------------------------------------------------------------


def test_label_selectors(cluster: Cluster, ns: str) -> None:
    for name, labels in {"p1": {"env": "prod", "tier": "web"}, "p2": {"env": "dev"}, "p3": {"env": "qa", "tier": "db"}, "p4": {}}.items():
        cluster.core.create_namespaced_config_map(ns, cm(name, labels=labels))

    def sel(s: str) -> list[str]:
        return sorted(i.metadata.name for i in cluster.core.list_namespaced_config_map(ns, label_selector=s).items
                      if i.metadata.name.startswith("p"))

    assert sel("env=prod") == ["p1"]
    assert sel("env==prod") == ["p1"]
    assert sel("env!=prod") == ["p2", "p3", "p4"]
    assert sel("env in (dev, qa)") == ["p2", "p3"]
    assert sel("env notin (dev,qa)") == ["p1", "p4"]
    assert sel("tier") == ["p1", "p3"]
    assert sel("!tier") == ["p2", "p4"]
    assert sel("env,!tier") == ["p2"]
    assert sel("tier,env in (prod,qa),tier!=db") == ["p1"]
    with pytest.raises(ApiException) as e:
        cluster.core.list_namespaced_config_map(ns, label_selector="env in prod")
    assert e.value.status == 400 and "unable to parse requirement" in status_of(e.value)["message"]


def test_field_selectors(cluster: Cluster, ns: str) -> None:
    cluster.pod(ns, "fa")
    cluster.pod(ns, "fb", nodeName="some-node")
    names = lambda **kw: sorted(p.metadata.name for p in cluster.core.list_namespaced_pod(ns, **kw).items)  # noqa: E731 - a one-line accessor
    assert names(field_selector="metadata.name=fa") == ["fa"]
    assert names(field_selector="spec.nodeName=some-node") == ["fb"]
    assert names(field_selector="spec.nodeName!=some-node,status.phase=Pending") == ["fa"]
    assert names(field_selector=f"metadata.namespace={ns}") == ["fa", "fb"]
    with pytest.raises(ApiException) as e:
        cluster.core.list_namespaced_pod(ns, field_selector="spec.restartPolicy.oops=x")
    st = status_of(e.value)
    assert e.value.status == 400 and st["message"].startswith("field label not supported: spec.restartPolicy.oops")


def test_event_field_selectors_and_both_event_apis(cluster: Cluster, ns: str) -> None:
    pod = cluster.pod(ns, "evt")
    cluster.events.create_namespaced_event(ns, {
        "metadata": {"name": "evt.1"}, "eventTime": "2025-01-01T00:00:00.000000Z", "reason": "Tested",
        "note": "written through events.k8s.io/v1", "type": "Normal", "action": "Test", "reportingController": "tests",
        "reportingInstance": "tests-1", "regarding": {"kind": "Pod", "name": "evt", "namespace": ns, "uid": pod.metadata.uid},
    })
    core = cluster.core.list_namespaced_event(ns, field_selector=f"involvedObject.name=evt,involvedObject.uid={pod.metadata.uid},reason=Tested")
    assert [(e.reason, e.message) for e in core.items] == [("Tested", "written through events.k8s.io/v1")]
    new_api = cluster.events.read_namespaced_event("evt.1", ns)
    assert new_api.note == "written through events.k8s.io/v1" and new_api.regarding.name == "evt"


def test_pagination(cluster: Cluster, ns: str) -> None:
    for i in range(5):
        cluster.core.create_namespaced_config_map(ns, cm(f"page{i}", labels={"pg": "1"}))
    first = cluster.core.list_namespaced_config_map(ns, label_selector="pg=1", limit=2)
    assert len(first.items) == 2 and first.metadata._continue and first.metadata.remaining_item_count == 3
    rest = cluster.core.list_namespaced_config_map(ns, label_selector="pg=1", limit=10, _continue=first.metadata._continue)
    assert [i.metadata.name for i in first.items + rest.items] == [f"page{i}" for i in range(5)]


# --- status subresource and generation ---------------------------------------------------------


def test_status_is_kept_apart_for_custom_resources(cluster: Cluster, crds, ns: str) -> None:
    doc = example()
    doc["metadata"]["namespace"] = ns
    doc["status"] = {"phase": "Ready"}
    created = cluster.custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, doc)
    assert "status" not in created and created["metadata"]["generation"] == 1
    created["status"] = {"phase": "Ready"}
    created["metadata"]["labels"] = {"touched": "yes"}
    after = cluster.custom.replace_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "demo", created)
    assert "status" not in after and after["metadata"]["labels"] == {"touched": "yes"}
    assert after["metadata"]["generation"] == 1  # metadata changes do not count
    after["status"] = {"phase": "Ready", "configHash": "abc"}
    after["spec"]["slurm"]["version"] = "99.99"
    with_status = cluster.custom.replace_namespaced_custom_object_status(GROUP, VERSION, ns, PLURAL, "demo", after)
    assert (with_status["status"]["phase"], with_status["status"]["configHash"]) == ("Ready", "abc")
    assert with_status["spec"]["slurm"]["version"] == doc["spec"]["slurm"]["version"]  # /status ignores the spec
    assert with_status["metadata"]["generation"] == 1
    spec_change = cluster.custom.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "demo", {"spec": {"slurm": {"version": "24.11"}}})
    assert spec_change["metadata"]["generation"] == 2 and spec_change["status"]["phase"] == "Ready"


def test_status_is_kept_apart_for_pods(cluster: Cluster, ns: str) -> None:
    pod = cluster.pod(ns, "s", schedulerName="not-ours")  # no scheduler writes to it meanwhile
    assert pod.status.phase == "Pending"
    body = cluster.api_client.sanitize_for_serialization(pod)
    body["status"]["phase"] = "Running"
    body["metadata"]["labels"] = {"x": "y"}
    updated = cluster.core.replace_namespaced_pod("s", ns, body)
    assert updated.status.phase == "Pending" and updated.metadata.labels == {"x": "y"}
    cluster.core.patch_namespaced_pod_status("s", ns, {"status": {"phase": "Running"}, "metadata": {"labels": {"x": "z"}}})
    got = cluster.core.read_namespaced_pod("s", ns)
    assert got.status.phase == "Running" and got.metadata.labels == {"x": "y"}


def test_generation_counts_spec_changes_only(cluster: Cluster, ns: str) -> None:
    dep = {"metadata": {"name": "g"}, "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "g"}},
           "template": {"metadata": {"labels": {"app": "g"}}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}
    d = cluster.apps.create_namespaced_deployment(ns, dep)
    assert d.metadata.generation == 1
    d = cluster.apps.patch_namespaced_deployment("g", ns, {"metadata": {"annotations": {"a": "b"}}})
    assert d.metadata.generation == 1
    d = cluster.apps.patch_namespaced_deployment("g", ns, {"spec": {"replicas": 1}})
    assert d.metadata.generation == 2


# --- finalizers and garbage collection ------------------------------------------------------------


def test_finalizers_hold_a_deleted_object_until_they_are_removed(cluster: Cluster, ns: str) -> None:
    cluster.core.create_namespaced_config_map(ns, cm("fin", finalizers=["example.com/hold"]))
    cluster.core.delete_namespaced_config_map("fin", ns)
    held = cluster.core.read_namespaced_config_map("fin", ns)
    assert held.metadata.deletion_timestamp is not None and held.metadata.finalizers == ["example.com/hold"]
    with pytest.raises(ApiException) as e:
        cluster.core.patch_namespaced_config_map("fin", ns, {"metadata": {"finalizers": ["example.com/hold", "example.com/new"]}})
    assert e.value.status == 422 and "no new finalizers can be added" in status_of(e.value)["message"]
    cluster.core.patch_namespaced_config_map("fin", ns, {"metadata": {"finalizers": None}}, _content_type="application/merge-patch+json")
    with pytest.raises(ApiException) as e:
        cluster.core.read_namespaced_config_map("fin", ns)
    assert e.value.status == 404


def _owned(cluster: Cluster, ns: str, owner, name: str, finalizers=None, block=True):
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": owner.metadata.name, "uid": owner.metadata.uid,
           "blockOwnerDeletion": block}
    meta = {"ownerReferences": [ref]}
    if finalizers:
        meta["finalizers"] = finalizers
    return cluster.core.create_namespaced_config_map(ns, cm(name, **meta))


def _gone(cluster: Cluster, ns: str, name: str) -> bool:
    try:
        cluster.core.read_namespaced_config_map(name, ns)
        return False
    except ApiException as e:
        return e.status == 404


def test_background_deletion_collects_dependents(cluster: Cluster, ns: str) -> None:
    owner = cluster.core.create_namespaced_config_map(ns, cm("owner"))
    _owned(cluster, ns, owner, "dep1")
    _owned(cluster, ns, owner, "dep2")
    cluster.core.delete_namespaced_config_map("owner", ns, propagation_policy="Background")
    assert _gone(cluster, ns, "owner")
    wait_for("dependents to be collected", lambda: _gone(cluster, ns, "dep1") and _gone(cluster, ns, "dep2"))


def test_foreground_deletion_waits_for_dependents(cluster: Cluster, ns: str) -> None:
    owner = cluster.core.create_namespaced_config_map(ns, cm("fg"))
    _owned(cluster, ns, owner, "fg-dep", finalizers=["example.com/slow"])
    cluster.core.delete_namespaced_config_map("fg", ns, propagation_policy="Foreground")
    waiting = cluster.core.read_namespaced_config_map("fg", ns)
    assert "foregroundDeletion" in waiting.metadata.finalizers and waiting.metadata.deletion_timestamp
    wait_for("the dependent to be deleted", lambda: cluster.core.read_namespaced_config_map("fg-dep", ns).metadata.deletion_timestamp)
    assert not _gone(cluster, ns, "fg")  # still waiting for its dependent
    cluster.core.patch_namespaced_config_map("fg-dep", ns, {"metadata": {"finalizers": []}}, _content_type="application/merge-patch+json")
    wait_for("the owner to go after its dependent", lambda: _gone(cluster, ns, "fg-dep") and _gone(cluster, ns, "fg"))


def test_orphan_deletion_keeps_dependents(cluster: Cluster, ns: str) -> None:
    owner = cluster.core.create_namespaced_config_map(ns, cm("orph"))
    _owned(cluster, ns, owner, "orph-dep")
    cluster.core.delete_namespaced_config_map("orph", ns, propagation_policy="Orphan")
    wait_for("the owner to go", lambda: _gone(cluster, ns, "orph"))
    dep = cluster.core.read_namespaced_config_map("orph-dep", ns)
    assert dep.metadata.deletion_timestamp is None and not dep.metadata.owner_references


def test_a_dependent_keeps_its_other_owner(cluster: Cluster, ns: str) -> None:
    one = cluster.core.create_namespaced_config_map(ns, cm("one"))
    two = cluster.core.create_namespaced_config_map(ns, cm("two"))
    refs = [{"apiVersion": "v1", "kind": "ConfigMap", "name": o.metadata.name, "uid": o.metadata.uid} for o in (one, two)]
    cluster.core.create_namespaced_config_map(ns, cm("shared-dep", ownerReferences=refs))
    cluster.core.delete_namespaced_config_map("one", ns)
    wait_for("the dangling reference to be removed",
             lambda: [r.name for r in cluster.core.read_namespaced_config_map("shared-dep", ns).metadata.owner_references] == ["two"])


# --- patches --------------------------------------------------------------------------------


def _deployment(name: str) -> dict:
    return {"metadata": {"name": name}, "spec": {"replicas": 0, "selector": {"matchLabels": {"app": name}}, "template": {
        "metadata": {"labels": {"app": name}}, "spec": {"containers": [
            {"name": "app", "image": "app:1", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]},
            {"name": "sidecar", "image": "side:1"}]}}}}


def test_strategic_merge_patch_of_containers_and_env(cluster: Cluster, ns: str) -> None:
    cluster.apps.create_namespaced_deployment(ns, _deployment("smp"))
    patched = cluster.apps.patch_namespaced_deployment("smp", ns, {"spec": {"template": {"spec": {"containers": [
        {"name": "app", "image": "app:2", "env": [{"name": "B", "value": "20"}, {"name": "C", "value": "3"}]}]}}}})
    containers = {c.name: c for c in patched.spec.template.spec.containers}
    assert set(containers) == {"app", "sidecar"}
    assert containers["app"].image == "app:2" and containers["sidecar"].image == "side:1"
    assert [(e.name, e.value) for e in containers["app"].env] == [("A", "1"), ("B", "20"), ("C", "3")]
    patched = cluster.apps.patch_namespaced_deployment("smp", ns, {"spec": {"template": {"spec": {"containers": [
        {"name": "sidecar", "$patch": "delete"}, {"name": "app", "env": [{"name": "A", "$patch": "delete"}]}]}}}})
    assert [c.name for c in patched.spec.template.spec.containers] == ["app"]
    assert [e.name for e in patched.spec.template.spec.containers[0].env] == ["B", "C"]


def test_json_patch_and_merge_patch(cluster: Cluster, ns: str) -> None:
    cluster.core.create_namespaced_config_map(ns, cm("jp", {"a": "1", "b": "2"}))
    out = cluster.core.patch_namespaced_config_map("jp", ns, [
        {"op": "test", "path": "/data/a", "value": "1"}, {"op": "replace", "path": "/data/a", "value": "10"},
        {"op": "remove", "path": "/data/b"}, {"op": "add", "path": "/metadata/labels", "value": {"l": "v"}}])
    assert out.data == {"a": "10"} and out.metadata.labels == {"l": "v"}
    with pytest.raises(ApiException) as e:
        cluster.core.patch_namespaced_config_map("jp", ns, [{"op": "test", "path": "/data/a", "value": "nope"}])
    assert e.value.status == 422
    out = cluster.core.patch_namespaced_config_map("jp", ns, {"data": {"a": None, "c": "3"}}, _content_type="application/merge-patch+json")
    assert out.data == {"c": "3"}


def test_unsupported_requests_fail_clearly(cluster: Cluster, ns: str) -> None:
    cluster.core.create_namespaced_config_map(ns, cm("u"))
    http = urllib3.PoolManager(ca_certs=str(cluster.srv.ca_path))
    url = cluster.srv.url
    auth = {"Authorization": f"Bearer {cluster.srv.token}"}

    def req(method, path, headers=None, body=None):
        r = http.request(method, url + path, headers={**auth, **(headers or {})}, body=body)
        return r.status, json.loads(r.data)

    code, st = req("GET", f"/api/v1/namespaces/{ns}/configmaps/u", headers={"Authorization": "Bearer wrong"})
    assert code == 401 and st["reason"] == "Unauthorized"
    assert http.request("GET", url + "/api/v1/namespaces").status == 401
    code, st = req("GET", "/apis/apps/v1/daemonsets")
    assert code == 404 and st["kind"] == "Status"
    code, st = req("PATCH", f"/api/v1/namespaces/{ns}/configmaps/u", {"Content-Type": "application/x-unknown"}, b"{}")
    assert code == 415 and st["reason"] == "UnsupportedMediaType"
    code, st = req("POST", f"/api/v1/namespaces/{ns}/configmaps/u", {"Content-Type": "application/json"}, b"{}")
    assert code == 405 and st["reason"] == "MethodNotAllowed"
    code, st = req("DELETE", "/api/v1/namespaces")
    assert code == 405
    code, st = req("GET", f"/api/v1/namespaces/{ns}/configmaps?labelSelector=a%20in%20b")
    assert code == 400 and st["reason"] == "BadRequest"
    code, st = req("PATCH", f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/{PLURAL}/x", {"Content-Type": "application/strategic-merge-patch+json"}, b"{}")
    assert code in (404, 415)


# --- custom resources --------------------------------------------------------------------------


def test_an_invalid_slurm_cluster_is_refused_with_field_paths(cluster: Cluster, crds, ns: str) -> None:
    doc = example()
    doc["metadata"] = {"name": "broken", "namespace": ns}
    doc["spec"]["nodeSets"][0]["replicas"] = "two"
    doc["spec"]["slurm"]["version"] = "twenty"
    del doc["spec"]["partitions"][1]["name"]
    with pytest.raises(ApiException) as e:
        cluster.custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, doc)
    st = status_of(e.value)
    assert e.value.status == 422 and st["reason"] == "Invalid"
    fields = {c["field"]: c for c in st["details"]["causes"]}
    assert fields["spec.nodeSets[0].replicas"]["reason"] == "FieldValueInvalid"
    assert "must be of type integer" in fields["spec.nodeSets[0].replicas"]["message"]
    # The CRD's enum of supported releases: Kubernetes' "Unsupported value", naming them.
    assert fields["spec.slurm.version"]["reason"] == "FieldValueNotSupported"
    assert all(f'"{v}"' in fields["spec.slurm.version"]["message"] for v in versions.SUPPORTED), \
        fields["spec.slurm.version"]["message"]
    assert fields["spec.partitions[1].name"]["reason"] == "FieldValueRequired"
    assert st["message"].startswith('SlurmCluster.slurmk8s.dev "broken" is invalid: [')
    assert st["details"]["group"] == GROUP and st["details"]["kind"] == "SlurmCluster"


def test_schema_defaults_are_applied(cluster: Cluster, crds, ns: str) -> None:
    doc = example()
    doc["metadata"] = {"name": "defaults", "namespace": ns}
    created = cluster.custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, doc)
    schema = crds[f"{PLURAL}.{GROUP}"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    image = schema["properties"]["spec"]["properties"]["slurm"]["properties"]["image"]
    assert "image" not in doc["spec"]["slurm"]
    assert created["spec"]["slurm"]["image"]["repository"] == image["properties"]["repository"]["default"]
    assert created["spec"]["slurm"]["image"]["pullPolicy"] == image["properties"]["pullPolicy"]["default"]
    top_defaults = {k: v["default"] for k, v in schema["properties"]["spec"]["properties"].items() if "default" in v and k not in doc["spec"]}
    assert top_defaults, "the CRD declares top-level spec defaults"
    for key in top_defaults:
        assert key in created["spec"], key


def test_unknown_fields_are_pruned_or_refused(cluster: Cluster, crds, ns: str) -> None:
    doc = example()
    doc["metadata"] = {"name": "unknown", "namespace": ns}
    doc["spec"]["notAField"] = 1
    created = cluster.custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, doc)
    assert "notAField" not in created["spec"]
    doc["metadata"]["name"] = "unknown-strict"
    with pytest.raises(ApiException) as e:
        cluster.custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, doc, field_validation="Strict")
    assert e.value.status == 400 and 'unknown field "spec.notAField"' in status_of(e.value)["message"]


def test_a_new_crd_is_served_and_discovered(cluster: Cluster, ns: str) -> None:
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": "widgets.test.slurmk8s.dev"},
           "spec": {"group": "test.slurmk8s.dev", "scope": "Namespaced",
                    "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
                    "versions": [{"name": "v1", "served": True, "storage": True,
                                  "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                                      "spec": {"type": "object", "properties": {"size": {"type": "integer", "default": 3}}}}}}}]}}
    cluster.ext.create_custom_resource_definition(crd)
    got = cluster.ext.read_custom_resource_definition("widgets.test.slurmk8s.dev")
    assert {c.type: c.status for c in got.status.conditions}["Established"] == "True"
    resources = cluster.custom.get_api_resources("test.slurmk8s.dev", "v1")
    assert [r.name for r in resources.resources] == ["widgets"]
    w = cluster.custom.create_namespaced_custom_object("test.slurmk8s.dev", "v1", ns, "widgets", {
        "apiVersion": "test.slurmk8s.dev/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {}})
    assert w["spec"]["size"] == 3
    cluster.ext.delete_custom_resource_definition("widgets.test.slurmk8s.dev")
    wait_for("the CRD to go", lambda: "widgets.test.slurmk8s.dev" not in {c.metadata.name for c in cluster.ext.list_custom_resource_definition().items})
    with pytest.raises(ApiException) as e:
        cluster.custom.get_namespaced_custom_object("test.slurmk8s.dev", "v1", ns, "widgets", "w")
    assert e.value.status == 404


def test_immutable_secret(cluster: Cluster, ns: str) -> None:
    cluster.core.create_namespaced_secret(ns, {"metadata": {"name": "key"}, "immutable": True, "stringData": {"k": "v"}})
    got = cluster.core.read_namespaced_secret("key", ns)
    assert got.data == {"k": "dg=="} and got.type == "Opaque"
    with pytest.raises(ApiException) as e:
        cluster.core.patch_namespaced_secret("key", ns, {"data": {"k": "eA=="}})
    assert e.value.status == 422 and "field is immutable" in status_of(e.value)["message"]


def test_openapi_v2_serves_the_official_built_in_schemas_and_the_crds(cluster: Cluster, crds) -> None:
    http = urllib3.PoolManager(ca_certs=str(cluster.srv.ca_path))
    auth = {"Authorization": f"Bearer {cluster.srv.token}"}
    doc = json.loads(http.request("GET", cluster.srv.url + "/openapi/v2",
                                  headers={**auth, "Accept": "application/json"}).data)
    assert doc["swagger"] == "2.0"
    sa = doc["definitions"]["io.k8s.api.core.v1.ServiceAccount"]
    assert sa["x-kubernetes-group-version-kind"] == [{"group": "", "version": "v1", "kind": "ServiceAccount"}]
    assert sa["properties"]["automountServiceAccountToken"]["type"] == "boolean"
    deployment = doc["definitions"]["io.k8s.api.apps.v1.Deployment"]
    assert deployment["properties"]["spec"]["$ref"] == "#/definitions/io.k8s.api.apps.v1.DeploymentSpec"
    assert doc["definitions"]["dev.slurmk8s.v1alpha1.SlurmCluster"]["x-kubernetes-group-version-kind"][0]["kind"] \
        == "SlurmCluster"
    # client-go (kubectl's and Helm's validators) asks for protobuf only: a gnostic Document it can parse
    r = http.request("GET", cluster.srv.url + "/openapi/v2",
                     headers={**auth, "Accept": "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"})
    assert r.status == 200 and r.headers["Content-Type"].endswith("+protobuf") and r.data == b"\x0a\x032.0"


def test_network_policies_are_stored(cluster: Cluster, ns: str) -> None:
    """networking.k8s.io/v1 is served (stored, not enforced): the operator renders one per SlurmCluster."""
    from kubernetes import client as k8s

    api = k8s.NetworkingV1Api(cluster.api_client)
    body = {"metadata": {"name": "demo-agent", "labels": {"app": "x"}}, "spec": {
        "podSelector": {"matchLabels": {"app": "x"}}, "policyTypes": ["Ingress"],
        "ingress": [{"ports": [{"protocol": "TCP", "port": 6830}]}]}}
    api.create_namespaced_network_policy(ns, body)
    got = api.read_namespaced_network_policy("demo-agent", ns)
    assert got.spec.ingress[0].ports[0].port == 6830
    assert [p.metadata.name for p in api.list_namespaced_network_policy(ns, label_selector="app=x").items] == [
        "demo-agent"]
    api.delete_namespaced_network_policy("demo-agent", ns)


def test_objects_past_the_apis_size_limits_are_refused(cluster):
    """A request body over kube-apiserver's 3 MiB, and an object over etcd's 1.5 MiB."""
    ns = cluster.namespace("sizes")
    big = {"metadata": {"name": "big"}, "data": {"blob": "x" * (3 * 1024 * 1024)}}
    with pytest.raises(ApiException) as err:
        cluster.core.create_namespaced_config_map(ns, big)
    assert err.value.status == 413 and "limit is 3145728" in err.value.body
    large = {"metadata": {"name": "large"}, "data": {f"k{i}": "x" * (256 * 1024) for i in range(7)}}
    with pytest.raises(ApiException) as err:
        cluster.core.create_namespaced_config_map(ns, large)
    assert err.value.status == 413 and "etcdserver: request is too large" in err.value.body
    assert [c.metadata.name for c in cluster.core.list_namespaced_config_map(ns).items
            if c.metadata.name in ("big", "large")] == []
    # Just under both: stored.
    fits = {"metadata": {"name": "fits"}, "data": {f"k{i}": "x" * (256 * 1024) for i in range(5)}}
    assert cluster.core.create_namespaced_config_map(ns, fits).metadata.name == "fits"
