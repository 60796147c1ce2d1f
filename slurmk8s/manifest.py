"""Reading manifests from files: YAML streams that may hold several objects.

YAML is read by :func:`load_yaml`, the one reader of user YAML in the
product: it bounds the input's size and the number of values its aliases
expand to (a few kilobytes of ``&a [*b, *b, ...]`` expand to billions of
values, which every later step would walk), so a hostile file is refused in
well under a second instead of keeping a command busy for minutes.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import yaml

from .api import InvalidSpec, NodeLendingPolicy, SlurmCluster, load_cluster, load_policy
from .api.cluster import API_VERSION, KIND
from .api.errors import FieldError
from .api.lending import KIND as POLICY_KIND

_stdin: str | None = None

#: The largest manifest read, in bytes: a cluster with 1000 users and their
#: keys is under 2 MiB.
MAX_YAML_BYTES = 16 * 2**20
#: The most values (mappings, sequences, scalars, keys included) a stream may
#: hold once its aliases are expanded: every alias counts as a copy of what it
#: names. The largest SlurmCluster the API allows (1000 users with 32 keys,
#: 64 node sets, ...) holds under 100,000.
MAX_YAML_VALUES = 1_000_000


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return node.value
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _expanded_size(root: yaml.Node, budget: int) -> int:
    """How many values ``root`` holds with every alias expanded, counting no
    further than just past ``budget``; each distinct node is visited once, so
    the cost follows the text's size, not the expansion's. A node that
    contains itself raises ValueError."""
    size: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            on_path.discard(key)
            total = 1 + sum(size[id(child)] for child in _children(node))
            size[key] = min(total, budget + 1)
            continue
        if key in size:
            continue
        if key in on_path:
            raise ValueError("an alias refers to a value that contains it")
        on_path.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in size)
    return size[id(root)]


def load_yaml(text: str | bytes, *, what: str = "(file)") -> list:
    """Every document of a YAML stream, refused with InvalidSpec (path ``what``)
    when it is not YAML, larger than MAX_YAML_BYTES, or expands to more than
    MAX_YAML_VALUES values. Nothing is built before the checks pass."""
    length = len(text.encode() if isinstance(text, str) else text)
    if length > MAX_YAML_BYTES:
        raise InvalidSpec([FieldError(what, f"is {length} bytes long; a manifest may have at most "
                                             f"{MAX_YAML_BYTES} ({MAX_YAML_BYTES // 2**20} MiB)")])
    loader = yaml.SafeLoader(text)
    docs = []
    left = MAX_YAML_VALUES
    try:
        while loader.check_node():
            node = loader.get_node()
            assert node is not None  # check_node() said there is one
            try:
                size = _expanded_size(node, left)
            except ValueError as exc:
                raise InvalidSpec([FieldError(what, f"is not a manifest: {exc}")]) from None
            if size > left:
                raise InvalidSpec([FieldError(
                    what, f"expands to more than {MAX_YAML_VALUES} values (its aliases repeat what they "
                          "name); write the manifest out, or split it")])
            left -= size
            docs.append(loader.construct_document(node))
    except yaml.YAMLError as exc:
        raise InvalidSpec([FieldError(what, f"is not valid YAML: {exc}")]) from None
    except RecursionError:
        raise InvalidSpec([FieldError(what, "is nested too deeply to be a manifest")]) from None
    finally:
        loader.dispose()
    return docs


def _read(path: str) -> str:
    """The text of ``path``; '-' is stdin, read once however often a command asks."""
    global _stdin
    if path != "-":
        with Path(path).open(encoding="utf-8") as f:
            return f.read(MAX_YAML_BYTES + 1)  # one more: load_yaml says it is too long
    if _stdin is None:
        _stdin = sys.stdin.read(MAX_YAML_BYTES + 1)
    return _stdin


def read_documents(path: str) -> list[dict]:
    """Every non-empty YAML document of ``path`` ('-' reads stdin)."""
    return [d for d in load_yaml(_read(path)) if d is not None]


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
