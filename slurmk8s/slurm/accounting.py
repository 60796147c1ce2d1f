"""Associations and QOS: what the cluster should hold, what slurmdbd holds,
and the ``sacctmgr`` commands from one to the other. Pure.

:class:`Associations` is the wanted state (the operator builds it from
``spec.accounting`` and ``spec.login.users``, the agent receives it as JSON);
:func:`parse_state` reads what ``sacctmgr -n -P show ...`` printed;
:func:`commands` is the difference, as sacctmgr argv lists. Commands only
add and modify: a user removed from the spec keeps the association and so
the history, and nothing a site added by hand is removed. Applying the
commands and reading again yields no commands (idempotent).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Mapping

__all__ = ["QosLimits", "Associations", "State", "commands", "parse_state", "STATE_QUERIES",
           "minutes", "DEFAULT_QOS"]

#: Names sacctmgr stores (it lower-cases account and QOS names); users as POSIX names.
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
_CLUSTER = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
#: Every association has Slurm's default QOS.
DEFAULT_QOS = "normal"


def _check(pattern: re.Pattern, value: object, what: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise ValueError(f"{value!r} is not a valid {what}")
    return value


def minutes(text: str) -> int | None:
    """A Slurm time (``10``, ``4:00:00``, ``2-00:00:00``, ``UNLIMITED``, empty) in minutes; None unlimited."""
    text = text.strip()
    if not text or text.upper() in ("UNLIMITED", "INFINITE"):
        return None
    days = 0
    if "-" in text:
        d, text = text.split("-", 1)
        days = int(d)
    parts = [int(p) for p in text.split(":")] if text else [0]
    if days:  # D-HH[:MM[:SS]]
        h, m, s = (parts + [0, 0])[:3]
    elif len(parts) == 1:  # minutes
        h, m, s = 0, parts[0], 0
    elif len(parts) == 2:  # MM:SS
        h, m, s = 0, parts[0], parts[1]
    else:  # HH:MM:SS
        h, m, s = parts[:3]
    return days * 1440 + h * 60 + m + (1 if s else 0)


@dataclass(frozen=True)
class QosLimits:
    name: str
    priority: int = 0
    max_wall: int | None = None  # minutes
    max_jobs_per_user: int | None = None
    max_submit_jobs_per_user: int | None = None

    def settings(self) -> dict[str, str]:
        """sacctmgr's ``set`` words; -1 clears a limit."""
        def value(v: int | None) -> str:
            return "-1" if v is None else str(v)
        return {"Priority": str(self.priority), "MaxWall": value(self.max_wall),
                "MaxJobsPerUser": value(self.max_jobs_per_user),
                "MaxSubmitJobsPerUser": value(self.max_submit_jobs_per_user)}


@dataclass(frozen=True)
class Associations:
    """What the cluster's accounting should hold."""

    cluster: str
    accounts: tuple[str, ...] = ()
    #: (user, default account)
    users: tuple[tuple[str, str], ...] = ()
    qos: tuple[QosLimits, ...] = ()

    def to_json(self) -> dict:
        return {"cluster": self.cluster, "accounts": list(self.accounts),
                "users": [list(u) for u in self.users], "qos": [asdict(q) for q in self.qos]}

    @classmethod
    def from_json(cls, data: Mapping) -> "Associations":
        """Checked: every name must be one sacctmgr stores as is (the agent's input)."""
        if not isinstance(data, Mapping):
            raise ValueError("associations must be a JSON object")
        cluster = _check(_CLUSTER, data.get("cluster"), "cluster name")
        accounts = tuple(_check(_NAME, a, "account name") for a in data.get("accounts") or [])
        users = []
        for u in data.get("users") or []:
            if not isinstance(u, (list, tuple)) or len(u) != 2:
                raise ValueError(f"{u!r} is not a [user, account] pair")
            users.append((_check(_USER, u[0], "user name"), _check(_NAME, u[1], "account name")))
        qos = []
        for q in data.get("qos") or []:
            if not isinstance(q, Mapping):
                raise ValueError(f"{q!r} is not a QOS object")
            limits = {}
            for k in ("priority", "max_wall", "max_jobs_per_user", "max_submit_jobs_per_user"):
                v = q.get(k)
                if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= 10**9):
                    raise ValueError(f"QOS {q.get('name')!r}: {k} must be a whole number")
                limits[k] = v
            qos.append(QosLimits(name=_check(_NAME, q.get("name"), "QOS name"),
                                 priority=limits["priority"] or 0,
                                 **{k: limits[k] for k in limits if k != "priority"}))
        for _, account in users:
            if account not in accounts:
                raise ValueError(f"account {account!r} of a user is not among the accounts")
        return cls(cluster, accounts, tuple(users), tuple(qos))


@dataclass
class State:
    """What slurmdbd holds for one cluster (from sacctmgr's parsable output)."""

    clusters: set[str] = field(default_factory=set)
    accounts: set[str] = field(default_factory=set)
    #: (user, account) -> the association's QOS names
    associations: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    default_account: dict[str, str] = field(default_factory=dict)
    qos: dict[str, QosLimits] = field(default_factory=dict)


#: The reads :func:`parse_state` takes, by name (sacctmgr -n -P argv, the cluster filled in).
STATE_QUERIES = {
    "clusters": ("show", "cluster", "format=cluster"),
    "associations": ("show", "assoc", "format=account,user,qos", "cluster={cluster}"),
    "users": ("show", "user", "format=user,defaultaccount"),
    "qos": ("show", "qos", "format=name,priority,maxwall,maxjobspu,maxsubmitpu"),
}


def _rows(text: str) -> list[list[str]]:
    return [line.split("|") for line in text.splitlines() if line.strip()]


def _int(text: str) -> int | None:
    return int(text) if text.strip() else None


def parse_state(outputs: Mapping[str, str]) -> State:
    """State from the output of each of :data:`STATE_QUERIES`."""
    s = State()
    s.clusters = {r[0] for r in _rows(outputs["clusters"])}
    for r in _rows(outputs["associations"]):
        account, user, qos = (r + ["", "", ""])[:3]
        s.accounts.add(account)
        if user:
            s.associations[(user, account)] = {q for q in qos.split(",") if q}
    for r in _rows(outputs["users"]):
        if len(r) >= 2 and r[1]:
            s.default_account[r[0]] = r[1]
    for r in _rows(outputs["qos"]):
        name, priority, wall, jobs, submit = (r + [""] * 5)[:5]
        s.qos[name] = QosLimits(name, _int(priority) or 0, minutes(wall), _int(jobs), _int(submit))
    return s


def commands(want: Associations, have: State) -> list[list[str]]:
    """The sacctmgr commands (argv, ``-i``: no confirmation) that make ``have`` hold ``want``."""
    c = want.cluster
    out: list[list[str]] = []
    if c not in have.clusters:
        out.append(["sacctmgr", "-i", "add", "cluster", c])
    for q in want.qos:
        current = have.qos.get(q.name)
        if current is None:
            out.append(["sacctmgr", "-i", "add", "qos", q.name])
        if current != q:
            out.append(["sacctmgr", "-i", "modify", "qos", "where", f"name={q.name}", "set",
                        *(f"{k}={v}" for k, v in q.settings().items())])
    for account in want.accounts:
        if account not in have.accounts:
            out.append(["sacctmgr", "-i", "add", "account", account, f"cluster={c}"])
    qos_names = sorted({DEFAULT_QOS, *(q.name for q in want.qos)})
    for user, account in want.users:
        assoc = have.associations.get((user, account))
        if assoc is None:
            out.append(["sacctmgr", "-i", "add", "user", user, f"account={account}", f"cluster={c}",
                        f"defaultaccount={account}", f"qos={','.join(qos_names)}"])
            continue
        if have.default_account.get(user) != account:
            out.append(["sacctmgr", "-i", "modify", "user", "where", f"name={user}", f"cluster={c}",
                        "set", f"defaultaccount={account}"])
        missing = [q for q in qos_names if q not in assoc]
        if missing:
            out.append(["sacctmgr", "-i", "modify", "user", "where", f"name={user}", f"account={account}",
                        f"cluster={c}", "set", f"qos+={','.join(missing)}"])
    return out
