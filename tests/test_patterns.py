"""The patterns of names (DNS labels and subdomains, sacctmgr's names, POSIX
user and group names, Slurm's names and node names) are spelled once, in
slurmk8s/api/fields.py; every other module imports them. A second spelling
drifts: a bound changed in one place and not the other lets a name through
one check that another refuses."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from slurmk8s.api import fields

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ROOT / "slurmk8s"
FIELDS = PRODUCT / "api" / "fields.py"

#: Each pattern, and the text no other module may hold: the character classes
#: that make it (so a copy with other bounds is found as well).
STEMS = {
    "DNS_LABEL_RE": "[-a-z0-9]",
    "DNS_SUBDOMAIN_RE": "[-a-z0-9]",
    "SACCTMGR_NAME_RE": "[a-z0-9][a-z0-9_-]",
    "POSIX_NAME_RE": "[a-z_][a-z0-9_-]",
    "SLURM_NAME_RE": "[A-Za-z0-9][A-Za-z0-9_.-]",
    "SLURM_NODE_NAME_RE": "[A-Za-z0-9][A-Za-z0-9_.-]",
}


def spelled_elsewhere(tree: Path, skip: Path | None = None) -> list[str]:
    """``file: pattern`` for each module under ``tree`` but ``skip`` that spells a pattern of STEMS."""
    found = []
    for path in sorted(tree.rglob("*.py")):
        if path == skip:
            continue
        text = path.read_text()
        found += [f"{path.relative_to(tree)}: {name}" for name, stem in STEMS.items() if stem in text]
    return found


@pytest.mark.parametrize("name", sorted(STEMS))
def test_each_stem_is_the_pattern_s_own(name):
    """The scan looks for what fields.py's pattern is made of."""
    assert STEMS[name] in getattr(fields, name)


def test_no_module_but_fields_spells_a_name_pattern():
    assert spelled_elsewhere(PRODUCT, skip=FIELDS) == [], "import these from slurmk8s/api/fields.py"


def test_the_scan_finds_a_copy_with_other_bounds(tmp_path):
    (tmp_path / "copy.py").write_text('_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")\n'
                                      '_RELEASE = r"[a-z0-9]([-a-z0-9]{0,51}[a-z0-9])?"\n')
    (tmp_path / "imports.py").write_text("from slurmk8s.api.fields import SACCTMGR_NAME_RE\n")
    assert spelled_elsewhere(tmp_path) == ["copy.py: DNS_LABEL_RE", "copy.py: DNS_SUBDOMAIN_RE",
                                           "copy.py: SACCTMGR_NAME_RE"]


def test_the_node_name_bound_differs_from_the_spec_s_names_only_in_length():
    """Slurm node names (a worker pod's, a lent Node's) take the alphabet of the
    spec's Slurm names, up to 128 characters where the spec's take 64."""
    node, name = re.compile(fields.SLURM_NODE_NAME_RE), re.compile(fields.SLURM_NAME_RE)
    for text in ("a", "gpu-node-7.example", "A_b.c-d", "a" * 128):
        assert node.fullmatch(text) and name.fullmatch(text)
    for text in ("-a", ".a", "a b", "a/b", ""):
        assert not node.fullmatch(text) and not name.fullmatch(text)
    assert not node.fullmatch("a" * 129) and name.fullmatch("a" * 129)
