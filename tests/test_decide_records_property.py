"""Random worlds (hypothesis) in which held nodes' records are spoilt, as
anyone with patch on a Node can spoil them (issue 41): whatever else the
world holds, such a node is Kubernetes' again within the reclaim deadline,
decided as the loop decides (the policy and every holder
:func:`~slurmk8s.bridge.decide.orphaned_policies` yields)."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import timedelta

from hypothesis import given
from hypothesis import strategies as st

from slurmk8s.api.lending import NodeLendingPolicy
from slurmk8s.bridge import actions as A
from slurmk8s.bridge.decide import DEFAULT_RECLAIM, decide, orphaned_policies
from slurmk8s.bridge.nodestate import (
    COMPONENT_LABEL,
    LENT,
    POLICY_ANNOTATION,
    SINCE_ANNOTATION,
    SLURMD_COMPONENT,
    STATE_LABEL,
    STATES,
    TAINT_EFFECT,
    TAINT_KEY,
    format_time,
)
from slurmk8s.bridge.observed import KubePod, NodeTaint, Unattributed
from slurmk8s.render.names import lent_slurmd
from slurmk8s.slurm.model import SlurmState

from .lending_sim import GPU_LABELS, T0, World, gpu_node, job, slurm_node
from .reach import reached, reaches
from .test_decide_property import SETTINGS, reclaim_of, worlds

#: What makes a held node's record unreadable: each kind, and the values it may write.
SPOILS = ("no-policy", "policy", "no-cluster", "cluster", "state", "no-label", "no-taint", "since")
BAD_KEYS = ["lend", "hpc/", "/lend", "HPC/lend", "hpc/lend/x", "hpc/le nd", " hpc/lend", "\u00b2", ""]


@st.composite
def spoiled(draw, node, policy_only=False):
    """``node``, held, with its record spoiled as anyone with patch on a Node
    can: the policy or SlurmCluster annotation gone or no <namespace>/<name>,
    a state label this version does not know, only the label or only the taint,
    a lending time far ahead or unreadable.
    ``policy_only``: the policy annotation, and the SlurmCluster's left as it is."""
    kinds = draw(st.lists(st.sampled_from(SPOILS), min_size=1, max_size=3, unique=True))
    if policy_only:
        kinds = [k for k in kinds if "cluster" not in k] + [draw(st.sampled_from(["no-policy", "policy"]))]
    labels, annotations = dict(node.labels), dict(node.annotations)
    taints = node.taints or (NodeTaint(TAINT_KEY, "demo", TAINT_EFFECT),)
    labels.setdefault(STATE_LABEL, LENT)
    annotations.setdefault(POLICY_ANNOTATION, "hpc/lend")
    annotations.setdefault("slurmk8s.dev/lending-cluster", "hpc/demo")
    annotations.setdefault(SINCE_ANNOTATION, format_time(T0 - timedelta(hours=1)))
    if "no-policy" in kinds:
        del annotations[POLICY_ANNOTATION]
    elif "policy" in kinds:
        annotations[POLICY_ANNOTATION] = draw(st.sampled_from(BAD_KEYS))
    if "no-cluster" in kinds:
        del annotations["slurmk8s.dev/lending-cluster"]
    elif "cluster" in kinds:
        annotations["slurmk8s.dev/lending-cluster"] = draw(st.sampled_from([k.replace("lend", "demo") for k in BAD_KEYS]))
    if "state" in kinds:
        labels[STATE_LABEL] = draw(st.sampled_from(["borrowed", "LENT", "lent ", "x" * 63]))
    if "since" in kinds:  # a time that would hold the reclaim for ever (decision record 45)
        annotations[SINCE_ANNOTATION] = draw(st.sampled_from(["9999-12-31T23:59:59Z", "2999-01-01T00:00:00Z", "x"]))
    if "no-label" in kinds:
        del labels[STATE_LABEL]
    elif "no-taint" in kinds:
        taints = ()
    return replace(node, labels=labels, annotations=annotations, taints=taints)


def held_by_label_or_taint(node) -> bool:
    return STATE_LABEL in node.labels or any(t.key == TAINT_KEY for t in node.taints)


_KEY = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


def attributed(node) -> bool:
    """The record names a policy and a SlurmCluster as <namespace>/<name>."""
    return all(_KEY.fullmatch(node.annotations.get(k) or "")
               for k in (POLICY_ANNOTATION, "slurmk8s.dev/lending-cluster"))


def decide_as_the_loop(w: World, pol, t) -> list:
    """One round as the loop has it: the policy (when it exists) and every
    holder :func:`orphaned_policies` yields, each with the SlurmCluster it
    names observed (only hpc/demo exists)."""
    existing = [pol.key] if isinstance(pol, NodeLendingPolicy) else []
    acts = w.decide(pol, t) if existing else []
    w.apply(acts)
    for holder in orphaned_policies(w.nodes.values(), existing):
        observed = w.observed()
        if holder.cluster != "hpc/demo":
            observed = replace(observed, cluster=None, slurm=SlurmState.unknown(), unreadable=None)
        now = decide(observed, holder, t)
        if isinstance(holder, Unattributed) and any(isinstance(a, A.DeleteSlurmdPod) for a in now):
            reached("pod_deleted")
        if isinstance(holder, Unattributed) and holder.cluster and observed.slurm.known \
                and any(isinstance(a, (A.Drain, A.Signal, A.Requeue, A.DeleteNode)) for a in now):
            reached("slurm_asked")  # the SlurmCluster its record names can be read: its Slurm is asked
        w.apply(now)
        acts += now
    return acts


@reaches(unattributed=0.7, pod_deleted=0.3, slurm_asked=0.12)
@SETTINGS
@given(worlds(), st.data(), st.integers(0, 3))
def test_a_held_node_whose_record_cannot_be_read_is_back_within_grace_plus_deadline(case, data, lie):
    """Issue 41: a node with the lending label (any value) or the lent taint
    whose record names no policy or SlurmCluster as <namespace>/<name>, or
    whose state label this version does not know, is no node's for ever:
    whatever else the world holds and whatever Slurm does, it is
    Kubernetes' again (unlabelled, untainted, its lent slurmd pod deleted)
    within gracePeriodSeconds + deadlineSeconds (and a round). Built to
    reach the case: n0 is always held and spoiled, others now and then."""
    w, pol, now = case
    if "n0" not in w.nodes or not held_by_label_or_taint(w.nodes["n0"]):
        w.nodes["n0"] = gpu_node("n0", labels=dict(w.nodes["n0"].labels if "n0" in w.nodes else GPU_LABELS))
        w.pods[("hpc", lent_slurmd("demo", "n0"))] = KubePod("hpc", lent_slurmd("demo", "n0"), node="n0",
                                                             phase="Running", gpus=8,
                                                             labels={COMPONENT_LABEL: SLURMD_COMPONENT})
    if data.draw(st.booleans(), label="a job on n0"):
        w.jobs[99] = job(99, "n0")
        w.snodes.setdefault("n0", slurm_node("n0", state="mixed"))
    for name in sorted(w.nodes):
        if name == "n0" or (held_by_label_or_taint(w.nodes[name]) and data.draw(st.integers(0, 2)) == 0):
            w.nodes[name] = data.draw(spoiled(w.nodes[name], policy_only=name == "n0" and data.draw(st.booleans())),
                                      label=f"spoiled {name}")
    unread = {n.name for n in w.nodes.values()
              if held_by_label_or_taint(n) and (not attributed(n) or n.labels.get(STATE_LABEL) not in STATES)}
    if any(not attributed(w.nodes[n]) for n in unread):
        reached("unattributed")
    spec = reclaim_of(pol)
    longest = max(spec.grace_period_seconds + spec.deadline_seconds,
                  DEFAULT_RECLAIM.grace_period_seconds + DEFAULT_RECLAIM.deadline_seconds)
    end = now + timedelta(seconds=longest + 30)
    t, back = now, set()
    while t <= end and unread - back:
        decide_as_the_loop(w, pol, t)
        for name in unread - back:
            if not held_by_label_or_taint(w.nodes[name]):
                back.add(name)
                pod = w.pods.get(("hpc", lent_slurmd("demo", name)))
                assert pod is None or pod.deleting, (name, pod, w.summary())
        w.lying_step(lie)
        t += timedelta(seconds=30)
    still = sorted(unread - back)
    assert still == [], (still, w.summary())
