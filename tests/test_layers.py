"""The import layers of the product: each part imports only parts below it,
never one beside it (the operator and the bridge never import each other).
A new top-level module fails here until it is given its layer. The sandbox
(`sandbox/`) is not part of it: nothing of the product imports it, since the
product's wheel and the controller image do not have it (decision record 22)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from .test_production_install import _third_party_imports

ROOT = Path(__file__).resolve().parent.parent
#: Where each importable package lives in the tree.
TREES = {"slurmk8s": ROOT / "slurmk8s", "slurmk8s.templates": ROOT / "templates"}
#: The sandbox: a distribution of its own, beside the product.
SANDBOX = ROOT / "sandbox"
#: Lower imports nothing of higher; equal ranks import nothing of each other.
RANK = {
    "slurmk8s.strict": -1,
    "slurmk8s.log": 0, "slurmk8s.times": 0, "slurmk8s.events": 0, "slurmk8s.versions": 0,
    "slurmk8s.published_model": 0, "slurmk8s.templates": 0, "slurmk8s.httpserver": 0, "slurmk8s.backoff": 0,
    "slurmk8s.api": 1, "slurmk8s.serve": 1, "slurmk8s.health": 1, "slurmk8s.metricsserver": 1,
    "slurmk8s.manifest": 2, "slurmk8s.slurm": 2,
    "slurmk8s.render": 3, "slurmk8s.evacuation": 3,
    "slurmk8s.kube": 4, "slurmk8s.informer": 4,
    "slurmk8s.permissions": 5,
    "slurmk8s.leader": 6,
    "slurmk8s.operator": 7, "slurmk8s.bridge": 7,
    "slurmk8s.simulate": 8,
    "slurmk8s.cli": 9,
}


def modules():
    """(file, dotted module name, is a package's __init__) of every product module."""
    for package, tree in TREES.items():
        for path in sorted(tree.rglob("*.py")):
            parts = [p for p in path.relative_to(tree).with_suffix("").parts if p != "__init__"]
            yield path, ".".join([package, *parts]), path.name == "__init__.py"


def part(name: str) -> str:
    """``slurmk8s.render.config`` -> ``slurmk8s.render``: the layered part a module belongs to."""
    return ".".join(name.split(".")[:2])


def imports(path: Path, module: str, is_package: bool):
    """Every slurmk8s module ``module`` imports, also inside functions."""
    here = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.split(".")[0] == "slurmk8s")
        elif isinstance(node, ast.ImportFrom):
            base = here[:len(here) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            if target.split(".")[0] != "slurmk8s":
                continue
            if target == "slurmk8s":  # from slurmk8s import log: the module named (not __version__)
                yield from (f"slurmk8s.{a.name}" for a in node.names if not a.name.startswith("__"))
            else:
                yield target


def test_every_part_imports_only_parts_below_it():
    wrong, unranked = [], set()
    for path, module, is_package in modules():
        mine = part(module)
        if module == "slurmk8s":
            continue
        for target in imports(path, module, is_package):
            theirs = part(target)
            if theirs == mine:
                continue
            unranked |= {p for p in (mine, theirs) if p not in RANK}
            if mine in RANK and theirs in RANK and RANK[theirs] >= RANK[mine]:
                wrong.append(f"{path.relative_to(ROOT)}: {module} imports {target}")
    assert not unranked, f"give these a layer in RANK: {sorted(unranked)}"
    assert wrong == [], "imports against the layer order:\n" + "\n".join(wrong)


def test_the_check_sees_imports_inside_functions(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from ..bridge.rollout import x\n")
    assert list(imports(f, "slurmk8s.slurm.agent", False)) == ["slurmk8s.bridge.rollout"]


def test_nothing_of_the_product_imports_the_sandbox():
    """The sandbox is not in the product's wheel, so an import of it from the
    operator, the bridge, the agent or the CLI fails in production. The CLI
    reaches the sandbox's commands through entry points only."""
    wrong = [str(path.relative_to(ROOT)) for path, _, _ in modules() if "sandbox" in _third_party_imports([path])]
    assert wrong == [], f"the product imports the sandbox: {wrong}"


def test_the_product_lives_in_its_package_and_the_sandbox_beside_it():
    """One import root for what ships (slurmk8s/, with the operator and the bridge
    inside it), the test bed outside it, and no top-level package of this tree
    named like a module of Python's standard library (``import operator`` from
    the repository root must be Python's)."""
    for part in ("operator", "bridge", "render", "slurm", "api", "simulate"):
        assert (ROOT / "slurmk8s" / part / "__init__.py").is_file(), part
    assert not (ROOT / "slurmk8s" / "sandbox").exists()
    assert (SANDBOX / "__init__.py").is_file()
    top = {p.parent.name for p in ROOT.glob("*/__init__.py")} | {p.stem for p in ROOT.glob("*.py")}
    assert top & set(sys.stdlib_module_names) == set(), "a top-level package shadows the standard library"
    assert not (ROOT / "operator").exists() and not (ROOT / "bridge").exists()


def test_the_sandbox_imports_the_product_by_its_absolute_name():
    """A relative import that climbs out of ``sandbox`` would name a package that is not there."""
    for path in SANDBOX.rglob("*.py"):
        # sandbox/x.py and sandbox/__init__.py may climb one level (to ``sandbox``), a module one folder down two.
        depth = len(path.relative_to(SANDBOX).parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                assert node.level <= depth, f"{path}: from {'.' * node.level}{node.module}"


#: A module over this many lines says why at the top of its docstring, on a
#: line that starts with :data:`LONG_MODULE_MARKER`.
LONG_MODULE_LINES = 500
LONG_MODULE_MARKER = "Over 500 lines because"


def test_every_module_over_500_lines_says_why():
    """A long module is a choice a reviewer can accept or refuse, not an
    accident: it says why it is one module, or it is split."""
    silent = []
    for tree in ("slurmk8s", "sandbox", "hack", "tests"):
        for path in sorted((ROOT / tree).rglob("*.py")):
            name = str(path.relative_to(ROOT))
            text = path.read_text()
            if text.count("\n") <= LONG_MODULE_LINES:
                continue
            doc = ast.get_docstring(ast.parse(text)) or ""
            if not any(line.startswith(LONG_MODULE_MARKER) for line in doc.splitlines()):
                silent.append(f"{name} ({text.count(chr(10))} lines)")
    assert silent == [], (f"say why in the module docstring, on a line starting {LONG_MODULE_MARKER!r}, "
                          f"or split it: {silent}")


def test_what_runs_pods_never_reads_the_build_cache():
    """The kubelet and its runtime get images from a registry (sandbox/pulls.py), as a
    node does: none of them imports the image store, which reads the build cache."""
    runners = ("kubelet.py", "kubeletserver.py", "runcruntime.py", "runcshim.py", "runtime.py", "oci.py",
               "plan.py", "pulls.py", "distribution.py", "layers.py", "gpus.py")
    wrong = []
    for name in runners:
        tree = ast.parse((ROOT / "sandbox" / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[-1] == "imagestore":
                wrong.append(name)
            elif isinstance(node, ast.Import) and any(a.name.endswith("imagestore") for a in node.names):
                wrong.append(name)
    assert wrong == [], f"these read images from the build cache, not a registry: {wrong}"
