"""What the lending decision remembers between calls changes none of its answers."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmk8s.bridge import actions as A
from slurmk8s.bridge.memo import changed_spans, forget, respliced
from slurmk8s.bridge.world import PodIndex, _slurm_index
from slurmk8s.render import names
from slurmk8s.slurm.model import Job, Node, SlurmState

from .lending_sim import cluster, gpu_pod
from .reach import reached, reaches
from .test_decide_property import worlds


def _node(name: str) -> Node:
    return Node(name, "allocated", frozenset(), "", (), ("gpu",), 8, 8, "", name)


def test_the_same_slurm_state_gives_the_same_index_and_another_one_a_new_one():
    job = Job(7, "train", "u", "RUNNING", "gpu", "n[1-2]", True, 0, "")
    state = SlurmState((_node("n1"), _node("n2")), (job,))
    index = _slurm_index(state)
    assert _slurm_index(state) is index
    assert index.known and index.nodes == state.nodes_by_name and index.jobs["n2"] == [job]
    again = SlurmState(state.nodes, state.jobs)  # read anew: equal, but not the same
    assert _slurm_index(again) is not index and _slurm_index(again).jobs == index.jobs
    for unread in (SlurmState.unknown(), SlurmState(state.nodes, None), SlurmState.nodes_only(state.nodes)):
        assert not unread.known and not _slurm_index(unread).known  # fail closed
    assert SlurmState.unknown().node("n1") is None and state.node("n1") == _node("n1")
    assert SlurmState.nodes_only(state.nodes).with_jobs([job]) == state


class Obj:
    """A distinct object (compared by identity, as the memo compares)."""


def test_changed_spans_finds_objects_replaced_in_place():
    old = [Obj() for _ in range(10)]
    new = list(old)
    new[2], new[7] = Obj(), Obj()
    assert changed_spans(old, new, limit=5) == [(2, 3, 3), (7, 8, 8)]
    assert changed_spans(old, old, limit=0) == []
    assert changed_spans(old, new, limit=1) is None


def test_changed_spans_finds_one_stretch_removed_or_inserted():
    old = [Obj() for _ in range(10)]
    assert changed_spans(old, old[:4] + old[6:], limit=5) == [(4, 6, 4)]
    added = [Obj(), Obj()]
    assert changed_spans(old, old[:3] + added + old[3:], limit=5) == [(3, 3, 5)]
    assert changed_spans(old, old + added, limit=5) == [(10, 10, 12)]
    assert changed_spans(old, old[1:], limit=5) == [(0, 1, 0)]
    # Two stretches apart: everything between them counts.
    assert changed_spans(old, old[1:5] + old[6:], limit=10) == [(0, 6, 4)]
    assert changed_spans(old, old[1:8] + old[9:], limit=10) is None


@given(st.lists(st.sampled_from(["keep", "replace", "drop", "insert"]), min_size=0, max_size=30), st.integers(0, 99))
def test_respliced_values_are_the_values_of_the_new_sequence(edits, seed):
    rng = random.Random(seed)
    old = [Obj() for _ in range(20)]
    new = list(old)
    for edit in edits:
        i = rng.randrange(len(new) + 1)
        if edit == "replace" and i < len(new):
            new[i] = Obj()
        elif edit == "drop" and i < len(new):
            del new[i]
        elif edit == "insert":
            new.insert(i, Obj())
    spans = changed_spans(old, new, limit=100)
    assert spans is not None
    assert respliced([id(x) for x in old], spans, new, id) == [id(x) for x in new]


def _index(index: PodIndex) -> tuple:
    """What an index says, whatever zeros it keeps."""
    return ({k: v for k, v in index.gpu_pods.items() if v}, {k: v for k, v in index.used_gpus.items() if v},
            index.slurmd_pods,
            sorted((p.namespace, p.name) for p in index.pending.values()), index.busy,
            {k: v for k, v in index.cluster_pods.items() if v})


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["replace", "drop", "insert", "append"]), st.integers(0, 40),
                          st.sampled_from(["Running", "Pending", "Succeeded"]), st.sampled_from([None, "n1", "n2"]),
                          st.booleans()), max_size=12))
def test_a_pod_index_updated_by_the_difference_is_the_index_built_afresh(edits):
    pods = [gpu_pod(f"p{i}", node=["n1", "n2", None][i % 3], gpus=1 + i % 2) for i in range(24)]
    pods[5] = replace(pods[5], labels={"app.kubernetes.io/component": "lent-slurmd"})
    for i in (7, 8, 10):  # pods of a SlurmCluster, as the operator labels them (ownpods.py)
        pods[i] = replace(pods[i], namespace="hpc", labels=names.labels(cluster(), "worker"))
    old, index = tuple(pods), PodIndex.of(pods)
    for k, (edit, i, phase, node, flag) in enumerate(edits):
        new = list(old)
        i %= len(new) + 1
        pod = gpu_pod(f"q{k}", node=node, phase=phase, unschedulable=flag, deleting=not flag and phase == "Pending")
        if edit == "replace" and i < len(new):
            new[i] = replace(new[i], phase=phase, node=node, deleting=flag)
        elif edit == "drop" and i < len(new):
            del new[i]
        elif edit == "insert":
            new.insert(i, pod)
        else:
            new.append(pod)
        new_t = tuple(new)
        updated = index.updated(old, new_t)
        assert updated is not None
        assert _index(updated) == _index(PodIndex.of(new_t))
        old, index = new_t, updated


@reaches(moves=0.45)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(worlds(), worlds(lendable=True)))
def test_deciding_with_what_is_remembered_equals_deciding_from_scratch(case):
    """Round after round of a moving world (whose unchanged objects carry
    over, as a watch cache keeps them), decide gives what it gives with
    nothing remembered."""
    w, pol, now = case
    forget()
    for _ in range(8):
        remembered = w.decide(pol, now)
        forget()
        assert w.decide(pol, now) == remembered, w.summary()
        if any(not isinstance(a, (A.Event, A.PolicyStatus)) for a in remembered):
            reached("moves")  # the world changes under what decide remembers
        w.apply(remembered)
        w.step()
        now += timedelta(seconds=30)
