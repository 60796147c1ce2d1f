"""The rules for building images/ without Docker, and for running them: pure functions.

``imagestore`` is the shell around them (mmdebstrap, buildah, the cache on
disk); everything here takes values and returns values, so it is tested
without building anything:

- which Debian suite a Slurm release is built on (``SUITES``), and which
  tags an image gets (the names the renderer and the chart use);
- references: ``normalize_ref``, and ``recipe_for`` from a reference back
  to the image and Slurm release that produce it;
- the build context a ``Dockerfile.dockerignore`` leaves (``IgnoreRules``),
  and the cache key of a build (``cache_key``);
- the image config a runtime needs (``ImageConfig``) and Kubernetes' rules
  for a container's process: ``command``/``args`` over the image's
  Entrypoint/Cmd, the image's env first and the container's over it
  (``container_process``).

Over 500 lines because it is the one pure module of image rules that the
builds, the pushes and the runtime share, in small groups each tested on its
own (suites and pins, tags and references, the build context, a container's
process); together they are the image API (images/README.md).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from slurmk8s import __version__, versions
from slurmk8s.api.cluster import ImageSpec, SlurmSpec


class ImageError(ValueError):
    """A request the image rules refuse; the message says what to do instead."""


# --- What is built, on what, and under which names ---------------------------------------------


@dataclass(frozen=True)
class Suite:
    """A Debian suite that images are built on: its Slurm is the images' Slurm."""

    name: str
    #: Extra mmdebstrap options (e.g. a snapshot whose Release has expired).
    mmdebstrap_options: tuple[str, ...] = ()


#: Slurm release -> the Debian suite whose own Slurm packages are that release, from the
#: version table (``slurmk8s.versions``): adding a release is a row there.
SUITES: dict[str, Suite] = {
    r.version: Suite(r.debian_suite, r.mmdebstrap_options) for r in versions.RELEASES.values()
}

#: The release the renderer defaults to (``spec.slurm.version``) and the chart's images are built for.
DEFAULT_SLURM = SlurmSpec().version
#: Where the renderer's and the chart's images come from.
REPOSITORY = ImageSpec().repository
#: The chart's appVersion: the tag of the controller image the chart deploys, and of the serve image.
APP_VERSION = __version__
#: Images that hold no Slurm: built once, on the default release's suite, tagged APP_VERSION.
SLURM_FREE = frozenset({"serve", "prometheus", "ldap"})
#: Images tagged both ways: the chart names the controller by APP_VERSION, the renderer (the
#: slurmctld pod's agent container) by the Slurm release, like every Slurm image.
APP_AND_SLURM = frozenset({"controller"})
#: Images that install Slurm packages (their Dockerfile takes ``SLURM_VERSION``): built with
#: the version table's exact package version (``versions.Release.slurm_package_version``).
SLURM_PACKAGED = frozenset({"controller", "login", "slurmctld", "slurmd", "slurmdbd", "slurmrestd"})
#: Images with SSSD's client (libnss-sss), from ``versions.Release.sssd_suite`` (build arg SSS_SUITE).
SSS_CLIENTS = frozenset({"controller", "login", "slurmctld", "slurmd"})

#: Debian's minbase (Essential and Priority: required packages, apt) is what debian:*-slim
#: holds, the Dockerfiles' default base; documentation is left out as in the slim images.
MMDEBSTRAP_OPTIONS = (
    "--variant=minbase",
    "--mode=root",
    "--format=tar",
    # /usr merged by mmdebstrap itself, as in Debian's images, instead of the usrmerge package
    # (which pulls in perl).
    "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
    "--dpkgopt=path-exclude=/usr/share/doc/*",
    "--dpkgopt=path-include=/usr/share/doc/*/copyright",
    "--dpkgopt=path-exclude=/usr/share/man/*",
    "--dpkgopt=path-exclude=/usr/share/info/*",
    "--dpkgopt=path-exclude=/usr/share/locale/*",
    # mmdebstrap copies the build host's resolv.conf and hostname in: no image may carry the
    # build machine's DNS server or name (the runtime provides both).
    '--customize-hook=rm -f "$1/etc/resolv.conf" "$1/etc/hostname"',
)
#: Packages beyond minbase that the Dockerfiles' RUN steps need before they install their own
#: (none: install-packages.sh needs bash, apt and dpkg; useradd is in passwd, which is required).
BASE_PACKAGES: tuple[str, ...] = ()
#: Config of the base image, as debian:*-slim has it.
BASE_ENV = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",)
BASE_CMD = ("bash",)
#: Files of the base get this time, so the same packages give the same base image ID.
SOURCE_DATE_EPOCH = 1700000000


def sssd_suite(slurm_version: str) -> Suite:
    """The suite the sssd image of ``slurm_version`` is built on, and its sss clients come from."""
    name = versions.release(slurm_version).sssd_suite
    return next(s for s in SUITES.values() if s.name == name)


def suite_for(slurm_version: str) -> Suite:
    try:
        return SUITES[slurm_version]
    except KeyError:
        raise ImageError(f"no Debian suite for Slurm {slurm_version}: images are built for "
                         f"{', '.join(sorted(SUITES))} (a release is a row of slurmk8s/versions.py)") from None


def base_ref(suite: Suite) -> str:
    """The base image of ``suite``, tagged with its recipe, so checkouts whose recipes differ
    (branches) keep their own bases instead of remaking one another's."""
    return f"localhost/slurmk8s/base:{suite.name}-{base_recipe(suite)[:12]}"


def mmdebstrap_argv(suite: Suite, out: str) -> list[str]:
    argv = ["mmdebstrap", *MMDEBSTRAP_OPTIONS, *suite.mmdebstrap_options]
    if BASE_PACKAGES:
        argv.append("--include=" + ",".join(BASE_PACKAGES))
    return [*argv, suite.name, out]


def base_recipe(suite: Suite) -> str:
    """A digest of how the base of ``suite`` is made: a base made otherwise is made again."""
    return _digest({"argv": mmdebstrap_argv(suite, "-"), "env": BASE_ENV, "cmd": BASE_CMD,
                    "epoch": SOURCE_DATE_EPOCH})


def tags(name: str, slurm_version: str = DEFAULT_SLURM, repository: str = REPOSITORY,
         app_version: str = APP_VERSION) -> list[str]:
    """The references image ``name`` is tagged with, as the renderer and the chart name them.

    Slurm images: ``<repository>/<name>:<slurm version>`` (``render.names.image``).
    The controller also by the chart's appVersion (``charts/slurmk8s``), when built for
    the chart's Slurm release. serve: the appVersion only (``examples/serving.yaml``).
    """
    if name in SLURM_FREE:
        return [f"{repository}/{name}:{app_version}"]
    out = [f"{repository}/{name}:{slurm_version}"]
    if name in APP_AND_SLURM and slurm_version == DEFAULT_SLURM:
        out.append(f"{repository}/{name}:{app_version}")
    return out


@dataclass(frozen=True)
class Recipe:
    """One image to build: ``images/<name>/Dockerfile`` on the suite of ``slurm_version``."""

    name: str
    slurm_version: str

    @property
    def suite(self) -> Suite:
        if self.name == "sssd":  # SSSD's own suite, which may not be the release's (versions.Release.sssd_suite)
            return sssd_suite(self.slurm_version)
        return suite_for(self.slurm_version)

    @property
    def tags(self) -> list[str]:
        return tags(self.name, self.slurm_version)

    @property
    def build_args(self) -> dict[str, str]:
        args = {"BASE_IMAGE": base_ref(self.suite)}
        if self.name in SLURM_PACKAGED:
            args["SLURM_VERSION"] = versions.release(self.slurm_version).slurm_package_version
        if self.name in SSS_CLIENTS:
            args["SSS_SUITE"] = sssd_suite(self.slurm_version).name
        return args


def recipes(names: Iterable[str], slurm_version: str, known: Iterable[str]) -> list[Recipe]:
    """The recipes for ``names`` (all of ``known`` when empty); Slurm-free images use DEFAULT_SLURM."""
    known = sorted(known)
    names = list(names) or known
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ImageError(f"no image {', '.join(unknown)}: images/ has {', '.join(known)}")
    suite_for(slurm_version)
    return [Recipe(n, DEFAULT_SLURM if n in SLURM_FREE else slurm_version) for n in dict.fromkeys(names)]


#: Images of images/ that ``sandbox up`` builds and pushes besides those the manifest's pods and
#: the chart name: the workloads the demo and the tests apply once the cluster runs,
#: examples/monitoring/prometheus.yaml (``sandbox.prometheus``, ``hack/demo_metrics.py``) and
#: examples/serving.yaml (the lending story's serving Deployment; the tests' plain pods).
SANDBOX_WORKLOADS = ("prometheus", "serve")
#: ``sandbox up --image all``: every image of images/.
ALL = "all"


def pod_images(objects: Iterable[object]) -> list[str]:
    """Every image the pods and pod templates of ``objects`` name (init, regular and
    ephemeral containers, at any depth: Pods, Deployments, StatefulSets, Jobs, CronJobs), in order."""
    out: list[str] = []

    def walk(value: object) -> None:
        if isinstance(value, Mapping):
            for key in ("initContainers", "containers", "ephemeralContainers"):
                containers = value.get(key)
                if isinstance(containers, list):
                    out.extend(c["image"] for c in containers
                               if isinstance(c, Mapping) and isinstance(c.get("image"), str))
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    walk(list(objects))
    return list(dict.fromkeys(out))


def image_names(names: Iterable[str], known: Iterable[str]) -> list[str]:
    """``names`` of images/ (``all``: every one), each once; an unknown one is refused, naming them all."""
    known = sorted(known)
    names = list(names)
    if ALL in names:
        names = [n for n in names if n != ALL] + known
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ImageError(f"no image {', '.join(dict.fromkeys(unknown))}: images/ has {', '.join(known)} "
                         f"(or {ALL})")
    return list(dict.fromkeys(names))


def sandbox_refs(objects: Iterable[object], slurm_version: str, known: Iterable[str],
                 extra: Iterable[str] = SANDBOX_WORKLOADS) -> list[str]:
    """What ``sandbox up`` builds and pushes for a cluster of ``slurm_version``: the images of
    the project's repository that the pods of ``objects`` name (the cluster as the operator
    renders it, and the manifest's other workloads), the chart's controller, and every image
    of images/ that ``extra`` names (``all``: each one), for that release. An image of another
    repository is not built here: the kubelet pulls it as named. Refuses an unknown name."""
    known = sorted(known)
    names = image_names(extra, known)
    ours = [normalize_ref(ref) for ref in pod_images(objects)]
    ours = [ref for ref in ours if ref.startswith(REPOSITORY + "/")]
    chart = tags("controller")
    wanted = [t for n in names for r in recipes([n], slurm_version, known) for t in r.tags]
    return list(dict.fromkeys([*ours, *chart, *wanted]))


#: Started first when images are built at once, longest first (the controller: two stages,
#: pip; then the Slurm images with the most packages), so that the last to start is a short one.
SLOW_FIRST = ("controller", "slurmd", "slurmctld", "login", "mariadb", "sssd")


def build_order(recipes: Iterable[Recipe]) -> list[Recipe]:
    """``recipes`` in the order their builds start: SLOW_FIRST's, then the others as given."""
    return sorted(recipes, key=lambda r: SLOW_FIRST.index(r.name) if r.name in SLOW_FIRST else len(SLOW_FIRST))


def recipe_for(ref: str, known: Iterable[str]) -> Recipe | None:
    """The recipe whose image is tagged ``ref``, or None if no image of images/ is."""
    want = normalize_ref(ref)
    for name in sorted(known):
        for version in SUITES:
            r = Recipe(name, DEFAULT_SLURM if name in SLURM_FREE else version)
            if want in r.tags:
                return r
    return None


# --- References --------------------------------------------------------------------------------

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?"
_REF = re.compile(rf"^(?:(?P<domain>{_DOMAIN})/)?(?P<path>{_COMPONENT}(?:/{_COMPONENT})*)"
                  r"(?::(?P<tag>[\w][\w.-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?$")


def normalize_ref(ref: str) -> str:
    """An image reference as container runtimes resolve it: ``slurmd`` is
    ``docker.io/library/slurmd:latest``; a tag defaults to ``latest``."""
    m = _REF.match(ref)
    if not m:
        raise ImageError(f"{ref!r} is not an image reference (use e.g. {REPOSITORY}/slurmd:{DEFAULT_SLURM})")
    domain, path, tag, digest = m.group("domain", "path", "tag", "digest")
    if domain is None or not ("." in domain or ":" in domain or domain == "localhost"):
        # The first component is a path component, not a registry (Docker's rule).
        if domain is not None and not re.fullmatch(_COMPONENT, domain):
            raise ImageError(f"{ref!r} is not an image reference (use e.g. {REPOSITORY}/slurmd:{DEFAULT_SLURM})")
        path = f"{domain}/{path}" if domain else path
        domain = "docker.io"
        if "/" not in path:
            path = f"library/{path}"
    if digest:
        return f"{domain}/{path}" + (f":{tag}" if tag else "") + f"@{digest}"
    return f"{domain}/{path}:{tag or 'latest'}"


def push_ref(tag: str, registry: str) -> str:
    """Where ``slurmk8s images push --registry REGISTRY`` puts the image tagged ``tag``: its
    repository (``REPOSITORY``) replaced by ``registry`` (``host[:port][/prefix]``), as the chart's
    ``image.repository`` names images: ``ghcr.io/slurmk8s/slurmd:22.05`` -> ``host:5000/slurmd:22.05``."""
    registry = registry.rstrip("/")
    host = registry.split("/", 1)[0]
    if "://" in registry or not ("." in host or ":" in host or host == "localhost"):
        raise ImageError(f"--registry {registry!r} is not HOST[:PORT][/PREFIX] (e.g. 127.0.0.1:5000 or "
                         "registry.example.org/slurmk8s): the host needs a dot, a port or to be localhost")
    tag = normalize_ref(tag)
    if not tag.startswith(REPOSITORY + "/"):
        raise ImageError(f"{tag} is not an image of {REPOSITORY}")
    out = f"{registry}/{tag[len(REPOSITORY) + 1:]}"
    try:
        ok = normalize_ref(out) == out
    except ImageError:
        ok = False
    if not ok:
        raise ImageError(f"--registry {registry!r} does not make an image reference of {tag} ({out!r}): use "
                         "lowercase letters, digits, '.', '_' and '-' in its prefix")
    return out


# --- The build context and the cache key -------------------------------------------------------

def _glob_regex(pattern: str) -> str:
    """Go's filepath.Match, with ``**`` for any number of directories (Docker's patternmatcher)."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            i += 2
            if pattern.startswith("/", i):  # "**/" : zero or more directories
                i += 1
                out.append(r"(?:.*/)?")
            else:
                out.append(r".*")
            continue
        if c == "*":
            out.append(r"[^/]*")
        elif c == "?":
            out.append(r"[^/]")
        elif c == "[":
            end = pattern.find("]", i + 1)
            if end < 0:
                raise ImageError(f"unclosed [ in .dockerignore pattern {pattern!r}")
            body = pattern[i + 1:end]
            out.append("[" + ("^" + body[1:] if body.startswith("^") else re.escape(body)) + "]")
            i = end
        elif c == "\\" and i + 1 < len(pattern):
            i += 1
            out.append(re.escape(pattern[i]))
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


@dataclass(frozen=True)
class IgnoreRules:
    """A ``.dockerignore``: the last pattern that matches a path or one of its parents
    decides; ``!pattern`` takes a path back in."""

    rules: tuple[tuple[bool, str, re.Pattern], ...]  # (exception, pattern, regex)

    @classmethod
    def parse(cls, text: str) -> IgnoreRules:
        rules = []
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            exception = line.startswith("!")
            pattern = line[1:].strip() if exception else line
            pattern = "/".join(p for p in pattern.strip("/").split("/") if p not in ("", "."))
            if pattern:
                rules.append((exception, pattern, re.compile(_glob_regex(pattern) + r"\Z")))
        return cls(tuple(rules))

    def ignored(self, path: str) -> bool:
        parts = path.strip("/").split("/")
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        result = False
        for exception, _, regex in self.rules:
            if any(regex.match(p) for p in prefixes):
                result = not exception
        return result

    def may_hold_included(self, directory: str) -> bool:
        """Whether an ignored directory may still hold paths an exception takes back in
        (if not, a walk need not enter it)."""
        d = directory.strip("/") + "/"
        for exception, pattern, _ in self.rules:
            if not exception:
                continue
            literal = re.split(r"[*?\[\\]", pattern, maxsplit=1)[0]
            if literal.startswith(d) or d.startswith(literal) or "**" in pattern[:len(d)]:
                return True
        return False


def context_entry(path: str, kind: str, mode: int, digest: str) -> str:
    """One line of a build context's listing: what COPY would carry of a file."""
    return f"{kind} {mode & 0o7777:04o} {digest} {path}"


def cache_key(*, dockerfile: str, context: Sequence[str], base_image_id: str,
              build_args: Mapping[str, str], tags: Sequence[str], builder: str) -> str:
    """The key of one build: the same inputs give the same image, so its export is reused."""
    return _digest({"dockerfile": dockerfile, "context": list(context), "base": base_image_id,
                    "args": dict(sorted(build_args.items())), "tags": sorted(tags), "builder": builder})


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# --- Buildah's output --------------------------------------------------------------------------

_STEP = re.compile(r"^(?:\[(\d+)/(\d+)\] )?STEP (\d+)/(\d+): (.*)$")


def parse_step(line: str) -> tuple[int, int, str] | None:
    """``STEP 9/14: RUN ...`` -> ``(9, 14, "RUN ...")``; a multi-stage build's
    ``[1/2] STEP 3/9: COPY ...`` -> ``(3, 9, "stage 1/2: COPY ...")``."""
    m = _STEP.match(line)
    if not m:
        return None
    stage = f"stage {m.group(1)}/{m.group(2)}: " if m.group(1) else ""
    return int(m.group(3)), int(m.group(4)), stage + m.group(5)


def failure_hint(tail: Sequence[str]) -> str:
    """What to do about a failed build, from the last lines of its output."""
    text = "\n".join(tail)
    if re.search(r"Temporary failure resolving|Could not resolve|Failed to fetch|Network is unreachable"
                 r"|Connection timed out|Could not connect", text):
        return ("a RUN step could not reach a package archive (Debian's, or PyPI for the controller): "
                "check this machine's network and apt proxy settings, then run the build again")
    if re.search(r"Unable to locate package|has no installation candidate|Version '.*' for '.*' was not found",
                 text):
        return ("a package is not in the base's archive: check SLURM_PACKAGES/SLURM_VERSION and the "
                "Debian suite of this Slurm release (slurmk8s/versions.py)")
    if re.search(r"no space left on device", text, re.I):
        return "the disk is full: free space under /var/lib/containers and the image cache, then run it again"
    return ("fix the Dockerfile or the script the failing step runs, then run the build again "
            "(the steps before it are cached)")


# --- Image config, and a container's process -----------------------------------------------------

@dataclass(frozen=True)
class ImageConfig:
    """What a runtime needs of an image's config (the OCI image config's ``config``)."""

    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: tuple[str, ...] = ()  # NAME=value, in the image's order
    working_dir: str = ""
    user: str = ""  # "", "uid", "uid:gid", "name", "name:group"
    exposed_ports: tuple[str, ...] = ()  # "6817/tcp"
    labels: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_oci(cls, oci: Mapping) -> ImageConfig:
        """From an OCI image configuration (``config.json`` of an export)."""
        c = oci.get("config") or {}
        return cls(
            entrypoint=tuple(c.get("Entrypoint") or ()),
            cmd=tuple(c.get("Cmd") or ()),
            env=tuple(c.get("Env") or ()),
            working_dir=c.get("WorkingDir") or "",
            user=c.get("User") or "",
            exposed_ports=tuple(sorted(c.get("ExposedPorts") or {})),
            labels=dict(c.get("Labels") or {}),
        )


@dataclass(frozen=True)
class Process:
    """What a container runs: argv, environment (NAME=value), working directory, user."""

    argv: tuple[str, ...]
    env: tuple[str, ...]
    cwd: str
    user: str  # the image's User unless the pod sets runAsUser/runAsGroup: resolve with resolve_user


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: defined names are replaced, ``$$`` is a ``$``, others stay."""
    out, i = [], 0
    while i < len(value):
        if value[i] == "$" and i + 1 < len(value):
            nxt = value[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = value.find(")", i + 2)
                if end > 0:
                    name = value[i + 2:end]
                    out.append(env[name] if name in env else value[i:end + 1])
                    i = end + 1
                    continue
        out.append(value[i])
        i += 1
    return "".join(out)


def merge_env(image_env: Sequence[str], container_env: Sequence[tuple[str, str]]) -> list[str]:
    """The image's env first, then the container's: a name the container sets takes its
    value in the image's place; new names follow in the container's order."""
    merged: dict[str, str] = {}
    for entry in image_env:
        name, _, value = entry.partition("=")
        merged[name] = value
    for name, value in container_env:
        merged[name] = value
    return [f"{k}={v}" for k, v in merged.items()]


def container_process(image: ImageConfig, *, command: Sequence[str] | None = None,
                      args: Sequence[str] | None = None, env: Sequence[tuple[str, str]] = (),
                      working_dir: str | None = None, run_as_user: int | None = None,
                      run_as_group: int | None = None) -> Process:
    """A Kubernetes container's process in ``image``.

    ``command`` replaces the image's Entrypoint and drops its Cmd; ``args``
    replaces the Cmd. An empty list counts as unset, as in Kubernetes.
    ``$(VAR)`` in command and args expands against the container's env
    (``env``, already expanded in order by the kubelet), not the image's.
    The container's env goes over the image's. ``workingDir`` overrides the
    image's (default ``/``); runAsUser/runAsGroup override the image's User.
    """
    container = dict(env)
    if command:
        argv = [*command, *(args or ())]
        argv = [expand(a, container) for a in argv]
    else:
        argv = [*image.entrypoint, *(expand(a, container) for a in args)] if args else \
            [*image.entrypoint, *image.cmd]
    if not argv:
        raise ImageError("the container has no command: the image sets no Entrypoint or Cmd, so set "
                         "command (and args) in the container")
    user = image.user
    if run_as_user is not None or run_as_group is not None:
        name, _, group = user.partition(":")
        uid = str(run_as_user) if run_as_user is not None else (name or "0")
        # runAsUser alone keeps the image's group only when the image names one.
        gid = str(run_as_group) if run_as_group is not None else group
        user = f"{uid}:{gid}" if gid else uid
    return Process(tuple(argv), tuple(merge_env(image.env, env)), working_dir or image.working_dir or "/", user)


def resolve_user(user: str, passwd: str, group: str) -> tuple[int, int]:
    """An image's ``User`` (``uid``, ``uid:gid``, ``name``, ``name:group``) as numbers,
    names looked up in the root file system's /etc/passwd and /etc/group text."""
    if not user:
        return 0, 0
    who, _, grp = user.partition(":")
    users = {f[0]: (int(f[2]), int(f[3])) for f in _table(passwd, 4)}
    groups = {f[0]: int(f[2]) for f in _table(group, 3)}
    if who.isdigit():
        uid = int(who)
        # the passwd entry's group; a uid without one runs with group 0, as in Docker
        gid = next((g for u, g in users.values() if u == uid), 0)
    elif who in users:
        uid, gid = users[who]
    else:
        raise ImageError(f"user {who!r} of the image is not in its /etc/passwd: use a uid, or "
                         "runAsUser in the pod's securityContext")
    if grp:
        if grp.isdigit():
            gid = int(grp)
        elif grp in groups:
            gid = groups[grp]
        else:
            raise ImageError(f"group {grp!r} of the image is not in its /etc/group: use a gid")
    return uid, gid


def _table(text: str, fields: int) -> list[list[str]]:
    rows = []
    for line in text.splitlines():
        f = line.split(":")
        if len(f) >= fields and not line.startswith("#") and f[2].isdigit() and (fields < 4 or f[3].isdigit()):
            rows.append(f)
    return rows


#: The packages whose version says which Slurm an image carries, in the order asked.
SLURM_PACKAGE_NAMES = ("slurmctld", "slurmd", "slurmdbd", "slurmrestd", "slurm-client")


def slurm_package_version(dpkg_status: str) -> str | None:
    """The version of the Slurm packages installed, from an image's
    ``var/lib/dpkg/status``; None when it holds none."""
    installed: dict[str, str] = {}
    for para in dpkg_status.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in para.splitlines() if ": " in line and not line[0].isspace())
        if fields.get("Status", "").endswith(" installed") and "Package" in fields and "Version" in fields:
            installed[fields["Package"]] = fields["Version"]
    return next((installed[p] for p in SLURM_PACKAGE_NAMES if p in installed), None)

