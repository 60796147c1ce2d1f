"""The version table (slurmk8s/versions.py) is the only place Slurm versions differ.

The code, the templates, the image entrypoints and hack/ may name a Slurm release only
in prose (docstrings, comments); every value that depends on the release comes
from the table. What each row says is checked against that release's real
daemons and plugin files in tests/test_image_build.py.
"""

from __future__ import annotations

import ast
import re
from itertools import pairwise
from pathlib import Path

import pytest

from sandbox import images
from slurmk8s import versions
from slurmk8s.api import InvalidSpec, load_cluster
from slurmk8s.api.crd import all_crds

from .conftest import minimal

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "slurmk8s/versions.py"
#: A Slurm release (YY.MM, 2020-2029) or an openapi data parser version.
RELEASE = re.compile(r"(?<![\w.])2[0-9]\.(0[1-9]|1[0-2])(?![\d])|v0\.0\.[0-9]{2}|openapi_v|v0_0_[0-9]{2}")
#: A comparison with a release as a tuple, e.g. ``version >= (23, 2)``.
TEMPLATE_COMPARISON = re.compile(r"version\s*(<|>|<=|>=|==|!=)|slurm_version\s*(<|>|<=|>=|==|!=)")


def _python_files() -> list[Path]:
    files = [*ROOT.glob("slurmk8s/**/*.py"), *ROOT.glob("hack/**/*.py")]
    return sorted(f for f in files if f != TABLE)


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    # Attribute docstrings: a string statement right after an assignment.
    for node in ast.walk(tree):
        for field in ("body", "orelse"):
            body = getattr(node, field, None)
            if isinstance(body, list):
                for prev, stmt in pairwise(body):
                    if isinstance(prev, (ast.Assign, ast.AnnAssign)) and isinstance(stmt, ast.Expr) \
                            and isinstance(stmt.value, ast.Constant):
                        out.add(id(stmt.value))
    return out


def python_version_literals(path: Path, root: Path = ROOT) -> list[str]:
    """Strings naming a Slurm release or a data parser (prose excluded), and release tuples."""
    tree = ast.parse(path.read_text(), str(path))
    prose = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            if RELEASE.search(node.value):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {node.value[:60]!r}")
        if isinstance(node, ast.Compare) and any(
                isinstance(c, ast.Tuple) and c.elts and isinstance(c.elts[0], ast.Constant)
                and isinstance(c.elts[0].value, int) and 20 <= c.elts[0].value <= 29
                for c in [node.left, *node.comparators]):
            found.append(f"{path.relative_to(root)}:{node.lineno}: a comparison with a release tuple")
    return sorted(found, key=lambda h: int(h.split(":")[1]))


def text_version_literals(path: Path, root: Path = ROOT) -> list[str]:
    """Lines of a template or script that name a release or compare versions. Comment lines
    (shell comments, and the comment lines a template writes into its file: ``#``, or
    ``--`` in a Lua template) and trailing shell comments are prose."""
    found = []
    comment = ("#", "--") if path.name.endswith(".lua.j2") else ("#",)
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith(comment):
            continue
        code = re.sub(r"\{#.*?#\}", "", line) if path.suffix == ".j2" else re.sub(r"\s#\s.*$", "", line)
        if RELEASE.search(code) or TEMPLATE_COMPARISON.search(code):
            found.append(f"{path.relative_to(root)}:{n}: {line.strip()[:80]}")
    return found


def test_no_slurm_release_is_named_outside_the_version_table():
    found = [hit for f in _python_files() for hit in python_version_literals(f)]
    texts = [*ROOT.glob("templates/*.j2"), *ROOT.glob("images/**/*.sh"), *ROOT.glob("images/**/Dockerfile"),
             *ROOT.glob("hack/**/*.sh")]
    found += [hit for f in sorted(texts) for hit in text_version_literals(f)]
    assert found == [], "version differences belong in slurmk8s/versions.py:\n" + "\n".join(found)


def test_the_scan_finds_what_it_is_meant_to(tmp_path):
    """The scan itself: literals, a tuple comparison and a template comparison are found;
    prose is not."""
    code = tmp_path / "m.py"
    code.write_text('"""Slurm 22.05 does X."""\n'
                    'X = 1\n"""Attribute doc: 24.11."""\n'
                    'def f(v):\n    """From 23.02 on."""\n'
                    '    if v >= (23, 2):\n        return "PreemptParameters"\n'
                    '    return {"22.05": 1, "p": "openapi/v0.0.38"}\n')
    hits = [h.split(": ", 1)[1] for h in python_version_literals(code, tmp_path)]
    assert sorted(hits) == sorted(["a comparison with a release tuple", "'22.05'", "'openapi/v0.0.38'"])
    j2 = tmp_path / "t.j2"
    j2.write_text("# Slurm {{ version }} (prose)\n{% if version >= '23.02' %}\nA=1\n{% endif %}\nB=26.05\n")
    assert [h.split(":")[1] for h in text_version_literals(j2, tmp_path)] == ["2", "5"]
    sh = tmp_path / "e.sh"
    sh.write_text("# Slurm 22.05 has no slurmdbd\nopenapi=openapi/v0.0.38  # default\necho ok # 24.11\n")
    assert [h.split(":")[1] for h in text_version_literals(sh, tmp_path)] == ["2"]


def test_the_table_is_well_formed():
    assert versions.SUPPORTED == tuple(sorted(versions.SUPPORTED)) and len(versions.SUPPORTED) >= 3
    assert versions.DEFAULT in versions.SUPPORTED
    for v, r in versions.RELEASES.items():
        assert r.version == v and re.fullmatch(r"[0-9]{2}\.[0-9]{2}", v)
        assert "auth/munge" in r.auth_types  # the images run munged on every release
        assert r.rest_parsers == tuple(sorted(r.rest_parsers))
        assert r.rest_data_parser in (None, r.rest_parsers[-1])
        assert r.rest_openapi_plugin in ("openapi/slurmctld", f"openapi/{r.rest_parsers[-1]}")
        assert {"sinfo", "squeue"} <= set(r.json_commands)
    suites = [r.debian_suite for r in versions.RELEASES.values()]
    assert len(set(suites)) == len(suites)
    with pytest.raises(KeyError, match="supports " + ", ".join(versions.SUPPORTED)):
        versions.release("23.02")


def test_the_image_rules_and_the_crd_take_their_releases_from_the_table():
    assert {v: (s.name, s.mmdebstrap_options) for v, s in images.SUITES.items()} == {
        r.version: (r.debian_suite, r.mmdebstrap_options) for r in versions.RELEASES.values()}
    crd = next(c for c in all_crds() if c["spec"]["names"]["kind"] == "SlurmCluster")
    version = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"]["slurm"]["properties"]["version"]
    assert version["enum"] == list(versions.SUPPORTED) and version["default"] == versions.DEFAULT


@pytest.mark.parametrize("version", versions.SUPPORTED)
def test_every_supported_release_is_accepted(version):
    assert load_cluster(minimal(slurm={"version": version})).spec.slurm.version == version


@pytest.mark.parametrize("value", ["21.08", "23.02", "25.11", "24.11.5", "24.11 ", "latest", ""])
def test_any_other_release_is_refused_naming_the_supported_ones(value):
    with pytest.raises(InvalidSpec) as exc:
        load_cluster(minimal(slurm={"version": value}))
    [error] = exc.value.errors
    assert error.path == "spec.slurm.version"
    assert "use one of " + ", ".join(versions.SUPPORTED) in error.message or "whitespace" in error.message


def test_a_long_value_is_quoted_short():
    with pytest.raises(InvalidSpec) as exc:
        load_cluster(minimal(slurm={"version": "2" * 100_000}))
    [error] = exc.value.errors
    assert error.path == "spec.slurm.version" and len(error.message) < 200
