"""The chart's RBAC as an API server sees it: the rendered ServiceAccounts,
Roles, ClusterRoles and bindings are created in the Kubernetes stand-in, which
authorizes with Kubernetes' RBAC rules, and SubjectAccessReviews ask it, for
each ServiceAccount, every verb on every resource the operator and the bridge
touch, in the watched namespaces, in kube-system and cluster-wide. The answer
must be "allowed" exactly where slurmk8s/operator/permissions.py and
slurmk8s/bridge/permissions.py declare a need.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import itertools
import threading

import kopf
import pytest
import yaml
from kubernetes import client

from sandbox.apiserver import audit
from sandbox.apiserver.storage import SHARED_CLASS
from slurmk8s.bridge.loop import FIELD_MANAGER
from slurmk8s.bridge.main import watching_bridge
from slurmk8s.bridge.nodestate import STATE_LABEL
from slurmk8s.kube import ApiError, Kube
from slurmk8s.leader import Elector, Timing, lease_name, legacy_lease_name
from slurmk8s.operator.handlers import FINALIZER, register
from slurmk8s.operator.round import Operator
from slurmk8s.operator.teardown import PATIENCE as TEARDOWN_PATIENCE
from slurmk8s.permissions import allows
from slurmk8s.render import names
from slurmk8s.render.keys import key_secret_names

from .apiserver.conftest import CRDS, start_server, wait_for
from .conftest import labelled_user_secrets
from .test_bridge_loop import NOW, Facade, MemorySlurm, idle_node
from .test_chart import (
    CONFIGURATION,
    KEPT_SECRET,
    NAMESPACE,
    RBAC_VALUE_SETS,
    RELEASE,
    WATCHED,
    declared,
    objects,
    of,
    one,
    watched,
)

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

    def allowed(self, component: str, verb: str, group: str, resource: str, namespace: str | None,
                name: str | None = None) -> bool:
        """As a SubjectAccessReview answers; a Lease is asked for by the
        component's own Lease's name unless ``name`` says another, and so are
        the webhook certificate's Secret (read and written in the release
        namespace) and configuration (decision record 53)."""
        user, groups = self.user(component)
        plural, _, sub = resource.partition("/")
        attrs = {"verb": verb, "group": group, "resource": plural}
        if sub:
            attrs["subresource"] = sub
        if namespace:
            attrs["namespace"] = namespace
        if plural == "leases" and verb != "create":
            name = name or LEASES[component]
        if plural == "secrets" and verb in ("get", "update") and namespace == NAMESPACE:
            name = name or KEPT_SECRET
        if plural == "validatingwebhookconfigurations":
            name = name or CONFIGURATION
        if name:
            attrs["name"] = name
        review = self.authz.create_subject_access_review(
            {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
             "spec": {"user": user, "groups": groups, "resourceAttributes": attrs}})
        return bool(review.status.allowed)


#: The Lease each component elects its leader on.
#: Each component's Lease, as the chart's release (test_chart.RELEASE) names it.
LEASES = {c: lease_name(c, RELEASE) for c in ("operator", "bridge")}


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
    # Each reads and renews its own Lease only.
    for component, other in (("operator", "bridge"), ("bridge", "operator")):
        for verb in ("get", "update"):
            assert chart.allowed(component, verb, "coordination.k8s.io", "leases", NAMESPACE)
            assert not chart.allowed(component, verb, "coordination.k8s.io", "leases", NAMESPACE, LEASES[other])
        # The name older versions used: read (to wait until it is free), never written.
        legacy = legacy_lease_name(component)
        assert chart.allowed(component, "get", "coordination.k8s.io", "leases", NAMESPACE, legacy)
        assert not chart.allowed(component, "update", "coordination.k8s.io", "leases", NAMESPACE, legacy)
    # The lent pods' disruption budgets (decision record 49): made and removed where the
    # bridge lends, never read by name, changed or relaxed (another's budget stays as it is).
    for namespace in (None, "kube-system", NAMESPACE, *WATCHED):
        for verb in ("get", "update", "patch", "deletecollection"):
            assert not chart.allowed("bridge", verb, "policy", "poddisruptionbudgets", namespace), (verb, namespace)
    for namespace in watched(chart.values, "bridge") or [NAMESPACE]:
        for verb in ("list", "watch", "create", "delete"):
            assert chart.allowed("bridge", verb, "policy", "poddisruptionbudgets", namespace), (verb, namespace)
    if name != "clusterwide":
        for verb in ("create", "delete"):
            assert not chart.allowed("bridge", verb, "policy", "poddisruptionbudgets", "kube-system")
    # The webhook's certificate: its own Secret and configuration, no other.
    assert chart.allowed("operator", "update", "", "secrets", NAMESPACE)
    assert not chart.allowed("operator", "update", "", "secrets", NAMESPACE, "another")
    assert not chart.allowed("operator", "update", "admissionregistration.k8s.io", "validatingwebhookconfigurations",
                             None, "another")
    # Where the operator works it reads its key Secrets by name.
    for namespace in watched(chart.values, "operator") or [NAMESPACE]:
        assert chart.allowed("operator", "get", "", "secrets", namespace)


# --- the operator and the bridge at work, as their ServiceAccounts -------------------

#: As the sandbox installs the chart: SlurmClusters and policies in their own namespace.
WORK = "hpc"


class Unreachable:
    """A Slurm agent that does not answer (no Slurm here): rounds wait, teardowns go on."""

    def __getattr__(self, name):
        def call(*args, **kwargs):
            raise RuntimeError("the agent does not answer")
        return call


class Work:
    """The stand-in with the CRDs and the chart's RBAC for SlurmClusters in WORK;
    clients logged in as the chart's ServiceAccounts."""

    def __init__(self, tmp_path):
        self.tmp = tmp_path
        self.cluster = start_server(tmp_path, crds=sorted(CRDS.glob("*.yaml")))
        self.chart = Installed(self.cluster, {"watchNamespaces": [WORK]})

    def user(self, component: str) -> str:
        return self.chart.user(component)[0]

    def kube_as(self, component: str, field_manager: str) -> Kube:
        sa = one(of(self.chart.objs, component), "ServiceAccount")["metadata"]
        kubeconfig = copy.deepcopy(self.cluster.srv.kubeconfig())
        kubeconfig["users"][0]["user"] = {"token": self.cluster.srv.issue_token(sa["namespace"], sa["name"])}
        path = self.tmp / f"kubeconfig-{component}"
        path.write_text(yaml.safe_dump(kubeconfig))
        return Kube.from_kubeconfig(str(path), field_manager=field_manager)

    def requests_of(self, component: str) -> list[dict]:
        """The stand-in's audit lines of the component's resource requests."""
        return [e for e in audit.read(self.cluster.srv.audit_path) if e["user"] == self.user(component)
                and "resource" in e]


@pytest.fixture
def work(tmp_path):
    w = Work(tmp_path)
    try:
        yield w
    finally:
        w.cluster.api_client.close()
        w.cluster.srv.stop()


def assert_declared_and_granted(work: Work, component: str) -> set[tuple[str, str, str]]:
    """Every request the component made was declared, and none was refused; what it made."""
    requests = work.requests_of(component)
    assert requests
    refused = [e for e in requests if e["code"] in (401, 403)]
    assert not refused, refused
    want = declared({"watchNamespaces": [WORK]}, component)
    undeclared = [e for e in requests if not allows(
        want, e["verb"], e["apiGroup"], e["resource"] + (f"/{e['subresource']}" if e.get("subresource") else ""),
        e.get("namespace"))]
    assert not undeclared, undeclared
    return {(e["verb"], e["apiGroup"], e["resource"]) for e in requests}


def test_the_operator_reconciles_and_tears_down_with_only_the_charts_rbac(work, example_doc, keys):
    cluster, kube_as = work.cluster, work.kube_as
    doc = copy.deepcopy(example_doc)
    doc["metadata"]["namespace"] = WORK
    for secret in labelled_user_secrets(doc):  # the site's, for spec.login.users[].sshPublicKeysFrom
        cluster.core.create_namespaced_secret(WORK, secret)
    cluster.custom.create_namespaced_custom_object("slurmk8s.dev", "v1alpha1", WORK, "slurmclusters", doc)
    kube = kube_as("operator", names.FIELD_MANAGER)

    def body() -> dict:
        return cluster.custom.get_namespaced_custom_object("slurmk8s.dev", "v1alpha1", WORK, "slurmclusters", "demo")

    op = Operator(kube, agent=lambda c, token, pod: Unreachable(), fresh_keys=lambda: keys,
                  shared_storage_class=SHARED_CLASS)
    out = op.reconcile(body())
    assert not out.problems, out.problems
    theirs = {s["metadata"]["name"] for s in labelled_user_secrets(doc)}
    created = {s.metadata.name for s in cluster.core.list_namespaced_secret(WORK).items} - theirs
    # The JWT and database-password Secrets only exist with slurmrestd and managed accounting.
    assert set(key_secret_names("demo")) - {names.jwt_secret("demo"), names.db_password_secret("demo")} <= created
    assert cluster.apps.read_namespaced_stateful_set("demo-controller", WORK)
    # The next round reads the keys back by name and keeps them.
    before = cluster.core.read_namespaced_secret(names.agent_token_secret("demo"), WORK).data
    out = op.reconcile(body())
    assert not out.problems, out.problems
    assert cluster.core.read_namespaced_secret(names.agent_token_secret("demo"), WORK).data == before
    assert body()["status"]["phase"]
    done, why = op.teardown(body(), attempt=TEARDOWN_PATIENCE)
    assert done, why
    assert not {s.metadata.name for s in cluster.core.list_namespaced_secret(WORK).items} & created
    assert not cluster.apps.list_namespaced_stateful_set(WORK).items
    assert ("get", "", "secrets") in assert_declared_and_granted(work, "operator")
    # What the operator used to do each round is refused.
    with pytest.raises(ApiError) as refused:
        kube.list("Secret", WORK)
    assert refused.value.status == 403


def test_the_bridge_lends_a_node_with_only_the_charts_rbac(work):
    cluster, kube_as = work.cluster, work.kube_as
    custom = cluster.custom
    custom.create_namespaced_custom_object("slurmk8s.dev", "v1alpha1", WORK, "slurmclusters", {
        "apiVersion": "slurmk8s.dev/v1alpha1", "kind": "SlurmCluster", "metadata": {"name": "demo"},
        "spec": {"partitions": [{"name": "gpu", "acceptLentNodes": True}]}})
    cluster.core.create_namespaced_secret(WORK, {"metadata": {"name": "demo-agent-token"},
                                                 "data": {"token": base64.b64encode(b"t" * 32).decode()}})
    custom.create_namespaced_custom_object("slurmk8s.dev", "v1alpha1", WORK, "nodelendingpolicies", {
        "apiVersion": "slurmk8s.dev/v1alpha1", "kind": "NodeLendingPolicy", "metadata": {"name": "lend"},
        "spec": {"clusterRef": {"name": "demo"}, "partition": "gpu", "idleAfterSeconds": 60,
                 "nodeSelector": {"matchLabels": {"lendable": "true"}}}})
    idle_node(cluster, "gpu-a", WORK)
    memory = MemorySlurm()
    # As `slurmk8s bridge` runs it: lists, then watches.
    bridge = watching_bridge(kube_as("bridge", FIELD_MANAGER), [WORK], agent=lambda c, token, pod: Facade(memory),
                             clock=lambda: NOW)
    wait_for("the bridge's caches", lambda: not bridge.view.not_synced()
             and bridge.view.nodes.get("gpu-a") and bridge.view.policies())
    report = bridge.round()
    assert not report.errors and not report.failed, report
    assert cluster.core.read_node("gpu-a").metadata.labels[STATE_LABEL] == "lending"
    assert cluster.core.read_namespaced_pod("demo-lent.gpu-a", WORK).spec.node_name == "gpu-a"
    # Events about the Node, in "default", where the chart's node-events Role allows creating them.
    assert {e.reason for e in cluster.core.list_namespaced_event("default").items
            if e.involved_object.name == "gpu-a"} >= {"Lending"}
    cluster.report_running(WORK, "demo-lent.gpu-a")
    memory.register("gpu-a")
    wait_for("the running pod in the cache", lambda: any(
        p.name == "demo-lent.gpu-a" and p.phase == "Running" for p in bridge.view.pods.values()))
    report = bridge.round()
    bridge.view.close()
    assert not report.errors and not report.failed, report
    assert cluster.core.read_node("gpu-a").metadata.labels[STATE_LABEL] == "lent"
    status = custom.get_namespaced_custom_object("slurmk8s.dev", "v1alpha1", WORK, "nodelendingpolicies", "lend")
    assert status["status"]["lentNodes"] == ["gpu-a"]
    made = assert_declared_and_granted(work, "bridge")
    assert {("create", "", "pods"), ("patch", "", "nodes"), ("get", "", "secrets"), ("create", "", "events"),
            ("patch", "slurmk8s.dev", "nodelendingpolicies"), ("watch", "", "nodes"), ("watch", "", "pods"),
            ("watch", "slurmk8s.dev", "nodelendingpolicies"), ("watch", "slurmk8s.dev", "slurmclusters")} <= made


@pytest.mark.parametrize("component", ["operator", "bridge"])
def test_the_leader_election_makes_only_declared_requests_and_none_is_refused(work, component):
    """Create, renew and release of the component's Lease in the release
    namespace, as its ServiceAccount."""
    e = Elector(work.kube_as(component, names.FIELD_MANAGER), NAMESPACE, LEASES[component], component,
                timing=Timing(lease=1.5, renew_deadline=1.0, retry=0.2), legacy=legacy_lease_name(component))
    assert e.try_once() and e.try_once() and e.leading
    e._became.set()
    e.stop()
    lease = work.cluster.kubectl_json("get", "lease", LEASES[component], "-n", NAMESPACE)
    assert "holderIdentity" not in lease["spec"]
    made = assert_declared_and_granted(work, component)
    assert {(v, "coordination.k8s.io", "leases") for v in ("get", "create", "update")} <= made


def test_kopf_and_the_operator_make_only_declared_requests_and_none_is_refused(work, keys):
    """The operator as `slurmk8s operator --namespace hpc` runs it (kopf, its
    handlers, the round, the finalizer's teardown), logged in as its
    ServiceAccount: the stand-in's audit log shows every request it made."""
    cluster = work.cluster
    kube = work.kube_as("operator", names.FIELD_MANAGER)
    registry = kopf.OperatorRegistry()
    register(registry, Operator(kube, agent=lambda c, token, pod: Unreachable(), fresh_keys=lambda: keys,
                                shared_storage_class=SHARED_CLASS), interval=1)
    ready, stop = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(kopf.operator(registry=registry, standalone=True, namespaces=[WORK],
                                      ready_flag=ready, stop_flag=stop))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    thread = threading.Thread(target=run, name="kopf", daemon=True)
    thread.start()
    try:
        assert ready.wait(30) and not errors, errors
        cluster.custom.create_namespaced_custom_object("slurmk8s.dev", "v1alpha1", WORK, "slurmclusters", {
            "apiVersion": "slurmk8s.dev/v1alpha1", "kind": "SlurmCluster", "metadata": {"name": "demo"},
            "spec": {"partitions": [{"name": "cpu"}]}})

        def read() -> dict:
            return cluster.custom.get_namespaced_custom_object("slurmk8s.dev", "v1alpha1", WORK, "slurmclusters",
                                                               "demo")

        wait_for("the first round's status", lambda: (read().get("status") or {}).get("phase"))
        assert FINALIZER in read()["metadata"]["finalizers"]
        wait_for("the key Secrets", lambda: len(cluster.core.list_namespaced_secret(WORK).items) >= 3)
        wait_for("an Event from kopf", lambda: cluster.core.list_namespaced_event(WORK).items)
        cluster.custom.delete_namespaced_custom_object("slurmk8s.dev", "v1alpha1", WORK, "slurmclusters", "demo")

        def gone() -> bool:
            try:
                read()
            except client.ApiException as exc:
                return exc.status == 404
            return False

        wait_for("the teardown to remove the finalizer", gone, timeout=60)
    finally:
        stop.set()
        thread.join(30)
    assert not errors, errors

    made = assert_declared_and_granted(work, "operator")
    # kopf's own requests are among them: the watch, the finalizer, its Events, namespaces.
    assert {("watch", "slurmk8s.dev", "slurmclusters"), ("patch", "slurmk8s.dev", "slurmclusters"),
            ("create", "", "events"), ("list", "", "namespaces"), ("get", "", "secrets")} <= made
    assert ("list", "", "secrets") not in made
