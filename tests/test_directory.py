"""The site directory's health: the sssd container's verdict file as the agent reads it, the
agent's route, and the DirectoryReady condition and Events the operator makes of it. The probe
itself runs against a real slapd in the sandbox (tests/e2e/test_sandbox_e2e.py)."""

from __future__ import annotations

import os
import re
import subprocess
import time

import pytest
import yaml

from slurmk8s.api import load_cluster
from slurmk8s.api.status import Condition
from slurmk8s.operator import directory
from slurmk8s.operator.status import compute
from slurmk8s.render.keys import ClusterKeys
from slurmk8s.slurm import RemoteSlurm, SlurmClient
from slurmk8s.slurm.agent import AgentServer
from slurmk8s.slurm.directory import (
    GROUPS_MAX_BYTES,
    STALE_SECONDS,
    Verdict,
    parse_groups,
    parse_verdict,
    read_groups,
    read_verdict,
)

from .conftest import EXAMPLE, ROOT

NOW = 1_800_000_000.0


def test_the_probes_lines_become_a_verdict_and_an_old_one_is_unknown():
    text = "state=bind\nuri=ldaps://ldap.example.org\nmessage=the directory refused the bind\n"
    v = parse_verdict(text, NOW - 10, NOW)
    assert (v.state, v.uri, v.message) == ("bind", "ldaps://ldap.example.org", "the directory refused the bind")
    stale = parse_verdict(text, NOW - STALE_SECONDS - 1, NOW)
    assert stale.state == "unknown" and "61 s ago" in stale.message
    assert parse_verdict("state=fine\n", NOW, NOW).state == "unknown"
    assert parse_verdict("state=ok\n\x1b[31m\n", NOW, NOW).state == "unknown"  # no other line is read
    assert Verdict.from_json(v.to_json()) == v
    with pytest.raises(ValueError):
        Verdict.from_json({"state": "maybe"})


def test_the_verdict_is_read_without_following_a_link(tmp_path):
    assert read_verdict(str(tmp_path / "none")).state == "unknown"
    real = tmp_path / "real"
    real.write_text("state=ok\nuri=ldaps://a\nmessage=bound\n")
    assert read_verdict(str(real)).state == "ok"
    old = time.time() - 2 * STALE_SECONDS
    os.utime(real, (old, old))
    assert read_verdict(str(real)).state == "unknown"
    link = tmp_path / "link"
    link.symlink_to(real)
    v = read_verdict(str(link))
    assert v.state == "unknown" and "cannot be read" in v.message


def test_the_group_list_is_read_strictly_and_not_through_a_link(tmp_path):
    groups = parse_groups("physics:alice,bob\nempty:\nUPPER:x\nfoo:a:b\n")
    assert groups.members == {"physics": ["alice", "bob"], "empty": [], "foo": []}
    assert groups.invalid == {"foo": ["'a:b'"]}
    real = tmp_path / "groups"
    real.write_text("physics:alice\n")
    assert read_groups(str(real)).members == {"physics": ["alice"]}
    link = tmp_path / "link"
    link.symlink_to(real)
    assert read_groups(str(link)) is None and read_groups(str(tmp_path / "none")) is None


def test_a_member_that_is_no_user_name_is_left_out_and_its_group_still_counts():
    """A member with a space froze its whole group (read as not found, so never closed)."""
    groups = parse_groups("physics:alice,bob smith,-x,Carol,dan,<base64 value>," + "e" * 40 + "\n")
    assert groups.members == {"physics": ["alice", "dan"]}
    assert groups.invalid == {"physics": ["'bob smith'", "'-x'", "'Carol'", "'<base64 value>'", repr("e" * 40)]}


def test_a_group_list_cut_at_its_limit_is_not_read_at_all(tmp_path):
    """A list longer than the agent reads was cut there: the members after the cut read as gone
    and were closed. Now none of it is read, and nobody is closed."""
    path = tmp_path / "groups"
    members = ",".join(f"user{i:07d}" for i in range(GROUPS_MAX_BYTES // 12 + 10))
    path.write_text(f"physics:{members}\n")
    assert path.stat().st_size > GROUPS_MAX_BYTES
    assert read_groups(str(path)) is None
    path.write_text(f"physics:{members[:GROUPS_MAX_BYTES - 100].rsplit(',', 1)[0]}\n")
    assert len(read_groups(str(path)).members["physics"]) > 300_000


def _members_awk() -> str:
    text = (ROOT / "images/sssd/probe.sh").read_text()
    return re.search(r"^members_awk='(.*?)'$", text, re.M | re.S).group(1)


def test_the_probe_lists_members_so_that_no_value_becomes_another_member(tmp_path):
    """What images/sssd/probe.sh makes of ldapsearch's LDIF: a value with ',' stays one (invalid)
    member, a base64 value is marked, and a group whose members came in parts is left out."""
    ldif = ("dn: cn=physics,ou=groups,dc=x\ncn: physics\nmemberUid: alice\nmemberUid: x,root\n"
            "memberUid:: IGJvYg==\nmemberUid: bob smith\n\n"
            "dn: cn=big,ou=groups,dc=x\ncn: big\nmemberUid;range=0-1499: a\nmemberUid;range=0-1499: b\n\n"
            "dn: cn=labs,ou=groups,dc=x\ncn: labs\nmemberUid: carol\n")
    out = subprocess.run(["awk", _members_awk()], input=ldif, capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["physics:alice,x root,<base64 value>,bob smith", "labs:carol"]
    groups = parse_groups(out)
    assert groups.members == {"physics": ["alice"], "labs": ["carol"]} and "big" not in groups.members
    assert "'x root'" in groups.invalid["physics"]


def test_the_agent_serves_the_verdict_to_the_operator(tmp_path):
    verdict = tmp_path / "verdict"
    verdict.write_text("state=unreachable\nuri=ldaps://ldap.example.org\n"
                       "message=ldaps://ldap.example.org: no connection to ldap.example.org:636 within 5 s\n")
    keys = ClusterKeys.generate()

    def runner(argv, stdin):  # pragma: no cover - no Slurm command is run for this route
        raise AssertionError(argv)

    server = AgentServer(("127.0.0.1", 0), SlurmClient(runner, directory_verdict=str(verdict)), keys.agent_token)
    server.start()
    try:
        got = RemoteSlurm(server.url, keys.agent_token).directory()
    finally:
        server.stop()
    assert got.state == "unreachable" and "within 5 s" in got.message and got.checked > 0


def _previous(status: str, reason: str) -> Condition:
    return Condition(type="DirectoryReady", status=status, reason=reason, message="",
                     last_transition_time="2026-11-27T00:00:00Z")


def test_the_condition_says_who_waits_and_events_mark_the_changes():
    down = directory.condition(Verdict("unreachable", "ldaps://a: no connection"))
    assert down[:2] == ("False", "Unreachable") and "from sssd's cache" in down[2]
    assert directory.condition(Verdict("tls", "x"))[1] == "TLSFailed"
    assert directory.condition(Verdict("bind", "x"))[1] == "BindFailed"
    assert directory.condition(None, "connection refused") == (
        "Unknown", "Unknown", "the Slurm agent did not say: connection refused")
    up = directory.condition(Verdict("ok", "ldaps://a: bound"))
    assert up[:2] == ("True", "Reachable")
    # Once per change: down, a different failure, back; nothing while unknown or the same.
    warn = directory.event(_previous("True", "Reachable"), down)
    assert warn is not None and (warn.type, warn.reason) == ("Warning", "DirectoryUnreachable")
    assert directory.event(_previous("False", "Unreachable"), down) is None
    assert directory.event(_previous("False", "Unreachable"), directory.condition(Verdict("bind", "x"))).reason \
        == "DirectoryBindFailed"
    assert directory.event(_previous("True", "Reachable"), directory.condition(None)) is None
    back = directory.event(_previous("False", "Unreachable"), up)
    assert back is not None and (back.type, back.reason) == ("Normal", "DirectoryReachable")
    assert directory.event(None, up) is None and directory.event(_previous("Unknown", "Unknown"), up) is None


def test_a_directory_that_is_down_is_a_condition_of_its_own_not_unready():
    doc = yaml.safe_load(EXAMPLE.read_text())
    plain = load_cluster(doc)
    doc["spec"]["identity"] = {"ldap": {
        "uris": ["ldaps://ldap.example.org"], "userSearchBase": "ou=people,dc=example,dc=org",
        "groupSearchBase": "ou=groups,dc=example,dc=org", "minId": 5000,
        "egressCidrs": ["192.0.2.0/24"]}}
    doc["spec"].setdefault("network", {})["egress"] = True
    c = load_cluster(doc)
    down = directory.condition(Verdict("unreachable", "no connection"))
    kw = dict(previous=None, observed=[], nodes=None, applied_hash=None, rendered_hash="h",
              now="2026-11-27T00:00:00Z")
    with_down = {x.type: x for x in compute(c, directory=down, **kw).conditions}
    assert (with_down["DirectoryReady"].status, with_down["DirectoryReady"].reason) == ("False", "Unreachable")
    assert with_down["Ready"].message == {x.type: x for x in compute(c, **kw).conditions}["Ready"].message
    assert "DirectoryReady" not in {x.type for x in compute(plain, **kw).conditions}
