"""Every folder says what lives in it: each folder README names every file
and folder beside it, and every file or folder a README's table names in its
first column is there. Pure: reads the tree."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Folders whose README lists what lives in them.
FOLDERS = (
    "charts", "docs", "examples", "hack", "images", "sandbox", "sandbox/apiserver",
    "slurmk8s", "slurmk8s/bridge", "slurmk8s/operator", "slurmk8s/simulate",
    "templates", "tests", "tests/apiserver", "tests/prometheus",
)

#: Entries no README lists: packaging and tool output.
IGNORED = re.compile(r"^(README\.md|__init__\.py|__pycache__|.*\.egg-info|\..*|pyproject\.toml|Chart\.yaml)$")

#: A table's first column that names an entry of the folder: `name.ext` or `name/`.
ROW = re.compile(r"^\|\s*`([\w.-]+(?:\.(?:py|sh|md|j2|yaml|json)|/))`", re.M)


def entries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if not IGNORED.match(p.name))


def named(readme: str, entry: str) -> bool:
    """`entry`, `entry/`, a path ending in it or one below it, in backticks; a
    module also by its stem."""
    stem = entry.removesuffix(".py")
    for quoted in re.findall(r"`([^`\s]+)`", readme):
        quoted = quoted.rstrip("/")
        if quoted in (entry, stem) or quoted.endswith("/" + entry) or quoted.startswith(entry + "/"):
            return True
    return False


@pytest.mark.parametrize("folder", FOLDERS)
def test_a_folder_s_readme_names_everything_in_it(folder: str) -> None:
    readme = (ROOT / folder / "README.md").read_text()
    missing = [e for e in entries(ROOT / folder) if not named(readme, e)]
    assert not missing, f"{folder}/README.md does not say what these are: {missing}"


@pytest.mark.parametrize("folder", FOLDERS)
def test_what_a_readme_s_table_names_is_there(folder: str) -> None:
    readme = (ROOT / folder / "README.md").read_text()
    gone = [r for r in ROW.findall(readme) if not (ROOT / folder / r.rstrip("/")).exists()]
    assert not gone, f"{folder}/README.md names what is not there: {gone}"


def test_the_check_sees_a_missing_entry_and_a_gone_one(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("")
    (tmp_path / "b.py").write_text("")
    readme = "| `a.py` | x |\n| `c.py` | y |\n"
    assert [e for e in entries(tmp_path) if not named(readme, e)] == ["b.py"]
    assert [r for r in ROW.findall(readme) if not (tmp_path / r).exists()] == ["c.py"]
