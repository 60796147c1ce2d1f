"""What the bridge may do through the Kubernetes API: the one declared list.

Every call ``loop.py`` and ``rollout.py`` make, as
:class:`slurmk8s.permissions.Permission` (verb, API group,
resource, scope; that module explains the scopes). :data:`WATCHED` are the
namespaces whose NodeLendingPolicies the bridge acts on: a policy's
SlurmCluster, agent token, lent slurmd pods and serving Deployments live in
the policy's namespace. Nodes, and reading pods, are cluster-wide: GPU pods
in any namespace decide whether a node is idle and whether a lent node must
come back. The Helm chart grants exactly these (``tests/test_chart.py``).
"""

from __future__ import annotations

from .. import leader
from ..api.cluster import GROUP
from ..permissions import CLUSTER, WATCHED, Permission

__all__ = ["BRIDGE", "NODE_EVENTS_NAMESPACE"]

#: Events about Nodes (cluster-scoped) go here, as the kubelet's do (``Kube.event``).
NODE_EVENTS_NAMESPACE = "default"

BRIDGE: tuple[Permission, ...] = (
    # The policies are listed, then watched (slurmk8s/bridge/view.py); it never changes their spec.
    Permission("list", GROUP, "nodelendingpolicies", WATCHED),
    Permission("watch", GROUP, "nodelendingpolicies", WATCHED),
    # Lent, lending and reclaiming nodes and the Ready condition, in .status.
    Permission("patch", GROUP, "nodelendingpolicies/status", WATCHED),
    # The SlurmClusters, listed and watched: a policy's cluster, and the
    # checkpoint directories whose model versions roll serving Deployments.
    # Read by name when the bridge reads instead of watching (view.Listing).
    Permission("get", GROUP, "slurmclusters", WATCHED),
    Permission("list", GROUP, "slurmclusters", WATCHED),
    Permission("watch", GROUP, "slurmclusters", WATCHED),
    # <cluster>-agent-token, by name, to reach the cluster's Slurm agent. Never listed.
    Permission("get", "", "secrets", WATCHED),
    # The controller pod, by name: its address reaches the agent.
    Permission("get", "", "pods", WATCHED),
    # The lent slurmd pod <cluster>-lent.<node>, created on a lent node and
    # deleted when the node goes back.
    Permission("create", "", "pods", WATCHED),
    Permission("delete", "", "pods", WATCHED),
    # The lent pod's PodDisruptionBudget (<cluster>-lent.<node>, owned by the
    # pod), created while Slurm runs jobs there and deleted once none is left
    # or the node goes back; listed, then watched (view.py), to know which exist.
    Permission("list", "policy", "poddisruptionbudgets", WATCHED),
    Permission("watch", "policy", "poddisruptionbudgets", WATCHED),
    Permission("create", "policy", "poddisruptionbudgets", WATCHED),
    Permission("delete", "policy", "poddisruptionbudgets", WATCHED),
    # The lent pod has an ownerReference to its SlurmCluster with
    # blockOwnerDeletion, which OwnerReferencesPermissionEnforcement allows
    # only with update on the owner's finalizers.
    Permission("update", GROUP, "slurmclusters/finalizers", WATCHED),
    # Serving Deployments that follow a model directory: listed, and rolled
    # with a pod-template annotation patch.
    Permission("list", "apps", "deployments", WATCHED),
    Permission("patch", "apps", "deployments", WATCHED),
    # Events on policies and serving Deployments; each created once, never patched.
    Permission("create", "", "events", WATCHED),
    # ... and on Nodes, in the default namespace.
    Permission("create", "", "events", NODE_EVENTS_NAMESPACE),
    # Lending state is on the Node: label, annotations, taint, by merge patch
    # (taint changes carry the resourceVersion). No create, no delete.
    # Listed, then watched.
    Permission("list", "", "nodes", CLUSTER),
    Permission("watch", "", "nodes", CLUSTER),
    Permission("patch", "", "nodes", CLUSTER),
    # Every pod: GPU pods anywhere keep a node from being lent, pending ones take lent nodes back.
    # Listed, then watched.
    Permission("list", "", "pods", CLUSTER),
    Permission("watch", "", "pods", CLUSTER),
    # Of the replicas, only the holder of the Lease slurmk8s-bridge acts (slurmk8s/leader.py).
    *leader.PERMISSIONS,
)
