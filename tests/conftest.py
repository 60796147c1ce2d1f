"""Shared fixtures: the example cluster, fixed keys, and a spec builder."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from slurmk8s.render import ClusterKeys

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "slurmcluster.yaml"


@pytest.fixture(scope="session")
def example_doc() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


@pytest.fixture
def doc(example_doc) -> dict:
    """A fresh, mutable copy of the example manifest."""
    return copy.deepcopy(example_doc)


@pytest.fixture(scope="session")
def keys() -> ClusterKeys:
    return ClusterKeys.generate()


def minimal(**spec) -> dict:
    """The smallest SlurmCluster document, with ``spec`` merged in."""
    return {
        "apiVersion": "slurmk8s.dev/v1alpha1",
        "kind": "SlurmCluster",
        "metadata": {"name": "c1", "namespace": "hpc"},
        "spec": spec,
    }
