"""The pod template a site shapes (decision record 48): node sets' and lent slurmd pods'
runtime class, labels and annotations, priority class, affinity, tolerations, extra
volumes and mounts, extra resources, capabilities and DNS; what would break the
product refused with its field path; applied by one function to both kinds of pod."""

from __future__ import annotations

import copy
from datetime import timedelta

import jsonschema
import kubernetes_validate
import pytest
import yaml

from sandbox.apiserver import podsecurity
from slurmk8s.api import InvalidSpec, load_cluster, load_policy
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

from .conftest import EXAMPLE, ROOT, minimal
from .lending_sim import T0, World, gpu_node
from .lending_sim import cluster as sim_cluster
from .lending_sim import policy as sim_policy


def errors_of(doc: dict) -> list[str]:
    with pytest.raises(InvalidSpec) as info:
        load_cluster(doc)
    return [str(e) for e in info.value.errors]


@pytest.mark.parametrize("key", [TAINT_KEY, "slurmk8s.dev/anything", "x.slurmk8s.dev/y"])
def test_a_node_set_tolerates_no_taint_of_the_products_own(key):
    found = errors_of(minimal(nodeSets=[{"name": "g", "tolerations": [{"key": key, "operator": "Exists"}]}]))
    assert len(found) == 1 and found[0].startswith("spec.nodeSets[0].tolerations[0].key: "), found
    assert "taint of slurmk8s's own" in found[0] and "lent to a Slurm cluster" in found[0]


def test_a_look_alike_taint_key_is_the_sites():
    load_cluster(minimal(nodeSets=[{"name": "g", "tolerations": [
        {"key": "notslurmk8s.dev/lent", "operator": "Exists"}, {"key": "slurmk8s.dev.example.com/x", "operator": "Exists"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}]))


#: A template that uses every field, as a site with RDMA GPU nodes might write it.
FULL = {
    "labels": {"example.com/team": "ml"},
    "annotations": {"k8s.v1.cni.cncf.io/networks": "rdma-net", "cluster-autoscaler.kubernetes.io/safe-to-evict": "false"},
    "runtimeClassName": "nvidia",
    "priorityClassName": "hpc-batch",
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "example.com/fabric", "operator": "In", "values": ["ib"]}]}]},
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 10, "preference": {"matchExpressions": [
                    {"key": "example.com/generation", "operator": "Gt", "values": ["3"]}]}}]},
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 50, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                               "labelSelector": {"matchLabels": {"example.com/team": "ml"}}}}]},
    },
    "tolerations": [{"key": "example.com/rdma", "operator": "Exists", "effect": "NoSchedule"}],
    "volumes": [
        {"name": "scratch", "emptyDir": {"sizeLimit": "100Gi"}},
        {"name": "hugepages", "emptyDir": {"medium": "HugePages"}},
        {"name": "nccl-topology", "configMap": {"name": "nccl-topology", "items": [{"key": "topo.xml", "path": "topo.xml"}]}},
        {"name": "datasets", "persistentVolumeClaim": {"claimName": "datasets", "readOnly": True}},
    ],
    "volumeMounts": [
        {"name": "scratch", "mountPath": "/scratch"},
        {"name": "hugepages", "mountPath": "/hugepages"},
        {"name": "nccl-topology", "mountPath": "/nccl", "readOnly": True},
        {"name": "datasets", "mountPath": "/datasets", "readOnly": True},
    ],
    "resources": {"rdma/hca": "1", "hugepages-2Mi": "2Gi"},
    "capabilities": ["IPC_LOCK", "SYS_RESOURCE"],
    "dnsConfig": {"nameservers": ["10.0.0.53"], "searches": ["hpc.example.com"],
                  "options": [{"name": "ndots", "value": "2"}, {"name": "edns0"}]},
}
#: The same for lent pods: a lent pod is bound to its node, so no affinity.
FULL_LENT = {k: v for k, v in FULL.items() if k != "affinity"}


def cluster_doc(template: dict | None, **node_set) -> dict:
    """A cluster of one GPU node set shaped by ``template`` (None: none), whose partition accepts lent nodes."""
    shaped = {"podTemplate": template} if template is not None else {}
    return minimal(
        nodeSets=[{"name": "gpu", "cpus": 8, "memory": "64Gi", "gpus": {"type": "h100", "count": 4},
                   **shaped, **node_set}],
        partitions=[{"name": "gpu", "nodeSets": ["gpu"], "acceptLentNodes": True}],
        sharedStorage={"volumes": [{"name": "shared", "mountPath": "/shared", "size": "1Gi"}]})


def policy_doc(template: dict) -> dict:
    return {"apiVersion": "slurmk8s.dev/v1alpha1", "kind": "NodeLendingPolicy", "metadata": {"name": "p", "namespace": "hpc"},
            "spec": {"clusterRef": {"name": "c1"}, "partition": "gpu",
                     "nodeSelector": {"matchLabels": {"slurmk8s.dev/lendable": "true"}}, "podTemplate": template}}


def policy_errors_of(doc: dict) -> list[str]:
    with pytest.raises(InvalidSpec) as info:
        load_policy(doc)
    return [str(e) for e in info.value.errors]


def test_a_template_with_every_field_loads_on_a_node_set_and_on_a_policy():
    cluster = load_cluster(cluster_doc(FULL))
    template = cluster.spec.node_sets[0].pod_template
    assert template is not None and template.runtime_class_name == "nvidia" and len(template.volumes) == 4
    assert load_cluster(cluster.dump()) == cluster
    policy = load_policy(policy_doc(FULL_LENT))
    assert policy.spec.pod_template is not None and policy.spec.pod_template.resources == FULL["resources"]
    assert load_policy(policy.dump()) == policy


def with_(path: str, value) -> dict:
    """FULL with ``value`` at ``path`` (dotted, list indexes as numbers)."""
    doc = copy.deepcopy(FULL)
    *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
    node = doc
    for p in parents:
        node = node[p]
    node[last] = value
    return doc


#: (where in FULL, the value put there, the error's path under the template, a piece of its reason)
REFUSALS = [
    # slurmk8s's own labels, annotations and taints
    ("labels", {"app.kubernetes.io/component": "x"}, "labels.app.kubernetes.io/component", "slurmk8s sets"),
    ("labels", {"slurmk8s.dev/nodeset": "other"}, "labels.slurmk8s.dev/nodeset", "slurmk8s sets"),
    ("annotations", {"slurmk8s.dev/restart-hash": "0"}, "annotations.slurmk8s.dev/restart-hash", "slurmk8s's own"),
    ("annotations", {"container.apparmor.security.beta.kubernetes.io/slurmd": "unconfined"},
     "annotations.container.apparmor.security.beta.kubernetes.io/slurmd", "AppArmor"),
    ("annotations", {"seccomp.security.alpha.kubernetes.io/pod": "unconfined"},
     "annotations.seccomp.security.alpha.kubernetes.io/pod", "seccomp"),
    ("annotations", {"example.com/x": "a\nb"}, "annotations.example.com/x", "newline"),
    ("tolerations", [{"key": "slurmk8s.dev/lent", "operator": "Exists"}], "tolerations[0].key", "taint of slurmk8s's own"),
    ("tolerations", [{"operator": "Equal", "value": "x"}], "tolerations[0].operator", "must be Exists"),
    # its volumes and mounts
    ("volumes.0.name", "munge-key", "volumes[0].name", "a volume of its own"),
    ("volumes.0.name", "shared-data", "volumes[0].name", "a volume of its own"),
    ("volumes.0.name", "shm", "volumes[0].name", "a volume of its own"),
    ("volumes.1.name", "scratch", "volumes[1].name", "must be unique"),
    ("volumes.0.emptyDir", {"medium": "Memory"}, "volumes[0].emptyDir.sizeLimit", "required with medium Memory"),
    ("volumes.0.emptyDir", {"medium": "Memory", "sizeLimit": "1Ti"}, "volumes[0].emptyDir.sizeLimit",
     "more than the pod's memory limit"),
    ("volumes.0.configMap", {"name": "x"}, "volumes[0]", "exactly one of"),
    ("volumes.3.persistentVolumeClaim.claimName", "state-c1-controller-0", "volumes[3].persistentVolumeClaim.claimName",
     "slurmctld's state"),
    ("volumes.3.persistentVolumeClaim.claimName", "data-c1-mariadb-0", "volumes[3].persistentVolumeClaim.claimName",
     "accounting database"),
    ("volumes.2.configMap.items.0.path", "../../etc/passwd", "volumes[2].configMap.items[0].path", "'..'"),
    ("volumes.0.hostPath", {"path": "/dev/infiniband"}, "volumes[0].hostPath", "node's own files"),
    ("volumes.0.secret", {"secretName": "c1-munge-key"}, "volumes[0].secret", "readable by every job"),
    ("volumes.0.projected", {"sources": []}, "volumes[0].projected", "Secrets and tokens"),
    ("volumes.0.nfs", {"server": "nfs", "path": "/"}, "volumes[0].nfs", "not a volume source"),
    ("volumeMounts.0.mountPath", "/etc/slurm", "volumeMounts[0].mountPath", "system directory /etc"),
    ("volumeMounts.0.mountPath", "/run/slurmk8s/munge", "volumeMounts[0].mountPath", "system directory /run"),
    ("volumeMounts.0.mountPath", "/dev/shm", "volumeMounts[0].mountPath", "system directory /dev"),
    ("volumeMounts.0.mountPath", "/var", "volumeMounts[0].mountPath", "contains the system directory"),
    ("volumeMounts.0.mountPath", "/shared/scratch", "volumeMounts[0].mountPath",
     "nests with spec.sharedStorage.volumes[0].mountPath"),
    ("volumeMounts.0.mountPath", "/datasets/x", "volumeMounts[3].mountPath", "nests with"),
    ("volumeMounts.0.mountPath", "/datasets", "volumeMounts[3].mountPath", "is spec.nodeSets[0].podTemplate.volumeMounts[0]"),
    ("volumeMounts.0.name", "munge-key", "volumeMounts[0].name", "not a volume of the template"),
    ("volumeMounts.0.subPath", "x", "volumeMounts[0].subPath", "whole volume"),
    # the slurmd container: command, image, privileges
    ("command", ["/bin/sh"], "command", "not what runs in it"),
    ("args", ["-D"], "args", "not what runs in it"),
    ("image", "evil/slurmd", "image", "not what runs in it"),
    ("containers", [], "containers", "not what runs in it"),
    ("privileged", True, "privileged", "no slurmd pod is privileged"),
    ("securityContext", {"privileged": True}, "securityContext", "no slurmd pod is privileged"),
    ("hostNetwork", True, "hostNetwork", "shares no namespace with its node"),
    ("hostPID", True, "hostPID", "shares no namespace with its node"),
    ("serviceAccountName", "admin", "serviceAccountName", "no token"),
    ("nodeName", "n1", "nodeName", "the scheduler"),
    ("dnsPolicy", "None", "dnsPolicy", "ClusterFirst"),
    ("capabilities", ["SYS_ADMIN"], "capabilities[0]", "only IPC_LOCK, SYS_RESOURCE"),
    ("capabilities", ["NET_RAW"], "capabilities[0]", "only IPC_LOCK, SYS_RESOURCE"),
    ("capabilities", ["CAP_IPC_LOCK"], "capabilities[0]", "write it as IPC_LOCK"),
    ("capabilities", ["IPC_LOCK", "IPC_LOCK"], "capabilities[1]", "listed twice"),
    # resources slurmk8s sets, and what Kubernetes refuses
    ("resources", {"cpu": "4"}, "resources.cpu", "set by slurmk8s"),
    ("resources", {"memory": "4Gi"}, "resources.memory", "set by slurmk8s"),
    ("resources", {"nvidia.com/gpu": "1"}, "resources.nvidia.com/gpu", "set by slurmk8s"),
    ("resources", {"limits": {"rdma/hca": "1"}}, "resources.limits", "name: amount"),
    ("resources", {"ephemeral-storage": "1Gi"}, "resources.ephemeral-storage", "not a resource a pod template may add"),
    ("resources", {"example.kubernetes.io/x": "1"}, "resources.example.kubernetes.io/x", "Kubernetes' own domain"),
    ("resources", {"rdma/hca": "0.5"}, "resources.rdma/hca", "whole number"),
    ("resources", {"hugepages-2Mi": "0"}, "resources.hugepages-2Mi", "not above 0"),
    # scheduling
    ("priorityClassName", "system-node-critical", "priorityClassName", "Kubernetes' own priority classes"),
    ("runtimeClassName", "Nvidia", "runtimeClassName", "Kubernetes object name"),
    ("affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms", [{}],
     "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]", "matches no node"),
    ("affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution.0.preference.matchExpressions.0.values",
     ["3", "4"], "affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].preference"
     ".matchExpressions[0].values", "exactly one value"),
    ("affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution.0.weight", 0,
     "affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight", "too small"),
    ("affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution.0.podAffinityTerm.labelSelector",
     {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["b"]}]},
     "affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].podAffinityTerm.labelSelector"
     ".matchExpressions[0].values", "must be empty"),
    ("dnsConfig.nameservers", ["1.1.1.1", "1.0.0.1", "8.8.8.8", "9.9.9.9"], "dnsConfig.nameservers", "at most 3"),
    ("dnsConfig.nameservers", ["dns.example.com"], "dnsConfig.nameservers[0]", "not an IP address"),
    ("dnsConfig.searches", ["a" * 60 + f".x{i}" for i in range(32)] + [], "dnsConfig.searches", "at most 2048"),
    ("dnsConfig.options", [{"name": "ndots", "value": "1"}, {"name": "ndots"}], "dnsConfig.options[1].name", "listed twice"),
]


@pytest.mark.parametrize("where,value,path,reason", REFUSALS, ids=[f"{r[0]}={r[1]!r}"[:60] for r in REFUSALS])
def test_a_node_sets_template_refuses_what_would_break_the_product(where, value, path, reason):
    found = errors_of(cluster_doc(with_(where, value)))
    full = f"spec.nodeSets[0].podTemplate.{path}"
    matching = [e for e in found if e.startswith(full + ": ")]
    assert matching, f"no error at {full}; got {found}"
    assert any(reason in e for e in matching), f"{reason!r} not in {matching}"


@pytest.mark.parametrize("where,value,path,reason",
                         [r for r in REFUSALS if not r[0].startswith(("affinity", "volumeMounts.0.mountPath",
                                                                      "volumes.0.emptyDir"))],
                         ids=lambda v: str(v)[:40])
def test_a_policys_template_refuses_the_same(where, value, path, reason):
    found = policy_errors_of(policy_doc({k: v for k, v in with_(where, value).items() if k != "affinity"}))
    matching = [e for e in found if e.startswith(f"spec.podTemplate.{path}: ")]
    assert matching and any(reason in e for e in matching), found


def test_a_policys_template_has_no_affinity():
    found = policy_errors_of(policy_doc(FULL))
    assert len(found) == 1 and found[0].startswith("spec.podTemplate.affinity: ") and "spec.nodeSelector" in found[0]


def test_a_memory_backed_volume_of_a_lent_pod_needs_a_bound():
    found = policy_errors_of(policy_doc({"volumes": [{"name": "ram", "emptyDir": {"medium": "Memory"}}]}))
    assert [e.split(":")[0] for e in found] == ["spec.podTemplate.volumes[0].emptyDir.sizeLimit"]


def test_an_empty_template_changes_nothing(keys):
    assert worker_template(cluster_doc({}), keys) == worker_template(cluster_doc(None), keys)
    assert lent_pod(cluster_doc(None), {}) == lent_pod(cluster_doc(None), None)


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


# --- Through the CRD schema ---------------------------------------------------------------------


def crd_validator(plural: str) -> jsonschema.Validator:
    crd = yaml.safe_load((ROOT / "charts" / "slurmk8s" / "files" / "crds" / f"{plural}.slurmk8s.dev.yaml").read_text())
    return jsonschema.Draft7Validator(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


def pruned(value, schema: dict):
    """``value`` as the API server stores it: what its structural schema does not name dropped."""
    if isinstance(value, dict):
        if "properties" in schema:
            return {k: pruned(v, schema["properties"][k]) for k, v in value.items() if k in schema["properties"]}
        if isinstance(schema.get("additionalProperties"), dict):
            return {k: pruned(v, schema["additionalProperties"]) for k, v in value.items()}
        return value
    if isinstance(value, list) and "items" in schema:
        return [pruned(v, schema["items"]) for v in value]
    return value


@pytest.mark.parametrize("plural,doc,load", [("slurmclusters", cluster_doc(FULL), load_cluster),
                                             ("nodelendingpolicies", policy_doc(FULL_LENT), load_policy)])
def test_a_template_round_trips_through_the_crd_schema(plural, doc, load):
    """The CRD takes a template of every field and, pruning as the API server does, keeps
    all of it: what the bridge and the operator read back is what was written."""
    validator = crd_validator(plural)
    loaded = load(doc)
    for written in (doc, loaded.dump()):
        assert [e.message for e in validator.iter_errors(written)] == []
        assert pruned(written, validator.schema) == written
        assert load(pruned(written, validator.schema)) == loaded


def test_the_crd_schema_refuses_what_it_can_see():
    validator = crd_validator("slurmclusters")
    bad = cluster_doc({**FULL, "capabilities": ["SYS_ADMIN"], "annotations": {"example.com/x": "x" * 5000},
                       "volumes": [{"name": "Scratch", "emptyDir": {"medium": "Disk"}}]})
    paths = sorted(".".join(map(str, e.absolute_path)) for e in validator.iter_errors(bad))
    base = "spec.nodeSets.0.podTemplate"
    assert paths == [f"{base}.annotations.example.com/x", f"{base}.capabilities.0", f"{base}.volumes.0.emptyDir.medium",
                     f"{base}.volumes.0.name"]
