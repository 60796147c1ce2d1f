"""What the operator may do through the Kubernetes API: the one declared list.

Each :class:`Permission` is an API call the operator makes, through its own
client (``round.py`` with ``slurmk8s/kube.py``) or through kopf (``handlers.py``,
``main.py``), as the RBAC authorizer sees it: a verb, an API group, a
resource (``resource/subresource`` for a subresource) and where:

- :data:`WATCHED`: in each namespace whose SlurmClusters it watches;
- :data:`CLUSTER`: cluster-wide (cluster-scoped kinds, or every namespace);
- :data:`LISTED`: cluster-wide, needed only when the operator watches listed
  namespaces (``--namespace``), not with ``--all-namespaces``;
- a namespace's name: in that namespace only.

The kinds of permission, and what a set of them grants, are
``slurmk8s.permissions``'s. The Helm chart grants exactly these, no more (``tests/test_chart.py`` compares
the rendered Roles and ClusterRoles with :func:`grants` and asks the API
stand-in with SubjectAccessReviews). A new call in the code is a new line
here, and the test then names the rule the chart lacks.

Not listed: discovery (``/api``, ``/apis``, ``/version``), which kopf reads
at start; Kubernetes grants it to every authenticated client
(``system:discovery``).
"""

from __future__ import annotations

from slurmk8s import leader
from slurmk8s.api.cluster import GROUP
from slurmk8s.permissions import CLUSTER, LISTED, WATCHED, Permission, of_kind

from .plan import MANAGED_KINDS

__all__ = ["OPERATOR"]

def _rendered() -> tuple[Permission, ...]:
    """The kinds ``slurmk8s render`` produces (``plan.MANAGED_KINDS``)
    but Secrets: listed by the cluster's label each round, applied
    (server-side apply is a PATCH; Kubernetes authorizes one that creates the
    object as create too, and create is the fallback of a server without
    apply), deleted when a spec change drops them and at teardown."""
    out = []
    for kind in MANAGED_KINDS:
        if kind == "Secret":
            continue
        group, resource = of_kind(kind)
        out += [Permission(verb, group, resource, WATCHED) for verb in ("list", "create", "patch", "delete")]
    return tuple(out)


OPERATOR: tuple[Permission, ...] = (
    # kopf lists, then watches, the SlurmClusters of each watched namespace.
    Permission("list", GROUP, "slurmclusters", WATCHED),
    Permission("watch", GROUP, "slurmclusters", WATCHED),
    # kopf adds and removes its finalizer (slurmk8s.dev/teardown) and keeps
    # its bookkeeping in slurmk8s.dev/ annotations, with patches.
    Permission("patch", GROUP, "slurmclusters", WATCHED),
    # round.py: phase, conditions, configHash.
    Permission("patch", GROUP, "slurmclusters/status", WATCHED),
    # Rendered objects carry an ownerReference to their SlurmCluster with
    # blockOwnerDeletion, which the OwnerReferencesPermissionEnforcement
    # admission plugin allows only with update on the owner's finalizers.
    Permission("update", GROUP, "slurmclusters/finalizers", WATCHED),
    # kopf posts core/v1 Events about SlurmClusters (create only).
    Permission("create", "", "events", WATCHED),
    # round.py: while a workload has fewer pods than it wants, its
    # controller's FailedCreate Events say why (Pod Security, a quota); while
    # a claim is not bound, its provisioner's Events say why (StorageReady).
    Permission("list", "", "events", WATCHED),
    *_rendered(),
    # Key Secrets (munge, JWT, SSH host keys, agent token): read by name each
    # round (a 404 means missing), created once and never updated, deleted at
    # teardown. Never listed: no other Secret can be enumerated.
    Permission("get", "", "secrets", WATCHED),
    Permission("create", "", "secrets", WATCHED),
    Permission("delete", "", "secrets", WATCHED),
    # A ConfigMap the spec names (spec.identity.ldap.ca.configMap), read by name
    # to check its slurmk8s.dev/configmap-use label (api/secrets.py). Never listed.
    Permission("get", "", "configmaps", WATCHED),
    # The cluster's pods, listed by its label; patched with drain annotations
    # and the busy label; a worker deleted once drained (scale-in, restarts).
    Permission("list", "", "pods", WATCHED),
    Permission("patch", "", "pods", WATCHED),
    Permission("delete", "", "pods", WATCHED),
    # spec.topology: a worker's Node, by name, for its switch labels.
    Permission("get", "", "nodes", CLUSTER),
    # kopf notices CRDs being installed, upgraded or removed.
    Permission("list", "apiextensions.k8s.io", "customresourcedefinitions", CLUSTER),
    Permission("watch", "apiextensions.k8s.io", "customresourcedefinitions", CLUSTER),
    # With listed namespaces, kopf follows them appearing and going (with
    # --all-namespaces it does not read namespaces at all).
    Permission("list", "", "namespaces", LISTED),
    Permission("watch", "", "namespaces", LISTED),
    # Of the replicas, only the holder of the Lease slurmk8s-operator acts (slurmk8s/leader.py).
    *leader.PERMISSIONS,
)
