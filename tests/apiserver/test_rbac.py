"""RBAC semantics of the stand-in, without a server: :mod:`sandbox.apiserver.rbac`."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sandbox.apiserver import policy
from sandbox.apiserver.rbac import (
    Attributes,
    Policy,
    User,
    aggregated_rules,
    authorize,
    forbidden_details,
    forbidden_message,
    request_attributes,
    rule_allows,
    rules_for,
)

SA = User("system:serviceaccount:x:y", ("system:serviceaccounts", "system:serviceaccounts:x", "system:authenticated"))
ALICE = User("alice", ("dev", "system:authenticated"))


def role(ns, name, *rules):
    return {"metadata": {"namespace": ns, "name": name}, "rules": list(rules)}


def crole(name, *rules, labels=None, aggregate=None):
    out = {"metadata": {"name": name, "labels": labels or {}}, "rules": list(rules)}
    if aggregate is not None:
        out["aggregationRule"] = {"clusterRoleSelectors": [{"matchLabels": aggregate}]}
    return out


def rb(ns, name, kind, ref, *subjects):
    return {"metadata": {"namespace": ns, "name": name}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": ref},
            "subjects": list(subjects)}


def crb(name, ref, *subjects):
    return {"metadata": {"name": name}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": ref},
            "subjects": list(subjects)}


def rule(groups, resources, verbs, names=None):
    r = {"apiGroups": groups, "resources": resources, "verbs": verbs}
    if names:
        r["resourceNames"] = names
    return r


def sa_subject(ns="x", name="y"):
    return {"kind": "ServiceAccount", "name": name, "namespace": ns}


def res(verb, resource, ns="", name="", group="", sub=""):
    return Attributes(verb=verb, namespace=ns, api_group=group, resource=resource, subresource=sub, name=name)


def allowed(user, attrs, **objs) -> bool:
    return authorize(user, attrs, **objs)[0]


def test_system_masters_may_do_anything() -> None:
    admin = User("sandbox-admin", ("system:masters", "system:authenticated"))
    assert authorize(admin, res("delete", "nodes", name="n1")) == (True, 'allowed by group "system:masters"')
    assert allowed(admin, Attributes("get", resource_request=False, path="/anything"))


def test_nothing_is_allowed_without_a_binding() -> None:
    assert authorize(SA, res("list", "secrets", "x")) == (False, "")


def test_role_binding_grants_in_its_namespace_only() -> None:
    objs = dict(roles=[role("x", "reader", rule([""], ["secrets"], ["get", "list"]))],
                rolebindings=[rb("x", "rb", "Role", "reader", sa_subject())])
    assert allowed(SA, res("list", "secrets", "x"), **objs)
    assert not allowed(SA, res("list", "secrets", "other"), **objs)
    assert not allowed(SA, res("list", "secrets"), **objs)  # cluster-wide list
    ok, reason = authorize(SA, res("get", "secrets", "x", "s"), **objs)
    assert ok and reason == 'RBAC: allowed by RoleBinding "rb/x" of Role "reader" to ServiceAccount "y/x"'


def test_cluster_role_bound_by_a_role_binding_applies_in_that_namespace_only() -> None:
    objs = dict(clusterroles=[crole("pods-reader", rule([""], ["pods"], ["get"]))],
                rolebindings=[rb("x", "rb", "ClusterRole", "pods-reader", {"kind": "User", "name": "alice"})])
    assert allowed(ALICE, res("get", "pods", "x", "p"), **objs)
    assert not allowed(ALICE, res("get", "pods", "y", "p"), **objs)
    objs["clusterrolebindings"] = [crb("all", "pods-reader", {"kind": "Group", "name": "dev"})]
    assert allowed(ALICE, res("get", "pods", "y", "p"), **objs)


def test_a_role_binding_cannot_reference_a_role_of_another_namespace() -> None:
    objs = dict(roles=[role("other", "reader", rule([""], ["pods"], ["get"]))],
                rolebindings=[rb("x", "rb", "Role", "reader", {"kind": "User", "name": "alice"})])
    assert not allowed(ALICE, res("get", "pods", "x", "p"), **objs)


def test_service_account_subject_namespace_defaults_to_the_binding_namespace() -> None:
    objs = dict(roles=[role("x", "r", rule([""], ["pods"], ["get"]))],
                rolebindings=[rb("x", "rb", "Role", "r", {"kind": "ServiceAccount", "name": "y"})])
    assert allowed(SA, res("get", "pods", "x", "p"), **objs)
    other = User("system:serviceaccount:z:y", ("system:serviceaccounts",))
    assert not allowed(other, res("get", "pods", "x", "p"), **objs)


def test_verbs_are_distinct() -> None:
    objs = dict(clusterroles=[crole("c", rule([""], ["pods"], ["list"]))], clusterrolebindings=[crb("b", "c", sa_subject())])
    assert allowed(SA, res("list", "pods", "x"), **objs)
    assert not allowed(SA, res("watch", "pods", "x"), **objs)
    assert not allowed(SA, res("get", "pods", "x", "p"), **objs)


def test_resource_names_never_match_requests_without_a_name() -> None:
    objs = dict(roles=[role("x", "r", rule([""], ["secrets"], ["get", "list", "watch", "delete", "create"], ["s1"]))],
                rolebindings=[rb("x", "b", "Role", "r", sa_subject())])
    assert allowed(SA, res("get", "secrets", "x", "s1"), **objs)
    assert not allowed(SA, res("get", "secrets", "x", "s2"), **objs)
    assert not allowed(SA, res("list", "secrets", "x"), **objs)
    assert not allowed(SA, res("create", "secrets", "x"), **objs)
    assert allowed(SA, res("watch", "secrets", "x", "s1"), **objs)  # a watch with fieldSelector metadata.name=s1


def test_subresources_need_their_own_rule() -> None:
    objs = dict(clusterroles=[crole("c", rule([""], ["pods"], ["*"]), rule(["slurmk8s.dev"], ["*/status"], ["update"]))],
                clusterrolebindings=[crb("b", "c", sa_subject())])
    assert allowed(SA, res("create", "pods", "x"), **objs)
    assert not allowed(SA, res("create", "pods", "x", "p", sub="exec"), **objs)
    assert not allowed(SA, res("patch", "pods", "x", "p", sub="status"), **objs)
    assert allowed(SA, res("update", "slurmclusters", "x", "c", "slurmk8s.dev", "status"), **objs)
    assert not allowed(SA, res("update", "slurmclusters", "x", "c", "slurmk8s.dev"), **objs)
    star = dict(clusterroles=[crole("c", rule(["*"], ["*"], ["get"]))], clusterrolebindings=[crb("b", "c", sa_subject())])
    assert allowed(SA, res("get", "pods", "x", "p", sub="log"), **star)  # "*" covers subresources too


def test_non_resource_urls_with_trailing_star() -> None:
    objs = dict(clusterroles=[crole("c", {"nonResourceURLs": ["/apis/*", "/version"], "verbs": ["get"]})],
                clusterrolebindings=[crb("b", "c", {"kind": "Group", "name": "dev"})])

    def path(p, verb="get"):
        return Attributes(verb, resource_request=False, path=p)

    assert allowed(ALICE, path("/apis/apps/v1"), **objs)
    assert allowed(ALICE, path("/version"), **objs)
    assert not allowed(ALICE, path("/version/x"), **objs)
    assert not allowed(ALICE, path("/api"), **objs)
    assert not allowed(ALICE, path("/apis/x", "post"), **objs)


def test_aggregated_rules_gather_the_selected_roles_rules_by_name_each_once() -> None:
    """As Kubernetes' clusterrole-aggregation controller: per selector, the
    matched roles by name, their stored rules, each rule once, itself left out."""
    to = {"rbac.example/aggregate-to-agg": "true"}
    get = rule(["slurmk8s.dev"], ["slurmclusters"], ["get"])
    write = rule(["slurmk8s.dev"], ["slurmclusters"], ["create"])
    agg = crole("agg", rule(["stale"], ["x"], ["get"]), labels=to, aggregate=to)
    roles = [agg, crole("b-part", write, get, labels=to), crole("a-part", get, labels=to),
             crole("other", rule([""], ["secrets"], ["get"]), labels={"rbac.example/aggregate-to-agg": "false"})]
    assert aggregated_rules(agg, roles) == [get, write]
    assert aggregated_rules(roles[1], roles) is None  # not aggregated
    assert aggregated_rules(crole("none", aggregate={"rbac.example/nothing": "true"}), roles) == []


def test_the_authorizer_reads_only_the_stored_rules_of_an_aggregated_role() -> None:
    """Until the controller has written them, an aggregated role grants nothing,
    whatever roles its selectors match (Kubernetes' authorizer never aggregates)."""
    to = {"rbac.example/aggregate-to-agg": "true"}
    part = crole("part", rule(["slurmk8s.dev"], ["slurmclusters"], ["get"]), labels=to)
    agg = crole("agg", aggregate=to)
    binding = crb("b", "agg", sa_subject())
    want = res("get", "slurmclusters", "x", "c", "slurmk8s.dev")
    assert not allowed(SA, want, clusterroles=[agg, part], clusterrolebindings=[binding])
    filled = dict(agg, rules=aggregated_rules(agg, [agg, part]))
    assert allowed(SA, want, clusterroles=[filled, part], clusterrolebindings=[binding])


def aggregate_until_stable(roles: list[dict]) -> list[dict]:
    """What the controller converges to: aggregated roles filled until nothing changes."""
    for _ in range(len(roles) + 1):
        before = roles
        roles = [dict(r, rules=aggregated_rules(r, roles)) if r.get("aggregationRule") else r for r in roles]
        if roles == before:
            return roles
    raise AssertionError("aggregation did not settle")


def test_admin_edit_view_are_built_by_aggregation_and_grant_nothing_of_slurmk8s_dev() -> None:
    """The bootstrap `admin`, `edit` and `view` hold no rules of their own: their
    grants come from system:aggregate-to-*, view's through edit into admin,
    and no bootstrap role names slurmk8s.dev (its chart's roles must)."""
    roles = policy.cluster_roles()
    by_name = {r["metadata"]["name"]: r for r in roles}
    for name in ("admin", "edit", "view"):
        assert by_name[name]["rules"] == [] and by_name[name]["aggregationRule"]
    assert not [r for r in roles for rr in r["rules"] if "slurmk8s.dev" in rr.get("apiGroups", ())]
    settled = aggregate_until_stable(roles)
    p = Policy(clusterroles=settled)

    def can(role: str, attrs: Attributes) -> bool:
        return authorize(ALICE, attrs, policy=Policy(clusterroles=settled, rolebindings=[
            rb("x", "b", "ClusterRole", role, {"kind": "User", "name": "alice"})]))[0]

    assert p.role_rules({"kind": "ClusterRole", "name": "view"}, "")[0]
    for role in ("view", "edit", "admin"):
        assert can(role, res("list", "pods", "x")), role
        assert not can(role, res("get", "slurmclusters", "x", "c", "slurmk8s.dev")), role
        assert not can(role, res("create", "nodelendingpolicies", "x", group="slurmk8s.dev")), role
    assert not can("view", res("create", "pods", "x")) and not can("view", res("get", "secrets", "x", "s"))
    assert can("edit", res("create", "pods", "x")) and can("admin", res("create", "pods", "x"))
    assert not can("edit", res("create", "rolebindings", "x", group="rbac.authorization.k8s.io"))
    assert can("admin", res("create", "rolebindings", "x", group="rbac.authorization.k8s.io"))


def test_rules_for_lists_cluster_and_namespace_rules() -> None:
    objs = dict(roles=[role("x", "r", rule([""], ["secrets"], ["get"], ["s1"]))],
                rolebindings=[rb("x", "b", "Role", "r", sa_subject())],
                clusterroles=[crole("c", {"nonResourceURLs": ["/healthz"], "verbs": ["get"]})],
                clusterrolebindings=[crb("cb", "c", {"kind": "Group", "name": "system:authenticated"})])
    resource_rules, nonresource = rules_for(SA, "x", **objs)
    assert resource_rules == [{"verbs": ["get"], "apiGroups": [""], "resources": ["secrets"], "resourceNames": ["s1"]}]
    assert nonresource == [{"verbs": ["get"], "nonResourceURLs": ["/healthz"]}]
    assert rules_for(SA, "other", **objs)[0] == []


def test_forbidden_messages_are_kubernetes_words() -> None:
    assert forbidden_message(SA, res("list", "secrets", "default")) == (
        'secrets is forbidden: User "system:serviceaccount:x:y" cannot list resource "secrets" in API group "" in the namespace "default"')
    assert forbidden_message(SA, res("get", "secrets", "default", "n")) == (
        'secrets "n" is forbidden: User "system:serviceaccount:x:y" cannot get resource "secrets" in API group "" in the namespace "default"')
    assert forbidden_message(ALICE, res("list", "nodes")) == (
        'nodes is forbidden: User "alice" cannot list resource "nodes" in API group "" at the cluster scope')
    assert forbidden_message(ALICE, res("create", "pods", "x", "p", sub="exec")) == (
        'pods "p" is forbidden: User "alice" cannot create resource "pods/exec" in API group "" in the namespace "x"')
    assert forbidden_message(ALICE, res("list", "deployments", "x", group="apps")) == (
        'deployments.apps is forbidden: User "alice" cannot list resource "deployments" in API group "apps" in the namespace "x"')
    assert forbidden_message(ALICE, Attributes("get", resource_request=False, path="/foo")) == (
        'forbidden: User "alice" cannot get path "/foo"')
    assert forbidden_details(res("get", "deployments", "x", "d", "apps")) == {"name": "d", "group": "apps", "kind": "deployments"}


def test_request_attributes_resolve_like_kubernetes() -> None:
    ra = request_attributes
    assert ra("GET", "/api/v1/namespaces/x/secrets", {}) == res("list", "secrets", "x") | _v("v1")
    assert ra("GET", "/api/v1/namespaces/x/secrets", {"watch": "1"}).verb == "watch"
    assert ra("GET", "/api/v1/namespaces/x/secrets", {"watch": "false"}).verb == "list"
    assert ra("GET", "/api/v1/watch/namespaces/x/secrets/s", {}) == res("watch", "secrets", "x", "s") | _v("v1")
    assert ra("GET", "/api/v1/pods", {"fieldSelector": "metadata.name=p"}) == res("list", "pods", name="p") | _v("v1")
    assert ra("DELETE", "/api/v1/namespaces/x/pods", {}).verb == "deletecollection"
    assert ra("GET", "/api/v1/namespaces/x", {}) == res("get", "namespaces", "x", "x") | _v("v1")
    assert ra("PUT", "/api/v1/namespaces/x/finalize", {}) == res("update", "namespaces", "x", "x", sub="finalize") | _v("v1")
    assert ra("GET", "/api/v1/namespaces/x/pods/p/exec", {}) == res("create", "pods", "x", "p", sub="exec") | _v("v1")
    assert ra("POST", "/api/v1/namespaces/x/serviceaccounts/s/token", {}) == res("create", "serviceaccounts", "x", "s", sub="token") | _v("v1")
    assert ra("PATCH", "/apis/slurmk8s.dev/v1alpha1/namespaces/x/slurmclusters/c/status", {}) == (
        res("patch", "slurmclusters", "x", "c", "slurmk8s.dev", "status") | _v("v1alpha1"))
    for p in ("/api", "/apis", "/api/v1", "/apis/apps", "/apis/apps/v1", "/openapi/v3", "/version", "/healthz"):
        assert ra("GET", p, {}) == Attributes("get", resource_request=False, path=p)


class _v:  # noqa: N801 - read as a suffix: `attrs | _v("v1")`
    def __init__(self, version: str) -> None:
        self.version = version

    def __ror__(self, a: Attributes) -> Attributes:
        import dataclasses

        return dataclasses.replace(a, api_version=self.version)


def test_bootstrap_policy_gives_the_kubelet_what_it_needs() -> None:
    p = Policy(clusterroles=policy.cluster_roles(), clusterrolebindings=policy.cluster_role_bindings())
    kubelet = User("system:node:sandbox", ("system:nodes", "system:authenticated"))
    for a in (res("patch", "nodes", name="n", sub="status"), res("list", "pods"), res("patch", "pods", "x", "p", sub="status"),
              res("delete", "pods", "x", "p"), res("create", "serviceaccounts", "x", "s", sub="token"), res("get", "secrets", "x", "s"),
              res("create", "events", "x"), res("update", "leases", "kube-node-lease", "n", "coordination.k8s.io"),
              # what sandbox/kubelet.py calls
              res("create", "nodes"), res("patch", "nodes", name="n"), res("list", "services"), res("list", "configmaps", "x"),
              res("list", "secrets", "x"), res("get", "configmaps", "x", "kube-root-ca.crt")):
        assert authorize(kubelet, a, policy=p)[0], a
    assert not authorize(kubelet, res("list", "clusterroles", group="rbac.authorization.k8s.io"), policy=p)[0]
    anyone = User("bob", ("system:authenticated",))
    assert authorize(anyone, Attributes("get", resource_request=False, path="/apis/apps/v1"), policy=p)[0]
    assert authorize(anyone, res("create", "selfsubjectaccessreviews", group="authorization.k8s.io"), policy=p)[0]
    assert not authorize(anyone, res("list", "pods", "x"), policy=p)[0]
    anonymous = User("system:anonymous", ("system:unauthenticated",))
    assert authorize(anonymous, Attributes("get", resource_request=False, path="/healthz"), policy=p)[0]
    assert not authorize(anonymous, Attributes("get", resource_request=False, path="/api"), policy=p)[0]


def test_reconcile_adds_missing_rules_and_respects_autoupdate_false() -> None:
    wanted = policy.cluster_roles()[0]
    assert policy.reconcile(None, wanted) == wanted
    assert policy.reconcile(wanted, wanted) is None
    trimmed = dict(wanted, rules=wanted["rules"][:1])
    assert policy.reconcile(trimmed, wanted)["rules"] == wanted["rules"]
    extra = dict(wanted, rules=wanted["rules"] + [rule(["x"], ["y"], ["get"])])
    assert policy.reconcile(extra, wanted) is None  # user additions are kept
    frozen = dict(trimmed, metadata=dict(trimmed["metadata"], annotations={"rbac.authorization.kubernetes.io/autoupdate": "false"}))
    assert policy.reconcile(frozen, wanted) is None
    # An aggregated role: its selectors and labels come back, its rules are the controller's.
    view = next(r for r in policy.cluster_roles() if r["metadata"]["name"] == "view")
    filled = dict(view, rules=[rule([""], ["pods"], ["get"])])
    assert policy.reconcile(filled, view) is None
    bare = dict(filled, aggregationRule={"clusterRoleSelectors": []},
                metadata=dict(view["metadata"], labels={"kubernetes.io/bootstrapping": "mine"}))
    fixed = policy.reconcile(bare, view)
    assert fixed["aggregationRule"] == view["aggregationRule"] and fixed["rules"] == filled["rules"]
    assert fixed["metadata"]["labels"] == {"kubernetes.io/bootstrapping": "mine",
                                           "rbac.authorization.k8s.io/aggregate-to-edit": "true"}


# --- properties ------------------------------------------------------------------------

names = st.sampled_from(["pods", "secrets", "nodes", "slurmclusters", "deployments"])
groups = st.sampled_from(["", "apps", "slurmk8s.dev"])
verbs = st.sampled_from(["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"])
subs = st.sampled_from(["", "status", "exec", "scale"])
namespaces = st.sampled_from(["", "x", "y"])
objnames = st.sampled_from(["", "a", "b"])
attributes = st.builds(res, verbs, names, namespaces, objnames, groups, subs)
rules = st.builds(rule, st.lists(st.sampled_from(["", "apps", "slurmk8s.dev", "*"]), min_size=1, max_size=2),
                  st.lists(st.sampled_from(["pods", "secrets", "nodes", "pods/exec", "*/status", "*", "slurmclusters"]), min_size=1, max_size=3),
                  st.lists(st.sampled_from(["get", "list", "watch", "create", "update", "*"]), min_size=1, max_size=3),
                  st.one_of(st.none(), st.lists(st.sampled_from(["a", "b"]), min_size=1, max_size=2)))


@given(attributes, st.lists(rules, max_size=4))
def test_a_user_with_no_bindings_is_never_allowed(a: Attributes, rs: list) -> None:
    assert not allowed(ALICE, a, clusterroles=[crole("c", *rs)], roles=[role("x", "r", *rs)])


@given(attributes, st.lists(rules, max_size=4), st.lists(rules, max_size=2))
def test_more_rules_never_allow_less(a: Attributes, rs: list, more: list) -> None:
    base = dict(clusterroles=[crole("c", *rs)], clusterrolebindings=[crb("b", "c", {"kind": "User", "name": "alice"})])
    bigger = dict(clusterroles=[crole("c", *rs, *more)], clusterrolebindings=base["clusterrolebindings"])
    if allowed(ALICE, a, **base):
        assert allowed(ALICE, a, **bigger)


@given(attributes, st.lists(rules, max_size=4))
def test_a_cluster_role_binding_allows_everything_its_role_binding_allows(a: Attributes, rs: list) -> None:
    narrow = dict(clusterroles=[crole("c", *rs)], rolebindings=[rb("x", "b", "ClusterRole", "c", {"kind": "User", "name": "alice"})])
    wide = dict(clusterroles=[crole("c", *rs)], clusterrolebindings=[crb("b", "c", {"kind": "User", "name": "alice"})])
    if allowed(ALICE, a, **narrow):
        assert a.namespace == "x"
        assert allowed(ALICE, a, **wide)


@given(attributes, rules)
def test_named_rules_never_match_unnamed_requests(a: Attributes, r: dict) -> None:
    if r.get("resourceNames") and not a.name:
        assert not rule_allows(a, r)


@given(attributes)
def test_wildcard_rule_allows_every_resource_request(a: Attributes) -> None:
    assert rule_allows(a, rule(["*"], ["*"], ["*"]))


def test_escalation_coverage_as_kubernetes_compares_rules() -> None:
    from sandbox.apiserver.rbac import uncovered

    held = [rule([""], ["pods", "*/status"], ["get", "list"]), rule(["apps"], ["*"], ["*"]), {"nonResourceURLs": ["/apis/*"], "verbs": ["get"]}]
    assert uncovered(held, [rule([""], ["pods"], ["get"])]) == []
    assert uncovered(held, [rule([""], ["pods/status"], ["list"])]) == []
    assert uncovered(held, [rule(["apps"], ["deployments/scale"], ["patch"], ["d"])]) == []
    assert uncovered(held, [{"nonResourceURLs": ["/apis/apps"], "verbs": ["get"]}]) == []
    assert uncovered(held, [rule([""], ["pods"], ["get", "delete"])]) == [{"verbs": ["delete"], "apiGroups": [""], "resources": ["pods"]}]
    assert uncovered(held, [rule(["*"], ["pods"], ["get"])]) == [{"verbs": ["get"], "apiGroups": ["*"], "resources": ["pods"]}]
    named = [rule([""], ["secrets"], ["get"], ["a"])]
    assert uncovered(named, [rule([""], ["secrets"], ["get"], ["a"])]) == []
    assert uncovered(named, [rule([""], ["secrets"], ["get"])]) != []


@given(st.lists(rules, max_size=4))
def test_every_rule_set_covers_itself(rs: list) -> None:
    from sandbox.apiserver.rbac import uncovered

    assert uncovered(rs, rs) == []


@given(st.lists(rules, min_size=1, max_size=3), attributes)
def test_covered_rules_allow_nothing_the_holder_could_not(rs: list, a: Attributes) -> None:
    from sandbox.apiserver.rbac import breakdown

    held = [one for r in rs for one in breakdown(r)][:3]
    if any(rule_allows(a, r) for r in held):
        assert any(rule_allows(a, r) for r in rs)
