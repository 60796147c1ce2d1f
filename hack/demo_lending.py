#!/usr/bin/env python3
"""The main job, act 2: lend idle GPU nodes to Slurm, train on them, take one
back for serving, and resume the training from its checkpoint.

Runs against the sandbox `hack/demo.sh` brought up (examples/slurmcluster.yaml,
two lendable GPU nodes), with the project's examples unchanged:

1. examples/nodelendingpolicy.yaml: the idle GPU nodes are lent to `gpu`.
2. The cluster's own GPU nodes are busy (a colleague's job), and
   examples/train.sh runs across the lent nodes.
3. examples/serving.yaml: a serving Deployment that needs a GPU scales up.
4. The bridge takes a lent node back for it.
5. The training job gets USR1, checkpoints and requeues itself.
6. The serving pod starts on the reclaimed node and serves that checkpoint.
7. The colleague's job ends; the training job resumes from its checkpoint.
8. With spec.accounting on, sacct shows each run of the training job, the
   requeue included.

It prints the lend, reclaim and resume latencies as it goes. Needs root.

    hack/demo_lending.py          (hack/demo.sh runs it)
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.e2e.common import wait_for  # noqa: E402 - after the checkout is put on sys.path

SK = str(ROOT / ".venv" / "bin" / "slurmk8s")
KUBECTL = str(ROOT / ".venv" / "bin" / "kubectl")
STEPS = 240  # train.sh steps of 0.5 s: long enough to be reclaimed mid-run


def say(text: str) -> None:
    print(f"\n== {text}", flush=True)


def note(text: str) -> None:
    print(f"   {text}", flush=True)


def run(argv: list[str], input: str | None = None) -> str:
    proc = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        sys.exit(f"`{' '.join(argv)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


STATUS = json.loads(run([SK, "sandbox", "status", "-o", "json"]))
KUBECONFIG = STATUS["kubeconfig"]
USER = STATUS["login"]["user"]
LEND = sorted(n for n in STATUS["nodes"] if n.startswith("sandbox-lend-"))


def kubectl(*args: str, input: str | None = None) -> str:
    return run([KUBECTL, "--kubeconfig", KUBECONFIG, *args], input=input)


def on_login(command: str, input: str | None = None) -> str:
    """A researcher's shell on the login pod."""
    return run([SK, "sandbox", "ssh", "--", command], input=input)


def wait(what: str, predicate, timeout: float = 180, every: float = 0.1):
    return wait_for(what, predicate, timeout=timeout, every=every)


def slurm_nodes() -> dict[str, str]:
    out = on_login("sinfo -h -N -p gpu -o '%N %T'")
    return dict(line.split() for line in out.splitlines() if line.strip())


def job(job_id: int) -> dict[str, str]:
    out = on_login(f"scontrol show job --oneliner {job_id}")
    return dict(f.split("=", 1) for f in out.split() if "=" in f)


def node(name: str) -> dict:
    return json.loads(kubectl("get", "node", name, "-o", "json"))


def reclaiming(since: float) -> str | None:
    """The lent node the bridge began to take back after ``since``: its Reclaiming Event,
    which stays after the node is back (a job that checkpoints and requeues itself on the
    signal frees the node within a round, faster than its label can be watched)."""
    events = json.loads(kubectl("get", "events", "-o", "json"))["items"]
    for e in events:
        obj = e.get("involvedObject") or {}
        stamp = e.get("lastTimestamp") or e.get("eventTime") or ""
        if (e.get("reason") == "Reclaiming" and obj.get("kind") == "Node" and obj.get("name") in LEND
                and stamp and datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() >= since - 1):
            return obj["name"]
    return None


def handed_back(name: str) -> bool:
    n = node(name)
    return ("slurmk8s.dev/lending" not in n["metadata"].get("labels", {})
            and not any(t["key"] == "slurmk8s.dev/lent" for t in n["spec"].get("taints") or []))


def serving_pod() -> dict | None:
    """The serving pod that stays: not one being replaced (the bridge rolls the
    Deployment when the job publishes a new model version)."""
    pods = json.loads(kubectl("get", "pods", "-l", "app.kubernetes.io/name=train-serve", "-o", "json"))["items"]
    pods = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    return pods[0] if pods else None


def ready(pod: dict | None) -> dict | None:
    conditions = (pod or {}).get("status", {}).get("conditions") or []
    return pod if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions) else None


def get_model(pod: dict) -> dict | None:
    """What the serving pod answers on GET /; None while it does not (it may be stopping)."""
    try:
        with urllib.request.urlopen(f"http://{pod['status']['podIP']}:8080/", timeout=10) as resp:
            return json.loads(resp.read())
    except OSError:
        return None


def main() -> None:
    say(f"1. Lending the idle GPU nodes {', '.join(LEND)} to Slurm (examples/nodelendingpolicy.yaml)")
    policy = (ROOT / "examples" / "nodelendingpolicy.yaml").read_text()
    idle_after = int(re.search(r"idleAfterSeconds: (\d+)", policy).group(1))
    t0 = time.time()
    kubectl("apply", "-f", "-", input=policy)
    lent = {}
    for name in LEND:
        wait(f"{name} idle in Slurm", lambda: slurm_nodes().get(name) == "idle", every=0.3)  # noqa: B023 - called within this iteration
        lent[name] = time.time() - t0
    for name, seconds in lent.items():
        note(f"{name}: an idle Slurm node {seconds:.1f}s after the policy was applied "
             f"({idle_after}s of it is the policy's idleAfterSeconds: lend latency {seconds - idle_after:.1f}s)")
    print(kubectl("get", "nodes", "-L", "slurmk8s.dev/lending"), end="")
    print(on_login("sinfo -p gpu -N"), end="")

    say("2. A colleague's job holds the cluster's own GPU nodes; train.sh runs across the lent nodes")
    own = sorted(n for n in slurm_nodes() if n not in LEND)
    colleague = int(on_login(f"sbatch --parsable -p gpu -w {','.join(own)} -N{len(own)} --exclusive "
                             "--gpus-per-node=4 --job-name=colleague "
                             "-o /dev/null --wrap 'sleep 900'").strip().split(";")[0])
    wait("the colleague's job to run", lambda: job(colleague)["JobState"] == "RUNNING")
    note(f"job {colleague} (colleague) runs on {job(colleague)['NodeList']}")
    workdir = f"/shared/{USER}/lending"
    ckpt = f"/shared/checkpoints/{USER}/train"
    on_login(f"rm -rf {ckpt} && mkdir -p {workdir} && cat > {workdir}/train.sh && chmod +x {workdir}/train.sh",
             input=(ROOT / "examples" / "train.sh").read_text())
    train = int(on_login(f"cd {workdir} && TRAIN_STEPS={STEPS} sbatch --parsable train.sh").strip().split(";")[0])
    wait("train.sh to run", lambda: job(train)["JobState"] == "RUNNING")
    note(f"job {train} (train.sh, unchanged) runs on {job(train)['NodeList']}")
    out = f"{workdir}/train-{train}.out"
    wait("its first checkpoint", lambda: "checkpoint saved" in on_login(f"cat {out}"), every=0.5)
    print(on_login(f"cat {out}"), end="")

    say("3. A serving Deployment that needs a GPU scales up (examples/serving.yaml)")
    t_serve = time.time()
    kubectl("apply", "-f", str(ROOT / "examples" / "serving.yaml"))
    pod = wait("the serving pod", serving_pod)
    note(f"pod {pod['metadata']['name']}: no GPU is free for it in Kubernetes; pending")

    say("4. The bridge takes a lent node back")
    reclaimed = wait("a node to be reclaimed", lambda: reclaiming(since=t_serve))
    t_reclaiming = time.time()
    note(f"{reclaimed} is reclaiming ({t_reclaiming - t_serve:.1f}s after the Deployment was applied)")
    wait(f"{reclaimed} handed back", lambda: handed_back(reclaimed))
    t_back = time.time()
    note(f"{reclaimed} is Kubernetes' again: {t_back - t_serve:.1f}s after the Deployment was applied")

    say("5. The training job checkpointed on USR1 and requeued itself")
    log = wait("the job's checkpoint", lambda: (lambda t: t if "USR1" in t else None)(on_login(f"cat {out}")))
    usr1 = [line for line in log.splitlines() if "USR1" in line][-1]
    saved = int(re.search(r"step (\d+)", usr1).group(1))
    print(f"   {usr1}")
    info = job(train)
    why = f" ({info['Reason']})" if info.get("Reason", "None") != "None" else ""
    note(f"job {train} is {info['JobState']}{why}, LATEST = {on_login(f'cat {ckpt}/LATEST').strip()}")

    say(f"6. The serving pod starts on {reclaimed} and serves that checkpoint")
    pod = wait("the serving pod ready", lambda: ready(serving_pod()))
    t_ready = time.time()
    note(f"pod {pod['metadata']['name']} on {pod['spec']['nodeName']}, ready {t_ready - t_serve:.1f}s after "
         "the Deployment was applied")
    # The pod that answers: the bridge may roll the Deployment to a newer version meanwhile.
    served = wait("the model served", lambda: (lambda p: p and get_model(p))(ready(serving_pod())), every=0.5)
    note(f"GET / -> version {served['version']}, step {served['step']}")

    say("7. The colleague's job ends; the training job resumes from its checkpoint")
    on_login(f"scancel {colleague}")
    t_free = time.time()
    wait("the training job to run again", lambda: job(train)["JobState"] == "RUNNING", timeout=300)
    t_resumed = time.time()
    info = job(train)
    note(f"job {train} runs again on {info['NodeList']} (restart {info['Restarts']}), "
         f"{t_resumed - t_free:.1f}s after GPU nodes were free")
    wait("its resumed output", lambda: f"step {saved} of {STEPS}" in on_login(f"cat {out}"), every=0.5)
    resumed = [line for line in on_login(f"cat {out}").splitlines() if f"step {saved} of" in line][-1]
    print(f"   {resumed}")

    say("8. The training job in sacct: each run on the lent nodes, the requeue included")
    if "accounting_storage/slurmdbd" in on_login("scontrol show config"):
        fields = "JobID,JobName%10,State,ExitCode,NodeList%32,Elapsed"
        wait("the requeue in sacct", lambda: "REQUEUED" in on_login(f"sacct -D -X -n -j {train} --format=State"),
             every=0.5)
        print(on_login(f"sacct -D -X -j {train} --format={fields}"), end="")
    else:
        note("spec.accounting is off in this cluster: sacct has no records (see README, Accounting)")

    say("Latencies")
    note(f"lend:    idle -> Slurm IDLE          {min(lent.values()) - idle_after:5.1f}s  (after {idle_after}s idle)")
    note(f"reclaim: GPU pod -> node reclaiming  {t_reclaiming - t_serve:5.1f}s")
    note(f"         GPU pod -> node schedulable {t_back - t_serve:5.1f}s  (checkpoint included)")
    note(f"         GPU pod -> serving ready    {t_ready - t_serve:5.1f}s")
    note(f"resume:  nodes free -> running again {t_resumed - t_free:5.1f}s  (from step {saved})")
    print("   hack/bench_lending.py measures these over repeated runs.")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as exc:  # a wait timed out: say what for, without a traceback
        sys.exit(f"demo: {exc}")
