"""What a test needs, said where it is needed: a fixture that starts daemons,
makes namespaces or changes owners declares it (``@needs("root")`` under
``@pytest.fixture``), and every test that uses the fixture gets the marker
(``conftest.pytest_collection_modifyitems``), so the tiers of tests/README.md
stay true as tests are added. A test that needs it by itself is marked
``@pytest.mark.root`` directly.

The markers: ``root`` (namespaces, mounts, veths, runc, chown to other users,
nftables: the pure tier, ``-m "not root"``, runs as an unprivileged user),
``slurm`` (this host's Slurm daemons), ``images`` (builds or runs the images),
``registry`` (Debian's docker-registry). ``slurm``, ``images`` and ``registry``
imply ``root``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pytest

__all__ = ["needs", "mark_needs", "IMPLY_ROOT"]

F = TypeVar("F", bound=Callable)

#: Markers whose tests also need root.
IMPLY_ROOT = ("slurm", "images", "registry")


def needs(*markers: str) -> Callable[[F], F]:
    """Declare, on a fixture's function (below ``@pytest.fixture``), the markers
    every test that uses it gets."""
    def mark(fn: F) -> F:
        fn.slurmk8s_needs = frozenset(markers)  # type: ignore[attr-defined]
        return fn
    return mark


def mark_needs(item: pytest.Item) -> set[str]:
    """Add to ``item`` the markers its fixtures declare, and ``root`` where a
    marker implies it; the markers added."""
    info = getattr(item, "_fixtureinfo", None)
    wanted: set[str] = set()
    for defs in (info.name2fixturedefs.values() if info is not None else ()):
        for d in defs:
            wanted |= getattr(d.func, "slurmk8s_needs", frozenset())
    if wanted & set(IMPLY_ROOT) or any(item.get_closest_marker(m) for m in IMPLY_ROOT):
        wanted.add("root")
    added = {m for m in wanted if item.get_closest_marker(m) is None}
    for m in sorted(added):
        item.add_marker(getattr(pytest.mark, m))
    return added
