"""Build images/ with buildah, without Docker, and keep each image unpacked for a runtime.

The base of each image is Debian's minbase, bootstrapped with mmdebstrap
from the archive apt is configured with and committed as a local image
(``localhost/slurmk8s/base:<suite>-<recipe digest>``); the Dockerfiles get it through their
``BASE_IMAGE`` argument and are built unchanged (``buildah bud``). Every
built image is exported into the cache as a root file system plus its OCI
image config, under a key of everything the build reads (``images.cache_key``),
so the next run finds it and builds nothing:

    <cache>/<name>/<key>/rootfs/       the image's files, as a container sees them
    <cache>/<name>/<key>/config.json   its OCI image configuration (config.Entrypoint, Cmd, Env, ...)
    <cache>/<name>/<key>/image.json    name, key, tags, Slurm release, buildah image ID; written last
    <cache>/refs/<ref>.json            which export a reference names now
    <cache>/logs/<name>-<release>.log  buildah's output of the last build

The cache is ``$SLURMK8S_IMAGE_CACHE``, else /var/cache/slurmk8s/images;
buildah keeps its own storage (base, layers, tagged images) in
/var/lib/containers. The image tests and the bare Slurm runs use
``ImageStore.lookup`` and ``ensure``; the sandbox's pods do not run from the
cache: ``sandbox up`` pushes the builds to its registry (``push``) and the
kubelet pulls them (decision record 30).

Over 500 lines because it is the one shell around buildah and the cache (base,
build, export, references, prune) under one lock and one log; its pure rules
are already apart in ``images``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import selectors
import shutil
import subprocess
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Protocol
from urllib.parse import quote

from . import images as rules
from .images import ImageConfig, ImageError, Recipe, Suite
from .pulls import mounted_lowers


class PushRecord(Protocol):
    """What :meth:`ImageStore.push` asks of a record of earlier pushes."""

    def present(self, target: str, image_id: str) -> str | None:
        """The digest under which the registry holds build ``image_id`` as ``target`` already; None: push it."""

    def pushed(self, target: str, image_id: str, digest: str) -> None:
        """``image_id`` was pushed as ``target`` and the registry named it ``digest``."""


REPO = Path(__file__).resolve().parents[1]
DEFAULT_CACHE = Path("/var/cache/slurmk8s/images")
CACHE_ENV = "SLURMK8S_IMAGE_CACHE"
JOBS_ENV = "SLURMK8S_IMAGE_JOBS"
#: Images built at once by default (``$SLURMK8S_IMAGE_JOBS``): one per core, at least two, so
#: that one build's downloads overlap another's package unpacking and layer commits, which are
#: CPU and disk; more than the cores only slow each other (images/README.md has the figures).
BUILD_JOBS = max(2, os.cpu_count() or 1)
#: The stages of one multi-stage Dockerfile built at once (``buildah bud --jobs``).
STAGE_JOBS = 2
#: Bumped when the export layout or the way images are built changes: every key changes with it.
LAYOUT = "1"
BASE_LABEL = "dev.slurmk8s.base-recipe"
TAIL_LINES = 25
HEARTBEAT_S = 20.0
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")
#: A named build stage (``FROM <image> AS <stage>``).
_STAGE = re.compile(r"^FROM\s+\S+\s+AS\s+([A-Za-z0-9_.-]+)\s*$", re.I | re.M)
#: Where a Dockerfile's named build stages are tagged (see ``_build_one``).
STAGE_REPOSITORY = "localhost/slurmk8s-stages"
#: The containers a build leaves when it dies: ``buildah bud``'s working containers and our exports'.
_LEFTOVER_CONTAINER = re.compile(r"^(.+-working-container(-\d+)?|slurmk8s-export-[a-z0-9-]+)$")

Progress = Callable[[str], None]


class ImageBuildFailed(RuntimeError):
    """A build or a tool failed; the message names the image, the step and what to do."""


@dataclass(frozen=True)
class Image:
    """An image exported for a runtime: ``rootfs`` and ``config`` are what runc needs."""

    ref: str  # the reference it was looked up by, normalized
    name: str  # images/<name>
    key: str
    path: Path  # <cache>/<name>/<key>

    @property
    def rootfs(self) -> Path:
        return self.path / "rootfs"

    @cached_property
    def oci_config(self) -> dict:
        """The OCI image configuration, as buildah committed it."""
        return json.loads((self.path / "config.json").read_text())

    @property
    def config(self) -> ImageConfig:
        return ImageConfig.from_oci(self.oci_config)

    @cached_property
    def meta(self) -> dict:
        return json.loads((self.path / "image.json").read_text())

    @cached_property
    def slurm_package(self) -> str | None:
        """The exact version of the Slurm packages in it (None: it has no Slurm)."""
        try:
            return rules.slurm_package_version((self.rootfs / "var/lib/dpkg/status").read_text())
        except FileNotFoundError:
            return None


def default_cache() -> Path:
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE)


class ImageStore:
    """The built images of a checkout (``repo``), exported under ``cache``."""

    def __init__(self, cache: Path | None = None, repo: Path = REPO):
        self.cache = Path(cache) if cache is not None else default_cache()
        self.repo = Path(repo)

    # --- what the runtime calls ---

    def lookup(self, ref: str) -> Image | None:
        """The export ``ref`` names, or None if it was never built here. Does not check that the
        sources are unchanged since; ``ensure`` does."""
        want = rules.normalize_ref(ref)
        try:
            entry = json.loads(self._ref_file(want).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        image = Image(want, entry["name"], entry["key"], self.cache / entry["name"] / entry["key"])
        return image if (image.path / "image.json").exists() else None

    def ensure(self, refs: Iterable[str], progress: Progress | None = None) -> dict[str, Image]:
        """Build whatever of ``refs`` is missing or out of date; every ref's export, by ref.

        A ref no image of images/ is tagged with is refused (ImageError): only images/ is built here.
        """
        known = self.names()
        wanted: dict[str, Recipe] = {}
        for ref in refs:
            recipe = rules.recipe_for(ref, known)
            if recipe is None:
                raise ImageError(f"no image of images/ is tagged {ref!r} and there is no registry to pull it "
                                 f"from while building: the sandbox builds {', '.join(sorted(known))}, tagged e.g. "
                                 f"{rules.tags('slurmd')[0]} (`slurmk8s images build` lists what it tags)")
            wanted[rules.normalize_ref(ref)] = recipe
        built = self._build(list(dict.fromkeys(wanted.values())), progress or _quiet)
        return {ref: Image(ref, b.name, b.key, b.path) for ref, r in wanted.items() for b in [built[r]]}

    # --- what `slurmk8s images` calls ---

    def names(self) -> list[str]:
        return sorted(p.parent.name for p in (self.repo / "images").glob("*/Dockerfile"))

    def build(self, names: Iterable[str] = (), slurm_version: str = rules.DEFAULT_SLURM,
              progress: Progress | None = None, refresh_base: bool = False) -> list[Image]:
        """Build images/<name> for each of ``names`` (all when empty), reusing cached exports."""
        recipes = rules.recipes(names, slurm_version, self.names())
        built = self._build(recipes, progress or _quiet, refresh_base=refresh_base)
        return [built[r] for r in recipes]

    def list(self) -> list[Image]:
        out = []
        for f in sorted((self.cache / "refs").glob("*.json")):
            image = self.lookup(json.loads(f.read_text())["ref"])
            if image is not None:
                out.append(image)
        return out

    def prune(self, progress: Progress | None = None, *, storage: bool = False) -> list[Path]:
        """Remove what earlier builds left: the exports no reference names any more, unless a
        mounted container root stands on one, and (``storage``) in buildah's storage the
        working containers of builds that died and the images no tag or child names (each
        earlier build of an image, with the layers only it used; the layer cache of the
        images tagged now stays). Under this cache's build lock; buildah's storage is the
        host's, so ``storage`` only where no other cache builds meanwhile (the test command)."""
        progress = progress or _quiet
        if not self.cache.is_dir():
            return []
        named = {(i.name, i.key) for i in self.list()}
        removed = []
        with self._locked(progress):
            in_use = mounted_lowers()
            for name in self.names():
                for path in sorted((self.cache / name).glob("*")):
                    if not path.is_dir() or (name, path.name) in named:
                        continue
                    if str(path / "rootfs") in in_use:
                        progress(f"kept {path}: a mounted container root stands on it")
                        continue
                    shutil.rmtree(path)
                    removed.append(path)
                    progress(f"removed {path}")
            shutil.rmtree(self.cache / "tmp", ignore_errors=True)
            if storage and shutil.which("buildah") is not None:
                self._prune_storage(progress)
        return removed

    @staticmethod
    def _prune_storage(progress: Progress) -> None:
        leftovers = [c["id"] for c in json.loads(_buildah("containers", "--json") or "null") or []
                     if _LEFTOVER_CONTAINER.match(c.get("containername", ""))]
        for container in leftovers:
            _buildah("rm", container, check=False)
        images = len(_buildah("images", "--all", "--quiet").split())
        _buildah("rmi", "--prune", check=False)
        gone = images - len(_buildah("images", "--all", "--quiet").split())
        progress(f"buildah: removed {len(leftovers)} working container(s) of earlier builds and "
                 f"{gone} image(s) and layer(s) no tag names")

    def push(self, registry: str, releases: Iterable[str] = (), *, refs: Iterable[str] = (),
             authfile: Path | None = None, ca_file: Path | None = None, progress: Progress | None = None,
             record: PushRecord | None = None) -> list[tuple[str, str]]:
        """Push every image of ``releases`` and the images tagged ``refs``, as last built here, to
        ``registry`` (``host[:port][/prefix]``, see ``images.push_ref``) with ``buildah push``;
        (reference, digest) of each. Images are pushed at once (``build_jobs``), the tags of one
        image one after another. A layer the registry has already is not sent again (buildah asks
        with a blob HEAD first), but buildah compresses each layer again to know its digest; with a
        ``record`` of earlier pushes, an image the registry already holds under that tag, as that
        same build, is not pushed at all. Refuses, naming them, when an image was never built or
        is gone from buildah's storage."""
        progress = progress or _quiet
        if shutil.which("buildah") is None:
            raise ImageBuildFailed("buildah missing: run hack/setup.sh (installs buildah from Debian)")
        known = self.names()
        tags = [tag for release in releases for r in rules.recipes([], release, known) for tag in r.tags]
        tags += [rules.normalize_ref(ref) for ref in refs]
        wanted: dict[str, str] = {}  # tag -> buildah image ID
        missing = []
        for tag in dict.fromkeys(tags):
            r = rules.recipe_for(tag, known)
            if r is None:
                raise ImageError(f"no image of images/ is tagged {tag!r}: there is nothing to push")
            image = self.lookup(tag)
            image_id = image.meta.get("imageId") if image is not None else None
            if image_id is None or _inspect(image_id) is None:
                missing.append(f"{tag} (slurmk8s images build --slurm-version {r.slurm_version} {r.name})")
            else:
                wanted[tag] = image_id
        if missing:
            raise ImageBuildFailed("not in buildah's storage, so there is nothing to push: "
                                   + "; ".join(dict.fromkeys(missing)) + ". Build them first with the commands named.")
        by_image: dict[str, list[str]] = {}  # an image's tags, pushed one after another
        for tag, image_id in wanted.items():
            by_image.setdefault(image_id, []).append(tag)
        record_lock = threading.Lock()
        with tempfile.TemporaryDirectory(prefix="push-") as tmp:
            certs = []
            if ca_file is not None:  # buildah trusts the *.crt of a directory
                (Path(tmp) / "certs").mkdir()
                shutil.copyfile(ca_file, Path(tmp) / "certs" / "ca.crt")
                certs = [f"--cert-dir={Path(tmp) / 'certs'}"]
            auth = [f"--authfile={authfile}"] if authfile is not None else []

            def push_image(image_id: str, tags: list[str]) -> dict[str, tuple[str, str]]:
                out = {}
                for tag in tags:
                    target = rules.push_ref(tag, registry)
                    digest = record.present(target, image_id) if record is not None else None
                    if digest is not None:
                        progress(f"{target}@{digest} is there already")
                        out[tag] = (target, digest)
                        continue
                    digestfile = Path(tmp) / f"digest-{hashlib.sha256(tag.encode()).hexdigest()}"
                    start = time.monotonic()
                    _buildah("push", "--quiet", *auth, *certs, f"--digestfile={digestfile}", image_id,
                             f"docker://{target}")
                    digest = digestfile.read_text().strip()
                    progress(f"pushed {target}@{digest} ({time.monotonic() - start:.1f}s)")
                    out[tag] = (target, digest)
                    if record is not None:
                        with record_lock:
                            record.pushed(target, image_id, digest)
                return out

            # Images at once: buildah compresses each layer it sends on one core.
            with ThreadPoolExecutor(build_jobs(), thread_name_prefix="push") as pool:
                done = [pool.submit(push_image, image_id, tags) for image_id, tags in by_image.items()]
                results: dict[str, tuple[str, str]] = {}
                for f in done:
                    results.update(f.result())
        return [results[tag] for tag in wanted]

    # --- the build ---

    def _build(self, recipes: list[Recipe], progress: Progress, refresh_base: bool = False) -> dict[Recipe, Image]:
        _need_tools()
        for d in ("refs", "logs", "tmp"):
            (self.cache / d).mkdir(parents=True, exist_ok=True)
        with self._locked(progress):
            builder = f"layout {LAYOUT}; {_buildah_version()}"
            suites = list(dict.fromkeys(r.suite for r in recipes))
            # Independent work at once: the bases, then each image as soon as its base is
            # there. Builds wait on downloads (apt, pip) and the disk more than on the CPU.
            with ThreadPoolExecutor(max(1, len(suites)), thread_name_prefix="base") as base_pool, \
                    ThreadPoolExecutor(build_jobs(), thread_name_prefix="build") as pool:
                failed = threading.Event()  # set by the first failure: the builds not started yet are not
                bases = {s: base_pool.submit(self._ensure_base, s, progress, refresh_base) for s in suites}
                builds = {r: pool.submit(self._ensure_one, r, bases[r.suite], builder, progress, failed)
                          for r in rules.build_order(recipes)}
                futures = [*bases.values(), *builds.values()]
                wait(futures)
                errors = [e for f in futures if (e := f.exception()) is not None]
                if errors:
                    raise errors[0]
                return {r: image for r in recipes if (image := builds[r].result()) is not None}

    def _ensure_one(self, r: Recipe, base: Future[str], builder: str, progress: Progress,
                    failed: threading.Event) -> Image | None:
        """``r``'s export, built unless the cache has it, once ``base`` (its base image's ID) is
        there; None, and nothing done, once another build ``failed``."""
        try:
            base_id = base.result()
            if failed.is_set():
                return None
            key = self.key(r, base_id, builder)
            path = self.cache / r.name / key
            if (path / "image.json").exists():
                progress(f"{r.name}: cached ({', '.join(r.tags)})")
            else:
                self._build_one(r, key, path, progress)
            for tag in r.tags:
                _write_atomic(self._ref_file(tag), json.dumps({"ref": tag, "name": r.name, "key": key}))
            return Image(r.tags[0], r.name, key, path)
        except BaseException:
            failed.set()
            raise

    def key(self, r: Recipe, base_image_id: str, builder: str) -> str:
        dockerfile = self.repo / "images" / r.name / "Dockerfile"
        ignore_file = dockerfile.with_name("Dockerfile.dockerignore")
        if not ignore_file.is_file():
            raise ImageError(f"{ignore_file} is missing: every image keeps its build context to what it copies "
                             "(see images/slurmd/Dockerfile.dockerignore)")
        ignore = rules.IgnoreRules.parse(ignore_file.read_text())
        return rules.cache_key(dockerfile=dockerfile.read_text(), context=list(context_listing(self.repo, ignore)),
                               base_image_id=base_image_id, build_args=r.build_args, tags=r.tags, builder=builder)

    def _ensure_base(self, suite: Suite, progress: Progress, refresh: bool) -> str:
        ref = rules.base_ref(suite)
        recipe = rules.base_recipe(suite)
        info = _inspect(ref)
        if info is not None and not refresh:
            labels = (info["OCIv1"].get("config") or {}).get("Labels") or {}
            if labels.get(BASE_LABEL) == recipe:
                return info["FromImageID"]
        progress(f"base: bootstrapping Debian {suite.name} (minbase) with mmdebstrap, about a minute")
        start = time.monotonic()
        with tempfile.TemporaryDirectory(dir=self.cache / "tmp") as tmp:
            tar = Path(tmp) / "rootfs.tar"
            env = {**os.environ, "SOURCE_DATE_EPOCH": str(rules.SOURCE_DATE_EPOCH)}
            self._run_logged(f"base-{suite.name}", rules.mmdebstrap_argv(suite, str(tar)), progress,
                             what=f"the base (mmdebstrap {suite.name})", env=env)
            container = _buildah("from", "scratch").strip()
            try:
                _buildah("add", "--quiet", container, str(tar), "/")
                _buildah("config", *[f"--env={e}" for e in rules.BASE_ENV], f"--cmd={json.dumps(rules.BASE_CMD)}",
                         f"--label={BASE_LABEL}={recipe}", container)
                _buildah("commit", "--quiet", "--format=docker", f"--timestamp={rules.SOURCE_DATE_EPOCH}",
                         container, ref)
            finally:
                _buildah("rm", container, check=False)
        info = _inspect(ref)
        assert info is not None, ref
        progress(f"base: {ref} ready ({time.monotonic() - start:.0f}s)")
        return info["FromImageID"]

    def _build_one(self, r: Recipe, key: str, path: Path, progress: Progress) -> None:
        if not _NAME.match(r.name):
            raise ImageError(f"images/{r.name}: an image's directory name must be lowercase letters, digits and -")
        for tag in r.tags:
            rules.normalize_ref(tag)
        dockerfile = self.repo / "images" / r.name / "Dockerfile"
        start = time.monotonic()
        progress(f"{r.name}: building for Slurm {r.slurm_version} on {rules.base_ref(r.suite)}")
        tmp = Path(tempfile.mkdtemp(prefix=f"{r.name}-", dir=self.cache / "tmp"))
        try:
            iidfile = tmp / "iid"
            common = ["buildah", "bud", "--isolation=chroot", "--format=docker", "--layers", "--pull=never",
                      f"--ignorefile={dockerfile.with_name('Dockerfile.dockerignore')}", f"--file={dockerfile}",
                      *[f"--build-arg={k}={v}" for k, v in sorted(r.build_args.items())], *_ca_secret()]
            # The stages of a multi-stage Dockerfile at once (the controller's venv and its
            # runtime's packages): --jobs.
            argv = [*common, f"--jobs={STAGE_JOBS}", f"--iidfile={iidfile}", *[f"--tag={t}" for t in r.tags],
                    str(self.repo)]
            self._run_logged(f"{r.name}-{r.slurm_version}", argv, progress, what=r.name)
            # Then each named build stage is tagged (its layers are cached now: seconds):
            # buildah keeps the layers of a tagged image only, so the next build (a change to
            # the code alone) finds the stage's earlier layers (its packages, its
            # dependencies) in its cache.
            for stage in _STAGE.findall(dockerfile.read_text()):
                self._run_logged(f"{r.name}-{r.slurm_version}-{stage}", [
                    *common, f"--target={stage}", f"--tag={STAGE_REPOSITORY}/{r.name}-{stage.lower()}:{r.slurm_version}",
                    str(self.repo)], progress, what=f"{r.name} ({stage})")
            image_id = iidfile.read_text().strip()
            progress(f"{r.name}: exporting the root file system")
            _export(image_id, tmp / "out", f"slurmk8s-export-{r.name}-{key[:12]}")
            (tmp / "out" / "image.json").write_text(json.dumps({
                "name": r.name, "key": key, "tags": r.tags, "slurmVersion": r.slurm_version,
                "suite": r.suite.name, "imageId": image_id, "builtAt": int(time.time()),
                "buildSeconds": round(time.monotonic() - start, 1)}, indent=2) + "\n")
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.exists():  # a half-made export of an earlier run that died: image.json was missing
                shutil.rmtree(path)
            (tmp / "out").rename(path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        progress(f"{r.name}: built {', '.join(r.tags)} in {time.monotonic() - start:.0f}s")

    def _run_logged(self, log_name: str, argv: list[str], progress: Progress, *, what: str,
                    env: dict | None = None) -> None:
        """Run a build tool; progress per buildah step (and every HEARTBEAT_S); on failure raise
        with the step and the tail of the output."""
        log = self.cache / "logs" / f"{log_name}.log"
        tail: deque[str] = deque(maxlen=TAIL_LINES)
        step = None
        start = step_start = time.monotonic()
        with open(log, "w") as out:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, text=True, errors="replace", bufsize=1)
            assert proc.stdout is not None
            sel = selectors.DefaultSelector()
            sel.register(proc.stdout, selectors.EVENT_READ)
            while True:
                if not sel.select(timeout=HEARTBEAT_S):
                    progress(f"{what}: {_step_text(step)} still running ({time.monotonic() - step_start:.0f}s, "
                             f"{time.monotonic() - start:.0f}s in all)")
                    continue
                line = proc.stdout.readline()
                if not line:
                    break
                out.write(line)
                line = line.rstrip("\n")
                tail.append(line)
                parsed = rules.parse_step(line)
                if parsed:
                    step, step_start = parsed, time.monotonic()
                    progress(f"{what}: {_step_text(step)} ({time.monotonic() - start:.0f}s)")
            sel.close()
            rc = proc.wait()
        if rc != 0:
            hint = rules.failure_hint(list(tail))
            lines = "\n".join(f"    {t}" for t in tail)
            raise ImageBuildFailed(f"building {what} failed at {_step_text(step)} (exit status {rc}); the last "
                                   f"lines of its output:\n{lines}\nThe whole output: {log}\nWhat to do: {hint}")

    @contextlib.contextmanager
    def _locked(self, progress: Progress) -> Iterator[None]:
        with open(self.cache / ".lock", "w") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                progress(f"waiting for another build in {self.cache} to finish")
                fcntl.flock(f, fcntl.LOCK_EX)
            yield

    def _ref_file(self, ref: str) -> Path:
        return self.cache / "refs" / (quote(ref, safe="") + ".json")


def build_jobs() -> int:
    """How many images are built at once: ``$SLURMK8S_IMAGE_JOBS``, else BUILD_JOBS."""
    value = os.environ.get(JOBS_ENV, "")
    if not value:
        return BUILD_JOBS
    if not value.isdigit() or int(value) < 1:
        raise ImageError(f"{JOBS_ENV}={value!r}: give how many images to build at once, a whole number from 1")
    return int(value)


def context_listing(root: Path, ignore: rules.IgnoreRules) -> Iterator[str]:
    """Every path of the build context at ``root`` that ``ignore`` leaves, one line each
    (``images.context_entry``), sorted: what COPY can carry into the image."""
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        rel_dir = "" if rel_dir == "." else rel_dir
        keep = []
        for d in sorted(dirnames):
            rel = f"{rel_dir}/{d}" if rel_dir else d
            full = os.path.join(dirpath, d)
            if os.path.islink(full):
                filenames.append(d)
            elif not ignore.ignored(rel) or ignore.may_hold_included(rel):
                keep.append(d)
                if not ignore.ignored(rel):
                    yield rules.context_entry(rel, "dir", os.lstat(full).st_mode, "-")
        dirnames[:] = keep
        for f in sorted(filenames):
            rel = f"{rel_dir}/{f}" if rel_dir else f
            if ignore.ignored(rel):
                continue
            full = os.path.join(dirpath, f)
            st = os.lstat(full)
            if os.path.islink(full):
                yield rules.context_entry(rel, "link", st.st_mode, os.readlink(full))
            else:
                with open(full, "rb") as fh:
                    yield rules.context_entry(rel, "file", st.st_mode, hashlib.file_digest(fh, "sha256").hexdigest())


def _export(image_id: str, out: Path, container_name: str) -> None:
    """The image's files into ``out/rootfs`` and its OCI config into ``out/config.json``:
    a working container of the image, mounted, copied out with owners, modes, links and xattrs."""
    info = _inspect(image_id)
    if info is None:
        raise ImageBuildFailed(f"buildah built image {image_id} but cannot find it now: run the build again")
    (out / "rootfs").mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(info["OCIv1"], indent=2, sort_keys=True) + "\n")
    _buildah("rm", container_name, check=False)
    container = _buildah("from", "--pull=never", f"--name={container_name}", image_id).strip()
    try:
        mountpoint = _buildah("mount", container).strip()
        try:
            subprocess.run(["cp", "-a", "--reflink=auto", f"{mountpoint}/.", str(out / "rootfs")],
                           check=True, capture_output=True, text=True)
        except subprocess.CalledProcessError as exc:
            raise ImageBuildFailed(f"copying the files of image {image_id} out of {mountpoint} failed: "
                                   f"{exc.stderr.strip()}. Check the free space of {out}.") from None
        finally:
            _buildah("umount", container, check=False)
    finally:
        _buildah("rm", container, check=False)


def _ca_secret() -> list[str]:
    """The build host's CA bundle as the build secret ``ca-certificates``: pip in the controller
    image's build stage trusts it, so a proxy that re-signs TLS works as it does on the host.
    Secrets are not part of the image (nor of its cache key)."""
    for candidate in (os.environ.get("PIP_CERT"), os.environ.get("SSL_CERT_FILE"),
                      "/etc/ssl/certs/ca-certificates.crt"):
        if candidate and "," not in candidate and Path(candidate).is_file():
            return [f"--secret=id=ca-certificates,src={candidate}"]
    return []


def _buildah(*args: str, check: bool = True) -> str:
    proc = subprocess.run(["buildah", *args], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise ImageBuildFailed(f"`buildah {' '.join(args)}` failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def _inspect(ref: str) -> dict | None:
    proc = subprocess.run(["buildah", "inspect", "--type=image", ref], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def _buildah_version() -> str:
    return _buildah("--version").strip()


def _need_tools() -> None:
    missing = [t for t in ("buildah", "mmdebstrap") if shutil.which(t) is None]
    if missing:
        raise ImageBuildFailed(f"{' and '.join(missing)} missing: run hack/setup.sh (installs buildah, "
                               "mmdebstrap and runc from Debian)")
    if os.geteuid() != 0:
        raise ImageBuildFailed("building images needs root (buildah's storage in /var/lib/containers, "
                               "chroot builds): run it as root")


def _step_text(step: tuple[int, int, str] | None) -> str:
    if step is None:
        return "the start"
    n, total, text = step
    return f"step {n}/{total} {text[:100]}"


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    tmp.write_text(text)
    tmp.rename(path)


def _quiet(_: str) -> None:
    pass
