"""Authentication: who a bearer token is.

Two kinds of tokens, as kube-apiserver knows them:

- a static token file (``--token-auth-file``: CSV ``token,user,uid,"group1,group2"``),
  ``D/tokens.csv``, holding the admin (``system:masters``) and kubelet
  (``system:nodes``) tokens;
- ServiceAccount tokens: RS256 JWTs issued by TokenRequest
  (``POST .../serviceaccounts/<name>/token``), signed with ``D/pki/sa.key``,
  bound to a Pod or not, checked against the ServiceAccount (and Pod) still
  existing with the same uid (a Pod being deleted: until 60 s past its
  deletionTimestamp).

The parsing, claim building and claim checking are pure; :class:`Authenticator`
holds the keys and asks a lookup for the objects.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import secrets
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from .rbac import AUTHENTICATED, SA_GROUP, User, service_account_groups, service_account_user

ADMIN_USER = "sandbox-admin"
KUBELET_USER = "system:node:sandbox"
NODES_GROUP = "system:nodes"
MASTERS_GROUP = "system:masters"
ISSUER = "https://kubernetes.default.svc.cluster.local"
MIN_EXPIRATION = 600
DEFAULT_EXPIRATION = 3600
MAX_EXPIRATION = 2**32  # Kubernetes caps at 2^32 seconds
# a token bound to a pod being deleted stays valid until 60 s past the pod's
# deletionTimestamp (the end of its grace period), as Kubernetes' validator allows
DELETED_GRACE = 60


class TokenError(Exception):
    """The token is not valid (the message says why; it never holds the token)."""


# --- static token file ----------------------------------------------------------------


@dataclass(frozen=True)
class StaticToken:
    token: str
    user: str
    uid: str
    groups: tuple[str, ...]


def parse_token_file(text: str) -> list[StaticToken]:
    """Rows of a kube-apiserver ``--token-auth-file`` (blank lines and ``#`` comments skipped)."""
    out = []
    for row in csv.reader(io.StringIO(text)):
        if not row or not row[0].strip() or row[0].lstrip().startswith("#"):
            continue
        if len(row) < 3:
            raise ValueError("a token file line needs at least token,user,uid")
        groups = tuple(g.strip() for g in (row[3] if len(row) > 3 else "").split(",") if g.strip())
        out.append(StaticToken(row[0].strip(), row[1].strip(), row[2].strip(), groups))
    return out


def render_token_file(rows: list[StaticToken]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, quoting=csv.QUOTE_MINIMAL, lineterminator="\n")
    for r in rows:
        w.writerow([r.token, r.user, r.uid, ",".join(r.groups)])
    return buf.getvalue()


def ensure_rows(rows: list[StaticToken], wanted: list[StaticToken]) -> list[StaticToken]:
    """``rows`` with every ``wanted`` row present: a row for the same user is
    replaced by the wanted one, other rows are kept."""
    users = {w.user for w in wanted}
    return [r for r in rows if r.user not in users] + list(wanted)


def static_user(row: StaticToken) -> User:
    groups = tuple(dict.fromkeys((*row.groups, AUTHENTICATED)))
    return User(row.user, groups, row.uid)


# --- JWT (RS256), as Kubernetes' serviceaccount token generator -----------------------


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(s: str) -> bytes:
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def key_id(public_key: rsa.RSAPublicKey) -> str:
    der = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return _b64(hashlib.sha256(der).digest())


def sign(key: rsa.RSAPrivateKey, claims: Mapping) -> str:
    header = {"alg": "RS256", "kid": key_id(key.public_key())}
    signing_input = _b64(json.dumps(header, separators=(",", ":")).encode()) + "." + _b64(json.dumps(claims, separators=(",", ":")).encode())
    sig = key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
    return signing_input + "." + _b64(sig)


def verify(public_key: rsa.RSAPublicKey, token: str) -> dict:
    """The claims of a JWT signed by ``public_key``; raises :class:`TokenError`."""
    parts = token.split(".")
    if len(parts) != 3:
        raise TokenError("not a JWT")
    try:
        header = json.loads(_unb64(parts[0]))
        claims = json.loads(_unb64(parts[1]))
        sig = _unb64(parts[2])
    except (ValueError, UnicodeDecodeError) as e:
        raise TokenError("malformed JWT") from e
    if not isinstance(header, dict) or header.get("alg") != "RS256" or not isinstance(claims, dict):
        raise TokenError("unsupported JWT (RS256 only)")
    try:
        public_key.verify(sig, (parts[0] + "." + parts[1]).encode(), padding.PKCS1v15(), hashes.SHA256())
    except InvalidSignature as e:
        raise TokenError("invalid signature") from e
    return claims


def looks_like_jwt(token: str) -> bool:
    return token.count(".") == 2 and token.startswith("eyJ")


# --- ServiceAccount claims ---------------------------------------------------------------


def service_account_claims(*, issuer: str, audiences: list[str], now: int, expiration: int, namespace: str,
                           sa_name: str, sa_uid: str, pod: tuple[str, str] | None = None, jti: str | None = None) -> dict:
    """The claims Kubernetes puts in a bound ServiceAccount token."""
    k8s: dict = {"namespace": namespace, "serviceaccount": {"name": sa_name, "uid": sa_uid}}
    if pod is not None:
        k8s["pod"] = {"name": pod[0], "uid": pod[1]}
    return {
        "aud": list(audiences),
        "exp": now + expiration,
        "iat": now,
        "iss": issuer,
        "jti": jti or str(uuid.uuid4()),
        "kubernetes.io": k8s,
        "nbf": now,
        "sub": service_account_user(namespace, sa_name),
    }


@dataclass(frozen=True)
class SAClaims:
    namespace: str
    name: str
    uid: str
    pod_name: str = ""
    pod_uid: str = ""
    jti: str = ""


def check_claims(claims: Mapping, *, issuer: str, audiences: list[str], now: int, leeway: int = 60) -> SAClaims:
    """What a ServiceAccount token's claims say, if they are valid now for one
    of ``audiences``; raises :class:`TokenError` saying why not."""
    if claims.get("iss") != issuer:
        raise TokenError("token issuer is not this server")
    aud = claims.get("aud")
    aud = [aud] if isinstance(aud, str) else list(aud or [])
    if not any(a in audiences for a in aud):
        raise TokenError("token audiences do not match this server's")
    try:
        exp, nbf = int(claims["exp"]), int(claims.get("nbf", 0))
    except (KeyError, TypeError, ValueError) as e:
        raise TokenError("token has no valid expiry") from e
    if now > exp + leeway:
        raise TokenError("token has expired")
    if now + leeway < nbf:
        raise TokenError("token is not valid yet")
    k8s = claims.get("kubernetes.io") or {}
    sa = k8s.get("serviceaccount") or {}
    ns, name, uid = k8s.get("namespace") or "", sa.get("name") or "", sa.get("uid") or ""
    if not (ns and name and uid) or claims.get("sub") != service_account_user(ns, name):
        raise TokenError("token does not name a service account")
    pod = k8s.get("pod") or {}
    return SAClaims(ns, name, uid, pod.get("name") or "", pod.get("uid") or "", claims.get("jti") or "")


def sa_user(c: SAClaims) -> User:
    extra: dict[str, tuple[str, ...]] = {}
    if c.pod_name:
        extra["authentication.kubernetes.io/pod-name"] = (c.pod_name,)
        extra["authentication.kubernetes.io/pod-uid"] = (c.pod_uid,)
    if c.jti:
        extra["authentication.kubernetes.io/credential-id"] = (f"JTI={c.jti}",)
    return User(service_account_user(c.namespace, c.name), service_account_groups(c.namespace), c.uid, extra)


def expiration_of(spec: Mapping) -> int:
    """``spec.expirationSeconds`` of a TokenRequest (default 3600); raises ValueError."""
    value = spec.get("expirationSeconds")
    if value is None:
        return DEFAULT_EXPIRATION
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError("spec.expirationSeconds must be an integer")
    if value < MIN_EXPIRATION:
        raise ValueError("may not specify a duration less than 10 minutes")
    if value > MAX_EXPIRATION:
        raise ValueError("may not specify a duration larger than 2^32 seconds")
    return value


# --- the shell: keys on disk and lookups -------------------------------------------------

# (namespace, name) -> uid of a live object, or None
Lookup = Callable[[str, str], "str | None"]


def _write_private(path: Path, data: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(data)
    os.replace(tmp, path)


def load_or_create_key(path: Path) -> rsa.RSAPrivateKey:
    if path.exists():
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        assert isinstance(key, rsa.RSAPrivateKey), f"{path} is not an RSA key"
        return key
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_private(path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()).decode())
    return key


def ensure_token_file(path: Path, admin_token: str) -> tuple[list[StaticToken], str]:
    """Makes ``path`` hold the admin token (``sandbox-admin``, ``system:masters``)
    and a kubelet token (``system:node:sandbox``, ``system:nodes``), keeping
    other rows; returns the rows and the kubelet token."""
    rows = parse_token_file(path.read_text()) if path.exists() else []
    kubelet = next((r for r in rows if r.user == KUBELET_USER), None)
    kubelet_token = kubelet.token if kubelet is not None else secrets.token_urlsafe(32)
    wanted = [
        StaticToken(admin_token, ADMIN_USER, "sandbox-admin", (MASTERS_GROUP,)),
        StaticToken(kubelet_token, KUBELET_USER, "system:node:sandbox", (NODES_GROUP,)),
    ]
    new = ensure_rows(rows, wanted)
    if new != rows or not path.exists():
        _write_private(path, render_token_file(new))
    os.chmod(path, 0o600)
    return new, kubelet_token


class Authenticator:
    """Bearer token -> :class:`User` (or :class:`TokenError`)."""

    def __init__(self, rows: list[StaticToken], key: rsa.RSAPrivateKey, issuer: str = ISSUER,
                 service_account: Lookup | None = None, pod: Callable[[str, str], tuple[str, float | None] | None] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.rows = rows
        self.key = key
        self.public_key = key.public_key()
        self.issuer = issuer
        self.service_account = service_account or (lambda ns, name: None)
        self.pod = pod or (lambda ns, name: None)  # -> (uid, deletionTimestamp as Unix seconds or None)
        self.clock = clock

    def issue(self, namespace: str, sa_name: str, sa_uid: str, audiences: list[str] | None, expiration: int,
              pod: tuple[str, str] | None = None) -> tuple[str, int]:
        """A signed token and its expiry (Unix seconds)."""
        now = int(self.clock())
        claims = service_account_claims(issuer=self.issuer, audiences=audiences or [self.issuer], now=now,
                                        expiration=expiration, namespace=namespace, sa_name=sa_name, sa_uid=sa_uid, pod=pod)
        return sign(self.key, claims), claims["exp"]

    def authenticate(self, token: str, audiences: list[str] | None = None) -> User:
        token = token.strip()
        if not token:
            raise TokenError("empty token")
        if looks_like_jwt(token):
            return self._service_account(token, audiences or [self.issuer])
        found = None
        for r in self.rows:  # compare every row in constant time
            if secrets.compare_digest(r.token.encode(), token.encode()):
                found = r
        if found is None:
            raise TokenError("unknown token")
        return static_user(found)

    def _service_account(self, token: str, audiences: list[str]) -> User:
        claims = verify(self.public_key, token)
        c = check_claims(claims, issuer=self.issuer, audiences=audiences, now=int(self.clock()))
        uid = self.service_account(c.namespace, c.name)
        if uid is None:
            raise TokenError(f"service account {c.namespace}/{c.name} has been deleted")
        if uid != c.uid:
            raise TokenError(f"service account UID ({c.uid}) does not match the existing {c.namespace}/{c.name} ({uid})")
        if c.pod_name:
            pod = self.pod(c.namespace, c.pod_name)
            if pod is None:
                raise TokenError(f"pod {c.namespace}/{c.pod_name} the token is bound to has been deleted")
            if pod[0] != c.pod_uid:
                raise TokenError(f"pod UID ({c.pod_uid}) does not match the existing {c.namespace}/{c.pod_name} ({pod[0]})")
            if pod[1] is not None and pod[1] < self.clock() - DELETED_GRACE:
                raise TokenError(f"pod {c.namespace}/{c.pod_name} the token is bound to was deleted more than {DELETED_GRACE} s ago")
        return sa_user(c)


__all__ = ["Authenticator", "TokenError", "StaticToken", "SA_GROUP", "ADMIN_USER", "KUBELET_USER", "ISSUER"]
