"""The `slurmk8s` command, run as a user runs it (the installed console script)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import EXAMPLE, ROOT

SLURMK8S = str(Path(sys.executable).parent / "slurmk8s")


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([SLURMK8S, *args], input=stdin, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args", [[], ["render"], ["validate"], ["crd"], ["serve"]])
def test_help_explains_every_command(args):
    proc = run(*args, "--help")
    assert proc.returncode == 0
    assert proc.stdout.startswith("Usage: slurmk8s")
    assert len(proc.stdout.splitlines()) >= 6


def test_version():
    proc = run("--version")
    assert proc.returncode == 0 and "slurmk8s, version" in proc.stdout


def test_validate_accepts_the_example():
    proc = run("validate", "-f", str(EXAMPLE))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "SlurmCluster default/demo is valid\n"


def test_validate_fails_with_field_paths_on_stderr(tmp_path):
    bad = yaml.safe_load(EXAMPLE.read_text())
    bad["spec"]["partitions"][1]["name"] = "gpu\nProlog=/x"
    bad["spec"]["nodeSets"][0]["replicas"] = -3
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    proc = run("validate", "-f", str(path))
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert 'spec.partitions[1].name: "gpu\\nProlog=/x" contains a newline' in proc.stderr
    assert "spec.nodeSets[0].replicas: -3 is too small" in proc.stderr


def test_a_missing_file_is_a_usage_error():
    proc = run("validate", "-f", "/nonexistent.yaml")
    assert proc.returncode == 2
    assert "does not exist" in proc.stderr and "Traceback" not in proc.stderr


def test_a_file_without_a_slurmcluster_is_a_usage_error(tmp_path):
    path = tmp_path / "cm.yaml"
    path.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    proc = run("render", "-f", str(path))
    assert proc.returncode == 2 and "holds no SlurmCluster" in proc.stderr


def test_render_prints_one_yaml_stream_and_logs_only_to_stderr(tmp_path):
    keys = tmp_path / "keys"
    first = run("render", "-f", str(EXAMPLE), "--keys-dir", str(keys))
    assert first.returncode == 0, first.stderr
    docs = list(yaml.safe_load_all(first.stdout))
    assert len(docs) >= 14 and all(d["metadata"]["namespace"] == "default" for d in docs)
    assert "generated key" in first.stderr and "generated key" not in first.stdout
    second = run("render", "-f", "-", "--keys-dir", str(keys), stdin=EXAMPLE.read_text())
    assert second.returncode == 0
    assert second.stdout == first.stdout  # same input and keys: byte-identical
    assert sorted(p.name for p in keys.iterdir()) == ["agent.token", "db.password", "jwt_hs256.key", "munge.key", "ssh_host_ed25519_key"]


def test_render_without_keys_dir_generates_fresh_secrets():
    a, b = run("render", "-f", str(EXAMPLE)), run("render", "-f", str(EXAMPLE))
    secret = lambda out: next(d for d in yaml.safe_load_all(out) if d["kind"] == "Secret")["data"]  # noqa: E731 - a one-line accessor
    assert secret(a.stdout) != secret(b.stdout)
    assert "--keys-dir" in a.stderr


def test_crd_prints_what_the_chart_holds():
    proc = run("crd")
    assert proc.returncode == 0
    printed = {d["metadata"]["name"]: d for d in yaml.safe_load_all(proc.stdout)}
    committed = {p.stem: yaml.safe_load(p.read_text()) for p in (ROOT / "charts" / "slurmk8s" / "files" / "crds").glob("*.yaml")}
    assert printed == committed


def test_render_and_validate_take_the_operators_storage_class_for_shared_claims():
    """Issue 43: with the operator's --shared-storage-class, a shared volume that names no
    class renders a claim of that class and validates as the operator judges it."""
    proc = run("render", "-f", str(EXAMPLE), "--shared-storage-class", "efs-sc")
    assert proc.returncode == 0, proc.stderr
    claims = [d for d in yaml.safe_load_all(proc.stdout) if d and d["kind"] == "PersistentVolumeClaim"]
    assert [c["spec"]["storageClassName"] for c in claims] == ["efs-sc"]
    assert "storageClassName" not in proc.stderr
    assert run("validate", "-f", str(EXAMPLE), "--shared-storage-class", "efs-sc").returncode == 0
    bad = run("validate", "-f", str(EXAMPLE), "--shared-storage-class", "EFS_sc")
    assert bad.returncode == 2 and "is not a StorageClass name" in bad.stderr


def test_json_logs(tmp_path):
    proc = run("--log-format", "json", "render", "-f", str(EXAMPLE))
    lines = proc.stderr.strip().splitlines()
    assert lines and all(line.startswith("{") for line in lines), proc.stderr
    assert any('"level": "info"' in line for line in lines)
    # The example names no StorageClass for its shared volume: said, as the operator without a default refuses it.
    assert any('"level": "warning"' in line and "storageClassName" in line for line in lines)
