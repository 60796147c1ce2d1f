"""Associations and QOS: what the cluster should hold, what slurmdbd holds,
and the ``sacctmgr`` commands from one to the other. Pure.

:class:`Associations` is the wanted state (the operator builds it from
``spec.accounting`` and ``spec.login.users``, the agent receives it as JSON);
:func:`with_members` adds the members of the directory groups an account
follows, as the agent resolved them; :func:`parse_state` reads what
``sacctmgr -n -P show ...`` printed; :func:`commands` is the difference, as
sacctmgr argv lists. Commands only add and modify: a user removed from the
spec keeps the association and so the history, and nothing a site added by
hand is removed. In an account that follows groups, an association of
someone no longer wanted there is closed (MaxSubmitJobs=0: no new job, the
history stays) and opened again (-1) if they come back. Applying the
commands and reading again yields no commands (idempotent).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace

from ..api.fields import POSIX_NAME_RE, RESERVED_USERS, SACCTMGR_NAME_RE
from .errors import InvalidArgument

__all__ = ["QosLimits", "Associations", "State", "commands", "parse_state", "STATE_QUERIES",
           "minutes", "DEFAULT_QOS", "with_members"]

#: Names sacctmgr stores (accounts, QOS, the cluster; it lower-cases them); users and the
#: spec's groups as POSIX names.
_NAME = re.compile(SACCTMGR_NAME_RE)
_USER = re.compile(POSIX_NAME_RE)
#: Every association has Slurm's default QOS.
DEFAULT_QOS = "normal"


def _check(pattern: re.Pattern, value: object, what: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise InvalidArgument(f"{value!r} is not a valid {what}")
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
    #: (user, account) associations; a user's first is the user's default account
    users: tuple[tuple[str, str], ...] = ()
    qos: tuple[QosLimits, ...] = ()
    #: (account, directory groups): the account holds the groups' members (:func:`with_members`)
    groups: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def to_json(self) -> dict:
        return {"cluster": self.cluster, "accounts": list(self.accounts),
                "users": [list(u) for u in self.users], "qos": [asdict(q) for q in self.qos],
                "groups": {account: list(groups) for account, groups in self.groups}}

    @classmethod
    def from_json(cls, data: Mapping) -> Associations:
        """Checked: every name must be one sacctmgr stores as is (the agent's input)."""
        if not isinstance(data, Mapping):
            raise InvalidArgument("associations must be a JSON object")
        cluster = _check(_NAME, data.get("cluster"), "cluster name")
        accounts = tuple(_check(_NAME, a, "account name") for a in data.get("accounts") or [])
        users = []
        for u in data.get("users") or []:
            if not isinstance(u, (list, tuple)) or len(u) != 2:
                raise InvalidArgument(f"{u!r} is not a [user, account] pair")
            users.append((_check(_USER, u[0], "user name"), _check(_NAME, u[1], "account name")))
        qos = []
        for q in data.get("qos") or []:
            if not isinstance(q, Mapping):
                raise InvalidArgument(f"{q!r} is not a QOS object")
            limits = {}
            for k in ("priority", "max_wall", "max_jobs_per_user", "max_submit_jobs_per_user"):
                v = q.get(k)
                if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= 10**9):
                    raise InvalidArgument(f"QOS {q.get('name')!r}: {k} must be a whole number")
                limits[k] = v
            qos.append(QosLimits(name=_check(_NAME, q.get("name"), "QOS name"),
                                 priority=limits["priority"] or 0,
                                 **{k: limits[k] for k in limits if k != "priority"}))
        for _, account in users:
            if account not in accounts:
                raise InvalidArgument(f"account {account!r} of a user is not among the accounts")
        if len(set(users)) != len(users):
            raise InvalidArgument("a [user, account] pair is listed twice")
        raw = data.get("groups") or {}
        if not isinstance(raw, Mapping):
            raise InvalidArgument("groups must be an object of account: [group, ...]")
        groups = []
        for account, names in raw.items():
            if _check(_NAME, account, "account name") not in accounts:
                raise InvalidArgument(f"account {account!r} of groups is not among the accounts")
            if not isinstance(names, list) or not names:
                raise InvalidArgument(f"the groups of account {account!r} must be a list of group names")
            groups.append((account, tuple(_check(_USER, g, "group name") for g in names)))
        return cls(cluster, accounts, tuple(users), tuple(qos), tuple(groups))


def with_members(want: Associations, members: Mapping[str, Sequence[str] | None], users: set[str]
                 ) -> tuple[Associations, dict[str, frozenset[str]]]:
    """``want`` with an association for each member of the groups its accounts follow,
    and the accounts whose every group is known, each with the users it may hold.

    ``members``: each group's members as the directory lists them, None where the
    group could not be read; ``users``: the members that resolve to users, the only
    ones given an association (Slurm maps a user's name to a uid). An account with a
    group not read is not in the second value: nothing in it is closed while what the
    directory says is unknown (fail closed); its known members are still added. A
    listed member whose user does not resolve now is not closed either. A user's
    default account stays the one ``want`` gives, else the first account (in
    ``want.accounts`` order) of a group the user is in. A member named like a
    login user or a system account is not the directory's (login.users win, and
    sssd does not read such entries): the directory gives them no account."""
    pairs = list(want.users)
    order = {a: i for i, a in enumerate(want.accounts)}
    managed: dict[str, frozenset[str]] = {}
    added: list[tuple[str, str]] = []
    local = {u for u, _ in want.users} | RESERVED_USERS
    for account, groups in sorted(want.groups, key=lambda g: order.get(g[0], len(order))):
        found = [members.get(g) for g in groups]
        listed = {u for m in found if m is not None for u in m if _USER.fullmatch(u) and u not in local}
        added += [(u, account) for u in sorted(listed & users) if (u, account) not in pairs]
        if all(m is not None for m in found):
            managed[account] = frozenset(listed) | {u for u, a in want.users if a == account}
    # Every user's spec association first (their default), then the directory's in account order.
    return replace(want, users=tuple(dict.fromkeys([*pairs, *added]))), managed


@dataclass
class State:
    """What slurmdbd holds for one cluster (from sacctmgr's parsable output)."""

    clusters: set[str] = field(default_factory=set)
    accounts: set[str] = field(default_factory=set)
    #: (user, account) -> the association's QOS names
    associations: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    #: (user, account) of the associations closed to new jobs (MaxSubmitJobs=0)
    closed: set[tuple[str, str]] = field(default_factory=set)
    default_account: dict[str, str] = field(default_factory=dict)
    qos: dict[str, QosLimits] = field(default_factory=dict)


#: The reads :func:`parse_state` takes, by name (sacctmgr -n -P argv, the cluster filled in).
STATE_QUERIES = {
    "clusters": ("show", "cluster", "format=cluster"),
    "associations": ("show", "assoc", "format=account,user,qos,maxsubmit", "cluster={cluster}"),
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
        account, user, qos, submit = (r + ["", "", "", ""])[:4]
        s.accounts.add(account)
        if user:
            s.associations[(user, account)] = {q for q in qos.split(",") if q}
            if submit.strip() == "0":
                s.closed.add((user, account))
    for r in _rows(outputs["users"]):
        if len(r) >= 2 and r[1]:
            s.default_account[r[0]] = r[1]
    for r in _rows(outputs["qos"]):
        name, priority, wall, jobs, submit = (r + [""] * 5)[:5]
        s.qos[name] = QosLimits(name, _int(priority) or 0, minutes(wall), _int(jobs), _int(submit))
    return s


def commands(want: Associations, have: State, managed: Mapping[str, frozenset[str]] | None = None
             ) -> list[list[str]]:
    """The sacctmgr commands (argv, ``-i``: no confirmation) that make ``have`` hold ``want``;
    ``managed``: the accounts that follow directory groups, each with the users it may hold
    (:func:`with_members`), where every other association is closed."""
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
    default: dict[str, str] = {}
    followed = {account for account, _ in want.groups}
    for user, account in want.users:
        default.setdefault(user, account)
    known = {user for user, _ in have.associations}
    for user, account in want.users:
        assoc = have.associations.get((user, account))
        if assoc is None:
            # A user's default is set on their first association only, and changed with `modify`
            # after: an `add` that changes it leaves slurmctld with none (26.05), and a job
            # without --account is then refused.
            first = [f"defaultaccount={default[user]}"] if user not in known else []
            known.add(user)
            out.append(["sacctmgr", "-i", "add", "user", user, f"account={account}", f"cluster={c}",
                        *first, f"qos={','.join(qos_names)}"])
            if first:
                continue
        if default[user] == account and have.default_account.get(user) != account:
            out.append(["sacctmgr", "-i", "modify", "user", "where", f"name={user}", f"cluster={c}",
                        "set", f"defaultaccount={account}"])
        if (user, account) in have.closed and account in followed:  # back in a group
            out.append(_submit_limit(user, account, c, -1))
        if assoc is None:
            continue
        missing = [q for q in qos_names if q not in assoc]
        if missing:
            out.append(["sacctmgr", "-i", "modify", "user", "where", f"name={user}", f"account={account}",
                        f"cluster={c}", "set", f"qos+={','.join(missing)}"])
    wanted = set(want.users)
    for (user, account) in sorted(have.associations):
        allowed = (managed or {}).get(account)
        if allowed is not None and user not in allowed and (user, account) not in wanted \
                and (user, account) not in have.closed:
            out.append(_submit_limit(user, account, c, 0))
    return out


def _submit_limit(user: str, account: str, cluster: str, limit: int) -> list[str]:
    """Close (0) or open again (-1: no limit) one association to new jobs."""
    return ["sacctmgr", "-i", "modify", "user", "where", f"name={user}", f"account={account}",
            f"cluster={cluster}", "set", f"maxsubmitjobs={limit}"]
