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

from slurmk8s.api import load_cluster  # noqa: E402 - with the item's tests below
from slurmk8s.api.secrets import (  # noqa: E402 - with the item's tests below
    ALLOWED_HOSTS_ANNOTATION,
    DATABASE_PASSWORD,
    OWNED_SECRET_SUFFIXES,
    SECRET_USE_LABEL,
    SSH_KEYS,
    secret_problem,
    secret_refs,
)
from slurmk8s.render import ClusterKeys, render  # noqa: E402 - with the item's tests below
from slurmk8s.render.keys import key_secret_names  # noqa: E402 - with the item's tests below

from .conftest import labelled_user_secrets, minimal  # noqa: E402 - with the item's tests below

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
    found = errors_of(minimal(imagePullSecrets=["regcred", name]))
    assert "kubernetes.io/dockerconfigjson" in found["spec.imagePullSecrets[1]"] and len(found) == 1


def test_image_pull_secrets_reach_every_pod_of_the_cluster_and_its_lent_nodes():
    from slurmk8s.render.manifests import lent_slurmd_pod

    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["imagePullSecrets"] = ["regcred", "mirror"]
    doc["spec"]["accounting"] = {"enabled": True}
    cluster = load_cluster(doc)
    objs = render(cluster, ClusterKeys.generate())
    specs = {f"{o['kind']}/{o['metadata']['name']}": o["spec"]["template"]["spec"] for o in objs
             if o["kind"] in ("StatefulSet", "Deployment")}
    lent = lent_slurmd_pod(cluster, "h", node="n1", resources={"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "2"},
                           labels={}, partition="gpu", shm_size="1Gi", taint_key="slurmk8s.dev/lent")
    specs["Pod/lent"] = lent["spec"]
    assert len(specs) >= 6  # controller, workers, login, database, slurmdbd, the lent pod
    assert all(s.get("imagePullSecrets") == [{"name": "regcred"}, {"name": "mirror"}] for s in specs.values()), \
        [k for k, s in specs.items() if s.get("imagePullSecrets") != [{"name": "regcred"}, {"name": "mirror"}]]
    # None named: none written.
    plain = render(load_cluster(yaml.safe_load(EXAMPLE.read_text())), ClusterKeys.generate())
    assert not any("imagePullSecrets" in o.get("spec", {}).get("template", {}).get("spec", {}) for o in plain)


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
        return {"metadata": {"labels": {SECRET_USE_LABEL: use} if use else {},
                             "annotations": {ALLOWED_HOSTS_ANNOTATION: "db.example.com"}}, "data": {key: "eA=="}}

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


# -- item 7: values Kubernetes or Slurm refuse later ---------------------------------------------

import base64  # noqa: E402 - with the item's tests below
import re  # noqa: E402 - with the item's tests below

from slurmk8s.api.fields import SLURM_DURATION_MAX_SECONDS, duration_seconds  # noqa: E402 - with the item's tests below
from slurmk8s.api.quantities import quantity_value  # noqa: E402 - with the item's tests below
from slurmk8s.api.secrets import DB_PASSWORD_RE  # noqa: E402 - with the item's tests below
from slurmk8s.slurm import SlurmClient, SlurmError  # noqa: E402 - with the item's tests below
from slurmk8s.slurm.accounting import Associations, QosLimits  # noqa: E402 - with the item's tests below

from .conftest import ROOT  # noqa: E402 - with the item's tests below


@pytest.mark.parametrize("toleration,path", [
    ({"operator": "Exists", "key": "gpu", "value": "yes"}, "value"),
    ({"operator": "Equal", "value": "yes"}, "operator"),
    ({"key": "gpu", "value": "yes", "effect": "NoSchedule", "tolerationSeconds": 60}, "tolerationSeconds"),
    ({"key": "gpu", "operator": "Exists", "tolerationSeconds": 60}, "tolerationSeconds"),
])
def test_tolerations_kubernetes_refuses_are_refused_with_the_field_path(toleration, path):
    found = errors_of(minimal(nodeSets=[{"name": "a", "tolerations": [{"key": "ok", "operator": "Exists"},
                                                                      toleration]}]))
    assert list(found) == [f"spec.nodeSets[0].tolerations[1].{path}"]


def test_tolerations_kubernetes_accepts_are_accepted():
    ok = [{"operator": "Exists"}, {"key": "gpu", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 5},
          {"key": "gpu", "value": "a100", "effect": "NoSchedule"}, {"key": "gpu", "operator": "Exists"}]
    assert load_cluster(minimal(nodeSets=[{"name": "a", "tolerations": ok}]))


@pytest.mark.parametrize("value", ["1Ei", "2E", "7Ei", "1e18", "0.5Gi"])
def test_quantities_kubernetes_holds_are_accepted_and_read_as_kubernetes_reads_them(value):
    from kubernetes.utils import parse_quantity

    assert load_cluster(minimal(controller={"resources": {"limits": {"memory": value}}}))
    assert quantity_value(value) == parse_quantity(value)


@pytest.mark.parametrize("value,why", [("+1Gi", "sign"), ("8Ei", "larger"), ("1e400", "larger"),
                                       ("Infinity", "quantity"), ("1_0", "quantity")])
def test_quantities_the_crd_refuses_are_refused(value, why):
    found = errors_of(minimal(controller={"resources": {"limits": {"memory": value}}}))
    assert why in found["spec.controller.resources.limits.memory"]


def test_numbers_slurm_cannot_hold_are_refused_with_the_field_path():
    found = errors_of(minimal(slurmConfig={"defMemPerCPU": 10 ** 30}))
    assert "spec.slurmConfig.defMemPerCPU" in found
    assert load_cluster(minimal(slurmConfig={"defMemPerCPU": 2 ** 53 - 1}))
    for field in ("maxTime",):
        found = errors_of(minimal(partitions=[{"name": "p", field: "999999999-00"}]))
        assert "Slurm holds at most" in found[f"spec.partitions[0].{field}"]
    found = errors_of(minimal(accounting={"enabled": True, "qos": [{"name": "q", "maxWall": "35791395"}]}))
    assert "spec.accounting.qos[0].maxWall" in found


@pytest.mark.parametrize("text,seconds", [("60", 3600), ("1:30", 90), ("4:00:00", 14400), ("2-00", 172800),
                                          ("2-01:30", 178200), ("2-01:30:05", 178205), ("UNLIMITED", None)])
def test_durations_are_read_as_slurm_reads_them(text, seconds):
    assert duration_seconds(text) == seconds
    limit = SLURM_DURATION_MAX_SECONDS
    assert duration_seconds(str(limit // 60)) <= limit < duration_seconds(str(limit // 60 + 1))


@pytest.mark.parametrize("where", ["accounts", "qos", "user"])
@pytest.mark.parametrize("word", ["set", "where"])
def test_sacctmgr_keywords_are_no_names(where, word):
    acct: dict = {"enabled": True}
    users = []
    if where == "user":
        users = [{"name": word, "uid": 2001, "sshPublicKeys": [KEY]}]
        path = "spec.login.users[0].name"
    else:
        acct[where] = [{"name": word}]
        path = f"spec.accounting.{where}[0].name"
    found = errors_of(minimal(accounting=acct, login={"users": users}))
    assert "sacctmgr keyword" in found[path]


def test_a_failing_sacctmgr_command_does_not_skip_the_later_ones():
    ran: list[list[str]] = []

    def runner(argv, stdin):
        ran.append(argv)
        bad = "broken" in argv
        return subprocess.CompletedProcess(argv, 1 if bad else 0, "", "sacctmgr: error: nope" if bad else "")

    want = Associations(cluster="c1", accounts=("broken", "ml"), users=(("alice", "ml"),),
                        qos=(QosLimits("short", 10, 1, None, None),))
    with pytest.raises(SlurmError) as info:
        SlurmClient(runner).apply_accounting(want)
    writes = [a for a in ran if "-n" not in a]
    assert any("broken" in a for a in writes)
    assert any(a[3:5] == ["account", "ml"] for a in writes) and any(a[3:5] == ["user", "alice"] for a in writes)
    assert f"1 of {len(writes)} sacctmgr commands failed" in str(info.value)


PASSWORDS = ["s3cr3t", "a b", "pw StorageHost=evil", "pw\tX=1", "a#b", 'a"b', "a'b", "a\\b", "a=b", "x" * 256,
             "x" * 257, "pässword", "", "!$%&()*+,./:;<=>?@[]^_`{|}~-", "a\x7fb"]


@pytest.mark.parametrize("password", PASSWORDS)
def test_the_slurmdbd_entrypoint_and_the_operator_agree_on_database_passwords(password):
    text = (ROOT / "images/slurmdbd/entrypoint.sh").read_text()
    fn = re.search(r"^sk_db_password_ok\(\) \{.*?^\}", text, re.S | re.M).group(0)
    shell = subprocess.run(["bash", "-c", fn + '\nsk_db_password_ok "$1"', "_", password],
                           capture_output=True, timeout=10).returncode == 0
    assert shell == bool(re.fullmatch(DB_PASSWORD_RE, password))
    c = load_cluster(minimal(accounting=external()))
    ref = next(r for r in secret_refs(c) if r.use == DATABASE_PASSWORD)
    secret = {"metadata": {"labels": {SECRET_USE_LABEL: DATABASE_PASSWORD},
                           "annotations": {ALLOWED_HOSTS_ANNOTATION: "db.example.com"}},
              "data": {"pw": base64.b64encode(password.encode()).decode()}}
    problem = secret_problem(ref, secret)
    assert (problem is None) == shell
    if problem is not None:
        assert password not in problem or password == ""  # never quoted back
