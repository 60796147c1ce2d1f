"""The webhook's serving certificate and its CA, as the process that serves
the webhook keeps them (decision record 53): what the Secret holds, what is
due (:func:`plan`) and the Secret's next contents (:func:`renew`). No I/O;
:mod:`.certkeeper` reads and writes the Secret and the webhook
configuration's ``caBundle``.

The Secret (``<release>-webhook-certs``, made empty by the chart) holds:

- ``ca.crt``: every CA the API server is to trust (PEM, the current one
  first), which is what ``caBundle`` must be;
- ``ca.key``: the current CA's key;
- ``tls.crt``, ``tls.key``: the serving certificate, for the Service's names.

Rules: a CA lives :data:`CA_LIFETIME` and is replaced once less than
:data:`LEAF_LIFETIME` of it is left (so a certificate it signs never outlives
it); a serving certificate lives :data:`LEAF_LIFETIME` and is replaced once a
third of that is left, when its names are not the Service's, or when it is not
the current CA's. A new serving certificate from a new CA waits until the
configuration's ``caBundle`` trusts that CA (the old one stays trusted until it
expires), so the API server never meets a certificate it cannot verify, unless
there is no usable one at all: then both are made at once.
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["CA_LIFETIME", "LEAF_LIFETIME", "LEAF_RENEW_BEFORE", "Stored", "Plan", "read", "plan", "renew",
           "service_names", "bundle_certs", "pem_bundle", "leaf_pems"]

CA_LIFETIME = dt.timedelta(days=3650)
LEAF_LIFETIME = dt.timedelta(days=365)
#: A serving certificate is replaced once less than this is left of it.
LEAF_RENEW_BEFORE = LEAF_LIFETIME / 3
#: A CA is replaced once less than this is left of it: a certificate it signs then would outlive it.
CA_RENEW_BEFORE = LEAF_LIFETIME
#: Clocks differ: certificates are valid from a little before they are made.
BACKDATE = dt.timedelta(minutes=5)

_Key = ec.EllipticCurvePrivateKey


@dataclass(frozen=True)
class Stored:
    """What the Secret holds, read: each part None when absent or unreadable."""

    trusted: tuple[x509.Certificate, ...] = ()
    ca_key: _Key | None = None
    leaf: x509.Certificate | None = None
    leaf_key: _Key | None = None

    @property
    def ca(self) -> x509.Certificate | None:
        return self.trusted[0] if self.trusted else None


@dataclass(frozen=True)
class Plan:
    """What is due: a new CA, a new serving certificate (or neither)."""

    new_ca: bool = False
    new_leaf: bool = False

    @property
    def writes(self) -> bool:
        return self.new_ca or self.new_leaf


def service_names(service: str, namespace: str) -> tuple[str, ...]:
    """The names the API server may call the Service by; the first is the one it verifies."""
    return (f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local", f"{service}.{namespace}",
            service)


def bundle_certs(pem: bytes) -> tuple[x509.Certificate, ...]:
    """The certificates of a PEM bundle; () for what does not read as one."""
    try:
        return tuple(x509.load_pem_x509_certificates(pem))
    except ValueError:
        return ()


def pem_bundle(certs: Sequence[x509.Certificate]) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)


def _key(pem: bytes) -> _Key | None:
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError):
        return None
    return key if isinstance(key, ec.EllipticCurvePrivateKey) else None


def read(data: Mapping[str, str] | None) -> Stored:
    """A Secret's ``data`` (base64 values) -> :class:`Stored`."""
    def raw(key: str) -> bytes:
        try:
            return base64.b64decode((data or {}).get(key) or "", validate=True)
        except ValueError:
            return b""

    leaves = bundle_certs(raw("tls.crt"))
    return Stored(trusted=bundle_certs(raw("ca.crt")), ca_key=_key(raw("ca.key")),
                  leaf=leaves[0] if leaves else None, leaf_key=_key(raw("tls.key")))


def _left(cert: x509.Certificate, now: dt.datetime) -> dt.timedelta:
    """How long ``cert`` is still valid (negative: not valid, or not yet)."""
    if cert.not_valid_before_utc > now:
        return dt.timedelta(-1)
    return cert.not_valid_after_utc - now


def _same_key(cert: x509.Certificate, key: _Key | None) -> bool:
    public = cert.public_key()
    return (key is not None and isinstance(public, ec.EllipticCurvePublicKey)
            and public.public_numbers() == key.public_key().public_numbers())


def _issued_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


def _names(cert: x509.Certificate) -> set[str]:
    try:
        return set(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
                   .value.get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        return set()


def _usable_leaf(s: Stored, names: Sequence[str], now: dt.datetime) -> bool:
    """Whether the serving certificate can serve now: its key, its names, valid, from a trusted CA."""
    return (s.leaf is not None and _same_key(s.leaf, s.leaf_key) and set(names) <= _names(s.leaf)
            and _left(s.leaf, now) > dt.timedelta(0) and any(_issued_by(s.leaf, ca) for ca in s.trusted))


def plan(s: Stored, names: Sequence[str], now: dt.datetime, config_bundle: Sequence[x509.Certificate]) -> Plan:
    """What is due for the Secret ``s`` at ``now``, for a Service called ``names``, while the
    webhook configuration trusts ``config_bundle``."""
    ca = s.ca
    ca_ok = ca is not None and _same_key(ca, s.ca_key) and _left(ca, now) > CA_RENEW_BEFORE
    usable = _usable_leaf(s, names, now)
    if not ca_ok:
        # Nothing served can be hurt by a new serving certificate when none is usable.
        return Plan(new_ca=True, new_leaf=not usable)
    assert ca is not None
    leaf_ok = usable and s.leaf is not None and _issued_by(s.leaf, ca) and _left(s.leaf, now) > LEAF_RENEW_BEFORE
    trusted = any(c == ca for c in config_bundle)
    return Plan(new_leaf=not leaf_ok and (trusted or not usable))


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _ca(common: str, now: dt.datetime) -> tuple[x509.Certificate, _Key]:
    key = ec.generate_private_key(ec.SECP256R1())
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (x509.CertificateBuilder().subject_name(_name(common)).issuer_name(_name(common))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE).not_valid_after(now + CA_LIFETIME)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(ski, critical=False)
            .sign(key, hashes.SHA256()))
    return cert, key


def _leaf(names: Sequence[str], ca: x509.Certificate, ca_key: _Key, now: dt.datetime) -> tuple[x509.Certificate, _Key]:
    key = ec.generate_private_key(ec.SECP256R1())
    until = min(now + LEAF_LIFETIME, ca.not_valid_after_utc)
    cert = (x509.CertificateBuilder().subject_name(_name(names[0])).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE).not_valid_after(until)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return cert, key


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _key_pem(key: _Key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def leaf_pems(s: Stored) -> tuple[bytes, bytes]:
    """The serving certificate and its key, PEM, as a TLS server loads them."""
    assert s.leaf is not None and s.leaf_key is not None
    return s.leaf.public_bytes(serialization.Encoding.PEM), _key_pem(s.leaf_key)


def renew(s: Stored, p: Plan, names: Sequence[str], now: dt.datetime, common: str) -> dict[str, str]:
    """The Secret's next ``data`` after plan ``p`` (new keys: not deterministic). A new CA
    named ``common`` goes first in ``ca.crt``; the CAs there before stay while they are valid."""
    trusted = [c for c in s.trusted if _left(c, now) > dt.timedelta(0)]
    ca, ca_key = s.ca, s.ca_key
    if p.new_ca or ca is None or ca_key is None:
        ca, ca_key = _ca(common, now)
        trusted = [ca, *(c for c in trusted if c != ca)]
    leaf, leaf_key = s.leaf, s.leaf_key
    if p.new_leaf or leaf is None or leaf_key is None:
        leaf, leaf_key = _leaf(names, ca, ca_key, now)
    return {"ca.crt": _b64(pem_bundle(trusted)), "ca.key": _b64(_key_pem(ca_key)),
            "tls.crt": _b64(leaf.public_bytes(serialization.Encoding.PEM)), "tls.key": _b64(_key_pem(leaf_key))}
