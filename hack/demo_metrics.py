#!/usr/bin/env python3
"""The main job's Prometheus: installed before the story, read after it.

    hack/demo_metrics.py install     apply examples/monitoring/prometheus.yaml and the alert rules
    hack/demo_metrics.py report      print GPU-hours lent, lend and reclaim latency and queue wait

Against the sandbox `hack/demo.sh` brought up (the default state directory,
or SLURMK8S_SANDBOX_DIR). The image is the one built from Debian's
prometheus package; it finds the operator, the bridge and the Slurm agent
through Kubernetes service discovery (docs/metrics.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sandbox.prometheus import Prometheus  # noqa: E402 - after the checkout is put on sys.path
from sandbox.sandbox import DEFAULT_STATE_DIR, Sandbox  # noqa: E402 - after the checkout is put on sys.path


def value(prom: Prometheus, expr: str) -> float | None:
    result = prom.query(expr)
    return float(result[0]["value"][1]) if result else None


def latency(prom: Prometheus, metric: str, what: str) -> str:
    count = value(prom, f"sum({metric}_count)") or 0
    if not count:
        return f"{what}: none seen"
    mean = value(prom, f"sum({metric}_sum)") / count
    worst = value(prom, f"histogram_quantile(1, sum by (le) ({metric}_bucket))")
    return f"{what}: {count:.0f}, mean {mean:.1f} s (the slowest at most {worst:g} s, by the histogram's buckets)"


def report(prom: Prometheus) -> None:
    up = prom.query("up")
    print(f"   targets: {sum(float(r['value'][1]) == 1 for r in up)} of {len(up)} up "
          f"({', '.join(sorted({r['metric'].get('component', r['metric']['job']) for r in up}))})")
    lent = value(prom, 'sum(sum_over_time(slurmk8s_slurm_gpus{lent="true"}[2h:15s])) / 240') or 0
    print(f"   GPU-hours lent: {lent:.2f}")
    print("   " + latency(prom, "slurmk8s_bridge_lend_seconds", "lends"))
    print("   " + latency(prom, "slurmk8s_bridge_reclaim_seconds", "reclaims"))
    print("   " + latency(prom, "slurmk8s_slurm_queue_wait_seconds", "jobs started, queue wait"))
    firing = prom.query('ALERTS{alertstate="firing"}')
    print(f"   alerts firing: {', '.join(sorted({r['metric']['alertname'] for r in firing})) or 'none'}")


def main() -> None:
    if len(sys.argv) != 2 or sys.argv[1] not in ("install", "report"):
        sys.exit(__doc__)
    prom = Prometheus(Sandbox(DEFAULT_STATE_DIR))
    if sys.argv[1] == "install":
        prom.install()
        print(f"   Prometheus is ready at {prom.url} (its targets: {prom.url}/targets)")
    else:
        report(prom)


if __name__ == "__main__":
    main()
