"""Every container slurmk8s makes has cpu and memory requests and limits.

A namespace's ResourceQuota on ``limits.*`` refuses a pod with a container
that sets none, and a LimitRange's default CPU limit would throttle slurmd
below the CPUs slurm.conf gives it. So the cluster's pods, the lent slurmd
pod and the chart's operator and bridge all carry both, requests within
limits, and slurmd's CPU limit is its node's CPUs.
"""

from __future__ import annotations

import copy
import re

import pytest
import yaml

from slurmk8s.api import InvalidSpec, load_cluster
from slurmk8s.api.cluster import LOGIN_RESOURCES
from slurmk8s.api.quantities import quantity_value
from slurmk8s.render.manifests import lent_slurmd_pod, render

from .conftest import EXAMPLE
from .test_chart import objects as chart_objects

KEYS = ("cpu", "memory")


def containers(objs: list[dict]):
    for o in objs:
        spec = o.get("spec") or {}
        pod = spec["template"]["spec"] if "template" in spec else spec if o["kind"] == "Pod" else None
        if pod:
            for c in [*pod.get("initContainers", []), *pod["containers"]]:
                yield f"{o['kind']}/{o['metadata']['name']}/{c['name']}", c


def assert_bounded(where: str, c: dict) -> None:
    r = c.get("resources") or {}
    for key in KEYS:
        req, lim = (r.get("requests") or {}).get(key), (r.get("limits") or {}).get(key)
        assert req is not None and lim is not None, f"{where}: {key} request {req}, limit {lim}"
        assert quantity_value(req) <= quantity_value(lim), f"{where}: {key} request {req} above limit {lim}"


def everything() -> dict:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["restApi"] = {"enabled": True}
    assert doc["spec"]["accounting"]["enabled"]
    return doc


def test_every_container_of_a_cluster_with_every_component_has_requests_and_limits(keys):
    doc = everything()
    doc["spec"]["identity"] = {"ldap": {"uris": ["ldaps://ldap.example.org"], "userSearchBase": "ou=people,dc=x",
                                        "groupSearchBase": "ou=groups,dc=x", "minId": 65536,
                                        "maxId": 2**31 - 2, "egressCidrs": ["192.0.2.0/24"]}}
    objs = render(load_cluster(doc), keys)
    seen = dict(containers(objs))
    assert {"slurmctld", "agent", "slurmd", "login", "slurmrestd", "slurmdbd", "mariadb", "sssd"} <= {
        name.rsplit("/", 1)[1] for name in seen}
    for where, c in seen.items():
        assert_bounded(where, c)


def test_slurmds_cpu_limit_is_the_cpus_slurm_conf_gives_its_node(keys):
    for where, c in containers(render(load_cluster(everything()), keys)):
        if c["name"] == "slurmd":
            env = {e["name"]: e.get("value") for e in c["env"]}
            cpus = re.search(r"\bCPUs=(\d+)", env["SLURMK8S_NODE_CONF"]).group(1)
            assert c["resources"]["limits"]["cpu"] == cpus, where


def test_the_lent_slurmd_pod_is_bounded_by_what_is_lent(keys):
    pod = lent_slurmd_pod(load_cluster(everything()), "", node="gpu-7", labels={}, partition="gpu",
                          resources={"cpu": "30500m", "memory": "200Gi", "nvidia.com/gpu": "6"},
                          shm_size="1Gi", taint_key="t")
    ((where, c),) = containers([pod])
    assert_bounded(where, c)
    assert c["resources"]["limits"]["cpu"] == "30"  # the whole CPUs it registers with


def test_the_charts_operator_and_bridge_have_requests_and_limits():
    objs = chart_objects({"bridge": {"enabled": True}})
    seen = dict(containers(objs))
    assert any("operator" in w for w in seen) and any("bridge" in w for w in seen), list(seen)
    for where, c in seen.items():
        assert_bounded(where, c)


def login(resources: dict, keys) -> dict:
    doc = everything()
    doc["spec"]["login"]["resources"] = resources
    return next(c for _, c in containers(render(load_cluster(doc), keys)) if c["name"] == "login")["resources"]


def test_what_a_spec_leaves_out_is_the_components_default_kept_around_what_it_gives(keys):
    default = LOGIN_RESOURCES
    assert login({"requests": {"cpu": "1"}}, keys) == {
        "requests": {"cpu": "1", "memory": default.requests.memory},
        "limits": {"cpu": default.limits.cpu, "memory": default.limits.memory}}
    # A request above the default limit raises the limit to it; a limit below
    # the default request lowers the request to it.
    assert login({"requests": {"cpu": "8", "memory": "16Gi"}}, keys)["limits"] == {"cpu": "8", "memory": "16Gi"}
    assert login({"limits": {"cpu": "100m", "memory": "256Mi"}}, keys)["requests"] == {"cpu": "100m",
                                                                                       "memory": "256Mi"}


@pytest.mark.parametrize("path", [("controller",), ("login",), ("restApi",), ("accounting", "slurmdbd"),
                                  ("accounting", "database", "managed")])
def test_a_request_above_its_limit_is_refused_with_its_field_path(path):
    doc = everything()
    doc["spec"]["restApi"] = {"enabled": True}
    node = doc["spec"]
    for key in path:
        node = node.setdefault(key, {})
    node["resources"] = {"requests": {"cpu": "3"}, "limits": {"cpu": "2"}}
    with pytest.raises(InvalidSpec) as refused:
        load_cluster(copy.deepcopy(doc))
    field = "spec." + ".".join(path) + ".resources.requests.cpu"
    assert any(e.path == field and "more than limits.cpu" in e.message for e in refused.value.errors), \
        refused.value
