"""Reading manifests from files: YAML streams that may hold several objects."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import yaml

from .api import InvalidSpec, NodeLendingPolicy, SlurmCluster, load_cluster, load_policy
from .api.cluster import API_VERSION, KIND
from .api.lending import KIND as POLICY_KIND
from .api.errors import FieldError


_stdin: str | None = None


def _read(path: str) -> str:
    """The text of ``path``; '-' is stdin, read once however often a command asks."""
    global _stdin
    if path != "-":
        return Path(path).read_text()
    if _stdin is None:
        _stdin = sys.stdin.read()
    return _stdin


def read_documents(path: str) -> list[dict]:
    """Every non-empty YAML document of ``path`` ('-' reads stdin)."""
    text = _read(path)
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise InvalidSpec([FieldError("(file)", f"is not valid YAML: {exc}")]) from None
    except RecursionError:
        raise InvalidSpec([FieldError("(file)", "is nested too deeply to be a manifest")]) from None
    return docs


def clusters(path: str) -> Iterator[SlurmCluster]:
    """The SlurmClusters of a file; other kinds are skipped, bad ones raise InvalidSpec."""
    return clusters_in(read_documents(path))


def clusters_in(docs: list) -> Iterator[SlurmCluster]:
    """The SlurmClusters of a manifest's documents, as :func:`clusters`."""
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") not in (None, KIND):
            continue
        if isinstance(doc, dict) and doc.get("apiVersion", API_VERSION) != API_VERSION:
            raise InvalidSpec([FieldError(
                "apiVersion", f"{doc['apiVersion']!r} is not served; use {API_VERSION}")])
        yield load_cluster(doc)


def with_slurm_version(docs: list[dict], version: str) -> list[dict]:
    """``docs`` with ``spec.slurm.version`` of every SlurmCluster set to ``version``
    (other documents and the input untouched): `sandbox up --slurm-version`."""
    out = []
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") in (None, KIND):
            spec = dict(doc.get("spec") or {})
            spec["slurm"] = {**(spec.get("slurm") or {}), "version": version}
            doc = {**doc, "spec": spec}
        out.append(doc)
    return out


def policies(path: str) -> Iterator[NodeLendingPolicy]:
    """The NodeLendingPolicies of a file; other kinds are skipped, bad ones raise InvalidSpec."""
    for doc in read_documents(path):
        if not isinstance(doc, dict) or doc.get("kind") != POLICY_KIND:
            continue
        if doc.get("apiVersion", API_VERSION) != API_VERSION:
            raise InvalidSpec([FieldError(
                "apiVersion", f"{doc['apiVersion']!r} is not served; use {API_VERSION}")], kind=POLICY_KIND)
        yield load_policy(doc)
