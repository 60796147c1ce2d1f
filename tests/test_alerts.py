"""The alert rules (charts/slurmk8s/files/prometheus/alerts.yaml) through
Debian's promtool: valid, every alert unit-tested (tests/prometheus/), and the
chart's PrometheusRule and monitors carrying exactly them when asked."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

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
