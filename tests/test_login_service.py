"""The login Service (spec.login.service): annotations for the cloud's load
balancer, loadBalancerSourceRanges and externalTrafficPolicy, rendered
(slurmk8s/render/login.py) and refused with their field paths
(slurmk8s/api/validate.py); spec.network.sshFrom behind a NodePort or
LoadBalancer Service keeps the clients' addresses (Local) or is refused.
Pure: no server."""

from __future__ import annotations

import kubernetes_validate
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox.apiserver.selectors import valid_label_key
from slurmk8s.api import InvalidSpec, load_cluster
from slurmk8s.api.cluster import ANNOTATIONS_MAX_BYTES
from slurmk8s.render import names, render

from .conftest import minimal
from .reach import reached, reaches

BLOCK = "192.0.2.0/24"
#: The internal load balancer of each cloud, as docs/install.md gives them.
INTERNAL = {
    "service.beta.kubernetes.io/aws-load-balancer-scheme": "internal",
    "networking.gke.io/load-balancer-type": "Internal",
    "service.beta.kubernetes.io/azure-load-balancer-internal": "true",
}


def cluster_doc(service: dict | None = None, **network) -> dict:
    return minimal(partitions=[{"name": "cpu"}], login={"service": service or {}}, network=network)


def login_service(doc: dict, keys) -> dict:
    c = load_cluster(doc)
    [svc] = [o for o in render(c, keys) if o["kind"] == "Service" and o["metadata"]["name"] == names.login(c)]
    kubernetes_validate.validate(svc, kubernetes_validate.latest_version(), strict=True)
    return svc


def errors_of(doc: dict) -> list[str]:
    with pytest.raises(InvalidSpec) as info:
        load_cluster(doc)
    return [str(e) for e in info.value.errors]


@pytest.mark.parametrize("kind", ["LoadBalancer", "NodePort"])
def test_ssh_from_behind_a_node_port_or_load_balancer_keeps_the_clients_addresses(keys, kind):
    svc = login_service(cluster_doc({"type": kind}, sshFrom=[BLOCK]), keys)
    assert svc["spec"]["externalTrafficPolicy"] == "Local"
    # The login pods' NetworkPolicy admits SSH from the block, which Local lets it see.
    c = load_cluster(cluster_doc({"type": kind}, sshFrom=[BLOCK]))
    [pol] = [o for o in render(c, keys) if o["kind"] == "NetworkPolicy"
             and o["metadata"]["name"] == names.network_policy(c, "login")]
    assert {"ipBlock": {"cidr": BLOCK}} in [p for r in pol["spec"]["ingress"] for p in r.get("from", [])]
    # Said explicitly, the same.
    assert login_service(cluster_doc({"type": kind, "externalTrafficPolicy": "Local"}, sshFrom=[BLOCK]),
                         keys)["spec"]["externalTrafficPolicy"] == "Local"


def test_without_an_enforced_ssh_from_the_policy_is_the_spec_s_or_kubernetes_default(keys):
    def policy(service: dict, **network) -> str | None:
        return login_service(cluster_doc(service, **network), keys)["spec"].get("externalTrafficPolicy")

    assert policy({"type": "LoadBalancer"}) is None  # Kubernetes' default, Cluster
    assert policy({"type": "LoadBalancer"}, sshFrom=[BLOCK], policies=False) is None  # no NetworkPolicy to feed
    assert policy({"type": "ClusterIP"}, sshFrom=[BLOCK]) is None  # Kubernetes takes none on a ClusterIP Service
    assert policy({"type": "NodePort", "externalTrafficPolicy": "Cluster"}) == "Cluster"
    assert policy({"type": "LoadBalancer", "externalTrafficPolicy": "Local"}) == "Local"
    assert policy({"type": "LoadBalancer", "externalTrafficPolicy": "Cluster"}, sshFrom=[BLOCK],
                  policies=False) == "Cluster"


@pytest.mark.parametrize("kind", ["LoadBalancer", "NodePort"])
def test_cluster_with_an_enforced_ssh_from_is_refused_with_the_reason(kind):
    [error] = errors_of(cluster_doc({"type": kind, "externalTrafficPolicy": "Cluster"}, sshFrom=[BLOCK]))
    path, _, reason = error.partition(": ")
    assert path == "spec.login.service.externalTrafficPolicy"
    assert reason.startswith("Cluster hands SSH connections on with a node's address in place of the client's")
    assert "use Local (or leave it unset" in reason and "or empty spec.network.sshFrom" in reason


def test_annotations_and_source_ranges_reach_the_service_beside_the_operators_own(keys):
    svc = login_service(cluster_doc({"type": "LoadBalancer", "annotations": INTERNAL,
                                     "loadBalancerSourceRanges": ["10.0.0.0/8", "2001:db8::/32"]}), keys)
    annotations = svc["metadata"]["annotations"]
    assert {k: annotations[k] for k in INTERNAL} == INTERNAL
    assert names.CONFIG_HASH in annotations
    assert svc["spec"]["loadBalancerSourceRanges"] == ["10.0.0.0/8", "2001:db8::/32"]
    # Without them, the Service is as before.
    plain = login_service(cluster_doc({"type": "LoadBalancer"}), keys)
    assert set(plain["metadata"]["annotations"]) == {names.CONFIG_HASH}
    assert "loadBalancerSourceRanges" not in plain["spec"]


@pytest.mark.parametrize("service,network,path,reason", [
    ({"externalTrafficPolicy": "Local"}, {}, "spec.login.service.externalTrafficPolicy",
     "applies only to a NodePort or LoadBalancer Service (Kubernetes refuses it on type ClusterIP)"),
    ({"type": "NodePort", "loadBalancerSourceRanges": [BLOCK]}, {}, "spec.login.service.loadBalancerSourceRanges",
     "applies only to a LoadBalancer Service (Kubernetes refuses it on type NodePort)"),
    ({"type": "LoadBalancer", "loadBalancerSourceRanges": ["10.0.0.1/8"]}, {},
     "spec.login.service.loadBalancerSourceRanges[0]", "is not an address block"),
    ({"type": "LoadBalancer", "externalTrafficPolicy": "Random"}, {}, "spec.login.service.externalTrafficPolicy",
     "'Random' is not allowed"),
    ({"annotations": {"bad key": "x"}}, {}, "spec.login.service.annotations.bad key", "is not a qualified name"),
    ({"annotations": {"a/b/c": "x"}}, {}, "spec.login.service.annotations.a/b/c", "is not a DNS subdomain"),
    ({"annotations": {"x" * 64: "x"}}, {}, f"spec.login.service.annotations.{'x' * 64}", "is not a qualified name"),
    ({"annotations": {"a" * 254 + "/x": "x"}}, {}, f"spec.login.service.annotations.{'a' * 254}/x",
     "is not a DNS subdomain of at most 253 characters"),
    ({"annotations": {"x\n": "x"}}, {}, "spec.login.service.annotations.x\\n", "contains a newline"),
    ({"annotations": {"a": "multi\nline"}}, {}, "spec.login.service.annotations.a",
     "contains a newline; an annotation value here is one line of printable text"),
    ({"annotations": {"a": "bidi\u202e"}}, {}, "spec.login.service.annotations.a", "invisible or control character"),
    ({"annotations": {"slurmk8s.dev/config-hash": "x"}}, {}, "spec.login.service.annotations",
     "is under slurmk8s.dev/, where the operator writes its own annotations"),
    ({"annotations": {"login.slurmk8s.dev/x": "x"}}, {}, "spec.login.service.annotations", "is under slurmk8s.dev/"),
    ({"annotations": {"a": "x" * ANNOTATIONS_MAX_BYTES}}, {}, "spec.login.service.annotations",
     f"keys and values take {ANNOTATIONS_MAX_BYTES + 1} bytes; Kubernetes allows at most {ANNOTATIONS_MAX_BYTES}"),
    ({"annotations": {f"k{i}": "" for i in range(65)}}, {}, "spec.login.service.annotations", "at most 64"),
])
def test_bad_service_fields_are_refused_by_field_path(service, network, path, reason):
    errors = errors_of(cluster_doc(service, **network))
    assert any(e.startswith(f"{path}: ") and reason in e for e in errors), errors


def test_annotation_keys_kubernetes_takes_are_taken(keys):
    taken = {"Example.COM/Name_1.x": "", "a": "x" * 1000, "a" * 253 + "/" + "b" * 63: "10.0.0.0/8, 192.0.2.0/24",
             "service.beta.kubernetes.io/aws-load-balancer-additional-resource-tags": "team=hpc,cost=gpu é"}
    svc = login_service(cluster_doc({"type": "LoadBalancer", "annotations": taken}), keys)
    assert {k: svc["metadata"]["annotations"][k] for k in taken} == taken


def _label(draw, alphabet: str, size: int) -> str:
    """``size`` characters of ``alphabet`` and '-', starting and ending with one of ``alphabet``."""
    ends = st.sampled_from(alphabet)
    if size == 1:
        return draw(ends)
    return draw(ends) + draw(st.text(alphabet=alphabet + "-", min_size=size - 2, max_size=size - 2)) + draw(ends)


@st.composite
def annotation_keys(draw) -> str:
    """Keys near Kubernetes' rule on every side: upper-case prefixes, names and
    prefixes at and past their lengths, an extra slash, characters it refuses."""
    lower, mixed = "abcdefghijklmnopqrstuvwxyz0123456789", "abcXYZ0189"
    name = _label(draw, mixed + "_.", draw(st.sampled_from([1, 8, 63, 64])))
    key = name
    if draw(st.booleans()):
        alphabet = draw(st.sampled_from([lower, "aBcD09"]))
        size = draw(st.sampled_from([4, 4, 50, 63, 64]))
        key = ".".join(_label(draw, alphabet, size) for _ in range(draw(st.integers(1, 5)))) + "/" + name
    mutation = draw(st.sampled_from(["none"] * 6 + ["slash", "space", "newline", "dash-end", "empty-name"]))
    key = {"none": key, "slash": key + "/x", "space": key.replace(key[len(key) // 2], " ", 1),
           "newline": key + "\n", "dash-end": key + "-", "empty-name": key.rpartition("/")[0] + "/"}[mutation]
    return key


@reaches(accepted=0.1, refused=0.3, upper_prefix=0.05, too_long=0.1)
@settings(max_examples=400, deadline=None)
@given(annotation_keys())
def test_annotation_keys_are_judged_as_kubernetes_judges_them(key):
    """The validator takes exactly the annotation keys the API stand-in's
    metadata check (Kubernetes' IsQualifiedName of the lower-cased key) takes."""
    kubernetes = valid_label_key(key.lower())
    try:
        load_cluster(cluster_doc({"annotations": {key: "v"}}))
        ours = True
    except InvalidSpec:
        ours = False
    assert ours == kubernetes, (key, ours)
    reached("accepted" if ours else "refused")
    prefix, _, name = key.rpartition("/")
    if ours and prefix != prefix.lower():
        reached("upper_prefix")
    if len(name) > 63 or len(prefix) > 253:
        reached("too_long")
