"""The tiers stay true: a test that checks for root itself (``os.geteuid() == 0``)
carries a marker that keeps it out of the pure tier (``root``, or ``slurm``,
``images`` or ``registry``, which imply it: tests/tiers.py). Pure: reads the
tests' source."""

from __future__ import annotations

import ast
from pathlib import Path

from .tiers import IMPLY_ROOT

TESTS = Path(__file__).resolve().parent
MARKERS = {"root", *IMPLY_ROOT}


def _marks(decorators: list[ast.expr]) -> set[str]:
    """The ``pytest.mark.X`` names among ``decorators`` (called or not)."""
    found = set()
    for d in decorators:
        node = d.func if isinstance(d, ast.Call) else d
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "mark":
            found.add(node.attr)
        elif isinstance(node, ast.Name):  # an alias such as needs_root = pytest.mark.root
            found.add(node.id)
    return found


def _aliases(tree: ast.Module) -> dict[str, str]:
    """Module-level ``name = pytest.mark.X``."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            marks = _marks([node.value])
            if marks:
                out[node.targets[0].id] = marks.pop()
    return out


def _module_marks(tree: ast.Module) -> set[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            values = node.value.elts if isinstance(node.value, ast.List | ast.Tuple) else [node.value]
            return _marks(values)
    return set()


def _is_root_check(compare: ast.Compare) -> bool:
    """``os.geteuid() == 0`` or ``!= 0``, either way round."""
    sides = [compare.left, *compare.comparators]
    calls = any(isinstance(s, ast.Call) and isinstance(s.func, ast.Attribute) and s.func.attr == "geteuid"
                for s in sides)
    return calls and any(isinstance(s, ast.Constant) and s.value == 0 for s in sides)


def unmarked_root_tests(source: str) -> list[str]:
    """Test functions of ``source`` that call ``geteuid`` and carry no marker of the root tier."""
    tree = ast.parse(source)
    aliases, module = _aliases(tree), _module_marks(tree)
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test_")):
            continue
        marks = {aliases.get(m, m) for m in _marks(node.decorator_list)} | module
        checks = any(isinstance(n, ast.Compare) and _is_root_check(n) for n in ast.walk(node))
        if checks and not marks & MARKERS:
            out.append(node.name)
    return out


def test_a_test_that_checks_for_root_is_marked_out_of_the_pure_tier() -> None:
    found = {p.name: names for p in sorted(TESTS.rglob("test_*.py"))
             if (names := unmarked_root_tests(p.read_text()))}
    assert not found, f"mark these @pytest.mark.root (tests/tiers.py): {found}"


def test_the_check_sees_an_unmarked_test_and_passes_a_marked_one() -> None:
    source = '''
import os, pytest
needs_root = pytest.mark.root

def test_a():
    assert os.geteuid() == 0

@pytest.mark.root
def test_b():
    assert os.geteuid() == 0

@needs_root
def test_c():
    assert os.geteuid() == 0

def test_d():
    assert os.stat('.').st_uid == os.geteuid()
'''
    assert unmarked_root_tests(source) == ["test_a"]
