"""Kubernetes RBAC as a pure function: who may do what, from Roles, ClusterRoles
and their bindings (plain dicts, as stored), with the semantics of
``k8s.io/kubernetes/plugin/pkg/auth/authorizer/rbac`` and the privileged
``system:masters`` group in front of it.

Nothing here does I/O: :func:`authorize` and :func:`rules_for` take the
objects they need and answer.

One module though over 400 lines: Kubernetes' RBAC authorizer is one rule set
(matching, bindings, 403 messages, escalation checks), pure and tested whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .selectors import from_label_selector_object, labels_match

MASTERS = "system:masters"
AUTHENTICATED = "system:authenticated"
UNAUTHENTICATED = "system:unauthenticated"
ANONYMOUS = "system:anonymous"
SA_PREFIX = "system:serviceaccount:"
SA_GROUP = "system:serviceaccounts"


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict, hash=False, compare=False)

    def info(self) -> dict[str, Any]:
        """As ``UserInfo`` in TokenReview / SelfSubjectReview."""
        out: dict[str, Any] = {"username": self.name, "groups": list(self.groups)}
        if self.uid:
            out["uid"] = self.uid
        if self.extra:
            out["extra"] = {k: list(v) for k, v in self.extra.items()}
        return out


@dataclass(frozen=True)
class Attributes:
    """What a request asks to do (Kubernetes' ``authorizer.Attributes``)."""

    verb: str
    resource_request: bool = True
    namespace: str = ""
    api_group: str = ""
    api_version: str = ""
    resource: str = ""
    subresource: str = ""
    name: str = ""
    path: str = ""  # non-resource requests


def service_account_user(namespace: str, name: str) -> str:
    return f"{SA_PREFIX}{namespace}:{name}"


def split_service_account(username: str) -> tuple[str, str] | None:
    """``(namespace, name)`` of ``system:serviceaccount:<ns>:<name>``, else None."""
    if not username.startswith(SA_PREFIX):
        return None
    parts = username[len(SA_PREFIX):].split(":")
    if len(parts) != 2 or not all(parts):
        return None
    return parts[0], parts[1]


def service_account_groups(namespace: str) -> tuple[str, ...]:
    return (SA_GROUP, f"{SA_GROUP}:{namespace}", AUTHENTICATED)


# --- rule matching (rbac/v1 helpers in Kubernetes) ---------------------------------


def verb_matches(rule: Mapping, verb: str) -> bool:
    return any(v == "*" or v == verb for v in rule.get("verbs") or ())


def api_group_matches(rule: Mapping, group: str) -> bool:
    return any(g == "*" or g == group for g in rule.get("apiGroups") or ())


def resource_matches(rule: Mapping, combined: str, subresource: str) -> bool:
    for r in rule.get("resources") or ():
        if r == "*" or r == combined:
            return True
        if subresource and r == "*/" + subresource:
            return True
    return False


def resource_name_matches(rule: Mapping, name: str) -> bool:
    names = rule.get("resourceNames") or ()
    return not names or name in names  # a request without a name never matches a named rule


def non_resource_url_matches(rule: Mapping, path: str) -> bool:
    for u in rule.get("nonResourceURLs") or ():
        if u == "*" or u == path:
            return True
        if u.endswith("*") and path.startswith(u[:-1]):
            return True
    return False


def rule_allows(attrs: Attributes, rule: Mapping) -> bool:
    if attrs.resource_request:
        combined = attrs.resource + ("/" + attrs.subresource if attrs.subresource else "")
        return (verb_matches(rule, attrs.verb) and api_group_matches(rule, attrs.api_group)
                and resource_matches(rule, combined, attrs.subresource) and resource_name_matches(rule, attrs.name))
    return verb_matches(rule, attrs.verb) and non_resource_url_matches(rule, attrs.path)


def subject_applies(subject: Mapping, user: User, binding_namespace: str) -> bool:
    kind = subject.get("kind")
    name = subject.get("name") or ""
    if kind == "User":
        return user.name == name
    if kind == "Group":
        return name in user.groups
    if kind == "ServiceAccount":
        ns = subject.get("namespace") or binding_namespace
        return bool(ns) and user.name == service_account_user(ns, name)
    return False


# --- role resolution -----------------------------------------------------------------


def _meta(obj: Mapping) -> Mapping:
    return obj.get("metadata") or {}


def _index(objs: Iterable[Mapping]) -> dict[tuple[str, str], Mapping]:
    return {((_meta(o).get("namespace") or ""), _meta(o).get("name") or ""): o for o in objs}


def aggregated_rules(clusterrole: Mapping, clusterroles: Iterable[Mapping]) -> list[Mapping] | None:
    """The rules an aggregated ClusterRole should hold, as Kubernetes'
    clusterrole-aggregation controller computes them: for each selector in
    turn, the stored rules of every other ClusterRole it matches (by name),
    each rule once. ``None`` when the role has no ``aggregationRule``.

    The rules of a selected role that is itself aggregated are its stored
    ones, so ``view`` reaches ``admin`` through ``edit`` once the controller
    has filled ``edit``. The authorizer reads only stored rules."""
    agg = clusterrole.get("aggregationRule")
    if agg is None:
        return None
    me = _meta(clusterrole).get("name")
    others = sorted((o for o in clusterroles if _meta(o).get("name") != me), key=lambda o: _meta(o).get("name") or "")
    out: list[Mapping] = []
    for raw in agg.get("clusterRoleSelectors") or ():
        selector = from_label_selector_object(raw)
        if selector is None:
            continue
        for other in others:
            if labels_match(selector, _meta(other).get("labels") or {}):
                out.extend(r for r in other.get("rules") or () if r not in out)
    return out


@dataclass
class Policy:
    """The RBAC objects, indexed. Build one per decision or cache it per store version."""

    roles: Sequence[Mapping] = ()
    clusterroles: Sequence[Mapping] = ()
    rolebindings: Sequence[Mapping] = ()
    clusterrolebindings: Sequence[Mapping] = ()

    def __post_init__(self) -> None:
        self._roles = _index(self.roles)
        self._clusterroles = _index(self.clusterroles)

    def role_rules(self, ref: Mapping, namespace: str) -> tuple[list[Mapping], str] | None:
        kind, name = ref.get("kind"), ref.get("name") or ""
        if kind == "ClusterRole":
            cr = self._clusterroles.get(("", name))
            return (list(cr.get("rules") or ()), f'ClusterRole "{name}"') if cr is not None else None
        if kind == "Role" and namespace:
            r = self._roles.get((namespace, name))
            return (list(r.get("rules") or ()), f'Role "{name}"') if r is not None else None
        return None

    def visit(self, user: User, namespace: str):
        """Yields ``(source, rules)`` for every binding that applies to ``user``:
        cluster role bindings, then role bindings in ``namespace``."""
        for b in self.clusterrolebindings:
            if any(subject_applies(s, user, "") for s in b.get("subjects") or ()):
                found = self.role_rules(b.get("roleRef") or {}, "")
                if found is not None:
                    yield f'ClusterRoleBinding "{_meta(b).get("name")}" of {found[1]}', found[0]
        if not namespace:
            return
        for b in self.rolebindings:
            if (_meta(b).get("namespace") or "") != namespace:
                continue
            if any(subject_applies(s, user, namespace) for s in b.get("subjects") or ()):
                found = self.role_rules(b.get("roleRef") or {}, namespace)
                if found is not None:
                    yield f'RoleBinding "{_meta(b).get("name")}/{namespace}" of {found[1]}', found[0]


def _subject_text(user: User) -> str:
    sa = split_service_account(user.name)
    if sa:
        return f'ServiceAccount "{sa[1]}/{sa[0]}"'
    return f'User "{user.name}"'


def authorize(user: User, attrs: Attributes, roles: Sequence[Mapping] = (), clusterroles: Sequence[Mapping] = (),
              rolebindings: Sequence[Mapping] = (), clusterrolebindings: Sequence[Mapping] = (),
              policy: Policy | None = None) -> tuple[bool, str]:
    """``(allowed, reason)`` as the privileged-group and RBAC authorizers answer."""
    if MASTERS in user.groups:
        return True, f'allowed by group "{MASTERS}"'
    policy = policy or Policy(roles, clusterroles, rolebindings, clusterrolebindings)
    for source, rules in policy.visit(user, attrs.namespace if attrs.resource_request else ""):
        if any(rule_allows(attrs, r) for r in rules):
            return True, f"RBAC: allowed by {source} to {_subject_text(user)}"
    return False, ""


def rules_for(user: User, namespace: str, roles: Sequence[Mapping] = (), clusterroles: Sequence[Mapping] = (),
              rolebindings: Sequence[Mapping] = (), clusterrolebindings: Sequence[Mapping] = (),
              policy: Policy | None = None) -> tuple[list[dict], list[dict]]:
    """``(resourceRules, nonResourceRules)`` of ``user`` in ``namespace``, as
    SelfSubjectRulesReview answers them."""
    if MASTERS in user.groups:
        return ([{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}],
                [{"verbs": ["*"], "nonResourceURLs": ["*"]}])
    policy = policy or Policy(roles, clusterroles, rolebindings, clusterrolebindings)
    res: list[dict] = []
    nonres: list[dict] = []
    for _source, rules in policy.visit(user, namespace):
        for r in rules:
            if r.get("nonResourceURLs"):
                out = {"verbs": list(r.get("verbs") or ()), "nonResourceURLs": list(r["nonResourceURLs"])}
                if out not in nonres:
                    nonres.append(out)
            else:
                out = {"verbs": list(r.get("verbs") or ()), "apiGroups": list(r.get("apiGroups") or ()),
                       "resources": list(r.get("resources") or ())}
                if r.get("resourceNames"):
                    out["resourceNames"] = list(r["resourceNames"])
                if out not in res:
                    res.append(out)
    return res, nonres


# --- messages -------------------------------------------------------------------------


def forbidden_message(user: User, attrs: Attributes, reason: str = "") -> str:
    """The message of a 403, exactly as kube-apiserver writes it
    (``responsewriters.forbiddenMessage`` wrapped by ``errors.NewForbidden``)."""
    if not attrs.resource_request:
        inner = f'User "{user.name}" cannot {attrs.verb} path "{attrs.path}"'
    else:
        resource = attrs.resource + ("/" + attrs.subresource if attrs.subresource else "")
        where = f'in the namespace "{attrs.namespace}"' if attrs.namespace else "at the cluster scope"
        inner = f'User "{user.name}" cannot {attrs.verb} resource "{resource}" in API group "{attrs.api_group}" {where}'
    if reason:
        inner = f"{inner}: {reason}"
    if not attrs.resource_request or not attrs.resource:
        return f"forbidden: {inner}"
    qualified = f"{attrs.resource}.{attrs.api_group}" if attrs.api_group else attrs.resource
    if attrs.name:
        return f'{qualified} "{attrs.name}" is forbidden: {inner}'
    return f"{qualified} is forbidden: {inner}"


def forbidden_details(attrs: Attributes) -> dict[str, str]:
    out = {}
    if attrs.name:
        out["name"] = attrs.name
    if attrs.resource_request and attrs.api_group:
        out["group"] = attrs.api_group
    if attrs.resource_request and attrs.resource:
        out["kind"] = attrs.resource
    return out


# --- the request's attributes (Kubernetes' RequestInfoFactory) ------------------------

NAMESPACE_SUBRESOURCES = ("status", "finalize")
CONNECT_SUBRESOURCES = ("exec", "attach", "portforward")


def request_attributes(method: str, path: str, query: Mapping[str, Any]) -> Attributes:
    """What ``method path?query`` asks for, as Kubernetes' RequestInfoFactory
    resolves it (the verb, group, resource, subresource, namespace and name)."""
    method = method.upper()
    parts = [p for p in path.strip("/").split("/") if p]
    if not parts or parts[0] not in ("api", "apis") or len(parts) < (2 if parts[0] == "api" else 3):
        return Attributes(verb=method.lower() if method != "HEAD" else "get", resource_request=False, path=path)
    if parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    else:
        group, version, rest = parts[1], parts[2], parts[3:]
    if not rest:  # /api/v1, /apis/g/v: discovery
        return Attributes(verb=method.lower() if method != "HEAD" else "get", resource_request=False, path=path)
    verb = {"POST": "create", "GET": "get", "HEAD": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method, "")
    if rest[0] == "watch":
        verb, rest = "watch", rest[1:]
        if not rest:
            return Attributes(verb="get", resource_request=False, path=path)
    namespace = ""
    if rest[0] == "namespaces":
        if len(rest) > 1:
            namespace = rest[1]
            if len(rest) > 2 and rest[2] not in NAMESPACE_SUBRESOURCES:
                rest = rest[2:]
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else ""
    sub = rest[2] if len(rest) > 2 else ""
    if not name and verb == "get":
        verb = "list"
    if verb == "list":
        w = query.get("watch")
        if w is not None and str(w).lower() not in ("0", "false"):
            verb = "watch"
    if not name and verb == "delete":
        verb = "deletecollection"
    if verb in ("list", "watch", "deletecollection") and not name:
        for term in str(query.get("fieldSelector") or "").split(","):
            key, sep, value = term.partition("==") if "==" in term else term.partition("=")
            if sep and key.strip() == "metadata.name" and not key.endswith("!"):
                name = value.strip()
    if sub in CONNECT_SUBRESOURCES and verb == "get":
        verb = "create"  # a websocket upgrade (GET) runs a command as a POST would
    return Attributes(verb=verb, namespace=namespace, api_group=group, api_version=version,
                      resource=resource, subresource=sub, name=name)


# --- escalation prevention (Kubernetes' rbac/validation policy comparator) -------------


def breakdown(rule: Mapping) -> list[dict]:
    """A rule as rules of one verb, one group, one resource and at most one name."""
    out: list[dict] = []
    verbs = list(rule.get("verbs") or ())
    if rule.get("nonResourceURLs"):
        for url in rule["nonResourceURLs"]:
            for v in verbs:
                out.append({"verbs": [v], "nonResourceURLs": [url]})
        return out
    names = list(rule.get("resourceNames") or ()) or [None]
    for g in rule.get("apiGroups") or ():
        for r in rule.get("resources") or ():
            for v in verbs:
                for n in names:
                    one = {"verbs": [v], "apiGroups": [g], "resources": [r]}
                    if n is not None:
                        one["resourceNames"] = [n]
                    out.append(one)
    return out


def _has_all(owner: Sequence[str], wanted: Sequence[str]) -> bool:
    return all(w in owner for w in wanted)


def _resources_cover(owner: Sequence[str], wanted: Sequence[str]) -> bool:
    for w in wanted:
        if "*" in owner or w in owner:
            continue
        _, slash, sub = w.partition("/")
        if slash and "*/" + sub in owner:
            continue
        return False
    return True


def _urls_cover(owner: Sequence[str], wanted: Sequence[str]) -> bool:
    return all(any(o == w or (o.endswith("*") and w.startswith(o[:-1])) for o in owner) for w in wanted)


def rule_covers(owner: Mapping, sub: Mapping) -> bool:
    ov, sv = owner.get("verbs") or (), sub.get("verbs") or ()
    og, sg = owner.get("apiGroups") or (), sub.get("apiGroups") or ()
    on, sn = owner.get("resourceNames") or (), sub.get("resourceNames") or ()
    names = (not on) if not sn else (not on or _has_all(on, sn))
    return (("*" in ov or _has_all(ov, sv)) and ("*" in og or _has_all(og, sg))
            and _resources_cover(owner.get("resources") or (), sub.get("resources") or ())
            and _urls_cover(owner.get("nonResourceURLs") or (), sub.get("nonResourceURLs") or ()) and names)


def uncovered(owner_rules: Sequence[Mapping], wanted_rules: Sequence[Mapping]) -> list[dict]:
    """The pieces of ``wanted_rules`` no owner rule covers (empty: no escalation)."""
    return [one for r in wanted_rules for one in breakdown(r) if not any(rule_covers(o, one) for o in owner_rules)]


def escalation_message(user: User, missing: Sequence[Mapping]) -> str:
    def show(r: Mapping) -> str:
        if r.get("nonResourceURLs"):
            return f'{{NonResourceURLs:["{r["nonResourceURLs"][0]}"], Verbs:["{r["verbs"][0]}"]}}'
        names = f', ResourceNames:["{r["resourceNames"][0]}"]' if r.get("resourceNames") else ""
        return f'{{APIGroups:["{r["apiGroups"][0]}"], Resources:["{r["resources"][0]}"]{names}, Verbs:["{r["verbs"][0]}"]}}'

    groups = " ".join(f'"{g}"' for g in user.groups)
    return (f'user "{user.name}" (groups=[{groups}]) is attempting to grant RBAC permissions not currently held:\n'
            + "\n".join(show(r) for r in missing))
