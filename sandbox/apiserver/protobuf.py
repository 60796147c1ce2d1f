"""Just enough of Kubernetes' protobuf encoding to read what clients send that
way: the review and token requests of ``kubectl auth can-i``, ``auth
whoami`` and ``create token``, the Secrets and ConfigMaps that Helm
keeps its releases in, with the DeleteOptions it removes them with, and
what kubectl's ``create namespace | serviceaccount | quota | role |
rolebinding | clusterrole | clusterrolebinding`` send (client-go's typed
clients write built-in kinds as protobuf): the ``k8s\\0`` envelope
(``runtime.Unknown``) and those messages. Pure; answers are JSON (clients
accept it)."""

from __future__ import annotations

import base64
from typing import Any

MAGIC = b"k8s\x00"

# field number -> (json name, kind, repeated); kind is "string", "int", "bytes", or a schema name
Schema = dict[int, tuple[str, str, bool]]

SCHEMAS: dict[str, Schema] = {
    "Unknown": {1: ("typeMeta", "TypeMeta", False), 2: ("raw", "bytes", False), 3: ("contentEncoding", "string", False),
                4: ("contentType", "string", False)},
    "TypeMeta": {1: ("apiVersion", "string", False), 2: ("kind", "string", False)},
    "ObjectMeta": {1: ("name", "string", False), 2: ("generateName", "string", False), 3: ("namespace", "string", False),
                   5: ("uid", "string", False), 6: ("resourceVersion", "string", False),
                   11: ("labels", "map:string", False), 12: ("annotations", "map:string", False),
                   14: ("finalizers", "string", True)},
    "Secret": {2: ("data", "map:bytes", False), 3: ("type", "string", False), 4: ("stringData", "map:string", False),
               5: ("immutable", "bool", False)},
    "ConfigMap": {2: ("data", "map:string", False), 3: ("binaryData", "map:bytes", False),
                  4: ("immutable", "bool", False)},
    "DeleteOptions": {1: ("gracePeriodSeconds", "int", False), 2: ("preconditions", "Preconditions", False),
                      3: ("orphanDependents", "bool", False), 4: ("propagationPolicy", "string", False),
                      5: ("dryRun", "string", True)},
    "Preconditions": {1: ("uid", "string", False), 2: ("resourceVersion", "string", False)},
    "ResourceAttributes": {1: ("namespace", "string", False), 2: ("verb", "string", False), 3: ("group", "string", False),
                           4: ("version", "string", False), 5: ("resource", "string", False),
                           6: ("subresource", "string", False), 7: ("name", "string", False)},
    "NonResourceAttributes": {1: ("path", "string", False), 2: ("verb", "string", False)},
    "SelfSubjectAccessReviewSpec": {1: ("resourceAttributes", "ResourceAttributes", False),
                                    2: ("nonResourceAttributes", "NonResourceAttributes", False)},
    "SubjectAccessReviewSpec": {1: ("resourceAttributes", "ResourceAttributes", False),
                                2: ("nonResourceAttributes", "NonResourceAttributes", False),
                                3: ("user", "string", False), 4: ("groups", "string", True),
                                5: ("extra", "ExtraEntry", True), 6: ("uid", "string", False)},
    "ExtraEntry": {1: ("key", "string", False), 2: ("value", "ExtraValue", False)},
    "ExtraValue": {1: ("items", "string", True)},
    "SelfSubjectRulesReviewSpec": {1: ("namespace", "string", False)},
    "TokenReviewSpec": {1: ("token", "string", False), 2: ("audiences", "string", True)},
    "TokenRequestSpec": {1: ("audiences", "string", True), 3: ("boundObjectRef", "BoundObjectReference", False),
                         4: ("expirationSeconds", "int", False)},
    "BoundObjectReference": {1: ("kind", "string", False), 2: ("apiVersion", "string", False), 3: ("name", "string", False),
                             4: ("uid", "string", False)},
    # What `kubectl create namespace | serviceaccount | quota | role | rolebinding |
    # clusterrole | clusterrolebinding` send.
    "NamespaceSpec": {1: ("finalizers", "string", True)},
    "ServiceAccount": {3: ("imagePullSecrets", "LocalObjectReference", True),
                       4: ("automountServiceAccountToken", "bool", False)},
    "LocalObjectReference": {1: ("name", "string", False)},
    "ResourceQuotaSpec": {1: ("hard", "map:Quantity", False), 2: ("scopes", "string", True)},
    "Role": {2: ("rules", "PolicyRule", True)},
    "PolicyRule": {1: ("verbs", "string", True), 2: ("apiGroups", "string", True), 3: ("resources", "string", True),
                   4: ("resourceNames", "string", True), 5: ("nonResourceURLs", "string", True)},
    "RoleBinding": {2: ("subjects", "Subject", True), 3: ("roleRef", "RoleRef", False)},
    "Subject": {1: ("kind", "string", False), 2: ("apiGroup", "string", False), 3: ("name", "string", False),
                4: ("namespace", "string", False)},
    "RoleRef": {1: ("apiGroup", "string", False), 2: ("kind", "string", False), 3: ("name", "string", False)},
}

#: Kinds whose fields sit beside metadata (field 1) instead of in a spec, by schema.
FLAT_KINDS = {"Secret": "Secret", "ConfigMap": "ConfigMap", "ServiceAccount": "ServiceAccount", "Role": "Role",
              "ClusterRole": "Role", "RoleBinding": "RoleBinding", "ClusterRoleBinding": "RoleBinding"}
#: Kinds without metadata: every field is the message's own (a DELETE's body).
BARE_KINDS = {"DeleteOptions": "DeleteOptions"}

# kind -> spec schema (every one of these is metadata=1, spec=2)
KINDS = {
    "SelfSubjectAccessReview": "SelfSubjectAccessReviewSpec",
    "SubjectAccessReview": "SubjectAccessReviewSpec",
    "LocalSubjectAccessReview": "SubjectAccessReviewSpec",
    "SelfSubjectRulesReview": "SelfSubjectRulesReviewSpec",
    "SelfSubjectReview": "",
    "TokenReview": "TokenReviewSpec",
    "TokenRequest": "TokenRequestSpec",
    "Namespace": "NamespaceSpec",
    "ResourceQuota": "ResourceQuotaSpec",
}


class DecodeError(ValueError):
    pass


def _varint(data: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if i >= len(data):
            raise DecodeError("truncated varint")
        b = data[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7
        if shift > 63:
            raise DecodeError("varint too long")


def fields(data: bytes):
    """(field number, wire type, value) of every field of a message."""
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(data, i)
        elif wire == 2:
            n, i = _varint(data, i)
            if i + n > len(data):
                raise DecodeError("truncated field")
            value, i = data[i:i + n], i + n
        elif wire == 1:
            value, i = data[i:i + 8], i + 8
        elif wire == 5:
            value, i = data[i:i + 4], i + 4
        else:
            raise DecodeError(f"unsupported wire type {wire}")
        yield num, wire, value


def decode_message(data: bytes, schema: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    spec = SCHEMAS[schema]
    for num, wire, value in fields(data):
        if num not in spec:
            continue  # fields we do not read
        name, kind, repeated = spec[num]
        if kind not in ("int", "bool") and wire != 2:
            # bytes(an int) would allocate that many bytes: a garbage varint could exhaust memory
            raise DecodeError(f"field {num} ({name}) is length-delimited, not wire type {wire}")
        if kind == "string":
            v: Any = bytes(value).decode()
            if not v and not repeated:
                continue  # proto2 sends an empty optional string; Kubernetes' JSON leaves it out
        elif kind == "bytes":
            v = bytes(value)
        elif kind == "int":
            v = value if wire == 0 else int.from_bytes(value, "little")
        elif kind == "bool":
            v = bool(value)
        elif kind.startswith("map:"):
            entry = {n: bytes(x) for n, _w, x in fields(bytes(value))}
            key, val = entry.get(1, b"").decode(), entry.get(2, b"")
            if kind == "map:Quantity":  # resource.Quantity: its string in field 1
                out.setdefault(name, {})[key] = next((bytes(x).decode() for n, _w, x in fields(val) if n == 1), "")
                continue
            out.setdefault(name, {})[key] = (base64.b64encode(val).decode() if kind == "map:bytes"
                                             else val.decode())
            continue
        else:
            v = decode_message(bytes(value), kind)
        if repeated:
            out.setdefault(name, []).append(v)
        else:
            out[name] = v
    return out


def decode(body: bytes) -> dict[str, Any]:
    """A JSON-shaped object from a protobuf request body; raises :class:`DecodeError`
    for anything but the kinds in :data:`KINDS`."""
    if not body.startswith(MAGIC):
        raise DecodeError("not a Kubernetes protobuf envelope (no k8s\\0 prefix)")
    unknown = decode_message(body[len(MAGIC):], "Unknown")
    tm = unknown.get("typeMeta") or {}
    kind = tm.get("kind", "")
    if kind not in KINDS and kind not in FLAT_KINDS and kind not in BARE_KINDS:
        raise DecodeError(f"protobuf bodies are read only for {', '.join(sorted([*KINDS, *FLAT_KINDS, *BARE_KINDS]))}, "
                          f"not {kind or 'this kind'}")
    obj: dict[str, Any] = {"apiVersion": tm.get("apiVersion", ""), "kind": kind}
    if kind in BARE_KINDS:
        obj.update(decode_message(unknown.get("raw", b""), BARE_KINDS[kind]))
        return obj
    if kind in FLAT_KINDS:
        raw = unknown.get("raw", b"")
        meta_ = [bytes(v) for n, _w, v in fields(raw) if n == 1]
        obj["metadata"] = decode_message(meta_[0], "ObjectMeta") if meta_ else {}
        obj.update(decode_message(raw, FLAT_KINDS[kind]))
        return obj
    for num, _wire, value in fields(unknown.get("raw", b"")):
        if num == 1:
            obj["metadata"] = decode_message(bytes(value), "ObjectMeta")
        elif num == 2 and KINDS[kind]:
            obj["spec"] = decode_message(bytes(value), KINDS[kind])
    spec = obj.get("spec")
    if isinstance(spec, dict) and "extra" in spec:
        spec["extra"] = {e.get("key", ""): (e.get("value") or {}).get("items", []) for e in spec["extra"]}
    return obj


# --- encoding (tests build kubectl-shaped bodies with these) ------------------------------


def _enc_varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(num: int, payload: bytes) -> bytes:
    return _enc_varint(num << 3 | 2) + _enc_varint(len(payload)) + payload


def encode_message(obj: dict[str, Any], schema: str) -> bytes:
    out = b""
    for num, (name, kind, repeated) in sorted(SCHEMAS[schema].items()):
        if name not in obj:
            continue
        values = obj[name] if repeated else [obj[name]]
        for v in values:
            if kind == "string":
                out += _field(num, v.encode())
            elif kind == "bytes":
                out += _field(num, v)
            elif kind in ("int", "bool"):
                out += _enc_varint(num << 3) + _enc_varint(int(v))
            elif kind.startswith("map:"):
                for key, val in sorted(v.items()):
                    val = base64.b64decode(val) if kind == "map:bytes" else val.encode()
                    out += _field(num, _field(1, key.encode()) + _field(2, val))
            else:
                out += _field(num, encode_message(v, kind))
    return out


def encode(obj: dict[str, Any]) -> bytes:
    kind = obj["kind"]
    raw = _field(1, encode_message(obj.get("metadata") or {}, "ObjectMeta"))
    if kind in BARE_KINDS:
        raw = encode_message(obj, BARE_KINDS[kind])
    elif kind in FLAT_KINDS:
        raw += encode_message(obj, FLAT_KINDS[kind])
    elif KINDS.get(kind) and "spec" in obj:
        raw += _field(2, encode_message(obj["spec"], KINDS[kind]))
    return MAGIC + encode_message({"typeMeta": {"apiVersion": obj.get("apiVersion", ""), "kind": kind}, "raw": raw}, "Unknown")
