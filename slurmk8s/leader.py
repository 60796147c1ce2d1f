"""Leader election on a ``coordination.k8s.io`` Lease, as client-go's
``leaderelection`` package does it (decision record 35).

The operator and the bridge each run two replicas; only the one that holds
its Lease acts. The rule (:func:`claim`) is pure; :class:`Elector` is the
thin shell that reads and writes the Lease.

- A candidate writes itself into the Lease (create, or a ``PUT`` carrying the
  resourceVersion it read, so that of two candidates one gets a 409) when
  the Lease is free (no holder: released), already its own (a renewal), or
  expired: the holder and renew time have not changed for
  ``leaseDurationSeconds`` *by the candidate's own monotonic clock*, counted
  from when it first saw them. So clocks that disagree between nodes do not
  matter.
- The leader renews every :attr:`Timing.retry` seconds. It leads while its
  last successful renewal is less than :attr:`Timing.renew_deadline` old;
  past that it has lost the lease and must stop acting at once (the
  commands exit; the kubelet restarts them as standbys). A standby takes
  over only once :attr:`Timing.lease` seconds passed without a renewal, and
  ``lease > renew_deadline``: the old leader has stopped before the new one
  starts.
- A leader that stops cleanly releases the Lease (no holder), so that a
  standby takes over at its next try instead of after the lease duration.
- Each request of a try may take what is left of the renew deadline (a
  standby: the whole renew deadline), as client-go bounds its renewals by
  the deadline, not by a short per-request timeout: a slow answer from a
  loaded API server is a late renewal, not a lost lease. A busy answer
  (429, Retry-After) is asked again within that time (:mod:`slurmk8s.kube`).
- The timings follow the lease duration (:meth:`Timing.for_lease`: client-go's
  15/10/2 s ratios), which the command takes within
  [:data:`LEASE_SECONDS_MIN`, :data:`LEASE_SECONDS_MAX`]. A duration read
  from a Lease is bounded the same way: a Lease written with a huge or
  unreadable ``leaseDurationSeconds`` cannot keep standbys waiting for ever.
- Each Helm release has its own Leases (:func:`lease_name`:
  ``slurmk8s-<component>-<release>``), so two releases in one namespace
  each elect their own leader. Until it first leads, a candidate also waits
  for the name older versions used (:func:`legacy_lease_name`) to be free,
  so that an upgrade never runs an old leader beside a new one.

Who leads: the Lease's ``holderIdentity`` (``kubectl get lease``), each
replica's ``slurmk8s_leader`` gauge and ``/healthz``.
"""

from __future__ import annotations

import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog
from prometheus_client import Gauge

from .api.fields import DNS_LABEL_RE
from .health import Health
from .kube import ApiError, Kube
from .permissions import RELEASE, Permission

__all__ = ["Timing", "claim", "released", "Elector", "identity", "lead", "LEADER", "PERMISSIONS", "lease_name",
           "legacy_lease_name", "lease_seconds", "is_free", "LEASE_SECONDS_MIN", "LEASE_SECONDS_MAX"]

log = structlog.get_logger("slurmk8s.leader")

#: What an elector does through the API, in its own namespace: read the
#: Lease, create it once, renew and release it with PUTs.
PERMISSIONS = (
    Permission("get", "coordination.k8s.io", "leases", RELEASE),
    Permission("create", "coordination.k8s.io", "leases", RELEASE),
    Permission("update", "coordination.k8s.io", "leases", RELEASE),
)

#: The lease durations a command accepts (``--lease-duration``, the chart's
#: ``leaderElection.leaseDurationSeconds``), and the most a Lease's own is believed.
LEASE_SECONDS_MIN = 5
LEASE_SECONDS_MAX = 300

#: A Helm release name: a DNS-1123 label of at most RELEASE_MAX characters (Helm's own limit).
_RELEASE = re.compile(DNS_LABEL_RE)
RELEASE_MAX = 53


def lease_name(component: str, release: str | None = None) -> str:
    """The Lease of ``component`` ("operator", "bridge") of the Helm release
    ``release``: ``slurmk8s-<component>-<release>``; without a release, the
    name older versions used. ValueError for what is no release name."""
    if release is None:
        return legacy_lease_name(component)
    if len(release) > RELEASE_MAX or not _RELEASE.fullmatch(release):
        raise ValueError(f"{release!r} is not a Helm release name (lower-case letters, digits and '-', starting "
                         "and ending with a letter or digit, at most 53 characters)")
    return f"slurmk8s-{component}-{release}"


def legacy_lease_name(component: str) -> str:
    """The one Lease name of ``component`` before Leases were per release."""
    return f"slurmk8s-{component}"


def lease_seconds(spec: Mapping[str, Any], default: float) -> float:
    """A Lease's ``leaseDurationSeconds`` as believed: a whole number of
    seconds, at most LEASE_SECONDS_MAX; ``default`` when absent or unreadable. Pure."""
    raw = spec.get("leaseDurationSeconds")
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        return default
    return float(min(raw, LEASE_SECONDS_MAX))


LEADER = Gauge("slurmk8s_leader", "1 on the replica that holds its component's Lease and acts, 0 on a standby.",
               ["component", "lease"])


@dataclass(frozen=True)
class Timing:
    """Seconds, as client-go's defaults (and controller-runtime's)."""

    #: How long a standby waits, from the last renewal it saw, before it takes the Lease.
    lease: float = 15.0
    #: How long the leader goes on acting without a successful renewal.
    renew_deadline: float = 10.0
    #: Between two tries (renewals, or a standby's attempts).
    retry: float = 2.0

    def __post_init__(self) -> None:
        if not (self.lease > self.renew_deadline > self.retry > 0):
            raise ValueError(f"leader election needs lease > renew deadline > retry > 0, not {self}")

    @classmethod
    def for_lease(cls, seconds: float) -> Timing:
        """The timings of a lease of ``seconds``, in client-go's ratios (15, 10, 2)."""
        if not LEASE_SECONDS_MIN <= seconds <= LEASE_SECONDS_MAX:
            raise ValueError(f"the lease duration must be {LEASE_SECONDS_MIN} to {LEASE_SECONDS_MAX} seconds, "
                             f"not {seconds}")
        return cls(lease=seconds, renew_deadline=seconds * 2 / 3, retry=seconds * 2 / 15)


def identity() -> str:
    """This process's name in the Lease: its pod (``POD_NAME``, from the
    downward API; else the host name) and a random suffix, so a restarted
    container is a new candidate, as in client-go."""
    pod = os.environ.get("POD_NAME") or socket.gethostname()
    return f"{pod}_{uuid.uuid4().hex[:8]}"


def _stamp(now_wall: float) -> str:
    """A MicroTime, as the API writes it."""
    t = time.gmtime(now_wall)
    return time.strftime("%Y-%m-%dT%H:%M:%S", t) + f".{int(now_wall % 1 * 1_000_000):06d}Z"


def is_free(lease: Mapping[str, Any] | None, seen_for: float, default_seconds: float) -> bool:
    """Nobody holds ``lease``: it does not exist, has no holder, or its holder
    and renew time have not changed for its duration (:func:`lease_seconds`)
    by the candidate's clock (``seen_for``). Pure."""
    spec = (lease or {}).get("spec") or {}
    if not spec.get("holderIdentity"):
        return True
    return seen_for >= lease_seconds(spec, default_seconds)


def claim(lease: Mapping[str, Any] | None, me: str, seen_for: float, now_wall: float, duration: float,
          *, namespace: str, name: str) -> dict | None:
    """The Lease to write for ``me`` to lead, or None while another holds it. Pure.

    ``lease``: as read (None: it does not exist; the result is then to be
    created). ``seen_for``: seconds since this candidate first saw the
    Lease's current holder and renew time, by its own clock.
    """
    if lease is None:
        spec: dict[str, Any] = {}
        out: dict[str, Any] = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                               "metadata": {"name": name, "namespace": namespace}}
    else:
        spec = dict(lease.get("spec") or {})
        out = {k: v for k, v in lease.items() if k != "spec"}
        out.setdefault("apiVersion", "coordination.k8s.io/v1")
        out.setdefault("kind", "Lease")
    holder = spec.get("holderIdentity") or ""
    if holder and holder != me and not is_free(lease, seen_for, duration):
        return None
    stamp = _stamp(now_wall)
    transitions = int(spec.get("leaseTransitions") or 0)
    out["spec"] = {
        "holderIdentity": me,
        "leaseDurationSeconds": max(1, int(round(duration))),
        "acquireTime": spec.get("acquireTime") if holder == me and spec.get("acquireTime") else stamp,
        "renewTime": stamp,
        "leaseTransitions": transitions if holder == me else (transitions + 1 if lease is not None else 0),
    }
    return out


def released(lease: Mapping[str, Any], now_wall: float) -> dict:
    """``lease`` given up: no holder, and a one-second duration. Pure."""
    out = dict(lease)
    spec = dict(lease.get("spec") or {})
    spec.pop("holderIdentity", None)
    spec |= {"leaseDurationSeconds": 1, "renewTime": _stamp(now_wall)}
    out["spec"] = spec
    return out


def _holder_and_renewal(lease: Mapping[str, Any] | None) -> tuple[str, str]:
    """What a standby watches change: the holder and the renew time ("" when absent)."""
    spec = (lease or {}).get("spec") or {}
    return spec.get("holderIdentity") or "", spec.get("renewTime") or ""


class Elector:
    """Holds ``namespace/name`` for this process while it can; see the module docstring.

    :attr:`leading` is True while the last renewal is younger than the
    renew deadline. ``on_lost`` is called once, from a watchdog thread,
    when a leader passes its renew deadline; the commands exit there.
    """

    def __init__(self, kube: Kube, namespace: str, name: str, component: str, *, me: str | None = None,
                 timing: Timing = Timing(), on_lost: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 legacy: str | None = None):
        self.kube, self.namespace, self.name, self.component = kube, namespace, name, component
        #: A Lease that must be free before this candidate first leads (the
        #: name older versions used; None: none, or the same name).
        self.legacy = legacy if legacy != name else None
        self._legacy_seen: tuple[str, str] | None = None
        self._legacy_seen_at = clock()
        self.me = me or identity()
        self.timing = timing
        self.on_lost = on_lost
        self.clock, self.wall = clock, wall
        #: Who holds the Lease, as last read ("" when nobody).
        self.holder = ""
        #: When the elector last finished a try, for health checks.
        self.last_try = clock()
        self._seen: tuple[str, str] | None = None
        self._seen_at = clock()
        self._renewed_at: float | None = None
        self._lost = False
        self._stop = threading.Event()
        self._became = threading.Event()
        self._threads: list[threading.Thread] = []
        LEADER.labels(component, name).set(0)

    @property
    def leading(self) -> bool:
        return (not self._lost and self._renewed_at is not None
                and self.clock() - self._renewed_at < self.timing.renew_deadline)

    def _time_left(self, now: float) -> float:
        """How long this try's requests may take, together: what is left of the
        renew deadline while leading, the whole renew deadline otherwise."""
        if self._renewed_at is not None and not self._lost:
            return max(self._renewed_at + self.timing.renew_deadline - now, 0.05)
        return self.timing.renew_deadline

    def _legacy_free(self, deadline: float) -> bool:
        """The older versions' Lease is free (read once a try until this candidate first leads)."""
        if self.legacy is None or self._renewed_at is not None:  # it has led: the Lease is its own
            return True
        lease = self.kube.get("Lease", self.namespace, self.legacy, timeout=max(deadline - self.clock(), 0.05))
        key = _holder_and_renewal(lease)
        if key != self._legacy_seen:
            self._legacy_seen, self._legacy_seen_at = key, self.clock()
        if is_free(lease, self.clock() - self._legacy_seen_at, self.timing.lease):
            return True
        self.holder = key[0]
        return False

    def try_once(self) -> bool:
        """One read and, when the rule allows, one write. True when this process now holds the Lease."""
        now = self.clock()
        deadline = now + self._time_left(now)

        def left() -> float:
            return max(deadline - self.clock(), 0.05)

        try:
            if not self._legacy_free(deadline):
                return False
            lease = self.kube.get("Lease", self.namespace, self.name, timeout=left())
            key = _holder_and_renewal(lease)
            if key != self._seen:
                self._seen, self._seen_at = key, now
            self.holder = key[0]
            body = claim(lease, self.me, now - self._seen_at, self.wall(), self.timing.lease,
                         namespace=self.namespace, name=self.name)
            if body is None:
                return False
            if lease is None:
                written = self.kube.create(body, timeout=left())
            else:
                written = self.kube.replace(body, timeout=left())
        except Exception as exc:  # noqa: BLE001 - unreachable API server: retry, lose by the deadline
            # A 409: another candidate wrote first; the next try reads its write.
            if not (isinstance(exc, ApiError) and exc.conflict):
                log.warning("lease not read or written", lease=f"{self.namespace}/{self.name}", error=str(exc))
            return False
        finally:
            self.last_try = self.clock()
        self._seen, self._seen_at = _holder_and_renewal(written), now
        self.holder = self.me
        self._renewed_at = now
        return True

    def _loop(self) -> None:
        while not self._stop.is_set() and not self._lost:
            was = self._became.is_set()
            if self.try_once() and not was and not self._lost:
                log.info("leading", lease=f"{self.namespace}/{self.name}", identity=self.me)
                LEADER.labels(self.component, self.name).set(1)
                self._became.set()
            self._stop.wait(self.timing.retry)

    def _watchdog(self) -> None:
        while not self._stop.wait(0.2):
            if self._became.is_set() and not self.leading and not self._lost:
                self._lost = True
                LEADER.labels(self.component, self.name).set(0)
                log.error("lost the lease: no renewal within the renew deadline; stopping",
                          lease=f"{self.namespace}/{self.name}", identity=self.me,
                          renew_deadline=self.timing.renew_deadline)
                if self.on_lost is not None:
                    self.on_lost()
                return

    def start(self) -> Elector:
        for target, what in ((self._loop, "lease"), (self._watchdog, "lease-watchdog")):
            t = threading.Thread(target=target, daemon=True, name=what)
            t.start()
            self._threads.append(t)
        return self

    def wait_leading(self, stopped: Callable[[], bool], *, progress: float = 30.0) -> bool:
        """Block until this process leads (True) or ``stopped()`` (False), saying who leads meanwhile."""
        said = self.clock() - progress
        while not self._became.wait(0.5):
            if stopped():
                return False
            if self.clock() - said >= progress:
                said = self.clock()
                log.info("standing by", lease=f"{self.namespace}/{self.name}", leader=self.holder or None,
                         identity=self.me)
        return True

    def stop(self) -> None:
        """Stop trying; a leader releases the Lease so that a standby takes over at once."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout=self.timing.retry + self.kube.timeout)
        if self._became.is_set() and self.leading:
            try:
                lease = self.kube.get("Lease", self.namespace, self.name)
                if lease and (lease.get("spec") or {}).get("holderIdentity") == self.me:
                    self.kube.replace(released(lease, self.wall()))
                    log.info("released the lease", lease=f"{self.namespace}/{self.name}", identity=self.me)
            except Exception as exc:  # noqa: BLE001 - a standby takes it after the lease duration anyway
                log.warning("lease not released", lease=f"{self.namespace}/{self.name}", error=str(exc))
        self._lost = True
        LEADER.labels(self.component, self.name).set(0)


def _exit_lost() -> None:
    """A leader that lost its Lease exits at once, as client-go's callers do:
    whatever it was doing stops before a standby can start, and the kubelet
    restarts it as a standby."""
    os._exit(1)


def lead(kubeconfig: str | None, namespace: str, name: str, component: str, health: Health,
         stopped: Callable[[], bool], *, timing: Timing = Timing(),
         on_lost: Callable[[], None] = _exit_lost, legacy: str | None = None) -> Elector | None:
    """Stand by until this process holds ``namespace/name`` (and ``legacy`` is
    free); the Elector (renewing in its threads), or None when ``stopped()``
    first. ``health`` watches its tries and says who leads."""
    elector = Elector(Kube.from_kubeconfig(kubeconfig, timeout=timing.renew_deadline), namespace, name, component,
                      timing=timing, on_lost=on_lost, legacy=legacy)
    health.watch("leaseTry", lambda: elector.last_try, stale=max(30.0, 5 * timing.retry + elector.kube.timeout))
    health.describe(lambda: {"leading": elector.leading, "leader": elector.holder or None,
                             "identity": elector.me})
    log.info("standing by for the lease", lease=f"{namespace}/{name}", identity=elector.me)
    elector.start()
    if not elector.wait_leading(stopped):
        elector.stop()
        return None
    return elector
