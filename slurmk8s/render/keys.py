"""Secret material a cluster needs: generated once, then only ever read back.

Generating keys is the one impure step of rendering, so it happens outside
``render()``: the caller passes a :class:`ClusterKeys`. The operator reads the
existing Secrets and generates keys only for a cluster that has none; the
Secrets are immutable, so a later render can never replace them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

MUNGE_KEY_BYTES = 1024  # what `mungekey --create` writes by default
JWT_KEY_BYTES = 32


@dataclass(frozen=True)
class ClusterKeys:
    munge_key: bytes
    jwt_key: bytes
    #: OpenSSH private key (PEM text) of the login pods' sshd; one host key for
    #: every login replica, stable across restarts, so known_hosts keeps working.
    ssh_host_key: bytes

    @classmethod
    def generate(cls) -> "ClusterKeys":
        host = ed25519.Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
        return cls(os.urandom(MUNGE_KEY_BYTES), os.urandom(JWT_KEY_BYTES), host)

    def ssh_host_public_key(self) -> str:
        key = serialization.load_ssh_private_key(self.ssh_host_key, password=None)
        return key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        ).decode()
