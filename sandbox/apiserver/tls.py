"""A private CA and the server's certificate, made with ``cryptography`` and kept
in the data directory (the CA survives restarts, so kubeconfigs stay valid; the
server certificate is remade when the names it must cover change)."""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pki:
    ca_cert: Path
    server_cert: Path
    server_key: Path

    @property
    def ca_pem(self) -> str:
        return self.ca_cert.read_text()


def _write(path: Path, data: bytes, private: bool = False) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def _sans(names: list[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for n in names:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            out.append(x509.DNSName(n))
    return out


def _cert_names(cert: x509.Certificate) -> set[str]:
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {str(v) for v in ext.get_values_for_type(x509.IPAddress)} | set(ext.get_values_for_type(x509.DNSName))


def _leaf(subject: x509.Name, usage, issuer, names: list[str] | None = None):
    """A new key and a ten-year end-entity certificate for ``subject`` with
    extended key usage ``usage`` (and ``names`` as its SANs), signed by
    ``issuer`` (CA certificate, CA key), or self-signed when it is None."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    issuer_name, signer = (issuer[0].subject, issuer[1]) if issuer else (subject, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(_sans(names)), critical=False)
    if issuer:
        builder = (builder
                   .add_extension(x509.KeyUsage(True, False, False, False, False, False, False, False, False),
                                  critical=True)
                   .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()),
                                  critical=False))
    return key, builder.sign(signer, hashes.SHA256())


def ensure(directory: Path, names: list[str], common_name: str = "slurmk8s-apiserver",
           ca_name: str = "slurmk8s-sandbox-ca") -> Pki:
    """The CA (``ca.crt``, ``ca.key``, made once, named ``ca_name``) and a server certificate
    (``server.crt``, ``server.key``) for ``common_name``, valid for ``names`` (IPs or DNS names).
    The API server's and the sandbox registry's (``sandbox/registry.py``), each in its own directory."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_cert_p, ca_key_p = directory / "ca.crt", directory / "ca.key"
    crt_p, key_p = directory / "server.crt", directory / "server.key"
    now = datetime.datetime.now(datetime.UTC)
    if ca_cert_p.exists() and ca_key_p.exists():
        ca_key = serialization.load_pem_private_key(ca_key_p.read_bytes(), None)
        ca_cert = x509.load_pem_x509_certificate(ca_cert_p.read_bytes())
    else:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ca_name)])
        ca_cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        _write(ca_key_p, _key_pem(ca_key), private=True)
        _write(ca_cert_p, ca_cert.public_bytes(serialization.Encoding.PEM))
        crt_p.unlink(missing_ok=True)
    want = set(names)
    if crt_p.exists() and key_p.exists():
        current = x509.load_pem_x509_certificate(crt_p.read_bytes())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        if (want <= _cert_names(current) and current.subject == subject and current.issuer == ca_cert.subject
                and current.not_valid_after_utc > now + datetime.timedelta(days=1)):
            return Pki(ca_cert_p, crt_p, key_p)
    key, cert = _leaf(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]),
                      ExtendedKeyUsageOID.SERVER_AUTH, issuer=(ca_cert, ca_key), names=sorted(want))
    _write(key_p, _key_pem(key), private=True)
    _write(crt_p, cert.public_bytes(serialization.Encoding.PEM))
    return Pki(ca_cert_p, crt_p, key_p)


#: The name the API server's client certificate carries when it calls kubelets.
KUBELET_CLIENT = "kube-apiserver-kubelet-client"


def ensure_kubelet_client(directory: Path) -> tuple[Path, Path]:
    """The certificate (and key) the API server shows kubelets: signed by the CA
    in ``directory`` (call ``ensure`` first), common name ``KUBELET_CLIENT``,
    organisation ``system:masters``, for client authentication only. Kubelets
    accept it because they trust the CA their kubeconfig names."""
    crt_p, key_p = directory / "kubelet-client.crt", directory / "kubelet-client.key"
    ca_cert = x509.load_pem_x509_certificate((directory / "ca.crt").read_bytes())
    now = datetime.datetime.now(datetime.UTC)
    if crt_p.exists() and key_p.exists():
        current = x509.load_pem_x509_certificate(crt_p.read_bytes())
        if current.issuer == ca_cert.subject and current.not_valid_after_utc > now + datetime.timedelta(days=1):
            return crt_p, key_p
    ca_key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), None)
    key, cert = _leaf(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
                                 x509.NameAttribute(NameOID.COMMON_NAME, KUBELET_CLIENT)]),
                      ExtendedKeyUsageOID.CLIENT_AUTH, issuer=(ca_cert, ca_key))
    _write(key_p, _key_pem(key), private=True)
    _write(crt_p, cert.public_bytes(serialization.Encoding.PEM))
    return crt_p, key_p


def ensure_self_signed(directory: Path, names: list[str], common_name: str) -> tuple[Path, Path]:
    """A self-signed serving certificate for ``names`` (what a kubelet serves
    with when no CA signs one for it, as kubelets do by default)."""
    directory.mkdir(parents=True, exist_ok=True)
    crt_p, key_p = directory / "server.crt", directory / "server.key"
    now = datetime.datetime.now(datetime.UTC)
    if crt_p.exists() and key_p.exists():
        current = x509.load_pem_x509_certificate(crt_p.read_bytes())
        if set(names) <= _cert_names(current) and current.not_valid_after_utc > now + datetime.timedelta(days=1):
            return crt_p, key_p
    key, cert = _leaf(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]),
                      ExtendedKeyUsageOID.SERVER_AUTH, issuer=None, names=sorted(set(names)))
    _write(key_p, _key_pem(key), private=True)
    _write(crt_p, cert.public_bytes(serialization.Encoding.PEM))
    return crt_p, key_p
