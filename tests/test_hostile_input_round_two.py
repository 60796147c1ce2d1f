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


# -- item 1: the Secrets a spec may name --------------------------------------------------------

from slurmk8s.api import load_cluster  # noqa: E402
from slurmk8s.api.secrets import (  # noqa: E402
    DATABASE_PASSWORD, OWNED_SECRET_SUFFIXES, SECRET_USE_LABEL, SSH_KEYS, secret_problem, secret_refs,
)
from slurmk8s.render import ClusterKeys, render  # noqa: E402
from slurmk8s.render.keys import key_secret_names  # noqa: E402

from .conftest import labelled_user_secrets, minimal  # noqa: E402

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice@laptop"


def errors_of(doc: dict) -> dict[str, str]:
    with pytest.raises(InvalidSpec) as info:
        load_cluster(doc)
    return {e.path: e.message for e in info.value.errors}


def external(host: str = "db.example.com", secret: str = "acct-db") -> dict:
    return {"enabled": True, "database": {"external": {"host": host, "passwordSecret": {"name": secret, "key": "pw"}}}}


def test_the_owned_suffixes_are_the_names_the_renderer_gives_key_secrets():
    """One rule, two layers: api/ cannot import render/names.py, so a test holds them together."""
    for cluster in ("demo", "a-b", "x"):
        assert sorted(n.removeprefix(cluster) for n in key_secret_names(cluster)) == sorted(OWNED_SECRET_SUFFIXES)


@pytest.mark.parametrize("name", ["demo-munge-key", "other-agent-token", "demo-ssh-host-keys", "demo-jwt-key",
                                  "x-db-password"])
def test_a_spec_naming_a_generated_secret_is_refused_with_the_field_path(name):
    users = [{"name": "alice", "uid": 2001, "sshPublicKeysFrom": {"name": name, "key": "munge.key"}}]
    found = errors_of(minimal(login={"users": users}))
    assert "generates for a cluster" in found["spec.login.users[0].sshPublicKeysFrom.name"]
    found = errors_of(minimal(accounting=external(secret=name)))
    assert f"{SECRET_USE_LABEL}={DATABASE_PASSWORD}" in \
        found["spec.accounting.database.external.passwordSecret.name"]


@pytest.mark.parametrize("host,why", [
    ("169.254.169.254", "link-local"), ("127.0.0.1", "loopback"), ("127.1.2.3", "loopback"),
    ("localhost", "loopback"), ("db.localhost", "loopback"), ("0.0.0.0", "unspecified"),
    ("224.0.0.1", "multicast"), ("240.0.0.1", "reserved"),
    # inet_aton's other forms of 169.254.169.254 and 127.0.0.1
    ("2852039166", "form other than"), ("0251.0376.0251.0376", "form other than"), ("0x7f000001", "form other than"),
    ("127.1", "form other than"),
])
def test_the_database_host_is_no_loopback_or_metadata_address(host, why):
    found = errors_of(minimal(accounting=external(host=host)))
    assert why in found["spec.accounting.database.external.host"]


@pytest.mark.parametrize("host", ["db.example.com", "10.0.0.5", "mariadb.hpc.svc.cluster.local", "db-1", "1e10"])
def test_ordinary_database_hosts_are_accepted(host):
    assert load_cluster(minimal(accounting=external(host=host)))


def test_secret_problem_checks_the_label_of_the_use_the_field_has():
    c = load_cluster(minimal(login={"users": [{"name": "alice", "uid": 2001, "sshPublicKeysFrom": {
        "name": "alice-keys", "key": "k"}}]}, accounting=external()))
    refs = secret_refs(c)
    assert [(r.path, r.use) for r in refs] == [("spec.login.users[0].sshPublicKeysFrom", SSH_KEYS),
                                              ("spec.accounting.database.external.passwordSecret",
                                               DATABASE_PASSWORD)]

    def secret(use: str | None, key: str) -> dict:
        return {"metadata": {"labels": {SECRET_USE_LABEL: use} if use else {}}, "data": {key: "eA=="}}

    ssh, db = refs
    assert secret_problem(ssh, secret(SSH_KEYS, "k")) is None
    assert secret_problem(db, secret(DATABASE_PASSWORD, "pw")) is None
    # A Secret labelled for login keys is no database password, and the other way round.
    assert "is not labelled" in secret_problem(db, secret(SSH_KEYS, "pw"))
    assert "is not labelled" in secret_problem(ssh, secret(DATABASE_PASSWORD, "k"))
    assert "is not labelled" in secret_problem(ssh, secret(None, "k"))
    assert secret_problem(ssh, None).startswith("spec.login.users[0].sshPublicKeysFrom: ")
    # Without accounting on, the password is not sent anywhere, so not read.
    off = load_cluster(minimal(accounting={**external(), "enabled": False}))
    assert secret_refs(off, used_only=True) == []
    assert [r.use for r in secret_refs(off)] == [DATABASE_PASSWORD]


def test_login_key_files_are_readable_by_root_only():
    doc = minimal(login={"users": [{"name": "bob", "uid": 2002, "sshPublicKeysFrom": {"name": "bob-keys",
                                                                                      "key": "keys"}}]})
    objs = render(load_cluster(doc), ClusterKeys.generate())
    login = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-login"))
    volume = next(v for v in login["spec"]["template"]["spec"]["volumes"] if v["name"] == "user-keys")
    assert volume["projected"]["defaultMode"] == 0o400
    assert labelled_user_secrets(doc)[0]["metadata"]["labels"] == {SECRET_USE_LABEL: SSH_KEYS}
