"""Authentication, RBAC, impersonation, the review APIs and the audit log,
through the official kubernetes client and kubectl."""

from __future__ import annotations

import copy
import json
import ssl
import urllib.error
import urllib.request

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from slurmk8s.sandbox.apiserver import audit

from .conftest import Cluster, wait_for

RBAC = "rbac.authorization.k8s.io"


def kubeconfig_with_token(cluster: Cluster, token: str, name: str) -> str:
    kc = copy.deepcopy(cluster.srv.kubeconfig())
    kc["users"][0]["user"]["token"] = token
    path = cluster.workdir / f"kubeconfig-{name}"
    path.write_text(yaml.safe_dump(kc))
    return str(path)


def client_for(cluster: Cluster, token: str, name: str = "sa") -> client.ApiClient:
    return config.new_client_from_config(config_file=kubeconfig_with_token(cluster, token, name))


def service_account(cluster: Cluster, ns: str, name: str) -> dict:
    return cluster.api_client.sanitize_for_serialization(
        cluster.core.create_namespaced_service_account(ns, {"metadata": {"name": name}}))


def grant(cluster: Cluster, ns: str, sa: str, rules: list[dict], name: str = "r") -> None:
    rbac = client.RbacAuthorizationV1Api(cluster.api_client)
    rbac.create_namespaced_role(ns, {"metadata": {"name": name}, "rules": rules})
    rbac.create_namespaced_role_binding(ns, {"metadata": {"name": name},
                                             "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": name},
                                             "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]})


def raw(cluster: Cluster, method: str, path: str, token: str | None, body: dict | None = None, headers: dict | None = None):
    ctx = ssl.create_default_context(cafile=str(cluster.srv.ca_path))
    req = urllib.request.Request(cluster.srv.url + path, method=method, data=json.dumps(body).encode() if body is not None else None)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    req.add_header("Content-Type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
            return r.status, json.loads(r.read() or b"null") if r.headers.get("Content-Type", "").startswith("application/json") else r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_a_service_account_without_a_role_gets_the_kubernetes_403(cluster: Cluster, ns: str) -> None:
    service_account(cluster, ns, "reader")
    api = client.CoreV1Api(client_for(cluster, cluster.srv.issue_token(ns, "reader")))
    with pytest.raises(ApiException) as e:
        api.list_namespaced_secret(ns)
    assert e.value.status == 403
    status = json.loads(e.value.body)
    assert status["reason"] == "Forbidden"
    assert status["message"] == (f'secrets is forbidden: User "system:serviceaccount:{ns}:reader" cannot list resource "secrets" '
                                 f'in API group "" in the namespace "{ns}"')
    assert status["details"] == {"kind": "secrets"}
    with pytest.raises(ApiException) as e:
        api.read_namespaced_secret("s", ns)
    assert json.loads(e.value.body)["details"] == {"name": "s", "kind": "secrets"}
    assert json.loads(e.value.body)["message"].startswith('secrets "s" is forbidden: User ')
    with pytest.raises(ApiException) as e:
        api.list_node()
    assert json.loads(e.value.body)["message"].endswith('cannot list resource "nodes" in API group "" at the cluster scope')


def test_a_role_grants_exactly_its_verbs(cluster: Cluster, ns: str) -> None:
    service_account(cluster, ns, "op")
    grant(cluster, ns, "op", [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create", "delete"]}])
    api = client.CoreV1Api(client_for(cluster, cluster.srv.issue_token(ns, "op")))
    api.create_namespaced_secret(ns, {"metadata": {"name": "s"}, "stringData": {"k": "v"}})
    assert api.read_namespaced_secret("s", ns).data == {"k": "dg=="}
    with pytest.raises(ApiException) as e:
        api.list_namespaced_secret(ns)  # the chart's old Role: get/create/delete only
    assert e.value.status == 403
    with pytest.raises(ApiException) as e:
        api.patch_namespaced_secret("s", ns, {"metadata": {"labels": {"a": "b"}}})
    assert e.value.status == 403
    api.delete_namespaced_secret("s", ns)


def test_self_subject_access_review_and_subject_access_review(cluster: Cluster, ns: str) -> None:
    service_account(cluster, ns, "sar")
    grant(cluster, ns, "sar", [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}])
    authz = client.AuthorizationV1Api(client_for(cluster, cluster.srv.issue_token(ns, "sar")))
    review = authz.create_self_subject_access_review(
        {"spec": {"resourceAttributes": {"namespace": ns, "verb": "list", "resource": "configmaps"}}})
    assert review.status.allowed is True
    assert review.status.reason == f'RBAC: allowed by RoleBinding "r/{ns}" of Role "r" to ServiceAccount "sar/{ns}"'
    review = authz.create_self_subject_access_review(
        {"spec": {"resourceAttributes": {"namespace": ns, "verb": "watch", "resource": "configmaps"}}})
    assert review.status.allowed is False
    admin = client.AuthorizationV1Api(cluster.api_client)
    sar = admin.create_subject_access_review({"spec": {"user": f"system:serviceaccount:{ns}:sar",
                                                       "groups": ["system:serviceaccounts", "system:authenticated"],
                                                       "resourceAttributes": {"namespace": ns, "verb": "list", "resource": "configmaps"}}})
    assert sar.status.allowed is True
    sar = admin.create_subject_access_review({"spec": {"user": "nobody", "nonResourceAttributes": {"path": "/api", "verb": "get"}}})
    assert sar.status.allowed is False
    lsar = admin.create_namespaced_local_subject_access_review(ns, {"spec": {"user": f"system:serviceaccount:{ns}:sar",
                                                                            "resourceAttributes": {"namespace": ns, "verb": "list", "resource": "configmaps"}}})
    assert lsar.status.allowed is True
    with pytest.raises(ApiException) as e:
        authz.create_subject_access_review({"spec": {"user": "x", "resourceAttributes": {"verb": "get", "resource": "pods"}}})
    assert e.value.status == 403  # SubjectAccessReview needs its own grant


def test_rbac_objects_are_served_with_bootstrap_policy(cluster: Cluster) -> None:
    rbac = client.RbacAuthorizationV1Api(cluster.api_client)
    names = {cr.metadata.name for cr in rbac.list_cluster_role().items}
    assert {"cluster-admin", "admin", "edit", "view", "system:discovery", "system:basic-user",
            "system:public-info-viewer", "system:node"} <= names
    binding = rbac.read_cluster_role_binding("system:node")
    assert binding.metadata.labels == {"kubernetes.io/bootstrapping": "rbac-defaults"}
    assert [(s.kind, s.name) for s in binding.subjects] == [("Group", "system:nodes")]
    out = cluster.kubectl("get", "clusterrolebindings", "cluster-admin", "-o", "wide").stdout
    assert "ClusterRole/cluster-admin" in out and "system:masters" in out
    with pytest.raises(ApiException) as e:
        rbac.create_cluster_role_binding({"metadata": {"name": "bad"}, "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": "x"},
                                          "subjects": [{"kind": "ServiceAccount", "name": "x"}]})
    assert e.value.status == 422
    assert "roleRef.kind" in e.value.body and "subjects[0].namespace" in e.value.body
