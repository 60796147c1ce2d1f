"""The controller: slurmctld with its state claim and Service, and the Slurm
agent beside it. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import versions
from ..api.cluster import CONTROLLER_RESOURCES, SlurmCluster
from . import names
from .config import JWT_KEY_PATH, PROLOG_SLURMCTLD_DIR, PROLOG_SLURMCTLD_FILE, STATE_DIR
from .identity import with_directory
from .pods import (
    AGENT_TOKEN_DIR,
    CONFIG_DIR,
    DAEMON_POD_SECURITY,
    MUNGE_DIR,
    Builder,
    base_volumes,
    common_env,
    pod_template,
    probe,
    resources_of,
    shared_volumes,
    slurm_container,
)

__all__ = ["AgentClients", "objects"]


@dataclass(frozen=True)
class AgentClients:
    """Who may reach the Slurm agent: the operator and bridge pods of the
    Helm release ``release`` in ``namespace`` (the operator learns both from
    the chart: ``--release-namespace``, ``--release-name``)."""

    namespace: str
    release: str
    components: tuple[str, ...] = ("bridge", "operator")


def probes(c: SlurmCluster) -> dict:
    """slurmctld's probes. Where slurmctld serves /readyz and /livez on its port
    (the version table's ``ctld_http_probes``), the kubelet asks it directly, and
    a slurmctld that stops answering for a minute is restarted (jobs keep running
    on their nodes; its state is on the state volume). Before, the entrypoint's
    ``scontrol ping`` says whether it is ready, and nothing restarts it."""
    if versions.release(c.spec.slurm.version).ctld_http_probes:
        def http(path: str, period: int, failures: int) -> dict:
            return {"httpGet": {"path": path, "port": "slurmctld"}, "periodSeconds": period,
                    "timeoutSeconds": 5, "failureThreshold": failures}
        return {"readinessProbe": http("/readyz", 10, 3), "startupProbe": http("/readyz", 5, 60),
                "livenessProbe": http("/livez", 10, 6)}
    return {"readinessProbe": probe("ready"), "startupProbe": {**probe("ready", period=5), "failureThreshold": 60}}


def objects(b: Builder, with_jwt: bool) -> list[dict]:
    c = b.c
    name = names.controller(c)
    sel = names.selector(c, "controller")
    volumes, mounts = base_volumes(c, config=True)
    mounts.append({"name": "state", "mountPath": STATE_DIR})
    volumes.append(_prolog_slurmctld_volume(c))
    mounts.append({"name": "prolog-slurmctld", "mountPath": PROLOG_SLURMCTLD_DIR, "readOnly": True})
    if with_jwt:
        volumes.append({"name": "jwt-key", "secret": {"secretName": names.jwt_secret(c), "defaultMode": 0o400}})
        mounts.append({"name": "jwt-key", "mountPath": JWT_KEY_PATH.rsplit("/", 1)[0], "readOnly": True})
    container = slurm_container(
        c, "slurmctld", "slurmctld",
        env=common_env(c), mounts=mounts,
        ports=[{"name": "slurmctld", "containerPort": names.SLURMCTLD_PORT}],
        resources=resources_of(c.spec.controller.resources, CONTROLLER_RESOURCES),
        **probes(c),
    )
    volumes.append({"name": "agent-token", "secret": {
        "secretName": names.agent_token_secret(c), "defaultMode": 0o400}})
    checkpoints = _checkpoint_volume(c)
    if checkpoints is not None:
        volumes.append(checkpoints[0])
    vol = c.spec.controller.state_volume
    claim_spec = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": vol.size}}}
    if vol.storage_class_name:
        claim_spec["storageClassName"] = vol.storage_class_name
    retain = c.spec.deletion_policy
    service = b.obj("v1", "Service", b.meta(name, "controller"), spec={
        "clusterIP": "None",
        "publishNotReadyAddresses": True,
        "selector": sel,
        "ports": [
            {"name": "slurmctld", "port": names.SLURMCTLD_PORT, "targetPort": "slurmctld"},
            {"name": "agent", "port": names.AGENT_PORT, "targetPort": "agent"},
            *([{"name": "metrics", "port": names.METRICS_PORT, "targetPort": "metrics"}]
              if c.spec.metrics.enabled else []),
        ],
    })
    sts = b.obj("apps/v1", "StatefulSet", b.meta(name, "controller"), spec={
        "serviceName": name,
        "replicas": 1,
        "selector": {"matchLabels": sel},
        "persistentVolumeClaimRetentionPolicy": {"whenDeleted": retain, "whenScaled": "Retain"},
        "template": with_directory(c, pod_template(
            c, sel, names.labels(c, "controller"), [container, _agent(c)], volumes,
            terminationGracePeriodSeconds=30, securityContext=dict(DAEMON_POD_SECURITY),
        ), "slurmctld", "agent", probe=True),  # the agent: members of the groups accounts follow; the probe
        "volumeClaimTemplates": [{
            "metadata": {"name": "state", "labels": names.claim_labels(c, "controller")},
            "spec": claim_spec,
        }],
    })
    return [service, sts]


def _prolog_slurmctld_volume(c: SlurmCluster) -> dict:
    """slurmctld's PrologSlurmctld from the slurm-config ConfigMap, the only file of its
    volume, executable (the ConfigMap's own mount at /etc/slurm has every file 0644)."""
    return {"name": "prolog-slurmctld", "projected": {"sources": [{"configMap": {
        "name": names.slurm_config(c),
        "items": [{"key": PROLOG_SLURMCTLD_FILE, "path": PROLOG_SLURMCTLD_FILE, "mode": 0o755}]}}]}}


def _checkpoint_volume(c: SlurmCluster) -> tuple[dict, dict] | None:
    """The shared volume that holds the checkpoint directory, mounted read-only."""
    storage = c.spec.shared_storage
    if storage is None or not storage.checkpoint_dir:
        return None
    volumes, mounts = shared_volumes(c)
    for volume, mount in zip(volumes, mounts, strict=True):
        root = mount["mountPath"].rstrip("/") + "/"
        if storage.checkpoint_dir == mount["mountPath"] or storage.checkpoint_dir.startswith(root):
            return volume, {**mount, "readOnly": True}
    return None


def _agent(c: SlurmCluster) -> dict:
    """The Slurm agent beside slurmctld: the operator's (and the bridge's) only
    way to drain, requeue, delete nodes and reconfigure (docs/decisions/0006).
    With a checkpoint directory it also reads, read-only, the model versions
    jobs publish there, for the bridge's rollouts of serving Deployments.

    It runs the controller image, whose entrypoint starts munged as root when
    the munge key is mounted; the Slurm commands find slurmctld through the
    mounted slurm.conf.
    """
    http = {"httpGet": {"path": "/healthz", "port": "agent"}, "periodSeconds": 10, "timeoutSeconds": 5}
    mounts = [
        {"name": "slurm-config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "munge-key", "mountPath": MUNGE_DIR, "readOnly": True},
        {"name": "agent-token", "mountPath": AGENT_TOKEN_DIR, "readOnly": True},
    ]
    args = ["agent", "--listen", f"0.0.0.0:{names.AGENT_PORT}",
            "--token-file", f"{AGENT_TOKEN_DIR}/token", "--config-dir", CONFIG_DIR]
    checkpoints = _checkpoint_volume(c)
    if checkpoints is not None:
        mounts.append(checkpoints[1])
        assert c.spec.shared_storage is not None and c.spec.shared_storage.checkpoint_dir  # what the volume holds
        args += ["--checkpoint-root", c.spec.shared_storage.checkpoint_dir]
    ports = [{"name": "agent", "containerPort": names.AGENT_PORT}]
    if c.spec.metrics.enabled:
        args += ["--metrics-listen", f"0.0.0.0:{names.METRICS_PORT}",
                 "--metrics-interval", str(c.spec.metrics.interval_seconds)]
        ports.append({"name": "metrics", "containerPort": names.METRICS_PORT})
    else:
        args += ["--metrics-listen", "off"]
    return slurm_container(
        c, "agent", "controller",
        env={"SLURMK8S_CLUSTER": c.name},
        mounts=mounts,
        ports=ports,
        resources={"requests": {"cpu": "50m", "memory": "64Mi"},
                   "limits": {"cpu": AGENT_CPU_LIMIT, "memory": f"{AGENT_MEMORY_LIMIT_MIB}Mi"}},
        args=args,
        readinessProbe=http,
        livenessProbe={**http, "failureThreshold": 6},
        # munged and the Slurm commands need root in this image (it defaults to uid 10001).
        securityContext={"runAsUser": 0, "runAsGroup": 0},
    )


#: The agent container's memory limit. It holds the agent (about 57 MiB at its peak answering
#: GET /v1/jobs over 10,000 jobs, Slurm's default MaxJobCount; hack/bench_agent_memory.py),
#: munged, and the Slurm command it runs, whose own memory grows with the jobs too
#: (squeue --json prints about 7.5 KiB per job on 26.05).
AGENT_MEMORY_LIMIT_MIB = 512
#: Its CPU limit: a whole CPU for the Slurm commands it runs (squeue --json of
#: many jobs is CPU-bound), though it answers only a few calls a round.
AGENT_CPU_LIMIT = "1"
