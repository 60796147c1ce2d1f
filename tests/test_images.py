"""images/: every entrypoint and script passes shellcheck, every Dockerfile
hadolint, with zero findings; every file a Dockerfile copies is in its build
context, and the sandbox installs exactly those files."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from slurmk8s.render.config import TASK_PROLOG
from slurmk8s.sandbox.image import copies, install
from slurmk8s.sandbox.images import IgnoreRules

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILES = sorted(ROOT.glob("images/*/Dockerfile"))
SCRIPTS = sorted(
    p for pattern in ("images/*/*.sh", "hack/*.sh", "slurmk8s/sandbox/*.sh", "tests/fixtures/*.sh",
                      "tests/e2e/jobs/*.sh", "examples/*.sh")
    for p in ROOT.glob(pattern)
)
HADOLINT = Path(sys.executable).parent / "hadolint"


def test_every_component_has_an_image():
    assert {p.parent.name for p in DOCKERFILES} == {"slurmctld", "slurmd", "login", "slurmrestd", "controller",
                                                      "serve"}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_shellcheck(script):
    assert shutil.which("shellcheck"), "shellcheck is missing: run hack/setup.sh"
    proc = subprocess.run(["shellcheck", "--external-sources", "--format=gcc", str(script.relative_to(ROOT))],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout == "", proc.stdout + proc.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_hadolint(dockerfile):
    proc = subprocess.run([str(HADOLINT), "--format", "json", str(dockerfile)], capture_output=True, text=True)
    findings = json.loads(proc.stdout or "[]")
    assert findings == [], "\n".join(f"{f['line']}: {f['code']} {f['message']}" for f in findings)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_copied_files_exist_and_are_in_the_build_context(dockerfile):
    ignore = IgnoreRules.parse(dockerfile.with_name("Dockerfile.dockerignore").read_text())
    sources = [s for c in copies(dockerfile.read_text()) if c.stage is None for s in c.sources]
    assert sources, f"{dockerfile} copies nothing"
    for src in sources:
        assert (ROOT / src).exists(), f"{dockerfile}: COPY {src} does not exist"
        assert not ignore.ignored(src.rstrip("/")), f"{dockerfile}: {src} is excluded from the build context"


@pytest.mark.parametrize("component", ["slurmctld", "slurmd", "login", "slurmrestd", "serve"])
def test_the_sandbox_installs_what_the_dockerfile_copies(component, tmp_path):
    install(component, tmp_path)
    entry = tmp_path / "usr/local/bin/slurmk8s-entrypoint"
    assert entry.read_bytes() == (ROOT / f"images/{component}/entrypoint.sh").read_bytes()
    assert entry.stat().st_mode & 0o777 == 0o755
    lib = tmp_path / "usr/local/lib/slurmk8s/lib.sh"
    assert lib.read_bytes() == (ROOT / "images/common/slurmk8s-lib.sh").read_bytes()


def test_the_slurmd_image_has_the_task_prolog_slurm_conf_names(tmp_path):
    install("slurmd", tmp_path)
    prolog = tmp_path / TASK_PROLOG.lstrip("/")
    assert prolog.read_bytes() == (ROOT / "images/slurmd/task-prolog.sh").read_bytes()
    assert prolog.stat().st_mode & 0o777 == 0o755
