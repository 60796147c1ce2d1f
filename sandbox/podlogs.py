"""Where a sandbox pod's container logs are, and reading them the way
``kubectl logs`` asks. The one place that knows the layout:

    POD_DIR/containers/<i>/name          the container's name (i: its place in the pod spec)
    POD_DIR/containers/<i>/log           what the running instance wrote (stdout and stderr)
    POD_DIR/containers/<i>/previous.log  what the instance before the last restart wrote
    POD_DIR/log                          what the pod's shim (runcshim) and runc said

``runcshim`` writes ``log``; ``runcruntime.prepare`` keeps each container's
log as its ``previous.log`` when the kubelet restarts the pod. The query parsing and
line selection are pure.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

CURRENT, PREVIOUS = "log", "previous.log"


class LogQueryError(ValueError):
    """A ``containerLogs`` query this runtime cannot answer; says what to ask instead."""


@dataclass(frozen=True)
class LogQuery:
    tail_lines: int | None = None
    limit_bytes: int | None = None
    follow: bool = False
    previous: bool = False


def _int(query: Mapping[str, str], name: str, minimum: int) -> int | None:
    value = query.get(name)
    if value in (None, ""):
        return None
    try:
        n = int(value)
    except ValueError:
        raise LogQueryError(f"{name} must be an integer, not {value!r}") from None
    if n < minimum:
        raise LogQueryError(f"{name} must be at least {minimum}, not {n}")
    return n


def _bool(query: Mapping[str, str], name: str) -> bool:
    value = query.get(name, "false")
    if value not in ("true", "false", "1", "0", ""):
        raise LogQueryError(f"{name} must be true or false, not {value!r}")
    return value in ("true", "1")


def log_query(query: Mapping[str, str]) -> LogQuery:
    """The query of ``GET .../log`` (API server) or ``/containerLogs/...`` (kubelet)."""
    if _bool(query, "timestamps") or query.get("sinceSeconds") or query.get("sinceTime"):
        raise LogQueryError("this sandbox's pod runtime does not record when each line was written, so "
                            "--timestamps, --since and --since-time cannot be answered: use --tail=N instead")
    return LogQuery(tail_lines=_int(query, "tailLines", 0), limit_bytes=_int(query, "limitBytes", 1),
                    follow=_bool(query, "follow"), previous=_bool(query, "previous"))


def last_lines(data: bytes, n: int | None) -> bytes:
    """The last ``n`` lines of ``data`` (all with None); a last line without a newline counts."""
    if n is None:
        return data
    if n == 0:
        return b""
    lines = data.splitlines(keepends=True)
    return b"".join(lines[-n:])


def tail_offset(f: BinaryIO, n: int | None, block: int = 64 * 1024) -> int:
    """Where the last ``n`` lines of the open file ``f`` start (0 for all, as
    ``last_lines`` counts them), reading back from its end a block at a time,
    so a long log is not read whole."""
    end = f.seek(0, os.SEEK_END)
    if n is None:
        return 0
    if n == 0:
        return end
    pos = end
    if end:
        f.seek(end - 1)
        if f.read(1) == b"\n":
            pos = end - 1  # the last line's own newline
    found = 0
    while pos > 0:
        start = max(0, pos - block)
        f.seek(start)
        chunk = f.read(pos - start)
        i = len(chunk)
        while (i := chunk.rfind(b"\n", 0, i)) != -1:
            found += 1
            if found == n:
                return start + i + 1
        pos = start
    return 0


def containers(pod_dir: Path) -> dict[str, Path]:
    """Container name -> its directory, in the pod spec's order. A pod being
    started again may lack a name for a moment: that container is left out."""
    out = {}
    dirs = sorted((d for d in pod_dir.glob("containers/*") if d.name.isdigit()), key=lambda d: int(d.name))
    for d in dirs:
        try:
            out[(d / "name").read_text()] = d
        except FileNotFoundError:
            continue
    return out


def index(ctr_dir: Path) -> int:
    return int(ctr_dir.name)


def log_file(ctr_dir: Path, previous: bool = False) -> Path:
    return ctr_dir / (PREVIOUS if previous else CURRENT)


def read(ctr_dir: Path, previous: bool = False) -> bytes:
    """A container's log, or b"" when it has none (yet)."""
    try:
        return log_file(ctr_dir, previous).read_bytes()
    except FileNotFoundError:
        return b""


def keep_previous(pod_dir: Path) -> dict[str, bytes]:
    """Before a pod's directory is made again: each container's log, by container directory name."""
    return {log.parent.name: log.read_bytes() for log in pod_dir.glob(f"containers/*/{CURRENT}")}


def start_instance(ctr_dir: Path, previous: bytes | None) -> None:
    """A container's logs as a (re)started instance begins: an empty log, and
    the last instance's, when there was one, as the previous log."""
    if previous is not None:
        log_file(ctr_dir, previous=True).write_bytes(previous)
    log_file(ctr_dir).write_bytes(b"")
