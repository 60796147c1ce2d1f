"""Serve the newest published model version of a checkpoint directory over HTTP.

A training job publishes a checkpoint by writing it into a new directory of
the model directory and then replacing the one-line file ``LATEST`` (the
version's directory name) with a rename (``examples/train.sh`` does this).
This server follows ``LATEST``: it loads the version it names, polls it every
few seconds, loads a new version when it changes, and keeps serving the old
one if the new one cannot be loaded. It never writes to the model directory,
which the serving pods mount read-only. Everything below the model directory
is the job's: ``LATEST``, the version directory and its files are opened one
component at a time without following any symbolic link (:func:`open_beneath`,
the same rule the Slurm agent reads ``LATEST`` by), and nothing read from them
is ever echoed: a 503 says only "no model loaded", and the log says why
without quoting the files.

    GET /         200 {"version", "step", "path", "files", "loadedAt"}; 503 {"error": "no model loaded"} before
    GET /healthz  200 once a model is loaded, else the same 503: the pod's readinessProbe

Loading here means reading the version's ``step`` file and listing its files;
a real server loads its weights in :func:`load` instead.

Standard library only, so that the serve image (``images/serve/``) needs only
``python3``: it runs this file as ``python3 serve.py``; with slurmk8s installed
it is also ``slurmk8s serve --model-dir DIR --port 8080``.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import posixpath
import re
import signal
import stat
import threading
import time
from dataclasses import dataclass
from typing import Any, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

LATEST = "LATEST"
#: A version is one directory name in the model directory: no '/', no leading '.'.
VERSION = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
#: The most of LATEST that is looked at: a version name is short.
LATEST_MAX = 256
#: Seconds between looks at LATEST.
DEFAULT_INTERVAL = 2.0

logger = logging.getLogger("slurmk8s.serve")


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


class Follower:
    """The loaded model, and the LATEST it was loaded from; thread-safe."""

    def __init__(self, model_dir: Path):
        self.model_dir = model_dir
        self._lock = threading.Lock()
        self._model: Model | None = None
        self._error: str | None = "not looked at LATEST yet"

    @property
    def model(self) -> Model | None:
        with self._lock:
            return self._model

    @property
    def error(self) -> str | None:
        with self._lock:
            return self._error

    def refresh(self) -> bool:
        """Look at LATEST once; load what it names if that is new. True if a model was loaded."""
        current = self.model
        try:
            version = read_latest(self.model_dir)
            if current is not None and current.version == version:
                return False
            model = load(self.model_dir, version)
        except LoadError as exc:
            with self._lock:
                changed = self._error != str(exc)
                self._error = str(exc)
            if changed:
                logger.warning("%s%s", exc, f"; still serving {current.version}" if current else "")
            return False
        with self._lock:
            self._model, self._error = model, None
        logger.info("loaded model version %s (step %s) from %s", model.version, model.step, model.path)
        return True


def _handler(follower: Follower) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "slurmk8s-serve"

        def do_GET(self) -> None:  # noqa: N802 - the http.server name
            model = follower.model
            if self.path not in ("/", "/healthz"):
                self._send(404, {"error": f"no such path {self.path}; try / or /healthz"})
            elif model is None:  # why is in the server's log: nothing read from the files is echoed
                self._send(503, {"error": "no model loaded"})
            elif self.path == "/healthz":
                self._send(200, {"status": "ok", "version": model.version})
            else:
                self._send(200, model.as_json())

        def _send(self, code: int, body: dict) -> None:
            data = json.dumps(body, sort_keys=True).encode() + b"\n"
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args) -> None:  # noqa: A002 - the http.server signature
            logger.debug("%s %s", self.address_string(), format % args)

    return Handler


def make_server(model_dir: Path, host: str = "0.0.0.0", port: int = 8080) -> tuple[ThreadingHTTPServer, Follower]:
    follower = Follower(model_dir)
    server = ThreadingHTTPServer((host, port), _handler(follower))
    server.daemon_threads = True
    return server, follower


def follow(follower: Follower, stop: threading.Event, interval: float = DEFAULT_INTERVAL) -> None:
    """Refresh every ``interval`` seconds until ``stop`` is set."""
    while True:
        follower.refresh()
        if stop.wait(interval):
            return


def serve(model_dir: Path, host: str = "0.0.0.0", port: int = 8080, interval: float = DEFAULT_INTERVAL) -> None:
    """Serve until SIGTERM or SIGINT."""
    server, follower = make_server(model_dir, host, port)
    stop = threading.Event()
    watcher = threading.Thread(target=follow, args=(follower, stop, interval), name="follow-latest", daemon=True)

    def shut_down(signum, _frame) -> None:
        logger.info("got %s: stopping", signal.Signals(signum).name)
        stop.set()
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, shut_down)
    signal.signal(signal.SIGINT, shut_down)
    watcher.start()
    logger.info("serving %s on %s:%d (LATEST checked every %gs)", model_dir, host, server.server_port, interval)
    try:
        server.serve_forever()
    finally:
        stop.set()
        server.server_close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="serve.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", type=Path, required=True, help="the model (checkpoint) directory with LATEST")
    p.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    p.add_argument("--port", type=int, default=8080, help="port to listen on (default 8080)")
    p.add_argument("--interval", type=float, default=DEFAULT_INTERVAL,
                   help=f"seconds between looks at LATEST (default {DEFAULT_INTERVAL:g})")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve(args.model_dir, args.host, args.port, args.interval)


if __name__ == "__main__":
    main()


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
