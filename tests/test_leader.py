"""Leader election (``slurmk8s/leader.py``): the rule, pure; never two leaders
over any interleaving of tries, clocks and lost writes (hypothesis, against
an in-memory Lease with resourceVersions); then two candidates against the
API stand-in: one leads, a killed leader's standby takes over within the
lease duration, a released lease at the standby's next try, and of two
creates one is refused.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmk8s.kube import ApiError, Kube
from slurmk8s.leader import (
    LEASE_SECONDS_MAX,
    LEASE_SECONDS_MIN,
    Elector,
    Timing,
    claim,
    lease_name,
    legacy_lease_name,
    released,
)

from .apiserver.conftest import Cluster, start_server, wait_for

NS, NAME = "ops", "slurmk8s-operator"


def lease(holder: str | None, renew: str = "2026-01-01T00:00:00.000000Z", transitions: int = 3, duration: int = 15,
          acquire: str = "2025-12-31T00:00:00.000000Z") -> dict:
    spec: dict[str, Any] = {"leaseDurationSeconds": duration, "renewTime": renew, "acquireTime": acquire,
                            "leaseTransitions": transitions}
    if holder:
        spec["holderIdentity"] = holder
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": NAME, "namespace": NS, "resourceVersion": "7"}, "spec": spec}


def test_a_missing_lease_is_created_for_the_candidate():
    out = claim(None, "a", 0.0, 1_800_000_000.25, 15, namespace=NS, name=NAME)
    assert out["metadata"] == {"name": NAME, "namespace": NS}
    assert out["spec"]["holderIdentity"] == "a" and out["spec"]["leaseTransitions"] == 0
    assert out["spec"]["renewTime"] == out["spec"]["acquireTime"] == "2027-01-15T08:00:00.250000Z"


def test_the_holder_renews_and_keeps_its_acquire_time_and_transitions():
    out = claim(lease("a"), "a", 3.0, 1_800_000_000.0, 15, namespace=NS, name=NAME)
    assert out["spec"]["acquireTime"] == "2025-12-31T00:00:00.000000Z"
    assert out["spec"]["leaseTransitions"] == 3
    assert out["metadata"]["resourceVersion"] == "7"  # the PUT is conditional on what was read


@pytest.mark.parametrize("seen_for", [0.0, 14.9])
def test_another_holders_lease_is_left_alone_until_it_expires_by_the_candidates_clock(seen_for):
    assert claim(lease("a"), "b", seen_for, 1_800_000_000.0, 15, namespace=NS, name=NAME) is None


def test_an_expired_lease_is_taken_with_one_more_transition():
    out = claim(lease("a"), "b", 15.0, 1_800_000_000.0, 15, namespace=NS, name=NAME)
    assert out["spec"]["holderIdentity"] == "b" and out["spec"]["leaseTransitions"] == 4
    assert out["spec"]["acquireTime"] == out["spec"]["renewTime"]


def test_a_released_lease_is_taken_at_once():
    free = released(lease("a"), 1_800_000_000.0)
    assert "holderIdentity" not in free["spec"] and free["spec"]["leaseDurationSeconds"] == 1
    assert claim(free, "b", 0.0, 1_800_000_001.0, 15, namespace=NS, name=NAME)["spec"]["holderIdentity"] == "b"


def test_timings_that_could_overlap_two_leaders_are_refused():
    with pytest.raises(ValueError, match="lease > renew deadline"):
        Timing(lease=10, renew_deadline=10, retry=2)


# --- never two leaders ----------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class MemoryLeases:
    """A Lease store as the API server keeps it, by name: create refused when
    it exists, PUT refused unless it carries the current resourceVersion.
    ``lose``: 1, the next write fails before it reaches the store; 2, it is
    stored but its answer is lost (both a timeout to the writer)."""

    timeout = 1.0

    def __init__(self) -> None:
        self.objs: dict[str, dict] = {}
        self.version = 0
        self.lose = 0

    @property
    def obj(self) -> dict | None:
        return self.objs.get(NAME)

    def get(self, kind: str, namespace: str, name: str, *, timeout: float | None = None) -> dict | None:
        obj = self.objs.get(name)
        return None if obj is None else {**obj, "metadata": dict(obj["metadata"])}

    def _store(self, obj: dict) -> dict:
        if self.lose == 1:
            raise TimeoutError("the write timed out")
        self.version += 1
        name = obj["metadata"]["name"]
        self.objs[name] = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(self.version)}}
        if self.lose == 2:
            raise TimeoutError("the answer timed out")
        return self.objs[name]

    def create(self, obj: dict, *, timeout: float | None = None) -> dict:
        if obj["metadata"]["name"] in self.objs:
            raise ApiError("POST", "/leases", 409, "AlreadyExists", "exists")
        return self._store(obj)

    def replace(self, obj: dict, *, timeout: float | None = None) -> dict:
        if obj["metadata"].get("resourceVersion") != self.objs[obj["metadata"]["name"]]["metadata"]["resourceVersion"]:
            raise ApiError("PUT", "/leases", 409, "Conflict", "modified")
        return self._store(obj)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.floats(0.0, 6.0), st.integers(0, 2)), min_size=1, max_size=80))
def test_never_two_leaders_whatever_the_order_of_tries_and_lost_writes(steps):
    """Three candidates; each step lets time pass, then one candidate tries
    (its write lost or not). At every step at most one believes it leads, and a
    lease that changes hands changes only after the old holder stopped leading."""
    clock, store, timing = Clock(), MemoryLeases(), Timing(lease=15, renew_deadline=10, retry=2)
    electors = [Elector(store, NS, NAME, "test", me=f"c{i}", timing=timing, clock=clock, wall=clock)
                for i in range(3)]
    for who, wait, lose in steps:
        clock.t += wait
        store.lose = lose
        electors[who].try_once()
        assert sum(e.leading for e in electors) <= 1, [(e.me, e._renewed_at) for e in electors]
    store.lose = 0
    # And someone leads again once the tries go on long enough.
    for _ in range(12):
        clock.t += timing.retry
        for e in electors:
            e.try_once()
    assert sum(e.leading for e in electors) == 1


# --- against the API stand-in -----------------------------------------------------------


FAST = Timing(lease=1.5, renew_deadline=1.0, retry=0.2)


@pytest.fixture(scope="module")
def api(tmp_path_factory) -> Cluster:
    c = start_server(tmp_path_factory.mktemp("leases"))
    c.core.create_namespace({"metadata": {"name": NS}})
    yield c
    c.api_client.close()
    c.srv.stop()


def candidates(api: Cluster, name: str, lost: list[str]) -> list[Elector]:
    return [Elector(Kube.from_kubeconfig(str(api.kubeconfig), timeout=5), NS, name, "test", me=me, timing=FAST,
                    on_lost=lambda me=me: lost.append(me)) for me in ("a", "b")]


def kill(e: Elector) -> None:
    """Stop trying without releasing: as a killed pod or a lost node does."""
    e._stop.set()
    for t in e._threads:
        t.join()


def test_a_standby_takes_over_within_the_lease_duration_after_the_leader_dies(api: Cluster):
    lost: list[str] = []
    a, b = candidates(api, "takeover", lost)
    a.start()
    wait_for("a leads", lambda: a.leading, timeout=5)
    b.start()
    time.sleep(4 * FAST.retry)
    assert not b.leading and b.holder == "a"
    killed = time.monotonic()
    kill(a)
    wait_for("b leads", lambda: b.leading, timeout=10)
    took = time.monotonic() - killed
    assert took <= FAST.lease + 2 * FAST.retry + 0.5, took
    assert lost == []  # a killed process calls nothing
    got = api.kubectl_json("get", "lease", "takeover", "-n", NS)["spec"]
    assert got["holderIdentity"] == "b" and got["leaseTransitions"] == 1
    b.stop()


def test_a_leader_cut_off_from_the_api_stops_before_a_standby_can_start(api: Cluster):
    lost: list[str] = []
    a, b = candidates(api, "partition", lost)
    when: dict[str, float] = {}
    a.on_lost = lambda: when.setdefault("a stopped", time.monotonic())
    a.start()
    wait_for("a leads", lambda: a.leading, timeout=5)
    b.start()
    time.sleep(2 * FAST.retry)
    a.kube = Kube.from_kubeconfig(str(api.kubeconfig), timeout=1)
    a.kube.server = "https://127.0.0.1:9"  # nothing listens there: every renewal fails
    cut = time.monotonic()
    wait_for("b leads", lambda: b.leading, timeout=10)
    when["b leads"] = time.monotonic()
    assert "a stopped" in when and when["a stopped"] < when["b leads"], when
    assert when["a stopped"] - cut <= FAST.renew_deadline + 0.5
    b.stop()
    kill(a)


def test_a_released_lease_goes_to_the_standby_at_its_next_try(api: Cluster):
    lost: list[str] = []
    a, b = candidates(api, "release", lost)
    a.start()
    wait_for("a leads", lambda: a.leading, timeout=5)
    b.start()
    time.sleep(2 * FAST.retry)
    stopped = time.monotonic()
    a.stop()
    wait_for("b leads", lambda: b.leading, timeout=5)
    assert time.monotonic() - stopped < FAST.lease, "a release must not wait for the lease to expire"
    assert lost == []
    b.stop()


def test_of_two_creates_at_once_the_api_refuses_one(api: Cluster):
    lost: list[str] = []
    a, b = candidates(api, "race", lost)
    barrier = threading.Barrier(2)
    won: list[bool] = []

    def go(e: Elector) -> None:
        barrier.wait()
        won.append(e.try_once())

    threads = [threading.Thread(target=go, args=(e,)) for e in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(won) == [False, True]
    assert [e.leading for e in (a, b)].count(True) == 1


# --- bounds, names per release, a slow API server (issue 41, items 8 and 9) --------------


def test_a_lease_duration_from_the_lease_is_believed_only_within_bounds():
    """A Lease written with a huge or unreadable duration cannot keep standbys out for ever."""
    for duration, waits in ((10**9, LEASE_SECONDS_MAX), ("15", 15), (None, 15), (True, 15), (-3, 15), (40, 40)):
        held = lease("a")
        held["spec"]["leaseDurationSeconds"] = duration
        assert claim(held, "b", waits - 0.1, 1_800_000_000.0, 15, namespace=NS, name=NAME) is None
        assert claim(held, "b", waits, 1_800_000_000.0, 15, namespace=NS, name=NAME)["spec"]["holderIdentity"] == "b"


@pytest.mark.parametrize("seconds", [LEASE_SECONDS_MIN - 1, LEASE_SECONDS_MAX + 1, 0])
def test_a_lease_duration_out_of_bounds_is_refused_with_the_bounds(seconds):
    with pytest.raises(ValueError, match=f"{LEASE_SECONDS_MIN} to {LEASE_SECONDS_MAX} seconds"):
        Timing.for_lease(seconds)


def test_the_timings_follow_the_lease_duration_as_client_gos():
    assert Timing.for_lease(15) == Timing()
    t = Timing.for_lease(60)
    assert (t.lease, t.renew_deadline, t.retry) == (60, 40, 8)


def test_lease_names_are_per_release_and_refuse_what_is_no_release_name():
    assert lease_name("operator", "ops") == "slurmk8s-operator-ops" != lease_name("operator", "hpc")
    assert lease_name("bridge") == legacy_lease_name("bridge") == "slurmk8s-bridge"
    for bad in ("Ops", "a" * 54, "-x", "x_y", "", "a.b"):
        with pytest.raises(ValueError, match="not a Helm release name"):
            lease_name("operator", bad)


def test_two_releases_in_one_namespace_each_lead():
    """Issue 41, item 8: with one fixed Lease name, the second release never led."""
    clock, store = Clock(), MemoryLeases()
    electors = [Elector(store, NS, lease_name("operator", release), "test", me=release, clock=clock, wall=clock)
                for release in ("ops", "hpc")]
    for e in electors:
        assert e.try_once() and e.leading


def test_a_new_version_waits_for_the_old_versions_lease_to_be_free():
    """An upgrade: the old leader holds slurmk8s-operator; the new candidate
    does not lead beside it, and takes its own Lease once the old one is free."""
    clock, store = Clock(), MemoryLeases()
    old = Elector(store, NS, NAME, "test", me="old", clock=clock, wall=clock)
    new = Elector(store, NS, lease_name("operator", "ops"), "test", me="new", clock=clock, wall=clock, legacy=NAME)
    assert old.try_once()
    for _ in range(5):
        clock.t += 2
        assert old.try_once() and not new.try_once() and new.holder == "old"
    store.objs[NAME] = released(store.objs[NAME], clock.t)  # the old pod stops cleanly
    assert new.try_once() and new.leading
    # Once leading it reads only its own Lease.
    store.objs[NAME]["spec"]["holderIdentity"] = "someone"
    clock.t += 2
    assert new.try_once()


class SlowLeases(MemoryLeases):
    """An API server that answers every request after ``delay`` seconds; a
    request given less time (its timeout, else the client's) fails as a real one would."""

    def __init__(self, delay: float, timeout: float) -> None:
        super().__init__()
        self.delay, self.timeout = delay, timeout
        self.lock = threading.Lock()

    def _slow(self, timeout: float | None) -> None:
        allowed = self.timeout if timeout is None else timeout
        time.sleep(min(self.delay, allowed))
        if allowed < self.delay:
            raise ApiError("GET", "/leases", 0, "Unreachable", f"no answer within {allowed:g} s")

    def get(self, kind, namespace, name, *, timeout=None):
        self._slow(timeout)
        with self.lock:
            return super().get(kind, namespace, name)

    def create(self, obj, *, timeout=None):
        self._slow(timeout)
        with self.lock:
            return super().create(obj)

    def replace(self, obj, *, timeout=None):
        self._slow(timeout)
        with self.lock:
            return super().replace(obj)


def test_a_slow_api_server_is_a_late_renewal_not_a_lost_lease():
    """Issue 41, item 9: each request had 4 s (twice the retry period), so an
    API server slower than that made leaders flip. Here, in proportion: a lease
    of 3 s, a renew deadline of 2 s, retries every 0.15 s (the old timeout:
    0.3 s), and every answer takes 0.4 s, a read and a write 0.8 s a try: the
    leader keeps its Lease, and the standby never takes it."""
    timing = Timing(lease=3.0, renew_deadline=2.0, retry=0.15)
    store = SlowLeases(delay=0.4, timeout=timing.retry * 2)
    lost: list[str] = []
    a, b = (Elector(store, NS, NAME, "test", me=me, timing=timing, on_lost=lambda me=me: lost.append(me))
            for me in ("a", "b"))
    a.start()
    wait_for("a leads", lambda: a.leading, timeout=5)
    b.start()
    time.sleep(4 * timing.lease)
    assert a.leading and not b.leading and lost == [] and store.obj["spec"]["holderIdentity"] == "a"
    for e in (a, b):
        e.stop()
