"""The pod template a site shapes (decision record 48): node sets' and lent slurmd pods'
runtime class, labels and annotations, priority class, affinity, tolerations, extra
volumes and mounts, extra resources, capabilities and DNS, loaded and round-tripped
through the CRD schema; what would break the product refused with its field path and
reason. How it is applied: tests/test_pod_template_render.py."""

from __future__ import annotations

import copy

import jsonschema
import pytest
import yaml

from slurmk8s.api import InvalidSpec, load_cluster, load_policy
from slurmk8s.bridge.nodestate import TAINT_KEY

from .conftest import ROOT, minimal


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
