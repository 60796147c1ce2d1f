"""The sandbox's image registry: Debian's ``docker-registry`` (the CNCF distribution
registry) with TLS from a private CA and htpasswd (bcrypt) authentication.

``start(directory, address)`` writes its configuration and starts
``docker-registry serve``; it returns once ``/v2/`` answers 401 (up, and asking
for credentials) and gives the address, the CA to trust and the credentials.
Everything lives under ``directory``:

    <directory>/tls/ca.crt, server.crt, server.key   its CA and serving certificate (apiserver/tls.py)
    <directory>/auth/htpasswd                        bcrypt entries
    <directory>/auth/password                        the password of ``username`` (0600), made once
    <directory>/storage/                             the registry's blobs and manifests
    <directory>/config.yml, registry.log             its configuration and its output

The registry runs as the package's ``docker-registry`` user when started by root.
Pushing to it: ``slurmk8s images push`` (imagestore.ImageStore.push); pulling
from it: ``sandbox/distribution.py``.
"""

from __future__ import annotations

import base64
import json
import os
import pwd
import re
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import bcrypt
import requests
import yaml

from . import runtime
from .apiserver import tls

BINARY = "docker-registry"
SERVICE_USER = "docker-registry"
DEFAULT_USERNAME = "slurmk8s"
REALM = "slurmk8s-sandbox-registry"
LOG_TAIL = 20
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}


class RegistryError(RuntimeError):
    """The registry could not be set up or did not come up; the message says why and what to do."""


@dataclass
class Registry:
    """A running registry: ``address`` (host:port), the CA that signed its certificate, and the credentials."""

    address: str
    ca_cert: Path
    username: str
    password: str = field(repr=False)
    directory: Path
    process: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def log(self) -> Path:
        return self.directory / "registry.log"

    @property
    def storage(self) -> Path:
        return self.directory / "storage"

    def auths(self) -> dict:
        """The credentials as a ``kubernetes.io/dockerconfigjson`` Secret (and containers-auth.json) holds them."""
        token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        return {"auths": {self.address: {"auth": token}}}

    def write_authfile(self, path: Path) -> Path:
        """``auths()`` into ``path``, readable by its owner only: buildah's ``--authfile``."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(self.auths(), f)
        return path

    def stop(self, timeout: float = 10.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout)

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def binary() -> str:
    path = shutil.which(BINARY)
    if path is None:
        raise RegistryError(f"{BINARY} is missing: run hack/setup.sh (installs Debian's docker-registry package, "
                            "the CNCF distribution registry)")
    return path


def config(directory: Path, address: str, pki: tls.Pki, htpasswd: Path, auth: dict | None = None,
           storage: Path | None = None) -> dict:
    """The registry's configuration: TLS, htpasswd (or ``auth``, the registry's own ``auth``
    section, e.g. a token service), storage under ``directory``, no deletes, no debug server, no
    notifications; an access log line per request in its output."""
    return {
        "version": 0.1,
        "log": {"level": "info", "formatter": "text", "fields": {"service": "registry"}},
        "storage": {"filesystem": {"rootdirectory": str(storage or directory / "storage")},
                    "delete": {"enabled": False}, "cache": {"blobdescriptor": "inmemory"},
                    "maintenance": {"uploadpurging": {"enabled": True, "age": "24h", "interval": "1h",
                                                      "dryrun": False}}},
        "http": {"addr": address, "secret": _http_secret(directory),
                 "tls": {"certificate": str(pki.server_cert), "key": str(pki.server_key)},
                 "headers": {"X-Content-Type-Options": ["nosniff"]}},
        "auth": auth or {"htpasswd": {"realm": REALM, "path": str(htpasswd)}},
    }


def prepare(directory: Path, address: str = "127.0.0.1:0", *, username: str = DEFAULT_USERNAME,
            run_as: str | None = SERVICE_USER, auth: dict | None = None,
            storage: Path | None = None) -> tuple[Registry, list[str]]:
    """Write the configuration of a registry listening on ``address`` (host:port; port 0 picks a
    free one), its TLS files and credentials under ``directory``, its blobs under ``storage``
    (default ``directory/storage``; a directory several registries use in turn keeps what was
    pushed); return it (not running) and the command that runs it, as ``run_as``. ``auth``:
    another ``auth`` section than htpasswd (``token``: a Bearer token service; its files must be
    readable by ``run_as``)."""
    binary()  # missing: say how to install it before anything is written
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise RegistryError(f"registry address {address!r} is not host:port (e.g. 127.0.0.1:5000)")
    if port == "0":
        port = str(_free_port(host))
    address = f"{host}:{port}"
    directory = Path(directory)
    storage = Path(storage) if storage is not None else directory / "storage"
    for d in (directory, directory / "auth", storage):
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
    pki = tls.ensure(directory / "tls", [host.strip("[]"), "localhost"], common_name="slurmk8s-registry",
                     ca_name="slurmk8s-sandbox-registry-ca")
    password = _password(directory / "auth" / "password")
    htpasswd = directory / "auth" / "htpasswd"
    # Cost 5, as `htpasswd -B`: the registry checks it on every request, and a random
    # 32-character password needs no slow hash to resist guessing.
    _write_private(htpasswd, f"{username}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt(5)).decode()}\n")
    config_path = directory / "config.yml"
    _write_private(config_path, yaml.safe_dump(config(directory, address, pki, htpasswd, auth, storage),
                                               sort_keys=False))
    user = _service_user(run_as)
    argv = serve_command(directory, run_as)
    if user is not None:  # what the registry reads and writes, its own; the CA key stays root's
        for p in (directory, directory / "auth", htpasswd, config_path, pki.server_key):
            os.chown(p, user.pw_uid, user.pw_gid)
        for dirpath, _, files in os.walk(storage):
            os.chown(dirpath, user.pw_uid, user.pw_gid)
            for f in files:
                os.chown(os.path.join(dirpath, f), user.pw_uid, user.pw_gid, follow_symlinks=False)
    return Registry(address, pki.ca_cert, username, password, directory), argv


def collect(storage: Path) -> str:
    """Garbage-collect the registry storage ``storage``: the manifests no tag names any more
    (each push of a rebuilt image leaves its predecessor untagged) and the blobs only they used
    (``docker-registry garbage-collect --delete-untagged``). Not while any registry serves,
    since collecting under a push can delete what it uploads: then nothing is done. What was
    done, in words."""
    storage = Path(storage)
    if not (storage / "docker").is_dir():
        return f"nothing pushed to {storage} yet"
    serving = [pid for pid, argv in runtime.processes() if _serves(argv, storage)]
    if serving:
        return f"{storage} not collected: a registry serves it (pid {', '.join(map(str, serving))})"
    before = runtime.tree_bytes(storage)
    with tempfile.TemporaryDirectory(prefix="registry-gc-") as tmp:
        cfg = Path(tmp) / "config.yml"
        cfg.write_text(yaml.safe_dump({"version": 0.1, "storage": {"filesystem": {"rootdirectory": str(storage)}}}))
        proc = subprocess.run([binary(), "garbage-collect", "--delete-untagged", str(cfg)], capture_output=True,
                              text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise RegistryError(f"garbage-collecting {storage} failed: {(proc.stderr or proc.stdout).strip()[-2000:]}")
    after = runtime.tree_bytes(storage)
    return f"collected {storage}: {(before - after) / 2**30:.1f} GiB freed, {after / 2**30:.1f} GiB kept"


def _serves(argv: list[str], storage: Path) -> bool:
    """Whether the process ``argv`` is a registry serving ``storage``; yes when a registry's
    configuration cannot be read."""
    if not argv or Path(argv[0]).name != BINARY or "serve" not in argv:
        return False
    try:
        cfg = yaml.safe_load(Path(argv[-1]).read_text())
        return Path(cfg["storage"]["filesystem"]["rootdirectory"]).resolve() == storage.resolve()
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return True


def serve_command(directory: Path, run_as: str | None = SERVICE_USER) -> list[str]:
    """The command that runs the registry :func:`prepare` configured in ``directory``, as ``run_as``."""
    argv = [binary(), "serve", str(Path(directory) / "config.yml")]
    user = _service_user(run_as)
    if user is None:
        return argv
    return ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups", *argv]


def start(directory: Path, address: str = "127.0.0.1:0", *, username: str = DEFAULT_USERNAME,
          timeout: float = 30.0, run_as: str | None = SERVICE_USER, auth: dict | None = None,
          storage: Path | None = None) -> Registry:
    """:func:`prepare`, then start ``docker-registry serve``; return once ``/v2/`` answers 401.
    Raises RegistryError with the tail of its log when it exits or does not answer within
    ``timeout`` seconds."""
    registry, argv = prepare(directory, address, username=username, run_as=run_as, auth=auth, storage=storage)
    with open(registry.log, "ab") as out:
        registry.process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            cwd=registry.directory, start_new_session=True, env=ENV | {"HOME": str(registry.directory)})
    try:
        wait_ready(registry, timeout)
    except BaseException:
        registry.stop()
        raise
    return registry


def log_tail(path: Path, lines: int = LOG_TAIL) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(deque(f, maxlen=lines)).rstrip()
    except FileNotFoundError:
        return "(no output)"


def upload_count(log: Path) -> int:
    """How many blobs were sent to the registry, by its access log: every upload that carries data
    ends with a PUT to its upload URL (a cross-repository mount, ``POST ...?mount=``, sends none
    and has none). A push that sends no layer adds none."""
    with open(log, errors="replace") as f:
        return sum(1 for line in f if re.search(r'"PUT /v2/\S+/blobs/uploads/\S+ HTTP/[\d.]+" 201 ', line))


def wait_ready(registry: Registry, timeout: float, alive: Callable[[], bool] | None = None) -> None:
    """Return once the registry's ``/v2/`` answers 401 (up, asking for credentials); ``alive``
    says whether its process still runs when another than ``registry.process`` runs it."""
    url = f"https://{registry.address}/v2/"
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while True:
        rc = registry.process.poll() if registry.process else None
        if rc is not None or (alive is not None and not alive()):
            raise RegistryError(f"{BINARY} exited (status {rc}) before it answered on {url}; the last lines of "
                                f"{registry.log}:\n{log_tail(registry.log)}\nWhat to do: fix what it names (a port "
                                "in use: pick another address; permission denied: the directory must be reachable "
                                f"by the {SERVICE_USER} user), then start it again")
        try:
            answer = requests.get(url, verify=str(registry.ca_cert), timeout=(1.0, 2.0), allow_redirects=False)
        except requests.RequestException as exc:
            last = f"{type(exc).__name__}: {exc}"
        else:
            if answer.status_code == 401:
                return
            last = f"HTTP {answer.status_code} (wanted 401: up and asking for credentials)"
        if time.monotonic() >= deadline:
            raise RegistryError(f"{BINARY} did not answer on {url} within {timeout:.0f}s (last: {last}); the last "
                                f"lines of {registry.log}:\n{log_tail(registry.log)}")
        time.sleep(0.1)


def _service_user(name: str | None) -> pwd.struct_passwd | None:
    if name is None or os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(name)
    except KeyError:
        raise RegistryError(f"user {name!r} is missing: Debian's docker-registry package creates it "
                            "(run hack/setup.sh), or start the registry with run_as=None") from None


def _password(path: Path) -> str:
    if path.exists():
        return path.read_text().strip()
    password = secrets.token_urlsafe(24)
    _write_private(path, password + "\n")
    return password


def _http_secret(directory: Path) -> str:
    """The key the registry signs upload state with: one per registry, kept across restarts."""
    path = directory / "auth" / "http-secret"
    if not path.exists():
        _write_private(path, secrets.token_hex(32) + "\n")
    return path.read_text().strip()


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host.strip("[]"), 0))
        return s.getsockname()[1]
