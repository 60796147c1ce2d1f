"""Constrained string types shared by the API models.

Every user string that can reach slurm.conf, a hostname, a file path or a
shell passes through one of these checks. Each check raises an error whose
message quotes the offending value (JSON-style, so a newline shows as ``\\n``)
and says why it was refused; :mod:`slurmk8s.api.errors` prefixes the field
path, giving messages like::

    spec.partitions[1].name: "gpu\\nProlog=/x" contains a newline
"""

from __future__ import annotations

import json
import re
import unicodedata
from decimal import Decimal, InvalidOperation
from typing import Annotated

from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError

from .. import versions

__all__ = [
    "ClusterName",
    "MemberName",
    "PartitionName",
    "RESERVED_NAMES",
    "ExtraLine",
    "DnsLabel",
    "SlurmName",
    "SlurmWord",
    "SlurmDuration",
    "Quantity",
    "LabelKey",
    "LabelValue",
    "PosixUser",
    "AbsPath",
    "SshPublicKey",
    "SlurmVersion",
    "quote",
    "refuse",
    "parse_quantity",
]


def _schema(pattern: str, max_length: int):
    """Publish the constraint in the JSON schema (and so in the CRD) only.

    The checks themselves run in the validators, which explain a refusal
    better than a bare pattern mismatch does.
    """
    return Field(json_schema_extra={"pattern": pattern, "maxLength": max_length})


#: What Python's str.splitlines (and so many a reader of a rendered file)
#: takes as a line break, beyond LF and CR.
LINE_BREAKS = frozenset("\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029")


def unprintable(c: str) -> bool:
    """A character that must not reach a config file or a log line as itself:
    control characters (NUL, C1 controls such as U+0085 included), format
    characters (zero-width spaces and joiners, bidirectional overrides, BOM),
    line and paragraph separators, unassigned and private-use code points."""
    return unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp")


def escape(text: str) -> str:
    """``text`` with every unprintable character written as an escape (``\\n``, ``\\u2028``)."""
    if not any(unprintable(c) for c in text):
        return text
    return "".join(json.dumps(c)[1:-1] if c in "\n\r\t" else f"\\u{ord(c):04x}" if unprintable(c) else c
                   for c in text)


def quote(value: str) -> str:
    """Quote a user value for an error message: JSON-style, and every control,
    zero-width or line-separator character escaped (a newline shows as ``\\n``)."""
    return escape(json.dumps(value, ensure_ascii=False))


def _bad_char(value: str) -> str | None:
    """Why ``value`` may not be written anywhere, or None."""
    if "\n" in value or "\r" in value:
        return "contains a newline"
    for c in value:
        if c in LINE_BREAKS:
            return f"contains a line break (U+{ord(c):04X})"
        if c == "\0":
            return "contains a NUL character"
        if unprintable(c):
            return f"contains an invisible or control character (U+{ord(c):04X})"
    return None


def refuse(value: str, reason: str) -> PydanticCustomError:
    """An error for ``value``; the message reads ``"<value>" <reason>``."""
    # No context is passed, so pydantic leaves braces in the message alone.
    return PydanticCustomError("slurmk8s", f"{quote(value)} {reason}")


def _no_injection(value: str) -> None:
    """Refuse the characters that would let a value escape its slurm.conf slot."""
    bad = _bad_char(value)
    if bad:
        raise refuse(value, bad)
    if "#" in value:
        raise refuse(value, "contains '#', which starts a comment in Slurm config files")
    if "=" in value:
        raise refuse(value, "contains '=', which would inject a Slurm parameter")
    if any(c.isspace() for c in value):
        raise refuse(value, "contains whitespace, which would split a Slurm config line")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise refuse(value, "contains a control character")


def _pattern_check(pattern: str, what: str, max_len: int, *, slurm: bool = True):
    """A validator for ``pattern``. ``slurm``: the value reaches Slurm config
    files, so injection characters are explained as such."""
    compiled = re.compile(pattern)

    def check(value: str) -> str:
        if slurm:
            _no_injection(value)
        elif _bad_char(value):
            raise refuse(value, _bad_char(value))
        if not value:
            raise refuse(value, f"is empty; {what}")
        if len(value) > max_len:
            raise refuse(value, f"is {len(value)} characters long; at most {max_len} are allowed")
        if not compiled.fullmatch(value):
            raise refuse(value, f"is not valid: {what}")
        return value

    return check


def constrained(pattern: str, what: str, max_len: int, *, slurm: bool = True):
    """A string type checked against ``pattern``; ``what`` tells the user how to fix it."""
    return Annotated[
        str,
        AfterValidator(_pattern_check(pattern, what, max_len, slurm=slurm)),
        _schema(f"^{pattern}$", max_len),
    ]


DNS_LABEL_RE = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"

#: Becomes part of Kubernetes object names and Slurm node host names.
DnsLabel = Annotated[
    str,
    AfterValidator(
        _pattern_check(
            DNS_LABEL_RE,
            "use lower-case letters, digits and '-', starting and ending with a letter or digit "
            "(a DNS-1123 label)",
            40,
        )
    ),
    _schema(f"^{DNS_LABEL_RE}$", 40),
]

DNS_1035_RE = r"[a-z]([-a-z0-9]*[a-z0-9])?"

#: The SlurmCluster's name. It prefixes every object, Services included, whose
#: names must start with a letter (DNS-1035).
ClusterName = Annotated[
    str,
    AfterValidator(
        _pattern_check(
            DNS_1035_RE,
            "use lower-case letters, digits and '-', starting with a letter and ending with a "
            "letter or digit (a DNS-1035 label: it prefixes Service names)",
            40,
        )
    ),
    _schema(f"^{DNS_1035_RE}$", 40),
]

#: Words slurmk8s puts after ``<cluster>-`` in its own object names, and words
#: Slurm reads specially in a node list or a partition line. A node set or
#: volume may not take one (see :data:`MemberName`).
RESERVED_NAMES = frozenset("controller workers login restapi all default none".split())
MEMBER_NAME_RE = r"[a-z][a-z0-9]*"


def _member_name(value: str) -> str:
    _pattern_check(
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
    str, AfterValidator(_member_name), _schema(f"^{MEMBER_NAME_RE}$", 20)
]

SLURM_NAME_RE = r"[A-Za-z0-9][A-Za-z0-9_.-]*"

#: A Slurm partition, feature or GRES type name.
SlurmName = Annotated[
    str,
    AfterValidator(
        _pattern_check(
            SLURM_NAME_RE,
            "use letters, digits, '_', '.' and '-', starting with a letter or digit",
            64,
        )
    ),
    _schema(f"^{SLURM_NAME_RE}$", 64),
]

SLURM_WORD_RE = r"[a-z_][a-z0-9_]*(=[A-Za-z0-9_.:/-]+)?"

#: One item of a comma-separated Slurm option list, such as ``bf_continue``
#: or ``bf_max_job_test=500``. '=' is allowed once, after the option name.
SlurmWord = Annotated[
    str,
    AfterValidator(
        lambda v: _slurm_word(v),
    ),
    _schema(f"^{SLURM_WORD_RE}$", 128),
]


def _partition_name(value: str) -> str:
    _pattern_check(
        SLURM_NAME_RE, "use letters, digits, '_', '.' and '-', starting with a letter or digit", 64
    )(value)
    if value.lower() == "default":
        raise refuse(value, "is Slurm's keyword for the defaults line (PartitionName=DEFAULT); choose another name")
    return value


#: A Slurm partition name: a SlurmName that Slurm does not read as a keyword.
PartitionName = Annotated[
    str, AfterValidator(_partition_name), _schema(f"^{SLURM_NAME_RE}$", 64)
]


def _slurm_word(value: str) -> str:
    if _bad_char(value):
        raise refuse(value, _bad_char(value))
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

#: A Slurm time limit: minutes, [H:]MM:SS, D-HH[:MM[:SS]] or UNLIMITED.
SlurmDuration = Annotated[
    str,
    AfterValidator(
        _pattern_check(
            DURATION_RE,
            "use a Slurm time such as 60 (minutes), 4:00:00, 2-00:00:00 or UNLIMITED",
            32,
        )
    ),
    _schema(f"^({DURATION_RE})$", 32),
]

QUANTITY_RE = (
    r"(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?"
)

#: What the CRD publishes: the same, without a sign (no negative amounts).
NONNEGATIVE_QUANTITY_RE = QUANTITY_RE.removeprefix(r"(\+|-)?")

_SUFFIX = {
    "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30), "Ti": Decimal(2**40),
    "Pi": Decimal(2**50), "Ei": Decimal(2**60),
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
    "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12),
    "P": Decimal(10**15), "E": Decimal(10**18),
}


def quantity_value(value: str) -> Decimal:
    """The exact value of a Kubernetes quantity string ("8Gi" -> 8589934592)."""
    m = re.fullmatch(r"([+-]?[0-9.]+)([eE][+-]?[0-9.]+|[A-Za-z]*)", value, re.ASCII)
    if not m:
        raise ValueError(f"not a quantity: {value!r}")
    number, suffix = m.groups()
    try:
        if suffix[:1] in ("e", "E"):
            exponent = Decimal(suffix[1:])
            if abs(exponent) > 64:  # Decimal would happily build 1e400000
                raise ValueError(f"quantity out of range: {value!r}")
            return Decimal(number).scaleb(exponent)
        if suffix not in _SUFFIX:
            raise ValueError(f"not a quantity: {value!r}")
        return Decimal(number) * _SUFFIX[suffix]
    except InvalidOperation:
        raise ValueError(f"not a quantity: {value!r}") from None


def parse_quantity(value: str) -> float:
    """The numeric value of a Kubernetes quantity string ("8Gi" -> 8589934592.0);
    out of a float's range, inf or 0.0. Checks on user input use
    :func:`quantity_value`, which is exact."""
    m = re.fullmatch(r"([+-]?[0-9.]+)([eE][+-]?[0-9.]+|[A-Za-z]*)", value, re.ASCII)
    if not m:
        raise ValueError(f"not a quantity: {value!r}")
    number, suffix = m.groups()
    if suffix[:1] in ("e", "E"):
        return float(number + suffix)
    return float(number) * float(_SUFFIX[suffix])


#: Kubernetes keeps quantities in a signed 64-bit integer: 8Ei - 1 is the most.
MAX_QUANTITY = 2**63 - 1


def _quantity(value: str) -> str:
    _pattern_check(QUANTITY_RE, "use a Kubernetes quantity such as 500m, 4 or 16Gi", 32)(value)
    try:
        amount = quantity_value(value)
    except ValueError:
        raise refuse(value, "is not a quantity Kubernetes can hold; use one such as 500m, 4 or 16Gi") from None
    if amount < 0:
        raise refuse(value, "is negative; a resource amount must be 0 or more")
    if amount > MAX_QUANTITY:
        raise refuse(value, "is larger than Kubernetes can hold (8Ei)")
    return value


#: A Kubernetes resource quantity such as ``500m``, ``4`` or ``16Gi``.
Quantity = Annotated[str, AfterValidator(_quantity), _schema(f"^{NONNEGATIVE_QUANTITY_RE}$", 32)]

LABEL_NAME_RE = r"([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]"
LABEL_KEY_RE = rf"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{LABEL_NAME_RE}"

#: A Kubernetes label key, optionally prefixed: ``topology.kubernetes.io/zone``.
LabelKey = Annotated[
    str,
    AfterValidator(
        _pattern_check(
            LABEL_KEY_RE, "use a Kubernetes label key such as example.com/rack", 316, slurm=False
        )
    ),
    _schema(f"^{LABEL_KEY_RE}$", 316),
]

LABEL_VALUE_RE = rf"({LABEL_NAME_RE})?"


def _label_value(value: str) -> str:
    if value == "":
        return value
    return _pattern_check(
        LABEL_VALUE_RE,
        "use at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit",
        63,
        slurm=False,
    )(value)


#: A Kubernetes label value (may be empty).
LabelValue = Annotated[
    str, AfterValidator(_label_value), _schema(f"^{LABEL_VALUE_RE}$", 63)
]

POSIX_USER_RE = r"[a-z_][a-z0-9_-]*"

#: Names the images already use, or that would collide with system accounts.
RESERVED_USERS = frozenset(
    "root daemon bin sys sync games man lp mail news uucp proxy www-data backup list irc "
    "gnats nobody _apt systemd-network systemd-resolve messagebus sshd munge slurm".split()
)


def _posix_user(value: str) -> str:
    _pattern_check(
        POSIX_USER_RE,
        "use lower-case letters, digits, '_' and '-', starting with a letter or '_'",
        32,
    )(value)
    if value in RESERVED_USERS:
        raise refuse(value, "is a system account name; choose another user name")
    return value


#: A login user name, the same in every pod.
PosixUser = Annotated[
    str, AfterValidator(_posix_user), _schema(f"^{POSIX_USER_RE}$", 32)
]

ABS_PATH_RE = r"/[A-Za-z0-9._/-]*"


def _abs_path(value: str) -> str:
    _pattern_check(
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
    str, AfterValidator(_abs_path), _schema(f"^{ABS_PATH_RE}$", 255)
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
    str, AfterValidator(_ssh_key), _schema(f"^{SSH_KEY_RE}$", SSH_KEY_MAX)
]

def _version(value: str) -> str:
    if value not in versions.SUPPORTED:
        shown = value if len(value) <= 40 else value[:40] + "..."
        if _bad_char(value):
            raise refuse(shown, _bad_char(value))
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
    if _bad_char(value):
        raise refuse(value, _bad_char(value))
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
#: (an allowlist) is checked in :mod:`slurmk8s.api.validate`.
ExtraLine = Annotated[str, AfterValidator(_extra_line), _schema(f"^{EXTRA_LINE_RE}$", EXTRA_LINE_MAX)]


#: The signals slurmk8s sends to Slurm jobs (``scontrol``/``scancel --signal``
#: names). The Slurm facade checks every signal against this set.
SLURM_SIGNALS = frozenset("USR1 USR2 TERM INT HUP CONT STOP KILL".split())
