"""The pod template a site shapes (decision record 48): node sets' and lent slurmd pods'
runtime class, labels and annotations, priority class, affinity, tolerations, extra
volumes and mounts, extra resources, capabilities and DNS; what would break the
product refused with its field path; applied by one function to both kinds of pod."""

from __future__ import annotations

import pytest

from slurmk8s.api import InvalidSpec, load_cluster
from slurmk8s.bridge.nodestate import TAINT_KEY

from .conftest import minimal


def errors_of(doc: dict) -> list[str]:
    with pytest.raises(InvalidSpec) as info:
        load_cluster(doc)
    return [str(e) for e in info.value.errors]


@pytest.mark.parametrize("key", [TAINT_KEY, "slurmk8s.dev/anything", "x.slurmk8s.dev/y"])
def test_a_node_set_tolerates_no_taint_of_the_products_own(key):
    found = errors_of(minimal(nodeSets=[{"name": "g", "tolerations": [{"key": key, "operator": "Exists"}]}]))
    assert len(found) == 1 and found[0].startswith("spec.nodeSets[0].tolerations[0].key: "), found
    assert "taint of slurmk8s's own" in found[0] and "lent to a Slurm cluster" in found[0]


def test_a_look_alike_taint_key_is_the_sites():
    load_cluster(minimal(nodeSets=[{"name": "g", "tolerations": [
        {"key": "notslurmk8s.dev/lent", "operator": "Exists"}, {"key": "slurmk8s.dev.example.com/x", "operator": "Exists"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}]))
