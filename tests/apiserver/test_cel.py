"""The stand-in's CEL validation rules (sandbox/apiserver/cel.py), without a server:
what ``self``/``oldSelf`` see, where and how a broken rule is reported, which CRDs
are refused for their rules' cost; and the chart's CRDs carry rules it accepts."""

from __future__ import annotations

import copy

import yaml

from sandbox.apiserver import cel
from sandbox.apiserver import schema as crdschema
from slurmk8s.api.celrules import RULES, rules_for

from .conftest import CRDS


def _schema(**spec_extra) -> dict:
    spec = {"type": "object", "properties": {
        "min": {"type": "integer"}, "max": {"type": "integer"},
        "items": {"type": "array", "maxItems": 10, "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                  "items": {"type": "object", "required": ["name"],
                            "properties": {"name": {"type": "string", "maxLength": 8}, "size": {"type": "integer"}}}},
    }, **spec_extra}
    return {"type": "object", "properties": {"spec": spec}}


def _errors(schema: dict, obj: dict, old: dict | None = None) -> list[str]:
    return [f"{e.field}: {e.text()}" for e in crdschema.process(obj, schema, old).errors]


def test_a_false_rule_is_refused_with_its_path_and_message_as_kube_apiserver_writes_it() -> None:
    schema = _schema(**{"x-kubernetes-validations": [
        {"rule": "self.min <= self.max", "message": "min must not exceed max"},
        {"rule": "self.min <= self.max", "message": "at max", "fieldPath": ".max"},
        {"rule": "self.min <= self.max"}]})
    assert _errors(schema, {"spec": {"min": 1, "max": 2}}) == []
    assert _errors(schema, {"spec": {"min": 3, "max": 2}}) == [
        'spec: Invalid value: "object": min must not exceed max',
        'spec.max: Invalid value: "object": at max',
        'spec: Invalid value: "object": failed rule: self.min <= self.max']


def test_rules_on_list_items_report_the_item_and_message_expressions_give_the_message() -> None:
    schema = _schema()
    schema["properties"]["spec"]["properties"]["items"]["items"]["x-kubernetes-validations"] = [
        {"rule": "self.size > 0", "message": "static", "messageExpression": "self.name + ' is empty'",
         "fieldPath": ".size"}]
    obj = {"spec": {"items": [{"name": "a", "size": 1}, {"name": "b", "size": 0}]}}
    assert _errors(schema, obj) == ['spec.items[1].size: Invalid value: "object": b is empty']


def test_the_kubernetes_library_functions_the_rules_use() -> None:
    schema = _schema(**{"x-kubernetes-validations": [
        {"rule": "self.items.map(i, i.size).sum() <= self.max", "message": "sum"},
        {"rule": "self.items.all(i, i.name.lowerAscii() == i.name)", "message": "lower"}]})
    assert _errors(schema, {"spec": {"max": 3, "items": [{"name": "a", "size": 1}, {"name": "b", "size": 2}]}}) == []
    assert _errors(schema, {"spec": {"max": 2, "items": [{"name": "A", "size": 1}, {"name": "b", "size": 2}]}}) == [
        'spec: Invalid value: "object": sum', 'spec: Invalid value: "object": lower']


def test_a_rule_that_fails_to_evaluate_refuses_the_object() -> None:
    schema = _schema(**{"x-kubernetes-validations": [{"rule": "self.min < 1", "message": "m"}]})
    got = _errors(schema, {"spec": {"max": 1}})
    assert got == ['spec: Invalid value: "object": rule evaluation error: no such key: min']


def test_at_the_root_self_sees_of_metadata_only_name_and_generate_name() -> None:
    schema = {"type": "object", "x-kubernetes-validations": [
        {"rule": "size(self.metadata.name) < 5 && !has(self.metadata.labels)", "message": "short",
         "fieldPath": ".spec"}],
        "properties": {"spec": {"type": "object"}, "metadata": {"type": "object"}}}
    assert _errors(schema, {"metadata": {"name": "abc", "labels": {"a": "b"}}, "spec": {}}) == []
    assert _errors(schema, {"metadata": {"name": "abcdef"}, "spec": {}}) == ['spec: Invalid value: "object": short']


def test_transition_rules_run_on_updates_only_and_follow_list_map_keys() -> None:
    schema = _schema()
    item = schema["properties"]["spec"]["properties"]["items"]["items"]
    item["x-kubernetes-validations"] = [{"rule": "self.size >= oldSelf.size", "message": "may not shrink"}]
    new = {"spec": {"items": [{"name": "b", "size": 1}, {"name": "a", "size": 5}]}}
    assert _errors(schema, new) == []  # a create: no oldSelf
    old = {"spec": {"items": [{"name": "a", "size": 4}, {"name": "b", "size": 2}]}}
    assert _errors(schema, new, old) == ['spec.items[0]: Invalid value: "object": may not shrink']
    old["spec"]["items"] = [{"name": "c", "size": 9}]  # no item of the same key: not a transition
    assert _errors(schema, new, old) == []


def test_rules_run_only_on_an_object_whose_schema_holds() -> None:
    schema = _schema(**{"x-kubernetes-validations": [{"rule": "self.min <= self.max", "message": "m"}]})
    assert _errors(schema, {"spec": {"min": "x", "max": 1}}) == [
        'spec.min: Invalid value: "string": spec.min in body must be of type integer: "string"']


def test_a_crd_whose_rule_iterates_an_unbounded_list_is_refused() -> None:
    schema = _schema(**{"x-kubernetes-validations": [{"rule": "self.items.all(i, i.size > 0)"}]})
    assert crdschema.check_schema(schema) is None
    del schema["properties"]["spec"]["properties"]["items"]["maxItems"]
    problem = crdschema.check_schema(schema)
    assert problem is not None and "self.items.all() iterates a list or map with no maxItems" in problem


def test_a_crd_whose_nested_rule_goes_over_the_cost_budget_is_refused() -> None:
    schema = _schema(**{"x-kubernetes-validations": [
        {"rule": "self.items.all(a, self.items.all(b, self.items.all(c, a.size + b.size >= c.size)))"}]})
    assert crdschema.check_schema(schema) is None  # 10 x 10 x 10
    schema["properties"]["spec"]["properties"]["items"]["maxItems"] = 1000
    problem = crdschema.check_schema(schema)
    assert problem is not None and "estimated rule cost exceeds budget" in problem


def test_a_crd_whose_rule_does_not_compile_or_names_no_field_is_refused() -> None:
    broken = _schema(**{"x-kubernetes-validations": [{"rule": "self.min <="}]})
    assert "compilation failed" in (crdschema.check_schema(broken) or "")
    astray = _schema(**{"x-kubernetes-validations": [{"rule": "true", "fieldPath": ".nosuch"}]})
    assert "does not refer to a field" in (crdschema.check_schema(astray) or "")


def test_the_charts_crds_carry_every_rule_and_the_stand_in_accepts_them() -> None:
    seen = 0
    for f in sorted(CRDS.glob("*.yaml")):
        crd = yaml.safe_load(f.read_text())
        kind = crd["spec"]["names"]["kind"]
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        assert cel.rule_problems(schema) == [], f.name
        placed = []
        nodes = [schema]
        while nodes:
            node = nodes.pop()
            # Kubernetes places rules beside a type, never on a node without one.
            assert "x-kubernetes-validations" not in node or "type" in node
            placed += [r["rule"] for r in node.get("x-kubernetes-validations") or ()]
            nodes += [v for v in (node.get("properties") or {}).values()]
            nodes += [node[k] for k in ("items", "additionalProperties") if isinstance(node.get(k), dict)]
        assert sorted(placed) == sorted(r.rule for r in rules_for(kind)), f.name
        seen += len(placed)
    assert seen == len(RULES)


def test_the_webhooks_match_conditions_and_the_crd_rules_share_one_cel() -> None:
    from sandbox.apiserver import webhooks

    assert webhooks.program is cel.program
    assert copy.copy(cel.FUNCTIONS).keys() >= {"lowerAscii", "sum"}
