"""Names the product makes from names users choose cannot collide (issue 24, item 6).

Properties over random specs (hypothesis): every Kubernetes object of two
clusters in one namespace, the pods their StatefulSets make and the lent pods
of any nodes, has its own (kind, namespace, name); every Slurm token (node
set, feature, switch) names one source. Then the issue's cases, one by one.
"""

from __future__ import annotations

import re
from collections import Counter
from itertools import combinations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from slurmk8s.api import InvalidSpec, load_cluster
from slurmk8s.api.fields import RESERVED_NAMES
from slurmk8s.bridge.observed import KubePod
from slurmk8s.render import ClusterKeys, TopologyNode, config_files, names, render
from slurmk8s.render.lent import UnlendableNode, lent_node
from slurmk8s.render.manifests import lent_slurmd_pod
from slurmk8s.render.slurmd import node_conf

from .conftest import minimal
from .reach import reached, reaches
from .test_bridge_loop import idle_node, world  # noqa: F401 (world: the bridge tests' fixture)

KEYS = ClusterKeys.generate()
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl x@y"
GPU_NODE = {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "4"}

# Words chosen to meet: each other's prefixes, the words slurmk8s puts after
# <cluster>-, node names shaped like pod names.
WORDS = ["a", "b", "gpu", "lent", "mariadb", "slurmdbd", "controller", "login", "x", "config", "busy", "data"]
CLUSTER_NAMES = st.lists(st.sampled_from(["a", "b", "lent", "gpu", "data", "state", "x"]), min_size=1,
                         max_size=3).map("-".join)
NODE_NAMES = st.one_of(
    st.lists(st.sampled_from([*WORDS, "0", "1"]), min_size=1, max_size=4).map("-".join),
    st.lists(st.sampled_from(["gpu", "0", "lent", "a", "b-1"]), min_size=2, max_size=3).map(".".join),
)


#: Node set and volume names: a reserved word now and then (the validator refuses it, as
#: it must: those names are slurmk8s's own), so that most specs are valid and render.
SET_NAMES = st.sampled_from([w for w in WORDS if w not in RESERVED_NAMES] * 3 + WORDS)


@st.composite
def cluster_docs(draw, name=CLUSTER_NAMES):
    sets = draw(st.lists(SET_NAMES, max_size=3, unique=True))
    # A node set's name is the feature that puts a node in it: no node set lists one.
    features = {s: draw(st.lists(st.sampled_from([*WORDS, "lent_gpu", "fast", "GPU"]), max_size=2, unique=True)
                        .map(lambda fs: [f for f in fs if f.lower() not in sets]))
                for s in sets}
    spec = {
        "nodeSets": [{"name": s, "replicas": draw(st.integers(0, 2)), "features": features[s]} for s in sets],
        "partitions": [{"name": p, "nodeSets": [s for s in sets if draw(st.booleans())],
                        "acceptLentNodes": draw(st.booleans())}
                       for p in draw(st.lists(st.sampled_from(["gpu", "GPU", "cpu", "lent"]), max_size=2,
                                              unique_by=str.lower))],
        "restApi": {"enabled": draw(st.booleans())},
        "accounting": {"enabled": draw(st.booleans())},
        "login": {"users": [{"name": "alice", "uid": 3000, "sshPublicKeys": [KEY]}]},
    }
    volumes = draw(st.lists(SET_NAMES, max_size=2, unique=True))
    if volumes:
        spec["sharedStorage"] = {"volumes": [{"name": v, "mountPath": f"/v{i}", "size": "1Gi"}
                                             for i, v in enumerate(volumes)]}
    return {"apiVersion": "slurmk8s.dev/v1alpha1", "kind": "SlurmCluster",
            "metadata": {"name": draw(name), "namespace": "hpc"}, "spec": spec}


def load_or_none(doc):
    try:
        return load_cluster(doc)
    except InvalidSpec:
        return None


def object_names(cluster, lent_nodes=()) -> list[tuple[str, str, str]]:
    """(kind, namespace, name) of everything there is of ``cluster``: what the
    renderer makes, the pods and claims its StatefulSets make (every ordinal
    up to maxNodeCount would be too many; a few past the replicas stand for
    them), and the lent pods of ``lent_nodes``."""
    out = []
    for o in render(cluster, KEYS):
        meta = o["metadata"]
        out.append((o["kind"], meta["namespace"], meta["name"]))
        if o["kind"] == "StatefulSet":
            for i in range(o["spec"]["replicas"] + 3):
                out.append(("Pod", meta["namespace"], f"{meta['name']}-{i}"))
                for claim in o["spec"].get("volumeClaimTemplates", []):
                    out.append(("PersistentVolumeClaim", meta["namespace"],
                                f"{claim['metadata']['name']}-{meta['name']}-{i}"))
    out += [("Pod", cluster.namespace, names.lent_slurmd(cluster, node)) for node in lent_nodes]
    return out


def duplicates(items) -> list:
    return [k for k, n in Counter(items).items() if n > 1]


# -- properties -----------------------------------------------------------------------------


@st.composite
def two_clusters(draw):
    """Two clusters' documents; the second's name is often the first's and a word more
    (cluster ``a-lent`` beside ``a``)."""
    first = draw(cluster_docs())
    longer = st.sampled_from(WORDS).map(f"{first['metadata']['name']}-{{}}".format)
    return first, draw(cluster_docs(name=st.one_of(CLUSTER_NAMES, longer)))


@reaches(valid=0.15, prefix=0.08, lent=0.08)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(two_clusters(), st.lists(NODE_NAMES, max_size=4, unique=True))
def test_two_clusters_in_one_namespace_never_share_an_object_name(docs, nodes):
    doc1, doc2 = docs
    assume(doc1["metadata"]["name"] != doc2["metadata"]["name"])
    c1, c2 = load_or_none(doc1), load_or_none(doc2)
    assume(c1 is not None and c2 is not None)
    reached("valid")
    if c1.name.startswith(c2.name + "-") or c2.name.startswith(c1.name + "-"):
        reached("prefix")  # one cluster's names are the other's, and then some
    if nodes:
        reached("lent")
    everything = object_names(c1, nodes) + object_names(c2, nodes)
    assert not duplicates(everything)


@reaches(valid=0.4, features=0.15)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(cluster_docs())
def test_every_slurm_node_set_and_feature_names_one_node_set(doc):
    c = load_or_none(doc)
    assume(c is not None)
    reached("valid")
    if any(ns.features for ns in c.spec.node_sets):
        reached("features")
    conf = config_files(c)["slurm.conf"]
    nodeset_feature = dict(re.findall(r"^NodeSet=(\S+) Feature=(\S+)$", conf, re.M))
    assert len(nodeset_feature) == len(re.findall(r"^NodeSet=", conf, re.M)), "a node set is defined twice"
    by_feature = Counter(f.lower() for f in nodeset_feature.values())
    assert not duplicates(by_feature.elements()), "two node sets select one feature"
    for ns in c.spec.node_sets:
        registered = re.search(r"Feature=(\S+)", node_conf(c, ns)).group(1).split(",")
        member_of = {s for s, f in nodeset_feature.items() if f.lower() in {r.lower() for r in registered}}
        assert member_of == {ns.name}, f"nodes of {ns.name} register into {member_of}"
    for p in c.spec.partitions:
        if p.accept_lent_nodes:
            lent = names.lent_nodeset(p.name)
            member_of = {s for s, f in nodeset_feature.items() if f.lower() == lent.lower()}
            assert member_of == {lent}


LABEL_VALUES = st.one_of(st.sampled_from(["a", "b", "c", "a_b", "b_c", "a__b", "unlabelled", "root", "sw", ""]),
                         st.from_regex(r"[ab]([ab_.-]{0,3}[ab])?", fullmatch=True))


def _tree(text: str) -> tuple[dict[str, str], dict[str, str]]:
    """topology.conf as (switch -> its parent, node -> its leaf switch)."""
    parent, leaf = {}, {}
    for line in text.splitlines():
        m = re.fullmatch(r"SwitchName=(\S+)(?: Switches=(\S+))?(?: Nodes=(\S+))?", line)
        if not m:
            continue
        name, switches, nodes = m.groups()
        for s in (switches or "").split(",") if switches else []:
            assert s not in parent, f"switch {s} under two parents"
            parent[s] = name
        for n in nodes.split(",") if nodes else []:
            assert n not in leaf, f"node {n} under two leaves"
            leaf[n] = name
    assert len(re.findall(r"^SwitchName=", text, re.M)) == len({*parent, *parent.values(), *leaf.values()}), \
        "a switch is defined twice"
    return parent, leaf


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(LABEL_VALUES, LABEL_VALUES), min_size=1, max_size=6))
def test_switches_are_shared_exactly_by_nodes_with_the_same_labels(labels):
    c = load_cluster(minimal(slurm={"version": "24.11"}, topology={"labelKeys": ["t/spine", "t/leaf"]}))
    nodes = [TopologyNode(f"c1-n-{i}", {k: v for k, v in zip(("t/spine", "t/leaf"), pair, strict=True) if v})
             for i, pair in enumerate(labels)]
    parent, leaf = _tree(config_files(c, nodes)["topology.conf"])

    def path(pair):
        return pair if all(pair) else None  # a node lacking a label is unlabelled, at every tier

    for (i, a), (j, b) in combinations(enumerate(labels), 2):
        na, nb = f"c1-n-{i}", f"c1-n-{j}"
        assert (leaf[na] == leaf[nb]) == (path(a) == path(b)), (a, b)
        same_top = path(a) == path(b) or (path(a) and path(b) and a[0] == b[0])
        assert (parent[leaf[na]] == parent[leaf[nb]]) == bool(same_top), (a, b)


def test_the_renderer_puts_only_reserved_words_or_member_names_after_the_cluster():
    """RESERVED_NAMES holds the first word of every name after <cluster>-."""
    doc = minimal(nodeSets=[{"name": "cpu"}], partitions=[{"name": "p", "nodeSets": ["cpu"]}],
                  restApi={"enabled": True}, accounting={"enabled": True},
                  login={"users": [{"name": "alice", "uid": 3000, "sshPublicKeys": [KEY]}]},
                  sharedStorage={"volumes": [{"name": "home", "mountPath": "/home", "size": "1Gi"}]})
    c = load_cluster(doc)
    members = {"cpu", "home"}
    firsts = {re.split(r"[-.]", name[len("c1-"):])[0] for _, _, name in object_names(c, ["n"])
              if name.startswith("c1-")}
    assert firsts - members <= RESERVED_NAMES
    assert {"mariadb", "slurmdbd", "lent", "controller", "login", "restapi", "workers"} <= firsts


# -- the issue's cases ------------------------------------------------------------------------


def test_a_node_set_named_mariadb_is_refused_with_accounting_on():
    with pytest.raises(InvalidSpec) as info:
        load_cluster(minimal(nodeSets=[{"name": "mariadb"}], accounting={"enabled": True}))
    assert [e.path for e in info.value.errors] == ["spec.nodeSets[0].name"]
    assert "reserved" in info.value.errors[0].message


def test_the_lent_pod_of_cluster_a_is_not_the_worker_of_cluster_a_lent():
    a = load_cluster({**minimal(), "metadata": {"name": "a", "namespace": "hpc"}})
    a_lent = load_cluster({**minimal(nodeSets=[{"name": "gpu"}]), "metadata": {"name": "a-lent", "namespace": "hpc"}})
    workers = {name for kind, _, name in object_names(a_lent) if kind == "Pod"}
    assert "a-lent-gpu-0" in workers
    assert names.lent_slurmd(a, "gpu-0") not in workers


def test_a_409_is_success_only_when_the_pod_is_this_nodes_lent_pod(world):  # noqa: F811 - the fixture imported above
    cluster, bridge, _ = world
    # Someone else's pod holds the name the lent pod of gpu-a would have.
    taken = names.lent_slurmd("demo", "gpu-a")
    cluster.core.create_namespaced_pod("default", {"metadata": {"name": taken, "labels": {"app": "theirs"}},
                                                   "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
    idle_node(cluster, "gpu-a")
    report = bridge.round()
    assert [type(a).__name__ for a, _ in report.failed] == ["CreateSlurmdPod"], report
    assert "is not the slurmd pod of node gpu-a" in report.failed[0][1]
    assert cluster.core.read_namespaced_pod(taken, "default").metadata.labels == {"app": "theirs"}


def _pod(name: str, node: str, **labels: str) -> KubePod:
    return KubePod("hpc", name, node=node, phase="Running", labels=labels)


def test_a_pod_lent_under_the_old_name_is_found_only_if_it_says_it_is_the_nodes():
    from types import SimpleNamespace

    from slurmk8s.bridge.world import World

    lent = {"app.kubernetes.io/component": "lent-slurmd", "app.kubernetes.io/managed-by": "slurmk8s-bridge",
            "app.kubernetes.io/instance": "a"}
    old_name = names.legacy_lent_slurmd("a", "gpu-0")
    assert old_name == "a-lent-gpu-0" != names.lent_slurmd("a", "gpu-0")

    def pod_of(*pods):
        """World.slurmd_pod (the bridge's one lookup of a node's lent pod) over these pods."""
        world = SimpleNamespace(slurmd_pods={(p.namespace, p.name): p for p in pods})  # noqa: F811 - the fixture imported above
        return World.slurmd_pod(world, "hpc", "a", "gpu-0")

    ours = _pod(old_name, "gpu-0", **lent)
    assert pod_of(ours) is ours
    # Another cluster's pod of that name (a-lent's), or one on another node: not this node's.
    assert pod_of(_pod(old_name, "gpu-0", **{**lent, "app.kubernetes.io/instance": "a-lent"})) is None
    assert pod_of(_pod(old_name, "other", **lent)) is None
    new = _pod(names.lent_slurmd("a", "gpu-0"), "gpu-0", **lent)
    assert pod_of(new, ours) is new


def test_a_feature_that_names_another_node_set_is_refused():
    with pytest.raises(InvalidSpec) as info:
        load_cluster(minimal(nodeSets=[{"name": "cpu", "features": ["gpu"]}, {"name": "gpu"}],
                             partitions=[{"name": "gpu", "nodeSets": ["gpu"]}]))
    assert [e.path for e in info.value.errors] == ["spec.nodeSets[0].features[0]"]
    assert "spec.nodeSets[1]" in info.value.errors[0].message


@pytest.mark.parametrize("feature", ["lent_gpu", "LENT_cpu", "Gpu"])
def test_lent_features_and_node_set_names_in_another_case_are_refused(feature):
    with pytest.raises(InvalidSpec) as info:
        load_cluster(minimal(nodeSets=[{"name": "cpu", "features": [feature]}, {"name": "gpu"}]))
    assert [e.path for e in info.value.errors] == ["spec.nodeSets[0].features[0]"]


def test_partitions_that_differ_only_in_case_are_refused():
    with pytest.raises(InvalidSpec) as info:
        load_cluster(minimal(partitions=[{"name": "gpu", "acceptLentNodes": True},
                                         {"name": "GPU", "acceptLentNodes": True}]))
    assert [e.path for e in info.value.errors] == ["spec.partitions[1].name"]


def _switches(labels: list[dict]) -> dict[str, str]:
    c = load_cluster(minimal(slurm={"version": "24.11"}, topology={"labelKeys": ["t/spine", "t/leaf"]}))
    nodes = [TopologyNode(f"c1-n-{i}", lab) for i, lab in enumerate(labels)]
    return _tree(config_files(c, nodes)["topology.conf"])[1]


def test_labels_a_b_c_and_a_b_c_are_two_switches():
    leaf = _switches([{"t/spine": "a_b", "t/leaf": "c"}, {"t/spine": "a", "t/leaf": "b_c"}])
    assert leaf["c1-n-0"] != leaf["c1-n-1"]


@pytest.mark.parametrize("value", ["unlabelled", "root"])
def test_a_label_value_is_not_a_switch_of_slurmk8s_own(value):
    leaf = _switches([{"t/spine": value, "t/leaf": value}, {}, {"t/spine": "x", "t/leaf": "y"}])
    assert len(set(leaf.values())) == 3


def test_an_account_named_like_a_user_in_no_account_is_refused():
    users = [{"name": "alice", "uid": 3000, "sshPublicKeys": [KEY]}, {"name": "bob", "uid": 3001, "sshPublicKeys": [KEY]}]
    with pytest.raises(InvalidSpec) as info:
        load_cluster(minimal(login={"users": users}, accounting={
            "enabled": True, "accounts": [{"name": "alice", "users": ["bob"]}]}))
    assert [e.path for e in info.value.errors] == ["spec.accounting.accounts[0].name"]
    # Listing the user in the account makes it the user's own: accepted.
    load_cluster(minimal(login={"users": users}, accounting={
        "enabled": True, "accounts": [{"name": "alice", "users": ["alice", "bob"]}]}))


def test_a_user_whose_name_is_no_account_name_needs_an_account():
    users = [{"name": "_svc", "uid": 3000, "sshPublicKeys": [KEY]}]
    with pytest.raises(InvalidSpec) as info:
        load_cluster(minimal(login={"users": users}, accounting={"enabled": True}))
    assert [e.path for e in info.value.errors] == ["spec.login.users[0].name"]
    load_cluster(minimal(login={"users": users}, accounting={"enabled": True, "accounts": [
        {"name": "svc", "users": ["_svc"]}]}))


@pytest.mark.parametrize("node", ["c1-gpu-0", "c1-controller-0", "c1-x9-12"])
def test_a_node_named_like_the_clusters_own_slurm_nodes_is_not_lent(node):
    with pytest.raises(UnlendableNode, match="shape of the names"):
        lent_node("c1", node, GPU_NODE, {}, "gpu")


@pytest.mark.parametrize("node", ["c1-gpu", "c2-gpu-0", "c1-gpu-0.example.com", "gpu-0"])
def test_other_node_names_are_lent(node):
    assert lent_node("c1", node, GPU_NODE, {}, "gpu").name == node


def test_a_long_lent_pod_name_stays_a_valid_and_distinct_name():
    node = "n" * 250
    a, b = names.lent_slurmd("a", node), names.lent_slurmd("a-lent", node)
    assert len(a) <= 253 and len(b) <= 253 and a != b and "." in a


def test_the_lent_pod_is_named_by_the_renderer_and_found_by_that_name():
    c = load_cluster(minimal(partitions=[{"name": "gpu", "acceptLentNodes": True}]))
    pod = lent_slurmd_pod(c, "", node="gpu-0", resources=GPU_NODE, labels={}, partition="gpu", shm_size="1Gi",
                          taint_key="t")
    assert pod["metadata"]["name"] == names.lent_slurmd(c, "gpu-0") == "c1-lent.gpu-0"


@pytest.mark.parametrize(("name", "ordinal"), [
    ("demo-cpu-0", 0), ("demo-cpu-12", 12), ("demo-cpu-012", None), ("demo-cpu-²", None),
    ("demo-cpu-٣", None), ("demo-cpu-", None), ("demo-cpu-1-2", None), ("demo-cpux-1", None),
    ("demo-cpu-99999999999", None), ("other-cpu-1", None),
])
def test_a_worker_s_name_is_read_one_way(name: str, ordinal: int | None) -> None:
    """The one reading of ``<statefulset>-<ordinal>`` (the operator's pods and its
    Slurm nodes): ASCII digits as the StatefulSet controller writes them, or nothing."""
    assert names.worker_ordinal("demo-cpu", name) == ordinal
