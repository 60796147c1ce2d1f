"""Issue 24, items 1, 7 and 9: Secrets a spec may name, values Kubernetes or
Slurm refuse later, and YAML that expands."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from slurmk8s.api import InvalidSpec
from slurmk8s.manifest import MAX_YAML_BYTES, MAX_YAML_VALUES, load_yaml, read_documents

from .conftest import EXAMPLE

SLURMK8S = str(Path(sys.executable).parent / "slurmk8s")


# -- item 9: YAML that expands -----------------------------------------------------------------


def billion_laughs(levels: int = 9, width: int = 10) -> str:
    """A SlurmCluster whose spec holds ``width ** levels`` values once its aliases expand."""
    lines = [f"a0: &a0 [{', '.join(['x'] * width)}]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels)]
    return ("apiVersion: slurmk8s.dev/v1alpha1\nkind: SlurmCluster\nmetadata: {name: demo}\nspec:\n  x:\n"
            + "".join(f"    {line}\n" for line in lines))


def test_validate_refuses_a_yaml_bomb_in_under_a_second(tmp_path):
    """Before the bound, `slurmk8s validate` walked 10^9 values for over a minute."""
    f = tmp_path / "bomb.yaml"
    f.write_text(billion_laughs())
    assert f.stat().st_size < 1000
    started = time.monotonic()
    proc = subprocess.run([SLURMK8S, "validate", "-f", str(f)], capture_output=True, text=True, timeout=20)
    took = time.monotonic() - started
    assert proc.returncode != 0
    assert f"(file): expands to more than {MAX_YAML_VALUES} values" in proc.stderr
    started = time.monotonic()
    with pytest.raises(InvalidSpec) as info:
        read_documents(str(f))
    assert time.monotonic() - started < 1, "the refusal itself must be quick"
    assert [e.path for e in info.value.errors] == ["(file)"]
    assert took < 10  # the command as a whole: interpreter start-up included


def test_expansion_is_counted_across_documents_and_just_under_the_bound_loads():
    per_doc = 10 ** 5  # 10^5 scalars + the list and the aliases' lists
    doc = "a: &a [" + ", ".join(["x"] * 10) + "]\nb: &b [" + ", ".join(["*a"] * 10) + "]\n"
    doc += "c: &c [" + ", ".join(["*b"] * 10) + "]\nd: &d [" + ", ".join(["*c"] * 10) + "]\n"
    doc += "e: [" + ", ".join(["*d"] * 10) + "]\n"
    assert len(load_yaml(doc)) == 1  # about 1.1 * 10^5 values: fine
    stream = "---\n".join([doc] * (MAX_YAML_VALUES // per_doc + 1))
    with pytest.raises(InvalidSpec, match="expands to more than"):
        load_yaml(stream)


def test_an_alias_inside_itself_is_refused_not_walked_for_ever():
    with pytest.raises(InvalidSpec, match="contains it"):
        load_yaml("a: &a [1, *a]\n")


def test_aliases_that_stay_small_are_still_yaml(tmp_path):
    text = EXAMPLE.read_text().replace("spec:\n", "x-defaults: &res {cpu: 500m}\nspec:\n", 1)
    docs = load_yaml(text)
    assert docs[0]["x-defaults"] == {"cpu": "500m"}
    assert docs == [yaml.safe_load(text)]


def test_a_file_over_the_size_bound_is_refused_without_reading_it_all(tmp_path):
    f = tmp_path / "big.yaml"
    with f.open("w") as out:
        out.write("a: '")
        out.write("x" * (MAX_YAML_BYTES + 10))
        out.write("'\n")
    started = time.monotonic()
    with pytest.raises(InvalidSpec, match="bytes long"):
        read_documents(str(f))
    assert time.monotonic() - started < 1
