"""Where researchers come from besides ``spec.login.users``: the site's directory (``spec.identity``).

SSSD in the Slurm pods reads users, groups and SSH keys from LDAP; the
fields here are what it is told. Each string reaches sssd.conf, where a line
break or an unbalanced filter would change what it reads, so each has an
allowlist: URIs of ``ldap``/``ldaps`` to a host name or plain IPv4 address
(not loopback or link-local: the bind password is sent there), DNs of
``attribute=value`` parts, filters parsed by the LDAP filter grammar
(RFC 4515) over a safe alphabet, attribute and group names as POSIX and LDAP
name them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Annotated

from pydantic import AfterValidator, Field

from .base import ApiModel
from .errors import FieldError
from .fields import (
    DATA_KEY_RE,
    DNS_SUBDOMAIN_RE,
    PERSON_ID_LOW_MAX,
    PERSON_ID_MIN,
    POSIX_NAME_RE,
    SYSTEM_GROUPS,
    SYSTEM_ID_BLOCK,
    Cidr,
    DnsSubdomain,
    constrained,
    credential_host,
    pattern_check,
    quote,
    refuse,
)
from .network import egress_blocks, ipv4_literal
from .refusals import schema_pattern

__all__ = ["IdentitySpec", "LdapSpec", "LdapCa", "BindPasswordRef", "ConfigMapKeyRef", "LDAP_FILTER_MAX",
           "LDAP_USE", "parse_filter", "identity_errors", "account_group_errors", "uri_port", "uri_host",
           "login_overlap_errors", "ID_MAX", "egress_errors", "directory_blocks"]

#: The ``slurmk8s.dev/secret-use`` (and ``configmap-use``) values of the objects these fields name.
LDAP_USE = {"bindPassword": "ldap-bind-password", "ca": "ldap-ca"}

LDAP_URI_RE = rf"(ldap|ldaps)://({DNS_SUBDOMAIN_RE})(:[0-9]{{1,5}})?/?"
_URI = re.compile(rf"(?P<scheme>ldaps?)://(?P<host>{DNS_SUBDOMAIN_RE})(:(?P<port>[0-9]{{1,5}}))?/?")


def _ldap_uri(value: str) -> str:
    pattern_check(LDAP_URI_RE, "use ldaps://host[:port] or ldap://host[:port] (a lower-case host name or IPv4 "
                  "address; no path, user or query)", 255, slurm=False)(value)
    m = _URI.fullmatch(value)
    assert m is not None
    credential_host(m["host"])
    if m["port"] is not None and not 1 <= int(m["port"]) <= 65535:
        raise refuse(value, "has a port outside 1-65535")
    return value


LdapUri = Annotated[str, AfterValidator(_ldap_uri), schema_pattern(f"^{LDAP_URI_RE}$", 255)]


def uri_host(uri: str) -> str:
    """The host an LdapUri names."""
    m = _URI.fullmatch(uri)
    assert m is not None, uri
    return m["host"]


def uri_port(uri: str) -> int:
    """The port an LdapUri names: its own, else 636 for ldaps:// and 389 for ldap://."""
    m = _URI.fullmatch(uri)
    assert m is not None, uri
    return int(m["port"]) if m["port"] is not None else (636 if m["scheme"] == "ldaps" else 389)

#: An attribute type as LDAP names it (a descriptor: RFC 4512's keystring).
ATTRIBUTE_RE = r"[A-Za-z][A-Za-z0-9-]{0,63}"
LdapAttribute = Annotated[str, constrained(ATTRIBUTE_RE, "use an LDAP attribute name: a letter, then letters, digits and '-'", 64,
                            slurm=False)]

#: A value inside a DN or filter: what directories hold in names, and no character
#: LDAP escapes (',' '+' '"' '\\' '<' '>' ';' '=' '(' ')' '*' NUL) or sssd.conf reads.
_VALUE = r"[A-Za-z0-9_.@-]([A-Za-z0-9 _.@-]*[A-Za-z0-9_.@-])?"
DN_RE = rf"{ATTRIBUTE_RE}={_VALUE}(,{ATTRIBUTE_RE}={_VALUE})*"
Dn = Annotated[str, constrained(DN_RE, "use a DN of attribute=value parts separated by ',' (values of letters, digits, "
                 "' ', '_', '.', '@' and '-'), such as ou=people,dc=example,dc=org", 512, slurm=False)]

def _group(value: str) -> str:
    pattern_check(POSIX_NAME_RE, "use lower-case letters, digits, '_' and '-', starting with a letter or '_'", 32,
                  slurm=False)(value)
    if value in SYSTEM_GROUPS:
        raise refuse(value, "is a system group; name a group of the directory's researchers")
    return value


#: A POSIX group name, as the directory's groups are named to sssd (``simple_allow_groups``).
PosixGroup = Annotated[str, AfterValidator(_group), schema_pattern(f"^{POSIX_NAME_RE}$", 32)]

LDAP_FILTER_MAX = 1024
_FILTER_DEPTH = 8
#: What an assertion value may hold: a DN's alphabet plus '=' and ',' (memberOf=cn=a,ou=b) and
#: '*' (a substring or presence match). No '(' ')' '\\' or NUL, which RFC 4515 makes special.
_ASSERTION = re.compile(r"[A-Za-z0-9 _.@,=*:-]+")
_ATTRIBUTE = re.compile(ATTRIBUTE_RE)


def parse_filter(text: str) -> None:
    """Check ``text`` against RFC 4515's grammar over a safe alphabet: ``(&...)``, ``(|...)``,
    ``(!...)`` around items ``(attr=value)``, ``(attr~=value)``, ``(attr>=value)``,
    ``(attr<=value)``; at most 8 deep. Raises ValueError saying where it is wrong."""
    pos = _filter(text, 0, 0)
    if pos != len(text):
        raise ValueError(f"has {text[pos:pos + 20]!r} after the filter's closing ')' at character {pos + 1}")


def _filter(text: str, pos: int, depth: int) -> int:
    if depth >= _FILTER_DEPTH:
        raise ValueError(f"nests deeper than {_FILTER_DEPTH} levels")
    if pos >= len(text) or text[pos] != "(":
        raise ValueError(f"needs '(' at character {pos + 1}")
    pos += 1
    if pos < len(text) and text[pos] in "&|":
        pos += 1
        count = 0
        while pos < len(text) and text[pos] == "(":
            pos = _filter(text, pos, depth + 1)
            count += 1
        if count == 0:
            raise ValueError(f"has an empty '&' or '|' at character {pos}")
    elif pos < len(text) and text[pos] == "!":
        pos = _filter(text, pos + 1, depth + 1)
    else:
        pos = _item(text, pos)
    if pos >= len(text) or text[pos] != ")":
        raise ValueError(f"needs ')' at character {pos + 1}")
    return pos + 1


def _item(text: str, pos: int) -> int:
    m = _ATTRIBUTE.match(text, pos)
    if m is None:
        raise ValueError(f"needs an attribute name at character {pos + 1}")
    pos = m.end()
    op = next((o for o in ("~=", ">=", "<=", "=") if text.startswith(o, pos)), None)
    if op is None:
        raise ValueError(f"needs '=', '~=', '>=' or '<=' after {m.group()!r}")
    pos += len(op)
    v = _ASSERTION.match(text, pos)
    if v is None:
        raise ValueError(f"needs a value after {m.group() + op!r} (letters, digits, ' ', '_', '.', '@', ',', '=', "
                         "'*', ':' and '-'; no '(', ')' or '\\')")
    return v.end()


def _ldap_filter(value: str) -> str:
    pattern_check(r".+", "write an LDAP filter such as (objectClass=posixAccount)", LDAP_FILTER_MAX, slurm=False)(value)
    try:
        parse_filter(value)
    except ValueError as e:
        raise refuse(value, f"is not an LDAP filter of the allowed form: it {e}") from None
    return value


LdapFilter = Annotated[str, AfterValidator(_ldap_filter), Field(json_schema_extra={"maxLength": LDAP_FILTER_MAX})]

#: The largest uid or gid SSSD reads (its id range's bound, and one below glibc's (uid_t)-1 halved).
ID_MAX = 2**31 - 2

ObjectKey = Annotated[str, constrained(DATA_KEY_RE, "use a key of letters, digits, '-', '_' and '.'", 253,
                                      slurm=False)]


class BindPasswordRef(ApiModel):
    name: DnsSubdomain
    """Secret in the SlurmCluster's namespace, labelled
    `slurmk8s.dev/secret-use: ldap-bind-password` by its owner; an Opaque
    Secret. Only the sssd container of each pod that resolves users mounts
    it, readable by root alone."""
    key: ObjectKey
    """Key whose value is the bind password (one line)."""


class ConfigMapKeyRef(ApiModel):
    name: DnsSubdomain
    """ConfigMap in the SlurmCluster's namespace, labelled
    `slurmk8s.dev/configmap-use: ldap-ca` by its owner."""
    key: ObjectKey
    """Key whose value is the CA bundle (PEM)."""


class LdapCa(ApiModel):
    """Where the CA that signed the directory's certificate is: set one of configMap or secret."""

    config_map: ConfigMapKeyRef | None = None
    """A ConfigMap key holding the CA bundle (PEM)."""
    secret: BindPasswordRef | None = None
    """A Secret key holding the CA bundle (PEM), labelled
    `slurmk8s.dev/secret-use: ldap-ca`."""


class LdapSpec(ApiModel):
    """An LDAP directory (OpenLDAP, 389, FreeIPA, Active Directory's LDAP)
    that SSSD reads researchers from: users (posixAccount), groups
    (posixGroup) and SSH public keys."""

    uris: list[LdapUri] = Field(min_length=1, max_length=4)
    """Directory servers, tried in order: ldaps://host[:port] (TLS), or
    ldap://host[:port] with startTLS, or ldap:// in plain text only with
    allowPlainLdap."""
    start_tls: bool = False
    """Upgrade ldap:// connections with StartTLS (the certificate checked
    against ca). Required for ldap:// URIs unless allowPlainLdap."""
    allow_plain_ldap: bool = False
    """Allow ldap:// without TLS: the bind password and every user's data
    cross the network in the clear. Only for a directory on a trusted
    network, said here explicitly."""
    ca: LdapCa | None = None
    """The CA the directory's certificate is checked against; the image's
    system CAs when unset. A certificate that does not verify is never
    accepted."""
    bind_dn: Dn | None = None
    """Who SSSD binds as (a read-only account); anonymous when unset."""
    bind_password_secret: BindPasswordRef | None = None
    """The bind password; required with bindDn."""
    user_search_base: Dn
    """Where users are searched (subtree), e.g. ou=people,dc=example,dc=org."""
    group_search_base: Dn
    """Where groups are searched (subtree), e.g. ou=groups,dc=example,dc=org."""
    user_filter: LdapFilter | None = None
    """Only users this filter matches exist, e.g. (objectClass=posixAccount)."""
    group_filter: LdapFilter | None = None
    """Only groups this filter matches exist."""
    ssh_public_key_attribute: LdapAttribute = "sshPublicKey"
    """The user attribute holding OpenSSH public keys (openssh-lpk's
    sshPublicKey by default); sshd reads them through sss_ssh_authorizedkeys."""
    login_groups: list[PosixGroup] = Field(default_factory=list, max_length=64)
    """Directory groups whose members may log in; every user found may when
    empty. Keys alone do not let others in: sshd asks SSSD's access check."""
    min_id: int = Field(PERSON_ID_MIN, ge=PERSON_ID_MIN, le=ID_MAX)
    """Users and groups below this uid/gid are ignored (never root or a system account).
    The range minId-maxId holds no id the images keep for their own accounts
    (60001-65535: SlurmUser, nobody), so it lies within 1000-60000 or within
    65536-2147483646, and no uid or gid of login.users."""
    max_id: int = Field(PERSON_ID_LOW_MAX, ge=PERSON_ID_MIN, le=ID_MAX)
    """Users and groups above this uid/gid are ignored: 60000 by default, as
    for login.users; set minId to 65536 or more for a directory whose ids
    lie above the images' own."""
    egress_cidrs: list[Cidr] = Field(default_factory=list, max_length=16)
    """Address blocks (CIDR) the directory's servers are in. With
    spec.network.egress, the pods that run sssd may reach the directory's
    ports at these addresses and at the IPv4 addresses uris name, and nowhere
    else; required then when a URI names its host by name (a NetworkPolicy
    admits addresses, not names)."""
    cache_seconds: int = Field(600, ge=15, le=86400)
    """How long a looked-up user, group or key is trusted before SSSD asks
    the directory again; with the directory down, cached entries keep
    answering."""


class IdentitySpec(ApiModel):
    """Where researchers come from besides login.users."""

    ldap: LdapSpec | None = None
    """Users, groups and SSH keys from an LDAP directory, through SSSD in the
    login, slurmctld and slurmd pods. login.users win: a directory user or
    group named like one of them (or like a system account) does not exist
    in the pods, sshd never asks the directory for their keys, and the
    directory's id range may not hold their uids and gids."""


def identity_errors(identity: IdentitySpec) -> Iterator[FieldError]:
    """The rules of spec.identity that span fields, each with its path."""
    ldap = identity.ldap
    if ldap is None:
        return
    path = "spec.identity.ldap"
    plain = [i for i, u in enumerate(ldap.uris) if u.startswith("ldap://")]
    if plain and not (ldap.start_tls or ldap.allow_plain_ldap):
        yield FieldError(f"{path}.uris[{plain[0]}]", f"{quote(ldap.uris[plain[0]])} is plain LDAP: set startTls "
                         "(or use ldaps://), or allowPlainLdap for a directory on a trusted network")
    if ldap.start_tls and not plain:
        yield FieldError(f"{path}.startTls", "applies to ldap:// URIs only, and every URI is ldaps:// (TLS already)")
    if (ldap.bind_dn is None) != (ldap.bind_password_secret is None):
        yield FieldError(f"{path}.{'bindPasswordSecret' if ldap.bind_dn else 'bindDn'}",
                         "set bindDn and bindPasswordSecret together (or neither, for an anonymous bind)")
    if ldap.ca is not None and (ldap.ca.config_map is None) == (ldap.ca.secret is None):
        yield FieldError(f"{path}.ca", "set exactly one of configMap and secret")
    if ldap.min_id > ldap.max_id:
        yield FieldError(f"{path}.maxId", f"{ldap.max_id} is below minId {ldap.min_id}")
    elif ldap.min_id <= SYSTEM_ID_BLOCK[1] and ldap.max_id >= SYSTEM_ID_BLOCK[0]:
        low, high = SYSTEM_ID_BLOCK
        field = "maxId" if ldap.min_id < low else "minId"
        yield FieldError(f"{path}.{field}", f"the id range {ldap.min_id}-{ldap.max_id} holds the ids {low}-{high} the "
                         "images keep for their own accounts (SlurmUser slurm is 64030, nobody 65534): a directory "
                         "entry with one would be the Slurm administrator; keep maxId at or below "
                         f"{PERSON_ID_LOW_MAX}, or minId at or above {high + 1}")
    for field, values in (("uris", ldap.uris), ("loginGroups", ldap.login_groups)):
        for i, value in enumerate(values):
            if value in values[:i]:
                yield FieldError(f"{path}.{field}[{i}]", f"{quote(value)} is listed twice")


def directory_blocks(ldap: LdapSpec) -> list[str]:
    """The address blocks the directory's servers are in: the IPv4 addresses its URIs name
    (each alone) and egressCidrs, each once."""
    return egress_blocks([uri_host(u) for u in ldap.uris], ldap.egress_cidrs)


def egress_errors(identity: IdentitySpec, egress: bool) -> Iterator[FieldError]:
    """With egress rules, the way out to the directory goes to its servers' addresses alone,
    and a URI that names its host by name needs them said (egressCidrs)."""
    ldap = identity.ldap
    if ldap is None or not egress or ldap.egress_cidrs:
        return
    named = [i for i, u in enumerate(ldap.uris) if not ipv4_literal(uri_host(u))]
    if named:
        yield FieldError("spec.identity.ldap.egressCidrs",
                         f"{quote(ldap.uris[named[0]])} names its host by name, and with spec.network.egress the "
                         "pods reach only addresses a NetworkPolicy admits: list the address blocks of the "
                         "directory's servers here (e.g. 192.0.2.10/32), or name the servers by IPv4 address")


def login_overlap_errors(identity: IdentitySpec, users) -> Iterator[FieldError]:
    """login.users win over the directory: a uid or gid of one inside the directory's id
    range would make a directory entry with that id the same account (its files, its jobs).
    Their names need no rule here: sssd.conf filters them out of the directory."""
    ldap = identity.ldap
    if ldap is None:
        return
    for i, u in enumerate(users):
        for field, value in (("uid", u.uid), ("gid", u.gid)):
            if value is not None and ldap.min_id <= value <= ldap.max_id:
                yield FieldError(f"spec.login.users[{i}].{field}",
                                 f"{value} lies in the directory's id range {ldap.min_id}-{ldap.max_id} "
                                 "(spec.identity.ldap.minId, maxId): a directory entry with that id would own "
                                 f"{quote(u.name)}'s files and jobs; give {quote(u.name)} an id outside the range, "
                                 "or narrow the range")


def account_group_errors(identity: IdentitySpec, accounting) -> Iterator[FieldError]:
    """Accounts that follow directory groups (spec.accounting.accounts[].groups, with
    accounting on): a directory to read them from, each group once, and the enforcement
    that closes an association (MaxSubmitJobs=0) for a member who left."""
    for i, account in enumerate(accounting.accounts):
        for j, group in enumerate(account.groups):
            where = f"spec.accounting.accounts[{i}].groups[{j}]"
            if identity.ldap is None:
                yield FieldError(where, "groups are the directory's: set spec.identity.ldap, or list users instead")
                break
            if group in account.groups[:j]:
                yield FieldError(where, f"{quote(group)} is listed twice")
        lacking = [o for o in ("associations", "limits") if o not in accounting.enforce]
        if account.groups and lacking:
            yield FieldError(f"spec.accounting.accounts[{i}].groups",
                             f"an account of directory groups needs enforce to hold {' and '.join(lacking)} "
                             "(without them a member who left the groups could still submit); add "
                             f"{' and '.join(lacking)} to spec.accounting.enforce")
