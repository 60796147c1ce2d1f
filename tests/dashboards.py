"""The queries of the Grafana dashboards (charts/slurmk8s/files/dashboards/),
with their variables as Grafana fills them in: for the promtool check
(test_alerts.py) and the e2e test that runs them against the sandbox's
Prometheus (e2e/test_bridge_e2e.py)."""

from __future__ import annotations

import json
from pathlib import Path

DASHBOARDS = Path(__file__).resolve().parent.parent / "charts" / "slurmk8s" / "files" / "dashboards"
#: What Grafana puts for each variable: every cluster ("All"), and the time range of the story.
VARIABLES = {"$cluster": ".+", "$__range": "1h", "$__rate_interval": "1m", "${datasource}": "prometheus"}


def fill(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"a variable the tests do not fill in: {expr}"
    return expr


def queries() -> list[tuple[str, str, str]]:
    """(dashboard title, panel title, query) of every panel's every target."""
    out = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        board = json.loads(path.read_text())
        for panel in board["panels"]:
            for target in panel["targets"]:
                out.append((board["title"], panel["title"], fill(target["expr"])))
    return out
