"""slurmd pods: the cluster's workers (a StatefulSet, headless Service and
busy-worker PodDisruptionBudget per node set), and the pod the bridge starts on
a lent Kubernetes node with the PodDisruptionBudget that guards it while Slurm
runs jobs there. Pure.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from ..api.base import in_group
from ..api.cluster import NodeSet, SlurmCluster
from ..api.lending import ReclaimSpec
from ..api.podtemplate import PodTemplate
from ..slurm.model import DRAIN_PREFIX, POD_TERMINATING
from . import names
from .config import dynamic_node_conf, gpu_gres_conf, memory_mib
from .identity import with_directory
from .lent import lent_node
from .pods import (
    Builder,
    base_volumes,
    common_env,
    pod_template,
    probe,
    pull_secrets,
    shared_volumes,
    shm_volume,
    slurm_container,
    with_site_template,
)

__all__ = ["node_conf", "workers", "lent_slurmd_pod", "lent_budget", "is_lent_slurmd_pod", "LENT_MEMORY_REQUEST",
           "LENT_COMPONENT", "TERMINATING_DRAIN_REASON", "DRAIN_MARGIN_SECONDS", "termination_grace"]

#: The drain reason the slurmd entrypoint sets when its pod is deleted
#: (SLURMK8S_DRAIN_REASON): the one the operator knows as its own and clears.
TERMINATING_DRAIN_REASON = f"{DRAIN_PREFIX} {POD_TERMINATING}"


def node_conf(c: SlurmCluster, ns: NodeSet) -> str:
    """The node definition a worker passes to ``slurmd -Z --conf``."""
    return dynamic_node_conf(cpus=ns.cpus, memory_mib=memory_mib(ns.memory), gpus=ns.gpus.count if ns.gpus else 0,
                             gpu_type=ns.gpus.type if ns.gpus else "", features=[ns.name, *ns.features])


#: What a slurmd pod's termination grace adds to its jobs' grace period and
#: Slurm's KillWait (:func:`termination_grace`).
DRAIN_MARGIN_SECONDS = 60


def termination_grace(c: SlurmCluster, grace_seconds: int) -> int:
    """How long a deleted slurmd pod may take to stop (its
    terminationGracePeriodSeconds): ``grace_seconds`` for its jobs to
    checkpoint (a node set's ``drain.gracePeriod``, a lending policy's
    ``reclaim.gracePeriodSeconds``), Slurm's ``KillWait`` for what is then
    requeued to end, and :data:`DRAIN_MARGIN_SECONDS`: the entrypoint waits
    30 s past the grace period for whoever empties the node before its last
    resort (``images/slurmd/entrypoint.sh``), 10 s past KillWait after that,
    and stopping slurmd and deleting its node record takes the rest (each
    scontrol bounded to 15 s). The pod is killed only after the jobs had their
    grace and Slurm its KillWait."""
    return grace_seconds + c.spec.slurm_config.kill_wait + DRAIN_MARGIN_SECONDS


def slurmd_env(c: SlurmCluster) -> dict[str, str]:
    """What every slurmd container's environment has, the cluster's workers and lent nodes alike."""
    return {**common_env(c), "SLURMK8S_DRAIN_REASON": TERMINATING_DRAIN_REASON}


def _worker_template(template: dict) -> dict:
    """``template`` with its restart hash (names.RESTART_HASH): what a worker
    restarts for, which is everything but the termination grace period. Of its
    annotations the site's stay (its pod template's); slurmk8s's own are in the hash."""
    spec = {k: v for k, v in template["spec"].items() if k != "terminationGracePeriodSeconds"}
    digest = hashlib.sha256(json.dumps({"metadata": template["metadata"], "spec": spec}, sort_keys=True).encode())
    site = {k: v for k, v in template["metadata"].get("annotations", {}).items() if not in_group(k)}
    template["metadata"]["annotations"] = {**site, names.RESTART_HASH: digest.hexdigest()[:16]}
    return template


#: Where a slurmd pod has the site's health checks (spec.healthCheck.siteChecks).
SITE_CHECKS_DIR = "/etc/slurmk8s/health.d"


def site_checks(c: SlurmCluster, *, verified: bool) -> tuple[list[dict], list[dict]]:
    """The volume and mount of the site's health checks, when the spec names
    their ConfigMap and it was ``verified`` (labelled for that use:
    slurmk8s.api.secrets): not optional, so that no pod runs checks from a
    ConfigMap someone made after the check; read-only, not executable (the
    program runs each with /bin/sh)."""
    h = c.spec.health_check
    if not (h.enabled and h.site_checks and verified):
        return [], []
    return ([{"name": "site-checks", "configMap": {"name": h.site_checks, "defaultMode": 0o444}}],
            [{"name": "site-checks", "mountPath": SITE_CHECKS_DIR, "readOnly": True}])


def site_checks_verified(c: SlurmCluster) -> bool:
    """Whether the operator found the spec's site checks ConfigMap labelled for its use
    (``status.siteChecks``): what a lent slurmd pod, which the bridge makes, goes by."""
    return c.status is not None and c.status.site_checks is not None \
        and c.status.site_checks == c.spec.health_check.site_checks


def workers(b: Builder) -> list[dict]:
    c = b.c
    svc_name = names.workers_service(c)
    out = [b.obj("v1", "Service", b.meta(svc_name, "worker"), spec={
        "clusterIP": "None",
        "publishNotReadyAddresses": True,
        "selector": names.selector(c, "worker"),
        "ports": [{"name": "slurmd", "port": names.SLURMD_PORT, "targetPort": "slurmd"}],
    })]
    shared_vols, shared_mounts = shared_volumes(c)
    for ns in c.spec.node_sets:
        name = names.nodeset(c, ns.name)
        sel = names.selector(c, "worker", **{names.NODESET_LABEL: ns.name})
        labels = names.labels(c, "worker", **{names.NODESET_LABEL: ns.name})
        # A GPU slurmd reads the config files with a gres.conf of its own
        # (render.config.gpu_gres_conf); the others fetch theirs (configless).
        volumes, mounts = base_volumes(c, config=bool(ns.gpus))
        # The operator renders the workers only once the spec's ConfigMaps passed its check.
        checks_vols, checks_mounts = site_checks(c, verified=True)
        volumes += [*shared_vols, shm_volume(ns.shm_size), *checks_vols]
        mounts += [*shared_mounts, {"name": "shm", "mountPath": "/dev/shm"}, *checks_mounts]
        # The limits bound jobs too: they run inside the pod's cgroups. The
        # CPU limit is the CPUs slurm.conf gives the node, so a LimitRange's
        # default cannot throttle it below what Slurm hands out.
        resources = {"requests": {"cpu": str(ns.cpus), "memory": ns.memory},
                     "limits": {"cpu": str(ns.cpus), "memory": ns.pod_memory_limit()}}
        if ns.gpus:
            resources["limits"]["nvidia.com/gpu"] = str(ns.gpus.count)
        # A worker pod deleted outside the operator's scale-in (a node drain, an
        # eviction, kubectl delete) gives its jobs the node set's grace too.
        env = {**slurmd_env(c), "SLURMK8S_NODESET": ns.name, "SLURMK8S_NODE_CONF": node_conf(c, ns),
               "SLURMK8S_DRAIN_TIMEOUT": str(ns.drain.grace_period)}
        if ns.gpus:
            env |= {"SLURMK8S_GPU_TYPE": ns.gpus.type, "SLURMK8S_GPU_COUNT": str(ns.gpus.count),
                    "SLURMK8S_GRES_CONF": gpu_gres_conf(c.name, ns.gpus.type)}
        container = slurm_container(
            c, "slurmd", "slurmd", env=env, mounts=mounts,
            ports=[{"name": "slurmd", "containerPort": names.SLURMD_PORT}],
            resources=resources,
            readinessProbe=probe("ready"),
            securityContext={"privileged": True} if c.spec.slurm_config.cgroups else {},
        )
        pod_spec: dict[str, Any] = {
            # Time for the entrypoint to drain the node, wait out the drain
            # grace, and requeue what still runs (Slurm's KillWait). Not part
            # of the restart hash: running pods keep theirs.
            "terminationGracePeriodSeconds": termination_grace(c, ns.drain.grace_period),
        }
        if ns.node_selector:
            pod_spec["nodeSelector"] = dict(ns.node_selector)
        if ns.tolerations:
            pod_spec["tolerations"] = [t.dump() for t in ns.tolerations]
        out.append(b.obj("apps/v1", "StatefulSet", b.meta(name, "worker", extra_labels={names.NODESET_LABEL: ns.name}), spec={
            "serviceName": svc_name,
            "replicas": ns.replicas,
            "podManagementPolicy": "Parallel",
            # The operator restarts pods itself on an image update, one at a
            # time and each drained first (slurmk8s/operator/workers.py).
            "updateStrategy": {"type": "OnDelete"},
            "selector": {"matchLabels": sel},
            "template": _worker_template(with_site_template(
                with_directory(c, pod_template(c, sel, labels, [container], volumes, **pod_spec), "slurmd"),
                ns.pod_template)),
        }))
        # Busy nodes (the operator labels pods that run jobs) may not be evicted.
        out.append(b.obj("policy/v1", "PodDisruptionBudget",
                         b.meta(names.busy_budget(name), "worker", extra_labels={names.NODESET_LABEL: ns.name}), spec={
            "maxUnavailable": 0,
            "selector": {"matchLabels": {**sel, names.BUSY_LABEL: "true"}},
        }))
    return out


#: The app.kubernetes.io/component of a lent slurmd pod.
LENT_COMPONENT = "lent-slurmd"
#: Its app.kubernetes.io/managed-by.
LENT_MANAGER = "slurmk8s-bridge"


def is_lent_slurmd_pod(labels: Mapping[str, str], pod_node: str | None, cluster: str, node: str) -> bool:
    """Whether a pod of these labels, bound to ``pod_node``, is the one
    :func:`lent_slurmd_pod` makes for ``node`` lent to ``cluster``: a pod that
    merely has its name is not (another cluster's, or anyone's)."""
    return (labels.get("app.kubernetes.io/component") == LENT_COMPONENT
            and labels.get("app.kubernetes.io/managed-by") == LENT_MANAGER
            and labels.get("app.kubernetes.io/instance") == cluster
            and pod_node == node)


#: Memory a lent slurmd pod requests: it is bound to its node without the
#: scheduler, so the kubelet admits it only if this fits beside the node's
#: DaemonSet pods. Its limit is the node's allocatable memory.
LENT_MEMORY_REQUEST = "256Mi"
#: And the CPU it requests; its limit is the CPUs it registers with.
LENT_CPU_REQUEST = "100m"


def lent_slurmd_pod(cluster: SlurmCluster, chash: str, *, node: str, resources: Mapping[str, str],
                    labels: Mapping[str, str], partition: str, shm_size: str, taint_key: str,
                    grace_seconds: int = ReclaimSpec().grace_period_seconds,
                    pod_template: PodTemplate | None = None) -> dict:
    """The slurmd pod the bridge starts on Kubernetes node ``node``, lent to ``partition``.

    The only place the lent pod is made: its name (:func:`names.lent_slurmd`,
    which the bridge also finds it by), its labels, and how the node
    registers with Slurm, described from ``resources`` (what of the node is
    lent: its allocatable cpu, memory and nvidia.com/gpu less what its other
    pods request) and the Node's ``labels`` (:func:`.lent.lent_node`, which
    raises :class:`~.lent.UnlendableNode`). Pinned to ``node``
    (``spec.nodeName``), tolerating the lending taint ``taint_key``, holding
    the GPUs lent, which the device plugin picks among the node's free ones.
    Its slurmd registers as the dynamic Slurm node ``node`` and reads the
    cluster's config files with the node's one-line gres.conf. It mounts
    the same shared storage as the cluster's own workers, at the same
    paths. ``chash`` is the cluster's config hash (an annotation, as on
    every object rendered for it). Its memory limit is the RealMemory the
    node registers with (the memory lent), so jobs cannot take the node's
    own share or its other pods'; its /dev/shm is bounded by ``shm_size``.

    Deleted (an eviction its budget let through, ``kubectl delete``), it
    drains its Slurm node and waits while jobs run, for the bridge to take
    the node back gracefully: ``grace_seconds`` (the policy's
    ``reclaim.gracePeriodSeconds``) is its entrypoint's drain timeout, and
    its termination grace covers that, KillWait and a margin
    (:func:`termination_grace`). It carries the label
    ``slurmk8s.dev/lent-node`` that its budget (:func:`lent_budget`) selects.

    The policy's ``pod_template`` shapes it as a node set's shapes its workers
    (:func:`.pods.with_site_template`).
    """
    desc = lent_node(cluster.name, node, resources, labels, partition)
    c = cluster
    b = Builder(c, chash)
    volumes, mounts = base_volumes(c, config=True)
    shared_vols, shared_mounts = shared_volumes(c)
    checks_vols, checks_mounts = site_checks(c, verified=site_checks_verified(c))
    volumes += [*shared_vols, shm_volume(shm_size), *checks_vols]
    mounts += [*shared_mounts, {"name": "shm", "mountPath": "/dev/shm"}, *checks_mounts]
    env = {**slurmd_env(c), "SLURMK8S_NODE_NAME": node, "SLURMK8S_NODE_CONF": desc.conf,
           "SLURMK8S_GRES_CONF": desc.gres_conf, "SLURMK8S_GPU_COUNT": str(desc.gpus),
           "SLURMK8S_DRAIN_TIMEOUT": str(grace_seconds)}
    container = slurm_container(
        c, "slurmd", "slurmd", env=env, mounts=mounts,
        ports=[{"name": "slurmd", "containerPort": names.SLURMD_PORT}],
        resources={"requests": {"cpu": LENT_CPU_REQUEST, "memory": LENT_MEMORY_REQUEST},
                   "limits": {"cpu": str(desc.cpus), "memory": f"{desc.memory_mib}Mi",
                              "nvidia.com/gpu": str(desc.gpus)}},
        readinessProbe=probe("ready"),
    )
    meta = b.meta(names.lent_slurmd(c, node), LENT_COMPONENT,
                  extra_labels={names.LENT_NODE_LABEL: names.lent_node_label(node)})
    meta["labels"]["app.kubernetes.io/managed-by"] = LENT_MANAGER
    return with_site_template(with_directory(c, b.obj("v1", "Pod", meta, spec={
        "nodeName": node,
        "containers": [container],
        "volumes": volumes,
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        **pull_secrets(c),
        # The bridge deletes the pod only once Slurm has no job on the node;
        # deleted by someone else, it gives the bridge time to take the node
        # back gracefully (signal, grace period, requeue).
        "terminationGracePeriodSeconds": termination_grace(c, grace_seconds),
        "restartPolicy": "Always",
        "tolerations": [{"key": taint_key, "operator": "Exists", "effect": "NoSchedule"},
                        {"key": taint_key, "operator": "Exists", "effect": "NoExecute"}],
    }), "slurmd"), pod_template)


def lent_budget(cluster: SlurmCluster, chash: str, *, node: str, pod_uid: str) -> dict:
    """The PodDisruptionBudget the bridge keeps on the lent slurmd pod of
    ``node`` while Slurm runs jobs there: the pod's name, ``maxUnavailable:
    0`` over that one pod (its ``slurmk8s.dev/lent-node`` label), so that an
    eviction (``kubectl drain``, a node-pool upgrade, the cluster
    autoscaler) is refused (429) until the bridge has taken the node back
    through Slurm: a cordon is a reclaim (signal, grace period, requeue),
    and the bridge deletes the budget once no job is left, or the pod itself
    when it hands the node back. Owned by the pod (``pod_uid``), so that it
    goes with it whoever deletes the pod. Decision record 49."""
    c = cluster
    b = Builder(c, chash)
    meta = b.meta(names.lent_budget(c, node), LENT_COMPONENT, owned=False,
                  extra_labels={names.LENT_NODE_LABEL: names.lent_node_label(node)})
    meta["labels"]["app.kubernetes.io/managed-by"] = LENT_MANAGER
    meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": names.lent_slurmd(c, node),
                                "uid": pod_uid}]
    return b.obj("policy/v1", "PodDisruptionBudget", meta, spec={
        "maxUnavailable": 0,
        "selector": {"matchLabels": names.selector(c, LENT_COMPONENT,
                                                   **{names.LENT_NODE_LABEL: names.lent_node_label(node)})},
    })
