"""The site's directory as the cluster sees it (``spec.identity.ldap``). Pure but for
:func:`read_verdict` and :func:`read_groups`.

The sssd container beside slurmctld probes the directory every
``render.identity.PROBE_SECONDS`` (images/sssd/probe.sh: a TCP connection, TLS
checked against the cluster's CA, and a bind as sssd binds) and writes its
verdict, and the members of the groups accounts follow, into the socket
directory it shares with the agent. The agent reads it (``GET /v1/directory``), and the
operator turns it into the DirectoryReady condition and an Event when it
changes (operator/directory.py). A verdict older than :data:`STALE_SECONDS`,
or none, is unknown: the condition says so and nothing else follows from it.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from ..api.fields import POSIX_NAME_RE

__all__ = ["Verdict", "VERDICT_FILE", "GROUPS_FILE", "GROUPS_MAX_BYTES", "STALE_SECONDS", "parse_verdict",
           "read_verdict", "Groups", "parse_groups", "read_groups", "STATES"]

#: Where the sssd container writes its verdict (images/sssd/entrypoint.sh), in the pod's
#: /var/lib/sss/pipes emptyDir, which the agent mounts read-only.
VERDICT_FILE = "/var/lib/sss/pipes/slurmk8s-directory"
#: Beside it, the members of the groups accounts follow, as the directory lists them (memberUid).
GROUPS_FILE = "/var/lib/sss/pipes/slurmk8s-groups"
#: The most of the group list the agent reads: a longer one is not read at all (its members
#: after the cut would read as gone, and be closed).
GROUPS_MAX_BYTES = 4 * 1024 * 1024
#: Several missed probes: the sssd container is not probing (stopped, or not started yet).
STALE_SECONDS = 60
STATES = ("ok", "unreachable", "tls", "bind", "error", "unknown")
_MAX_BYTES = 4096
_LINE = re.compile(r"(state|uri|message)=([ -~]*)")


@dataclass(frozen=True)
class Verdict:
    state: str
    message: str
    uri: str = ""
    #: POSIX seconds of the probe, 0 when unknown
    checked: float = 0.0

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping) -> Verdict:
        state = data.get("state")
        if state not in STATES:
            raise ValueError(f"{state!r} is not a directory state ({', '.join(STATES)})")
        return cls(state, str(data.get("message", ""))[:1024], str(data.get("uri", ""))[:512],
                   float(data.get("checked") or 0))


def parse_verdict(text: str, checked: float, now: float) -> Verdict:
    """The probe's file (``state=``, ``uri=``, ``message=`` lines), written at ``checked``."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        m = _LINE.fullmatch(line)
        if m is None:
            return Verdict("unknown", f"the probe wrote an unreadable line: {line[:80]!r}", checked=checked)
        fields[m.group(1)] = m.group(2)
    state = fields.get("state", "")
    if state not in STATES:
        return Verdict("unknown", f"the probe wrote no known state ({state[:20]!r})", checked=checked)
    if now - checked > STALE_SECONDS:
        return Verdict("unknown", f"the sssd container last probed the directory {now - checked:.0f} s ago",
                       fields.get("uri", ""), checked)
    return Verdict(state, fields.get("message", ""), fields.get("uri", ""), checked)


def _read_small(path: str, limit: int) -> tuple[str, float]:
    """A plain file's text and mtime, opened without following a link. Raises OSError,
    also for a file longer than ``limit`` bytes (EFBIG): a part of it is never read as all."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(0, "not a plain file")
        data = b""
        while len(data) <= limit and (chunk := os.read(fd, limit + 1 - len(data))):
            data += chunk
        if len(data) > limit:
            raise OSError(errno.EFBIG, f"longer than {limit} bytes")
        return data.decode("ascii", errors="replace"), st.st_mtime
    finally:
        os.close(fd)


def read_verdict(path: str = VERDICT_FILE, now: float | None = None) -> Verdict:
    """The verdict in ``path``, opened without following a link (the file is the sssd container's)."""
    now = time.time() if now is None else now
    try:
        text, checked = _read_small(path, _MAX_BYTES)
    except FileNotFoundError:
        return Verdict("unknown", "the sssd container has not probed the directory yet")
    except OSError as exc:
        return Verdict("unknown", f"the probe's verdict cannot be read: {exc.strerror}")
    return parse_verdict(text, checked, now)


_GROUP_LINE = re.compile(rf"({POSIX_NAME_RE}):([ -~]*)")
_MEMBER = re.compile(POSIX_NAME_RE)


@dataclass(frozen=True)
class Groups:
    """The followed groups as the probe listed them (probe.sh: ``name:member,member`` lines)."""

    #: group -> its members that are user names (api/fields.py, POSIX_NAME_RE)
    members: dict[str, list[str]]
    #: group -> the members left out because they are no user name (shown quoted, shortened)
    invalid: dict[str, list[str]]


def parse_groups(text: str) -> Groups:
    """The groups of the probe's lines. A member whose name is no user name (a space, a
    leading '-', a value the directory gave in base64) is left out and reported; the rest of
    its group still counts. A line of another shape is left out, so its group reads as not
    found (unknown: nothing in it is closed)."""
    members: dict[str, list[str]] = {}
    invalid: dict[str, list[str]] = {}
    for line in text.splitlines():
        m = _GROUP_LINE.fullmatch(line)
        if m is None:
            continue
        found = [u for u in m.group(2).split(",") if u]
        members[m.group(1)] = [u for u in found if _MEMBER.fullmatch(u)]
        bad = [repr(u[:40]) for u in found if not _MEMBER.fullmatch(u)]
        if bad:
            invalid[m.group(1)] = bad
    return Groups(members, invalid)


def read_groups(path: str = GROUPS_FILE, now: float | None = None) -> Groups | None:
    """The members of the followed groups, None when the list is missing, longer than
    :data:`GROUPS_MAX_BYTES` or older than :data:`STALE_SECONDS` (the directory away, or no
    bind): what it says is then unknown, and nobody is closed for it."""
    now = time.time() if now is None else now
    try:
        text, written = _read_small(path, GROUPS_MAX_BYTES)
    except OSError:
        return None
    return parse_groups(text) if now - written <= STALE_SECONDS else None
