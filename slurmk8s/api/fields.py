"""Constrained string types shared by the API models.

Every user string that can reach slurm.conf, a hostname, a file path or a
shell passes through one of these checks. Each check raises an error whose
message quotes the offending value (JSON-style, so a newline shows as ``\\n``)
and says why it was refused; :mod:`slurmk8s.api.errors` prefixes the field
path, giving messages like::

    spec.partitions[1].name: "gpu\\nProlog=/x" contains a newline

How a value is checked and a refusal quoted is :mod:`.refusals`; resource
quantities are :mod:`.quantities`; what callers use of them is re-exported here.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated

from pydantic import AfterValidator, Field

from .. import versions
from .quantities import Quantity, parse_quantity, quantity_value
from .refusals import bad_char, constrained, escape, pattern_check, quote, refuse, schema_pattern, unprintable

__all__ = [
    "Cidr",
    "PortRange",
    "ClusterName",
    "MemberName",
    "PartitionName",
    "RESERVED_NAMES",
    "ExtraLine",
    "DnsLabel", "NamespaceName",
    "SlurmName",
    "SlurmWord",
    "SlurmDuration",
    "Quantity",
    "LabelKey",
    "LabelValue",
    "PosixUser",
    "POSIX_NAME_RE", "RESERVED_USERS", "SYSTEM_GROUPS", "PERSON_ID_MIN", "SYSTEM_ID_BLOCK", "PERSON_ID_LOW_MAX",
    "AbsPath",
    "SshPublicKey",
    "SlurmVersion",
    "credential_host",
    "quote",
    "refuse",
    "parse_quantity",
    # Re-exported from .refusals and .quantities, where they live.
    "unprintable", "escape", "constrained", "quantity_value",
]


DNS_LABEL_RE = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"

#: Becomes part of Kubernetes object names and Slurm node host names.
DnsLabel = Annotated[
    str,
    AfterValidator(
        pattern_check(
            DNS_LABEL_RE,
            "use lower-case letters, digits and '-', starting and ending with a letter or digit "
            "(a DNS-1123 label)",
            40,
        )
    ),
    schema_pattern(f"^{DNS_LABEL_RE}$", 40),
]

#: A Kubernetes namespace's name (a DNS-1123 label of at most 63 characters).
NamespaceName = Annotated[
    str,
    AfterValidator(
        pattern_check(
            DNS_LABEL_RE,
            "use lower-case letters, digits and '-', starting and ending with a letter or digit "
            "(a namespace's name)",
            63,
        )
    ),
    schema_pattern(f"^{DNS_LABEL_RE}$", 63),
]

DNS_1035_RE = r"[a-z]([-a-z0-9]*[a-z0-9])?"

#: The SlurmCluster's name. It prefixes every object, Services included, whose
#: names must start with a letter (DNS-1035).
ClusterName = Annotated[
    str,
    AfterValidator(
        pattern_check(
            DNS_1035_RE,
            "use lower-case letters, digits and '-', starting with a letter and ending with a "
            "letter or digit (a DNS-1035 label: it prefixes Service names)",
            40,
        )
    ),
    schema_pattern(f"^{DNS_1035_RE}$", 40),
]

#: The first word of every name slurmk8s puts after ``<cluster>-`` for its own
#: objects (slurmk8s.render.names: controller, workers, login, restapi,
#: slurmdbd, mariadb, slurm-config, users, munge-key, jwt-key, ssh-host-keys,
#: agent-token, db-password, the lent pods' "lent"), and words Slurm reads
#: specially in a node list or a partition line. A node set or volume may not
#: take one (see :data:`MemberName`): every object of a cluster is then
#: ``<cluster>-<first word>...`` with a first word that says whose it is.
#: tests/test_names.py checks that the renderer uses no other word.
RESERVED_NAMES = frozenset(
    "controller workers login restapi slurmdbd mariadb slurm users munge jwt ssh agent db lent sssd "
    "all default none".split()
)
MEMBER_NAME_RE = r"[a-z][a-z0-9]*"


def _member_name(value: str) -> str:
    pattern_check(
        MEMBER_NAME_RE,
        "use lower-case letters and digits, starting with a letter (no '-': the name follows "
        "'<cluster>-' in object names, and a '-' would let it collide with another cluster's "
        "objects)",
        20,
    )(value)
    if value in RESERVED_NAMES:
        raise refuse(value, "is a reserved name (slurmk8s's own objects and Slurm's keywords use "
                     f"{', '.join(sorted(RESERVED_NAMES))}); choose another")
    return value


#: A node set or shared volume name: one word that follows ``<cluster>-`` in
#: object names. Without '-' in it, ``<cluster>-<name>`` names exactly one
#: pair, so no two clusters' objects in a namespace can share a name.
MemberName = Annotated[
    str, AfterValidator(_member_name), schema_pattern(f"^{MEMBER_NAME_RE}$", 20)
]

SLURM_NAME_RE = r"[A-Za-z0-9][A-Za-z0-9_.-]*"

#: A Slurm partition, feature or GRES type name.
SlurmName = Annotated[
    str,
    AfterValidator(
        pattern_check(
            SLURM_NAME_RE,
            "use letters, digits, '_', '.' and '-', starting with a letter or digit",
            64,
        )
    ),
    schema_pattern(f"^{SLURM_NAME_RE}$", 64),
]

SLURM_WORD_RE = r"[a-z_][a-z0-9_]*(=[A-Za-z0-9_.:/-]+)?"

#: One item of a comma-separated Slurm option list, such as ``bf_continue``
#: or ``bf_max_job_test=500``. '=' is allowed once, after the option name.
SlurmWord = Annotated[
    str,
    AfterValidator(
        lambda v: _slurm_word(v),
    ),
    schema_pattern(f"^{SLURM_WORD_RE}$", 128),
]


def _partition_name(value: str) -> str:
    pattern_check(
        SLURM_NAME_RE, "use letters, digits, '_', '.' and '-', starting with a letter or digit", 64
    )(value)
    if value.lower() == "default":
        raise refuse(value, "is Slurm's keyword for the defaults line (PartitionName=DEFAULT); choose another name")
    return value


#: A Slurm partition name: a SlurmName that Slurm does not read as a keyword.
PartitionName = Annotated[
    str, AfterValidator(_partition_name), schema_pattern(f"^{SLURM_NAME_RE}$", 64)
]


def _slurm_word(value: str) -> str:
    if bad := bad_char(value):
        raise refuse(value, bad)
    if len(value) > 128:
        raise refuse(value[:40] + "...", f"is {len(value)} characters long; at most 128 are allowed")
    if "#" in value:
        raise refuse(value, "contains '#', which starts a comment in Slurm config files")
    if any(c.isspace() for c in value) or "," in value:
        raise refuse(value, "contains whitespace or ','; give one option per list item")
    if not re.fullmatch(SLURM_WORD_RE, value):
        raise refuse(value, "is not a Slurm option: expected name or name=value, e.g. bf_continue")
    return value


DURATION_RE = (
    r"UNLIMITED|INFINITE|[0-9]{1,9}|[0-9]{1,9}:[0-9]{1,2}|[0-9]{1,9}:[0-9]{1,2}:[0-9]{1,2}"
    r"|[0-9]{1,9}-[0-9]{1,2}|[0-9]{1,9}-[0-9]{1,2}:[0-9]{1,2}|[0-9]{1,9}-[0-9]{1,2}:[0-9]{1,2}:[0-9]{1,2}"
)

#: Slurm reads a time (time_str2secs) into a signed 32-bit number of seconds.
SLURM_DURATION_MAX_SECONDS = 2**31 - 1


def duration_seconds(value: str) -> int | None:
    """The seconds of a Slurm time in DURATION_RE (None: UNLIMITED), read as Slurm
    reads it: a lone number is minutes, M:S, H:M:S, D-H, D-H:M, D-H:M:S."""
    if value in ("UNLIMITED", "INFINITE"):
        return None
    days, _, clock = value.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if days:
        parts += [0] * (3 - len(parts))  # D-H, D-H:M
        h, m, sec = parts
        return int(days) * 86400 + h * 3600 + m * 60 + sec
    if len(parts) == 1:
        return parts[0] * 60
    if len(parts) == 2:
        return parts[0] * 60 + parts[1]
    return parts[0] * 3600 + parts[1] * 60 + parts[2]


def _duration(value: str) -> str:
    pattern_check(DURATION_RE, "use a Slurm time such as 60 (minutes), 4:00:00, 2-00:00:00 or UNLIMITED", 32)(value)
    seconds = duration_seconds(value)
    if seconds is not None and seconds > SLURM_DURATION_MAX_SECONDS:
        raise refuse(value, f"is {seconds} seconds; Slurm holds at most {SLURM_DURATION_MAX_SECONDS} "
                     "(some 68 years) and would read another time; use UNLIMITED")
    return value


#: A Slurm time limit: minutes, [H:]MM:SS, D-HH[:MM[:SS]] or UNLIMITED, within what Slurm holds.
SlurmDuration = Annotated[str, AfterValidator(_duration), schema_pattern(f"^({DURATION_RE})$", 32)]

LABEL_NAME_RE = r"([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]"
LABEL_KEY_RE = rf"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{LABEL_NAME_RE}"

#: A Kubernetes label key, optionally prefixed: ``topology.kubernetes.io/zone``.
LabelKey = Annotated[
    str,
    AfterValidator(
        pattern_check(
            LABEL_KEY_RE, "use a Kubernetes label key such as example.com/rack", 316, slurm=False
        )
    ),
    schema_pattern(f"^{LABEL_KEY_RE}$", 316),
]

LABEL_VALUE_RE = rf"({LABEL_NAME_RE})?"


def _label_value(value: str) -> str:
    if value == "":
        return value
    return pattern_check(
        LABEL_VALUE_RE,
        "use at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit",
        63,
        slurm=False,
    )(value)


#: A Kubernetes label value (may be empty).
LabelValue = Annotated[
    str, AfterValidator(_label_value), schema_pattern(f"^{LABEL_VALUE_RE}$", 63)
]

_POSIX_FIRST, _POSIX_REST = "[a-z_]", "[a-z0-9_-]"
POSIX_USER_RE = rf"{_POSIX_FIRST}{_POSIX_REST}*"
#: A user or group name as every pod reads it, within its 32 characters: the one rule for
#: names that come from spec.login.users, from the directory (its group members, the names
#: sshd and Slurm ask about), and the shell scripts of the images that check them
#: (tests/test_identity.py checks that they use this pattern).
POSIX_NAME_RE = rf"{_POSIX_FIRST}{_POSIX_REST}{{0,31}}"

#: Names the images already use, or that would collide with system accounts.
RESERVED_USERS = frozenset(
    "root daemon bin sys sync games man lp mail news uucp proxy www-data backup list irc "
    "gnats nobody _apt systemd-network systemd-resolve messagebus sshd munge slurm".split()
)
#: Group names the images hold (Debian's base groups and those their packages add), and the
#: system users' names: no login group, followed group or directory group takes one.
SYSTEM_GROUPS = RESERVED_USERS | frozenset(
    "adm tty disk kmem dialout fax voice cdrom floppy tape sudo audio dip operator src shadow utmp video "
    "sasl plugdev staff users nogroup wheel docker input kvm render sgx crontab systemd-journal "
    "systemd-timesync _ssh ssh slurmk8s".split()
)

#: Ids the images keep for their own accounts, which no person's uid or gid takes (neither
#: spec.login.users' nor the directory's: spec.identity.ldap.minId and maxId): those below
#: PERSON_ID_MIN (Debian's system accounts, munge among them) and SYSTEM_ID_BLOCK, Debian's
#: statically allocated accounts (SlurmUser slurm is 64030), nobody and nogroup (65534) and a
#: 16-bit -1 (65535). A uid there is the Slurm administrator or the owner of the images' files.
PERSON_ID_MIN = 1000
SYSTEM_ID_BLOCK = (60001, 65535)
PERSON_ID_LOW_MAX = SYSTEM_ID_BLOCK[0] - 1


def _posix_user(value: str) -> str:
    pattern_check(
        POSIX_USER_RE,
        "use lower-case letters, digits, '_' and '-', starting with a letter or '_'",
        32,
    )(value)
    if value in RESERVED_USERS:
        raise refuse(value, "is a system account name; choose another user name")
    return value


#: A login user name, the same in every pod.
PosixUser = Annotated[
    str, AfterValidator(_posix_user), schema_pattern(f"^{POSIX_USER_RE}$", 32)
]

ABS_PATH_RE = r"/[A-Za-z0-9._/-]*"


def _abs_path(value: str) -> str:
    pattern_check(
        ABS_PATH_RE, "use an absolute path of letters, digits, '.', '_', '-' and '/'", 255
    )(value)
    parts = value.split("/")
    if ".." in parts or "." in parts:
        raise refuse(value, "contains '.' or '..' components; give the path in its plain form")
    if value != "/" and value.endswith("/") or "//" in value:
        raise refuse(value, "is not in normal form; drop repeated and trailing '/'")
    return value


#: An absolute, normalized file-system path that is safe in a shell.
AbsPath = Annotated[
    str, AfterValidator(_abs_path), schema_pattern(f"^{ABS_PATH_RE}$", 255)
]

SSH_KEY_TYPES = (
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
)
SSH_KEY_RE = r"(" + "|".join(re.escape(t) for t in SSH_KEY_TYPES) + r") [A-Za-z0-9+/]+={0,3}( [ -~]*)?"


SSH_KEY_MAX = 16384


def _ssh_key(value: str) -> str:
    if "\n" in value or "\r" in value:
        raise refuse(value[:40] + ("..." if len(value) > 40 else ""), "contains a newline; give one key per list item")
    if len(value) > SSH_KEY_MAX:
        raise refuse(value[:40] + "...", f"is {len(value)} characters long; at most {SSH_KEY_MAX} are allowed")
    if not re.fullmatch(SSH_KEY_RE, value):
        raise refuse(
            value[:40] + ("..." if len(value) > 40 else ""),
            "is not an OpenSSH public key: expected '<type> <base64> [comment]' with type one of "
            + ", ".join(SSH_KEY_TYPES)
            + " (authorized_keys options are not allowed)",
        )
    return value


#: One line of an OpenSSH authorized_keys file, without options.
SshPublicKey = Annotated[
    str, AfterValidator(_ssh_key), schema_pattern(f"^{SSH_KEY_RE}$", SSH_KEY_MAX)
]

def _version(value: str) -> str:
    if value not in versions.SUPPORTED:
        shown = value if len(value) <= 40 else value[:40] + "..."
        if bad := bad_char(value):
            raise refuse(shown, bad)
        raise refuse(shown, f"is not a supported Slurm release: use one of {', '.join(versions.SUPPORTED)}")
    return value


#: A supported Slurm release, "YY.MM" (the rows of :mod:`slurmk8s.versions`; the CRD's enum).
SlurmVersion = Annotated[
    str, AfterValidator(_version), Field(json_schema_extra={"enum": list(versions.SUPPORTED)})
]


EXTRA_LINE_VALUE_RE = r"[A-Za-z0-9_.,:/=+*@%-]+"
EXTRA_LINE_RE = rf"[A-Za-z][A-Za-z0-9]*={EXTRA_LINE_VALUE_RE}"
EXTRA_LINE_MAX = 1024


def _extra_line(value: str) -> str:
    if "\n" in value or "\r" in value:
        raise refuse(value, "contains a newline; give one line per list item")
    if bad := bad_char(value):
        raise refuse(value, bad)
    if len(value) > EXTRA_LINE_MAX:
        raise refuse(value[:40] + "...", f"is {len(value)} characters long; at most {EXTRA_LINE_MAX} are allowed")
    if "#" in value:
        raise refuse(value, "contains '#', which starts a comment in slurm.conf")
    if value.endswith("\\"):
        raise refuse(value, "ends with '\\', which makes Slurm join the next line to it")
    if not re.fullmatch(EXTRA_LINE_RE, value):
        raise refuse(
            value,
            "is not a single Key=Value setting: no spaces, and the value made of letters, digits "
            "and _ . , : / = + * @ % - (e.g. SchedulerTimeSlice=60)",
        )
    return value


#: One ``Key=Value`` line for slurm.conf. Whether the key may be set this way
#: (an allowlist) is checked in :mod:`slurmk8s.api.extralines`.
ExtraLine = Annotated[str, AfterValidator(_extra_line), schema_pattern(f"^{EXTRA_LINE_RE}$", EXTRA_LINE_MAX)]


#: The signals slurmk8s sends to Slurm jobs (``scontrol``/``scancel --signal``
#: names). The Slurm facade checks every signal against this set.
SLURM_SIGNALS = frozenset("USR1 USR2 TERM INT HUP CONT STOP KILL".split())


PORT_RANGE_RE = r"[0-9]{4,5}-[0-9]{4,5}"
#: Ports srun listens on, for slurmstepd and slurmctld to call back: at least 100 of them (each
#: srun takes a few), above the privileged ports, within 1024-65535.
PORT_RANGE_MIN = 100


def _port_range(value: str) -> str:
    pattern_check(PORT_RANGE_RE, "use FIRST-LAST, e.g. 60001-63000", 11)(value)
    first, last = (int(v) for v in value.split("-"))
    if not 1024 <= first <= last <= 65535:
        raise refuse(value, "must lie within 1024-65535, the first port not above the last")
    if last - first + 1 < PORT_RANGE_MIN:
        raise refuse(value, f"holds {last - first + 1} ports; srun needs a few for each step, give at least {PORT_RANGE_MIN}")
    return value


#: A range of TCP ports, ``FIRST-LAST``, as slurm.conf's SrunPortRange takes it.
PortRange = Annotated[str, AfterValidator(_port_range), schema_pattern(f"^{PORT_RANGE_RE}$", 11)]


def _cidr(value: str) -> str:
    try:
        net = ipaddress.ip_network(value, strict=True)
    except ValueError as exc:
        raise refuse(value, f"is not an address block such as 10.0.0.0/8 or 192.0.2.7/32 ({exc})") from None
    return str(net)


#: An IPv4 or IPv6 address block in CIDR notation, host bits clear: ``10.20.0.0/16``.
Cidr = Annotated[str, AfterValidator(_cidr), schema_pattern(r"^[0-9a-fA-F:.]+/[0-9]{1,3}$", 43)]


#: What inet_aton (and so the database client) reads as an IPv4 address:
#: 1 to 4 parts, each decimal, octal (0...) or hex (0x...): 2852039166 and
#: 0251.0376.0251.0376 are both 169.254.169.254.
_INET_ATON_RE = r"(0x[0-9a-f]*|[0-9]+)(\.(0x[0-9a-f]*|[0-9]+)){0,3}"


def credential_host(value: str) -> str:
    """A host name, or an IPv4 address in dotted-decimal form that is not
    loopback, link-local (cloud metadata services), unspecified, multicast or
    reserved: a password (the database's, the directory's bind password) is
    sent there."""
    if value == "localhost" or value.endswith(".localhost"):
        raise refuse(value, "is this pod itself (loopback); name the service's host")
    if not re.fullmatch(_INET_ATON_RE, value):
        return value
    try:
        address = ipaddress.IPv4Address(value)
    except ValueError:
        raise refuse(value, "is an IPv4 address in a form other than a.b.c.d (decimal, octal or hex "
                     "parts hide which host it is); write it as four decimal numbers") from None
    for bad, why in (("is_loopback", "a loopback"), ("is_link_local", "a link-local (cloud metadata services)"),
                     ("is_unspecified", "the unspecified"), ("is_multicast", "a multicast"),
                     ("is_reserved", "a reserved")):
        if getattr(address, bad):
            raise refuse(value, f"is {why} address; a password may only go to the service's own host")
    return value
