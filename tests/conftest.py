"""Shared fixtures: the example cluster, fixed keys, and a spec builder."""

from __future__ import annotations

import copy
import functools
import os
from pathlib import Path

import kubernetes_validate.utils
import pytest
import yaml
from hypothesis import HealthCheck, settings

from slurmk8s import versions
from slurmk8s.render import ClusterKeys

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "slurmcluster.yaml"

# kubernetes-validate reads and parses its JSON schemas (the definitions file
# alone is megabytes) on every object it validates, half of what the corpus
# tests spent: each file is parsed once. The schemas are only ever read.
kubernetes_validate.utils.schema_contents = functools.lru_cache(maxsize=None)(
    kubernetes_validate.utils.schema_contents)
kubernetes_validate.utils.all_versions = functools.lru_cache(maxsize=1)(kubernetes_validate.utils.all_versions)

# Hypothesis's timing checks (an example's 200 ms deadline, input drawn "too
# slowly") measure the machine, not the code: the suite runs on two cores beside
# two sandboxes (hack/test.sh), where a first draw that builds Unicode tables can
# take seconds. What a property is about is checked as written; what share of
# its examples reach it, by tests/reach.py.
settings.register_profile("suite", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")


@pytest.fixture(scope="session")
def example_doc() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


def example_without_accounting() -> dict:
    """The example manifest less its ``spec.accounting``, for tests that start the cluster's
    daemons without slurmdbd: slurmctld's very first start waits for slurmdbd
    (tests/test_accounting_images.py and the accounting e2e run them together)."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"].pop("accounting", None)
    return doc


def host_release() -> str:
    """The supported Slurm release of this machine's Debian packages: the daemons
    ``realslurm.py`` starts without image roots are this one, whatever the default."""
    fields = dict(line.split("=", 1) for line in Path("/etc/os-release").read_text().splitlines() if "=" in line)
    suite = fields.get("VERSION_CODENAME", "").strip('"')
    return next(v for v, r in versions.RELEASES.items() if r.debian_suite == suite)


@pytest.fixture(scope="session")
def host_example_doc() -> dict:
    """The example manifest on the host's Slurm release, for tests of this host's daemons
    (without slurmdbd, so without accounting)."""
    doc = example_without_accounting()
    doc["spec"]["slurm"]["version"] = host_release()
    return doc


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


@pytest.fixture
def fake_slurm(tmp_path) -> dict[str, str]:
    """scontrol and srun stand-ins, so that examples/train.sh runs outside Slurm."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/sh\n[ \"$1\" = show ] && echo node-0\nexit 0\n")
    (bin_dir / "srun").write_text("#!/bin/sh\nexec \"$@\"\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node-0",
            "SLURM_JOB_NAME": "train", "USER": "researcher"}


def publish(model_dir: Path, version: str, step: int | None = None) -> Path:
    """What a training job does: write the version, then replace LATEST by a rename."""
    tmp = model_dir / f".new-{version}"
    tmp.mkdir(parents=True)
    if step is not None:
        (tmp / "step").write_text(f"{step}\n")
    (tmp / "model.json").write_text("{}\n")
    tmp.rename(model_dir / version)
    (model_dir / ".LATEST.new").write_text(version + "\n")
    (model_dir / ".LATEST.new").rename(model_dir / "LATEST")
    return model_dir / version


def pytest_collection_modifyitems(config, items) -> None:
    """Each test gets the markers its fixtures declare (tests/tiers.py)."""
    from .tiers import mark_needs

    for item in items:
        mark_needs(item)


@pytest.fixture(autouse=True)
def _logging_as_found():
    """structlog's configuration as before each test: a test that runs the CLI
    in-process configures it (its level, its stream), and the tests after it
    in the same process (pytest-xdist runs files in other orders) must not
    inherit that."""
    import structlog

    before = structlog.get_config()
    yield
    structlog.configure(**before)


#: what the run's closing summary prints, gathered from the tests' reports
_SUMMARY: dict = {"reached": [], "counts": {}}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Carry what a test adds to the run's closing summary (the corpus's counts,
    the shares of tests/reach.py) on its report, so that it reaches the summary
    from a pytest-xdist worker as well as from this process."""
    from .reach import LINES

    outcome = yield
    report = outcome.get_result()
    if report.when != "teardown":
        return
    while LINES:
        report.user_properties.append(("reached", LINES.pop(0)))
    module = getattr(item, "module", None)
    counts = getattr(module, "COUNTS", None)
    if counts:
        report.user_properties.append(("counts", (module.__name__.split(".")[-1], dict(counts))))


def pytest_runtest_logreport(report) -> None:
    for key, value in report.user_properties:
        if key == "reached":
            _SUMMARY["reached"].append(value)
        elif key == "counts":
            name, counts = value
            _SUMMARY["counts"].setdefault(name, {}).update(counts)


def pytest_terminal_summary(terminalreporter) -> None:
    """The hostile-input corpus's counts (tests/test_corpus.py), when it ran, and the share
    of examples each property test reached its point with (tests/reach.py)."""
    for name, counts in sorted(_SUMMARY["counts"].items()):
        terminalreporter.write_line(f"{name}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    for line in _SUMMARY["reached"]:
        terminalreporter.write_line(line)


def labelled_user_secrets(doc: dict, public_key: str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice@laptop") -> list[dict]:
    """The Secrets a site makes for the ``sshPublicKeysFrom`` of ``doc``, labelled for that use
    (slurmk8s.api.secrets): the operator mounts no other."""
    import base64

    from slurmk8s.api.secrets import SECRET_USE_LABEL, SSH_KEYS

    data: dict[str, dict[str, str]] = {}
    for u in doc.get("spec", {}).get("login", {}).get("users", []):
        ref = u.get("sshPublicKeysFrom")
        if ref:
            data.setdefault(ref["name"], {})[ref["key"]] = base64.b64encode(public_key.encode()).decode()
    return [{"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
             "metadata": {"name": n, "namespace": doc["metadata"].get("namespace", "default"),
                          "labels": {SECRET_USE_LABEL: SSH_KEYS}}, "data": d} for n, d in sorted(data.items())]
