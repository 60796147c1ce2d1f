"""spec.identity.ldap: what is refused (with its field path), the sssd.conf it renders, the
sssd container beside the Slurm containers, the Secrets and ConfigMaps it may name, and the
way out to the directory. Pure."""

from __future__ import annotations

import base64
import copy
import os
import re
import subprocess

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmk8s.api.errors import InvalidSpec
from slurmk8s.api.fields import PERSON_ID_MIN, POSIX_NAME_RE, SYSTEM_ID_BLOCK
from slurmk8s.api.identity import LdapSpec, parse_filter
from slurmk8s.api.secrets import SecretRef, secret_problem, secret_refs
from slurmk8s.api.validate import load_cluster
from slurmk8s.render import names
from slurmk8s.render.config import PROLOG, sssd_conf
from slurmk8s.render.identity import PIPES_DIR
from slurmk8s.render.keys import ClusterKeys
from slurmk8s.render.manifests import lent_slurmd_pod, render
from slurmk8s.slurm.directory import GROUPS_FILE, VERDICT_FILE

from .conftest import EXAMPLE, ROOT
from .reach import reached, reaches

LDAP = {"uris": ["ldaps://ldap.example.org"], "userSearchBase": "ou=people,dc=example,dc=org",
        "groupSearchBase": "ou=groups,dc=example,dc=org", "bindDn": "cn=reader,dc=example,dc=org",
        "bindPasswordSecret": {"name": "ldap-bind", "key": "password"},
        "ca": {"configMap": {"name": "ldap-ca", "key": "ca.crt"}}, "loginGroups": ["physics"],
        # Above the example's login user (uid 2001); the way out to the directory's servers.
        "minId": 5000, "egressCidrs": ["192.0.2.0/24"]}


def cluster(**ldap):
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["identity"] = {"ldap": {**copy.deepcopy(LDAP), **ldap}}
    doc["spec"].setdefault("network", {})["egress"] = True
    return doc


def errors(doc) -> dict[str, str]:
    with pytest.raises(InvalidSpec) as e:
        load_cluster(doc)
    return {err.path: err.message for err in e.value.errors}


@pytest.mark.parametrize("text", [
    "(objectClass=posixAccount)", "(&(objectClass=posixAccount)(!(uid=svc-*)))",
    "(|(memberOf=cn=physics,ou=groups,dc=example,dc=org)(uid=alice))", "(uidNumber>=1000)", "(cn~=smith)",
    "(uid=*)",
])
def test_ldap_filters_of_the_grammar_are_accepted(text):
    parse_filter(text)


@pytest.mark.parametrize("text, where", [
    ("objectClass=posixAccount", "needs '('"), ("(uid=a)(uid=b)", "after the filter's closing"),
    ("(uid=a\\29)", "needs ')'"), ("(&)", "empty '&'"), ("(uid=a", "needs ')'"), ("(=a)", "attribute name"),
    ("(uid=a)\n[domain/x]", "after the filter's closing"), ("(&" * 9 + "(uid=a)" + ")" * 9, "nests deeper"),
    ("(uid)", "needs '='"),
])
def test_ldap_filters_outside_the_grammar_are_refused_saying_where(text, where):
    with pytest.raises(ValueError, match=re.escape(where)):
        parse_filter(text)


#: RFC 4515 over the alphabet parse_filter allows: attribute names, the four match
#: operators, assertion values (a DN's characters, '=', ',', '*' and ':').
_VALUE_CHARACTERS = "abcAZ09 _.@,=*:-"
_FILTER_ATTRIBUTES = st.one_of(st.sampled_from(["uid", "cn", "objectClass", "memberOf", "uidNumber"]),
                               st.builds(str.__add__, st.sampled_from("aZx"), st.text("bY7-", max_size=6)))
_FILTER_VALUES = st.text(alphabet=_VALUE_CHARACTERS, min_size=1, max_size=12)


def ldap_filters(depth: int = 0) -> st.SearchStrategy[str]:
    """Filters of the grammar, up to five deep (parse_filter allows eight)."""
    item = st.builds(lambda a, op, v: f"({a}{op}{v})", _FILTER_ATTRIBUTES, st.sampled_from(["=", "~=", ">=", "<="]),
                     _FILTER_VALUES)
    if depth >= 3:
        return item
    inner = st.deferred(lambda: ldap_filters(depth + 1))
    return st.one_of(item, item,
                     st.builds(lambda op, fs: f"({op}{''.join(fs)})", st.sampled_from("&|"),
                               st.lists(inner, min_size=1, max_size=3)),
                     inner.map(lambda f: f"(!{f})"))


#: What an edit puts in: the grammar's own characters (those of values most, which keep
#: many filters in the grammar), and what would break the file a filter is written to.
_EDIT_CHARACTERS = st.one_of(st.sampled_from(_VALUE_CHARACTERS), st.sampled_from(_VALUE_CHARACTERS),
                             st.sampled_from("()&|!~<>"),
                             st.sampled_from(["\n", "\\", "\r", "\x00", "\t", "é", ")\n("]))


@st.composite
def edited_ldap_filters(draw) -> str:
    """A filter of the grammar with one edit: a character put in, removed or replaced
    at the end of a value (where many edits stay in the grammar) or anywhere, or text
    after the filter's end (``(uid=a)\\n``)."""
    text = draw(ldap_filters())
    how = draw(st.sampled_from(["insert", "replace", "delete", "append"]))
    if draw(st.booleans()):
        at = draw(st.sampled_from([i for i, ch in enumerate(text) if ch == ")" and text[i - 1] != ")"]))
        at -= how in ("replace", "delete")  # the value's last character; an insert goes after it
    else:
        at = draw(st.integers(0, len(text)))
    if how == "append":
        return text + draw(st.sampled_from(["\n", "\r\n", " ", "\n[domain/x]", ")", "(uid=a)", "\x00"]))
    if how == "delete":
        return text[:at] + text[at + 1:]
    return text[:at] + draw(_EDIT_CHARACTERS) + text[at + (how == "replace"):]


@settings(max_examples=200, deadline=None)
@given(ldap_filters())
def test_every_filter_of_the_grammar_is_accepted(text):
    parse_filter(text)


@reaches(accepted=0.12, refused=0.3)
@settings(max_examples=200, deadline=None)
@given(edited_ldap_filters())
def test_whatever_the_parser_accepts_is_balanced_and_on_one_line(text):
    try:
        parse_filter(text)
    except ValueError:
        reached("refused")
        return
    reached("accepted")
    depth = 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        assert depth > 0 or i == len(text) - 1, text  # one filter, balanced, closed by its last character
    assert depth == 0, text
    assert re.fullmatch(r"[A-Za-z0-9 _.@,=*:~<>&|!()-]+", text), text  # one line, nothing sssd.conf reads


def test_every_field_a_user_writes_is_refused_with_its_path():
    found = errors(cluster(uris=["ldaps://127.0.0.1", "ftp://x"], userSearchBase="ou=people\n[sssd]",
                           groupSearchBase="ou=g,dc=x,", userFilter="(uid=a))", sshPublicKeyAttribute="ssh key",
                           loginGroups=["sudo", "Physics"], minId=999))
    assert "loopback" in found["spec.identity.ldap.uris[0]"]
    assert "ldaps://host" in found["spec.identity.ldap.uris[1]"]
    assert "newline" in found["spec.identity.ldap.userSearchBase"]
    assert "DN of attribute=value" in found["spec.identity.ldap.groupSearchBase"]
    assert "LDAP filter" in found["spec.identity.ldap.userFilter"]
    assert "LDAP attribute name" in found["spec.identity.ldap.sshPublicKeyAttribute"]
    assert "system group" in found["spec.identity.ldap.loginGroups[0]"]
    assert "lower-case" in found["spec.identity.ldap.loginGroups[1]"]
    assert "spec.identity.ldap.minId" in found


def test_plain_ldap_needs_starttls_or_saying_so_and_bind_needs_its_password():
    found = errors(cluster(uris=["ldap://ldap.example.org"], bindPasswordSecret=None))
    assert "set startTls" in found["spec.identity.ldap.uris[0]"]
    assert "together" in found["spec.identity.ldap.bindPasswordSecret"]
    assert load_cluster(cluster(uris=["ldap://ldap.example.org"], startTls=True))
    assert load_cluster(cluster(uris=["ldap://ldap.example.org"], allowPlainLdap=True))
    found = errors(cluster(startTls=True, ca={"configMap": {"name": "a", "key": "k"}, "secret": {"name": "b", "key": "k"}}))
    assert "ldap:// URIs only" in found["spec.identity.ldap.startTls"]
    assert "exactly one" in found["spec.identity.ldap.ca"]


def test_sssd_conf_has_the_directory_and_no_password():
    c = load_cluster(cluster(userFilter="(objectClass=posixAccount)", cacheSeconds=120))
    conf = sssd_conf(c)
    assert conf is not None
    lines = conf.splitlines()
    assert "ldap_uri = ldaps://ldap.example.org" in lines and "ldap_tls_reqcert = demand" in lines
    assert "ldap_user_search_base = ou=people,dc=example,dc=org?subtree?(objectClass=posixAccount)" in lines
    assert "ldap_default_bind_dn = cn=reader,dc=example,dc=org" in lines and "entry_cache_timeout = 120" in lines
    assert "memcache_timeout = 120" in lines  # glibc's reads of the memory cache age as the entries do
    assert "ldap_tls_cacert = /run/slurmk8s/ldap-ca/ca.crt" in lines
    assert "min_id = 5000" in lines and "max_id = 60000" in lines
    assert not any(ln.startswith("ldap_default_authtok =") for ln in lines)
    # The domain's section is the last: the sssd container appends the password to it.
    assert [ln for ln in lines if ln.startswith("[")][-1] == "[domain/directory]"
    assert sssd_conf(load_cluster(yaml.safe_load(EXAMPLE.read_text()))) is None


def _pod_specs(objs) -> dict[str, dict]:
    out = {}
    for o in objs:
        t = o["spec"].get("template") if o["kind"] in ("Deployment", "StatefulSet") else None
        if t is not None:
            out[o["metadata"]["name"]] = t
    return out


def test_the_sssd_container_runs_beside_login_slurmctld_and_slurmd_and_only_it_reads_the_password():
    c = load_cluster(cluster())
    objs = render(c, ClusterKeys.generate())
    specs = _pod_specs(objs)
    lent = lent_slurmd_pod(c, "h", node="gpu-1", resources={"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "8"},
                           labels={}, partition="gpu", shm_size="1Gi", taint_key="slurmk8s.dev/lent")
    specs["lent"] = lent
    with_sssd = {name for name, t in specs.items() if any(ct["name"] == "sssd" for ct in t["spec"]["containers"])}
    expected = {names.login(c), names.controller(c), "lent"} | {f"{c.name}-{ns.name}" for ns in c.spec.node_sets}
    assert with_sssd == expected
    for name in with_sssd:
        t = specs[name]
        # A worker's restart hash covers it (the operator restarts workers one at a time).
        assert {names.SSSD_HASH, names.RESTART_HASH} & set(t["metadata"]["annotations"])
        for ct in t["spec"]["containers"]:
            mounts = {m["name"]: m for m in ct["volumeMounts"]}
            if ct["name"] == "sssd":
                assert {"ldap-bind", "ldap-ca", "sssd-config", "sss-pipes", "sss-db"} <= set(mounts)
                assert ct["image"].endswith(f"/sssd:{c.spec.slurm.version}")
            else:  # the Slurm containers, and the agent (group members, the probe's verdict)
                assert mounts["sss-pipes"]["readOnly"] and mounts["sss-mc"]["readOnly"]
                assert "ldap-bind" not in mounts and "sss-db" not in mounts
        bind = next(v for v in t["spec"]["volumes"] if v["name"] == "ldap-bind")
        assert bind["secret"]["defaultMode"] == 0o400
    # Only the controller pod's sssd probes the directory, where the agent reads its verdict.
    probing = {name for name, t in specs.items() for ct in t["spec"]["containers"]
               if ct["name"] == "sssd" and any(e["name"] == "PROBE_SECONDS" for e in ct.get("env", []))}
    assert probing == {names.controller(c)}
    entrypoint = (ROOT / "images/sssd/entrypoint.sh").read_text()
    assert VERDICT_FILE == f"{PIPES_DIR}/slurmk8s-directory" and "verdict=$pipes/slurmk8s-directory" in entrypoint
    assert GROUPS_FILE == f"{PIPES_DIR}/slurmk8s-groups" and "members=$pipes/slurmk8s-groups" in entrypoint
    config = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == names.sssd_config(c))
    assert config["data"]["sssd.conf"] == sssd_conf(c)
    login = next(ct for ct in specs[names.login(c)]["spec"]["containers"] if ct["name"] == "login")
    env = {e["name"]: e["value"] for e in login["env"]}
    assert env["SLURMK8S_DIRECTORY"] == "ldap" and env["SLURMK8S_LOGIN_GROUPS"] == "physics"
    # A change of the directory rolls the pods.
    other = _pod_specs(render(load_cluster(cluster(cacheSeconds=60)), ClusterKeys.generate()))
    for name in with_sssd - {"lent"}:
        assert other[name]["metadata"]["annotations"] != specs[name]["metadata"]["annotations"], name


def test_without_a_directory_no_pod_changes():
    c = load_cluster(yaml.safe_load(EXAMPLE.read_text()))
    for t in _pod_specs(render(c, ClusterKeys.generate())).values():
        assert all(ct["name"] != "sssd" for ct in t["spec"]["containers"])
        assert names.SSSD_HASH not in t["metadata"].get("annotations", {})


def _egress(c) -> dict[str, list[dict]]:
    return {o["metadata"]["name"]: o["spec"]["egress"] for o in render(c, ClusterKeys.generate())
            if o["kind"] == "NetworkPolicy"}


def test_the_pods_that_run_sssd_may_reach_the_directorys_ports_at_its_servers_alone():
    """ldaps://x:443 must not open 443 to the world: the rule names the servers' addresses."""
    c = load_cluster(cluster(uris=["ldaps://a.example.org", "ldap://198.51.100.7:3890"], startTls=True))
    ports = [{"protocol": "TCP", "port": 636}, {"protocol": "TCP", "port": 3890}]
    policies = _egress(c)
    for component in ("controller", "workers", "login"):
        egress = policies[f"{c.name}-{component}"]
        assert {"ports": ports, "to": [{"ipBlock": {"cidr": "198.51.100.7/32"}},
                                       {"ipBlock": {"cidr": "192.0.2.0/24"}}]} in egress
    assert all(r.get("ports") != ports for r in policies[f"{c.name}-slurmdbd"])
    # No rule but DNS's opens a port to any address.
    for name, egress in policies.items():
        assert all("to" in r for r in egress if r.get("ports") != [{"protocol": "UDP", "port": 53},
                                                                 {"protocol": "TCP", "port": 53}]), name
    # A URI of an IPv4 address needs nothing more; one that names a host needs its blocks said.
    ip_only = load_cluster(cluster(uris=["ldaps://198.51.100.7:443"], egressCidrs=[]))
    assert {"ports": [{"protocol": "TCP", "port": 443}], "to": [{"ipBlock": {"cidr": "198.51.100.7/32"}}]} \
        in _egress(ip_only)[f"{c.name}-login"]
    found = errors(cluster(uris=["ldaps://x.example.org:443"], egressCidrs=[]))
    assert "names its host by name" in found["spec.identity.ldap.egressCidrs"]
    assert "not an address block" in errors(cluster(egressCidrs=["10.0.0.1/8"]))["spec.identity.ldap.egressCidrs[0]"]
    # Without egress rules there is nothing to say.
    doc = cluster(egressCidrs=[])
    doc["spec"]["network"]["egress"] = False
    assert load_cluster(doc)


def test_login_users_and_the_images_accounts_win_over_the_directory(tmp_path):
    """A directory user or group named like a login user (or a system account, or a system
    group) does not exist in the pods: sssd.conf filters them, and the sssd container tells
    sshd no keys of theirs."""
    c = load_cluster(cluster())
    user = c.spec.login.users[0].name
    conf = sssd_conf(c)
    lines = conf.splitlines()
    filtered = {k: set(next(ln for ln in lines if ln.startswith(f"{k} = ")).split(" = ")[1].split(", "))
                for k in ("filter_users", "filter_groups")}
    assert {user, "slurm", "munge", "root", "nobody"} <= filtered["filter_users"]
    assert {user, "slurm", "sudo", "users", "staff", "shadow"} <= filtered["filter_groups"]
    assert lines.index("[nss]") < lines.index(next(ln for ln in lines if ln.startswith("filter_users")))
    # The sssd container's key socket: nothing for a filtered name, without asking SSSD.
    (tmp_path / "sssd.conf").write_text(conf)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "sss_ssh_authorizedkeys"
    fake.write_text(f'#!/bin/sh\necho "$1" >>{tmp_path}/asked\necho "ssh-ed25519 AAAA $1"\n')
    fake.chmod(0o755)

    def keys_of(name: str, conf_path=tmp_path / "sssd.conf") -> str:
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SSSD_CONF": str(conf_path)}
        return subprocess.run(["bash", str(ROOT / "images/sssd/keys-of.sh")], input=f"{name}\n", text=True,
                              capture_output=True, env=env, timeout=30).stdout

    assert keys_of("bob") == "ssh-ed25519 AAAA bob\n"
    for name in (user, "slurm", "root", "-x", "bob x"):
        assert keys_of(name) == "", name
    assert keys_of("bob", tmp_path / "missing.conf") == ""  # no rendered sssd.conf: nobody
    assert (tmp_path / "asked").read_text().split() == ["bob"]


def test_sshd_never_asks_the_directory_for_the_keys_of_an_account_of_the_pods_files(tmp_path):
    """AuthorizedKeysCommand (images/login/authorized-keys.sh) for a login user or an image's
    account answers nothing and never asks the sssd container; for another name it asks."""
    asked = tmp_path / "asked"
    env = {"PATH": os.environ["PATH"], "ASKED": str(asked),
           # The pod's /etc/passwd, as sk_setup_users leaves it: the login user alice is there.
           "BASH_FUNC_getent%%": '() { if [ "$*" = "-s files passwd -- alice" ]; then '
                                 'echo "alice:x:2001:2001::/home/alice:/bin/bash"; return 0; fi; '
                                 'command getent "$@"; }',
           "BASH_FUNC_timeout%%": '() { shift; "$@"; }',
           "BASH_FUNC_nc%%": '() { cat >>"$ASKED"; echo "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAA x"; }'}
    script = str(ROOT / "images/login/authorized-keys.sh")
    for name in ("alice", "root", "slurm", "-x", "Alice"):
        proc = subprocess.run(["bash", script, name], capture_output=True, text=True, env=env, timeout=30)
        assert proc.returncode == 0 and proc.stdout == "", (name, proc.stderr)
        assert not asked.exists(), name
    subprocess.run(["bash", script, "nosuchuser"], capture_output=True, text=True, env=env, timeout=30)
    assert asked.read_text() == "nosuchuser\n"


def test_a_login_users_ids_may_not_lie_in_the_directorys_range():
    """A directory entry with a login user's uid or gid would own their files and jobs."""
    doc = cluster(minId=1000)
    doc["spec"]["login"]["users"][0]["gid"] = 2500
    found = errors(doc)
    user = doc["spec"]["login"]["users"][0]
    assert f"{user['uid']} lies in the directory's id range 1000-60000" in found["spec.login.users[0].uid"]
    assert "2500 lies in" in found["spec.login.users[0].gid"]
    assert load_cluster(cluster(minId=65536, maxId=2**31 - 2))


#: The ids an image gives an account of its own, and why one outside the system ids is safe.
OWN_IDS_OUTSIDE = {10001: "the controller and serve images' own user: it runs the operator, the bridge and "
                          "serve, in pods with no sssd; the agent, in that image beside slurmctld, runs as root"}


def _image_ids() -> dict[int, str]:
    """Every uid and gid an image or a rendered pod sets, and where."""
    found: dict[int, str] = {}
    pattern = re.compile(r"(?:--uid|--gid|-o|-g|USER|runAsUser|runAsGroup|fsGroup)[\s=:\"']+([0-9]+)(?::([0-9]+))?")
    for path in [*ROOT.glob("images/*/Dockerfile"), *ROOT.glob("images/*/*.sh"), *ROOT.glob("slurmk8s/render/*.py"),
                 ROOT / "slurmk8s/slurm/published.py"]:
        for m in pattern.finditer(path.read_text()):
            for value in m.groups():
                if value is not None and int(value) > 0:
                    found[int(value)] = str(path.relative_to(ROOT))
    return found


def test_the_directorys_id_range_holds_no_id_the_images_keep():
    """The default range was 1000-2^31-2: a directory entry with uid 64030 was SlurmUser."""
    assert LdapSpec.model_fields["max_id"].default == 60000
    low, high = SYSTEM_ID_BLOCK
    ids = _image_ids()
    assert {65534} <= set(ids)  # the scan finds what the images set
    for uid, where in ids.items():
        assert uid < PERSON_ID_MIN or low <= uid <= high or uid in OWN_IDS_OUTSIDE, (uid, where)
    for slurm_own in (64030, 65534, 65535):  # SlurmUser of Debian's packages, nobody, a 16-bit -1
        assert low <= slurm_own <= high
    conf = sssd_conf(load_cluster(cluster())).splitlines()
    assert "min_id = 5000" in conf and "max_id = 60000" in conf
    assert "images keep" in errors(cluster(maxId=2**31 - 2))["spec.identity.ldap.maxId"]
    assert "images keep" in errors(cluster(minId=60001, maxId=70000))["spec.identity.ldap.minId"]
    assert "images keep" in errors(cluster(minId=64030, maxId=64030))["spec.identity.ldap.minId"]
    high_range = sssd_conf(load_cluster(cluster(minId=65536, maxId=2**31 - 2))).splitlines()
    assert "min_id = 65536" in high_range and f"max_id = {2**31 - 2}" in high_range


def test_every_name_check_of_the_images_is_the_apis_rule():
    """One rule for user and group names: the shell scripts check the pattern api/fields.py holds."""
    shell = f"^{POSIX_NAME_RE}$"
    for script in ("images/sssd/keys-of.sh", "images/sssd/probe.sh", "images/common/slurmk8s-lib.sh"):
        text = (ROOT / script).read_text()
        checks = re.findall(r"=~ (\^\[a-z_\][^ )]*)", text)
        assert checks and all(c == shell for c in checks), (script, checks)
    assert 'sk_directory_user "$user" || exit 0' in (ROOT / "images/login/authorized-keys.sh").read_text()


def _ref(refs, path) -> SecretRef:
    return next(r for r in refs if r.path == path)


def test_the_ca_and_the_bind_password_must_be_marked_for_their_use():
    refs = secret_refs(load_cluster(cluster()))
    ca = _ref(refs, "spec.identity.ldap.ca.configMap")
    bind = _ref(refs, "spec.identity.ldap.bindPasswordSecret")
    assert ca.kind == "ConfigMap" and bind.kind == "Secret"
    cm = {"metadata": {"labels": {"slurmk8s.dev/configmap-use": "ldap-ca"}}, "data": {"ca.crt": "PEM"}}
    assert secret_problem(ca, cm) is None
    assert "not labelled slurmk8s.dev/configmap-use=ldap-ca" in secret_problem(ca, {**cm, "metadata": {}})
    assert "has no key" in secret_problem(ca, {**cm, "data": {}})
    assert "does not exist" in secret_problem(ca, None)

    def secret(value: bytes) -> dict:
        return {"type": "Opaque", "metadata": {"labels": {"slurmk8s.dev/secret-use": "ldap-bind-password"},
                                               "annotations": {"slurmk8s.dev/allowed-hosts": "ldap.example.org"}},
                "data": {"password": base64.b64encode(value).decode()}}

    assert secret_problem(bind, secret(b"s3cret#!x\n")) is None
    for bad in ("two words", "", "caf\u00e9"):
        problem = secret_problem(bind, secret(bad.encode()))
        assert problem is not None and "printable ASCII" in problem
        assert not bad or bad not in problem  # a password is never quoted back
    # A database password's label does not do for a bind password.
    wrong = secret(b"x")
    wrong["metadata"]["labels"]["slurmk8s.dev/secret-use"] = "database-password"
    assert "not labelled slurmk8s.dev/secret-use=ldap-bind-password" in secret_problem(bind, wrong)


def test_the_bind_password_goes_only_to_the_hosts_its_secret_names():
    """A labelled bind password went to whatever host a SlurmCluster's editor named (a public CA
    verifies theirs, and ca is optional). Its Secret now lists the hosts it may go to."""
    c = load_cluster(cluster(uris=["ldaps://ldap.example.org", "ldaps://198.51.100.7:636"]))
    bind = _ref(secret_refs(c), "spec.identity.ldap.bindPasswordSecret")
    assert bind.hosts == ("ldap.example.org", "198.51.100.7")

    def secret(annotations: dict) -> dict:
        return {"type": "Opaque", "metadata": {"labels": {"slurmk8s.dev/secret-use": "ldap-bind-password"},
                                               "annotations": annotations},
                "data": {"password": base64.b64encode(b"pw").decode()}}

    assert secret_problem(bind, secret({"slurmk8s.dev/allowed-hosts": "ldap.example.org, 198.51.100.7"})) is None
    for wrong in ({}, {"slurmk8s.dev/allowed-hosts": "ldap.example.org"},
                  {"slurmk8s.dev/allowed-hosts": "ldap.example.org.evil.org,198.51.100.70"}):
        problem = secret_problem(bind, secret(wrong))
        assert problem is not None and problem.startswith("spec.identity.ldap.bindPasswordSecret: ")
        assert '"198.51.100.7"' in problem and "kubectl annotate secret ldap-bind slurmk8s.dev/allowed-hosts=" in problem
    # The CA is sent nowhere: it needs no hosts.
    assert _ref(secret_refs(c), "spec.identity.ldap.ca.configMap").hosts == ()


def test_with_a_directory_each_job_node_looks_its_user_up_and_the_followed_groups_roll_nothing():
    doc = cluster()
    doc["spec"]["accounting"]["accounts"] += [{"name": "physics", "groups": ["physics", "labs"]}]
    c = load_cluster(doc)
    keys = ClusterKeys.generate()
    objs = render(c, keys)
    conf = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == names.slurm_config(c))
    assert f"Prolog={PROLOG}" in conf["data"]["slurm.conf"].splitlines()
    assert (ROOT / "images/slurmd/prolog.sh").exists()
    plain = render(load_cluster(yaml.safe_load(EXAMPLE.read_text())), ClusterKeys.generate())
    assert not any(ln.startswith("Prolog=") for o in plain if o["kind"] == "ConfigMap"
                   for ln in o["data"].get("slurm.conf", "").splitlines())
    sssd = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == names.sssd_config(c))
    assert sssd["data"]["groups"].split() == ["labs", "physics"]
    # Another group followed: the list changes, no pod template does (the probe reads it each time).
    doc["spec"]["accounting"]["accounts"][-1]["groups"].append("optics")
    other = render(load_cluster(doc), keys)
    assert _pod_specs(other) == _pod_specs(objs)
