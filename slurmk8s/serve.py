"""Serve the newest published model version of a checkpoint directory over HTTP.

A training job publishes a checkpoint by writing it into a new directory of
the model directory and then replacing the one-line file ``LATEST`` (the
version's directory name) with a rename (``examples/train.sh`` does this).
This server follows ``LATEST``: it loads the version it names, polls it every
few seconds, loads a new version when it changes, and keeps serving the old
one if the new one cannot be loaded. It never writes to the model directory,
which the serving pods mount read-only. Everything below the model directory
is the job's: ``LATEST``, the version directory and its files are read by
:mod:`slurmk8s.published_model` (the layout, and the one rule the Slurm agent
reads ``LATEST`` by too: one component at a time, never through a symbolic
link), and nothing read from them is ever echoed: a 503 says only "no model loaded", and the log says why
without quoting the files.

    GET /         200 {"version", "step", "path", "files", "loadedAt"}; 503 {"error": "no model loaded"} before
    GET /healthz  200 once a model is loaded, else the same 503: the pod's readinessProbe

Loading here means reading the version's ``step`` file and listing its files;
a real server loads its weights in ``published_model.load`` instead.

Standard library only, so that the serve image (``images/serve/``) needs only
``python3``: it runs this file as ``python3 serve.py``, with
``published_model.py`` beside it; with slurmk8s installed
it is also ``slurmk8s serve --model-dir DIR --port 8080``.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import threading
from pathlib import Path

try:
    from .httpserver import HttpServer, Limits, Request, Response, error
    from .published_model import LoadError, Model, load, read_latest
except ImportError:  # run as a file (python3 serve.py, the serve image): both modules are beside it
    from httpserver import HttpServer, Limits, Request, Response, error  # type: ignore[no-redef,import-not-found]
    from published_model import LoadError, Model, load, read_latest  # type: ignore[no-redef,import-not-found]

__all__ = ["Follower", "make_server", "follow", "serve", "main"]

#: Seconds between looks at LATEST.
DEFAULT_INTERVAL = 2.0

logger = logging.getLogger("slurmk8s.serve")


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


#: What the model server allows (:mod:`slurmk8s.httpserver`): GETs without a body.
LIMITS = Limits(deadline=10.0, max_header_bytes=16 * 1024, max_headers=64, max_body=0,
                max_buffered=2 * 1024 * 1024, max_connections=512, workers=4, max_inflight=32)


def _handler(follower: Follower):
    def handle(request: Request) -> Response:
        model = follower.model
        if request.target not in ("/", "/healthz"):
            return error(404, f"no such path {request.path}; try / or /healthz", "not-found")
        if request.method != "GET":
            return error(405, "GET only", "method", {"Allow": "GET"})
        if model is None:  # why is in the server's log: nothing read from the files is echoed
            return error(503, "no model loaded", "no-model")
        if request.target == "/healthz":
            return _json(200, {"status": "ok", "version": model.version})
        return _json(200, model.as_json())

    return handle


def _json(status: int, body: dict) -> Response:
    return Response(status, json.dumps(body, sort_keys=True).encode() + b"\n")


def make_server(model_dir: Path, host: str = "0.0.0.0", port: int = 8080,
                limits: Limits = LIMITS) -> tuple[HttpServer, Follower]:
    follower = Follower(model_dir)
    server = HttpServer((host, port), _handler(follower), limits, name="serve", quiet=("/healthz",))
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
