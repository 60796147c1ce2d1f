"""The audit log: one JSON line per request in ``D/audit.log``.

Fields: ``time``, ``user``, ``groups``, ``extra`` (the user's extra
attributes, as Kubernetes' ``user.extra``: for a pod's bound token, the
pod's name and uid), ``impersonatedBy`` (when impersonating), ``verb``, ``apiGroup``, ``resource``, ``subresource``,
``namespace``, ``name`` (resource requests) or ``path`` (the others), and
``code``, the HTTP status (for a watch, the one it started with, written as it
starts). Empty fields
are left out. The file is rotated to ``audit.log.1`` past ``max_bytes``.
Tokens are never written.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import timeutil
from .rbac import Attributes, User

MAX_BYTES = 64 * 1024 * 1024


def entry(user: User | None, attrs: Attributes | None, code: int, impersonated_by: User | None = None,
          path: str = "", time: str | None = None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """One audit line as a dict (pure)."""
    out: dict[str, Any] = {"time": time or timeutil.micro()}
    out["user"] = user.name if user else ""
    out["groups"] = list(user.groups) if user else []
    if user is not None and user.extra:
        out["extra"] = {k: list(v) for k, v in sorted(user.extra.items())}
    if impersonated_by is not None:
        out["impersonatedBy"] = impersonated_by.name
    if attrs is not None:
        out["verb"] = attrs.verb
        if attrs.resource_request:
            for key, value in (("apiGroup", attrs.api_group), ("resource", attrs.resource), ("subresource", attrs.subresource),
                               ("namespace", attrs.namespace), ("name", attrs.name)):
                if value or key == "apiGroup":
                    out[key] = value
        else:
            out["path"] = attrs.path
    elif path:
        out["path"] = path
    out["code"] = code
    if annotations:
        out["annotations"] = dict(annotations)
    return out


class AuditLog:
    """Appends lines to ``path`` (line-buffered), rotating once past ``max_bytes``."""

    def __init__(self, path: Path, max_bytes: int = MAX_BYTES) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._f = self._open()

    def _open(self):
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        return os.fdopen(fd, "a", buffering=1)

    def write(self, line: dict[str, Any]) -> None:
        text = json.dumps(line, separators=(",", ":"), sort_keys=False) + "\n"
        with self._lock:
            if self._f.closed:
                return
            self._f.write(text)
            if self._f.tell() > self.max_bytes:
                self._f.close()
                os.replace(self.path, self.path.with_name(self.path.name + ".1"))
                self._f = self._open()

    def close(self) -> None:
        with self._lock:
            self._f.close()


def read(path: Path, include_rotated: bool = True) -> list[dict[str, Any]]:
    """Every line of an audit log (the rotated file first), for tests and tools."""
    return list(iter_lines(path, include_rotated))


def iter_lines(path: Path, include_rotated: bool = True) -> Iterator[dict[str, Any]]:
    path = Path(path)
    files = ([path.with_name(path.name + ".1")] if include_rotated else []) + [path]
    for f in files:
        if not f.exists():
            continue
        with open(f) as fh:
            for line in fh:
                line = line.strip()
                if line:
                    yield json.loads(line)


def forbidden(lines: list[dict[str, Any]], users: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """The 403 lines, of ``users`` only if given."""
    return [ln for ln in lines if ln.get("code") == 403 and (users is None or ln.get("user") in users)]
