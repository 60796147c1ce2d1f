"""What is wrong with a policy as a whole, and what to do about it. Pure.

A problem gives the policy a ``Ready=False`` condition with a reason and a
message that says what to fix; nothing is lent meanwhile, and the reclaims
that follow from the policy's content stop too (``slurmk8s/bridge/README.md``).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..api.lending import LENDABLE_TO_LABEL, describe_selector
from ..api.podtemplate import mount_conflicts
from .observed import KubeNode
from .settings import Settings
from .world import World

__all__ = ["policy_problem"]


def policy_problem(world: World, settings: Settings, selected: Sequence[KubeNode]) -> tuple[str, str] | None:
    """(reason, message) of the first problem, or None: ClusterUnreadable,
    ClusterNotFound, PartitionNotFound, PartitionNotLendable, PodTemplateConflict,
    NoMatchingNodes, SlurmUnreachable."""
    policy = settings.policy
    assert policy is not None
    spec = policy.spec
    cluster = settings.cluster
    if settings.unreadable is not None:
        bad = settings.unreadable
        if bad.transient:
            return ("ClusterUnreadable", f"SlurmCluster {bad.key} could not be read ({bad.problem}); "
                    "nothing is lent until it can")
        return ("ClusterUnreadable",
                f"SlurmCluster {bad.key} cannot be loaded by the bridge ({bad.problem}); the operator judges "
                "it by the same rule, so fix the SlurmCluster (kubectl describe slurmcluster says why), or "
                "run the bridge and the operator of one release")
    if cluster is None:
        return ("ClusterNotFound",
                f"SlurmCluster {settings.namespace}/{spec.cluster_ref.name} does not exist; create it, "
                "or fix spec.clusterRef.name (the cluster must be in the policy's namespace)")
    parts = cluster.spec.partitions
    part = next((p for p in parts if p.name == spec.partition), None)
    if part is None:
        known = ", ".join(p.name for p in parts) or "(none)"
        return ("PartitionNotFound",
                f"SlurmCluster {settings.cluster_key} has no partition {spec.partition!r}; fix spec.partition "
                f"(partitions: {known})")
    if not part.accept_lent_nodes:
        index = parts.index(part)
        return ("PartitionNotLendable",
                f"partition {part.name!r} of SlurmCluster {settings.cluster_key} does not accept lent nodes; "
                f"set spec.partitions[{index}].acceptLentNodes: true on the SlurmCluster")
    if spec.pod_template is not None:
        # The one rule of the validator, against what the policy alone cannot know: the
        # cluster's shared storage, which the lent pods mount too.
        storage = cluster.spec.shared_storage
        shared = [(f"SlurmCluster {settings.cluster_key}'s spec.sharedStorage.volumes[{j}].mountPath", v.mount_path)
                  for j, v in enumerate(storage.volumes if storage else [])]
        conflict = next(mount_conflicts(spec.pod_template, "spec.podTemplate", shared), None)
        if conflict is not None:
            return ("PodTemplateConflict", f"{conflict} (the lent pods mount the cluster's shared storage too)")
    if not selected:
        forbidden = sum(1 for n in world.observed.nodes
                        if n.gpus > 0 and spec.node_selector.matches(n.labels))
        if forbidden:
            return ("NoMatchingNodes",
                    f"spec.nodeSelector ({describe_selector(spec.node_selector)}) matches {forbidden} GPU "
                    f"node(s), but none is labelled {LENDABLE_TO_LABEL}={settings.namespace}: a cluster "
                    f"administrator labels the nodes this namespace may lend "
                    f"(kubectl label node <node> {LENDABLE_TO_LABEL}={settings.namespace})")
        return ("NoMatchingNodes",
                f"no Node with allocatable nvidia.com/gpu and label {LENDABLE_TO_LABEL}={settings.namespace} "
                f"matches spec.nodeSelector ({describe_selector(spec.node_selector)}); label the nodes to "
                "lend, or fix the selector")
    if not world.slurm_known:
        return ("SlurmUnreachable",
                f"Slurm of SlurmCluster {settings.cluster_key} could not be read ({world.slurm_problem}); "
                "nothing is lent or reclaimed until it can")
    return None
