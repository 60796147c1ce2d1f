"""What a component of slurmk8s may do through the Kubernetes API, as the RBAC
authorizer sees it: a :class:`Permission` (verb, API group, resource, and
where), what a declared list of them grants (:func:`grants`) and whether that
allows a request (:func:`allows`). Pure. The lists themselves are the
operator's (``slurmk8s/operator/permissions.py``) and the bridge's
(``slurmk8s/bridge/permissions.py``); the Helm chart grants exactly those.

Where a permission is needed:

- :data:`WATCHED`: in each namespace whose objects the component watches;
- :data:`CLUSTER`: cluster-wide (cluster-scoped kinds, or every namespace);
- :data:`LISTED`: cluster-wide, needed only when the component watches listed
  namespaces, not with all namespaces;
- :data:`RELEASE`: in the component's own namespace (the Helm release's:
  its Lease);
- a namespace's name: in that namespace only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from .kube import RESOURCES

__all__ = ["Permission", "WATCHED", "CLUSTER", "LISTED", "RELEASE", "Grant", "grants", "allows", "of_kind"]

WATCHED = "watched"
CLUSTER = "cluster"
LISTED = "cluster-when-namespaces-are-listed"
RELEASE = "release-namespace"


class Permission(NamedTuple):
    verb: str
    group: str  # "" is the core API
    resource: str  # plural, or plural/subresource
    scope: str  # WATCHED, CLUSTER, LISTED or a namespace


def of_kind(kind: str) -> tuple[str, str]:
    """(API group, resource) of a kind the Kubernetes client knows (``kube.RESOURCES``)."""
    r = RESOURCES[kind]
    return r.api_version.rpartition("/")[0], r.plural


Grant = tuple[str, str, str]  # (verb, group, resource)


def grants(permissions: Iterable[Permission], namespaces: Sequence[str] | None,
           release: str | None = None) -> dict[str | None, set[Grant]]:
    """Where each permission is needed, for a component watching ``namespaces``
    (None: every namespace) and running in ``release`` (None: leave out what
    it needs there): namespace -> {(verb, group, resource)}, with None for
    cluster-wide. Pure; what a chart's roles must add up to."""
    out: dict[str | None, set[Grant]] = {}
    for p in permissions:
        g = (p.verb, p.group, p.resource)
        where: Iterable[str | None]
        if p.scope == RELEASE:
            where = (release,) if release else ()
        elif p.scope == LISTED:
            where = () if namespaces is None else (None,)
        elif p.scope == CLUSTER or namespaces is None:
            where = (None,)
        elif p.scope == WATCHED:
            where = namespaces
        else:
            where = (p.scope,)
        for ns in where:
            out.setdefault(ns, set()).add(g)
    return out


def allows(granted: Mapping[str | None, set[Grant]], verb: str, group: str, resource: str,
           namespace: str | None) -> bool:
    """Whether ``granted`` (as :func:`grants` returns) allows one request;
    ``namespace`` None: a cluster-wide request or a cluster-scoped kind."""
    g = (verb, group, resource)
    return g in granted.get(None, ()) or (namespace is not None and g in granted.get(namespace, ()))
