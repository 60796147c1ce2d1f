"""Accounting without daemons: the spec, what it renders, the association
plan (sacctmgr commands) and the operator's decisions. The daemons run in
tests/test_accounting_images.py."""

from __future__ import annotations

import copy
import os
import resource
import subprocess
import time

import pytest

from slurmk8s.api import InvalidSpec, load_cluster
from slurmk8s.operator import accounting as acct
from slurmk8s.operator.status import compute
from slurmk8s.render import ClusterKeys, names, render
from slurmk8s.render.keys import keys_from_secrets
from slurmk8s.slurm import SlurmClient
from slurmk8s.slurm.accounting import Associations, QosLimits, State, commands, minutes, parse_state, with_members
from slurmk8s.slurm.client import LocalRunner

UID = "c0ffee00-0000-4000-8000-000000000002"


def with_accounting(doc, **accounting):
    doc = copy.deepcopy(doc)
    doc["metadata"]["uid"] = UID
    doc["spec"]["login"]["users"].append({"name": "alice", "uid": 2002, "sshPublicKeysFrom": {
        "name": "alice-ssh", "key": "authorized_keys"}})
    doc["spec"]["accounting"] = {"enabled": True, **accounting}
    return doc


def by_name(objs):
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


def slurm_conf(objs):
    return by_name(objs)[("ConfigMap", "demo-slurm-config")]["data"]["slurm.conf"]


def test_accounting_is_off_by_default_and_renders_nothing(doc):
    doc = copy.deepcopy(doc)
    doc["spec"].pop("accounting", None)
    objs = render(load_cluster(doc), ClusterKeys.generate())
    assert not [o for o in objs if "slurmdbd" in o["metadata"]["name"] or "mariadb" in o["metadata"]["name"]]
    assert "Accounting" not in slurm_conf(objs) and "PriorityType" not in slurm_conf(objs)


def test_managed_accounting_renders_slurmdbd_mariadb_and_a_generated_password(doc):
    c = load_cluster(with_accounting(doc, enforce=["associations", "qos"], fairShare={"weightAge": 5}))
    keys = ClusterKeys.generate()
    objs = render(c, keys)
    o = by_name(objs)
    conf = slurm_conf(objs)
    assert "AccountingStorageType=accounting_storage/slurmdbd\n" in conf
    assert f"AccountingStorageHost={names.slurmdbd_fqdn(c)}\n" in conf
    assert "AccountingStorageEnforce=associations,qos\n" in conf
    assert "PriorityType=priority/multifactor\n" in conf and "PriorityWeightAge=5\n" in conf
    dbd_conf = o[("ConfigMap", "demo-slurmdbd-config")]["data"]["slurmdbd.conf"]
    assert f"StorageHost={names.database_fqdn(c)}\n" in dbd_conf and "StoragePass=" not in dbd_conf
    # The password is in its create-only Secret and in no ConfigMap.
    secret = o[("Secret", "demo-db-password")]
    assert secret["metadata"]["annotations"][names.CREATE_ONLY] == "true"
    assert keys.db_password and len(keys.db_password) == 48
    for obj in objs:
        if obj["kind"] == "ConfigMap":
            assert keys.db_password.decode() not in str(obj), obj["metadata"]["name"]
    # slurmdbd and MariaDB come before slurmctld in apply order, each behind a Service, with probes.
    order = [k for k in o]
    assert order.index(("Deployment", "demo-slurmdbd")) < order.index(("StatefulSet", "demo-controller"))
    assert order.index(("StatefulSet", "demo-mariadb")) < order.index(("Deployment", "demo-slurmdbd"))
    dbd = o[("Deployment", "demo-slurmdbd")]
    assert dbd["spec"]["strategy"] == {"type": "Recreate"} and dbd["spec"]["replicas"] == 1
    [ctr] = dbd["spec"]["template"]["spec"]["containers"]
    assert ctr["image"] == "ghcr.io/slurmk8s/slurmdbd:26.05" and "readinessProbe" in ctr
    assert {v["name"]: v for v in dbd["spec"]["template"]["spec"]["volumes"]}["db-password"]["secret"][
        "secretName"] == "demo-db-password"
    db = o[("StatefulSet", "demo-mariadb")]
    [ctr] = db["spec"]["template"]["spec"]["containers"]
    assert ctr["image"] == "ghcr.io/slurmk8s/mariadb:26.05"
    assert ctr["readinessProbe"]["exec"]["command"][-1] == "ready"
    assert db["spec"]["volumeClaimTemplates"][0]["metadata"]["labels"][names.CLUSTER_LABEL] == "demo"
    assert o[("Service", "demo-slurmdbd")]["spec"]["ports"][0]["port"] == names.SLURMDBD_PORT


@pytest.mark.parametrize("resources, mib", [
    ({}, 2048),  # the default: a 4Gi limit
    ({"limits": {"memory": "8Gi"}}, 4096),
    ({"requests": {"memory": "3G"}, "limits": {}}, 2048),  # no limit: the default limit, 4Gi
    ({"requests": {"memory": "6Gi"}, "limits": {}}, 3072),  # no limit and above the default: the request
    ({"requests": {}, "limits": {"memory": "40Mi"}}, 32),
])
def test_the_buffer_pool_is_half_the_mariadb_containers_memory(doc, resources, mib):
    managed = {"resources": resources} if resources else {}
    c = load_cluster(with_accounting(doc, database={"managed": managed}))
    [db] = [o for o in render(c, ClusterKeys.generate()) if o["metadata"]["name"] == "demo-mariadb"
            and o["kind"] == "StatefulSet"]
    env = {e["name"]: e["value"] for e in db["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["SLURMK8S_DB_BUFFER_POOL_MIB"] == str(mib)


def test_slurmdbd_may_reach_an_external_databases_port_at_its_address_alone(doc):
    """Issue 41, item 8's class: with egress rules, a database on port 443 must not open 443
    to the world. The rule names the database's IPv4 address, or the blocks a named
    host's servers are in, which the spec must then give."""

    def egress(external: dict) -> list[dict]:
        d = with_accounting(doc, database={"external": {"passwordSecret": {"name": "acct-db", "key": "pw"},
                                                         **external}})
        d["spec"].setdefault("network", {})["egress"] = True
        policies = {o["metadata"]["name"]: o["spec"]["egress"] for o in render(load_cluster(d), ClusterKeys.generate())
                    if o["kind"] == "NetworkPolicy"}
        return policies["demo-slurmdbd"]

    assert {"ports": [{"protocol": "TCP", "port": 443}], "to": [{"ipBlock": {"cidr": "198.51.100.20/32"}}]} \
        in egress({"host": "198.51.100.20", "port": 443})
    named = egress({"host": "db.example.org", "egressCidrs": ["192.0.2.0/28"]})
    assert {"ports": [{"protocol": "TCP", "port": 3306}], "to": [{"ipBlock": {"cidr": "192.0.2.0/28"}}]} in named
    # No rule but DNS's opens a port to any address.
    dns = [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
    assert all("to" in r for r in named if r.get("ports") != dns)
    d = with_accounting(doc, database={"external": {"host": "db.example.org",
                                                    "passwordSecret": {"name": "acct-db", "key": "pw"}}})
    d["spec"].setdefault("network", {})["egress"] = True
    with pytest.raises(InvalidSpec) as refused:
        load_cluster(d)
    assert "is a name" in str(refused.value) and "spec.accounting.database.external.egressCidrs" in str(refused.value)
    d["spec"]["network"]["egress"] = False
    assert load_cluster(d)


@pytest.mark.parametrize("policy", ["Retain", "Delete"])
def test_the_database_claim_follows_the_deletion_policy(doc, policy):
    d = with_accounting(doc)
    d["spec"]["deletionPolicy"] = policy
    db = by_name(render(load_cluster(d), ClusterKeys.generate()))[("StatefulSet", "demo-mariadb")]
    assert db["spec"]["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == policy


def test_external_database_renders_no_mariadb_and_mounts_the_sites_secret(doc):
    d = with_accounting(doc, database={"external": {
        "host": "mariadb.db.svc", "port": 3307, "database": "acct", "user": "slurm_demo",
        "passwordSecret": {"name": "acct-db", "key": "pw"}}})
    c = load_cluster(d)
    objs = render(c, ClusterKeys.generate())
    o = by_name(objs)
    assert ("StatefulSet", "demo-mariadb") not in o and ("Secret", "demo-db-password") not in o
    dbd_conf = o[("ConfigMap", "demo-slurmdbd-config")]["data"]["slurmdbd.conf"]
    for line in ("StorageHost=mariadb.db.svc", "StoragePort=3307", "StorageLoc=acct", "StorageUser=slurm_demo"):
        assert line + "\n" in dbd_conf
    vols = {v["name"]: v for v in o[("Deployment", "demo-slurmdbd")]["spec"]["template"]["spec"]["volumes"]}
    assert vols["db-password"]["secret"] == {"secretName": "acct-db", "defaultMode": 0o400,
                                             "items": [{"key": "pw", "path": "password"}]}
    # No password is generated for an external database.
    keys, missing = keys_from_secrets(c, {}, ClusterKeys.generate())
    assert keys.db_password == b"" and "demo-db-password" not in missing


@pytest.mark.parametrize("change,path,reason", [
    ({"database": {"managed": {}, "external": {"host": "h", "passwordSecret": {"name": "s", "key": "k"}}}},
     "spec.accounting.database", "not both"),
    ({"accounts": [{"name": "ml", "users": ["bob"]}]}, "spec.accounting.accounts[0].users[0]", "not in spec.login.users"),
    ({"accounts": [{"name": "ml"}, {"name": "ml"}]}, "spec.accounting.accounts", "ml"),
    ({"accounts": [{"name": "ML"}]}, "spec.accounting.accounts[0].name", "lower-case"),
    ({"accounts": [{"name": "root"}]}, "spec.accounting.accounts[0].name", "Slurm's own"),
    ({"enforce": ["associations", "bogus"]}, "spec.accounting.enforce[1]", ""),
    ({"enforce": ["qos", "qos"]}, "spec.accounting.enforce[1]", "twice"),
    ({"qos": [{"name": "short", "maxWall": "soon"}]}, "spec.accounting.qos[0].maxWall", "Slurm time"),
    ({"database": {"external": {"host": "h;drop", "passwordSecret": {"name": "s", "key": "k"}}}},
     "spec.accounting.database.external.host", ""),
])
def test_bad_accounting_specs_are_refused_with_the_field_path(doc, change, path, reason):
    with pytest.raises(InvalidSpec) as err:
        load_cluster(with_accounting(doc, **change))
    assert path in str(err.value) and reason in str(err.value), str(err.value)


def test_fair_share_needs_accounting_and_its_keys_are_not_extra_lines(doc):
    d = copy.deepcopy(doc)
    d["spec"]["accounting"] = {"fairShare": {}}
    with pytest.raises(InvalidSpec, match="spec.accounting.fairShare"):
        load_cluster(d)
    d = with_accounting(doc)
    d["spec"]["slurmConfig"]["extraLines"] = ["PriorityWeightFairshare=5"]
    with pytest.raises(InvalidSpec, match="spec.accounting.fairShare.weightFairshare"):
        load_cluster(d)


def test_login_users_get_a_default_account_from_the_accounts_or_their_own(doc):
    c = load_cluster(with_accounting(doc, accounts=[{"name": "ml", "users": ["alice"]}],
                                     qos=[{"name": "short", "maxWall": "1:00:00", "maxJobsPerUser": 2}]))
    want = acct.wanted(c)
    assert want.users == (("researcher", "researcher"), ("alice", "ml"))
    assert set(want.accounts) == {"ml", "researcher"}
    assert want.qos == (QosLimits("short", 0, 60, 2, None),)
    # The agent receives it as JSON and reads back the same.
    assert Associations.from_json(want.to_json()) == want


@pytest.mark.parametrize("bad", [
    {"cluster": "demo", "accounts": ["a b"]},
    {"cluster": "demo", "accounts": ["a"], "users": [["x;reboot", "a"]]},
    {"cluster": "demo", "users": [["x", "nope"]]},
    {"cluster": "demo", "qos": [{"name": "q", "max_wall": "1; drop"}]},
    {"cluster": "Demo where"},
])
def test_the_agent_refuses_associations_with_names_sacctmgr_would_misread(bad):
    with pytest.raises(ValueError):
        Associations.from_json(bad)


def _apply(state: State, argv: list[str]) -> None:
    """What sacctmgr does with each command :func:`commands` makes (a model of slurmdbd)."""
    words = argv[2:]
    kv = dict(w.split("=", 1) for w in words if "=" in w and not w.startswith("qos+="))
    if words[:2] == ["add", "cluster"]:
        state.clusters.add(words[2])
    elif words[:2] == ["add", "account"]:
        state.accounts.add(words[2])
    elif words[:2] == ["add", "qos"]:
        state.qos[words[2]] = QosLimits(words[2])
    elif words[:2] == ["modify", "qos"]:
        name = kv["name"]
        def limit(k):
            return None if kv[k] == "-1" else int(kv[k])
        state.qos[name] = QosLimits(name, int(kv["Priority"]), limit("MaxWall"), limit("MaxJobsPerUser"),
                                    limit("MaxSubmitJobsPerUser"))
    elif words[:2] == ["add", "user"]:
        new = not any(u == words[2] for u, _ in state.associations)
        assert new == ("defaultaccount" in kv), argv  # a default is set by add only for a new user
        state.associations[(words[2], kv["account"])] = set(kv["qos"].split(","))
        if new:
            state.default_account[words[2]] = kv["defaultaccount"]
    elif words[:2] == ["modify", "user"] and "defaultaccount" in kv:
        state.default_account[kv["name"]] = kv["defaultaccount"]
    elif words[:2] == ["modify", "user"] and "maxsubmitjobs" in kv:
        pair = (kv["name"], kv["account"])
        assert pair in state.associations, argv
        (state.closed.add if kv["maxsubmitjobs"] == "0" else state.closed.discard)(pair)
    elif words[:2] == ["modify", "user"]:
        added = next(w for w in words if w.startswith("qos+=")).split("=", 1)[1].split(",")
        state.associations[(kv["name"], kv["account"])] |= set(added)
    else:  # pragma: no cover
        raise AssertionError(argv)


def test_commands_add_what_is_missing_and_applying_them_leaves_nothing_to_do(doc):
    c = load_cluster(with_accounting(doc, accounts=[{"name": "ml", "users": ["alice"]}],
                                     qos=[{"name": "short", "maxWall": "10"}]))
    want = acct.wanted(c)
    state = parse_state({"clusters": "", "associations": "root||normal\nroot|root|normal\n",
                         "users": "root|root\n", "qos": "normal|0||||\n"})
    first = commands(want, state)
    assert ["sacctmgr", "-i", "add", "cluster", "demo"] in first
    assert ["sacctmgr", "-i", "add", "user", "alice", "account=ml", "cluster=demo", "defaultaccount=ml",
            "qos=normal,short"] in first
    assert all(cmd[:2] == ["sacctmgr", "-i"] and cmd[2] in ("add", "modify") for cmd in first)
    for argv in first:
        _apply(state, argv)
    assert commands(want, state) == []
    # A user dropped from the spec keeps the association (and so the history): nothing is removed.
    doc2 = with_accounting(doc, qos=[{"name": "short", "maxWall": "20"}])
    doc2["spec"]["login"]["users"] = doc2["spec"]["login"]["users"][:1]
    again = commands(acct.wanted(load_cluster(doc2)), state)
    assert again == [["sacctmgr", "-i", "modify", "qos", "where", "name=short", "set", "Priority=0", "MaxWall=20",
                      "MaxJobsPerUser=-1", "MaxSubmitJobsPerUser=-1"]]


def test_parse_state_reads_sacctmgrs_parsable_output():
    s = parse_state({"clusters": "demo\n", "associations": "ml||normal|\nml|alice|normal,short|\nml|bob|normal|0\n",
                     "users": "alice|ml\n", "qos": "normal|0||||\nshort|10|01:00:00|2|\n"})
    assert s.clusters == {"demo"} and s.accounts == {"ml"}
    assert s.associations == {("alice", "ml"): {"normal", "short"}, ("bob", "ml"): {"normal"}}
    assert s.closed == {("bob", "ml")}
    assert s.qos["short"] == QosLimits("short", 10, 60, 2, None)


@pytest.mark.parametrize("text,expected", [
    ("10", 10), ("01:00:00", 60), ("1-00:00:00", 1440), ("2-03", 2 * 1440 + 180), ("00:30", 1),
    ("UNLIMITED", None), ("", None), ("1:30:00", 90),
])
def test_minutes_reads_slurm_times(text, expected):
    assert minutes(text) == expected


def test_accounting_ready_waits_for_the_database_slurmdbd_and_associations(doc):
    c = load_cluster(with_accounting(doc))
    db = {"kind": "StatefulSet", "metadata": {"name": "demo-mariadb"}, "status": {"readyReplicas": 1}}
    dbd = {"kind": "Deployment", "metadata": {"name": "demo-slurmdbd"}, "status": {"readyReplicas": 1}}
    assert acct.condition(c, [], None)[1] == "DatabaseNotReady"
    assert acct.condition(c, [db], None)[1] == "SlurmdbdNotReady"
    assert acct.condition(c, [db, dbd], None)[1] == "AssociationsPending"
    assert acct.condition(c, [db, dbd], False, "boom") == ("False", "AssociationsFailed", "sacctmgr failed: boom")
    assert acct.condition(c, [db, dbd], True)[0] == "True"
    # Ready waits for it.
    st = compute(c, None, observed=[], nodes=None, applied_hash="h", rendered_hash="h", now="2026-01-01T00:00:00Z",
                 accounting=acct.condition(c, [db], None))
    ready = next(x for x in st.conditions if x.type == "Ready")
    assert ready.status == "False"
    assert next(x for x in st.conditions if x.type == "AccountingReady").reason == "SlurmdbdNotReady"


def _directory(doc, **accounting):
    doc = with_accounting(doc, **accounting)
    doc["spec"]["identity"] = {"ldap": {
        "uris": ["ldaps://ldap.example.org"], "userSearchBase": "ou=people,dc=example,dc=org",
        "groupSearchBase": "ou=groups,dc=example,dc=org", "loginGroups": ["physics", "chemistry"],
        "minId": 5000, "egressCidrs": ["192.0.2.0/24"]}}
    doc["spec"].setdefault("network", {})["egress"] = True
    return doc


def _converge(want, state, members, users):
    """Rounds of the agent until nothing is left to do; the commands of each."""
    rounds = []
    for _ in range(3):
        full, managed = with_members(want, members, users)
        todo = commands(full, state, managed)
        if not todo:
            return rounds
        for argv in todo:
            _apply(state, argv)
        rounds.append(todo)
    raise AssertionError(f"no fixed point: {rounds}")


def test_accounts_follow_directory_groups_and_a_member_who_leaves_is_closed_not_removed(doc):
    c = load_cluster(_directory(doc, accounts=[{"name": "ml", "users": ["alice"]},
                                              {"name": "physics", "groups": ["physics"]},
                                              {"name": "chemistry", "groups": ["chemistry", "labs"]}]))
    want = acct.wanted(c)
    assert dict(want.groups) == {"physics": ("physics",), "chemistry": ("chemistry", "labs")}
    assert Associations.from_json(want.to_json()) == want  # as the agent receives it
    state = parse_state({"clusters": "demo\n", "associations": "", "users": "", "qos": "normal|0||||\n"})
    members = {"physics": ["bob", "dan", "ghost"], "chemistry": ["carol"], "labs": ["bob"]}
    users = {"bob", "carol", "dan"}  # ghost is listed in the group but is no user the directory has
    _converge(want, state, members, users)
    assert {p for p in state.associations if p[1] in ("physics", "chemistry")} == {
        ("bob", "physics"), ("dan", "physics"), ("bob", "chemistry"), ("carol", "chemistry")}
    assert state.default_account["bob"] == "physics"  # his first account, in the spec's order
    assert state.closed == set()
    # bob moves from physics to chemistry: a new default; physics closed to him, his history kept.
    members = {"physics": ["dan"], "chemistry": ["carol", "bob"], "labs": []}
    rounds = _converge(want, state, members, users)
    assert ["sacctmgr", "-i", "modify", "user", "where", "name=bob", "account=physics", "cluster=demo", "set",
            "maxsubmitjobs=0"] in rounds[0]
    assert state.default_account["bob"] == "chemistry" and ("bob", "physics") in state.associations
    assert state.closed == {("bob", "physics")}
    # The directory away and a group unreadable: nothing in its account is closed.
    _converge(want, state, {"physics": [], "chemistry": None, "labs": []}, set())
    assert state.closed == {("bob", "physics"), ("dan", "physics")}
    # bob back in physics: opened again. An association a site added by hand to ml stays open.
    state.associations[("erin", "ml")] = {"normal"}
    _converge(want, state, {"physics": ["bob", "dan"], "chemistry": ["carol"], "labs": []}, users)
    assert state.closed == {("bob", "chemistry")} and ("erin", "ml") not in state.closed


def test_groups_need_the_directory_and_enforced_limits(doc):
    bad = with_accounting(doc, accounts=[{"name": "physics", "groups": ["physics"]}])
    with pytest.raises(InvalidSpec) as e:
        load_cluster(bad)
    assert "spec.accounting.accounts[0].groups[0]" in str(e.value) and "spec.identity.ldap" in str(e.value)
    loose = _directory(doc, accounts=[{"name": "physics", "groups": ["physics", "physics"]}], enforce=["associations"])
    with pytest.raises(InvalidSpec) as e:
        load_cluster(loose)
    paths = {err.path: err.message for err in e.value.errors}
    assert "listed twice" in paths["spec.accounting.accounts[0].groups[1]"]
    assert "limits" in paths["spec.accounting.accounts[0].groups"]
    with pytest.raises(InvalidSpec, match="system group"):
        load_cluster(_directory(doc, accounts=[{"name": "physics", "groups": ["sudo"]}]))


def test_the_agent_reads_the_directorys_members_and_keeps_those_nss_resolves(tmp_path):
    """The members as the sssd container listed them from the directory; a group absent from
    the list, or a list gone old, is unknown; only members getent resolves become users."""
    listing = tmp_path / "groups"
    listing.write_text("physics:bob,ghost\nempty:\nBad Line\n")
    passwd = {"bob": "bob:*:5002:5000::/home/bob:/bin/bash"}
    calls = []

    def runner(argv, stdin):
        calls.append(argv)
        assert argv[:3] == ["getent", "passwd", "--"]
        lines = [passwd[k] for k in argv[3:] if k in passwd]
        return subprocess.CompletedProcess(argv, 0 if len(lines) == len(argv) - 3 else 2, "\n".join(lines), "")

    client = SlurmClient(runner, directory_groups=str(listing))
    members, users = client.group_members(["empty", "missing", "physics"])
    assert members == {"empty": [], "missing": None, "physics": ["bob", "ghost"]} and users == {"bob"}
    assert calls == [["getent", "passwd", "--", "bob", "ghost"]]
    old = time.time() - 120
    os.utime(listing, (old, old))
    assert client.group_members(["physics"]) == ({"physics": None}, set())


def test_hostile_members_neither_stop_the_associations_nor_freeze_their_group(tmp_path):
    """Real getent: a member '-x' was read as getent's option and stopped every new association;
    a group of many members overflowed getent's argv (E2BIG) and failed apply_accounting for
    everyone; a member with a space froze its group. Each is now left out alone."""
    listing = tmp_path / "groups"
    # 20,000 names, some 300 KB: past ARG_MAX at once under a 512 KiB stack limit (ARG_MAX is a
    # quarter of it, 128 KiB at least), as 200,000 are under the usual 8 MiB.
    many = [f"nosuch{i:07d}" for i in range(20_000)]
    listing.write_text(f"physics:-x,root,bob smith,{','.join(many)}\nlabs:--help,root\n")

    class SmallStack(LocalRunner):
        def __call__(self, argv, stdin=None):
            def limit():
                resource.setrlimit(resource.RLIMIT_STACK, (512 * 1024, 512 * 1024))
            return subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=self.timeout,
                                  preexec_fn=limit)

    client = SlurmClient(SmallStack(), directory_groups=str(listing))
    members, users = client.group_members(["labs", "physics"])
    assert members["physics"][:1] == ["root"] and len(members["physics"]) == 1 + len(many)
    assert members["labs"] == ["root"] and users == {"root"}  # every batch was asked, and answered


def test_members_named_like_login_users_or_system_accounts_get_no_account_from_the_directory(doc):
    """login.users win over the directory: its member 'alice' is not the login user alice."""
    c = load_cluster(_directory(doc, accounts=[{"name": "physics", "groups": ["physics"]}]))
    want = acct.wanted(c)
    login = want.users[0][0]
    state = parse_state({"clusters": "demo\n", "associations": f"physics|{login}|normal|\n", "users": "",
                         "qos": "normal|0||||\n"})
    _converge(want, state, {"physics": [login, "root", "slurm", "bob"]}, {login, "root", "slurm", "bob"})
    assert {u for u, a in state.associations if a == "physics"} == {login, "bob"}
    assert state.closed == {(login, "physics")}  # the login user's old association there: closed
