"""The pure pieces around the lending decision: host lists, windows, Node
patches, the Node record and the Kubernetes JSON parsers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmk8s.api.lending import LendingWindow
from slurmk8s.bridge import actions as A
from slurmk8s.bridge.nodestate import (
    FORCED_ANNOTATION,
    IDLE_SINCE_ANNOTATION,
    JOBS_ANNOTATION,
    LENDING,
    LENDING_ANNOTATIONS,
    POLICY_ANNOTATION,
    REASON_ANNOTATION,
    RECLAIMING,
    SIGNALLED_ANNOTATION,
    SINCE_ANNOTATION,
    STATE_LABEL,
    TAINT_KEY,
    LendingRecord,
    format_time,
    parse_time,
)
from slurmk8s.bridge.observed import KubeNode, NodeTaint, node_from_api, pod_from_api
from slurmk8s.bridge.patches import node_patch
from slurmk8s.bridge.windows import in_window
from slurmk8s.slurm.hostlist import HostlistError, expand

from .lending_sim import T0, patched

# -- host lists -------------------------------------------------------------------------------


@pytest.mark.parametrize("text,names", [
    ("", []),
    ("n1", ["n1"]),
    ("n1,n2", ["n1", "n2"]),
    ("gpu-[01-03,7],cpu0", ["gpu-01", "gpu-02", "gpu-03", "gpu-7", "cpu0"]),
    ("n[8-11]", ["n8", "n9", "n10", "n11"]),
    ("ip-10-0-[1-2].ec2.internal", ["ip-10-0-1.ec2.internal", "ip-10-0-2.ec2.internal"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
])
def test_host_lists_expand_like_slurm(text, names):
    assert expand(text) == names


@pytest.mark.parametrize("text", ["n[1-", "n1]", "n[a-b]", "n[3-1]", "n[[1]]", "n[0-99999999]"])
def test_malformed_host_lists_are_refused(text):
    with pytest.raises(HostlistError):
        expand(text)


@given(st.lists(st.integers(0, 300), min_size=1, max_size=20, unique=True), st.sampled_from([1, 3]))
def test_a_compressed_range_expands_to_its_numbers(numbers, width):
    numbers.sort()
    body = ",".join(str(n).zfill(width) for n in numbers)
    assert expand(f"gpu-[{body}]") == [f"gpu-{n:0{width}d}" for n in numbers]


# -- windows ------------------------------------------------------------------------------------


def w(start, end, days=None, tz="UTC"):
    spec = {"start": start, "end": end}
    if days:
        spec["days"] = days
    return LendingWindow.model_validate(spec)


MONDAY = datetime(2025, 3, 3, tzinfo=UTC)


@pytest.mark.parametrize("windows,when,inside", [
    ([], MONDAY, True),
    ([w("08:00", "18:00")], MONDAY.replace(hour=8), True),
    ([w("08:00", "18:00")], MONDAY.replace(hour=18), False),   # the end is not inside
    ([w("08:00", "18:00")], MONDAY.replace(hour=7, minute=59), False),
    ([w("00:00", "24:00", ["Sat", "Sun"])], MONDAY, False),
    ([w("00:00", "24:00", ["Sat", "Sun"])], MONDAY - timedelta(minutes=1), True),   # Sunday 23:59
    ([w("22:00", "06:00", ["Fri"])], MONDAY - timedelta(days=1, hours=19), True),   # Saturday 05:00
    ([w("22:00", "06:00", ["Fri"])], MONDAY - timedelta(hours=19), False),          # Sunday 05:00
    ([w("22:00", "06:00", ["Fri"])], MONDAY - timedelta(days=2, hours=19), False),  # Friday 05:00
    ([w("22:00", "06:00", ["Sun"])], MONDAY.replace(hour=5, minute=59), True),      # Monday morning
    ([w("08:00", "09:00"), w("12:00", "13:00")], MONDAY.replace(hour=12, minute=30), True),
])
def test_lending_windows(windows, when, inside):
    assert in_window(windows, "UTC", when) is inside


def test_windows_follow_the_time_zone_through_daylight_saving():
    window = [w("09:00", "17:00")]
    winter = datetime(2025, 1, 6, 8, 30, tzinfo=UTC)   # 09:30 in Berlin (UTC+1)
    summer = datetime(2025, 7, 7, 7, 30, tzinfo=UTC)   # 09:30 in Berlin (UTC+2)
    assert in_window(window, "Europe/Berlin", winter) and in_window(window, "Europe/Berlin", summer)
    assert not in_window(window, "UTC", summer)


# -- the Node record and its patches ----------------------------------------------------------


def test_times_round_trip_through_annotations():
    t = datetime(2025, 3, 3, 12, 0, 7, 999, tzinfo=UTC)
    assert format_time(t) == "2025-03-03T12:00:07Z"
    assert parse_time(format_time(t)) == t.replace(microsecond=0)
    assert parse_time("yesterday") is None and parse_time(None) is None
    assert parse_time("2025-03-03T12:00:07").tzinfo is not None


def test_a_node_without_our_marks_serves_kubernetes():
    rec = LendingRecord.read({"a": "b"}, {}, ())
    assert rec.state is None and rec.taint is None and rec.policy is None


def test_the_whole_state_machine_is_written_and_cleared_by_patches():
    node = KubeNode("n1", labels={"keep": "me"}, annotations={"other/ann": "x"},
                    taints=(NodeTaint("nvidia.com/gpu", "", "NoSchedule"),))
    steps = [
        A.RecordIdleSince("n1", T0),
        A.SetLendingState("n1", LENDING, "hpc/lend", "hpc/demo", "gpu", T0),
        A.Taint("n1", TAINT_KEY, "demo", "NoSchedule"),
        A.SetLendingState("n1", RECLAIMING, "hpc/lend", "hpc/demo", "gpu", T0, reason="demand"),
        A.RecordSignalled("n1", T0, (7, 8)),
        A.RecordForced("n1", T0),
    ]
    for action in steps:
        node = patched(node, node_patch(action, node))
    rec = node.record
    assert (rec.state, rec.policy, rec.cluster, rec.partition, rec.reason) == (
        RECLAIMING, "hpc/lend", "hpc/demo", "gpu", "demand")
    assert rec.since == rec.signalled == rec.forced == T0 and rec.taint == "demo"
    assert rec.signalled_jobs == (7, 8)
    assert rec.idle_since is None   # lending dropped it
    for action in (A.Untaint("n1", TAINT_KEY), A.ClearLending("n1")):
        node = patched(node, node_patch(action, node))
    assert node.labels == {"keep": "me"} and node.annotations == {"other/ann": "x"}
    assert node.taints == (NodeTaint("nvidia.com/gpu", "", "NoSchedule"),)


def test_entering_a_state_clears_the_bookkeeping_of_the_last_one():
    patch = node_patch(A.SetLendingState("n1", RECLAIMING, "p", "c", "gpu", T0, reason="window"), KubeNode("n1"))
    ann = patch["metadata"]["annotations"]
    assert ann[REASON_ANNOTATION] == "window"
    assert ann[SIGNALLED_ANNOTATION] is None and ann[FORCED_ANNOTATION] is None and ann[JOBS_ANNOTATION] is None
    assert ann[POLICY_ANNOTATION] == "p" and ann[SINCE_ANNOTATION] == format_time(T0)
    assert patch["metadata"]["labels"] == {STATE_LABEL: RECLAIMING}
    clear = node_patch(A.ClearLending("n1"), KubeNode("n1"))["metadata"]["annotations"]
    assert set(clear) == set(LENDING_ANNOTATIONS) and IDLE_SINCE_ANNOTATION in clear


def test_patching_a_node_with_another_action_is_an_error():
    with pytest.raises(TypeError):
        node_patch(A.DeleteNode("n1"), KubeNode("n1"))


# -- Kubernetes JSON --------------------------------------------------------------------------

NODE_JSON = {
    "metadata": {"name": "gpu-7", "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                 "annotations": {IDLE_SINCE_ANNOTATION: "2025-03-03T11:00:00Z"}},
    "spec": {"unschedulable": True,
             "taints": [{"key": TAINT_KEY, "value": "demo", "effect": "NoSchedule"},
                        {"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
    "status": {"allocatable": {"cpu": "95500m", "memory": "1031880Mi", "nvidia.com/gpu": "8"},
               "conditions": [{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": "True"}]},
}

POD_JSON = {
    "metadata": {"name": "infer-0", "namespace": "serving", "labels": {"team": "inference"},
                 "ownerReferences": [{"kind": "StatefulSet", "name": "infer", "controller": True}]},
    "spec": {"priority": 1000, "nodeSelector": {"pool": "h100"},
             "initContainers": [{"name": "warm", "resources": {"limits": {"nvidia.com/gpu": "2"}}}],
             "containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "4"}}},
                            {"name": "b", "resources": {"requests": {"nvidia.com/gpu": "1"},
                                                        "limits": {"nvidia.com/gpu": "1"}}},
                            {"name": "c"}]},
    "status": {"phase": "Pending",
               "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]},
}


def test_a_node_is_read_from_the_kubernetes_api():
    node = node_from_api(NODE_JSON)
    assert node.name == "gpu-7" and node.ready and node.unschedulable and node.gpus == 8
    assert node.record.taint == "demo" and node.record.idle_since == datetime(2025, 3, 3, 11, tzinfo=UTC)
    assert node.allocatable["cpu"] == "95500m"


def test_a_pod_is_read_from_the_kubernetes_api():
    pod = pod_from_api(POD_JSON)
    assert (pod.namespace, pod.name, pod.node, pod.phase) == ("serving", "infer-0", None, "Pending")
    assert pod.gpus == 5 and pod.priority == 1000 and pod.unschedulable
    assert pod.owner_kind == "StatefulSet" and not pod.deleting
    assert pod.node_selector == {"pool": "h100"} and pod.labels == {"team": "inference"}


def test_a_bound_pod_and_a_bare_node():
    pod = pod_from_api({"metadata": {"name": "p", "deletionTimestamp": "2025-03-03T12:00:00Z"},
                        "spec": {"nodeName": "gpu-7", "containers": [{"name": "x"}]},
                        "status": {"phase": "Running"}})
    assert pod.node == "gpu-7" and pod.deleting and pod.gpus == 0 and not pod.unschedulable
    node = node_from_api({"metadata": {"name": "cpu-1"}})
    assert not node.ready and node.gpus == 0 and node.record.state is None
