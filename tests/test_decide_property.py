"""Random worlds (hypothesis): the lending decision keeps its safety rules,
is idempotent, and a bridge killed in the middle of a round converges to the
same end state as one that was not.

Over 500 lines because every property here draws from the same random worlds
(the strategies and the round-by-round drivers at the top), and each one
states its reached share beside it.
"""

from __future__ import annotations

from datetime import timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmk8s.api.lending import LENDABLE_TO_LABEL, NodeLendingPolicy
from slurmk8s.bridge import actions as A
from slurmk8s.bridge.decide import DEFAULT_RECLAIM
from slurmk8s.bridge.nodestate import (
    COMPONENT_LABEL,
    DOWN_OWED_ANNOTATION,
    DOWN_OWED_POLICY_ANNOTATION,
    FORCED_ANNOTATION,
    IDLE_SINCE_ANNOTATION,
    JOBS_ANNOTATION,
    LENDING,
    LENT,
    POLICY_ANNOTATION,
    RECLAIMING,
    SIGNALLED_ANNOTATION,
    SINCE_ANNOTATION,
    SLURMD_COMPONENT,
    STATE_LABEL,
    TAINT_EFFECT,
    TAINT_KEY,
    format_time,
)
from slurmk8s.bridge.observed import KubePod, NodeTaint, PolicyGone, UnreadableCluster
from slurmk8s.render import names
from slurmk8s.render.names import lent_slurmd
from slurmk8s.slurm.model import DRAIN_PREFIX

from .lending_sim import GPU_LABELS, T0, World, cluster, gpu_node, gpu_pod, job, policy, slurm_node
from .reach import reached, reaches

NAMES = [f"n{i}" for i in range(6)]
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def policies(draw, lendable=False):
    spec = {
        "idleAfterSeconds": draw(st.sampled_from([0, 60, 120])),
        "minKubernetesNodes": draw(st.sampled_from([0, 0, 1, 2] if lendable else [0, 0, 0, 1, 3])),
        "registrationTimeoutSeconds": draw(st.sampled_from([60, 600])),
    }
    if draw(st.integers(0, 3)) > 0 if lendable else draw(st.booleans()):
        spec["maxLentNodes"] = draw(st.integers(0, 2 if lendable else 4))
    if draw(st.integers(0, 3)) == 0:
        # T0 is Monday 12:00, and worlds are in its hour: 11:00-18:00 is open then.
        spec["windows"] = [{"start": draw(st.sampled_from(["11:00"] if lendable else ["08:00", "11:00", "13:00"])),
                            "end": draw(st.sampled_from(["18:00"] if lendable else ["12:30", "18:00", "02:00"]))}]
    reclaim = {"gracePeriodSeconds": draw(st.sampled_from([0, 30, 90])),
               "deadlineSeconds": draw(st.sampled_from([30, 300, 600])),
               "jobAction": draw(st.sampled_from(["requeue", "cancel"])),
               "signal": draw(st.sampled_from(["USR1", "TERM"]))}
    choice = draw(st.integers(0, 2))
    if choice == 1:
        reclaim["podSelector"] = {"matchLabels": {"team": "inference"}}
    elif choice == 2:
        reclaim["minPriority"] = 100
    return policy(reclaim=reclaim, **spec)


@st.composite
def worlds(draw, lendable=False):
    """A world, its policy and the time. ``lendable``: one where lending may happen (the
    policy and its SlurmCluster there, Slurm read, within a window, no pending GPU pod that
    could land on a free node), with free nodes idle long enough, and most of the rest as
    varied as in any world; random worlds lend in very few examples."""

    def one_in(n: int, then: int | None = None) -> bool:
        """True one time in ``n`` (in ``then`` when lendable and ``then`` is given)."""
        n = then if lendable and then is not None else n
        return n > 0 and draw(st.integers(1, n)) == 1

    pol = draw(policies(lendable))
    if one_in(8, 0):
        pol = PolicyGone("hpc", "lend", "hpc/demo")  # deleted: its nodes come back
    now = T0 + timedelta(seconds=draw(st.integers(0, 3600)))
    w = World()
    budgets: dict[tuple[str, str], tuple[str, str]] = {}
    node_names = NAMES[: draw(st.integers(2 if lendable else 1, len(NAMES)))]
    # When lendable, the first nodes are free to lend: selected, idle long enough, nothing on them.
    free = draw(st.integers(1, 3)) if lendable else 0
    for i, name in enumerate(node_names):
        if i < free:
            idle_after = pol.spec.idle_after_seconds
            w.nodes[name] = gpu_node(name, annotations={IDLE_SINCE_ANNOTATION: format_time(
                now - timedelta(seconds=idle_after + draw(st.integers(1, 300))))})
            continue
        state = draw(st.sampled_from([None, None, None, LENDING, LENT, RECLAIMING] if lendable else
                                     [None, None, LENDING, LENT, LENT, RECLAIMING, "bogus"]))
        labels = {"other": "x"} if one_in(6, 12) else dict(GPU_LABELS)
        if one_in(5, 3):
            # Selected, but its owner lends it to another namespace, or to none.
            labels = {k: v for k, v in labels.items() if k != LENDABLE_TO_LABEL}
            if draw(st.booleans()):
                labels[LENDABLE_TO_LABEL] = draw(st.sampled_from(["other", "hpc2", ""]))
        annotations = {}
        taints = ()
        if state is not None:
            labels[STATE_LABEL] = state
            other_policy = one_in(10)
            annotations = {
                POLICY_ANNOTATION: "hpc/other" if other_policy else pol.key,
                "slurmk8s.dev/lending-cluster": "hpc/demo",
                "slurmk8s.dev/lending-partition": "gpu",
                SINCE_ANNOTATION: format_time(now - timedelta(seconds=draw(st.integers(0, 900)))),
            }
            if state == RECLAIMING:
                annotations["slurmk8s.dev/reclaim-reason"] = draw(
                    st.sampled_from(["demand", "window", "slurmd-lost", "node-not-ready"]))
                if draw(st.booleans()):
                    annotations[SIGNALLED_ANNOTATION] = format_time(now - timedelta(seconds=draw(st.integers(0, 200))))
                if draw(st.booleans()):
                    annotations[FORCED_ANNOTATION] = format_time(now - timedelta(seconds=draw(st.integers(0, 60))))
            if not one_in(5):
                taints = (NodeTaint(TAINT_KEY, "demo", TAINT_EFFECT),)
        elif not one_in(2, 8):
            idle_after = pol.spec.idle_after_seconds if lendable and isinstance(pol, NodeLendingPolicy) else 0
            annotations[IDLE_SINCE_ANNOTATION] = format_time(
                now - timedelta(seconds=idle_after + draw(st.integers(1 if lendable else 0, 300))))
        if one_in(8, 16):
            # Taken back past a reclaim deadline: its Slurm node still to be set DOWN.
            annotations[DOWN_OWED_ANNOTATION] = draw(st.sampled_from(["hpc/demo", "hpc/other"]))
            annotations[DOWN_OWED_POLICY_ANNOTATION] = pol.key
        ready = not one_in(12, 24)
        not_ready_since = None
        if not ready and not one_in(4):
            not_ready_since = now - timedelta(seconds=draw(st.integers(0, 900)))
        node = gpu_node(name, labels=labels, annotations=annotations, taints=taints,
                        ready=ready, not_ready_since=not_ready_since, unschedulable=one_in(12, 24),
                        allocatable={"cpu": "32", "memory": "256Gi",
                                     "nvidia.com/gpu": str(draw(st.sampled_from([8, 8, 8, 4, 0] if lendable else
                                                                                [0, 4, 8, 8, 8])))})
        w.nodes[name] = node
        held_state = state in (LENDING, LENT, RECLAIMING)
        # A GPU pod (or a DaemonSet's) may run there.
        if one_in(4, 8):
            w.pods[("apps", f"app-{name}")] = gpu_pod(
                f"app-{name}", name, gpus=draw(st.sampled_from([1, 4, 8])),
                owner_kind=draw(st.sampled_from([None, "ReplicaSet", "DaemonSet"])))
        # The lent slurmd pod, in some phase: usually there on held nodes (lent by this
        # version: labelled with its node, which its disruption budget selects).
        if not one_in(6) if held_state else one_in(8, 16):
            pod_name = lent_slurmd("demo", name)
            labels = {COMPONENT_LABEL: SLURMD_COMPONENT}
            if not one_in(6):
                labels[names.LENT_NODE_LABEL] = names.lent_node_label(name)
            w.pods[("hpc", pod_name)] = KubePod(
                "hpc", pod_name, node=name,
                phase=draw(st.sampled_from(["Running", "Running", "Running", "Pending", "Failed"])),
                gpus=8, labels=labels, deleting=one_in(8))
            # Its disruption budget, there or not (none is observed in some worlds: below).
            if draw(st.booleans()):
                budgets[("hpc", names.lent_budget("demo", name))] = ("hpc", pod_name)
        # A tenant's pod that carries the lent slurmd label (issue 24, item 8).
        if one_in(8):
            w.pods[("tenant", f"forged-{name}")] = KubePod(
                "tenant", lent_slurmd("demo", name), node=draw(st.sampled_from([name, None])),
                phase=draw(st.sampled_from(["Running", "Pending"])), gpus=draw(st.sampled_from([0, 8])),
                unschedulable=True, labels={COMPONENT_LABEL: SLURMD_COMPONENT})
        # Its Slurm node, in some state: usually there on lent nodes.
        if not one_in(6) if state in (LENT, RECLAIMING) else \
                draw(st.booleans()) if state == LENDING else one_in(4, 16):
            flag = draw(st.sampled_from([None, None, None, "DRAIN", "NOT_RESPONDING", "COMPLETING"]))
            flags = {flag} if flag else set()
            reason = ""
            if "DRAIN" in flags:
                reason = draw(st.sampled_from([f"{DRAIN_PREFIX} reclaimed", "admin: bad GPU"]))
            w.snodes[name] = slurm_node(
                name, partition=draw(st.sampled_from(["gpu", "gpu", "gpu", "cpu"])),
                state=draw(st.sampled_from(["idle", "idle", "mixed", "allocated", "down", "unknown"])),
                flags=flags, reason=reason)
    # Jobs, some spanning nodes.
    for job_id in range(1, draw(st.integers(0, 5)) + 1):
        on = draw(st.lists(st.sampled_from(node_names), min_size=1, max_size=2, unique=True))
        w.jobs[job_id] = job(job_id, ",".join(sorted(on)),
                             state=draw(st.sampled_from(["RUNNING", "RUNNING", "COMPLETING", "PENDING"])),
                             requeue=not one_in(5))
    # Pending GPU pods (when lendable, only ones no node here can take).
    for i in range(draw(st.sampled_from([0, 0, 0, 1] if lendable else [0, 0, 1, 2, 3]))):
        w.pods[("apps", f"want-{i}")] = gpu_pod(
            f"want-{i}", None, gpus=draw(st.sampled_from([1, 4, 8])),
            priority=draw(st.sampled_from([0, 100])),
            labels={"team": draw(st.sampled_from(["inference", "research"]))},
            node_selector=draw(st.sampled_from([{"zone": "b"}] if lendable else
                                               [{}, {}, {"nvidia.com/gpu.product": "NVIDIA-H100-80GB"},
                                                {"zone": "b"}])))
    w.budgets = None if one_in(6) else budgets
    w.slurm_known = not one_in(6, 0)
    if one_in(10, 0):
        w.cluster = None
    elif one_in(10, 0):
        w.cluster = cluster(accept=False)
    return w, pol, now


def held(w: World, key: str) -> int:
    return sum(1 for n in w.nodes.values()
               if n.labels.get(STATE_LABEL) in (LENDING, LENT) and n.annotations.get(POLICY_ANNOTATION) == key)


def kube_selected(w: World) -> int:
    return sum(1 for n in w.nodes.values()
               if STATE_LABEL not in n.labels and n.gpus > 0 and n.labels.get("slurmk8s.dev/lendable") == "true"
               and n.labels.get(LENDABLE_TO_LABEL) == "hpc")


def reclaim_of(pol):
    return pol.spec.reclaim if isinstance(pol, NodeLendingPolicy) else DEFAULT_RECLAIM


def overdue(w: World, pol, now, node: str) -> bool:
    """Reclaiming for longer than gracePeriodSeconds + deadlineSeconds: the
    node goes back whatever Slurm says (issue 24, item 2)."""
    n = w.nodes[node]
    rec, spec = n.record, reclaim_of(pol)
    return (rec.state == RECLAIMING and rec.since is not None
            and now - rec.since >= timedelta(seconds=spec.grace_period_seconds + spec.deadline_seconds))


@reaches(suppressed=0.4)
@SETTINGS
@given(worlds())
def test_unknown_slurm_means_no_destructive_action(case):
    """Nothing that touches Slurm, nothing lent; the owner's claims may start
    a reclaim (the record only), and only a reclaim past its deadline hands
    a node back."""
    w, pol, now = case
    if w.cluster is None:
        w.cluster = cluster()
    known = w.copy()
    known.slurm_known = True
    if any(isinstance(a, (*A.DESTRUCTIVE_ACTIONS, A.CreateSlurmdPod)) for a in known.decide(pol, now)):
        reached("suppressed")  # what Slurm's answer would have led to
    w.slurm_known = False
    acts = w.decide(pol, now)
    for a in acts:
        if isinstance(a, A.SetLendingState):
            assert a.state == RECLAIMING and a.reason in ("withdrawn", "cordoned", "demand", "policy-gone",
                                                          "limits", "record-unreadable"), a
        elif isinstance(a, (A.DeleteSlurmdPod, A.Untaint, A.ClearLending, A.RecordDownOwed, A.DeleteBudget)):
            assert overdue(w, pol, now, a.node), (a, w.summary())
        else:
            assert not isinstance(a, (*A.DESTRUCTIVE_ACTIONS, A.CreateSlurmdPod, A.ClearDownOwed,
                                      A.CreateBudget)), a


@reaches(sets_down=0.03)  # 6-20% of examples, run to run
@SETTINGS
@given(worlds())
def test_a_node_is_set_down_only_when_its_slurmd_is_gone_or_it_is_lost(case):
    """A blip must not end a job: DOWN (which ends every job there) only for
    a node whose slurmd pod is gone or ended, one Kubernetes has reported not Ready for
    notReadyTimeoutSeconds while Slurm reports it NOT_RESPONDING, or one
    taken back past its reclaim deadline."""
    w, pol, now = case
    acts = w.decide(pol, now)
    timeout = reclaim_of(pol).not_ready_timeout_seconds
    for a in acts:
        if not isinstance(a, A.SetDown):
            continue
        reached("sets_down")
        node = w.nodes[a.node]
        entering = [x.reason for x in acts if isinstance(x, A.SetLendingState) and x.node == a.node]
        reason = entering[0] if entering else node.record.reason
        snode = w.snodes.get(a.node)
        lost = (not node.ready and node.not_ready_since is not None and snode is not None
                and "NOT_RESPONDING" in snode.flags and now - node.not_ready_since >= timedelta(seconds=timeout))
        cluster = pol.cluster if isinstance(pol, PolicyGone) else f"{pol.namespace}/{pol.spec.cluster_ref.name}"
        owed = node.record.down_owed == cluster or overdue(w, pol, now, a.node)
        pod = w.pods.get(("hpc", lent_slurmd("demo", a.node)))
        pod_gone = pod is None or pod.terminal
        assert reason == "slurmd-lost" or pod_gone or lost or owed, (a, reason, node)


@reaches(hands_back=0.1, busy=0.15)
@SETTINGS
@given(worlds())
def test_no_node_with_slurm_jobs_is_untainted_or_handed_back(case):
    """...before its reclaim deadline."""
    w, pol, now = case
    if w.cluster is None:
        return  # no cluster, no Slurm: nothing can run there (covered elsewhere)
    acts = w.decide(pol, now)
    if any(w.active_jobs(n.name) for n in w.nodes.values() if n.record.state in (LENDING, LENT, RECLAIMING)):
        reached("busy")
    for a in acts:
        if isinstance(a, (A.Untaint, A.ClearLending)) and not overdue(w, pol, now, a.node):
            reached("hands_back")
            assert w.slurm_known
            assert w.active_jobs(a.node) == [], (a, w.active_jobs(a.node))


@reaches(wanted=0.15)
@SETTINGS
@given(worlds(), st.integers(0, 3))
def test_no_node_stays_held_past_grace_plus_deadline_when_its_owner_wants_it_back(case, lie):
    """Whatever the borrower's Slurm does (answers, does not, or shows jobs
    that never end), a node its owner wants back (withdrawn, cordoned, the
    policy deleted, or in reclaim already) is Kubernetes' again within
    gracePeriodSeconds + deadlineSeconds (and a round) of the claim."""
    w, pol, now = case
    if w.cluster is None:
        return  # handed back at once (cluster-gone)
    mine = [n for n in w.nodes.values() if n.record.state in (LENDING, LENT, RECLAIMING)
            and n.record.policy == pol.key]
    wanted = {n.name for n in mine if n.record.state == RECLAIMING or n.unschedulable or isinstance(pol, PolicyGone)
              or n.labels.get(LENDABLE_TO_LABEL) != pol.namespace}
    if wanted:
        reached("wanted")
    spec = reclaim_of(pol)
    end = now + timedelta(seconds=spec.grace_period_seconds + spec.deadline_seconds + 30)
    t = now
    back: set[str] = set()
    while t <= end:
        w.apply(w.decide(pol, t))
        back |= {n for n in wanted if w.nodes[n].record.state is None}  # (it may be lent again later)
        w.lying_step(lie)
        t += timedelta(seconds=30)
    still = sorted(wanted - back)
    assert still == [], (still, w.summary())


def lose_cluster(w: World, loss: str) -> None:
    """The bridge can no longer load the policy's SlurmCluster."""
    if loss == "deleted":
        w.cluster = None
    else:
        w.unreadable = UnreadableCluster("hpc/demo", loss)


@SETTINGS
@given(worlds(), st.sampled_from(["invalid", "newer-status", "deleted"]), st.integers(0, 3))
def test_no_node_stays_lent_to_a_cluster_the_bridge_cannot_load_past_grace_plus_deadline(case, loss, step):
    """Issue 41, item 1: whatever else the world holds, a SlurmCluster the
    bridge cannot load (invalid, unknown to it, deleted) gets nothing lent,
    and every node the policy lent to it is Kubernetes' again within
    gracePeriodSeconds + deadlineSeconds (and a round). Built to reach the
    case: n0 is always lent to it by the policy."""
    w, pol, now = case
    labels = {**w.nodes["n0"].labels, STATE_LABEL: LENT} if "n0" in w.nodes else {**GPU_LABELS, STATE_LABEL: LENT}
    w.nodes["n0"] = gpu_node("n0", labels=labels, annotations={
        POLICY_ANNOTATION: pol.key, "slurmk8s.dev/lending-cluster": "hpc/demo",
        "slurmk8s.dev/lending-partition": "gpu", SINCE_ANNOTATION: format_time(now - timedelta(hours=1))},
        taints=(NodeTaint(TAINT_KEY, "demo", TAINT_EFFECT),))
    lose_cluster(w, loss)
    mine = {n.name for n in w.nodes.values() if n.record.state in (LENDING, LENT, RECLAIMING)
            and n.record.policy == pol.key and n.record.cluster == "hpc/demo"}
    assert "n0" in mine
    spec = reclaim_of(pol)
    end = now + timedelta(seconds=spec.grace_period_seconds + spec.deadline_seconds + 30)
    t, back = now, set()
    while t <= end:
        acts = w.decide(pol, t)
        assert not [a for a in acts if isinstance(a, (A.CreateSlurmdPod, A.Taint))
                    or (isinstance(a, A.SetLendingState) and a.state != RECLAIMING)], acts
        w.apply(acts)
        back |= {n for n in mine if w.nodes[n].record.state is None}
        w.step()
        t += timedelta(seconds=10 * (step + 1))
    still = sorted(mine - back)
    assert still == [], (still, loss, w.summary())


def lifted(pol: NodeLendingPolicy, **limits) -> NodeLendingPolicy:
    """``pol`` with some of its limits changed (None: no limit)."""
    return pol.model_copy(update={"spec": pol.spec.model_copy(update=limits)})


@reaches(lends=0.3, capped=0.12)
@SETTINGS
@given(worlds(lendable=True))
def test_lending_never_passes_max_lent_nodes_or_goes_below_min_kubernetes_nodes(case):
    """The examples are worlds where lending may happen; in many, maxLentNodes or
    minKubernetesNodes keeps back a node that would be lent without it."""
    w, pol, now = case
    before_held, before_kube = held(w, pol.key), kube_selected(w)
    if isinstance(pol, NodeLendingPolicy) and pol.spec.max_lent_nodes is not None:
        free = w.copy()
        free.apply(free.decide(lifted(pol, max_lent_nodes=None), now))
        if held(free, pol.key) > max(pol.spec.max_lent_nodes, before_held):
            reached("capped")  # the limit is what keeps a node back here
    acts = w.decide(pol, now)
    w.apply(acts)
    after_held, after_kube = held(w, pol.key), kube_selected(w)
    if isinstance(pol, PolicyGone):
        assert not any(isinstance(a, A.SetLendingState) and a.state != RECLAIMING for a in acts)
        return
    spec = pol.spec
    if any(isinstance(a, A.SetLendingState) and a.state == LENDING for a in acts):
        reached("lends")
        if spec.max_lent_nodes is not None:
            assert after_held <= spec.max_lent_nodes
        assert after_kube >= spec.min_kubernetes_nodes
    if spec.max_lent_nodes is not None:
        assert after_held <= max(spec.max_lent_nodes, before_held)
    assert after_kube >= min(spec.min_kubernetes_nodes, before_kube)


@reaches(lends=0.3, withheld=0.2)
@SETTINGS
@given(worlds(lendable=True))
def test_only_nodes_lendable_to_the_policys_namespace_are_lent_or_kept(case):
    """A node whose owner did not name the policy's namespace in
    slurmk8s.dev/lendable-to is never lent, never kept lent: whatever it
    holds is on its way back (decision record 15)."""
    w, pol, now = case
    acts = w.decide(pol, now)
    allowed = {n.name for n in w.nodes.values() if n.labels.get(LENDABLE_TO_LABEL) == pol.namespace}
    if any(n.labels.get("slurmk8s.dev/lendable") == "true" and n.name not in allowed for n in w.nodes.values()):
        reached("withheld")  # a node the policy selects but may not lend
    for a in acts:
        if isinstance(a, (A.CreateSlurmdPod, A.Taint)) or (isinstance(a, A.SetLendingState) and a.state != RECLAIMING):
            reached("lends")
            assert a.node in allowed, (a, w.summary())
    w.apply(acts)
    if isinstance(pol, NodeLendingPolicy) and w.cluster is not None and w.slurm_known:
        for n in w.nodes.values():
            if n.name not in allowed and n.annotations.get(POLICY_ANNOTATION) == pol.key \
                    and n.annotations.get("slurmk8s.dev/lending-cluster") == "hpc/demo":
                assert n.labels.get(STATE_LABEL) in (None, RECLAIMING, "bogus"), (n, w.summary())


def lending_now(acts) -> set[str]:
    return {a.node for a in acts if isinstance(a, A.SetLendingState) and a.state == LENDING}


@reaches(lends=0.25, beside=0.15)
@SETTINGS
@given(worlds(lendable=True), st.data())
def test_no_node_is_lent_to_the_cluster_whose_own_pods_run_there(case, data):
    """Issue 44, item 4: pods of the policy's SlurmCluster (its controller, login or a
    worker, labelled as the operator renders them) run on some nodes; none of those is
    lent to it, whatever else the world holds (decision record 49). The examples put
    such a pod on a node that would be lent without it."""
    w, pol, now = case
    c = w.cluster if w.cluster is not None else cluster()
    on = data.draw(st.lists(st.sampled_from(sorted(w.nodes)), min_size=1, max_size=2, unique=True), label="on")
    for i, node in enumerate(on):
        component = data.draw(st.sampled_from(["controller", "login", "worker"]), label="component")
        w.pods[(c.namespace, f"own-{i}")] = KubePod(
            c.namespace, f"{c.name}-{component}-{i}", node=node, phase="Running",
            labels=names.labels(c, component))
    without = w.copy()
    without.pods = {k: p for k, p in w.pods.items() if not k[1].startswith("own-")}
    if lending_now(without.decide(pol, now)) & set(on):
        reached("beside")  # the pod is what keeps that node back
    lent = lending_now(w.decide(pol, now))
    if lent:
        reached("lends")
    assert not lent & set(on), (lent, on, w.summary())


@reaches(guards=0.08, relaxes=0.05)
@SETTINGS
@given(st.one_of(worlds(), worlds(lendable=True)), st.booleans())
def test_a_lent_pod_has_a_disruption_budget_exactly_while_slurm_runs_jobs_on_its_node(case, busy):
    """Issue 44, item 4 (decision record 49): once a round's actions are applied, every
    node the policy holds for its SlurmCluster and keeps has a budget on its lent pod
    when that pod runs (Running, not being deleted, lent by this version) and Slurm
    shows a job there, and none otherwise; a node handed back keeps none (unless its
    chain stopped: it waits for the next round). Slurm unknown or no SlurmCluster:
    nothing is guarded anew, and a budget goes only with its node handed back
    (past the deadline); budgets not observed: the rule does nothing.
    Built to reach the case: with ``busy``, n0 is lent by the policy and runs a job."""
    w, pol, now = case
    if busy:
        w.nodes["n0"] = gpu_node("n0", labels={**GPU_LABELS, STATE_LABEL: LENT}, annotations={
            POLICY_ANNOTATION: pol.key, "slurmk8s.dev/lending-cluster": "hpc/demo",
            "slurmk8s.dev/lending-partition": "gpu", SINCE_ANNOTATION: format_time(now - timedelta(hours=1))},
            taints=(NodeTaint(TAINT_KEY, "demo", TAINT_EFFECT),))
        w.pods[("hpc", lent_slurmd("demo", "n0"))] = KubePod(
            "hpc", lent_slurmd("demo", "n0"), node="n0", phase="Running", gpus=8,
            labels={COMPONENT_LABEL: SLURMD_COMPONENT, names.LENT_NODE_LABEL: names.lent_node_label("n0")})
        w.snodes["n0"] = slurm_node("n0", state="mixed")
        w.jobs[99] = job(99, "n0")
    acts = w.decide(pol, now)
    if w.budgets is None:  # not observed: the rule waits
        assert not [a for a in acts if isinstance(a, (A.CreateBudget, A.DeleteBudget))], acts
        return
    if w.cluster is None or not w.slurm_known:
        # No Slurm to ask: nothing is guarded anew; a budget goes only with its node handed back.
        handed_back = {a.node for a in acts if isinstance(a, A.ClearLending)}
        assert not [a for a in acts if isinstance(a, A.CreateBudget)], acts
        assert all(a.node in handed_back for a in acts if isinstance(a, A.DeleteBudget)), acts
        return
    if any(isinstance(a, A.CreateBudget) for a in acts):
        reached("guards")
    if any(isinstance(a, A.DeleteBudget) for a in acts):
        reached("relaxes")
    before = w.copy()
    w.apply(acts)
    for n in before.nodes.values():
        rec = n.record
        if rec.holder != pol.key or rec.cluster != "hpc/demo" or n.name in w.stopped:
            continue  # not this policy's for its cluster, or its chain waits for the next round
        has = ("hpc", names.lent_budget("demo", n.name)) in w.budgets
        if w.nodes[n.name].record.state is None:
            assert not has, (n.name, acts, w.summary())  # handed back: its budget went with it
            continue
        # What the round saw: the pod (lent by this version) running, and a job there.
        pod = before.pods.get(("hpc", lent_slurmd("demo", n.name)))
        wanted = (pod is not None and not pod.deleting and pod.phase == "Running"
                  and pod.labels.get(names.LENT_NODE_LABEL) == names.lent_node_label(n.name)
                  and bool(before.active_jobs(n.name)))
        assert has == wanted, (n.name, has, wanted, acts, before.summary())


@reaches(acts=0.4)
@SETTINGS
@given(st.one_of(worlds(), worlds(lendable=True)))
def test_deciding_again_on_the_result_changes_nothing(case):
    w, pol, now = case
    before = w.summary()
    first = w.decide(pol, now)
    if any(not isinstance(a, (A.Event, A.PolicyStatus)) for a in first):
        reached("acts")
    w.apply(first)
    again = w.decide(pol, now)
    assert again == [], (f"\n{before}\npolicy {getattr(pol, 'spec', pol)}\n"
                         f"first: {first}\nafter:\n{w.summary()}")


def end_state(w: World) -> dict:
    """What must agree after convergence (times differ with the rounds lost,
    and so do the jobs signalled: a job that a cut round ended before the
    restarted bridge signalled is not signalled)."""
    bookkeeping = {SIGNALLED_ANNOTATION, FORCED_ANNOTATION, JOBS_ANNOTATION}
    nodes = {n.name: (n.labels.get(STATE_LABEL), tuple(sorted(t.key for t in n.taints)),
                      tuple(sorted(k for k in n.annotations if k not in bookkeeping)))
             for n in w.nodes.values()}
    pods = sorted((k, p.phase, p.deleting) for k, p in w.pods.items())
    snodes = sorted((s.name, s.state, s.drain_set) for s in w.snodes.values())
    jobs = sorted((j.job_id, j.state, j.nodes) for j in w.jobs.values())
    budgets = None if w.budgets is None else sorted(w.budgets)
    return {"nodes": nodes, "pods": pods, "slurm": snodes, "jobs": jobs, "budgets": budgets}


def run(w: World, pol, now, rounds: int = 60):
    for _ in range(rounds):
        w.apply(w.decide(pol, now))
        w.step()
        now += timedelta(seconds=30)
    return w


@reaches(cut=0.3, lends=0.12)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(worlds(), worlds(lendable=True)), st.data())
def test_a_bridge_killed_after_any_prefix_of_its_actions_converges_to_the_same_end(case, data):
    w, pol, now = case
    acts = w.decide(pol, now)
    cut = data.draw(st.integers(0, len(acts)), label="actions applied before the kill")
    whole, killed = w.copy(), w.copy()
    whole.apply(acts)
    killed.apply(acts[:cut])
    if 0 < cut < len(acts):
        reached("cut")
    if any(isinstance(a, A.SetLendingState) and a.state == LENDING for a in acts):
        reached("lends")
    # The restarted bridge decides again on the partially updated world.
    killed.apply(killed.decide(pol, now))
    later = now + timedelta(seconds=30)
    whole.step()
    killed.step()
    before = w.summary()
    a, b = end_state(run(whole, pol, later)), end_state(run(killed, pol, later))
    assert a == b, (f"\n{before}\npolicy {getattr(pol, 'spec', pol)}\nactions {acts}\n"
                    f"cut after {cut}\nwhole:\n{whole.summary()}\nkilled:\n{killed.summary()}")
