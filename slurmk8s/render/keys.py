"""Secret material a cluster needs: generated once, then only ever read back.

Generating keys is the one impure step of rendering, so it happens outside
``render()``: the caller passes a :class:`ClusterKeys`. The operator reads the
existing Secrets and generates keys only for a cluster that has none; the
Secrets are immutable, so a later render can never replace them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

MUNGE_KEY_BYTES = 1024  # what `mungekey --create` writes by default
JWT_KEY_BYTES = 32


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

    @classmethod
    def generate(cls) -> "ClusterKeys":
        host, _ = ssh_keypair()
        return cls(os.urandom(MUNGE_KEY_BYTES), os.urandom(JWT_KEY_BYTES), host)

    #: File names of the keys in a keys directory.
    FILES = {"munge_key": "munge.key", "jwt_key": "jwt_hs256.key", "ssh_host_key": "ssh_host_ed25519_key"}

    @classmethod
    def from_dir(cls, directory: Path) -> tuple["ClusterKeys", list[Path]]:
        """Keys from ``directory``; missing ones are generated and written there.

        Returns the keys and the files that were newly written.
        """
        directory.mkdir(parents=True, exist_ok=True)
        fresh = cls.generate()
        values, written = {}, []
        for f in fields(cls):
            path = directory / cls.FILES[f.name]
            if path.exists():
                values[f.name] = path.read_bytes()
            else:
                values[f.name] = getattr(fresh, f.name)
                path.touch(mode=0o600)
                path.write_bytes(values[f.name])
                written.append(path)
        return cls(**values), written

    def ssh_host_public_key(self) -> str:
        return public_line(self.ssh_host_key)
