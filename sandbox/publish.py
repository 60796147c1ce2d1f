"""The sandbox's images as a cluster gets them: through its registry.

``sandbox up`` runs Debian's distribution registry (:mod:`.registry`, TLS from its own
CA, htpasswd) on the sandbox's network, pushes to it the images it built (those the
manifest's pods and the chart name, and the workloads it applies later:
``images.sandbox_refs``) (``slurmk8s images push``'s own code: buildah, which sends no layer the
registry has), and writes the nodes' registry configuration
(:class:`~.pulls.NodeRegistries`): the project's repository (``ghcr.io/slurmk8s``) is
mirrored to the registry, with the node's credentials for it and the CA to trust, as a
site configures containerd for a registry mirror. The kubelet pulls every image from
there (:mod:`.pulls`); nothing reads the build cache at run time.

The registry's blobs live in one directory for every sandbox of this host
(``$SLURMK8S_REGISTRY_STORAGE``, else /var/cache/slurmk8s/registry), so a second
sandbox pushes nothing that an earlier one pushed; ``slurmk8s images prune`` collects
what no tag names there (``registry.collect``). Its ``pushed.json`` records which build
each tag was pushed as, under which digest (:class:`StorageRecord`): an image the
registry answers for with that digest is not pushed again, which spares buildah
compressing every layer anew only to find the registry has it (half a minute a
sandbox).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import requests

from . import images, registry
from .distribution import MANIFESTS
from .pulls import NodeRegistries

STORAGE_ENV = "SLURMK8S_REGISTRY_STORAGE"
DEFAULT_STORAGE = Path("/var/cache/slurmk8s/registry")
#: Where each sandbox's registry keeps its TLS files, credentials and configuration, by
#: sandbox id: a directory the docker-registry user can reach (a sandbox's own directory
#: may be under a private one, as pytest's are).
RUN_DIR = Path("/run/slurmk8s/registry")

Progress = Callable[[str], None]


def storage() -> Path:
    return Path(os.environ.get(STORAGE_ENV) or DEFAULT_STORAGE)


def directory(sid: str) -> Path:
    return RUN_DIR / sid


def prepare(sid: str, address: str) -> tuple[registry.Registry, list[str]]:
    """Sandbox ``sid``'s registry on ``address`` (the gateway's), configured, and the command that runs it."""
    RUN_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    return registry.prepare(directory(sid), address, storage=storage())


def running(sid: str, address: str) -> registry.Registry:
    """Sandbox ``sid``'s registry as :func:`prepare` left it (nothing written): its address, CA and credentials."""
    d = directory(sid)
    return registry.Registry(address, d / "tls" / "ca.crt", registry.DEFAULT_USERNAME,
                             (d / "auth" / "password").read_text().strip(), d)


def command(sid: str) -> list[str]:
    """What runs the sandbox's registry, once :func:`prepare` configured it."""
    return registry.serve_command(directory(sid))


def mirror(reg: registry.Registry) -> str:
    """Where the project's repository is served in the sandbox: ``<registry>/slurmk8s``."""
    return f"{reg.address}/{images.REPOSITORY.rsplit('/', 1)[-1]}"


def publish(reg: registry.Registry, refs: list[str], progress: Progress) -> list[tuple[str, str]]:
    """Push the images ``refs`` (tags of images/, as built last) to the registry; (reference, digest) of each."""
    from .imagestore import ImageStore

    t0 = time.monotonic()
    authfile = reg.write_authfile(reg.directory / "auth" / "push-auth.json")
    pushed = ImageStore().push(mirror(reg), refs=refs, authfile=authfile, ca_file=reg.ca_cert,
                               progress=lambda msg: progress(f"registry: {msg}"), record=StorageRecord(reg))
    progress(f"registry: {len(pushed)} images in {mirror(reg)} after {time.monotonic() - t0:.1f}s")
    return pushed


def node_registries(reg: registry.Registry) -> NodeRegistries:
    """The nodes' registry configuration: the project's repository mirrored to the sandbox's
    registry, with the node's credentials for it and its CA."""
    return NodeRegistries(mirrors={images.REPOSITORY: mirror(reg)}, ca_file=str(reg.ca_cert),
                          auths=reg.auths()["auths"])


class StorageRecord:
    """Which build each tag of the shared registry storage was pushed as, and its digest
    (``<storage>/pushed.json``, by repository and tag, whatever the sandbox's registry
    address): :meth:`present` answers only when the running registry serves the tag
    with the recorded digest, so a tag another build replaced, or storage collected,
    is pushed again. A lost update (two sandboxes pushing at once) costs a push."""

    def __init__(self, reg: registry.Registry, path: Path | None = None):
        self.reg = reg
        self.path = path or storage() / "pushed.json"

    def _read(self) -> dict:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def present(self, target: str, image_id: str) -> str | None:
        repo_tag = target.split("/", 1)[1]
        entry = self._read().get(repo_tag)
        if not isinstance(entry, dict) or entry.get("image") != image_id:
            return None
        repo, _, tag = repo_tag.rpartition(":")
        try:
            answer = requests.head(f"https://{self.reg.address}/v2/{repo}/manifests/{tag}",
                                   auth=(self.reg.username, self.reg.password), verify=str(self.reg.ca_cert),
                                   headers={"Accept": ", ".join(MANIFESTS)}, timeout=(2.0, 10.0))
        except requests.RequestException:
            return None
        digest = answer.headers.get("Docker-Content-Digest")
        return digest if answer.status_code == 200 and digest == entry.get("digest") else None

    def pushed(self, target: str, image_id: str, digest: str) -> None:
        data = self._read()
        data[target.split("/", 1)[1]] = {"image": image_id, "digest": digest}
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".pushed-")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, self.path)
