"""What a simulation reports: figures per run, the comparison table, JSON and plots. Pure but for the plot files.

Definitions (every run on the same window):

- queueing delay: a job's submission -> its first start; jobs not started
  by the end of the window count with the time they waited so far (so a run
  that starts fewer jobs is not flattered);
- JCT: submission -> completion, over the jobs completed in the window;
- GPU-hours used: serving pods Running, plus Slurm jobs on Slurm's own
  nodes, plus Slurm jobs on lent nodes (work later lost included), against
  all GPUs for the whole window;
- serving pending: a serving pod's creation -> Running (-> its end, or the
  end of the window, if it never ran);
- lost GPU-hours: work of requeued or cancelled jobs that no checkpoint
  kept, and the restart overhead they spent, times their GPUs; of which
  ``lost_gpu_hours_started_unreserved``: jobs that started on a lent node
  while it had no lending reservation (decision record 40: a lent node
  registers before its first reservation is made, and a policy without a
  forecast makes none).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

from .engine import Result

__all__ = ["summary", "table", "write_json", "plot", "percentile"]


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (nearest rank), 0 for no values."""
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def summary(r: Result) -> dict:
    """One run's figures; the keys scripts rely on are listed in the issue
    and ``slurmk8s simulate --help``."""
    q = [*r.queueing, *r.unstarted]
    G = r.shape.gpus_per_node
    used = r.gpu_seconds_serving + r.gpu_seconds_own + r.gpu_seconds_lent
    return {
        "name": r.name,
        "queueing_delay_mean_s": _mean(q),
        "queueing_delay_p50_s": percentile(q, 50),
        "queueing_delay_p95_s": percentile(q, 95),
        "queueing_delay_p99_s": percentile(q, 99),
        "jct_mean_s": _mean(r.jct),
        "jobs": len(q),
        "jobs_started": len(r.queueing),
        "jobs_completed": len(r.jct),
        "jobs_dropped": r.dropped_jobs,
        "gpu_hours_used": used / 3600,
        "gpu_hours_available": r.shape.nodes * G * r.span / 3600,
        "gpu_hours_serving": r.gpu_seconds_serving / 3600,
        "gpu_hours_own_slurm": r.gpu_seconds_own / 3600,
        "gpu_hours_lent": r.gpu_seconds_lent / 3600,
        "serving_pending_p50_s": percentile(r.serving_pending, 50),
        "serving_pending_p99_s": percentile(r.serving_pending, 99),
        "serving_pending_max_s": max(r.serving_pending, default=0.0),
        "lends": r.lends,
        "reclaims": r.reclaims,
        "reclaim_reasons": dict(sorted(r.reclaim_reasons.items())),
        "jobs_requeued": r.requeued,
        "jobs_cancelled": r.cancelled,
        "lost_gpu_hours": r.lost_gpu_seconds / 3600,
        "lost_gpu_hours_started_unreserved": r.lost_gpu_seconds_unreserved / 3600,
        "rounds": r.rounds,
        "lent_nodes_mean": _mean([row[3] for row in r.timeline]),
        "lent_nodes_max": max((row[3] for row in r.timeline), default=0.0),
    }


def _days(s: float) -> str:
    if s >= 86400:
        return f"{s / 86400:.1f} d"
    if s >= 3600:
        return f"{s / 3600:.1f} h"
    if s >= 60:
        return f"{s / 60:.1f} min"
    return f"{s:.2f} s"


def table(runs: list[dict]) -> str:
    """One line per run; ratios against the static split and the share of the
    oracle's gain in GPU-hours each run reaches, when those runs are there."""
    static = next((r for r in runs if r["name"] == "static"), None)
    oracle = next((r for r in runs if r["name"] == "oracle"), None)
    head = (f"{'run':<18} {'queue mean':>10} {'p95':>9} {'JCT mean':>9} {'GPU-h used':>11} {'util':>6} "
            f"{'serve p99':>9} {'max':>9} {'reclaims':>8} {'lost GPU-h':>10}")
    if static:
        head += f" {'queue ×':>8} {'GPU-h ±':>8}"
    if static and oracle:
        head += f" {'of oracle':>9}"
    lines = [head]
    for r in runs:
        line = (f"{r['name'][:18]:<18} {_days(r['queueing_delay_mean_s']):>10} {_days(r['queueing_delay_p95_s']):>9} "
                f"{_days(r['jct_mean_s']):>9} {r['gpu_hours_used']:>11,.0f} "
                f"{100 * r['gpu_hours_used'] / max(r['gpu_hours_available'], 1e-9):>5.1f}% "
                f"{_days(r['serving_pending_p99_s']):>9} {_days(r['serving_pending_max_s']):>9} {r['reclaims']:>8} "
                f"{r['lost_gpu_hours']:>10,.1f}")
        if static:
            ratio = static["queueing_delay_mean_s"] / r["queueing_delay_mean_s"] if r["queueing_delay_mean_s"] else math.inf
            gain = r["gpu_hours_used"] / static["gpu_hours_used"] - 1 if static["gpu_hours_used"] else 0.0
            line += f" {ratio:>7.2f}× {100 * gain:>+7.1f}%"
        if static and oracle:
            room = oracle["gpu_hours_used"] - static["gpu_hours_used"]
            share = (r["gpu_hours_used"] - static["gpu_hours_used"]) / room if room > 0 else 0.0
            line += f" {100 * share:>8.0f}%"
        lines.append(line)
    lines.append("queue ×: the static split's mean queueing delay / this run's (higher is better); "
                 "GPU-h ±: GPU-hours used against the static split; of oracle: the share of the oracle's "
                 "gain in GPU-hours this run reaches")
    return "\n".join(lines)


def write_json(path: Path, runs: list[dict], inputs: dict) -> None:
    path.write_text(json.dumps({"inputs": inputs, "runs": runs}, indent=2) + "\n")


def plot(directory: Path, results: list[Result]) -> list[Path]:
    """PNG files: utilisation over time per run (serving / own Slurm / lent),
    the CDF of queueing delay per run, and lent nodes over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    written = []

    def save(fig, name: str) -> None:
        fig.tight_layout()
        written.append(directory / name)
        fig.savefig(written[-1], dpi=90)
        plt.close(fig)

    def finish(fig, ax, name: str, xlabel: str, ylabel: str, title: str) -> None:
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        save(fig, name)

    n = len(results)
    fig, axes = plt.subplots(n, 1, figsize=(10, 2.2 * n + 0.6), sharex=True, squeeze=False)
    for ax, r in zip(axes[:, 0], results, strict=True):
        total = r.shape.nodes * r.shape.gpus_per_node
        days = [k * r.sample / 86400 for k in range(len(r.timeline))]
        serving = [100 * row[0] / total for row in r.timeline]
        own = [100 * row[1] / total for row in r.timeline]
        lent = [100 * row[2] / total for row in r.timeline]
        ax.stackplot(days, serving, own, lent, labels=["serving (Kubernetes)", "Slurm, own nodes", "Slurm, lent nodes"],
                     colors=["#4c72b0", "#55a868", "#dd8452"], step="post")
        ax.set_ylim(0, 100)
        ax.set_ylabel("GPUs in use %")
        ax.set_title(r.name, fontsize=10, loc="left")
    axes[0, 0].legend(loc="lower right", fontsize=8)
    axes[-1, 0].set_xlabel("day")
    save(fig, "utilisation.png")

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in results:
        q = sorted(x / 3600 for x in [*r.queueing, *r.unstarted])
        if q:
            ax.plot(q, [(k + 1) / len(q) for k in range(len(q))], label=r.name)
    ax.set_xscale("symlog", linthresh=0.1)
    finish(fig, ax, "queueing_cdf.png", "queueing delay (hours)", "fraction of jobs", "training jobs' queueing delay (CDF)")

    fig, ax = plt.subplots(figsize=(10, 3))
    for r in results:
        if r.name == "static":
            continue
        ax.plot([k * r.sample / 86400 for k in range(len(r.timeline))], [row[3] for row in r.timeline],
                label=r.name, drawstyle="steps-post")
    finish(fig, ax, "lent_nodes.png", "day", "lent nodes (mean)", "Kubernetes nodes lent to Slurm")
    return written
