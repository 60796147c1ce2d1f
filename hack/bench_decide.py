#!/usr/bin/env python3
"""Time the lending decision on a large synthetic world and print medians.

    .venv/bin/python hack/bench_decide.py [--nodes 10000] [--pods 50000] [--jobs 50000] [--runs 7] [--cpu]

The world: GPU nodes with 8 GPUs each, all matching the policy's selector.
Most serve Kubernetes and are busy (GPU pods plus a DaemonSet pod each), a
fifth are lent to Slurm and run jobs (some spanning several nodes, written
as Slurm host lists), some are still starting or on their way back, a few
are idle, and some GPU pods are pending.

Prints the median time of one decide() call from scratch (nothing
remembered from an earlier call: the first round after the bridge starts),
the time per node, what the round decided, and the median time of the
next round after a small change: one Node changed, one Pod changed, and
one Node changed with Slurm read anew (the same answer in new objects, as
every round reads it). Unchanged Nodes and Pods are the same objects, as a
watch cache keeps them (slurmk8s/bridge/world.py).
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from slurmk8s.api import load_cluster, load_policy  # noqa: E402 - after the checkout is put on sys.path
from slurmk8s.api.cluster import lent_nodeset  # noqa: E402 - after the checkout is put on sys.path
from slurmk8s.bridge.decide import decide  # noqa: E402 - after the checkout is put on sys.path
from slurmk8s.bridge.memo import forget  # noqa: E402 - after the checkout is put on sys.path
from slurmk8s.bridge.nodestate import (  # noqa: E402 - after the checkout is put on sys.path
    CLUSTER_ANNOTATION,
    COMPONENT_LABEL,
    IDLE_SINCE_ANNOTATION,
    LENDING,
    LENT,
    PARTITION_ANNOTATION,
    POLICY_ANNOTATION,
    REASON_ANNOTATION,
    RECLAIMING,
    SIGNALLED_ANNOTATION,
    SINCE_ANNOTATION,
    SLURMD_COMPONENT,
    STATE_LABEL,
    TAINT_EFFECT,
    TAINT_KEY,
    format_time,
)
from slurmk8s.bridge.observed import KubeNode, KubePod, NodeTaint, Observed  # noqa: E402 - after the checkout is put on sys.path
from slurmk8s.render.names import lent_slurmd  # noqa: E402 - after the checkout is put on sys.path
from slurmk8s.slurm.model import Job, Node, SlurmState  # noqa: E402 - after the checkout is put on sys.path

NOW = datetime(2025, 3, 3, 12, 0, tzinfo=UTC)
LABELS = {"slurmk8s.dev/lendable": "true", "slurmk8s.dev/lendable-to": "hpc", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
          "topology.kubernetes.io/zone": "zone-a"}
ALLOCATABLE = {"cpu": "95500m", "memory": "1031880Mi", "nvidia.com/gpu": "8", "pods": "110"}


def world(n_nodes: int, n_pods: int, n_jobs: int, seed: int = 7):
    rng = random.Random(seed)
    cluster = load_cluster({"apiVersion": "slurmk8s.dev/v1alpha1", "kind": "SlurmCluster",
                            "metadata": {"name": "demo", "namespace": "hpc"},
                            "spec": {"partitions": [{"name": "gpu", "acceptLentNodes": True}]}})
    policy = load_policy({"apiVersion": "slurmk8s.dev/v1alpha1", "kind": "NodeLendingPolicy",
                          "metadata": {"name": "lend", "namespace": "hpc", "generation": 1},
                          "spec": {"clusterRef": {"name": "demo"}, "partition": "gpu",
                                   "nodeSelector": {"matchLabels": {"slurmk8s.dev/lendable": "true"}},
                                   "minKubernetesNodes": n_nodes // 2, "maxLentNodes": n_nodes // 4}})
    names = [f"gpu-{i:05d}" for i in range(n_nodes)]
    lent_n, lending_n, reclaiming_n, idle_n = n_nodes // 5, n_nodes // 50, n_nodes // 100, n_nodes // 50
    lent = names[:lent_n]
    lending = names[lent_n:lent_n + lending_n]
    reclaiming = names[lent_n + lending_n:lent_n + lending_n + reclaiming_n]
    idle = names[lent_n + lending_n + reclaiming_n:][:idle_n]
    busy = names[lent_n + lending_n + reclaiming_n + idle_n:]

    def held(name, state, **ann):
        return KubeNode(name, labels={**LABELS, STATE_LABEL: state},
                        annotations={POLICY_ANNOTATION: "hpc/lend", CLUSTER_ANNOTATION: "hpc/demo",
                                     PARTITION_ANNOTATION: "gpu",
                                     SINCE_ANNOTATION: format_time(NOW - timedelta(minutes=rng.randint(1, 9))),
                                     **ann},
                        taints=(NodeTaint(TAINT_KEY, "demo", TAINT_EFFECT),), allocatable=ALLOCATABLE)

    nodes = [held(n, LENT) for n in lent]
    nodes += [held(n, LENDING) for n in lending]
    nodes += [held(n, RECLAIMING, **{REASON_ANNOTATION: "demand",
                                     SIGNALLED_ANNOTATION: format_time(NOW - timedelta(seconds=30))})
              for n in reclaiming]
    nodes += [KubeNode(n, labels=LABELS, allocatable=ALLOCATABLE,
                       annotations={IDLE_SINCE_ANNOTATION: format_time(NOW - timedelta(minutes=10))})
              for n in idle]
    nodes += [KubeNode(n, labels=LABELS, allocatable=ALLOCATABLE) for n in busy]

    pods: list[KubePod] = []
    for n in [*lent, *lending, *reclaiming]:
        pods.append(KubePod("hpc", lent_slurmd("demo", n), node=n, phase="Running", gpus=8,
                            labels={COMPONENT_LABEL: SLURMD_COMPONENT}))
    for n in names:  # a device-plugin DaemonSet pod everywhere
        pods.append(KubePod("kube-system", f"nvidia-plugin-{n}", node=n, phase="Running",
                            owner_kind="DaemonSet"))
    pending = max(1, n_pods // 50)
    for i in range(pending):
        pods.append(KubePod("serving", f"infer-pending-{i}", phase="Pending", gpus=rng.choice([1, 4, 8, 8]),
                            unschedulable=True, priority=rng.choice([0, 1000]),
                            labels={"team": rng.choice(["inference", "research"])},
                            node_selector=rng.choice([{}, {"topology.kubernetes.io/zone": "zone-a"}])))
    i = 0
    while len(pods) < n_pods:  # the rest run on the busy nodes, 1 or 2 GPUs each
        pods.append(KubePod("apps", f"train-{i}", node=busy[i % len(busy)], phase="Running",
                            gpus=rng.choice([1, 1, 2]), owner_kind="ReplicaSet", labels={"app": f"a{i % 97}"}))
        i += 1

    snodes = [Node(name=n, state="mixed", flags=frozenset(), reason="", features=(lent_nodeset("gpu"),),
                   partitions=("gpu",), cpus=95, alloc_cpus=64, gres="gpu:NVIDIA-H100-80GB-HBM3:8", address="")
              for n in lent]
    snodes += [Node(name=n, state="mixed", flags=frozenset({"DRAIN"}), reason="slurmk8s: reclaimed by Kubernetes",
                    features=(lent_nodeset("gpu"),), partitions=("gpu",), cpus=95, alloc_cpus=32,
                    gres="gpu:NVIDIA-H100-80GB-HBM3:8", address="") for n in reclaiming]
    jobs: list[Job] = []
    on_nodes = [*lent, *reclaiming]
    running = n_jobs // 5
    for j in range(n_jobs):
        if j < running:
            first = rng.randrange(len(on_nodes))
            width = rng.choice([1, 1, 1, 2, 4])
            span = on_nodes[first:first + width]
            # Slurm compresses consecutive names into a host list.
            hostlist = (f"gpu-[{span[0][4:]}-{span[-1][4:]}]" if len(span) > 1 else span[0])
            jobs.append(Job(job_id=j + 1, name=f"train{j}", user="researcher", state="RUNNING",
                            partition="gpu", nodes=hostlist, requeue=True, restart_count=0, reason=""))
        else:
            jobs.append(Job(job_id=j + 1, name=f"queued{j}", user="researcher", state="PENDING",
                            partition="gpu", nodes="", requeue=True, restart_count=0, reason="Resources"))
    observed = Observed(tuple(nodes), tuple(pods), cluster, SlurmState(tuple(snodes), tuple(jobs)))
    return observed, policy


def _median_ms(times: list[float]) -> str:
    return (f"median {statistics.median(times) * 1000:.1f} ms over {len(times)} runs "
            f"(min {min(times) * 1000:.1f}, max {max(times) * 1000:.1f})")


CLOCK = time.perf_counter


def _time(call, prepare, runs: int) -> list[float]:
    """Run ``prepare(i)`` (untimed), then time ``call(prepared)``, ``runs`` times."""
    times = []
    for i in range(runs):
        arg = prepare(i)
        gc.collect()  # what making the world left for the collector is not the decision's
        start = CLOCK()
        call(arg)
        times.append(CLOCK() - start)
    return times


def one_node_changed(observed: Observed, i: int) -> Observed:
    """The next round's world after one Node changed (a new object for it, as
    a watch cache makes), everything else the same objects."""
    nodes = list(observed.nodes)
    k = len(nodes) - 1 - i % 100  # a busy Kubernetes node
    nodes[k] = replace(nodes[k], annotations={**nodes[k].annotations, "example.com/touched": str(i)})
    return replace(observed, nodes=tuple(nodes))


def one_pod_changed(observed: Observed, i: int) -> Observed:
    """The next round's world after one Pod changed (a running pod ended),
    everything else the same objects."""
    pods = list(observed.pods)
    k = len(pods) - 1 - i % 100
    pods[k] = replace(pods[k], phase="Succeeded" if pods[k].phase == "Running" else "Running")
    return replace(observed, pods=tuple(pods))


def slurm_read_anew(observed: Observed, i: int) -> Observed:
    """One Node changed, and Slurm read again: the same answer, in new objects."""
    slurm = observed.slurm
    fresh = SlurmState(tuple(replace(n) for n in slurm.nodes or ()), tuple(replace(j) for j in slurm.jobs or ()))
    return replace(one_node_changed(observed, i), slurm=fresh)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--pods", type=int, default=50_000)
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--cpu", action="store_true",
                        help="time the process's CPU time, not wall time (on a machine other work shares)")
    args = parser.parse_args()
    global CLOCK
    if args.cpu:
        CLOCK = time.process_time
    observed, policy = world(args.nodes, args.pods, args.jobs)
    actions = decide(observed, policy, NOW)  # warm up (imports; each Node parses its record once)

    def decide_on(obs: Observed) -> None:
        decide(obs, policy, NOW)

    def from_scratch(_: int) -> Observed:
        forget()  # nothing remembered from an earlier decision: the first round after a start
        return observed

    full = _time(decide_on, from_scratch, args.runs)
    counts = Counter(type(a).__name__ for a in actions)
    print(f"world: {len(observed.nodes)} nodes, {len(observed.pods)} pods, {len(observed.slurm.jobs)} jobs "
          f"({sum(1 for j in observed.slurm.jobs if j.state == 'RUNNING')} running)")
    print(f"decide(), from scratch: {_median_ms(full)}")
    print(f"per node: {statistics.median(full) / len(observed.nodes) * 1e6:.1f} us")
    print("actions: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    for what, change in (("one Node changed", one_node_changed), ("one Pod changed", one_pod_changed),
                         ("one Node changed, Slurm read anew", slurm_read_anew)):
        forget()
        decide(observed, policy, NOW)  # the round before
        print(f"decide(), {what}: {_median_ms(_time(decide_on, lambda i, c=change: c(observed, i), args.runs))}")


if __name__ == "__main__":
    main()
