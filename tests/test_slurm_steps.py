"""The one executor of Slurm steps and its failure rule (decision record 29)."""

from __future__ import annotations

import pytest

from slurmk8s.events import Event
from slurmk8s.slurm import AgentUnreachable, NotOurDrain, SlurmError
from slurmk8s.slurm.steps import (
    Cancel,
    DeleteNode,
    Drain,
    Requeue,
    SetDown,
    Signal,
    StartNow,
    Undrain,
    execute,
)

UNREACHABLE = SlurmError(["scontrol"], 1, "slurm_load_jobs error: Unable to contact slurm controller")
GONE = SlurmError(["scontrol", "requeue", "2"], 1, "Job has already finished")


class Slurm:
    """A SlurmControl that records calls; ``fail`` maps a call to what it raises."""

    def __init__(self, fail=None):
        self.calls: list[tuple] = []
        self.fail = fail or {}

    def _do(self, *call):
        self.calls.append(call)
        if call in self.fail:
            raise self.fail[call]

    def drain(self, name, reason):
        self._do("drain", name)

    def set_down(self, name, reason):
        self._do("down", name)

    def undrain(self, name):
        self._do("undrain", name)

    def signal_node_jobs(self, name, signal):
        self._do("signal", name)
        return [7, 8]

    def requeue(self, job):
        self._do("requeue", job)

    def start_now(self, job):
        self._do("start-now", job)

    def cancel(self, job):
        self._do("cancel", job)

    def delete_node(self, name):
        self._do("delete", name)



class Note:
    """A caller's own action about a node (a record write, a Kubernetes Event)."""

    def __init__(self, node):
        self.node = node


def test_a_failed_step_stops_its_nodes_chain_and_no_other():
    slurm = Slurm({("delete", "a"): SlurmError(["scontrol"], 1, "Requested nodes are busy")})
    done_other = []
    a_note, b_note = Note("a"), Note("b")
    out = execute(slurm, [Drain("a", "r"), DeleteNode("a"), a_note, SetDown("a", "r"),
                          Drain("b", "r"), DeleteNode("b"), b_note], other=done_other.append)
    assert [type(a).__name__ for a, _ in out.failed] == ["DeleteNode"] and out.failed[0][0].node == "a"
    assert out.skipped == [a_note, SetDown("a", "r")]
    assert done_other == [b_note]
    assert slurm.calls == [("drain", "a"), ("delete", "a"), ("drain", "b"), ("delete", "b")]
    assert out.unreachable is None and not out.refusals


def test_slurm_unreachable_stops_every_later_step_but_not_other_actions():
    slurm = Slurm({("drain", "a"): AgentUnreachable("no answer")})
    done_other = []
    c_note = Note("c")
    out = execute(slurm, [Drain("a", "r"), Drain("b", "r"), Note("b"), c_note, Signal("c", (1,), "USR2")],
                  other=done_other.append)
    assert slurm.calls == [("drain", "a")]  # b and c are not asked: the agent just did not answer
    assert [(type(a).__name__, a.node) for a, _ in out.failed] == [("Drain", "a"), ("Drain", "b"), ("Signal", "c")]
    assert [type(a).__name__ for a in out.skipped] == ["Note"]  # b's own action: its chain stopped
    assert done_other == [c_note]  # c's chain had not failed yet
    assert out.unreachable == "no answer"


def test_an_unreachable_slurm_in_a_per_job_step_is_a_failure_not_a_refusal():
    slurm = Slurm({("requeue", 1): UNREACHABLE})
    out = execute(slurm, [Requeue("a", (1, 2)), Cancel("b", (3,))])
    assert slurm.calls == [("requeue", 1)]
    assert [type(a).__name__ for a, _ in out.failed] == ["Requeue", "Cancel"] and not out.refusals
    assert out.unreachable


def test_a_job_slurm_refuses_is_reported_and_the_others_and_the_chain_go_on():
    slurm = Slurm({("requeue", 2): GONE, ("start-now", 5): GONE})
    after = Note("a")
    done_other = []
    out = execute(slurm, [Signal("a", (1, 2, 3), "USR2"), Requeue("a", (1, 2, 3)), StartNow("a", (4, 5)),
                          Cancel("a", (6,)), after], other=done_other.append)
    assert ("requeue", 3) in slurm.calls and ("cancel", 6) in slurm.calls
    assert not out.failed and not out.skipped and done_other == [after]
    assert [type(a).__name__ for a in out.applied] == ["Signal", "Requeue", "StartNow", "Cancel", "Note"]
    assert [(e.type, e.reason, e.kind, e.name) for e in out.refusals] == [
        ("Warning", "RequeueRefused", "Node", "a"), ("Warning", "StartRefused", "Node", "a")]
    assert "job 2 on a" in out.refusals[0].message and "already finished" in out.refusals[0].message
    assert dict(out.jobs) == {"signalled": 2, "requeued": 2, "started-now": 1, "cancelled": 1}


def test_an_undrain_refused_for_someone_elses_drain_is_reported_and_done():
    slurm = Slurm({("undrain", "a"): NotOurDrain("a is drained by someone else")})
    out = execute(slurm, [Undrain("a"), Drain("b", "r")])
    assert [type(a).__name__ for a in out.applied] == ["Undrain", "Drain"] and not out.failed
    assert [e.reason for e in out.refusals] == ["UndrainRefused"]


def test_without_slurm_every_step_fails_and_other_actions_still_run():
    done_other = []
    note = Note("b")
    out = execute(None, [Drain("a", "r"), Note("a"), note], other=done_other.append)
    assert [type(a).__name__ for a, _ in out.failed] == ["Drain"] and done_other == [note]


def test_an_action_nobody_runs_fails_its_chain():
    out = execute(Slurm(), [Note("a"), Drain("a", "r")])
    assert "no runner" in out.failed[0][1] and [type(a).__name__ for a in out.skipped] == ["Drain"]


def test_a_failure_is_announced_once_per_reason_and_object():
    a = Event("Warning", "SlurmActionFailed", "one message", kind="Drain", name="n1")
    b = Event("Warning", "SlurmActionFailed", "another message", kind="Drain", name="n1")
    assert a.about == b.about == "Drain//n1" and Event("Normal", "X", "m").about == ""


@pytest.mark.parametrize("step", [Drain("a", "r"), SetDown("a", "r"), DeleteNode("a")])
def test_a_node_step_that_fails_is_reported_with_slurms_answer(step):
    slurm = Slurm({(c, "a"): SlurmError(["scontrol"], 1, "Invalid node name") for c in ("drain", "down", "delete")})
    out = execute(slurm, [step])
    assert out.failed and "Invalid node name" in out.failed[0][1]
