"""The typed API and the CRD generated from it."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest
import yaml

from slurmk8s import versions
from slurmk8s.api import load_cluster, load_policy
from slurmk8s.api.crd import all_crds, crd_filename, dump_yaml

from .conftest import ROOT, minimal

CRD_DIR = ROOT / "charts" / "slurmk8s" / "files" / "crds"


def test_committed_crds_match_a_fresh_generation():
    for obj in all_crds():
        committed = CRD_DIR / crd_filename(obj)
        assert committed.exists(), f"{committed} is missing: run `slurmk8s crd --write {CRD_DIR}`"
        assert committed.read_text() == dump_yaml([obj]), (
            f"{committed} is stale: run `slurmk8s crd --write charts/slurmk8s/files/crds`"
        )
    generated = {crd_filename(o) for o in all_crds()}
    assert {p.name for p in CRD_DIR.glob("*.yaml")} == generated


def _walk(node: dict, path: str):
    yield path, node
    for key, child in node.get("properties", {}).items():
        yield from _walk(child, f"{path}.{key}")
    if "items" in node:
        yield from _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}{{}}")


def _committed_schemas():
    for path in sorted(CRD_DIR.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        for version in crd["spec"]["versions"]:
            yield crd["metadata"]["name"], version


@pytest.mark.parametrize("name,version", list(_committed_schemas()))
def test_every_schema_node_has_a_type_and_a_description(name, version):
    schema = version["schema"]["openAPIV3Schema"]
    nodes = list(_walk(schema, name))
    assert len(nodes) > 50  # the walk really descends into the schema
    untyped = [p for p, n in nodes if "type" not in n]
    assert untyped == [], f"schema nodes without a type: {untyped}"
    undocumented = [p for p, n in nodes if not n.get("description")]
    assert undocumented == [], f"schema nodes without a description: {undocumented}"


@pytest.mark.parametrize("name,version", list(_committed_schemas()))
def test_crd_is_structural_with_status_defaults_and_columns(name, version):
    text = yaml.safe_dump(version)
    for forbidden in ("$ref", "anyOf", "allOf", "oneOf", "title:", "$defs", "patternProperties", "&id"):
        assert forbidden not in text, f"{name}: {forbidden} is not allowed in a structural schema"
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert {"Phase", "Ready", "Age"} <= set(columns) or {"Cluster", "Partition", "Lent", "Ready", "Age"} <= set(columns)
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    defaults = [p for p, n in _walk(spec, "spec") if "default" in n]
    assert EXPECTED_DEFAULTS[name] <= set(defaults)


EXPECTED_DEFAULTS = {
    "slurmclusters.slurmk8s.dev": {"spec.slurm.version", "spec.slurmConfig.maxNodeCount"},
    "nodelendingpolicies.slurmk8s.dev": {
        "spec.idleAfterSeconds", "spec.minKubernetesNodes", "spec.reclaim.gracePeriodSeconds",
        "spec.reclaim.signal", "spec.reclaim.jobAction", "spec.timeZone",
    },
}


def test_both_kinds_are_generated():
    assert {c["spec"]["names"]["kind"] for c in all_crds()} == {"SlurmCluster", "NodeLendingPolicy"}
    assert {c["spec"]["scope"] for c in all_crds()} == {"Namespaced"}


def _validator_for(kind_plural: str) -> jsonschema.Validator:
    crd = yaml.safe_load((CRD_DIR / f"{kind_plural}.slurmk8s.dev.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return jsonschema.Draft7Validator(schema)


def test_every_example_validates_against_the_generated_crd():
    validators = {"SlurmCluster": (_validator_for("slurmclusters"), load_cluster),
                  "NodeLendingPolicy": (_validator_for("nodelendingpolicies"), load_policy)}
    checked = {kind: 0 for kind in validators}
    for path in sorted((ROOT / "examples").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") in validators:
                validator, load = validators[doc["kind"]]
                errors = [e.message for e in validator.iter_errors(doc)]
                assert errors == [], f"{path}: {errors}"
                load(doc)
                checked[doc["kind"]] += 1
    assert min(checked.values()) >= 1, checked


def test_the_example_policy_lends_to_a_partition_of_the_example_cluster_that_accepts_lent_nodes():
    policy = load_policy(yaml.safe_load((ROOT / "examples" / "nodelendingpolicy.yaml").read_text()))
    cluster = load_cluster(yaml.safe_load((ROOT / "examples" / "slurmcluster.yaml").read_text()))
    assert policy.spec.cluster_ref.name == cluster.name and policy.namespace == cluster.namespace
    partition = next(p for p in cluster.spec.partitions if p.name == policy.spec.partition)
    assert partition.accept_lent_nodes


def test_the_policy_crd_rejects_what_the_model_rejects():
    validator = _validator_for("nodelendingpolicies")
    bad = {"apiVersion": "slurmk8s.dev/v1alpha1", "kind": "NodeLendingPolicy", "metadata": {"name": "p"},
           "spec": {"clusterRef": {"name": "Demo"}, "partition": "gpu\nProlog=/x",
                    "nodeSelector": {"matchLabels": {"a": "b c"}}, "idleAfterSeconds": -1,
                    "reclaim": {"signal": "KILL", "jobAction": "drop"}}}
    paths = sorted(".".join(map(str, e.absolute_path)) for e in validator.iter_errors(bad))
    assert paths == ["spec.clusterRef.name", "spec.idleAfterSeconds", "spec.nodeSelector.matchLabels.a",
                     "spec.partition", "spec.reclaim.jobAction", "spec.reclaim.signal"]


def test_the_crd_schema_rejects_what_the_model_rejects():
    validator = _validator_for("slurmclusters")
    bad = minimal(partitions=[{"name": "gpu\nProlog=/x"}], nodeSets=[{"name": "x", "replicas": -1}])
    messages = " ".join(e.message for e in validator.iter_errors(bad))
    assert "does not match" in messages
    assert "minimum" in messages or "-1 is less than" in messages


def test_defaults_fill_an_empty_spec():
    c = load_cluster(minimal())
    assert c.spec.slurm.version == versions.SUPPORTED[-1]  # the newest (decision record 18)
    assert c.spec.slurm_config.max_node_count == 1024
    assert c.spec.controller.state_volume.size == "10Gi"
    assert c.spec.deletion_policy == "Retain"


def test_dump_round_trips(example_doc):
    c = load_cluster(example_doc)
    again = load_cluster(c.dump())
    assert again == c
    assert again.dump()["spec"]["nodeSets"][1]["gpus"] == {"type": "h100", "count": 4}


def test_operator_and_bridge_import_under_slurmk8s_without_shadowing_the_stdlib():
    import operator

    import slurmk8s.bridge
    import slurmk8s.operator

    assert Path(slurmk8s.operator.__file__).parent == ROOT / "slurmk8s" / "operator"
    assert Path(slurmk8s.bridge.__file__).parent == ROOT / "slurmk8s" / "bridge"
    assert hasattr(operator, "itemgetter")  # still the standard library's
