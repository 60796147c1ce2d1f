"""The sandbox's bridge on a host that a killed sandbox left a bridge on: an
empty one of a sandbox that no longer exists is removed, anything in use is not."""

import os
import re
import socket
import subprocess
from pathlib import Path

import pytest

from sandbox import runtime
from sandbox.sandbox import DEFAULT_SUBNET

from .tiers import needs

SUBNET = "10.253.82.0/24"


def addresses(dev: str) -> str:
    return subprocess.run(["ip", "-o", "-4", "addr", "show", "dev", dev], capture_output=True, text=True).stdout


@pytest.fixture
@needs("root")
def networks():
    assert os.geteuid() == 0, "bridges need root"
    made: list[runtime.Network] = []

    def network(sid: str) -> runtime.Network:
        net = runtime.Network(sid, SUBNET, "10.253.82.1")
        made.append(net)
        return net

    yield network
    for net in made:
        net.detach("p", 0)
        net.delete()


def test_an_empty_bridge_of_a_dead_sandbox_on_the_subnet_is_removed(networks):
    dead, new = networks("d0d0d0"), networks("e0e0e0")
    assert dead.create() == []
    assert runtime.abandoned_bridge(dead.bridge)
    assert new.create() == [dead.bridge]
    assert not Path(f"/sys/class/net/{dead.bridge}").exists()
    assert "10.253.82.1/24" in addresses(new.bridge)


def test_a_bridge_a_starting_sandbox_serves_on_is_kept(networks):
    starting, new = networks("d2d2d2"), networks("e2e2e2")
    starting.create()
    with socket.create_server(("10.253.82.1", 0)):  # its registry, before any pod
        assert not runtime.abandoned_bridge(starting.bridge, "10.253.82.1")
        with pytest.raises(runtime.SandboxError, match=f"already in use on {starting.bridge}"):
            new.create()
    assert runtime.abandoned_bridge(starting.bridge, "10.253.82.1")


def test_a_bridge_with_a_pod_on_it_is_kept_and_named(networks):
    live, new = networks("d1d1d1"), networks("e1e1e1")
    live.create()
    live.attach("p", 0, "10.253.82.10")
    assert not runtime.abandoned_bridge(live.bridge)
    with pytest.raises(runtime.SandboxError, match=f"already in use on {live.bridge}"):
        new.create()
    assert "10.253.82.1/24" in addresses(live.bridge)
    assert not Path(f"/sys/class/net/{new.bridge}").exists()


def test_only_bridges_named_as_the_sandbox_names_them_count():
    assert not runtime.abandoned_bridge("eth0")
    assert not runtime.abandoned_bridge("sk8sXYZ123")
    assert not runtime.abandoned_bridge("sk8s0123456")
    assert not runtime.abandoned_bridge("sk8sabcdef")  # no such device


def test_no_two_test_files_that_may_run_at_once_share_a_subnet():
    """hack/test.sh runs four lanes at once: everything outside tests/e2e, and
    the end-to-end suites in three lanes (researcher_e2e, platform_e2e,
    trust_e2e), each lane one file after another. A subnet two files share
    must be used by files of one end-to-end lane only, or two networks collide
    on one host."""
    tests = Path(__file__).parent
    users: dict[str, set[str]] = {}
    for path in tests.rglob("*.py"):
        for subnet in re.findall(r"\b(10\.25[0-9]\.\d+)\.(?:0/24|1\b)", path.read_text()):
            if subnet + ".0/24" != DEFAULT_SUBNET:  # a sandbox run by hand; pure tests name it
                users.setdefault(subnet, set()).add(str(path.relative_to(tests)))
    assert users, "no subnet found: the pattern no longer matches how the tests write them"
    script = (tests.parent / "hack/test.sh").read_text()
    lanes = {name: {f.removeprefix("tests/") for f in files.split()}
             for name, files in re.findall(r"^(\w+)_e2e=\(([^)]*)\)", script, re.M)}
    assert {"researcher", "platform", "trust"} <= set(lanes), f"hack/test.sh names the lanes {sorted(lanes)}"
    assert "e2e/test_simulate_trust.py" in lanes["trust"]

    def lane(f: str) -> str:
        if not f.startswith("e2e/"):
            return "rest"
        return next(name for name, files in lanes.items() if f in files)

    shared = {s: sorted(files) for s, files in users.items()
              if len(files) > 1 and (len({lane(f) for f in files}) > 1 or lane(next(iter(files))) == "rest")}
    assert not shared, f"subnets used by files that may run at once: {shared}"
