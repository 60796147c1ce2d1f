"""The NodeLendingPolicy API: defaults, selectors, and errors that name the field."""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from slurmk8s.api import InvalidSpec, load_policy
from slurmk8s.api.lending import RECLAIM_SIGNALS, LabelSelector, describe_selector
from slurmk8s.cli import main
from slurmk8s.slurm.client import SIGNALS

from .conftest import ROOT
from .reach import reached, reaches

EXAMPLE = ROOT / "examples" / "nodelendingpolicy.yaml"
NIGHTS = ROOT / "examples" / "nodelendingpolicy-nights.yaml"


def policy_doc(**spec) -> dict:
    base = {"clusterRef": {"name": "demo"}, "partition": "gpu",
            "nodeSelector": {"matchLabels": {"slurmk8s.dev/lendable": "true"}}}
    return {"apiVersion": "slurmk8s.dev/v1alpha1", "kind": "NodeLendingPolicy",
            "metadata": {"name": "lend", "namespace": "hpc"}, "spec": {**base, **spec}}


def errors_of(doc: dict) -> list[str]:
    with pytest.raises(InvalidSpec) as info:
        load_policy(doc)
    assert info.value.kind == "NodeLendingPolicy"
    return [str(e) for e in info.value.errors]


def test_defaults():
    p = load_policy(policy_doc())
    assert p.key == "hpc/lend"
    assert p.spec.idle_after_seconds == 120
    assert p.spec.min_kubernetes_nodes == 0 and p.spec.max_lent_nodes is None
    assert p.spec.windows == [] and p.spec.time_zone == "UTC"
    r = p.spec.reclaim
    assert (r.grace_period_seconds, r.signal, r.job_action) == (60, "USR1", "requeue")
    assert r.pod_selector is None and r.min_priority is None


@pytest.mark.parametrize("example", [EXAMPLE, NIGHTS], ids=lambda p: p.name)
def test_the_examples_round_trip(example):
    p = load_policy(yaml.safe_load(example.read_text()))
    assert load_policy(p.dump()) == p


def test_a_window_may_end_at_midnight():
    assert load_policy(yaml.safe_load(NIGHTS.read_text())).spec.windows[1].end == "24:00"


def test_reclaim_signals_are_those_the_facade_sends_except_uncatchable_ones():
    assert set(RECLAIM_SIGNALS) == SIGNALS - {"KILL", "STOP"}
    for sig in RECLAIM_SIGNALS:
        assert load_policy(policy_doc(reclaim={"signal": sig})).spec.reclaim.signal == sig


@pytest.mark.parametrize("spec,path,reason", [
    ({"nodeSelector": {}}, "spec.nodeSelector", "would lend every GPU node"),
    ({"nodeSelector": {"matchLabels": {"bad key!": "x"}}}, "spec.nodeSelector.matchLabels.bad key!", "label key"),
    ({"nodeSelector": {"matchLabels": {"a": "x y"}}}, "spec.nodeSelector.matchLabels.a", "at most 63"),
    ({"nodeSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}},
     "spec.nodeSelector.matchExpressions[0].values", "at least one value"),
    ({"nodeSelector": {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}},
     "spec.nodeSelector.matchExpressions[0].values", "only looks at the key"),
    ({"nodeSelector": {"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}},
     "spec.nodeSelector.matchExpressions[0].operator", "not allowed"),
    ({"clusterRef": {"name": "Demo"}}, "spec.clusterRef.name", "DNS-1123"),
    ({"clusterRef": {}}, "spec.clusterRef.name", "is required"),
    ({"partition": "gpu\nProlog=/x"}, "spec.partition", "newline"),
    ({"partition": "gpu Nodes=ALL"}, "spec.partition", "'='"),
    ({"idleAfterSeconds": -1}, "spec.idleAfterSeconds", "too small"),
    ({"minKubernetesNodes": -2}, "spec.minKubernetesNodes", "too small"),
    ({"maxLentNodes": "many"}, "spec.maxLentNodes", "integer"),
    ({"registrationTimeoutSeconds": 5}, "spec.registrationTimeoutSeconds", "too small"),
    ({"timeZone": "Mars/Olympus"}, "spec.timeZone", "not a known time zone"),
    ({"timeZone": "../../etc/passwd"}, "spec.timeZone", "not a time zone name"),
    ({"windows": [{"start": "8:00", "end": "17:00"}]}, "spec.windows[0].start", "HH:MM"),
    ({"windows": [{"start": "08:00", "end": "24:01"}]}, "spec.windows[0].end", "HH:MM"),
    ({"windows": [{"start": "08:00", "end": "08:00"}]}, "spec.windows[0].end", "empty window"),
    ({"windows": [{"start": "24:00", "end": "08:00"}]}, "spec.windows[0].start", "end of a day"),
    ({"windows": [{"days": ["Mon", "Mon"], "start": "08:00", "end": "09:00"}]}, "spec.windows[0].days[1]", "twice"),
    ({"windows": [{"days": ["Monday"], "start": "08:00", "end": "09:00"}]}, "spec.windows[0].days[0]", "not allowed"),
    ({"windows": [{"days": [], "start": "08:00", "end": "09:00"}]}, "spec.windows[0].days", "at least 1"),
    ({"reclaim": {"signal": "KILL"}}, "spec.reclaim.signal", "cannot be caught"),
    ({"reclaim": {"signal": "SIGUSR1"}}, "spec.reclaim.signal", "write it as USR1"),
    ({"reclaim": {"signal": "usr2"}}, "spec.reclaim.signal", "write it as USR2"),
    ({"reclaim": {"signal": "USR1;reboot"}}, "spec.reclaim.signal", "not a signal"),
    ({"reclaim": {"jobAction": "hold"}}, "spec.reclaim.jobAction", "not allowed"),
    ({"reclaim": {"gracePeriodSeconds": 100000}}, "spec.reclaim.gracePeriodSeconds", "too large"),
    ({"reclaim": {"podSelector": {}}}, "spec.reclaim.podSelector", "matches every pod"),
    ({"reclaim": {"podSelector": {"matchExpressions": [{"key": "t", "operator": "NotIn"}]}}},
     "spec.reclaim.podSelector.matchExpressions[0].values", "at least one value"),
    ({"surprise": 1}, "spec.surprise", "not a known field"),
])
def test_bad_input_names_the_field_and_the_reason(spec, path, reason):
    found = errors_of(policy_doc(**spec))
    matching = [e for e in found if e.startswith(path + ": ")]
    assert matching, f"no error at {path}; got {found}"
    assert any(reason in e for e in matching), f"{reason!r} not in {matching}"


def test_every_problem_is_reported_at_once():
    doc = policy_doc(nodeSelector={}, windows=[{"start": "10:00", "end": "10:00"}])
    paths = {e.split(": ")[0] for e in errors_of(doc)}
    assert paths == {"spec.nodeSelector", "spec.windows[0].end"}


@pytest.mark.parametrize("expressions", [
    [{"key": "no.such/label", "operator": "DoesNotExist"}],
    [{"key": "team", "operator": "NotIn", "values": ["b"]}],
    [{"key": "a", "operator": "DoesNotExist"}, {"key": "b", "operator": "NotIn", "values": ["x"]}],
])
def test_a_selector_that_only_excludes_labels_is_refused(expressions):
    """Issue 13: matchExpressions [{key: no.such/label, operator: DoesNotExist}]
    passed the empty-selector guard and matched every node."""
    found = errors_of(policy_doc(nodeSelector={"matchExpressions": expressions}))
    assert any(e.startswith("spec.nodeSelector: ") and "matches every node" in e for e in found), found


@pytest.mark.parametrize("selector", [
    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]},
                          {"key": "x", "operator": "DoesNotExist"}]},
    {"matchExpressions": [{"key": "pool", "operator": "Exists"}]},
    {"matchLabels": {"pool": "a"}, "matchExpressions": [{"key": "x", "operator": "NotIn", "values": ["1"]}]},
])
def test_a_selector_that_asks_for_a_label_may_also_exclude_some(selector):
    assert load_policy(policy_doc(nodeSelector=selector)).spec.node_selector.positive


def test_a_policy_needs_its_cluster_partition_and_selector():
    doc = policy_doc()
    doc["spec"] = {}
    paths = {e.split(": ")[0] for e in errors_of(doc)}
    assert paths == {"spec.clusterRef", "spec.partition", "spec.nodeSelector"}


SELECTOR_CASES = [
    ({"matchLabels": {"a": "1"}}, {"a": "1", "b": "2"}, True),
    ({"matchLabels": {"a": "1"}}, {"a": "2"}, False),
    ({"matchLabels": {"a": "1"}}, {}, False),
    ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]}, {"a": "2"}, True),
    ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1"]}]}, {}, False),
    ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {}, True),
    ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {"a": "1"}, False),
    ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"a": ""}, True),
    ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"a": ""}, False),
    ({"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "b", "operator": "Exists"}]}, {"a": "1"}, False),
]


@pytest.mark.parametrize("selector,labels,expected", SELECTOR_CASES)
def test_label_selectors_follow_kubernetes_semantics(selector, labels, expected):
    assert LabelSelector.model_validate(selector).matches(labels) is expected


@reaches(matches=0.15, misses=0.2)
@given(labels=st.dictionaries(st.sampled_from("abc"), st.sampled_from(["1", "2", ""]), max_size=3)
       .flatmap(lambda d: st.sampled_from([d, {**d, "a": "1", "c": d.get("c", "")}])))  # often near a match
def test_a_selector_is_the_conjunction_of_its_parts(labels):
    parts = [
        {"matchLabels": {"a": "1"}},
        {"matchExpressions": [{"key": "b", "operator": "NotIn", "values": ["2"]}]},
        {"matchExpressions": [{"key": "c", "operator": "Exists"}]},
    ]
    whole = LabelSelector.model_validate({"matchLabels": {"a": "1"}, "matchExpressions": [
        parts[1]["matchExpressions"][0], parts[2]["matchExpressions"][0]]})
    reached("matches" if whole.matches(labels) else "misses")
    assert whole.matches(labels) == all(LabelSelector.model_validate(p).matches(labels) for p in parts)


def test_selectors_are_described_in_kubectl_syntax():
    sel = LabelSelector.model_validate({"matchLabels": {"a": "1"}, "matchExpressions": [
        {"key": "b", "operator": "NotIn", "values": ["x", "y"]}, {"key": "c", "operator": "DoesNotExist"}]})
    assert describe_selector(sel) == "a=1,b notin (x,y),!c"


def test_validate_command_checks_policies_too(tmp_path):
    runner = CliRunner()
    ok = runner.invoke(main, ["validate", "-f", str(EXAMPLE)])
    assert ok.exit_code == 0, ok.output
    assert ok.output == "NodeLendingPolicy default/lend-idle-gpus is valid\n"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(policy_doc(reclaim={"signal": "KILL"})))
    result = runner.invoke(main, ["validate", "-f", str(bad)])
    assert result.exit_code == 1
    assert "NodeLendingPolicy 'lend' is invalid" in result.output
    assert "spec.reclaim.signal: " in result.output


def test_the_sandboxs_lendable_nodes_are_ones_the_example_policy_may_lend():
    """The sandbox labels its lendable nodes for the cluster's namespace, as a
    platform team would (decision record 15), so the example policy lends them."""
    from sandbox.sandbox import sandbox_nodes
    from slurmk8s.api import load_cluster
    from slurmk8s.api.lending import may_lend
    cluster = load_cluster(yaml.safe_load((ROOT / "examples" / "slurmcluster.yaml").read_text()))
    pol = load_policy(yaml.safe_load(EXAMPLE.read_text()))
    nodes = sandbox_nodes(cluster, lendable=2)
    lendable = [n.name for n in nodes if may_lend(pol.namespace, n.labels) and pol.spec.node_selector.matches(n.labels)]
    assert lendable == ["sandbox-lend-0", "sandbox-lend-1"]
    # The cluster's own GPU nodes are not lendable.
    assert not [n for n in nodes if n.name.startswith("sandbox-gpu") and may_lend(pol.namespace, n.labels)]
