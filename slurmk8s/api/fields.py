"""Constrained string types shared by the API models.

Every user string that can reach slurm.conf, a hostname, a file path or a
shell passes through one of these checks. Each check raises an error whose
message quotes the offending value (JSON-style, so a newline shows as ``\\n``)
and says why it was refused; :mod:`slurmk8s.api.errors` prefixes the field
path, giving messages like::

    spec.partitions[1].name: "gpu\\nProlog=/x" contains a newline

How a value is checked and a refusal quoted is :mod:`.refusals`; resource
quantities are :mod:`.quantities`, addresses and ports :mod:`.network`; what
callers use of them is re-exported here.

The patterns of the names that reach Kubernetes, Slurm and the images are
spelled here and nowhere else in slurmk8s/ (tests/test_patterns.py): the
DNS label and subdomain (:data:`DNS_LABEL_RE`, :data:`DNS_SUBDOMAIN_RE`),
sacctmgr's names (:data:`SACCTMGR_NAME_RE`), POSIX user and group names
(:data:`POSIX_NAME_RE`), Slurm's names (:data:`SLURM_NAME_RE`) and node
names (:data:`SLURM_NODE_NAME_RE`). Others import them.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field

from .. import versions
from .network import Cidr, IpAddress, PortRange, credential_host
from .quantities import Quantity, parse_quantity, quantity_value
from .refusals import bad_char, constrained, escape, pattern_check, quote, refuse, schema_pattern, unprintable

__all__ = [
    "Cidr",
    "IpAddress",
    "PortRange",
    "ClusterName",
    "MemberName",
    "PartitionName",
    "RESERVED_NAMES",
    "ExtraLine",
    "DnsLabel", "NamespaceName",
    "DNS_LABEL_RE", "DNS_SUBDOMAIN_RE", "DnsSubdomain", "DATA_KEY_RE",
    "SACCTMGR_NAME_RE",
    "SLURM_NAME_RE", "SLURM_NODE_NAME_RE",
    "SlurmName",
    "SlurmWord",
    "SlurmDuration",
    "Quantity",
    "LabelKey",
    "LabelValue",
    "AnnotationKey",
    "AnnotationValue",
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


#: A DNS-1123 label: lower-case letters, digits and '-', starting and ending with a
#: letter or digit. Its length (at most 63) is each use's bound.
DNS_LABEL_RE = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
#: A DNS-1123 subdomain: labels joined by '.', as Kubernetes names most objects and as
#: host names are written (at most 253 characters, each use's bound).
DNS_SUBDOMAIN_RE = rf"{DNS_LABEL_RE}(\.{DNS_LABEL_RE})*"

#: A Kubernetes object name (Secret, ConfigMap, StorageClass, claim) or a host name.
DnsSubdomain = Annotated[str, constrained(
    DNS_SUBDOMAIN_RE,
    "use a Kubernetes object name: lower-case letters, digits, '-' and '.'",
    253,
    slurm=False,
)]
#: A key of a Secret's or ConfigMap's data.
DATA_KEY_RE = r"[-._a-zA-Z0-9]+"

#: An account, QOS or cluster name as sacctmgr stores it (it lower-cases names): the spec's
#: accounts and QOS, and every name the agent passes to sacctmgr.
SACCTMGR_NAME_RE = r"[a-z0-9][a-z0-9_-]{0,63}"

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

_SLURM_FIRST, _SLURM_REST = "[A-Za-z0-9]", "[A-Za-z0-9_.-]"
#: A name Slurm reads in slurm.conf and its commands (partition, feature, GRES type; the
#: spec's names are bounded at 64 by each use).
SLURM_NAME_RE = rf"{_SLURM_FIRST}{_SLURM_REST}*"
#: A Slurm node name as the Slurm facade takes it: the same alphabet, at most 128
#: characters, longer than the spec's own names: a node's name is a worker pod's or a lent
#: Kubernetes Node's, which the spec does not choose.
SLURM_NODE_NAME_RE = rf"{_SLURM_FIRST}{_SLURM_REST}{{0,127}}"

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
LABEL_KEY_RE = rf"({DNS_SUBDOMAIN_RE}/)?{LABEL_NAME_RE}"

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


def _annotation_key(value: str) -> str:
    """As Kubernetes checks an annotation key (``IsQualifiedName`` of the key in
    lower case): an optional DNS subdomain prefix of at most 253 characters and
    '/', then a name of at most 63 characters."""
    if bad := bad_char(value):
        raise refuse(value, bad)
    prefix, slash, name = value.lower().rpartition("/")
    what = ("use an annotation key such as service.beta.kubernetes.io/aws-load-balancer-scheme: an optional "
            "DNS subdomain and '/', then at most 63 letters, digits, '-', '_' and '.', starting and ending "
            "with a letter or digit")
    if slash and not (len(prefix) <= 253 and re.fullmatch(DNS_SUBDOMAIN_RE, prefix)):
        raise refuse(value, f"has a prefix that is not a DNS subdomain of at most 253 characters; {what}")
    if not (len(name) <= 63 and re.fullmatch(LABEL_NAME_RE, name)):
        raise refuse(value, f"is not a qualified name; {what}")
    return value


def _annotation_value(value: str) -> str:
    if bad := bad_char(value):
        raise refuse(value, f"{bad}; an annotation value here is one line of printable text")
    return value


#: An annotation value: any printable text on one line (Kubernetes bounds only all of an
#: object's annotations together, which the map that holds them checks).
AnnotationValue = Annotated[str, AfterValidator(_annotation_value)]

#: An annotation key's form: a label key, whose prefix may also be upper case.
ANNOTATION_KEY_RE = rf"({DNS_SUBDOMAIN_RE.replace('a-z', 'a-zA-Z')}/)?{LABEL_NAME_RE}"
#: A Kubernetes annotation key (``service.beta.kubernetes.io/aws-load-balancer-scheme``).
AnnotationKey = Annotated[str, AfterValidator(_annotation_key), schema_pattern(f"^{ANNOTATION_KEY_RE}$", 317)]

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

#: A user or group name as every pod reads it, within its 32 characters: the one rule for
#: names that come from spec.login.users, from the directory (its group members, the names
#: sshd and Slurm ask about), and the shell scripts of the images that check them
#: (tests/test_identity.py checks that they use this pattern).
POSIX_NAME_RE = r"[a-z_][a-z0-9_-]{0,31}"

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
        POSIX_NAME_RE,
        "use lower-case letters, digits, '_' and '-', starting with a letter or '_'",
        32,
    )(value)
    if value in RESERVED_USERS:
        raise refuse(value, "is a system account name; choose another user name")
    return value


#: A login user name, the same in every pod.
PosixUser = Annotated[
    str, AfterValidator(_posix_user), schema_pattern(f"^{POSIX_NAME_RE}$", 32)
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
