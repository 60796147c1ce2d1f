"""The alert rules (charts/slurmk8s/files/prometheus/alerts.yaml) through
Debian's promtool: valid, every alert unit-tested (tests/prometheus/), and the
chart's PrometheusRule and monitors carrying exactly them when asked."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml

from slurmk8s.api import load_cluster

from .conftest import ROOT
from .test_chart import WATCHED, objects, one

RULES = ROOT / "charts" / "slurmk8s" / "files" / "prometheus" / "alerts.yaml"
TESTS = ROOT / "tests" / "prometheus" / "alerts-test.yaml"
#: Where hack/setup.sh unpacks Debian's prometheus package.
PROMTOOL = shutil.which("promtool") or "/var/cache/slurmk8s/prometheus/usr/bin/promtool"


def promtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    assert Path(PROMTOOL).exists(), "run hack/setup.sh: it unpacks promtool from Debian's prometheus package"
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def alerts() -> dict[str, dict]:
    return {r["alert"]: r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}


def test_the_rules_are_valid_prometheus_rules():
    out = promtool("check", "rules", str(RULES))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in out.stdout


def test_every_alert_passes_its_promtool_unit_tests():
    out = promtool("test", "rules", TESTS.name, cwd=TESTS.parent)
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr


def test_every_alert_is_seen_firing_and_not_firing_and_says_what_to_do():
    cases = [c for t in yaml.safe_load(TESTS.read_text())["tests"] for c in t["alert_rule_test"]]
    fired = {c["alertname"] for c in cases if c["exp_alerts"]}
    quiet = {c["alertname"] for c in cases if not c["exp_alerts"]}
    assert set(alerts()) == fired == quiet
    for name, rule in alerts().items():
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name


def test_the_chart_ships_the_rules_and_monitors_only_when_asked():
    off = objects()
    assert not [o for o in off if o["apiVersion"].startswith("monitoring.coreos.com/")]
    on = objects({"monitoring": {"prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus"}},
                                 "monitors": {"enabled": True}}, "watchNamespaces": WATCHED})
    rule = one(on, "PrometheusRule")
    assert rule["spec"] == yaml.safe_load(RULES.read_text())  # the same file, byte for byte in meaning
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus"
    monitors = {o["metadata"]["name"]: o for o in on if o["kind"] in ("ServiceMonitor", "PodMonitor")}
    assert len(monitors) == 3
    fewer = objects({"monitoring": {"monitors": {"enabled": True}}, "metrics": {"service": {"enabled": False}}})
    assert [o["kind"] for o in fewer if o["kind"] in ("ServiceMonitor", "PodMonitor")] == ["ServiceMonitor", "PodMonitor"]
    services = {o["metadata"]["name"]: o for o in on if o["kind"] == "Service" and
                any(p["name"] == "metrics" for p in o["spec"]["ports"])}
    for m in monitors.values():
        if m["kind"] == "ServiceMonitor":  # selects exactly one metrics Service, by its labels
            chosen = [s for s in services.values()
                      if m["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()]
            assert len(chosen) == 1 and m["spec"]["endpoints"][0]["port"] == "metrics"
    [pods] = [m for m in monitors.values() if m["kind"] == "PodMonitor"]
    assert pods["spec"]["namespaceSelector"] == {"matchNames": WATCHED}
    assert pods["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"


DASHBOARDS = ROOT / "charts" / "slurmk8s" / "files" / "dashboards"


def test_the_dashboards_are_grafana_json_whose_queries_prometheus_parses(tmp_path):
    """Every panel's query, with the dashboards' variables as Grafana fills them in,
    is a valid PromQL expression (promtool checks it as a recording rule's)."""
    from .dashboards import queries

    exprs = queries()
    assert len(exprs) >= 15
    rules = {"groups": [{"name": "dashboards", "rules": [
        {"record": f"dashboard:query{i}", "expr": e} for i, (_, _, e) in enumerate(exprs)]}]}
    path = tmp_path / "dashboards-as-rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    out = promtool("check", "rules", str(path))
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_chart_ships_the_dashboards_for_grafanas_sidecar_when_asked():
    import json

    assert not [o for o in objects() if o["kind"] == "ConfigMap" and "grafana_dashboard" in o["metadata"]["labels"]]
    maps = [o for o in objects({"monitoring": {"dashboards": {"enabled": True}}})
            if o["kind"] == "ConfigMap" and o["metadata"]["labels"].get("grafana_dashboard") == "1"]
    shipped = {k: json.loads(v) for m in maps for k, v in m["data"].items()}
    assert shipped == {p.name: json.loads(p.read_text()) for p in DASHBOARDS.glob("*.json")}


def test_the_example_prometheus_is_valid_and_scrapes_the_ports_slurmk8s_names_metrics(example_doc, keys):
    import kubernetes_validate

    from slurmk8s.render import render

    from .test_chart import K8S_VERSIONS

    docs = [d for d in yaml.safe_load_all((ROOT / "examples" / "monitoring" / "prometheus.yaml").read_text()) if d]
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSIONS[-1], strict=True)
    [config] = [d for d in docs if d["kind"] == "ConfigMap"]
    [job] = [j for j in yaml.safe_load(config["data"]["prometheus.yml"])["scrape_configs"] if j["job_name"] == "slurmk8s"]
    [keep] = [r for r in job["relabel_configs"] if r["source_labels"] == ["__meta_kubernetes_pod_container_port_name"]]
    # The port names it keeps are those of the agent beside slurmctld, the operator and the bridge.
    agent_ports = {p["name"] for o in render(load_cluster(example_doc), keys) if o["kind"] == "StatefulSet"
                   for c in o["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])
                   if re.fullmatch(keep["regex"], p["name"])}
    chart_ports = {p["name"] for o in objects() if o["kind"] == "Deployment"
                   for c in o["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])
                   if re.fullmatch(keep["regex"], p["name"])}
    assert agent_ports == chart_ports == {"metrics"}
    cluster = load_cluster(yaml.safe_load((ROOT / "examples" / "slurmcluster.yaml").read_text()))
    [ns] = [d for d in docs if d["kind"] == "Namespace"]
    assert ns["metadata"]["name"] in cluster.spec.metrics.scrape_from
