"""The files an image adds on top of Debian, read from its Dockerfile.

The sandbox runs pods on the host's Debian, which has the same packages the
images install. What the images add beyond packages (entrypoint, library,
static config) is exactly what their Dockerfiles ``COPY`` from the repository,
so the sandbox reads those instructions instead of keeping its own list.
"""

from __future__ import annotations

import re
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
IMAGES = REPO / "images"
#: What a build stage produces, and what stands in for it on this host. The
#: controller image builds slurmk8s into a virtual environment; the sandbox
#: uses the one slurmk8s itself runs from.
STAGE_OUTPUTS = {"/opt/slurmk8s": Path(sys.prefix)}


class ImageError(RuntimeError):
    pass


@dataclass(frozen=True)
class Copy:
    sources: tuple[str, ...]  # relative to the repository root (the build context)
    dest: str
    mode: int | None
    stage: str | None = None  # COPY --from=STAGE: from another build stage, not the context


def copies(dockerfile: str) -> list[Copy]:
    """The COPY instructions of a Dockerfile (continuation lines joined)."""
    out = []
    text = dockerfile.replace("\\\n", " ")
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        if not words or words[0].upper() != "COPY":
            continue
        mode = stage = None
        args = []
        for w in words[1:]:
            if w.startswith("--chmod="):
                mode = int(w.split("=", 1)[1], 8)
            elif w.startswith("--from="):
                stage = w.split("=", 1)[1]
            elif not w.startswith("--"):
                args.append(w)
        if len(args) < 2:
            raise ImageError(f"COPY needs a source and a destination: {line}")
        out.append(Copy(tuple(args[:-1]), args[-1], mode, stage))
    return out


def install(component: str, root: Path) -> None:
    """Copy what images/<component>/Dockerfile adds into ``root`` (a layer directory)."""
    dockerfile = IMAGES / component / "Dockerfile"
    if not dockerfile.exists():
        raise ImageError(f"no image {component!r}: {dockerfile} is missing")
    for c in copies(dockerfile.read_text()):
        if c.stage is not None:
            _link_stage_output(dockerfile, c, root)
            continue
        for src in c.sources:
            source = REPO / src
            if not source.exists():
                raise ImageError(f"{dockerfile}: COPY source {src} does not exist")
            dest = root / c.dest.lstrip("/")
            if source.is_dir():
                shutil.copytree(source, dest, dirs_exist_ok=True)
                continue
            if c.dest.endswith("/") or len(c.sources) > 1:
                dest = dest / source.name
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, dest)
            dest.chmod(c.mode if c.mode is not None else 0o644)


def _link_stage_output(dockerfile: Path, c: Copy, root: Path) -> None:
    """``COPY --from=STAGE X X``: link X to what stands in for it here (STAGE_OUTPUTS)."""
    here = STAGE_OUTPUTS.get(c.dest.rstrip("/"))
    if here is None or c.sources != (c.dest,):
        raise ImageError(f"{dockerfile}: COPY --from={c.stage} {' '.join(c.sources)} {c.dest} copies from a "
                         "build stage the sandbox cannot run; it knows only " + ", ".join(STAGE_OUTPUTS))
    link = root / c.dest.strip("/")
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(here)


def image_env(component: str, base: dict[str, str]) -> dict[str, str]:
    """The ``ENV`` settings of images/<component>/Dockerfile, ``$NAME`` expanded against ``base``."""
    env: dict[str, str] = {}
    text = (IMAGES / component / "Dockerfile").read_text().replace("\\\n", " ")
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        if not words or words[0].upper() != "ENV":
            continue
        for word in words[1:]:
            name, _, value = word.partition("=")
            env[name] = re.sub(r"\$\{?(\w+)\}?", lambda m: {**base, **env}.get(m.group(1), ""), value)
    return env
