"""What cert-manager (v1 API, cert-manager.io/v1) accepts of the Issuers and
Certificates the chart renders: the fields of its CRDs' schemas that the
chart may use, closed to any other (a misspelt field is pruned by the API
server and silently lost), and the rules its own admission webhook adds
(one issuer type, key sizes, durations). Written from cert-manager's API
reference; :func:`problems` checks one object against it."""

from __future__ import annotations

import re
from typing import Any

import jsonschema

__all__ = ["problems", "SCHEMAS", "USAGES"]

#: cert-manager's KeyUsage values (spec.usages).
USAGES = ["signing", "digital signature", "content commitment", "key encipherment", "key agreement",
          "data encipherment", "cert sign", "crl sign", "encipher only", "decipher only", "any", "server auth",
          "client auth", "code signing", "email protection", "s/mime", "ipsec end system", "ipsec tunnel",
          "ipsec user", "timestamping", "ocsp signing", "microsoft sgc", "netscape sgc"]

_STRINGS = {"type": "array", "items": {"type": "string"}}
_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_METADATA = {"type": "object", "required": ["name"], "properties": {
    "name": {"type": "string"}, "namespace": {"type": "string"}, "labels": _MAP, "annotations": _MAP}}
_ISSUER_REF = {"type": "object", "additionalProperties": False, "required": ["name"], "properties": {
    "name": {"type": "string"}, "kind": {"type": "string"}, "group": {"type": "string"}}}


def _closed(properties: dict, required: tuple[str, ...] = ()) -> dict:
    return {"type": "object", "additionalProperties": False, "properties": properties, "required": list(required)}


def _kind(kind: str, spec: dict) -> dict:
    return _closed({"apiVersion": {"const": "cert-manager.io/v1"}, "kind": {"const": kind},
                    "metadata": _METADATA, "spec": spec}, ("apiVersion", "kind", "metadata", "spec"))


_ISSUER_SPEC = {
    **_closed({
        "selfSigned": _closed({"crlDistributionPoints": _STRINGS}),
        "ca": _closed({"secretName": {"type": "string", "minLength": 1}, "crlDistributionPoints": _STRINGS,
                       "ocspServers": _STRINGS, "issuingCertificateURLs": _STRINGS}, ("secretName",)),
        "acme": {"type": "object"}, "vault": {"type": "object"}, "venafi": {"type": "object"},
    }),
    # Exactly one issuer type (cert-manager's webhook refuses none and several).
    "minProperties": 1, "maxProperties": 1,
}

_CERTIFICATE_SPEC = _closed({
    "secretName": {"type": "string", "minLength": 1},
    "secretTemplate": _closed({"annotations": _MAP, "labels": _MAP}),
    "issuerRef": _ISSUER_REF,
    "commonName": {"type": "string", "maxLength": 64},
    "dnsNames": _STRINGS, "ipAddresses": _STRINGS, "uris": _STRINGS, "emailAddresses": _STRINGS,
    "duration": {"type": "string"}, "renewBefore": {"type": "string"},
    "renewBeforePercentage": {"type": "integer"},
    "isCA": {"type": "boolean"},
    "usages": {"type": "array", "items": {"enum": USAGES}},
    "privateKey": _closed({"rotationPolicy": {"enum": ["Never", "Always"]},
                           "encoding": {"enum": ["PKCS1", "PKCS8"]},
                           "algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]},
                           "size": {"type": "integer"}}),
    "revisionHistoryLimit": {"type": "integer", "minimum": 1},
    "encodeUsagesInRequest": {"type": "boolean"},
}, ("secretName", "issuerRef"))

SCHEMAS = {"Issuer": _kind("Issuer", _ISSUER_SPEC), "Certificate": _kind("Certificate", _CERTIFICATE_SPEC)}

_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def _seconds(text: str) -> int | None:
    """A Go duration of hours, minutes and seconds, in seconds; None for what is not one."""
    m = _DURATION.fullmatch(text)
    if not m or not any(m.groups()):
        return None
    h, mi, s = (int(g or 0) for g in m.groups())
    return h * 3600 + mi * 60 + s


def problems(obj: dict[str, Any]) -> list[str]:
    """What cert-manager would refuse (or silently drop) in ``obj``; [] when nothing."""
    schema = SCHEMAS.get(obj.get("kind", ""))
    if schema is None:
        return [f"not a kind of cert-manager's the chart renders: {obj.get('kind')!r}"]
    out = [f"{'.'.join(map(str, e.absolute_path)) or '.'}: {e.message}"
           for e in jsonschema.Draft202012Validator(schema).iter_errors(obj)]
    if out or obj["kind"] != "Certificate":
        return out
    spec = obj["spec"]
    key = spec.get("privateKey") or {}
    sizes = {"ECDSA": (256, 384, 521), "RSA": tuple(range(2048, 8193))}.get(key.get("algorithm", "RSA"))
    if "size" in key and sizes is not None and key["size"] not in sizes:
        out.append(f"spec.privateKey.size: {key['size']} is not a size for {key.get('algorithm', 'RSA')}")
    duration = _seconds(spec.get("duration", "2160h"))
    renew = _seconds(spec["renewBefore"]) if "renewBefore" in spec else None
    if duration is None or duration < 3600:
        out.append("spec.duration: a duration of at least 1h (hours, minutes, seconds)")
    if "renewBefore" in spec and (renew is None or renew < 300 or (duration and renew >= duration)):
        out.append("spec.renewBefore: at least 5m and less than spec.duration")
    if not (spec.get("commonName") or spec.get("dnsNames") or spec.get("uris") or spec.get("ipAddresses")
            or spec.get("emailAddresses")):
        out.append("spec: at least one of commonName, dnsNames, uris, ipAddresses or emailAddresses")
    return out
