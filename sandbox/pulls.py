"""The kubelet's images: pulled from a registry by reference, as containerd's CRI image service does.

A container's image is pulled over the distribution API (:mod:`.distribution`) into the
node's image cache, never read from the build cache: what a pod runs is what a registry
served. ``imagePullPolicy`` decides when the registry is asked: ``Always`` each time a
container starts (layers already held are not fetched again), ``IfNotPresent`` when the
node has no image by that reference yet, ``Never`` not at all. Without a policy,
Kubernetes' default applies: ``Always`` for ``:latest`` or no tag, else ``IfNotPresent``.

Credentials (``kubernetes.io/dockerconfigjson``) come from the pod's ``imagePullSecrets``.
The node's registry configuration (:class:`NodeRegistries`, what containerd's
``config_path`` hosts and ``registry.configs`` say) may name mirrors: a reference under a
mirrored prefix (``ghcr.io/slurmk8s/slurmd:26.05``) is pulled from the mirror
(``10.253.0.1:5000/slurmk8s/slurmd:26.05``) with the node's own credentials for it. The
sandbox mirrors the project's repository to its own registry, so the manifests stay as
users write them; a reference to a registry directly is pulled with the pod's secrets only.

Failures are :class:`~.distribution.PullError`: ``ErrImagePull`` with the registry's
answer, ``ErrImageNeverPull``, ``InvalidImageName``; the kubelet reports them, with
``ImagePullBackOff`` between tries, as Kubernetes does.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .distribution import Pulled, Puller, PullError, Reference
from .runtime import tree_bytes

__all__ = ["NodeRegistries", "NodeImages", "default_policy", "pull_secret_auths",
           "DOCKERCONFIGJSON"]

DOCKERCONFIGJSON = "kubernetes.io/dockerconfigjson"

Progress = Callable[[str], None]


@dataclass(frozen=True)
class NodeRegistries:
    """A node's registry configuration: ``mirrors`` (a reference prefix -> the prefix it is
    pulled from), the CA its registries' certificates are checked with, and the node's own
    credentials for its mirrors (``auths`` as in a dockerconfigjson)."""

    mirrors: Mapping[str, str] = field(default_factory=dict)
    ca_file: str | None = None
    auths: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def save(self, path: Path) -> None:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)  # credentials: root's
        with os.fdopen(fd, "w") as f:
            json.dump({"mirrors": dict(self.mirrors), "caFile": self.ca_file, "auths": dict(self.auths)}, f, indent=1)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> NodeRegistries:
        if not path.exists():
            return cls()
        data = json.loads(path.read_text())
        return cls(data.get("mirrors") or {}, data.get("caFile"), data.get("auths") or {})

    def resolve(self, ref: str) -> tuple[str, bool]:
        """(the reference to pull, whether it goes through a mirror)."""
        for prefix, mirror in sorted(self.mirrors.items(), key=lambda kv: -len(kv[0])):
            if ref.startswith(prefix + "/"):
                return mirror + ref[len(prefix):], True
        return ref, False


def default_policy(ref: str) -> str:
    """Kubernetes' default ``imagePullPolicy``: Always for ``:latest`` or no tag, else IfNotPresent."""
    r = Reference.parse(ref)
    return "IfNotPresent" if r.digest or (r.tag and r.tag != "latest") else "Always"


def pull_secret_auths(secrets: Sequence[Mapping]) -> dict:
    """The ``auths`` of the pod's ``imagePullSecrets`` (Secret objects as the API returns them),
    the first naming a registry winning; a Secret of another type, or unreadable, gives none."""
    out: dict = {}
    for secret in secrets:
        if secret.get("type") != DOCKERCONFIGJSON:
            continue
        try:
            doc = json.loads(base64.b64decode((secret.get("data") or {}).get(".dockerconfigjson", ""), validate=True))
        except (binascii.Error, ValueError):
            continue
        for host, entry in (doc.get("auths") or {}).items() if isinstance(doc, dict) else ():
            out.setdefault(host, entry)
    return {"auths": out}


class NodeImages:
    """A node's images: blobs and unpacked images in ``cache``, by digest (content-addressed,
    so one store serves every node and sandbox of the host, as one containerd's content
    store), and in ``refs`` which digest each reference this node pulled named then: what
    ``IfNotPresent`` and ``Never`` go by. ``refs`` belongs to the nodes of one cluster: a
    tag pushed again is pulled again by a new cluster, and by this one under ``Always``."""

    def __init__(self, cache: Path, registries: NodeRegistries | Path, refs: Path):
        self.cache = Path(cache)
        self.refs = Path(refs)
        #: The node's registry configuration, or the file it is read from at each pull (as
        #: containerd reads its hosts directory): a mirror configured later takes effect.
        self._registries = registries
        self.refs.mkdir(parents=True, exist_ok=True)

    @property
    def registries(self) -> NodeRegistries:
        r = self._registries
        return r if isinstance(r, NodeRegistries) else NodeRegistries.load(r)

    def image(self, ref: str, policy: str | None, auths: Mapping | None = None,
              progress: Progress | None = None) -> tuple[Pulled, bool]:
        """The image of ``ref`` under ``policy``; (it, whether the registry was asked). Raises PullError."""
        policy = policy or default_policy(ref)
        local = self._local(ref)
        if policy == "Never":
            if local is None:
                raise PullError("ErrImageNeverPull",
                                f'Container image "{ref}" is not present with pull policy of Never')
            self.used(local)
            return local, False
        if policy == "IfNotPresent" and local is not None:
            self.used(local)
            return local, False
        registries = self.registries
        source, mirrored = registries.resolve(ref)
        puller = Puller(self.cache, Path(registries.ca_file) if registries.ca_file else None)
        pulled = puller.pull(source, {"auths": registries.auths} if mirrored else auths, progress)
        self._index(ref, pulled)
        self.used(pulled)
        return pulled, True

    def _ref_file(self, ref: str) -> Path:
        return self.refs / f"{hashlib.sha256(ref.encode()).hexdigest()}.json"

    def _local(self, ref: str) -> Pulled | None:
        f = self._ref_file(ref)
        if not f.exists():
            return None
        data = json.loads(f.read_text())
        path = self.cache / "images" / data["digest"].split(":", 1)[1]
        if not (path / "pull.json").exists():
            return None
        return Pulled(data["pulled"], data["digest"], path)

    @staticmethod
    def used(pulled: Pulled) -> None:
        """Note that a container is made from it now (what :func:`prune` goes by)."""
        try:
            os.utime(pulled.path / "pull.json")
        except FileNotFoundError:
            pass

    def _index(self, ref: str, pulled: Pulled) -> None:
        f = self._ref_file(ref)
        tmp = f.with_name(f".{f.name}.tmp")
        tmp.write_text(json.dumps({"ref": ref, "pulled": pulled.ref, "digest": pulled.digest}) + "\n")
        os.replace(tmp, f)


def mounted_lowers() -> set[str]:
    """The lower directories of every overlay mounted on this host, in any mount namespace
    (a container's root is one: its image's ``rootfs`` below)."""
    lowers: set[str] = set()
    for info in Path("/proc").glob("[0-9]*/mountinfo"):
        try:
            text = info.read_text()
        except OSError:  # the process ended meanwhile
            continue
        for m in re.finditer(r"lowerdir=([^,\s]+)", text):
            lowers.update(m[1].split(":"))
    return lowers


#: The free space a node keeps on its image file system: below it, unused images go oldest first
#: (a kubelet's imageGCHighThresholdPercent, in bytes, since this host's disk is shared).
MIN_FREE_BYTES = 16 * 2**30


def prune(cache: Path, older_than: float = 86400, now: float | None = None,
          min_free: int = MIN_FREE_BYTES, free: Callable[[], int] | None = None) -> tuple[int, int]:
    """Free the host's node image store (``cache``), as a kubelet's image garbage collection
    does: unpacked images no container was made from for ``older_than`` seconds, then, while
    the file system has less than ``min_free`` bytes free, the least recently used others; but
    never one a mounted container root stands on. Blobs unused for ``older_than`` go too (a
    later pull fetches them again). Returns (images removed, bytes freed)."""
    if not cache.is_dir():
        return 0, 0
    now = time.time() if now is None else now
    free = free or (lambda: shutil.disk_usage(cache).free)
    in_use = mounted_lowers()
    candidates = []
    for path in (cache / "images").glob("*"):
        stamp = path / "pull.json"
        if stamp.exists() and str(path / "rootfs") not in in_use:
            candidates.append((stamp.stat().st_mtime, path))
    removed = freed = 0
    for used, path in sorted(candidates):
        if now - used < older_than and free() >= min_free:
            break
        freed += tree_bytes(path)
        shutil.rmtree(path)
        removed += 1
    for blob in (cache / "blobs").glob("*/*"):
        if blob.is_file() and now - blob.stat().st_mtime >= older_than:
            freed += blob.stat().st_size
            blob.unlink()
    return removed, freed
