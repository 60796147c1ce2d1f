"""The informer (slurmk8s/informer.py): the pure cache, and the shell's
list, watch, 410 -> relist, error -> back-off, resync, against a scripted
source; and what the bridge does with a cache that is not synced."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from slurmk8s.bridge.loop import Bridge, next_tick
from slurmk8s.bridge.observed import node_from_api, pod_from_api
from slurmk8s.bridge.view import relevant
from slurmk8s.informer import Change, Gone, Informer, Store, WatchFailed, backoff

from .fakekube import FakeKube


def node(name: str, rv: int, **labels: str) -> dict:
    return {"kind": "Node", "metadata": {"name": name, "resourceVersion": str(rv), "labels": labels},
            "status": {"allocatable": {"nvidia.com/gpu": "4"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def ev(kind: str, obj: dict) -> dict:
    return {"type": kind, "object": obj}


def gone() -> dict:
    return ev("ERROR", {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old resource version"})


# The store (pure).


def test_a_list_fills_the_store_and_syncs_it_and_events_change_it():
    s = Store(node_from_api)
    assert not s.synced
    s.replace([node("a", 1), node("b", 2)], "2")
    assert s.synced and s.version == "2" and sorted(n.name for n in s.values()) == ["a", "b"]
    change = s.apply(ev("MODIFIED", node("a", 3, team="x")))
    assert change.key == "a" and change.old.labels == {} and change.new.labels == {"team": "x"}
    s.apply(ev("ADDED", node("c", 4)))
    s.apply(ev("DELETED", node("b", 5)))
    assert sorted(n.name for n in s.values()) == ["a", "c"] and s.version == "5"
    assert s.raw()["a"]["metadata"]["resourceVersion"] == "3"


def test_a_bookmark_moves_the_version_and_changes_nothing():
    s = Store(node_from_api)
    s.replace([node("a", 1)], "1")
    assert s.apply(ev("BOOKMARK", {"kind": "Node", "metadata": {"resourceVersion": "9"}})) is None
    assert s.version == "9" and [n.name for n in s.values()] == ["a"]


def test_error_events_raise_gone_for_410_and_watch_failed_otherwise():
    s = Store(node_from_api)
    s.replace([], "1")
    with pytest.raises(Gone):
        s.apply(gone())
    with pytest.raises(WatchFailed):
        s.apply(ev("ERROR", {"code": 500, "reason": "InternalError", "message": "boom"}))


def test_our_own_write_shows_at_once_and_older_events_do_not_undo_it():
    s = Store(node_from_api)
    s.replace([node("a", 1)], "1")
    s.write_through(node("a", 3, state="lending"))
    assert s.get("a").labels == {"state": "lending"}
    # An event from before our write arrives late: ignored.
    assert s.apply(ev("MODIFIED", node("a", 2, other="x"))) is None
    assert s.get("a").labels == {"state": "lending"}
    # Our write's own event: the pin goes; later events apply again.
    change = s.apply(ev("MODIFIED", node("a", 3, state="lending")))
    assert change.old == change.new
    s.apply(ev("MODIFIED", node("a", 4, state="lent")))
    assert s.get("a").labels == {"state": "lent"}


def test_a_write_that_changed_nothing_pins_nothing():
    s = Store(node_from_api)
    s.replace([node("a", 1)], "1")
    s.write_through(node("a", 1))  # a no-op patch: same resourceVersion, no event will come
    s.apply(ev("MODIFIED", node("a", 2, team="y")))
    assert s.get("a").labels == {"team": "y"}


def test_a_relist_forgets_pins():
    s = Store(node_from_api)
    s.replace([node("a", 1)], "1")
    s.write_through(node("a", 3))
    s.replace([node("a", 5, team="z")], "5")
    s.apply(ev("MODIFIED", node("a", 6, team="w")))
    assert s.get("a").labels == {"team": "w"}


def test_backoff_doubles_up_to_a_cap_and_stretches_by_the_jitter():
    assert [backoff(n) for n in range(0, 5)] == [0.0, 0.5, 1.0, 2.0, 4.0]
    assert backoff(20) == 30.0
    assert backoff(2, jitter=0.5) == 1.5


# The shell, against a scripted source.


class Script:
    """list_versioned answers from ``lists``; each watch call takes the next of ``watches``
    (a list of events, or an exception to raise); when none is left, the informer stops."""

    def __init__(self, informer_box: list, lists: list, watches: list):
        self.box, self.lists, self.watches = informer_box, list(lists), list(watches)
        self.calls: list[tuple] = []

    def list_versioned(self, kind: str, namespace: str | None = None) -> tuple[list[dict], str]:
        self.calls.append(("list", kind, namespace))
        step = self.lists.pop(0)
        if isinstance(step, Exception):
            raise step
        return step

    def watch(self, kind: str, namespace: str | None, resource_version: str, *,
              timeout_seconds: int = 300) -> Iterator[dict]:
        self.calls.append(("watch", resource_version, timeout_seconds))
        if not self.watches:
            self.box[0].stop()
            return iter(())
        step = self.watches.pop(0)
        if isinstance(step, Exception):
            raise step
        return iter(step)


def informer(lists: list, watches: list, **kwargs: Any) -> tuple[Informer, Script, list[float], list]:
    box: list = [None]
    source = Script(box, lists, watches)
    slept: list[float] = []
    changes: list = []
    inf = Informer(source, "Node", None, Store(node_from_api), on_change=changes.append,
                   sleep=slept.append, jitter=lambda: 0.0, **kwargs)
    box[0] = inf
    return inf, source, slept, changes


def test_it_lists_then_watches_from_the_lists_version_and_applies_events():
    inf, src, slept, changes = informer([([node("a", 1)], "7")],
                                        [[ev("ADDED", node("b", 8)), ev("MODIFIED", node("a", 9, x="1"))]])
    inf.run()
    assert src.calls[0] == ("list", "Node", None) and src.calls[1][:2] == ("watch", "7")
    assert inf.store.synced and sorted(n.name for n in inf.store.values()) == ["a", "b"]
    assert changes[0] is None and [c.key for c in changes[1:]] == ["b", "a"]
    assert src.calls[2][:2] == ("watch", "9")  # the next watch resumes where the last ended
    assert slept == []


def test_410_unsyncs_and_relists_at_once():
    inf, src, slept, _ = informer([([node("a", 1)], "1"), ([node("a", 5, y="2")], "5")], [[gone()]])
    inf.step()
    assert not inf.store.synced and slept == []
    inf.step()
    assert inf.store.synced and inf.store.get("a").labels == {"y": "2"} and inf.lists == 2
    assert [c[0] for c in src.calls] == ["list", "watch", "list", "watch"]


def test_an_error_unsyncs_backs_off_and_relists():
    inf, src, slept, _ = informer([([node("a", 1)], "1"), ConnectionError("refused"), ([node("a", 3)], "3")],
                                  [ConnectionResetError("reset")])
    inf.step()
    assert not inf.store.synced and slept == [0.5]
    inf.step()  # the list fails too: a longer wait
    assert not inf.store.synced and slept == [0.5, 1.0]
    inf.step()
    assert inf.store.synced and inf.failures == 0


def test_a_resync_relists_after_its_period_and_keeps_the_store_synced_meanwhile():
    now = [0.0]
    inf, src, slept, _ = informer([([node("a", 1)], "1"), ([node("a", 2)], "2")], [[], []],
                                  resync=60, clock=lambda: now[0])

    def watch_then_pass_time(*args, **kwargs):
        now[0] += 40
        assert inf.store.synced
        return Script.watch(src, *args, **kwargs)

    src.watch = watch_then_pass_time
    inf.step()  # two watches of 40 s: the resync is due
    assert [c[0] for c in src.calls] == ["list", "watch", "watch"]
    assert src.calls[2][2] == 20  # the second watch asked for what was left of the period
    inf.step()
    assert inf.lists == 2


# What the bridge makes of it.


def pod(name: str, *, gpus: int = 0, phase: str = "Running", labels: dict | None = None) -> dict:
    res = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    return {"metadata": {"name": name, "namespace": "ns", "labels": labels or {}},
            "spec": {"nodeName": "a", "containers": [{"name": "c", "resources": res}]}, "status": {"phase": phase}}


def test_only_changes_a_decision_can_see_wake_the_loop():
    cpu = [pod_from_api(pod("web", phase=p)) for p in ("Pending", "Running")]
    gpu = [pod_from_api(pod("train", gpus=1, phase=p)) for p in ("Pending", "Running")]
    lent = [pod_from_api(pod("demo-lent-a", phase=p, labels={"app.kubernetes.io/component": "lent-slurmd"}))
            for p in ("Pending", "Running")]
    assert not relevant("Pod", Change("ns/web", *cpu))
    assert relevant("Pod", Change("ns/train", *gpu)) and relevant("Pod", Change("ns/train", gpu[1], None))
    assert relevant("Pod", Change("ns/demo-lent-a", *lent))
    beat = node("a", 1)
    beat2 = node("a", 2)
    beat2["status"]["conditions"][0]["lastHeartbeatTime"] = "2026-01-01T00:00:00Z"
    assert not relevant("Node", Change("a", node_from_api(beat), node_from_api(beat2)))
    assert relevant("Node", Change("a", node_from_api(beat), node_from_api(node("a", 3, lendable="true"))))
    assert relevant("NodeLendingPolicy", Change("ns/p", {}, {})) and relevant("Node", None)


class Unsynced:
    def not_synced(self) -> list[str]:
        return ["Pod"]

    def __getattr__(self, name: str):
        raise AssertionError(f"a round read {name} from a view that is not synced")


def test_a_round_decides_nothing_while_a_cache_is_not_synced():
    kube = FakeKube()
    report = Bridge(kube, view=Unsynced(), agent=lambda *a: pytest.fail("Slurm asked")).round()
    assert report.waiting == ["Pod"] and not report.applied and not report.errors
    assert kube.requests == []


def test_timed_rounds_fall_just_after_whole_seconds():
    assert next_tick(100.5, 1) == pytest.approx(101.02)
    assert next_tick(101.01, 1) == pytest.approx(101.02)
    assert next_tick(101.03, 1) == pytest.approx(102.02)
    assert next_tick(101.5, 2) == pytest.approx(102.02)


# Against the API stand-in: the Kube client's list and watch, and a 410.


@pytest.fixture()
def short_history(tmp_path):
    from .apiserver.conftest import start_server

    cluster = start_server(tmp_path, history_limit=5)
    yield cluster
    cluster.api_client.close()
    cluster.srv.stop()


def test_against_the_stand_in_events_arrive_and_a_compacted_version_is_gone(short_history):
    from slurmk8s.kube import Kube

    from .apiserver.conftest import wait_for

    cluster = short_history
    kube = Kube.from_kubeconfig(str(cluster.kubeconfig))
    cluster.node("n0", cpu="1", memory="1Gi")
    inf = Informer(kube, "Node", None, Store(node_from_api), watch_timeout=5).start()
    wait_for("the list", lambda: inf.store.synced)
    cluster.core.patch_node("n0", {"metadata": {"labels": {"seen": "yes"}}})
    wait_for("the event", lambda: inf.store.get("n0").labels.get("seen") == "yes")
    inf.stop()
    # A client that was away while more than the history changed: 410, relist.
    away = Informer(kube, "Node", None, Store(node_from_api), watch_timeout=1, sleep=lambda s: None)
    away.list()
    for i in range(8):
        cluster.node(f"n{i + 1}", cpu="1", memory="1Gi")
    with pytest.raises(Gone):
        away.watch(1)
    away.list()  # a relist: the watch works from its version again
    assert len(away.store.values()) == 9
    away.watch(1)
