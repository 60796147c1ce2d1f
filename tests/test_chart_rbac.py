"""The chart's RBAC as an API server sees it: the rendered ServiceAccounts,
Roles, ClusterRoles and bindings are created in the Kubernetes stand-in, which
authorizes with Kubernetes' RBAC rules, and SubjectAccessReviews ask it, for
each ServiceAccount, every verb on every resource the operator and the bridge
touch, in the watched namespaces, in kube-system and cluster-wide. The answer
must be "allowed" exactly where operator/permissions.py and
bridge/permissions.py declare a need.
"""

from __future__ import annotations

import itertools

import pytest
from kubernetes import client

from slurmk8s.operator.permissions import allows

from .apiserver.conftest import start_server
from .test_chart import NAMESPACE, RBAC_VALUE_SETS, WATCHED, declared, objects, of, one, watched

#: Every verb RBAC knows for resources (besides escalate, bind, impersonate, which no rule names).
VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
#: Value sets asked through the stand-in: the default, two listed namespaces, the opt-in.
ASKED = ("defaults", "namespaced", "clusterwide", "bridge-own")
CREATORS = {
    "ServiceAccount": lambda api, o: client.CoreV1Api(api).create_namespaced_service_account(
        o["metadata"]["namespace"], o),
    "Role": lambda api, o: client.RbacAuthorizationV1Api(api).create_namespaced_role(o["metadata"]["namespace"], o),
    "RoleBinding": lambda api, o: client.RbacAuthorizationV1Api(api).create_namespaced_role_binding(
        o["metadata"]["namespace"], o),
    "ClusterRole": lambda api, o: client.RbacAuthorizationV1Api(api).create_cluster_role(o),
    "ClusterRoleBinding": lambda api, o: client.RbacAuthorizationV1Api(api).create_cluster_role_binding(o),
}


class Installed:
    """A stand-in holding one value set's rendered RBAC, asked through SubjectAccessReviews."""

    def __init__(self, cluster, values: dict):
        self.cluster = cluster
        self.values = values
        self.objs = objects(values)
        api = cluster.api_client
        existing = {n.metadata.name for n in cluster.core.list_namespace().items}
        namespaces = {o["metadata"].get("namespace") for o in self.objs} - {None}
        for ns in sorted((namespaces | {NAMESPACE, "kube-system"}) - existing):
            cluster.core.create_namespace({"metadata": {"name": ns}})
        order = list(CREATORS)
        rbac = sorted((o for o in self.objs if o["kind"] in CREATORS), key=lambda o: order.index(o["kind"]))
        assert {o["kind"] for o in rbac} >= {"ServiceAccount", "ClusterRole", "ClusterRoleBinding"}
        for o in rbac:
            CREATORS[o["kind"]](api, o)
        self.authz = client.AuthorizationV1Api(api)

    def user(self, component: str) -> tuple[str, list[str]]:
        sa = one(of(self.objs, component), "ServiceAccount")["metadata"]
        ns = sa["namespace"]
        return (f"system:serviceaccount:{ns}:{sa['name']}",
                ["system:serviceaccounts", f"system:serviceaccounts:{ns}", "system:authenticated"])

    def allowed(self, component: str, verb: str, group: str, resource: str, namespace: str | None) -> bool:
        user, groups = self.user(component)
        plural, _, sub = resource.partition("/")
        attrs = {"verb": verb, "group": group, "resource": plural}
        if sub:
            attrs["subresource"] = sub
        if namespace:
            attrs["namespace"] = namespace
        review = self.authz.create_subject_access_review(
            {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
             "spec": {"user": user, "groups": groups, "resourceAttributes": attrs}})
        return bool(review.status.allowed)


@pytest.fixture(scope="module", params=ASKED)
def installed(request, tmp_path_factory):
    cluster = start_server(tmp_path_factory.mktemp(f"rbac-{request.param}"))
    try:
        yield request.param, Installed(cluster, RBAC_VALUE_SETS[request.param])
    finally:
        cluster.api_client.close()
        cluster.srv.stop()


@pytest.mark.parametrize("component", ["operator", "bridge"])
def test_every_declared_permission_is_allowed_where_it_is_needed(installed, component):
    name, chart = installed
    want = declared(chart.values, component)
    asked = 0
    for namespace, needed in want.items():
        for verb, group, resource in sorted(needed):
            assert chart.allowed(component, verb, group, resource, namespace), (
                f"{name}: {component} may not {verb} {group}/{resource} in {namespace or 'the cluster'}")
            asked += 1
    assert asked >= 10


@pytest.mark.parametrize("component", ["operator", "bridge"])
def test_nothing_undeclared_is_allowed(installed, component):
    """Every verb on every resource either component touches, in each place it
    works, in kube-system and cluster-wide: allowed only when declared."""
    name, chart = installed
    want = declared(chart.values, component)
    resources = sorted({(g, r) for c in ("operator", "bridge") for s in declared(chart.values, c).values()
                        for _, g, r in s})
    places = [None, "kube-system", *filter(None, want)]
    wrong = []
    for (group, resource), verb, namespace in itertools.product(resources, VERBS, places):
        expected = allows(want, verb, group, resource, namespace)
        if chart.allowed(component, verb, group, resource, namespace) != expected:
            wrong.append(f"{verb} {group}/{resource} in {namespace or 'the cluster'}: "
                         f"{'allowed' if not expected else 'denied'}")
    assert not wrong, f"{name}, {component}:\n" + "\n".join(wrong)


def test_least_privilege_by_default_as_the_api_server_answers(installed):
    name, chart = installed
    if name == "clusterwide":
        # The opt-in grants what it says: Secrets and pods in every namespace.
        assert chart.allowed("operator", "get", "", "secrets", "kube-system")
        assert chart.allowed("bridge", "create", "", "pods", "kube-system")
    else:
        for component in ("operator", "bridge"):
            for verb, resource in (("get", "secrets"), ("create", "pods"), ("delete", "pods")):
                assert not chart.allowed(component, verb, "", resource, "kube-system"), (component, verb, resource)
            assert not chart.allowed(component, "patch", "apps", "deployments", "kube-system")
    for namespace in (None, "kube-system", NAMESPACE, *WATCHED):
        assert not chart.allowed("operator", "list", "", "secrets", namespace)
        assert not chart.allowed("bridge", "list", "", "secrets", namespace)
    # Where the operator works it reads its key Secrets by name.
    for namespace in watched(chart.values, "operator") or [NAMESPACE]:
        assert chart.allowed("operator", "get", "", "secrets", namespace)
