"""Tenants: what the built-in `admin`, `edit` and `view` roles let a team do
with SlurmClusters and NodeLendingPolicies once the chart's aggregated
ClusterRoles (templates/tenant-roles.yaml) exist, asked of the API stand-in,
whose `admin`, `edit` and `view` are built by the clusterrole-aggregation
controller as Kubernetes builds them (sandbox/apiserver/controllers/aggregation.py).

Users are bound only by a RoleBinding in their namespace, and act through
impersonation by the stand-in's admin, so each request is authorized as
theirs alone.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from .apiserver.conftest import CRDS, Cluster, start_server, wait_for
from .test_chart import aggregated, objects

GROUP, VERSION = "slurmk8s.dev", "v1alpha1"
RBAC = "rbac.authorization.k8s.io"
TEAM = "hpc"
#: One object of each kind, as a tenant writes it.
KINDS = {
    "slurmclusters": {"apiVersion": f"{GROUP}/{VERSION}", "kind": "SlurmCluster", "metadata": {"name": "demo"},
                      "spec": {"partitions": [{"name": "gpu", "acceptLentNodes": True}]}},
    "nodelendingpolicies": {"apiVersion": f"{GROUP}/{VERSION}", "kind": "NodeLendingPolicy", "metadata": {"name": "lend"},
                            "spec": {"clusterRef": {"name": "demo"}, "partition": "gpu", "idleAfterSeconds": 60,
                                     "nodeSelector": {"matchLabels": {"lendable": "true"}}}},
}
#: A field of each kind's spec that a tenant changes.
CHANGE = {"slurmclusters": {"spec": {"login": {"replicas": 2}}}, "nodelendingpolicies": {"spec": {"idleAfterSeconds": 120}}}


def tenant_roles(values: dict | None = None) -> list[dict]:
    return [o for o in objects(values) if o["kind"] == "ClusterRole" and aggregated(o)]


def holds(obj: object, part: object) -> bool:
    """Whether ``obj`` has every field of ``part`` with its value (defaults around them)."""
    if isinstance(part, dict):
        return isinstance(obj, dict) and all(k in obj and holds(obj[k], v) for k, v in part.items())
    return obj == part


def forbidden(user: str, verb: str, resource: str, name: str = "") -> str:
    """Kubernetes' words for a refused request in the team's namespace."""
    plural = resource.split("/")[0]
    subject = f'{plural}.{GROUP} "{name}"' if name else f"{plural}.{GROUP}"
    return (f'{subject} is forbidden: User "{user}" cannot {verb} resource "{resource}" in API group "{GROUP}" '
            f'in the namespace "{TEAM}"')


# --- the rendered roles ------------------------------------------------------------------


def test_the_chart_ships_a_view_and_an_edit_role_for_aggregation_and_binds_neither():
    view, edit = sorted(tenant_roles(), key=lambda o: o["metadata"]["name"], reverse=True)
    assert view["metadata"]["name"].endswith("-view") and edit["metadata"]["name"].endswith("-edit")
    labels = {o["metadata"]["name"]: {k.rpartition("-")[2] for k, v in o["metadata"]["labels"].items()
                                      if k.startswith(f"{RBAC}/aggregate-to-") and v == "true"} for o in (view, edit)}
    assert labels == {view["metadata"]["name"]: {"admin", "edit", "view"}, edit["metadata"]["name"]: {"admin", "edit"}}
    [read] = view["rules"]
    assert read == {"apiGroups": [GROUP], "verbs": ["get", "list", "watch"], "resources": [
        "slurmclusters", "slurmclusters/status", "nodelendingpolicies", "nodelendingpolicies/status"]}
    [write] = edit["rules"]
    # The kinds only: status is the operator's and the bridge's to write.
    assert write == {"apiGroups": [GROUP], "resources": ["slurmclusters", "nodelendingpolicies"],
                     "verbs": ["create", "update", "patch", "delete", "deletecollection"]}
    bound = {o["roleRef"]["name"] for o in objects() if o["kind"].endswith("Binding")}
    assert not bound & {view["metadata"]["name"], edit["metadata"]["name"]}
    assert tenant_roles({"rbac": {"aggregateClusterRoles": False}}) == []
    # They do not depend on the operator's own RBAC.
    assert len(tenant_roles({"rbac": {"create": False}})) == 2


# --- as the API server answers -----------------------------------------------------------


def as_user(cluster: Cluster, user: str) -> client.CustomObjectsApi:
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    api.set_default_header("Impersonate-User", user)
    return client.CustomObjectsApi(api)


def refused(call, *args, **kwargs) -> str:
    """The message of the 403 that ``call`` must get."""
    with pytest.raises(ApiException) as e:
        call(*args, **kwargs)
    assert e.value.status == 403, e.value.body
    return json.loads(e.value.body)["message"]


class Team:
    """The stand-in with the CRDs, a namespace, and a user bound by a
    RoleBinding there to each of `edit` and `view`; no slurmk8s role yet."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        cluster.core.create_namespace({"metadata": {"name": TEAM}})
        rbac = client.RbacAuthorizationV1Api(cluster.api_client)
        for role in ("edit", "view"):
            rbac.create_namespaced_role_binding(TEAM, {
                "metadata": {"name": f"{role}-user"},
                "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": role},
                "subjects": [{"apiGroup": RBAC, "kind": "User", "name": f"{role}-user"}]})
        self.editor, self.viewer = as_user(cluster, "edit-user"), as_user(cluster, "view-user")

    def may(self, user: str, verb: str, resource: str, group: str = GROUP) -> bool:
        plural, _, sub = resource.partition("/")
        attrs = {"namespace": TEAM, "verb": verb, "group": group, "resource": plural, "subresource": sub}
        review = client.AuthorizationV1Api(self.cluster.api_client).create_subject_access_review(
            {"spec": {"user": user, "groups": ["system:authenticated"], "resourceAttributes": attrs}})
        return bool(review.status.allowed)

    def install_chart_roles(self) -> None:
        """Every ClusterRole the chart renders, as `helm install` creates them."""
        rbac = client.RbacAuthorizationV1Api(self.cluster.api_client)
        for o in objects():
            if o["kind"] == "ClusterRole":
                rbac.create_cluster_role(o)
        wait_for("edit and view to aggregate the chart's roles", lambda: self.may("edit-user", "create", "slurmclusters")
                 and self.may("view-user", "watch", "nodelendingpolicies"))


@pytest.fixture
def team(tmp_path) -> Iterator[Team]:
    cluster = start_server(tmp_path, crds=sorted(CRDS.glob("*.yaml")))
    try:
        yield Team(cluster)
    finally:
        cluster.api_client.close()
        cluster.srv.stop()


def test_before_the_chart_edit_and_view_get_nothing_of_slurmk8s_dev(team: Team):
    """edit is aggregated (it may create ConfigMaps) and still grants nothing on
    either kind: it gets them from the chart's roles, not from the stand-in."""
    wait_for("edit aggregated", lambda: team.may("edit-user", "create", "configmaps", group=""))
    for resource in KINDS:
        for user in ("edit-user", "view-user"):
            for verb in ("get", "list", "watch", "create", "patch", "delete"):
                assert not team.may(user, verb, resource), (user, verb, resource)
        assert refused(team.editor.create_namespaced_custom_object, GROUP, VERSION, TEAM, resource, KINDS[resource]) \
            == forbidden("edit-user", "create", resource)
        assert refused(team.viewer.list_namespaced_custom_object, GROUP, VERSION, TEAM, resource) \
            == forbidden("view-user", "list", resource)


def test_edit_creates_changes_and_deletes_both_kinds_and_view_only_reads_them(team: Team):
    team.install_chart_roles()
    editor, viewer, admin = team.editor, team.viewer, team.cluster.custom
    for resource, body in KINDS.items():
        name = body["metadata"]["name"]
        made = editor.create_namespaced_custom_object(GROUP, VERSION, TEAM, resource, body)
        assert made["metadata"]["namespace"] == TEAM
        # view reads it, its status and the list, and may watch it.
        assert viewer.get_namespaced_custom_object(GROUP, VERSION, TEAM, resource, name)["metadata"]["uid"] \
            == made["metadata"]["uid"]
        viewer.get_namespaced_custom_object_status(GROUP, VERSION, TEAM, resource, name)
        assert [o["metadata"]["name"] for o in viewer.list_namespaced_custom_object(
            GROUP, VERSION, TEAM, resource)["items"]] == [name]
        assert team.may("view-user", "watch", resource) and team.may("view-user", "get", f"{resource}/status")
        # edit changes it by merge patch and by replacing it.
        patched = editor.patch_namespaced_custom_object(GROUP, VERSION, TEAM, resource, name, CHANGE[resource])
        assert holds(patched, CHANGE[resource])
        current = editor.get_namespaced_custom_object(GROUP, VERSION, TEAM, resource, name)
        current["metadata"].setdefault("labels", {})["team"] = TEAM
        replaced = editor.replace_namespaced_custom_object(GROUP, VERSION, TEAM, resource, name, current)
        assert replaced["metadata"]["labels"]["team"] == TEAM
        # view changes nothing, each write refused in Kubernetes' words.
        current = viewer.get_namespaced_custom_object(GROUP, VERSION, TEAM, resource, name)
        other = json.loads(json.dumps(body).replace(f'"name": "{name}"', f'"name": "{name}-2"', 1))
        for message, want in (
            (refused(viewer.create_namespaced_custom_object, GROUP, VERSION, TEAM, resource, other),
             forbidden("view-user", "create", resource)),
            (refused(viewer.patch_namespaced_custom_object, GROUP, VERSION, TEAM, resource, name, CHANGE[resource]),
             forbidden("view-user", "patch", resource, name)),
            (refused(viewer.replace_namespaced_custom_object, GROUP, VERSION, TEAM, resource, name, current),
             forbidden("view-user", "update", resource, name)),
            (refused(viewer.delete_namespaced_custom_object, GROUP, VERSION, TEAM, resource, name),
             forbidden("view-user", "delete", resource, name)),
            (refused(viewer.delete_collection_namespaced_custom_object, GROUP, VERSION, TEAM, resource),
             forbidden("view-user", "deletecollection", resource)),
            (refused(viewer.patch_namespaced_custom_object_status, GROUP, VERSION, TEAM, resource, name,
                     {"status": {}}), forbidden("view-user", "patch", f"{resource}/status", name)),
        ):
            assert message == want
        # Neither tenant writes status: the operator's and the bridge's.
        assert refused(editor.patch_namespaced_custom_object_status, GROUP, VERSION, TEAM, resource, name,
                       {"status": {}}) == forbidden("edit-user", "patch", f"{resource}/status", name)
        assert admin.get_namespaced_custom_object(GROUP, VERSION, TEAM, resource, name)["metadata"]["resourceVersion"] \
            == replaced["metadata"]["resourceVersion"], "a refused write changed the object"
    # edit deletes both.
    for resource, body in KINDS.items():
        editor.delete_namespaced_custom_object(GROUP, VERSION, TEAM, resource, body["metadata"]["name"])
        assert viewer.list_namespaced_custom_object(GROUP, VERSION, TEAM, resource)["items"] == []
    # Only the tenant roles reached edit: none of the operator's cluster-wide reads did.
    assert not team.may("edit-user", "get", "nodes", group="")
    assert not team.may("edit-user", "list", "customresourcedefinitions", group="apiextensions.k8s.io")


def test_kubectl_as_the_tenants(team: Team):
    """What a team member sees: kubectl apply as edit, kubectl's Forbidden as view."""
    team.install_chart_roles()
    doc = json.dumps(KINDS["slurmclusters"])
    out = team.cluster.kubectl("--as", "edit-user", "-n", TEAM, "apply", "-f", "-", stdin=doc)
    assert "slurmcluster.slurmk8s.dev/demo created" in out.stdout
    got = team.cluster.kubectl("--as", "view-user", "-n", TEAM, "get", "slurmclusters", "-o", "name")
    assert got.stdout.split() == ["slurmcluster.slurmk8s.dev/demo"]
    denied = team.cluster.kubectl("--as", "view-user", "-n", TEAM, "delete", "slurmcluster", "demo", check=False)
    assert denied.returncode != 0
    assert f"Error from server (Forbidden): {forbidden('view-user', 'delete', 'slurmclusters', 'demo')}" \
        in denied.stderr
    team.cluster.kubectl("--as", "edit-user", "-n", TEAM, "delete", "slurmcluster", "demo")
