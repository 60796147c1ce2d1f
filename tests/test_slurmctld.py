"""A real slurmctld (Debian's 22.05) accepts what the renderer writes."""

from __future__ import annotations

import os
import stat
import time

import pytest

from slurmk8s.api import load_cluster
from slurmk8s.render import config_files
from slurmk8s.render.config import GPU_FILES
from slurmk8s.render.lent import lent_node

from .realslurm import SlurmNamespace, missing_tools, parse_config, parse_oneliners


@pytest.fixture(scope="session")
def example_doc(host_example_doc):
    """This module's Slurm daemons are this host's packages (realslurm.py): the example on their release."""
    return host_example_doc


pytestmark = pytest.mark.slurm


@pytest.fixture(autouse=True)
def _needs_root_and_slurm():
    # The README's test command installs these; failing loudly beats skipping.
    assert os.geteuid() == 0, "these tests start Slurm daemons in namespaces and need root"
    assert not missing_tools(), f"missing {missing_tools()}: run hack/test.sh, which installs them"


def accepted(files, keys, work) -> tuple[dict, dict, str]:
    with SlurmNamespace(files, keys, work) as ns:
        ping = ns.run(["scontrol", "ping"]).stdout
        config = parse_config(ns.run(["scontrol", "show", "config"]).stdout)
        parts = parse_oneliners(ns.run(["scontrol", "show", "partition", "--oneliner"]).stdout, "PartitionName")
        assert "fatal" not in ns.log()
    assert "is UP" in ping
    return config, parts, ping


def test_slurmctld_accepts_the_example_and_configures_it_as_rendered(doc, keys, tmp_path):
    cluster = load_cluster(doc)
    cfg, parts, _ = accepted(config_files(cluster), keys, tmp_path)
    assert cfg["ClusterName"] == "demo"
    assert cfg["SelectType"] == "select/cons_tres"
    assert cfg["MaxNodeCount"] == "1024"
    assert cfg["TreeWidth"] == "65533"
    assert "enable_configless" in cfg["SlurmctldParameters"].split(",")
    assert "preempt_send_user_signal" in cfg["SlurmctldParameters"].split(",")
    assert cfg["GresTypes"] == "gpu"
    assert "cred_expire=30" in cfg["AuthInfo"]
    assert cfg["PreemptType"] == "preempt/partition_prio"
    assert set(parts) == {p.name for p in cluster.spec.partitions}
    assert parts["cpu"]["Default"] == "YES" and parts["gpu"]["Default"] == "NO"
    assert parts["gpu"]["NodeSets"] == "gpu,lent_gpu"  # acceptLentNodes
    assert parts["gpu"]["MaxTime"] == "2-00:00:00"
    assert parts["gpu"]["PreemptMode"] == "REQUEUE"
    assert parts["gpu"]["GraceTime"] == "60"


def test_slurmctld_accepts_every_optional_feature_at_once(doc, keys, tmp_path):
    doc["spec"]["restApi"] = {"enabled": True}
    doc["spec"]["slurmConfig"].update(
        selectTypeParameters="CR_Core_Memory", defMemPerCPU=512, killWait=45, maxNodeCount=64,
        schedulerParameters=["bf_continue", "bf_max_job_test=200"],
        slurmctldDebug="verbose", extraLines=["SchedulerTimeSlice=45", "MessageTimeout=20"],
    )
    doc["spec"]["partitions"].append(
        {"name": "urgent", "nodeSets": ["gpu", "cpu"], "priority": 100, "maxTime": "30"})
    cluster = load_cluster(doc)
    cfg, parts, _ = accepted(config_files(cluster), keys, tmp_path)
    assert cfg["AuthAltTypes"] == "auth/jwt"
    # spec.topology is refused for this release (its tree never places dynamic nodes); the
    # releases that take it are run with one in tests/test_image_build.py.
    assert cfg["SelectTypeParameters"] == "CR_CORE_MEMORY"
    assert cfg["DefMemPerCPU"] == "512"
    assert cfg["KillWait"] == "45 sec"
    assert cfg["MaxNodeCount"] == "64"
    assert cfg["SchedulerParameters"] == "bf_continue,bf_max_job_test=200"
    assert cfg["SchedulerTimeSlice"] == "45 sec"
    assert cfg["MessageTimeout"] == "20 sec"
    assert parts["urgent"]["PriorityTier"] == "100"
    assert parts["urgent"]["MaxTime"] == "00:30:00"
    assert set(parts["urgent"]["NodeSets"].split(",")) == {"gpu", "cpu"}


def test_a_dynamic_node_joins_its_node_set_partition(doc, keys, tmp_path):
    from slurmk8s.render import node_conf

    cluster = load_cluster(doc)
    cpu = cluster.spec.node_sets[0]
    with SlurmNamespace(config_files(cluster), keys, tmp_path,
                        nodes=[("demo-cpu-0", node_conf(cluster, cpu))]) as ns:
        out = ns.run(["sinfo", "-h", "-N", "-o", "%N %P %T %c %f"]).stdout.split()
    assert out == ["demo-cpu-0", "cpu*", "idle", "2", "cpu"]


def _char_devices(directory, numbers) -> str:
    """GPU-like character devices (major 195, as /dev/nvidiaN) with the host's
    ``numbers``, as the device plugin hands them to a pod; returns the path prefix."""
    directory.mkdir()
    for i in numbers:
        os.mknod(directory / f"nvidia{i}", 0o600 | stat.S_IFCHR, os.makedev(195, i))
    return str(directory / "nvidia")


def test_a_lent_node_joins_its_partition_by_feature_with_its_gpus(doc, keys, tmp_path):
    cluster = load_cluster(doc)  # the example's gpu partition accepts lent nodes
    files = config_files(cluster)
    # A Kubernetes node's name, with a dot, as cloud providers name them.
    node = lent_node(
        "demo", "gpu-node-7.example", {"cpu": "2", "memory": "1Gi", "nvidia.com/gpu": "4"},
        {"nvidia.com/gpu.product": "NVIDIA-H100-80GB"}, "gpu",
    )
    # The pod was given GPUs 1, 3, 4 and 6 of its host: the entrypoint fills
    # them in (sk_ranges), and Slurm numbers them 0-3 for the jobs, as CUDA
    # numbers the devices the pod sees.
    prefix = _char_devices(tmp_path / "dev", (1, 3, 4, 6))
    gres = node.gres_conf.replace(GPU_FILES, f"{prefix}[1,3-4,6]")
    local = tmp_path / "lent-conf"
    local.mkdir()
    for name, text in {**files, "gres.conf": gres}.items():
        (local / name).write_text(text)
    outs = [tmp_path / f"job{i}.out" for i in range(2)]
    with SlurmNamespace(files, keys, tmp_path / "slurm") as ns:
        ns.start_local_node(node.name, node.conf, local)
        info = ns.run(["sinfo", "-h", "-N", "-n", node.name, "-o", "%N %P %f %G"]).stdout.split()
        for out in outs:  # both at once: each holds two GPUs until both have started
            ns.run(["sbatch", "-p", "gpu", f"--gpus={node.gpu_type}:2", "-o", str(out), "--wrap",
                    f"echo CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES; touch {out}.started; "
                    f"for _ in $(seq 50); do [ $(ls {tmp_path}/*.started | wc -l) -ge 2 ] && break; sleep 0.1; done"])
        for _ in range(150):  # wait for the jobs to finish (bounded)
            if not ns.run(["squeue", "-h"]).stdout.strip() and all(o.exists() for o in outs):
                break
            time.sleep(0.2)
        log = ns.log()
    assert info == [node.name, "gpu", "lent_gpu", f"gpu:{node.gpu_type}:4"]
    seen = sorted(o.read_text().split()[0] for o in outs)
    assert seen == ["CUDA_VISIBLE_DEVICES=0,1", "CUDA_VISIBLE_DEVICES=2,3"], log[-2000:]
