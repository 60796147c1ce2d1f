"""images/: every entrypoint and script passes shellcheck, every Dockerfile
hadolint, with zero findings. (That each builds, with what it copies, is
test_image_build.py's.)"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILES = sorted(ROOT.glob("images/*/Dockerfile"))
SCRIPTS = sorted(
    p for pattern in ("images/*/*.sh", "hack/*.sh", "tests/fixtures/*.sh",
                      "tests/e2e/jobs/*.sh", "examples/*.sh")
    for p in ROOT.glob(pattern)
)
HADOLINT = Path(sys.executable).parent / "hadolint"


def test_every_component_has_an_image():
    assert {p.parent.name for p in DOCKERFILES} == {"slurmctld", "slurmd", "login", "slurmrestd", "controller",
                                                      "serve", "slurmdbd", "mariadb", "prometheus", "sssd", "ldap"}


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
