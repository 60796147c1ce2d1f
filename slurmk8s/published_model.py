"""The layout of a published model directory, and the one safe way to read it.

A training job publishes a checkpoint by writing it into a new directory of
the model directory and then replacing the one-line file ``LATEST`` (the
version's directory name) with a rename (``examples/train.sh`` does this).
Everything below the model directory is the job's, so it is read as an
adversary's: one path component at a time, never following a symbolic link
(:func:`open_beneath`), only a regular file, at most a few bytes, and nothing
read is ever quoted back unless it is a version name.

Who reads it: the model server (:mod:`slurmk8s.serve`) loads the version
``LATEST`` names; the Slurm agent (``slurmk8s/slurm/published.py``) reads
``LATEST`` for the bridge, whose rollouts (``slurmk8s/bridge/rollout.py``)
check the model-dir annotation with :func:`check_model_dir`.

Standard library only: the serve image runs ``serve.py`` with this file
beside it and nothing else of slurmk8s.
"""

from __future__ import annotations

import errno
import os
import posixpath
import re
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "LATEST", "VERSION", "LATEST_MAX", "LoadError", "Model", "check_parts", "open_beneath", "read_beneath_fd",
    "read_latest", "load", "BadModelDir", "check_model_dir",
]

LATEST = "LATEST"
#: A version is one directory name in the model directory: no '/', no leading '.'.
VERSION = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
#: The most of LATEST that is looked at: a version name is short.
LATEST_MAX = 256


class LoadError(Exception):
    """A version that cannot be loaded; the message says why."""


@dataclass(frozen=True)
class Model:
    version: str
    step: int | None
    path: str
    files: tuple[str, ...]
    loaded_at: float

    def as_json(self) -> dict:
        return {"version": self.version, "step": self.step, "path": self.path,
                "files": list(self.files), "loadedAt": self.loaded_at}


#: How files below a model directory are opened: never through a symbolic link.
_NOFOLLOW = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def check_parts(parts: Sequence[str]) -> None:
    """ValueError unless ``parts`` are plain names, one directory level each."""
    if not parts or any(p in ("", ".", "..") or "/" in p or "\0" in p for p in parts):
        raise ValueError("the path has an empty, '.' or '..' component")


def open_beneath(root_fd: int, parts: Sequence[str], *, directory: bool = False) -> int:
    """A descriptor of ``root/parts...`` (the caller closes it), opened one component at a
    time below the directory ``root_fd`` without following any symbolic link: whoever
    writes below the root (a training job) cannot lead the reader out of it.

    The one rule for reading what jobs publish, here and in the Slurm agent
    (``slurmk8s/slurm/published.py``). Raises ValueError for an empty, ``.``, ``..`` or
    ``/``-holding component; OSError ``ELOOP`` (a link), ``ENOTDIR``, ``ENOENT``,
    ``EACCES``, or ``EISDIR`` when a regular file is wanted and it is not one.
    """
    check_parts(parts)
    opened: list[int] = []
    try:
        fd = root_fd
        for part in parts[:-1]:
            fd = os.open(part, _NOFOLLOW | os.O_DIRECTORY, dir_fd=fd)
            opened.append(fd)
        last = os.open(parts[-1], _NOFOLLOW | (os.O_DIRECTORY if directory else 0), dir_fd=fd)
    finally:
        for fd in opened:
            os.close(fd)
    if not directory and not stat.S_ISREG(os.fstat(last).st_mode):
        os.close(last)
        raise OSError(errno.EISDIR, "not a regular file")
    return last


def read_beneath_fd(root_fd: int, parts: Sequence[str], limit: int) -> bytes:
    """At most ``limit`` bytes of the regular file ``root/parts...`` (see :func:`open_beneath`)."""
    fd = open_beneath(root_fd, parts)
    try:
        return os.read(fd, limit)
    finally:
        os.close(fd)


def _why(exc: OSError) -> str:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EISDIR):
        return "is a symbolic link or not a plain file or directory (links are never followed)"
    return exc.strerror or "cannot be read"


def _open_root(model_dir: Path) -> int:
    try:  # the administrator's path (the pod's mount): the only one opened the ordinary way
        return os.open(model_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise LoadError(f"cannot open the model directory {model_dir}: {exc.strerror}") from None


def read_latest(model_dir: Path) -> str:
    """The version ``LATEST`` names. Raises :class:`LoadError` if there is none
    or it is not a plain directory name. The message never holds what the file holds
    unless it is a version name."""
    root = _open_root(model_dir)
    try:
        raw = read_beneath_fd(root, [LATEST], LATEST_MAX + 1)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            raise LoadError(f"{model_dir / LATEST} does not exist yet: no model has been published") from None
        raise LoadError(f"{model_dir / LATEST} {_why(exc)}") from None
    finally:
        os.close(root)
    version = raw.decode("utf-8", errors="replace").strip()
    if len(raw) > LATEST_MAX or not VERSION.fullmatch(version):
        raise LoadError(f"{model_dir / LATEST} does not hold a version directory name ({len(raw)} bytes; "
                        "letters, digits, '.', '_', '-'; not starting with '.'): write one line, the name")
    return version


def load(model_dir: Path, version: str, now: float | None = None) -> Model:
    """Load ``model_dir/version``, never through a symbolic link. Raises :class:`LoadError`."""
    if not VERSION.fullmatch(version):
        raise LoadError("not a version directory name")
    path = model_dir / version
    root = _open_root(model_dir)
    try:
        fd = open_beneath(root, [version], directory=True)
        try:
            files = tuple(sorted(n for n in os.listdir(fd) if not n.startswith(".")))
            raw = read_beneath_fd(fd, ["step"], 64) if "step" in files else None
        finally:
            os.close(fd)
    except OSError as exc:
        raise LoadError(f"cannot read version {version!r} at {path}: it {_why(exc)}") from None
    finally:
        os.close(root)
    step = None
    if raw is not None:
        text = raw.decode("utf-8", errors="replace").strip()
        if not text.isascii() or not text.isdigit():
            raise LoadError(f"{path / 'step'} does not hold a step number (digits only)")
        step = int(text)
    return Model(version, step, str(path), files, time.time() if now is None else now)


# What of a model directory may be read: the bridge's rule for the model-dir
# annotation, and the agent's before it reads LATEST for the bridge.

_MAX_PATH = 4096


class BadModelDir(ValueError):
    """A model-dir annotation the bridge refuses; the message says why."""


def _normal_absolute(path: str) -> bool:
    return path.startswith("/") and posixpath.normpath(path) == path and not path.startswith("//")


def check_model_dir(path: Any, allowed_roots: Sequence[str]) -> str:
    """``path`` if it is a model directory the bridge may read, else :class:`BadModelDir`.

    It must be an absolute path, normalised (no ``.`` or ``..`` parts, no
    ``//``, no trailing ``/``), without control characters, and inside (or
    equal to) one of ``allowed_roots``.
    """
    if not isinstance(path, str) or not path:
        raise BadModelDir("is empty; set it to the absolute path of the training job's checkpoint directory")
    shown = repr(path[:200])
    if len(path) > _MAX_PATH:
        raise BadModelDir(f"{shown}... is longer than {_MAX_PATH} characters")
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in path):
        raise BadModelDir(f"{shown} contains a control character")
    if not path.startswith("/"):
        raise BadModelDir(f"{shown} is not an absolute path")
    if ".." in path.split("/"):
        raise BadModelDir(f"{shown} contains '..'")
    if not _normal_absolute(path):
        raise BadModelDir(f"{shown} is not a normalised path (write it as {posixpath.normpath(path)!r})")
    roots = [r for r in allowed_roots if _normal_absolute(r)]
    if not any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots):
        where = ", ".join(sorted(roots)) or "(none: no SlurmCluster has a checkpointDir)"
        raise BadModelDir(f"{shown} is outside the checkpoint directories the bridge may read: {where}")
    return path
