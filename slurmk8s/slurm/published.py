"""What the agent serves of the shared storage: ``GET /v1/published?dir=D``,
the model version a job published (``D/LATEST``), for the bridge's rollouts
of serving Deployments (``slurmk8s/bridge/rollout.py``).

Everything below the checkpoint root is the jobs', so it is read as an
adversary's: one path component at a time, never following a link, only a
regular file, at most a few bytes, in a child process that runs as nobody
when the agent runs as root (the agent token and the munge key are root's
alone). Apart from the HTTP server (:mod:`.agent`) because it changes for
its own reasons: what may be read, and how safely.
"""

from __future__ import annotations

import errno
import os
import select
import time
from http import HTTPStatus
from typing import Any

from ..published_model import LATEST_MAX, BadModelDir, check_model_dir, check_parts, read_beneath_fd

__all__ = ["Fail", "published", "read_beneath", "UNPRIVILEGED"]


class Fail(Exception):
    """A request the agent answers with ``status`` and ``{"error": message, "kind": kind, **extra}``."""

    def __init__(self, status: HTTPStatus, kind: str, message: str, **extra: Any):
        self.status, self.kind, self.message, self.extra = status, kind, message, extra


def published(root: str | None, query: dict) -> dict:
    """``<dir>/LATEST`` for the bridge's model-version rollouts (slurmk8s/bridge/rollout.py)."""
    if root is None:
        raise Fail(HTTPStatus.NOT_FOUND, "not-found", "this cluster has no spec.sharedStorage.checkpointDir; "
                   "no model versions are published")
    dirs = query.get("dir") or []
    if len(dirs) != 1:
        raise Fail(HTTPStatus.BAD_REQUEST, "invalid", "name one model directory: ?dir=<path>")
    try:
        model_dir = check_model_dir(dirs[0], [root])
    except BadModelDir as exc:
        raise Fail(HTTPStatus.FORBIDDEN, "forbidden", f"model directory {exc}") from None
    rel = [p for p in model_dir[len(root.rstrip("/")):].split("/") if p]
    text = read_beneath(root, [*rel, "LATEST"], LATEST_MAX)
    return {"latest": text.decode("utf-8", errors="replace")}


#: Who reads published files when the agent runs as root: nobody.
UNPRIVILEGED = (65534, 65534)


def read_beneath(root: str, parts: list[str], limit: int, timeout: float = 10) -> bytes:
    """At most ``limit`` bytes of ``root/parts...``, opened component by
    component below ``root`` without following any symbolic link (a job
    controls everything below the root), in a child process that runs as an
    unprivileged user when the agent runs as root (the agent's token and the
    munge key are root's alone). Raises Fail: 403 for a link, a non-regular
    file or a file others may not read; 404 when it does not exist."""
    try:
        check_parts(parts)
    except ValueError as exc:
        raise Fail(HTTPStatus.FORBIDDEN, "forbidden", str(exc)) from None
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the administrator's path
    try:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: only system calls, then _exit
            code = 0
            try:
                os.close(r)
                if os.geteuid() == 0:
                    os.setgroups([])
                    os.setgid(UNPRIVILEGED[1])
                    os.setuid(UNPRIVILEGED[0])
                os.write(w, b"D" + read_beneath_fd(root_fd, parts, limit))
            except OSError as exc:
                os.write(w, b"E%d" % (exc.errno or 0))
            except BaseException:  # noqa: BLE001 - the forked child exits whatever happened
                code = 1
            finally:
                os._exit(code)
        os.close(w)
        out = b""
        deadline = time.monotonic() + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([r], [], [], left)[0]:
                    os.kill(pid, 9)
                    raise Fail(HTTPStatus.SERVICE_UNAVAILABLE, "unavailable",
                               "reading the shared storage timed out")
                chunk = os.read(r, 65536)
                if not chunk:
                    break
                out += chunk
        finally:
            os.close(r)
            os.waitpid(pid, 0)
    finally:
        os.close(root_fd)
    if out[:1] == b"D":
        return out[1:]
    shown = "/".join(parts)
    err = int(out[1:] or 0) if out[:1] == b"E" else None
    if err == errno.ENOENT:
        raise Fail(HTTPStatus.NOT_FOUND, "not-found", f"{shown} does not exist (nothing published yet)")
    if err in (errno.ELOOP, errno.ENOTDIR, errno.EISDIR, errno.EACCES, errno.EPERM):
        raise Fail(HTTPStatus.FORBIDDEN, "forbidden",
                   f"{shown} below the checkpoint root is a symbolic link, not a regular file, or not "
                   "readable by others: publish LATEST as a plain world-readable file (examples/train.sh)")
    if err is None:
        raise Fail(HTTPStatus.INTERNAL_SERVER_ERROR, "internal", f"reading {shown} failed")
    raise Fail(HTTPStatus.SERVICE_UNAVAILABLE, "unavailable", f"{shown}: {os.strerror(err)}")
