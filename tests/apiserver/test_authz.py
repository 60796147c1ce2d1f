"""Authentication, RBAC, impersonation, the review APIs and the audit log,
through the official kubernetes client and kubectl.

Over 500 lines because each request path (authentication, RBAC, impersonation, reviews,
audit) needs its own setup of users and roles.
"""

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

from sandbox.apiserver import audit

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


def test_the_aggregation_controller_builds_admin_edit_and_view(cluster: Cluster, ns: str) -> None:
    """As Kubernetes' clusterrole-aggregation controller: admin, edit and view
    hold the rules of the ClusterRoles labelled into them (view's into edit,
    edit's into admin), recomputed when one is created, changed or deleted,
    and a hand edit of an aggregated role's rules is undone."""
    rbac = client.RbacAuthorizationV1Api(cluster.api_client)
    authz = client.AuthorizationV1Api(cluster.api_client)

    def rules(name: str) -> list[dict]:
        return cluster.api_client.sanitize_for_serialization(rbac.read_cluster_role(name)).get("rules") or []

    def holds(name: str, wanted: list[dict]) -> bool:
        have = rules(name)
        return all(r in have for r in wanted)

    view_part, edit_part = rules("system:aggregate-to-view"), rules("system:aggregate-to-edit")
    assert view_part and edit_part and rules("system:aggregate-to-admin")
    wait_for("view from system:aggregate-to-view", lambda: rules("view") == view_part)
    wait_for("edit from view and system:aggregate-to-edit", lambda: holds("edit", view_part + edit_part))
    wait_for("admin from edit and system:aggregate-to-admin",
             lambda: holds("admin", view_part + edit_part + rules("system:aggregate-to-admin")))
    assert not holds("view", edit_part[:1]) and not holds("edit", rules("system:aggregate-to-admin")[:1])

    for role in ("view", "edit"):
        rbac.create_namespaced_role_binding(ns, {"metadata": {"name": role}, "roleRef": {
            "apiGroup": RBAC, "kind": "ClusterRole", "name": role}, "subjects": [
            {"apiGroup": RBAC, "kind": "User", "name": f"{role}-user"}]})

    def may(user: str, verb: str) -> bool:
        review = authz.create_subject_access_review({"spec": {"user": user, "groups": ["system:authenticated"],
                                                              "resourceAttributes": {"namespace": ns, "verb": verb,
                                                                                     "group": "example.com",
                                                                                     "resource": "widgets"}}})
        return bool(review.status.allowed)

    widgets = {"apiGroups": ["example.com"], "resources": ["widgets"], "verbs": ["get"]}
    assert not may("view-user", "get") and not may("edit-user", "get")
    rbac.create_cluster_role({"metadata": {"name": "widgets-view", "labels": {
        "rbac.authorization.k8s.io/aggregate-to-view": "true"}}, "rules": [widgets]})
    try:
        wait_for("the new rule in view, edit and admin", lambda: all(holds(r, [widgets]) for r in ("view", "edit", "admin")))
        assert may("view-user", "get") and may("edit-user", "get") and not may("edit-user", "list")
        changed = dict(widgets, verbs=["get", "list"])
        body = cluster.api_client.sanitize_for_serialization(rbac.read_cluster_role("widgets-view"))
        rbac.replace_cluster_role("widgets-view", dict(body, rules=[changed]))
        wait_for("the changed rule in admin", lambda: holds("admin", [changed]) and not holds("admin", [widgets]))
        assert may("edit-user", "list")
        view = cluster.api_client.sanitize_for_serialization(rbac.read_cluster_role("view"))
        rbac.replace_cluster_role("view", dict(view, rules=[]))
        wait_for("view's rules put back", lambda: rules("view") == view_part + [changed])
    finally:
        rbac.delete_cluster_role("widgets-view")
    wait_for("the deleted role's rule gone from admin", lambda: not holds("admin", [changed]))
    assert not may("view-user", "get") and not may("edit-user", "list")


# --- ServiceAccount admission ---------------------------------------------------------


def test_service_account_admission_mounts_the_token_volume(cluster: Cluster, ns: str) -> None:
    pod = cluster.api_client.sanitize_for_serialization(cluster.core.create_namespaced_pod(ns, {
        "metadata": {"name": "p"},
        "spec": {"initContainers": [{"name": "init", "image": "busybox:1.36"}],
                 "containers": [{"name": "main", "image": "busybox:1.36", "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                 "volumes": [{"name": "data", "emptyDir": {}}]}}))
    spec = pod["spec"]
    assert spec["serviceAccountName"] == spec["serviceAccount"] == "default"
    token_volume = spec["volumes"][-1]
    assert token_volume["name"].startswith("kube-api-access-") and len(token_volume["name"]) == len("kube-api-access-") + 5
    assert token_volume["projected"] == {"defaultMode": 420, "sources": [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}
    mount = {"name": token_volume["name"], "readOnly": True, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}
    assert spec["containers"][0]["volumeMounts"] == [{"name": "data", "mountPath": "/data"}, mount]
    assert spec["initContainers"][0]["volumeMounts"] == [mount]


def test_service_account_admission_refuses_a_missing_account_and_honours_automount(cluster: Cluster, ns: str) -> None:
    with pytest.raises(ApiException) as e:
        cluster.pod(ns, "p", serviceAccountName="ghost")
    assert e.value.status == 403
    assert json.loads(e.value.body)["message"] == (
        f'pods "p" is forbidden: error looking up service account {ns}/ghost: serviceaccount "ghost" not found')
    cluster.core.create_namespaced_service_account(ns, {"metadata": {"name": "quiet"}, "automountServiceAccountToken": False})
    quiet = cluster.pod(ns, "q", serviceAccountName="quiet")
    assert not quiet.spec.volumes and not quiet.spec.containers[0].volume_mounts
    loud = cluster.pod(ns, "l", serviceAccountName="quiet", automountServiceAccountToken=True)
    assert loud.spec.volumes[0].name.startswith("kube-api-access-")
    off = cluster.pod(ns, "o", automountServiceAccountToken=False)
    assert not off.spec.volumes


def test_a_pod_created_right_after_its_namespace_is_admitted(cluster: Cluster) -> None:
    for _ in range(5):
        ns = cluster.namespace("fast")
        assert cluster.pod(ns, "p").spec.service_account_name == "default"


def test_workload_controllers_retry_until_the_service_account_exists(cluster: Cluster, ns: str) -> None:
    cluster.apps.create_namespaced_deployment(ns, {
        "metadata": {"name": "d"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "d"}},
                 "template": {"metadata": {"labels": {"app": "d"}},
                              "spec": {"serviceAccountName": "late", "containers": [{"name": "c", "image": "busybox:1.36"}]}}}})
    import time

    time.sleep(0.5)
    assert cluster.core.list_namespaced_pod(ns).items == []
    service_account(cluster, ns, "late")
    pods = wait_for("the ReplicaSet controller to create the pod once the account exists",
                    lambda: cluster.core.list_namespaced_pod(ns).items, timeout=15)
    assert pods[0].spec.service_account_name == "late"
    cluster.apps.create_namespaced_stateful_set(ns, {
        "metadata": {"name": "s"},
        "spec": {"replicas": 1, "serviceName": "s", "selector": {"matchLabels": {"app": "s"}},
                 "template": {"metadata": {"labels": {"app": "s"}},
                              "spec": {"serviceAccountName": "later", "containers": [{"name": "c", "image": "busybox:1.36"}]}}}})
    time.sleep(0.5)
    assert [p.metadata.name for p in cluster.core.list_namespaced_pod(ns, label_selector="app=s").items] == []
    service_account(cluster, ns, "later")
    wait_for("the StatefulSet controller to create s-0 once the account exists",
             lambda: cluster.core.list_namespaced_pod(ns, label_selector="app=s").items, timeout=15)


# --- authentication ---------------------------------------------------------------------


def test_the_kubelet_identity_is_a_node(cluster: Cluster, ns: str) -> None:
    path = cluster.srv.write_kubeconfig(cluster.workdir / "kubelet.kubeconfig", identity="kubelet")
    kc = yaml.safe_load(path.read_text())
    assert kc["users"][0]["user"]["token"] == cluster.srv.kubelet_token != cluster.srv.token
    kubelet = config.new_client_from_config(config_file=str(path))
    me = client.AuthenticationV1Api(kubelet).create_self_subject_review({})
    assert me.status.user_info.username == "system:node:sandbox"
    assert me.status.user_info.groups == ["system:nodes", "system:authenticated"]
    core = client.CoreV1Api(kubelet)
    core.list_pod_for_all_namespaces()
    cluster.pod(ns, "p")
    core.patch_namespaced_pod_status("p", ns, {"status": {"phase": "Running"}})
    with pytest.raises(ApiException) as e:
        core.delete_namespace(ns)
    assert e.value.status == 403
    rows = (cluster.srv.data_dir / "tokens.csv").read_text().splitlines()
    assert [r.split(",")[1:] for r in rows] == [["sandbox-admin", "sandbox-admin", "system:masters"],
                                                 ["system:node:sandbox", "system:node:sandbox", "system:nodes"]]
    assert (cluster.srv.data_dir / "tokens.csv").stat().st_mode & 0o777 == 0o600


def test_admin_whoami_and_unauthenticated_health(cluster: Cluster) -> None:
    out = cluster.kubectl("auth", "whoami", "-o", "json")
    info = json.loads(out.stdout)["status"]["userInfo"]
    assert info["username"] == "sandbox-admin" and "system:masters" in info["groups"]
    for path in ("/healthz", "/livez", "/readyz", "/version"):
        code, _ = raw(cluster, "GET", path, None)
        assert code == 200, path
    code, status = raw(cluster, "GET", "/api", None)
    assert code == 401 and status["reason"] == "Unauthorized"
    code, status = raw(cluster, "GET", "/healthz", "not-a-token")
    assert code == 401


def token_request(cluster: Cluster, ns: str, sa: str, **spec) -> dict:
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
    code, out = raw(cluster, "POST", f"/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token", cluster.srv.token, body)
    assert code == 201, out
    return out


def whoami(cluster: Cluster, token: str):
    return raw(cluster, "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", token,
               {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})


def test_token_request_issues_kubernetes_shaped_tokens(cluster: Cluster, ns: str) -> None:
    from sandbox.apiserver.authn import _unb64

    sa = service_account(cluster, ns, "bot")
    out = token_request(cluster, ns, "bot")
    assert out["kind"] == "TokenRequest" and out["spec"]["expirationSeconds"] == 3600
    assert out["spec"]["audiences"] == ["https://kubernetes.default.svc.cluster.local"]
    token = out["status"]["token"]
    claims = json.loads(_unb64(token.split(".")[1]))
    assert claims["sub"] == f"system:serviceaccount:{ns}:bot"
    assert claims["iss"] == "https://kubernetes.default.svc.cluster.local" and claims["exp"] - claims["iat"] == 3600
    assert claims["kubernetes.io"] == {"namespace": ns, "serviceaccount": {"name": "bot", "uid": sa["metadata"]["uid"]}}
    code, me = whoami(cluster, token)
    assert code == 201
    assert me["status"]["userInfo"]["username"] == f"system:serviceaccount:{ns}:bot"
    assert me["status"]["userInfo"]["groups"] == ["system:serviceaccounts", f"system:serviceaccounts:{ns}", "system:authenticated"]
    # too short, unknown account
    code, status = raw(cluster, "POST", f"/api/v1/namespaces/{ns}/serviceaccounts/bot/token", cluster.srv.token,
                       {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 60}})
    assert code == 422 and "spec.expirationSeconds" in status["message"]
    code, _ = raw(cluster, "POST", f"/api/v1/namespaces/{ns}/serviceaccounts/nobody/token", cluster.srv.token, {"spec": {}})
    assert code == 404
    # deleting the account invalidates its tokens; a new account of the same name does not revive them
    cluster.core.delete_namespaced_service_account("bot", ns)
    assert whoami(cluster, token)[0] == 401
    service_account(cluster, ns, "bot")
    assert whoami(cluster, token)[0] == 401


def test_a_pod_bound_token_dies_with_its_pod(cluster: Cluster, ns: str) -> None:
    service_account(cluster, ns, "runner")
    pod = cluster.pod(ns, "p", serviceAccountName="runner")
    out = token_request(cluster, ns, "runner", audiences=["https://kubernetes.default.svc.cluster.local", "slurm"],
                        expirationSeconds=3607, boundObjectRef={"kind": "Pod", "apiVersion": "v1", "name": "p", "uid": pod.metadata.uid})
    token = out["status"]["token"]
    code, me = whoami(cluster, token)
    assert code == 201
    assert me["status"]["userInfo"]["extra"]["authentication.kubernetes.io/pod-name"] == ["p"]
    review = client.AuthenticationV1Api(cluster.api_client).create_token_review({"spec": {"token": token, "audiences": ["slurm"]}})
    assert review.status.authenticated and review.status.user.username == f"system:serviceaccount:{ns}:runner"
    review = client.AuthenticationV1Api(cluster.api_client).create_token_review({"spec": {"token": token, "audiences": ["other"]}})
    assert review.status.authenticated is False
    code, status = raw(cluster, "POST", f"/api/v1/namespaces/{ns}/serviceaccounts/runner/token", cluster.srv.token,
                       {"spec": {"boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "p", "uid": "wrong"}}})
    assert code == 409
    cluster.core.delete_namespaced_pod("p", ns, grace_period_seconds=0)
    assert whoami(cluster, token)[0] == 401


def test_expired_and_foreign_audience_tokens_are_refused(cluster: Cluster, ns: str) -> None:
    import time

    from sandbox.apiserver import authn

    sa = service_account(cluster, ns, "old")
    key = authn.load_or_create_key(cluster.srv.data_dir / "pki" / "sa.key")
    now = int(time.time())

    def token(**kw) -> str:
        args = dict(issuer=authn.ISSUER, audiences=[authn.ISSUER], now=now, expiration=3600, namespace=ns,
                    sa_name="old", sa_uid=sa["metadata"]["uid"])
        args.update(kw)
        return authn.sign(key, authn.service_account_claims(**args))

    assert whoami(cluster, token())[0] == 201
    assert whoami(cluster, token(now=now - 7200))[0] == 401
    assert whoami(cluster, token(audiences=["vault"]))[0] == 401
    assert whoami(cluster, token(issuer="https://elsewhere"))[0] == 401
    other_key = authn.load_or_create_key(cluster.workdir / "other.key")
    forged = authn.sign(other_key, authn.service_account_claims(issuer=authn.ISSUER, audiences=[authn.ISSUER], now=now,
                                                                 expiration=3600, namespace=ns, sa_name="old", sa_uid=sa["metadata"]["uid"]))
    assert whoami(cluster, forged)[0] == 401


# --- impersonation and kubectl auth ------------------------------------------------------


def test_impersonation_needs_the_impersonate_verb(cluster: Cluster, ns: str) -> None:
    service_account(cluster, ns, "plain")
    token = cluster.srv.issue_token(ns, "plain")
    code, status = raw(cluster, "GET", f"/api/v1/namespaces/{ns}/pods", token, headers={"Impersonate-User": "alice"})
    assert code == 403
    assert status["message"] == (f'users "alice" is forbidden: User "system:serviceaccount:{ns}:plain" cannot impersonate '
                                 'resource "users" in API group "" at the cluster scope')
    grant(cluster, ns, "plain", [{"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["impersonate"], "resourceNames": ["target"]}],
          name="imp")
    code, me = raw(cluster, "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", token,
                   {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
                   headers={"Impersonate-User": f"system:serviceaccount:{ns}:target"})
    assert code == 201
    assert me["status"]["userInfo"] == {"username": f"system:serviceaccount:{ns}:target",
                                        "groups": ["system:serviceaccounts", f"system:serviceaccounts:{ns}", "system:authenticated"]}
    code, _ = raw(cluster, "GET", "/api", token, headers={"Impersonate-User": f"system:serviceaccount:{ns}:target",
                                                           "Impersonate-Group": "system:masters"})
    assert code == 403
    code, _ = raw(cluster, "GET", "/api", token, headers={"Impersonate-Group": "system:masters"})
    assert code == 400
    line = next(ln for ln in audit.read(cluster.srv.audit_path)
                if ln.get("user") == f"system:serviceaccount:{ns}:plain" and ln.get("verb") == "impersonate" and ln.get("resource") == "users")
    assert line == dict(line, code=403, name="alice", apiGroup="")


def test_kubectl_auth_can_i_as_a_service_account(cluster: Cluster, ns: str) -> None:
    service_account(cluster, ns, "op")
    grant(cluster, ns, "op", [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create"]},
                              {"apiGroups": ["apps"], "resources": ["deployments/scale"], "verbs": ["patch"]}])
    as_sa = f"--as=system:serviceaccount:{ns}:op"
    assert cluster.kubectl("auth", "can-i", "get", "secrets", "-n", ns, as_sa).stdout.strip() == "yes"
    no = cluster.kubectl("auth", "can-i", "list", "secrets", "-n", ns, as_sa, check=False)
    assert no.returncode == 1 and no.stdout.strip() == "no"
    assert cluster.kubectl("auth", "can-i", "get", "secrets", "-n", "default", as_sa, check=False).stdout.strip() == "no"
    assert cluster.kubectl("auth", "can-i", "patch", "deployments.apps", "--subresource=scale", "-n", ns, as_sa).stdout.strip() == "yes"
    listing = cluster.kubectl("auth", "can-i", "--list", "-n", ns, as_sa).stdout
    rows = [ln.split(None, 1) for ln in listing.splitlines()[1:] if ln.strip() and not ln.startswith(" ")]
    table = {name: rest.split("[", 3)[-1].rstrip("] ").split() for name, rest in rows}
    assert table["secrets"] == ["get", "create"]
    assert table["deployments.apps/scale"] == ["patch"]
    assert table["selfsubjectaccessreviews.authorization.k8s.io"] == ["create"]
    assert "[/healthz]" in listing
    assert cluster.kubectl("auth", "can-i", "create", "pods/exec", "-n", ns, as_sa, check=False).stdout.strip() == "no"
    assert cluster.kubectl("auth", "can-i", "delete", "nodes").stdout.strip() == "yes"  # the admin


def test_kubectl_as_a_service_account_sees_the_403(cluster: Cluster, ns: str) -> None:
    service_account(cluster, ns, "viewer")
    out = cluster.kubectl("get", "secrets", "-n", ns, f"--as=system:serviceaccount:{ns}:viewer", check=False)
    assert out.returncode == 1
    assert (f'secrets is forbidden: User "system:serviceaccount:{ns}:viewer" cannot list resource "secrets" in API group "" '
            f'in the namespace "{ns}"') in out.stderr


def test_a_watch_is_authorized_as_watch_not_list(cluster: Cluster, ns: str) -> None:
    service_account(cluster, ns, "lister")
    grant(cluster, ns, "lister", [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}])
    token = cluster.srv.issue_token(ns, "lister")
    code, _ = raw(cluster, "GET", f"/api/v1/namespaces/{ns}/configmaps", token)
    assert code == 200
    code, status = raw(cluster, "GET", f"/api/v1/namespaces/{ns}/configmaps?watch=true&timeoutSeconds=1", token)
    assert code == 403 and "cannot watch resource \"configmaps\"" in status["message"]


def test_a_kopf_style_watch_is_refused_with_a_status(cluster: Cluster, ns: str) -> None:
    import asyncio

    import aiohttp

    service_account(cluster, ns, "kopfish")
    token = cluster.srv.issue_token(ns, "kopfish")

    async def watch() -> tuple[int, dict]:
        ctx = ssl.create_default_context(cafile=str(cluster.srv.ca_path))
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as session:
            url = f"{cluster.srv.url}/apis/slurmk8s.dev/v1alpha1/namespaces/{ns}/slurmclusters"
            async with session.get(url, params={"watch": "true", "allowWatchBookmarks": "true"}, ssl=ctx) as resp:
                return resp.status, await resp.json()

    code, status = asyncio.run(watch())
    assert code == 403
    assert status["message"] == (f'slurmclusters.slurmk8s.dev is forbidden: User "system:serviceaccount:{ns}:kopfish" cannot watch '
                                 f'resource "slurmclusters" in API group "slurmk8s.dev" in the namespace "{ns}"')
    assert status["details"] == {"group": "slurmk8s.dev", "kind": "slurmclusters"}


def test_self_subject_rules_review(cluster: Cluster, ns: str) -> None:
    service_account(cluster, ns, "rr")
    grant(cluster, ns, "rr", [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"], "resourceNames": ["one"]}])
    authz = client.AuthorizationV1Api(client_for(cluster, cluster.srv.issue_token(ns, "rr")))
    review = authz.create_self_subject_rules_review({"spec": {"namespace": ns}})
    rules = [(r.verbs, r.api_groups, r.resources, r.resource_names) for r in review.status.resource_rules]
    assert (["get"], [""], ["pods"], ["one"]) in rules
    assert any("/healthz" in r.non_resource_urls for r in review.status.non_resource_rules)
    assert review.status.incomplete is False


def test_exec_needs_create_on_pods_exec(cluster: Cluster, ns: str) -> None:
    service_account(cluster, ns, "ex")
    grant(cluster, ns, "ex", [{"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["get"]}])
    token = cluster.srv.issue_token(ns, "ex")
    code, status = raw(cluster, "GET", f"/api/v1/namespaces/{ns}/pods/p/exec?command=ls", token)
    assert code == 403
    assert status["message"] == (f'pods "p" is forbidden: User "system:serviceaccount:{ns}:ex" cannot create resource "pods/exec" '
                                 f'in API group "" in the namespace "{ns}"')


# --- audit ------------------------------------------------------------------------------


def test_every_request_is_audited(cluster: Cluster, ns: str) -> None:
    service_account(cluster, ns, "audited")
    token = cluster.srv.issue_token(ns, "audited")
    raw(cluster, "GET", f"/api/v1/namespaces/{ns}/secrets/s", token)
    cluster.kubectl("get", "pods", "-n", ns, f"--as=system:serviceaccount:{ns}:audited", check=False)
    raw(cluster, "GET", "/healthz", None)
    user = f"system:serviceaccount:{ns}:audited"

    def lines():
        return [ln for ln in audit.read(cluster.srv.audit_path) if ln.get("user") == user]

    found = wait_for("the audit lines", lambda: len(lines()) >= 2 and lines())
    secret = next(ln for ln in found if ln.get("resource") == "secrets")
    assert secret["verb"] == "get" and secret["namespace"] == ns and secret["name"] == "s" and secret["code"] == 403
    assert secret["apiGroup"] == "" and "impersonatedBy" not in secret
    assert secret["groups"] == ["system:serviceaccounts", f"system:serviceaccounts:{ns}", "system:authenticated"]
    pods = next(ln for ln in found if ln.get("resource") == "pods")
    assert pods["impersonatedBy"] == "sandbox-admin" and pods["verb"] == "list" and pods["code"] == 403
    assert {ln["user"] for ln in audit.forbidden(found)} == {user}
    every = audit.read(cluster.srv.audit_path)
    health = [ln for ln in every if ln.get("path") == "/healthz" and ln["user"] == "system:anonymous"]
    assert health and health[-1]["code"] == 200 and health[-1]["verb"] == "get"
    text = cluster.srv.audit_path.read_text()
    assert token not in text and cluster.srv.token not in text


# --- escalation prevention -----------------------------------------------------------------


def test_you_may_only_grant_what_you_hold(cluster: Cluster, ns: str) -> None:
    service_account(cluster, ns, "granter")
    grant(cluster, ns, "granter", [{"apiGroups": [RBAC], "resources": ["roles", "rolebindings"], "verbs": ["create", "update", "patch"]},
                                   {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}])
    rbac = client.RbacAuthorizationV1Api(client_for(cluster, cluster.srv.issue_token(ns, "granter")))
    rbac.create_namespaced_role(ns, {"metadata": {"name": "ok"}, "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]})
    with pytest.raises(ApiException) as e:
        rbac.create_namespaced_role(ns, {"metadata": {"name": "more"}, "rules": [
            {"apiGroups": [""], "resources": ["configmaps", "secrets"], "verbs": ["get"]}]})
    assert e.value.status == 403
    message = json.loads(e.value.body)["message"]
    assert message.startswith(f'roles.rbac.authorization.k8s.io "more" is forbidden: user "system:serviceaccount:{ns}:granter" ')
    assert 'is attempting to grant RBAC permissions not currently held:\n{APIGroups:[""], Resources:["secrets"], Verbs:["get"]}' in message
    subject = [{"kind": "ServiceAccount", "name": "default", "namespace": ns}]
    rbac.create_namespaced_role_binding(ns, {"metadata": {"name": "ok"}, "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": "ok"},
                                             "subjects": subject})
    with pytest.raises(ApiException) as e:
        rbac.create_namespaced_role_binding(ns, {"metadata": {"name": "admin"}, "subjects": subject,
                                                 "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": "admin"}})
    assert e.value.status == 403
    # `bind` on the ClusterRole lets it bind what it does not hold
    admin_rbac = client.RbacAuthorizationV1Api(cluster.api_client)
    admin_rbac.create_namespaced_role(ns, {"metadata": {"name": "binder"}, "rules": [
        {"apiGroups": [RBAC], "resources": ["clusterroles"], "verbs": ["bind"], "resourceNames": ["view"]}]})
    admin_rbac.create_namespaced_role_binding(ns, {"metadata": {"name": "binder"}, "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": "binder"},
                                                   "subjects": [{"kind": "ServiceAccount", "name": "granter", "namespace": ns}]})
    rbac.create_namespaced_role_binding(ns, {"metadata": {"name": "view"}, "subjects": subject,
                                             "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": "view"}})


def test_a_running_watch_is_audited_when_it_starts(cluster: Cluster, ns: str) -> None:
    ctx = ssl.create_default_context(cafile=str(cluster.srv.ca_path))
    req = urllib.request.Request(f"{cluster.srv.url}/api/v1/namespaces/{ns}/configmaps?watch=true&timeoutSeconds=30",
                                 headers={"Authorization": f"Bearer {cluster.srv.token}"})

    def started():
        return [ln for ln in audit.read(cluster.srv.audit_path) if ln.get("verb") == "watch" and ln.get("namespace") == ns]

    with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:  # headers are in: the watch runs
        assert resp.status == 200
        lines = wait_for("the watch's audit line while it runs", started, timeout=5)
    assert lines[0]["code"] == 200 and lines[0]["resource"] == "configmaps" and lines[0]["user"] == "sandbox-admin"
    assert len(started()) == 1


def test_the_kubelet_resolves_a_token_volume_with_the_python_client(cluster: Cluster, ns: str) -> None:
    """What the sandbox kubelet does for a kube-api-access volume: TokenRequest bound to the pod, with its own identity."""
    kubelet = client.CoreV1Api(config.new_client_from_config(
        config_file=str(cluster.srv.write_kubeconfig(cluster.workdir / "kubelet2.kubeconfig", identity="kubelet"))))
    pod = cluster.pod(ns, "p")
    source = next(v.projected.sources[0].service_account_token for v in pod.spec.volumes if v.name.startswith("kube-api-access-"))
    tr = kubelet.create_namespaced_service_account_token(pod.spec.service_account_name, ns, {
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"audiences": [source.audience] if source.audience else [], "expirationSeconds": source.expiration_seconds,
                 "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": pod.metadata.uid}}})
    assert tr.spec.expiration_seconds == 3607 and tr.spec.bound_object_ref.uid == pod.metadata.uid
    assert tr.status.expiration_timestamp is not None
    code, me = whoami(cluster, tr.status.token)
    assert code == 201 and me["status"]["userInfo"]["username"] == f"system:serviceaccount:{ns}:default"
    # the default account may discover the API but not read anything
    api = client.CoreV1Api(client_for(cluster, tr.status.token, "pod"))
    with pytest.raises(ApiException) as e:
        api.list_namespaced_pod(ns)
    assert e.value.status == 403
