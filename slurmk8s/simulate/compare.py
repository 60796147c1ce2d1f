"""Runs a set of simulations on the same inputs: the shell of ``slurmk8s simulate``."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..api.lending import NodeLendingPolicy
from .engine import Latencies, Result, Run, Shape, bridge_setup, simulate
from .report import summary
from .traces import (
    DAILY_PROFILE,
    RequestModel,
    ServingPod,
    TraceError,
    read_jobs,
    read_rates,
    read_requests,
    read_serving_pods,
    replicas_from_rates,
    replicas_from_requests,
    window,
)

__all__ = ["Inputs", "load_inputs", "run_all"]


@dataclass
class Inputs:
    shape: Shape
    jobs: list
    pods: list[ServingPod]
    start: float
    span: float
    described: dict = field(default_factory=dict)


def load_inputs(shape: Shape, jobs_file: Path, pods_file: Path | None, requests_file: Path | None,
                start: float | None, days: float | None, model: RequestModel, rates_file: Path | None = None
                ) -> Inputs:
    """The trace window and the serving demand over it (from exactly one of the three files)."""
    jobs, t0, span = window(read_jobs(jobs_file), start, days)
    described: dict = {"jobs_file": str(jobs_file), "window_start_posix": t0, "window_days": span / 86400,
                       "jobs": len(jobs), "nodes": shape.nodes, "gpus_per_node": shape.gpus_per_node,
                       "slurm_nodes": shape.slurm_nodes}
    if pods_file is not None:
        pods = read_serving_pods(pods_file)
        if pods and pods[0].start > 1e8:  # absolute timestamps: relative to the window
            pods = [ServingPod(p.start - t0, p.end - t0, p.gpus) for p in pods]
        described["serving_pods_file"] = str(pods_file)
    elif rates_file is not None:
        series = read_rates(rates_file)
        try:
            pods, scale = replicas_from_rates(series, span, model)
        except ValueError as exc:
            raise TraceError(f"{rates_file}: {exc}: give --days {math.floor(series.end / 864) / 100:g} or less") from None
        described.update(serving_rate_file=str(rates_file), request_rate_scale=scale,
                         requests_per_gpu_second=model.requests_per_gpu_second,
                         target_utilisation=model.target_utilisation, gpus_per_replica=model.gpus_per_replica,
                         serving_rate_window_s=series.step, serving_rate_gaps=series.gaps,
                         serving_rate_gaps_read_as="the rate of the window before", serving_peak_gpus=model.peak_gpus)
    else:
        assert requests_file is not None
        pods, stretch, scale = replicas_from_requests(read_requests(requests_file), span, model)
        described.update(serving_requests_file=str(requests_file), time_stretch=stretch, request_rate_scale=scale,
                         tokens_per_gpu_second=model.tokens_per_gpu_second,
                         target_utilisation=model.target_utilisation, gpus_per_replica=model.gpus_per_replica,
                         autoscale_window_s=model.bucket_seconds, serving_peak_gpus=model.peak_gpus,
                         serving_daily_profile=list(DAILY_PROFILE) if model.daily else None)
    described["serving_pods"] = len(pods)
    return Inputs(shape, jobs, pods, t0, span, described)


def run_all(inputs: Inputs, policies: list[NodeLendingPolicy], compare: bool, latencies: Latencies,
            labels: dict[str, str], queue_depth: int, time_limits: bool = True,
            progress: Callable[[str], Callable[[float], None] | None] = lambda name: None
            ) -> list[Result]:
    """static (with ``compare`` or without policies), each policy, then the oracle (with ``compare``)."""
    runs: list[Run] = []
    if compare or not policies:
        runs.append(Run("static", "static"))
    runs += [Run(p.name, "policy", p) for p in policies]
    if compare:
        runs.append(Run("oracle", "oracle"))
    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        raise ValueError(f"two runs would have the same name ({', '.join(names)}): give each policy its own "
                         "metadata.name; 'static' and 'oracle' are taken")
    out = []
    for run in runs:
        cluster, node_labels = bridge_setup(run.policy, labels) if run.policy else (None, labels)
        out.append(simulate(inputs.shape, inputs.jobs, inputs.pods, inputs.span, run, cluster, node_labels,
                            latencies, queue_depth, progress=progress(run.name), time_limits=time_limits))
    return out


def summaries(results: list[Result]) -> list[dict]:
    return [summary(r) for r in results]


def _stderr_progress(total: float) -> Callable[[str], Callable[[float], None]]:
    """A progress bar per run on stderr (click's), advanced in simulated seconds."""
    import click

    def make(name: str) -> Callable[[float], None]:
        bar = click.progressbar(length=1000, label=f"{name:<18}", file=sys.stderr, width=30,
                                show_eta=True, show_percent=True)
        bar.__enter__()
        state = {"at": 0}

        def tick(t: float) -> None:
            at = int(1000 * min(t / total, 1.0)) if total > 0 else 1000
            if at > state["at"]:
                bar.update(at - state["at"])
                state["at"] = at
            if at >= 1000:
                bar.__exit__(None, None, None)
        return tick
    return make
