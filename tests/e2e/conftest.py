"""The Slurm release matrix of the e2e suites.

Every module's sandbox takes the module-scoped fixture ``release``, one of
``versions.SUPPORTED``: each test runs once per supported Slurm release, on a
sandbox started for that release (``sandbox up --slurm-version``), unless it is
marked :data:`default_release_only`. Such a test is parametrized with the
default release alone (pytest lets a test's own parametrization override the
fixture's), so it shares the default release's sandbox and is not skipped
elsewhere: it is never collected for the other releases. tests/README.md says
which tests run where.
"""

from __future__ import annotations

import pytest

from slurmk8s import versions

#: On the default release only: what no release changes (the chart, RBAC, the
#: sandbox's own behaviour) or what the release matrix need not repeat.
default_release_only = pytest.mark.parametrize("release", [versions.DEFAULT], indirect=True)


@pytest.fixture(scope="module", params=versions.SUPPORTED)
def release(request) -> str:
    """The Slurm release of the module's sandbox."""
    return request.param
