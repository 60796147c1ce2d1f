"""Secret material a cluster needs: generated once, then only ever read back.

Generating keys is the one impure step of rendering, so it happens outside
``render()``: the caller passes a :class:`ClusterKeys`. The operator reads the
existing Secrets and generates a key only for a Secret that is missing (a
round that finds them all generates nothing); the Secrets are immutable, so
a later render can never replace them.
"""

from __future__ import annotations

import base64
import os
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from ..api.cluster import SlurmCluster
from . import names

MUNGE_KEY_BYTES = 1024  # what `mungekey --create` writes by default
JWT_KEY_BYTES = 32
AGENT_TOKEN_BYTES = 32  # written as 64 hex digits: printable, fits an HTTP header
DB_PASSWORD_BYTES = 24  # 48 hex digits: no character a config file or SQL string would need quoted


def ssh_keypair() -> tuple[bytes, str]:
    """A new ed25519 key: (OpenSSH private key PEM, ``ssh-ed25519 AAAA...`` public line)."""
    key = ed25519.Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    return private, public_line(private)


def public_line(private: bytes) -> str:
    """The OpenSSH public key line of an OpenSSH private key."""
    key = serialization.load_ssh_private_key(private, password=None)
    return key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    ).decode()


@dataclass(frozen=True)
class ClusterKeys:
    munge_key: bytes
    jwt_key: bytes
    #: OpenSSH private key (PEM text) of the login pods' sshd; one host key for
    #: every login replica, stable across restarts, so known_hosts keeps working.
    ssh_host_key: bytes
    #: Bearer token of the Slurm agent beside slurmctld (ASCII hex); the
    #: operator and the bridge present it, the agent refuses requests without it.
    agent_token: bytes
    #: Password of the managed accounting database's user (ASCII hex): only
    #: with spec.accounting on and its database managed.
    db_password: bytes = b""

    @classmethod
    def generate(cls) -> ClusterKeys:
        return cls(**{f.name: cls.new_key(f.name) for f in fields(cls)})

    @staticmethod
    def new_key(name: str) -> bytes:
        """A new key for the field ``name`` (munge_key, jwt_key, ssh_host_key, agent_token, db_password)."""
        if name == "munge_key":
            return os.urandom(MUNGE_KEY_BYTES)
        if name == "jwt_key":
            return os.urandom(JWT_KEY_BYTES)
        if name == "ssh_host_key":
            return ssh_keypair()[0]
        if name == "agent_token":
            return secrets.token_hex(AGENT_TOKEN_BYTES).encode()
        if name == "db_password":
            return secrets.token_hex(DB_PASSWORD_BYTES).encode()
        raise ValueError(f"no key called {name!r}")

    #: File names of the keys in a keys directory.
    FILES = {
        "munge_key": "munge.key",
        "jwt_key": "jwt_hs256.key",
        "ssh_host_key": "ssh_host_ed25519_key",
        "agent_token": "agent.token",
        "db_password": "db.password",
    }

    @classmethod
    def from_dir(cls, directory: Path) -> tuple[ClusterKeys, list[Path]]:
        """Keys from ``directory``; missing ones are generated and written there.

        Returns the keys and the files that were newly written.
        """
        directory.mkdir(parents=True, exist_ok=True)
        values, written = {}, []
        for f in fields(cls):
            path = directory / cls.FILES[f.name]
            if path.exists():
                values[f.name] = path.read_bytes()
            else:
                values[f.name] = cls.new_key(f.name)  # only the keys that are missing
                path.touch(mode=0o600)
                path.write_bytes(values[f.name])
                written.append(path)
        return cls(**values), written

    def ssh_host_public_key(self) -> str:
        return public_line(self.ssh_host_key)


#: Where each key lives in the cluster: (Secret name, data key).
SECRETS = {
    "munge_key": (names.munge_secret, "munge.key"),
    "jwt_key": (names.jwt_secret, "jwt_hs256.key"),
    "ssh_host_key": (names.ssh_host_keys_secret, "ssh_host_ed25519_key"),
    "agent_token": (names.agent_token_secret, "token"),
    "db_password": (names.db_password_secret, "password"),
}


#: Whether a cluster uses each key: the JWT key only with slurmrestd (spec.restApi).
USED: dict[str, Callable[[SlurmCluster], bool]] = {
    "munge_key": lambda c: True,
    "jwt_key": lambda c: c.spec.rest_api.enabled,
    "ssh_host_key": lambda c: True,
    "agent_token": lambda c: True,
    "db_password": lambda c: c.spec.accounting.enabled and c.spec.accounting.database.external is None,
}


def key_secret_names(cluster: SlurmCluster | str) -> list[str]:
    """The names of a cluster's key Secrets (the cluster or its name): the
    operator reads them one by one, never by listing Secrets."""
    return [name_of(cluster) for name_of, _ in SECRETS.values()]


class BadKeySecret(ValueError):
    """An existing key Secret cannot be read; it is never replaced automatically."""


class ForeignKeySecret(BadKeySecret):
    """A key Secret exists that slurmk8s did not create for this cluster (one
    planted before it, say): its key is never used, and it is never replaced."""


def owns(cluster: SlurmCluster, secret: Mapping) -> bool:
    """Whether ``secret`` is one the operator created for ``cluster``: labelled
    for it and managed by the operator, with a controller ownerReference to
    this SlurmCluster's uid. The uid is set when the cluster is created, so a
    Secret planted before that cannot carry it; a cluster without a uid
    owns nothing (fail closed)."""
    meta = secret.get("metadata") or {}
    labels = meta.get("labels") or {}
    uid = cluster.metadata.uid
    if not uid or names.rendered_for(labels) != cluster.name:
        return False
    return any(isinstance(ref, Mapping) and ref.get("uid") == uid and ref.get("controller") is True
               and ref.get("kind") == cluster.kind and ref.get("name") == cluster.name
               for ref in meta.get("ownerReferences") or [])


def keys_from_secrets(
    cluster: SlurmCluster, existing: Mapping[str, Mapping],
    fresh: ClusterKeys | Callable[[str], bytes] = ClusterKeys.new_key,
) -> tuple[ClusterKeys, list[str]]:
    """The cluster's keys from its existing Secrets (by name), ``fresh`` ones where none exists.

    ``fresh``: new keys, or what makes one by field name
    (:meth:`ClusterKeys.new_key`), called only for a Secret that is missing:
    a round that finds its keys generates none, and a key the cluster does
    not use (:data:`USED`) is left empty. Returns the keys and the names of
    the Secrets that did not exist (their keys come from ``fresh``).
    A Secret that exists but lacks its key raises :class:`BadKeySecret`:
    replacing a key would cut every node off, so that is left to a person.
    One the cluster does not :func:`own` raises :class:`ForeignKeySecret`:
    whoever made it knows the key (a munge key forges any user's
    credentials), so it is neither used nor replaced.
    """
    values, missing = {}, []
    for f in fields(ClusterKeys):
        name_of, data_key = SECRETS[f.name]
        name = name_of(cluster)
        secret = existing.get(name)
        if secret is None and not USED[f.name](cluster):
            values[f.name] = b""  # rendered nowhere: nothing to generate
            continue
        if secret is None:
            values[f.name] = getattr(fresh, f.name) if isinstance(fresh, ClusterKeys) else fresh(f.name)
            missing.append(name)
            continue
        if not owns(cluster, secret):
            raise ForeignKeySecret(
                f"Secret {name} exists but was not created by slurmk8s for SlurmCluster "
                f"{cluster.namespace}/{cluster.name} (it lacks the cluster's labels or a controller "
                f"ownerReference to its uid {cluster.metadata.uid or '(none)'}): its key is not used and the "
                f"Secret is not overwritten. Find out who made it; then delete it "
                f"(kubectl -n {cluster.namespace} delete secret {name}) and the operator creates a new one")
        encoded = (secret.get("data") or {}).get(data_key)
        if not encoded:
            raise BadKeySecret(
                f"Secret {name} exists but has no {data_key!r} key: restore it from a backup, or delete "
                f"the Secret to have a new one generated (then restart the cluster's pods)")
        try:
            values[f.name] = base64.b64decode(encoded, validate=True)
        except ValueError:
            raise BadKeySecret(
                f"Secret {name}: data.{data_key} is not base64: restore the Secret, or delete it to "
                f"have a new one generated (then restart the cluster's pods)") from None
    return ClusterKeys(**values), missing
