"""How a lent Kubernetes node describes itself to Slurm (slurmk8s.render.lent)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmk8s.render import names
from slurmk8s.render.config import GPU_FILES
from slurmk8s.render.lent import DEFAULT_GPU_TYPE, GPU_PRODUCT_LABEL, UnlendableNode, lent_node
from slurmk8s.slurm.hostlist import expand

from .reach import reached, reaches

ALLOCATABLE = {"cpu": "95500m", "memory": "1031880Mi", "nvidia.com/gpu": "8", "pods": "110"}
LABELS = {GPU_PRODUCT_LABEL: "NVIDIA-H100-80GB-HBM3"}


def test_a_gpu_node_becomes_a_slurmd_conf_and_a_one_line_gres_conf():
    node = lent_node("demo", "ip-10-0-3-7.ec2.internal", ALLOCATABLE, LABELS, "gpu")
    assert (node.cpus, node.memory_mib, node.gpus) == (95, 1031880, 8)  # whole CPUs only
    assert node.gpu_type == LABELS[GPU_PRODUCT_LABEL]
    feature = names.lent_nodeset("gpu")
    assert node.conf == f"CPUs=95 RealMemory=1031880 Gres=gpu:{node.gpu_type}:8 Feature={feature}"
    lines = [x for x in node.gres_conf.splitlines() if x and not x.startswith("#")]
    # Its devices are the device plugin's choice: the entrypoint fills them in.
    assert lines == [f"Name=gpu Type={node.gpu_type} File={GPU_FILES}"]


def test_one_gpu_and_no_product_label():
    node = lent_node("demo", "n1", {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"}, {}, "gpu")
    assert node.gpu_type == DEFAULT_GPU_TYPE
    assert f"Type=gpu File={GPU_FILES}\n" in node.gres_conf
    assert node.memory_mib == 16 * 1024


@pytest.mark.parametrize("label", ["", "a" * 65, "-leading-dash"])
def test_an_unusable_product_label_falls_back_to_gpu(label):
    node = lent_node("demo", "n1", ALLOCATABLE, {GPU_PRODUCT_LABEL: label}, "gpu")
    assert node.gpu_type == DEFAULT_GPU_TYPE


@pytest.mark.parametrize("node,allocatable,partition,reason", [
    ("n 1", ALLOCATABLE, "gpu", "cannot be a Slurm node name"),
    ("n1;reboot", ALLOCATABLE, "gpu", "cannot be a Slurm node name"),
    ("n" * 129, ALLOCATABLE, "gpu", "cannot be a Slurm node name"),
    ("n1", ALLOCATABLE, "gpu Nodes=ALL", "not a Slurm partition name"),
    ("n1", ALLOCATABLE, "gpu\nProlog=/x", "not a Slurm partition name"),
    ("n1", {**ALLOCATABLE, "cpu": "500m"}, "gpu", "less than one whole unit"),
    ("n1", {**ALLOCATABLE, "memory": "512Ki"}, "gpu", "less than one whole unit"),
    ("n1", {**ALLOCATABLE, "memory": "lots"}, "gpu", "not a quantity"),
    ("n1", {**ALLOCATABLE, "cpu": "1e999"}, "gpu", "less than one whole unit"),
    ("n1", {**ALLOCATABLE, "nvidia.com/gpu": "0"}, "gpu", "less than one whole unit"),
    ("n1", {**ALLOCATABLE, "nvidia.com/gpu": "65"}, "gpu", "at most 64"),
    ("n1", {"cpu": "4", "memory": "1Gi"}, "gpu", "no allocatable nvidia.com/gpu"),
])
def test_what_cannot_be_described_safely_is_refused(node, allocatable, partition, reason):
    with pytest.raises(UnlendableNode, match=reason):
        lent_node("demo", node, allocatable, {}, partition)


@st.composite
def _reported(draw, good: list[str]) -> str:
    """What a node may report: mostly a good value, else one with a character put in, or any text."""
    value = draw(st.sampled_from(good))
    how = draw(st.sampled_from(["as is", "as is", "as is", "edited", "any"]))
    if how == "edited":
        at = draw(st.integers(0, len(value)))
        return value[:at] + draw(st.characters()) + value[at:]
    return draw(st.text(max_size=40)) if how == "any" else value


@reaches(described=0.15, refused=0.2)
@given(cpu=_reported(["8", "32", "7500m", "1k"]), memory=_reported(["256Gi", "64G", "1000Mi", "5e9"]),
       gpus=_reported(["8", "4", "1"]), product=_reported(["NVIDIA-H100-80GB", "A100", "gpu.x_1"]))
def test_nothing_unsafe_reaches_the_command_line(cpu, memory, gpus, product):
    """Whatever a node reports, the --conf value is four plain Key=Value words."""
    try:
        node = lent_node("demo", "n1", {"cpu": cpu, "memory": memory, "nvidia.com/gpu": gpus},
                         {GPU_PRODUCT_LABEL: product}, "gpu")
    except UnlendableNode:
        reached("refused")
        return
    reached("described")
    words = node.conf.split(" ")
    assert [w.split("=", 1)[0] for w in words] == ["CPUs", "RealMemory", "Gres", "Feature"]
    assert all(c.isalnum() or c in "=:_.-" for c in node.conf.replace(" ", ""))


def test_the_lent_slurmd_pod_is_pinned_tolerates_the_taint_and_shares_the_storage():
    import kubernetes_validate
    import yaml

    from slurmk8s.api import load_cluster
    from slurmk8s.bridge.nodestate import COMPONENT_LABEL, SLURMD_COMPONENT, TAINT_KEY
    from slurmk8s.render import names
    from slurmk8s.render.manifests import lent_slurmd_pod

    root = Path(__file__).resolve().parents[1]
    cluster = load_cluster(yaml.safe_load((root / "examples" / "slurmcluster.yaml").read_text()))
    node = lent_node(cluster.name, "gpu-node-7", ALLOCATABLE, LABELS, "gpu")
    pod = lent_slurmd_pod(cluster, "abc", node="gpu-node-7", resources=ALLOCATABLE, labels=LABELS,
                          partition="gpu", shm_size="1Gi", taint_key=TAINT_KEY)
    kubernetes_validate.validate(pod, kubernetes_validate.latest_version(), strict=True)
    spec = pod["spec"]
    assert spec["nodeName"] == "gpu-node-7"
    assert {t["key"] for t in spec["tolerations"]} == {TAINT_KEY}
    (container,) = spec["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["SLURMK8S_NODE_NAME"] == "gpu-node-7" and env["SLURMK8S_NODE_CONF"] == node.conf
    assert env["SLURMK8S_GRES_CONF"] == node.gres_conf and env["SLURMK8S_GPU_COUNT"] == "8"
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "8", "memory": f"{node.memory_mib}Mi",
                                                "cpu": str(node.cpus)}
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    storage = cluster.spec.shared_storage
    assert "/etc/slurm" in mounts and {v.mount_path for v in storage.volumes} <= mounts
    # Named and labelled as the bridge looks for it.
    assert pod["metadata"]["name"] == names.lent_slurmd(cluster, "gpu-node-7") == "demo-lent.gpu-node-7"
    assert pod["metadata"]["labels"][COMPONENT_LABEL] == SLURMD_COMPONENT
    assert pod["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "slurmk8s-bridge"


REPO = Path(__file__).resolve().parents[1]
LIB = REPO / "images" / "common" / "slurmk8s-lib.sh"


def test_the_slurmd_entrypoint_fills_in_the_placeholder_the_renderer_writes():
    entrypoint = (REPO / "images" / "slurmd" / "entrypoint.sh").read_text()
    assert f"//{GPU_FILES}/$gpu_files}}" in entrypoint
    assert 'gpu_files=/dev/nvidia$(sk_ranges "${gpus[@]}")' in entrypoint


@given(st.sets(st.integers(0, 63), min_size=1, max_size=16))
def test_sk_ranges_writes_the_devices_a_pod_has_as_a_hostlist_slurm_expands_back(numbers):
    ordered = sorted(numbers)
    out = subprocess.run(["bash", "-c", f'. "{LIB}"; sk_ranges "$@"', "sk_ranges", *map(str, ordered)],
                         capture_output=True, text=True, check=True).stdout
    assert expand(f"/dev/nvidia{out}") == [f"/dev/nvidia{n}" for n in ordered]

