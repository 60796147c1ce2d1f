"""The stand-in's pure rules, without a server: selectors, JSONPath, patches,
server-side apply, CRD schemas, scheduling filters, StatefulSet plans and
rolling-update arithmetic."""

from __future__ import annotations

import copy
from decimal import Decimal

import pytest
import yaml

from sandbox.apiserver import apply as ssa
from sandbox.apiserver import jsonpath, patch, quantity, schema, timeutil
from sandbox.apiserver.controllers import deployment, scheduler, statefulset
from sandbox.apiserver.errors import APIError
from sandbox.apiserver.resources import Registry, from_crd
from sandbox.apiserver.selectors import (
    labels_match,
    parse_field_selector,
    parse_label_selector,
    valid_label_key,
    valid_label_value,
)
from slurmk8s.api.quantities import quantity_value

from .conftest import CRDS, EXAMPLE


@pytest.mark.parametrize("text,labels,expected", [
    ("a=b", {"a": "b"}, True),
    ("a=b", {"a": "c"}, False),
    ("a!=b", {}, True),
    ("a in (x, y)", {"a": "y"}, True),
    ("a notin (x,y)", {"a": "y"}, False),
    ("a notin (x,y)", {}, True),
    ("a", {"a": ""}, True),
    ("!a", {"a": ""}, False),
    ("a,b=c,!d", {"a": "1", "b": "c"}, True),
    ("n>3", {"n": "4"}, True),
    ("example.com/role=head", {"example.com/role": "head"}, True),
])
def test_label_selectors(text, labels, expected) -> None:
    assert labels_match(parse_label_selector(text), labels) is expected


@pytest.mark.parametrize("text", ["a in b", "a in ()", "=b", "a=b,", "a b", "a=(b)", "-bad-=1"])
def test_bad_label_selectors_are_400(text) -> None:
    with pytest.raises(APIError) as e:
        parse_label_selector(text)
    assert e.value.code == 400 and "unable to parse requirement" in e.value.message


def test_label_keys_and_values_end_where_kubernetes_ends_them() -> None:
    """Go's `$` is the end of the text; Python's `$` also matches before a final newline."""
    assert valid_label_key("example.com/a") and valid_label_value("v")
    assert not valid_label_key("example.com/a\n") and not valid_label_value("v\n")


def test_field_selectors() -> None:
    sel = parse_field_selector(r"metadata.name=a\,b,status.phase!=Running", ["metadata.name", "status.phase"])
    assert [(r.field, r.op, r.value) for r in sel] == [("metadata.name", "=", "a,b"), ("status.phase", "!=", "Running")]
    with pytest.raises(APIError) as e:
        parse_field_selector("spec.x=1", ["metadata.name"])
    assert e.value.code == 400 and e.value.message.startswith("field label not supported: spec.x")


def test_jsonpath() -> None:
    obj = {"status": {"conditions": [{"type": "A", "status": "False"}, {"type": "Ready", "status": "True"}]},
           "metadata": {"labels": {"app.kubernetes.io/name": "x"}}}
    assert jsonpath.find(obj, '.status.conditions[?(@.type=="Ready")].status') == ["True"]
    assert jsonpath.find(obj, ".status.conditions[*].type") == ["A", "Ready"]
    assert jsonpath.find(obj, ".status.conditions[0].status") == ["False"]
    assert jsonpath.find(obj, r".metadata.labels.app\.kubernetes\.io/name") == ["x"]
    assert jsonpath.find(obj, ".spec.missing") == []


def test_quantities_and_ages() -> None:
    assert quantity.parse("500m") == Decimal("0.5")
    assert quantity.parse("4Gi") == 4 * 2**30
    assert quantity.parse("1e3") == 1000
    with pytest.raises(ValueError):
        quantity.parse("4 GB")
    # The product's parser (the Kubernetes client's) with the same refusals: no "K", no NaN, no 1e1.5.
    for bad in ("1K", "1ki", "Infinity", "1_0", "1e1.5", True):
        assert not quantity.valid(bad), bad
    assert quantity.parse(" 0.5Gi ") == quantity_value("0.5Gi") and quantity.parse(2) == 2  # JSON numbers too
    assert [timeutil.human_duration(s) for s in (5, 150, 700, 4 * 3600 + 60, 3 * 86400)] == ["5s", "2m30s", "11m", "4h1m", "3d"]


def test_merge_patch_is_rfc7386() -> None:
    assert patch.merge_patch({"a": {"b": 1, "c": 2}, "l": [1]}, {"a": {"b": None, "d": 3}, "l": [2]}) == {"a": {"c": 2, "d": 3}, "l": [2]}


def test_strategic_merge_patch_directives() -> None:
    pod = {"metadata": {"finalizers": ["a"]}, "spec": {
        "containers": [{"name": "x", "image": "1", "ports": [{"containerPort": 80}]}, {"name": "y", "image": "1"}],
        "volumes": [{"name": "v", "emptyDir": {}}], "tolerations": [{"key": "t"}]}}
    out = patch.strategic_merge_patch(pod, {
        "metadata": {"finalizers": ["b"]},
        "spec": {"containers": [{"name": "y", "$patch": "delete"}, {"name": "z", "image": "2"},
                                {"name": "x", "ports": [{"containerPort": 81}]}],
                 "$setElementOrder/containers": [{"name": "z"}, {"name": "x"}],
                 "volumes": [{"name": "v", "hostPath": {"path": "/d"}, "$retainKeys": ["name", "hostPath"]}],
                 "tolerations": [{"key": "u"}]}}, ("", "pods"))
    assert out["metadata"]["finalizers"] == ["a", "b"]  # a merged primitive list
    assert [c["name"] for c in out["spec"]["containers"]] == ["z", "x"]
    assert [p["containerPort"] for p in out["spec"]["containers"][1]["ports"]] == [80, 81]
    assert out["spec"]["volumes"] == [{"name": "v", "hostPath": {"path": "/d"}}]  # retainKeys dropped emptyDir
    assert out["spec"]["tolerations"] == [{"key": "u"}]  # no merge key: replaced
    replaced = patch.strategic_merge_patch(pod, {"spec": {"containers": [{"$patch": "replace"}, {"name": "only", "image": "3"}]}}, ("", "pods"))
    assert replaced["spec"]["containers"] == [{"name": "only", "image": "3"}]
    gone = patch.strategic_merge_patch(pod, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}, ("", "pods"))
    assert "a" not in gone["metadata"]["finalizers"]
    with pytest.raises(APIError) as e:
        patch.strategic_merge_patch(pod, {"spec": {"containers": [{"image": "no-name"}]}}, ("", "pods"))
    assert e.value.code == 422 and "merge key: name" in e.value.message


def test_json_patch_errors() -> None:
    with pytest.raises(APIError) as e:
        patch.json_patch({}, {"op": "add"})
    assert e.value.code == 400
    with pytest.raises(APIError) as e:
        patch.json_patch({}, [{"op": "remove", "path": "/missing"}])
    assert e.value.code == 422


def test_server_side_apply_removes_what_a_manager_stopped_applying() -> None:
    node = ssa._from_patch_schema(patch.merge_key_schema(("apps", "deployments")))
    live = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}, "spec": {"replicas": 1}}
    first = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "labels": {"a": "1", "b": "2"}},
             "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i:1", "env": [{"name": "E", "value": "1"}]}]}}}}
    merged, fields = ssa.apply(live, first, "me", node)
    merged["metadata"]["managedFields"] = ssa.set_manager(None, "me", "apps/v1", fields, None)
    assert fields["f:metadata"]["f:labels"] == {"f:a": {}, "f:b": {}}
    assert '{"name":"c"}' in next(iter(fields["f:spec"]["f:template"]["f:spec"]["f:containers"])).replace("k:", "")
    second = copy.deepcopy(first)
    del second["metadata"]["labels"]["b"]
    del second["spec"]["template"]["spec"]["containers"][0]["env"]
    merged2, _ = ssa.apply(merged, second, "me", node)
    assert merged2["metadata"]["labels"] == {"a": "1"}
    assert "env" not in merged2["spec"]["template"]["spec"]["containers"][0]
    assert merged2["spec"]["replicas"] == 1  # never applied by "me": kept


def crd_schema() -> dict:
    doc = yaml.safe_load(next(CRDS.glob("*.yaml")).read_text())
    return doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_schema_prunes_defaults_and_validates() -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["bogus"] = {"x": 1}
    doc["spec"]["nodeSets"].append(copy.deepcopy(doc["spec"]["nodeSets"][0]))
    out = schema.process(doc, crd_schema())
    assert out.unknown == ["spec.bogus"] and "bogus" not in out.obj["spec"]
    assert out.obj["metadata"] == doc["metadata"]  # metadata is the server's, never pruned
    assert [(e.field, e.kind) for e in out.errors] == [("spec.nodeSets[2]", "Duplicate")]  # list-type map keys
    assert "image" in out.obj["spec"]["slurm"]  # a default object, itself defaulted


def test_registry_serves_a_crd() -> None:
    crd = yaml.safe_load(next(CRDS.glob("*.yaml")).read_text())
    reg = Registry()
    reg.set_crd(crd)
    rt = reg.get("slurmk8s.dev", "v1alpha1", "slurmclusters")
    assert rt is not None and rt.has_status and rt.short_names == tuple(crd["spec"]["names"]["shortNames"])
    assert [t.plural for t in from_crd(crd)] == ["slurmclusters"]
    reg.remove_crd(crd["metadata"]["name"])
    assert reg.get("slurmk8s.dev", "v1alpha1", "slurmclusters") is None


# --- scheduling ---------------------------------------------------------------------


def node(name, taints=(), labels=None, **alloc):
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": {"taints": list(taints)},
            "status": {"allocatable": {"pods": "10", "cpu": "4", "memory": "8Gi", **alloc}}}


def pod(requests=None, tolerations=(), **spec):
    return {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "resources": {"requests": requests or {}}}],
                                                 "tolerations": list(tolerations), **spec}}


def test_tolerations() -> None:
    taint = {"key": "k", "value": "v", "effect": "NoSchedule"}
    assert scheduler.tolerates({"key": "k", "operator": "Equal", "value": "v"}, taint)
    assert not scheduler.tolerates({"key": "k", "value": "w"}, taint)
    assert scheduler.tolerates({"operator": "Exists"}, taint)
    assert not scheduler.tolerates({"key": "k", "operator": "Exists", "effect": "NoExecute"}, taint)


def test_filter_reasons_follow_the_plugin_order() -> None:
    tainted = node("t", taints=[{"key": "gpu", "value": "", "effect": "NoSchedule"}])
    assert scheduler.filter_node(pod(), tainted, {}, 0) == ["node(s) had untolerated taint {gpu: }"]
    assert scheduler.filter_node(pod(nodeSelector={"a": "b"}), node("n"), {}, 0) == ["node(s) didn't match Pod's node affinity/selector"]
    busy = {"cpu": Decimal(3)}
    assert scheduler.filter_node(pod({"cpu": "2", "example.com/fpga": "1"}), node("n"), busy, 10) == [
        "Too many pods", "Insufficient cpu", "Insufficient example.com/fpga"]
    assert scheduler.filter_node(pod({"cpu": "1"}), node("n"), busy, 0) == []


def test_init_containers_count_by_their_largest_request() -> None:
    p = pod({"cpu": "1"})
    p["spec"]["initContainers"] = [{"name": "i", "resources": {"requests": {"cpu": "3"}}}]
    assert scheduler.pod_requests(p) == {"cpu": Decimal(3)}


def test_schedule_message_counts_nodes_per_reason() -> None:
    nodes = [node("a", **{"nvidia.com/gpu": "1"}), node("b", **{"nvidia.com/gpu": "1"}),
             node("c", taints=[{"key": "x", "value": "y", "effect": "NoExecute"}])]
    chosen, msg = scheduler.schedule(pod({"nvidia.com/gpu": "2"}), nodes, {})
    assert chosen is None
    assert msg == "0/3 nodes are available: 1 node(s) had untolerated taint {x: y}, 2 Insufficient nvidia.com/gpu."
    chosen, _ = scheduler.schedule(pod({"cpu": "1"}), nodes, {"a": ({"cpu": Decimal(2)}, 1)})
    assert chosen == "b"  # the least allocated node


# --- workloads ------------------------------------------------------------------------


def sts(replicas=3, policy="OrderedReady", **spec):
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "s", "namespace": "n", "uid": "u", "generation": 1},
            "spec": {"replicas": replicas, "podManagementPolicy": policy, "serviceName": "s",
                     "selector": {"matchLabels": {"app": "s"}},
                     "template": {"metadata": {"labels": {"app": "s"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
                     "updateStrategy": {"type": "RollingUpdate"}, **spec}}


def running(p: dict) -> dict:
    p = copy.deepcopy(p)
    p["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    return p


def test_statefulset_plan_is_ordered() -> None:
    s = sts()
    plan = statefulset.plan(s, [], set())
    assert [p["metadata"]["name"] for _, p in plan.create] == ["s-0"]
    pod0 = plan.create[0][1]
    plan = statefulset.plan(s, [pod0], set())
    assert not plan.create  # s-0 is not ready yet
    plan = statefulset.plan(s, [running(pod0)], set())
    assert [p["metadata"]["name"] for _, p in plan.create] == ["s-1"]
    parallel = statefulset.plan(sts(policy="Parallel"), [], set())
    assert [p["metadata"]["name"] for _, p in parallel.create] == ["s-0", "s-1", "s-2"]


def test_statefulset_plan_scales_down_from_the_top_and_updates_one_at_a_time() -> None:
    s = sts(replicas=3)
    rev = statefulset.update_revision(s)
    pods = [running(statefulset.new_pod(s, i, rev)) for i in range(3)]
    down = statefulset.plan(sts(replicas=1), pods, set())
    assert down.delete_pods == ["s-2"]
    changed = sts(replicas=3)
    changed["spec"]["template"]["spec"]["containers"][0]["image"] = "j"
    up = statefulset.plan(changed, pods, set())
    assert up.delete_pods == ["s-2"] and up.status["updateRevision"] != rev
    partitioned = copy.deepcopy(changed)
    partitioned["spec"]["updateStrategy"]["rollingUpdate"] = {"partition": 3}
    assert statefulset.plan(partitioned, pods, set()).delete_pods == []


def test_rollout_respects_surge_and_unavailability() -> None:
    def rs(name, replicas, available, created):
        return {"metadata": {"name": name, "creationTimestamp": created}, "spec": {"replicas": replicas},
                "status": {"replicas": replicas, "availableReplicas": available}}

    d = {"spec": {"replicas": 4, "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}}}
    assert deployment.rollout(d, rs("new", 0, 0, "2"), [rs("old", 4, 4, "1")]) == {"new": 1}
    assert deployment.rollout(d, rs("new", 1, 1, "2"), [rs("old", 4, 4, "1")]) == {"old": 3}
    recreate = {"spec": {"replicas": 2, "strategy": {"type": "Recreate"}}}
    assert deployment.rollout(recreate, rs("new", 0, 0, "2"), [rs("old", 2, 2, "1")]) == {"old": 0}
    assert deployment.rollout(recreate, rs("new", 0, 0, "2"), [rs("old", 0, 0, "1")]) == {"new": 2}

