"""The pod template applied (decision record 48): one function shapes the workers of a node
set and the lent slurmd pods alike; the restart hash covers it; nothing rendered that the
API server drops; slurmk8s's own volumes, mounts and label domains are what a template may
not take; the bridge lends with the policy's template, and not while its mounts meet the
cluster's shared storage; Pod Security baseline but for capabilities. The templates and
their refusals: tests/test_pod_template.py."""

from __future__ import annotations

import copy
from datetime import timedelta

import kubernetes_validate
import pytest
import yaml

from sandbox.apiserver import podsecurity
from slurmk8s.api import load_cluster, load_policy
from slurmk8s.api.base import in_group
from slurmk8s.api.mounts import system_mount_problem
from slurmk8s.api.podtemplate import PRODUCT_LABEL_DOMAINS, RESERVED_VOLUMES, SHARED_VOLUME_PREFIX
from slurmk8s.bridge import actions as A
from slurmk8s.bridge.nodestate import IDLE_SINCE_ANNOTATION, TAINT_KEY, format_time
from slurmk8s.operator.plan import differences
from slurmk8s.render import render
from slurmk8s.render.manifests import lent_slurmd_pod
from slurmk8s.render.names import NODESET_LABEL, RESTART_HASH
from slurmk8s.render.pods import ROOT_CAPABILITIES, with_site_template
from slurmk8s.render.slurmd import is_lent_slurmd_pod

from .conftest import EXAMPLE
from .lending_sim import T0, World, gpu_node
from .lending_sim import cluster as sim_cluster
from .lending_sim import policy as sim_policy
from .test_pod_template import FULL, FULL_LENT, cluster_doc, policy_doc

# --- Rendering: one function applies a template to a worker and to a lent pod -----------------

LENT_RESOURCES = {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "4"}


def worker_template(doc: dict, keys, node_set: str = "gpu") -> dict:
    """The pod template of a node set's StatefulSet, as rendered."""
    (sts,) = [o for o in render(load_cluster(doc), keys)
              if o["kind"] == "StatefulSet" and o["metadata"].get("labels", {}).get(NODESET_LABEL) == node_set]
    kubernetes_validate.validate(sts, kubernetes_validate.latest_version(), strict=True)
    return sts["spec"]["template"]


def lent_pod(doc: dict, template: dict | None) -> dict:
    policy = load_policy(policy_doc(template)) if template is not None else None
    pod = lent_slurmd_pod(load_cluster(doc), "", node="gpu-7", resources=LENT_RESOURCES, labels={}, partition="gpu",
                          shm_size="1Gi", taint_key=TAINT_KEY,
                          pod_template=policy.spec.pod_template if policy is not None else None)
    kubernetes_validate.validate(pod, kubernetes_validate.latest_version(), strict=True)
    return pod


def slurmd(pod: dict) -> dict:
    (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "slurmd"]
    return container


def check_shaped(pod: dict, plain: dict, template: dict) -> None:
    """``pod`` is ``plain`` (the same pod rendered without a template) shaped by ``template``."""
    spec, before = pod["spec"], plain["spec"]
    assert spec["runtimeClassName"] == "nvidia" and spec["priorityClassName"] == "hpc-batch"
    assert spec["dnsConfig"] == template["dnsConfig"]
    assert spec.get("affinity") == template.get("affinity")
    assert spec["tolerations"] == [*before.get("tolerations", []),
                                   {"key": "example.com/rdma", "operator": "Exists", "effect": "NoSchedule"}]
    assert spec["volumes"] == [*before["volumes"], *template["volumes"]]
    container, bare = slurmd(pod), slurmd(plain)
    assert container["volumeMounts"] == [*bare["volumeMounts"], *template["volumeMounts"]]
    for section in ("requests", "limits"):
        assert container["resources"][section] == {**template["resources"], **bare["resources"][section]}
    assert container["securityContext"]["capabilities"] == {
        "drop": ["ALL"], "add": [*ROOT_CAPABILITIES, "IPC_LOCK", "SYS_RESOURCE"]}
    assert {k: v for k, v in container.items() if k not in ("volumeMounts", "resources", "securityContext")} == \
        {k: v for k, v in bare.items() if k not in ("volumeMounts", "resources", "securityContext")}
    assert [c for c in spec["containers"] if c["name"] != "slurmd"] == \
        [c for c in before["containers"] if c["name"] != "slurmd"]
    labels, annotations = pod["metadata"]["labels"], pod["metadata"].get("annotations", {})
    assert labels == {**template["labels"], **plain["metadata"]["labels"]}
    assert {k: annotations[k] for k in template["annotations"]} == template["annotations"]


def test_a_node_sets_template_shapes_its_workers(keys):
    shaped, plain = worker_template(cluster_doc(FULL), keys), worker_template(cluster_doc(None), keys)
    check_shaped(shaped, plain, FULL)
    # The node set's own tolerations stay, the template's come after them.
    doc = cluster_doc(FULL, tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}])
    assert [t["key"] for t in worker_template(doc, keys)["spec"]["tolerations"]] == ["nvidia.com/gpu", "example.com/rdma"]


def test_a_policys_template_shapes_the_lent_pods():
    doc = cluster_doc(None)
    shaped, plain = lent_pod(doc, FULL_LENT), lent_pod(doc, None)
    check_shaped(shaped, plain, FULL_LENT)
    # Still pinned to its node, tolerating the lending taint first, named and labelled as the bridge finds it.
    assert shaped["spec"]["nodeName"] == "gpu-7" and shaped["metadata"]["name"] == plain["metadata"]["name"]
    assert shaped["spec"]["tolerations"][:2] == plain["spec"]["tolerations"]
    assert is_lent_slurmd_pod(shaped["metadata"]["labels"], "gpu-7", "c1", "gpu-7")


def test_a_worker_and_a_lent_pod_get_the_same_from_one_template(keys):
    """What a template adds is the same for both pods: one function applies it."""
    doc = cluster_doc(FULL_LENT)

    def added(shaped: dict, plain: dict) -> dict:
        out = {k: v for k, v in shaped["spec"].items() if plain["spec"].get(k) != v
               and k not in ("containers", "volumes", "tolerations")}
        out["volumes"] = shaped["spec"]["volumes"][len(plain["spec"]["volumes"]):]
        out["tolerations"] = shaped["spec"]["tolerations"][len(plain["spec"].get("tolerations", [])):]
        out["mounts"] = slurmd(shaped)["volumeMounts"][len(slurmd(plain)["volumeMounts"]):]
        out["resources"] = {s: {k: v for k, v in slurmd(shaped)["resources"][s].items()
                                if k not in slurmd(plain)["resources"][s]} for s in ("requests", "limits")}
        out["capabilities"] = slurmd(shaped)["securityContext"]["capabilities"]["add"][
            len(slurmd(plain)["securityContext"]["capabilities"]["add"]):]
        return out

    worker = added(worker_template(doc, keys), worker_template(cluster_doc(None), keys))
    lent = added(lent_pod(cluster_doc(None), FULL_LENT), lent_pod(cluster_doc(None), None))
    assert worker == lent
    assert set(worker) == {"runtimeClassName", "priorityClassName", "dnsConfig", "volumes", "tolerations", "mounts",
                           "resources", "capabilities"}


@pytest.mark.parametrize("field,value", [
    ("runtimeClassName", "kata"), ("priorityClassName", "other"), ("labels", {"example.com/team": "hpc"}),
    ("annotations", {"k8s.v1.cni.cncf.io/networks": "other-net"}), ("resources", {"rdma/hca": "2"}),
    ("capabilities", ["IPC_LOCK"]), ("volumes", [{"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}}]),
])
def test_a_template_change_restarts_the_workers(keys, field, value):
    """The restart hash covers the template: the operator restarts one drained worker at a
    time (its pods' hash differs from the StatefulSet's); the site's annotations stay beside it."""
    before = worker_template(cluster_doc(FULL), keys)
    changed = {**FULL, field: value}
    if field == "volumes":
        changed["volumeMounts"] = [{"name": "scratch", "mountPath": "/scratch"}]
    after = worker_template(cluster_doc(changed), keys)
    assert before["metadata"]["annotations"][RESTART_HASH] != after["metadata"]["annotations"][RESTART_HASH]
    assert after["metadata"]["annotations"] == {**changed["annotations"],
                                                RESTART_HASH: after["metadata"]["annotations"][RESTART_HASH]}


def test_a_privileged_slurmd_gets_no_capabilities_it_has_already(keys):
    doc = cluster_doc(FULL)
    doc["spec"]["slurmConfig"] = {"cgroups": True}
    doc["spec"]["partitions"][0]["acceptLentNodes"] = False
    container = slurmd(worker_template(doc, keys))
    assert container["securityContext"] == {"privileged": True}
    assert container["resources"]["limits"]["rdma/hca"] == "1"


def go_omitempty(value):
    """``value`` as the API server writes it back: Go's omitempty drops empty lists,
    maps, strings and false (an emptyDir is a pointer: {} stays)."""
    if isinstance(value, dict):
        return {k: go_omitempty(v) for k, v in value.items()
                if k == "emptyDir" or v not in ([], {}, "", False, None)}
    if isinstance(value, list):
        return [go_omitempty(v) for v in value]
    return value


def test_the_operator_finds_a_shaped_worker_unchanged_once_applied():
    """What a template renders is what Kubernetes keeps: no empty list, map or false
    that the API server drops, which the operator's plan would take for a change every
    round. (Applied to a bare pod, everything in the result is the template's.)"""
    template = {**FULL, "volumes": [*FULL["volumes"], {"name": "disk", "emptyDir": {}}],
                "volumeMounts": [*FULL["volumeMounts"], {"name": "disk", "mountPath": "/disk"}]}
    shaped = with_site_template({"metadata": {}, "spec": {"containers": [{"name": "slurmd"}]}},
                                load_cluster(cluster_doc(template)).spec.node_sets[0].pod_template)
    assert differences(shaped, go_omitempty(shaped)) == []
    assert {"name": "disk", "emptyDir": {}} in shaped["spec"]["volumes"]
    assert shaped["spec"]["affinity"]["podAntiAffinity"] == FULL["affinity"]["podAntiAffinity"]


def rich_cluster() -> dict:
    """The example with every component and volume slurmk8s renders: the directory, slurmrestd,
    site checks, a GPU node set."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["identity"] = {"ldap": {
        "uris": ["ldaps://ldap.example.org"], "userSearchBase": "ou=people,dc=example,dc=org",
        "groupSearchBase": "ou=groups,dc=example,dc=org", "bindDn": "cn=reader,dc=example,dc=org",
        "bindPasswordSecret": {"name": "ldap-bind", "key": "password"},
        "ca": {"configMap": {"name": "ldap-ca", "key": "ca.crt"}}, "minId": 5000}}
    doc["spec"]["restApi"] = {"enabled": True}
    doc["spec"]["healthCheck"] = {"siteChecks": "site-health"}
    return doc


def rendered_pods(keys) -> list[dict]:
    """Every pod (template) slurmk8s renders for the rich cluster, with the volumes of its
    StatefulSet's claims, and a lent slurmd pod."""
    cluster = load_cluster(rich_cluster())
    pods = []
    for o in render(cluster, keys):
        if "template" in o.get("spec", {}):
            pod = copy.deepcopy(o["spec"]["template"])
            pod["spec"]["volumes"] += [{"name": c["metadata"]["name"]} for c in o["spec"].get("volumeClaimTemplates", [])]
            pods.append(pod)
    pods.append(lent_slurmd_pod(cluster, "", node="gpu-7", resources=LENT_RESOURCES, labels={}, partition="gpu",
                                shm_size="1Gi", taint_key=TAINT_KEY))
    return pods


def test_the_reserved_volume_names_are_the_renderers(keys):
    """Every volume slurmk8s gives a pod is one a template may not name, and every
    reserved name is one it gives some pod: the list is the renderer's."""
    pods = rendered_pods(keys)
    assert len(pods) >= 7
    used = {v["name"] for p in pods for v in p["spec"]["volumes"]}
    assert {n for n in used if not n.startswith(SHARED_VOLUME_PREFIX)} == set(RESERVED_VOLUMES)
    assert any(n.startswith(SHARED_VOLUME_PREFIX) for n in used)


def test_slurmk8s_mounts_only_where_a_template_may_not(keys):
    """A template mount is refused at, in or over a system directory; every mount
    slurmk8s makes (but the cluster's shared storage, which the template stays apart
    from) is in one."""
    shared = {v["mountPath"] for v in rich_cluster()["spec"]["sharedStorage"]["volumes"]}
    mounts = {m["mountPath"] for p in rendered_pods(keys) for c in p["spec"]["containers"]
              for m in c.get("volumeMounts", [])}
    assert len(mounts) > 15
    assert [m for m in mounts - shared if system_mount_problem(m) is None] == []


def test_slurmk8s_labels_its_pods_only_in_the_domains_a_template_may_not(keys):
    keys_used = {k for p in rendered_pods(keys) for k in p["metadata"]["labels"]}
    assert keys_used and all(in_group(k) or k.rpartition("/")[0] in PRODUCT_LABEL_DOMAINS for k in keys_used)


# --- The bridge: the policy's template reaches the pods it starts ------------------------------

IDLE = {IDLE_SINCE_ANNOTATION: format_time(T0 - timedelta(seconds=600))}


def test_the_bridge_lends_with_the_policys_template():
    pol = sim_policy(podTemplate=FULL_LENT)
    (create,) = [a for a in World.of(nodes=[gpu_node("n1", annotations=IDLE)]).decide(pol, T0)
                 if isinstance(a, A.CreateSlurmdPod)]
    assert create.pod_template == pol.spec.pod_template


def test_a_policy_whose_mounts_meet_the_clusters_shared_storage_lends_nothing():
    with_storage = load_cluster({**sim_cluster().dump(), "spec": {
        **sim_cluster().dump()["spec"], "sharedStorage": {"volumes": [{"name": "shared", "mountPath": "/shared",
                                                                        "size": "1Gi"}]}}})
    template = {"volumes": [{"name": "scratch", "emptyDir": {}}],
                "volumeMounts": [{"name": "scratch", "mountPath": "/shared/scratch"}]}
    world = World.of(nodes=[gpu_node("n1", annotations=IDLE)], cluster=with_storage)
    acts = world.decide(sim_policy(podTemplate=template), T0)
    assert not [a for a in acts if isinstance(a, A.CreateSlurmdPod)]
    (status,) = [a.status for a in acts if isinstance(a, A.PolicyStatus)]
    (cond,) = status.conditions
    assert (cond.status, cond.reason) == ("False", "PodTemplateConflict")
    assert cond.message.startswith('spec.podTemplate.volumeMounts[0].mountPath: "/shared/scratch" nests with '
                                   "SlurmCluster hpc/demo's spec.sharedStorage.volumes[0].mountPath")
    # Apart from it, the same template lends.
    template["volumeMounts"][0]["mountPath"] = "/scratch"
    assert [a for a in world.decide(sim_policy(podTemplate=template), T0) if isinstance(a, A.CreateSlurmdPod)]


def test_a_template_keeps_the_pods_at_baseline_but_for_its_capabilities(keys):
    """What docs/install.md says of the level: a template's volumes, resources, scheduling and
    DNS keep the slurmd pods at Pod Security baseline; adding capabilities makes them privileged."""
    strictest = {}
    for name, template in (("without capabilities", {**FULL, "capabilities": []}), ("with", FULL)):
        pods = [worker_template(cluster_doc(template), keys)["spec"],
                lent_pod(cluster_doc(None), {k: v for k, v in template.items() if k != "affinity"})["spec"]]
        strictest[name] = {next(level for level in ("restricted", "baseline", "privileged")
                                if not podsecurity.check(pod, level)) for pod in pods}
    assert strictest == {"without capabilities": {"baseline"}, "with": {"privileged"}}


def test_an_empty_template_changes_nothing(keys):
    assert worker_template(cluster_doc({}), keys) == worker_template(cluster_doc(None), keys)
    assert lent_pod(cluster_doc(None), {}) == lent_pod(cluster_doc(None), None)
