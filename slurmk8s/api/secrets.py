"""Which Secrets a SlurmCluster may name, and why a named one is refused. Pure.

A spec names Secrets in these fields: ``spec.login.users[].sshPublicKeysFrom``
(mounted into every login pod), ``spec.accounting.database.external.passwordSecret``
(sent to the database host), ``spec.identity.ldap.bindPasswordSecret`` (sent to
the directory) and ``ca.secret`` (or a ConfigMap, ``ca.configMap``: the CA the
directory's certificate is checked against), and ``spec.imagePullSecrets`` (read
by the kubelet alone); one field names a whole ConfigMap: ``spec.healthCheck.siteChecks``
(scripts every slurmd pod runs, lent ones included). Editing a SlurmCluster needs
no right to read Secrets, so no field may
reach a Secret its writer could not read: not slurmk8s's own (the munge key,
the agent token, ...), and nothing its owner did not mark for that use. A pull
Secret needs no mark: the kubelet sends each registry only the credentials its
``auths`` entry names for that registry, and nothing mounts it; it may still
not be one slurmk8s generates.
The rule (docs/decisions/0027-secrets-a-spec-may-name.md):

- statically, from the spec alone (:func:`owned_name_error`): a name that is a
  Secret slurmk8s generates for some cluster (``<cluster>-munge-key`` ...);
- when the operator reads the Secret (:func:`secret_problem`): it must exist,
  be an Opaque Secret not made by slurmk8s, hold the key, and carry the label
  ``slurmk8s.dev/secret-use`` with the value of the field's use
  (``ssh-keys``, ``database-password``, ``ldap-bind-password``, ``ldap-ca``).
  A ConfigMap likewise, with ``slurmk8s.dev/configmap-use`` (``ldap-ca``,
  ``health-checks``). A password that
  is sent to a host (the database's, the directory's) also needs the
  annotation ``slurmk8s.dev/allowed-hosts`` to list every host the spec sends
  it to: a label says what a Secret is for, and whoever may edit a
  SlurmCluster could otherwise send it to a host of theirs (a public CA's
  certificate would do). Otherwise the round is refused and nothing is
  mounted.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from dataclasses import dataclass

from .cluster import GROUP, SlurmCluster
from .errors import FieldError
from .fields import quote
from .identity import LDAP_USE, uri_host

__all__ = [
    "SECRET_USE_LABEL", "CONFIGMAP_USE_LABEL", "SSH_KEYS", "DATABASE_PASSWORD", "LDAP_BIND_PASSWORD", "LDAP_CA",
    "HEALTH_CHECKS", "IMAGE_PULL", "OWNED_SECRET_SUFFIXES", "SecretRef", "ALLOWED_HOSTS_ANNOTATION",
    "secret_refs", "pull_secret_refs",
    "owned_name_error", "secret_problem",
]

#: The label that says what a Secret (a ConfigMap) may be used for by a SlurmCluster.
SECRET_USE_LABEL = f"{GROUP}/secret-use"
CONFIGMAP_USE_LABEL = f"{GROUP}/configmap-use"
#: On a password's Secret: the hosts (as the spec names them, separated by ',') it may be sent to.
ALLOWED_HOSTS_ANNOTATION = f"{GROUP}/allowed-hosts"
#: Its values: the uses of the fields that name Secrets.
SSH_KEYS = "ssh-keys"
DATABASE_PASSWORD = "database-password"
LDAP_BIND_PASSWORD = LDAP_USE["bindPassword"]
LDAP_CA = LDAP_USE["ca"]
#: The use of the ConfigMap of the site's health check scripts (every key of it).
HEALTH_CHECKS = "health-checks"
#: The use of an image pull Secret (no label asked for: see above).
IMAGE_PULL = "image-pull"

#: The Secrets slurmk8s generates are ``<cluster>-<suffix>`` (render/names.py;
#: tests/test_hostile_input_round_two.py checks the two agree). A spec names
#: none of them, whichever cluster's.
OWNED_SECRET_SUFFIXES = ("-munge-key", "-jwt-key", "-ssh-host-keys", "-agent-token", "-db-password")

#: What a database password may hold: it is written unquoted as
#: ``StoragePass=<it>`` into slurmdbd.conf (images/slurmdbd/entrypoint.sh
#: checks the same), where whitespace would start another ``Key=Value``,
#: '#' a comment, and quotes or a backslash change how the rest is read.
DB_PASSWORD_RE = r"[A-Za-z0-9!$%&()*+,./:;<=>?@\[\]^_`{|}~-]{1,256}"
#: What a bind password may hold: one sssd.conf value (``ldap_default_authtok``), which
#: ends at the line and loses spaces at either end. images/sssd/entrypoint.sh checks the same.
BIND_PASSWORD_RE = r"[!-~]{1,256}"

#: What marks an object slurmk8s made (render/names.py's labels() and CREATE_ONLY).
_OWNED_LABELS = {"app.kubernetes.io/managed-by": "slurmk8s-operator"}
_OWNED_MARKS = (f"{GROUP}/cluster", f"{GROUP}/create-only")


@dataclass(frozen=True)
class SecretRef:
    """One field of a spec that names a Secret key (a ConfigMap's; "": every key of it)."""

    path: str
    name: str
    key: str
    use: str
    kind: str = "Secret"
    #: The hosts the spec sends its value to (a password's): each must be allowed by the Secret.
    hosts: tuple[str, ...] = ()


def secret_refs(c: SlurmCluster, *, used_only: bool = False) -> list[SecretRef]:
    """Every Secret key the spec names, with its field path; ``used_only``: only
    those the rendered objects mount (the external password with accounting on)."""
    refs = [SecretRef(f"spec.login.users[{i}].sshPublicKeysFrom", u.ssh_public_keys_from.name,
                      u.ssh_public_keys_from.key, SSH_KEYS)
            for i, u in enumerate(c.spec.login.users) if u.ssh_public_keys_from is not None]
    acct = c.spec.accounting
    ext = acct.database.external
    if ext is not None and (acct.enabled or not used_only):
        refs.append(SecretRef("spec.accounting.database.external.passwordSecret", ext.password_secret.name,
                              ext.password_secret.key, DATABASE_PASSWORD, hosts=(ext.host,)))
    ldap = c.spec.identity.ldap
    if ldap is not None:
        path = "spec.identity.ldap"
        if ldap.bind_password_secret is not None:
            refs.append(SecretRef(f"{path}.bindPasswordSecret", ldap.bind_password_secret.name,
                                  ldap.bind_password_secret.key, LDAP_BIND_PASSWORD,
                                  hosts=tuple(dict.fromkeys(uri_host(u) for u in ldap.uris))))
        ca = ldap.ca
        if ca is not None and ca.secret is not None:
            refs.append(SecretRef(f"{path}.ca.secret", ca.secret.name, ca.secret.key, LDAP_CA))
        if ca is not None and ca.config_map is not None:
            refs.append(SecretRef(f"{path}.ca.configMap", ca.config_map.name, ca.config_map.key, LDAP_CA,
                                  kind="ConfigMap"))
    health = c.spec.health_check
    if health.site_checks and (health.enabled or not used_only):
        refs.append(SecretRef("spec.healthCheck.siteChecks", health.site_checks, "", HEALTH_CHECKS,
                              kind="ConfigMap"))
    return refs


def pull_secret_refs(c: SlurmCluster) -> list[SecretRef]:
    """The spec's ``imagePullSecrets``, as references the static rule checks."""
    return [SecretRef(f"spec.imagePullSecrets[{i}]", name, ".dockerconfigjson", IMAGE_PULL)
            for i, name in enumerate(c.spec.image_pull_secrets)]


def owned_name_error(ref: SecretRef) -> FieldError | None:
    """A refusal when ``ref`` names a Secret slurmk8s generates, for any cluster."""
    suffix = next((s for s in OWNED_SECRET_SUFFIXES if ref.name.endswith(s)), None)
    if suffix is None:
        return None
    pull = ref.use == IMAGE_PULL
    own = "of type kubernetes.io/dockerconfigjson" if pull else f"labelled {SECRET_USE_LABEL}={ref.use}"
    return FieldError(ref.path if pull else f"{ref.path}.name",
                      f"{quote(ref.name)} is the name of a Secret slurmk8s generates for a cluster (names ending "
                      f"in {quote(suffix)} hold its keys); name a Secret of your own, {own}")


def secret_problem(ref: SecretRef, secret: Mapping | None) -> str | None:
    """Why the Secret (or ConfigMap, by ``ref.kind``) read for ``ref`` (None: not found) may
    not be used, naming the field; None if it may."""
    shown = f"{ref.kind} {quote(ref.name)}"
    label = CONFIGMAP_USE_LABEL if ref.kind == "ConfigMap" else SECRET_USE_LABEL
    fix = f"label a {ref.kind} of your own {label}={ref.use} and name it here"
    if secret is None:
        return f"{ref.path}: {shown} does not exist in the cluster's namespace; {fix}"
    meta = secret.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    if any(labels.get(k) == v for k, v in _OWNED_LABELS.items()) or \
            any(m in labels or m in annotations for m in _OWNED_MARKS):
        return f"{ref.path}: {shown} was made by slurmk8s and holds a cluster's own keys; {fix}"
    if ref.kind == "Secret" and secret.get("type", "Opaque") != "Opaque":
        return (f"{ref.path}: {shown} is of type {quote(str(secret.get('type')))}; only Opaque "
                f"Secrets may be named; {fix}")
    if labels.get(label) != ref.use:
        return (f"{ref.path}: {shown} is not labelled {label}={ref.use}, which says its "
                f"owner meant it for this use; nothing of it is mounted until it is")
    allowed = {h.strip() for h in str(annotations.get(ALLOWED_HOSTS_ANNOTATION) or "").split(",") if h.strip()}
    foreign = [h for h in ref.hosts if h not in allowed]
    if foreign:
        return (f"{ref.path}: the spec sends the password in {shown} to {', '.join(map(quote, foreign))}, which "
                f"its annotation {ALLOWED_HOSTS_ANNOTATION} does not list; if its owner means it to go there: "
                f"kubectl annotate secret {ref.name} {ALLOWED_HOSTS_ANNOTATION}="
                f"{','.join(dict.fromkeys([*sorted(allowed), *ref.hosts]))} --overwrite")
    data = secret.get("data") or {}
    if ref.kind == "ConfigMap" and not ref.key:
        return None if data else f"{ref.path}: {shown} has no data: nothing in it to run"
    if ref.kind == "ConfigMap":
        return None if ref.key in data else f"{ref.path}.key: {shown} has no key {quote(ref.key)} in its data"
    if ref.key not in data:
        return f"{ref.path}.key: {shown} has no key {quote(ref.key)}"
    rule = {DATABASE_PASSWORD: (DB_PASSWORD_RE, "without spaces, '#', quotes or '\\' (slurmdbd.conf reads it "
                                                "unquoted)"),
            LDAP_BIND_PASSWORD: (BIND_PASSWORD_RE, "without spaces (sssd.conf reads it to the end of its line)")}
    if ref.use in rule:
        pattern, why = rule[ref.use]
        try:
            password = base64.b64decode(data[ref.key], validate=True).decode("ascii")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            password = None
        first = password.split("\n", 1)[0] if password is not None else None
        if first is None or not re.fullmatch(pattern, first):
            # The value itself is never quoted back: it is a password.
            return (f"{ref.path}.key: the password in {shown} key {quote(ref.key)} must be 1 to 256 "
                    f"printable ASCII characters {why}")
    return None
