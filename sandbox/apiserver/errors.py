"""Kubernetes ``Status`` errors: every refusal the stand-in gives is one of these."""

from __future__ import annotations

from typing import Any

REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    504: "Timeout",
}


class APIError(Exception):
    """An error answered as a ``Status`` object with an HTTP code."""

    def __init__(
        self,
        code: int,
        message: str,
        reason: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or REASONS.get(code, "Unknown")
        self.details = details

    def status(self) -> dict[str, Any]:
        return status_object(self.code, self.message, self.reason, self.details)


def status_object(code: int, message: str, reason: str, details: dict | None = None) -> dict:
    out: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        out["details"] = details
    return out


def success_status(details: dict | None = None) -> dict:
    out: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}
    if details:
        out["details"] = details
    return out


def qualified(plural: str, group: str) -> str:
    """``pods`` or ``deployments.apps``, as Kubernetes names a resource in messages."""
    return f"{plural}.{group}" if group else plural


def not_found(plural: str, group: str, name: str) -> APIError:
    return APIError(
        404,
        f'{qualified(plural, group)} "{name}" not found',
        "NotFound",
        {"name": name, "group": group, "kind": plural} if group else {"name": name, "kind": plural},
    )


def already_exists(plural: str, group: str, name: str) -> APIError:
    return APIError(
        409,
        f'{qualified(plural, group)} "{name}" already exists',
        "AlreadyExists",
        {"name": name, "group": group, "kind": plural} if group else {"name": name, "kind": plural},
    )


def conflict(plural: str, group: str, name: str, why: str | None = None) -> APIError:
    why = why or "the object has been modified; please apply your changes to the latest version and try again"
    return APIError(
        409,
        f'Operation cannot be fulfilled on {qualified(plural, group)} "{name}": {why}',
        "Conflict",
        {"name": name, "group": group, "kind": plural} if group else {"name": name, "kind": plural},
    )


def bad_request(message: str) -> APIError:
    return APIError(400, message, "BadRequest")


def gone(message: str) -> APIError:
    return APIError(410, message, "Expired")


class FieldError:
    """One problem in an object, by field path, as Kubernetes reports it in ``causes``."""

    __slots__ = ("field", "reason", "detail", "value", "kind")

    # kind: Invalid | Required | NotSupported | Forbidden | Duplicate | TooLong | TooMany
    def __init__(self, field: str, kind: str, detail: str = "", value: Any = None) -> None:
        self.field = field
        self.kind = kind
        self.detail = detail
        self.value = value

    def text(self) -> str:
        import json

        if self.kind == "Required":
            head = "Required value"
        elif self.kind == "Forbidden":
            head = "Forbidden"
        elif self.kind == "Duplicate":
            head = f"Duplicate value: {json.dumps(self.value)}"
        elif self.kind == "NotSupported":
            head = f"Unsupported value: {json.dumps(self.value)}"
        elif self.kind == "TooLong":
            head = "Too long"
        elif self.kind == "TooMany":
            head = "Too many"
        else:
            head = f"Invalid value: {json.dumps(self.value, default=str)}"
        return f"{head}: {self.detail}" if self.detail else head

    def cause(self) -> dict:
        return {"reason": f"FieldValue{self.kind}", "message": self.text(), "field": self.field}

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"{self.field}: {self.text()}"


def invalid(kind: str, group: str, name: str, errors: list[FieldError]) -> APIError:
    """422 Invalid: ``Kind.group "name" is invalid: [field: problem, ...]``."""
    what = f"{kind}.{group}" if group else kind
    parts = [f"{e.field}: {e.text()}" for e in errors]
    listing = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
    details: dict[str, Any] = {"name": name, "kind": kind, "causes": [e.cause() for e in errors]}
    if group:
        details["group"] = group
    return APIError(422, f'{what} "{name}" is invalid: {listing}', "Invalid", details)
