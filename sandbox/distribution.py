"""Pull an image over the OCI distribution API, as containerd would, into the layout
the sandbox's runtime reads (``rootfs/`` + ``config.json``, as imagestore.Image).

``Puller(cache).pull(ref, auths)``: resolve ``host[:port]/repo[:tag][@sha256:...]``,
authenticate (Basic, or the Bearer token flow a ``WWW-Authenticate`` challenge asks
for) with credentials from a ``kubernetes.io/dockerconfigjson``-style auths dict, fetch
the manifest (OCI or Docker schema 2; from an index or manifest list the linux/amd64
one), verify every blob's size and digest, keep layers by digest (a blob already in the
cache is not fetched again) and unpack them in order with OCI whiteouts. The cache:

    <cache>/blobs/sha256/<hex>                 layers and configs, verified, by digest
    <cache>/images/<manifest hex>/rootfs/      the unpacked layers
    <cache>/images/<manifest hex>/config.json  the image configuration
    <cache>/images/<manifest hex>/pull.json    reference, digests; written last

Unpacking (:mod:`.layers`) never writes outside ``rootfs``.

Every failure is a PullError whose ``reason`` is what the kubelet reports
(ErrImagePull, InvalidImageName) and whose message carries the registry's answer.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from urllib.parse import urlencode, urlparse

import requests

from .images import ImageConfig, ImageError, normalize_ref
from .layers import LayerError, unpack_layer

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
MANIFESTS = (OCI_MANIFEST, DOCKER_MANIFEST)
INDEXES = (OCI_INDEX, DOCKER_LIST)
#: Layer media types by compression; zstd and foreign (non-distributable) layers are refused.
LAYERS = {
    "application/vnd.oci.image.layer.v1.tar": "",
    "application/vnd.oci.image.layer.v1.tar+gzip": "gz",
    "application/vnd.docker.image.rootfs.diff.tar": "",
    "application/vnd.docker.image.rootfs.diff.tar.gzip": "gz",
}
PLATFORM = ("linux", "amd64")
MAX_MANIFEST = 4 << 20  # containerd's limit
MAX_CONFIG = 16 << 20
MAX_TOKEN = 1 << 20
CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 60.0
DEFAULT_DEADLINE = 1800.0
CHUNK = 1 << 20
_DIGEST = re.compile(r"^(sha256:[0-9a-f]{64}|sha512:[0-9a-f]{128})$")
_CHALLENGE = re.compile(r'(\w+)="([^"]*)"')

Progress = Callable[[str], None]


class PullError(RuntimeError):
    """A pull that failed: ``reason`` as the kubelet reports it, ``message`` with the registry's answer
    (``status``: its HTTP status, when it answered)."""

    def __init__(self, reason: str, message: str, status: int | None = None):
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message
        self.status = status


@dataclass(frozen=True)
class Reference:
    registry: str  # host[:port]
    repository: str
    tag: str | None
    digest: str | None

    @classmethod
    def parse(cls, ref: str) -> Reference:
        try:
            normal = normalize_ref(ref)
        except ImageError as exc:
            raise PullError("InvalidImageName", str(exc)) from None
        name, _, digest = normal.partition("@")
        registry, _, rest = name.partition("/")
        repository, _, tag = rest.rpartition(":") if ":" in rest.rsplit("/", 1)[-1] else (rest, "", "")
        return cls(registry, repository, tag or None, digest or None)

    @property
    def reference(self) -> str:
        """What the manifest is asked for by: the digest when there is one, else the tag."""
        return self.digest or self.tag or "latest"

    def __str__(self) -> str:
        return f"{self.registry}/{self.repository}" + (f":{self.tag}" if self.tag else "") + (
            f"@{self.digest}" if self.digest else "")


@dataclass(frozen=True)
class Pulled:
    """A pulled image: ``rootfs`` and ``config.json`` under ``path``, as imagestore.Image has them;
    what a container runs."""

    ref: str  # the reference pulled (a mirror's, when the node pulled through one)
    digest: str  # the manifest's
    path: Path
    fetched: tuple[str, ...] = ()  # the blobs this pull downloaded (none when all were cached)

    @property
    def rootfs(self) -> Path:
        return self.path / "rootfs"

    @property
    def oci_config(self) -> dict:
        return json.loads((self.path / "config.json").read_text())

    @cached_property
    def config(self) -> ImageConfig:
        return ImageConfig.from_oci(self.oci_config)

    @property
    def image_id(self) -> str:
        """``containerStatuses[].imageID``: the repository pulled from, at the manifest's digest."""
        name = self.ref.split("@", 1)[0]
        repo = name.rsplit(":", 1)[0] if ":" in name.rsplit("/", 1)[-1] else name
        return f"{repo}@{self.digest}"


def credentials_for(auths: Mapping | None, registry: str) -> tuple[str, str] | None:
    """(user, password) for ``registry`` from a dockerconfigjson's ``auths`` (the whole document
    or the ``auths`` mapping), by host[:port] or a URL of it."""
    if not auths:
        return None
    entries = auths.get("auths", auths)
    for key, entry in entries.items():
        host = urlparse(key).netloc if "://" in key else key.split("/", 1)[0]
        if host != registry or not isinstance(entry, Mapping):
            continue
        if entry.get("username") is not None and entry.get("password") is not None:
            return str(entry["username"]), str(entry["password"])
        if entry.get("auth"):
            try:
                user, sep, password = base64.b64decode(entry["auth"], validate=True).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                raise PullError("ErrImagePull", f"the credentials for {registry} are not base64 of user:password "
                                "(the 'auth' field of the pull secret)") from None
            if sep:
                return user, password
    return None


class Puller:
    """Pulls into ``cache`` (see the module's docstring); ``ca_file``: the CA the registries'
    certificates are checked with (default: the system's)."""

    def __init__(self, cache: Path, ca_file: Path | None = None, *, connect_timeout: float = CONNECT_TIMEOUT,
                 read_timeout: float = READ_TIMEOUT, deadline: float = DEFAULT_DEADLINE):
        self.cache = Path(cache)
        self.verify: str | bool = str(ca_file) if ca_file else True
        self.connect_timeout, self.read_timeout, self.deadline = connect_timeout, read_timeout, deadline

    def pull(self, ref: str, auths: Mapping | None = None, progress: Progress | None = None) -> Pulled:
        progress = progress or (lambda _: None)
        reference = Reference.parse(ref)
        for d in ("blobs/sha256", "blobs/sha512", "images", "tmp"):
            (self.cache / d).mkdir(parents=True, exist_ok=True)
        session = _Session(self, reference, credentials_for(auths, reference.registry),
                           time.monotonic() + self.deadline)
        with session.http:
            manifest, digest = session.manifest(reference.reference)
            if reference.digest and digest != reference.digest:
                raise PullError("ErrImagePull", f"{reference}: the registry's manifest has digest {digest}")
            path = self.cache / "images" / digest.split(":", 1)[1]
            if (path / "pull.json").exists():
                progress(f"{reference}: {digest} already unpacked")
                return Pulled(str(reference), digest, path)
            config = _descriptor(manifest.get("config"), f"{reference}: the manifest's config")
            layers = manifest.get("layers")
            if not isinstance(layers, list):
                raise PullError("ErrImagePull", f"{reference}: the manifest {digest} has no list of layers")
            layers = [_descriptor(d, f"{reference}: layer {i}") for i, d in enumerate(layers)]
            fetched: list[str] = []
            config_path = session.blob(config, fetched, limit=MAX_CONFIG)
            try:
                json.loads(config_path.read_bytes())
            except ValueError:
                raise PullError("ErrImagePull", f"{reference}: its config {config['digest']} is not JSON") from None
            blobs = []
            for i, layer in enumerate(layers):
                if layer["mediaType"] not in LAYERS:
                    raise PullError("ErrImagePull", f"{reference}: layer {i} ({layer['digest']}) has media type "
                                    f"{layer['mediaType']!r}; the sandbox unpacks {', '.join(sorted(LAYERS))}")
                progress(f"{reference}: layer {i + 1}/{len(layers)} {layer['digest'][:19]} ({layer['size']} bytes)")
                blobs.append((session.blob(layer, fetched), layer))
        with self._locked():
            if (path / "pull.json").exists():
                return Pulled(str(reference), digest, path, tuple(fetched))
            tmp = Path(tempfile.mkdtemp(prefix="unpack-", dir=self.cache / "tmp"))
            try:
                (tmp / "rootfs").mkdir()
                for blob, layer in blobs:
                    try:
                        unpack_layer(blob, tmp / "rootfs", LAYERS[layer["mediaType"]])
                    except LayerError as exc:
                        raise PullError("ErrImagePull", f"{reference}: layer {layer['digest']}: {exc}") from None
                shutil.copyfile(config_path, tmp / "config.json")
                (tmp / "pull.json").write_text(json.dumps({
                    "ref": str(reference), "digest": digest, "config": config["digest"],
                    "layers": [lay["digest"] for lay in layers], "pulledAt": int(time.time())}, indent=2) + "\n")
                if path.exists():
                    shutil.rmtree(path)
                tmp.rename(path)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        progress(f"{reference}: unpacked {digest} ({len(fetched)} blob(s) fetched)")
        return Pulled(str(reference), digest, path, tuple(fetched))

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.cache / ".lock", "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            yield


def _descriptor(d, what: str) -> dict:
    if (not isinstance(d, dict) or not isinstance(d.get("digest"), str) or not _DIGEST.match(d["digest"])
            or not isinstance(d.get("size"), int) or d["size"] < 0):
        raise PullError("ErrImagePull", f"{what} is not a descriptor with a sha256 digest and a size: {d!r:.200}")
    return {"mediaType": d.get("mediaType", ""), "digest": d["digest"], "size": d["size"],
            "platform": d.get("platform") or {}}


@dataclass
class _Session:
    puller: Puller
    ref: Reference
    credentials: tuple[str, str] | None = field(repr=False)
    deadline: float
    http: requests.Session = field(default_factory=requests.Session)
    authorization: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        # No ~/.netrc credentials and no proxy from the environment: only what the pull is given.
        self.http.trust_env = False

    @property
    def base(self) -> str:
        return f"https://{self.ref.registry}/v2/{self.ref.repository}"

    def manifest(self, reference: str) -> tuple[dict, str]:
        body, digest = self._small(f"{self.base}/manifests/{reference}", MAX_MANIFEST,
                                   accept=", ".join((*MANIFESTS, *INDEXES)), want_digest=reference)
        try:
            doc = json.loads(body)
        except ValueError:
            raise PullError("ErrImagePull", f"{self.ref}: the manifest {digest} is not JSON") from None
        media = doc.get("mediaType") or ("" if "manifests" not in doc else OCI_INDEX)
        if media in INDEXES or "manifests" in doc:
            chosen = [m for m in doc.get("manifests") or [] if isinstance(m, dict)
                      and ((m.get("platform") or {}).get("os"), (m.get("platform") or {}).get("architecture"))
                      == PLATFORM]
            if not chosen:
                raise PullError("ErrImagePull", f"{self.ref}: no manifest for {'/'.join(PLATFORM)} in its index "
                                f"{digest} (it has {_platforms(doc)})")
            return self.manifest(_descriptor(chosen[0], f"{self.ref}: the index entry")["digest"])
        if media and media not in MANIFESTS:
            raise PullError("ErrImagePull", f"{self.ref}: manifest media type {media!r} is not one the sandbox "
                            f"pulls ({', '.join(MANIFESTS + INDEXES)})")
        return doc, digest

    def blob(self, d: dict, fetched: list[str], limit: int | None = None) -> Path:
        """The verified blob of descriptor ``d`` in the cache; fetched only if it is not there yet."""
        algo, hexdigest = d["digest"].split(":", 1)
        path = self.puller.cache / "blobs" / algo / hexdigest
        if path.is_file() and not path.is_symlink():
            return path
        if limit is not None and d["size"] > limit:
            raise PullError("ErrImagePull", f"{self.ref}: blob {d['digest']} is {d['size']} bytes, over {limit}")
        url = f"{self.base}/blobs/{d['digest']}"
        h = hashlib.new(algo)
        size = 0
        fd, tmp = tempfile.mkstemp(prefix="blob-", dir=self.puller.cache / "tmp")
        try:
            with os.fdopen(fd, "wb") as out, self._get(url, accept="*/*") as answer:
                for chunk in answer.iter_content(CHUNK):
                    self._check_deadline(url)
                    size += len(chunk)
                    if size > d["size"]:
                        raise PullError("ErrImagePull", f"{self.ref}: blob {d['digest']} from {url} is longer than "
                                        f"the {d['size']} bytes its descriptor says")
                    h.update(chunk)
                    out.write(chunk)
            got = f"{algo}:{h.hexdigest()}"
            if size != d["size"] or got != d["digest"]:
                raise PullError("ErrImagePull", f"{self.ref}: blob {url} does not match its descriptor: got {size} "
                                f"bytes with digest {got}, expected {d['size']} bytes with {d['digest']}; "
                                "the registry's storage or something between it and here altered it")
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        fetched.append(d["digest"])
        return path

    # --- HTTP, authentication ---

    def _small(self, url: str, limit: int, accept: str, want_digest: str) -> tuple[bytes, str]:
        with self._get(url, accept=accept) as answer:
            body = b""
            for chunk in answer.iter_content(65536):
                body += chunk
                if len(body) > limit:
                    raise PullError("ErrImagePull", f"{self.ref}: {url} answered more than {limit} bytes")
                self._check_deadline(url)
        pinned = bool(_DIGEST.match(want_digest))
        algo = want_digest.split(":", 1)[0] if pinned else "sha256"
        digest = f"{algo}:{hashlib.new(algo, body).hexdigest()}"
        if pinned and digest != want_digest:
            raise PullError("ErrImagePull", f"{self.ref}: the manifest {url} has digest {digest}, not the one asked for")
        return body, digest

    @contextlib.contextmanager
    def _get(self, url: str, accept: str) -> Iterator[requests.Response]:
        answer = self._request(url, accept)
        if answer.status_code == 401 and self.credentials is not None:
            challenge = answer.headers.get("WWW-Authenticate", "")
            answer.close()
            self._authenticate(url, challenge)
            answer = self._request(url, accept)
        try:
            if answer.status_code != 200:
                raise PullError("ErrImagePull", f"{self.ref}: GET {url}: {_answer_text(answer)}"
                                + _advice(answer.status_code, self.ref, bool(self.credentials)), answer.status_code)
            yield answer
        finally:
            answer.close()

    def _request(self, url: str, accept: str, headers: dict | None = None, auth=None) -> requests.Response:
        self._check_deadline(url)
        hdrs = {"Accept": accept, "User-Agent": "slurmk8s-sandbox-kubelet"}
        if self.authorization and headers is None:
            hdrs["Authorization"] = self.authorization
        hdrs.update(headers or {})
        remaining = max(0.1, self.deadline - time.monotonic())
        try:
            return self.http.get(url, headers=hdrs, auth=auth, stream=True, verify=self.puller.verify,
                                 timeout=(min(self.puller.connect_timeout, remaining),
                                          min(self.puller.read_timeout, remaining)))
        except requests.exceptions.SSLError as exc:
            raise PullError("ErrImagePull", f"{self.ref}: GET {url}: the registry's certificate was refused "
                            f"({_short(exc)}); give the CA that signed it") from None
        except requests.RequestException as exc:
            raise PullError("ErrImagePull", f"{self.ref}: GET {url}: {self.ref.registry} unreachable: "
                            f"{_short(exc)}") from None

    def _authenticate(self, url: str, challenge: str) -> None:
        scheme, _, params = challenge.partition(" ")
        fields = dict(_CHALLENGE.findall(params))
        if scheme.lower() == "basic" and self.credentials:
            user, password = self.credentials
            self.authorization = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        elif scheme.lower() == "bearer" and fields.get("realm"):
            realm = fields["realm"]
            if urlparse(realm).scheme != "https":
                raise PullError("ErrImagePull", f"{self.ref}: the registry sends for a token to {realm!r}, not https; "
                                "credentials are not sent there")
            query = {k: fields[k] for k in ("service", "scope") if k in fields}
            if "scope" not in query:
                query["scope"] = f"repository:{self.ref.repository}:pull"
            token_url = f"{realm}?{urlencode(query)}"
            auth = self.credentials
            answer = self._request(token_url, "application/json", headers={}, auth=auth)
            with contextlib.closing(answer):
                if answer.status_code != 200:
                    raise PullError("ErrImagePull", f"{self.ref}: token from {realm}: {_answer_text(answer)}"
                                    + _advice(answer.status_code, self.ref, bool(auth)), answer.status_code)
                body = answer.raw.read(MAX_TOKEN + 1, decode_content=True)
            try:
                doc = json.loads(body) if len(body) <= MAX_TOKEN else {}
            except ValueError:
                doc = {}
            token = doc.get("token") or doc.get("access_token")
            if not isinstance(token, str) or not token:
                raise PullError("ErrImagePull", f"{self.ref}: the token service {realm} answered no token")
            self.authorization = f"Bearer {token}"
        else:
            raise PullError("ErrImagePull", f"{self.ref}: GET {url}: 401 Unauthorized with a challenge the sandbox "
                            f"cannot answer: {challenge[:200]!r}", 401)

    def _check_deadline(self, url: str) -> None:
        if time.monotonic() > self.deadline:
            raise PullError("ErrImagePull", f"{self.ref}: GET {url}: the pull took longer than "
                            f"{self.puller.deadline:.0f}s")


def _answer_text(answer: requests.Response) -> str:
    """``401 Unauthorized: UNAUTHORIZED: authentication required``: the status and the registry's errors."""
    head = f"{answer.status_code} {answer.reason}"
    try:
        body = answer.raw.read(65536, decode_content=True)
        errors = json.loads(body).get("errors") or []
        text = "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors if isinstance(e, dict))
    except Exception:  # noqa: BLE001 - any body that is not the registry's error JSON
        text = ""
    return f"{head}: {text}" if text else head


def _advice(status: int, ref: Reference, had_credentials: bool) -> str:
    if status in (401, 403):
        return (" (the credentials for " + ref.registry + " were refused: check the pull secret)" if had_credentials
                else f" (no credentials for {ref.registry}: add an imagePullSecret)")
    if status == 404:
        return f" ({ref.repository}:{ref.reference} is not in {ref.registry}: push it, or fix the reference)"
    return ""


def _platforms(doc: dict) -> str:
    seen = [f"{(m.get('platform') or {}).get('os')}/{(m.get('platform') or {}).get('architecture')}"
            for m in doc.get("manifests") or [] if isinstance(m, dict)]
    return ", ".join(seen) or "none"


def _short(exc: Exception) -> str:
    return str(exc).split("\n")[0][:300]
