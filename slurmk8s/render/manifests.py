"""SlurmCluster -> Kubernetes objects. Pure: no I/O, no clock, no randomness.

The objects and what the images expect of them (paths, variables) are
described in docs/architecture.md and images/README.md.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from typing import Sequence

from .. import versions
from ..api.cluster import NodeSet, Resources, SlurmCluster
from . import names
from .config import (
    JWT_KEY_PATH,
    STATE_DIR,
    TopologyNode,
    config_files,
    config_hash,
    dynamic_node_conf,
    memory_mib,
    user_files,
)
from .keys import ClusterKeys

__all__ = ["render", "node_conf", "lent_slurmd_pod", "AgentClients"]

# Mount points inside every Slurm container (the images' contract).
CONFIG_DIR = "/etc/slurm"
MUNGE_DIR = "/run/slurmk8s/munge"
USERS_DIR = "/run/slurmk8s/users"
USER_KEYS_DIR = "/run/slurmk8s/user-keys"
SSH_HOST_KEYS_DIR = "/run/slurmk8s/ssh-host-keys"
AGENT_TOKEN_DIR = "/run/slurmk8s/agent"
ENTRYPOINT = "/usr/local/bin/slurmk8s-entrypoint"


@dataclass(frozen=True)
class AgentClients:
    """Who may reach the Slurm agent: the operator and bridge pods of the
    Helm release ``release`` in ``namespace`` (the operator learns both from
    the chart: ``--release-namespace``, ``--release-name``)."""

    namespace: str
    release: str
    components: tuple[str, ...] = ("bridge", "operator")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class _Builder:
    """Helpers that stamp the common metadata; one per render call."""

    def __init__(self, c: SlurmCluster, chash: str):
        self.c = c
        self.chash = chash

    def meta(self, name: str, component: str, *, owned: bool = True, **extra_labels: str) -> dict:
        meta = {
            "name": name,
            "namespace": self.c.namespace,
            "labels": names.labels(self.c, component, **extra_labels),
            "annotations": {names.CONFIG_HASH: self.chash},
        }
        uid = self.c.metadata.uid
        if owned and uid:
            meta["ownerReferences"] = [
                {
                    "apiVersion": self.c.api_version,
                    "kind": self.c.kind,
                    "name": self.c.name,
                    "uid": uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ]
        return meta

    def obj(self, api_version: str, kind: str, meta: dict, **body) -> dict:
        return {"apiVersion": api_version, "kind": kind, "metadata": meta, **body}


def _resources(r: Resources) -> dict:
    out = {}
    for section in ("requests", "limits"):
        values = getattr(r, section).dump()
        if values:
            out[section] = values
    return out


def _env(pairs: dict[str, str]) -> list[dict]:
    return [{"name": k, "value": v} for k, v in pairs.items()]


def node_conf(c: SlurmCluster, ns: NodeSet) -> str:
    """The node definition a worker passes to ``slurmd -Z --conf``."""
    return dynamic_node_conf(cpus=ns.cpus, memory_mib=memory_mib(ns.memory), gpus=ns.gpus.count if ns.gpus else 0,
                             gpu_type=ns.gpus.type if ns.gpus else "", features=[ns.name, *ns.features])


def _common_env(c: SlurmCluster) -> dict[str, str]:
    env = {
        "SLURMK8S_CLUSTER": c.name,
        "SLURMK8S_CONTROLLER": names.controller_fqdn(c),
        "SLURMK8S_CONTROLLER_PORT": str(names.SLURMCTLD_PORT),
    }
    storage = c.spec.shared_storage
    if storage and storage.checkpoint_dir:
        env["SLURMK8S_CHECKPOINT_ROOT"] = storage.checkpoint_dir
    return env


def _login_env(c: SlurmCluster) -> dict[str, str]:
    """The login pods prepare each user's directories on shared storage."""
    env = _common_env(c)
    storage = c.spec.shared_storage
    if storage:
        env["SLURMK8S_SHARED_DIRS"] = " ".join(v.mount_path for v in storage.volumes if not v.read_only)
    return env


def _shared_volumes(c: SlurmCluster) -> tuple[list[dict], list[dict]]:
    storage = c.spec.shared_storage
    if storage is None:
        return [], []
    volumes, mounts = [], []
    for v in storage.volumes:
        claim = v.existing_claim or names.shared_claim(c, v.name)
        volumes.append({"name": f"shared-{v.name}", "persistentVolumeClaim": {"claimName": claim}})
        mount = {"name": f"shared-{v.name}", "mountPath": v.mount_path}
        if v.read_only:
            mount["readOnly"] = True
        mounts.append(mount)
    return volumes, mounts


def _base_volumes(c: SlurmCluster, *, config: bool) -> tuple[list[dict], list[dict]]:
    """munge key and users for every pod; the Slurm config where it is read directly."""
    volumes = [
        {"name": "munge-key", "secret": {"secretName": names.munge_secret(c), "defaultMode": 0o400}},
        {"name": "users", "configMap": {"name": names.users_config(c)}},
    ]
    mounts = [
        {"name": "munge-key", "mountPath": MUNGE_DIR, "readOnly": True},
        {"name": "users", "mountPath": USERS_DIR, "readOnly": True},
    ]
    if config:
        volumes.insert(0, {"name": "slurm-config", "configMap": {"name": names.slurm_config(c)}})
        mounts.insert(0, {"name": "slurm-config", "mountPath": CONFIG_DIR, "readOnly": True})
    return volumes, mounts


def _shm_volume(size: str) -> dict:
    """/dev/shm: memory-backed, so bounded (what is written there counts
    against the pod's memory limit)."""
    return {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": size}}


def _probe(kind: str, period: int = 10) -> dict:
    return {
        "exec": {"command": [ENTRYPOINT, kind]},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": 3,
    }


def _container(c: SlurmCluster, name: str, component: str, *, env: dict, mounts: list,
               ports: list, resources: dict, **extra) -> dict:
    container = {
        "name": name,
        "image": names.image(c, component),
        "imagePullPolicy": c.spec.slurm.image.pull_policy,
        "env": _env(env),
        "ports": ports,
        "volumeMounts": mounts,
    }
    if resources:
        container["resources"] = resources
    container.update(extra)
    return container


def _pod_template(c: SlurmCluster, selector: dict, labels: dict, containers: list, volumes: list,
                  **spec) -> dict:
    return {
        "metadata": {"labels": {**labels, **selector}},
        "spec": {"containers": containers, "volumes": volumes, "enableServiceLinks": False,
                 # Slurm pods never call the Kubernetes API: no token for jobs and SSH users to read.
                 "automountServiceAccountToken": False, **spec},
    }


def _worker_template(template: dict) -> dict:
    """``template`` with its restart hash (names.RESTART_HASH): what a worker
    restarts for, which is everything but the termination grace period."""
    spec = {k: v for k, v in template["spec"].items() if k != "terminationGracePeriodSeconds"}
    digest = hashlib.sha256(json.dumps({"metadata": template["metadata"], "spec": spec}, sort_keys=True).encode())
    template["metadata"]["annotations"] = {names.RESTART_HASH: digest.hexdigest()[:16]}
    return template


def _controller(b: _Builder, with_jwt: bool) -> list[dict]:
    c = b.c
    name = names.controller(c)
    sel = names.selector(c, "controller")
    volumes, mounts = _base_volumes(c, config=True)
    mounts.append({"name": "state", "mountPath": STATE_DIR})
    if with_jwt:
        volumes.append({"name": "jwt-key", "secret": {"secretName": names.jwt_secret(c), "defaultMode": 0o400}})
        mounts.append({"name": "jwt-key", "mountPath": JWT_KEY_PATH.rsplit("/", 1)[0], "readOnly": True})
    container = _container(
        c, "slurmctld", "slurmctld",
        env=_common_env(c), mounts=mounts,
        ports=[{"name": "slurmctld", "containerPort": names.SLURMCTLD_PORT}],
        resources=_resources(c.spec.controller.resources),
        readinessProbe=_probe("ready"),
        startupProbe={**_probe("ready", period=5), "failureThreshold": 60},
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
        ],
    })
    sts = b.obj("apps/v1", "StatefulSet", b.meta(name, "controller"), spec={
        "serviceName": name,
        "replicas": 1,
        "selector": {"matchLabels": sel},
        "persistentVolumeClaimRetentionPolicy": {"whenDeleted": retain, "whenScaled": "Retain"},
        "template": _pod_template(
            c, sel, names.labels(c, "controller"), [container, _agent(c)], volumes,
            terminationGracePeriodSeconds=30,
        ),
        "volumeClaimTemplates": [{
            "metadata": {"name": "state", "labels": names.labels(c, "controller")},
            "spec": claim_spec,
        }],
    })
    return [service, sts]


def _checkpoint_volume(c: SlurmCluster) -> tuple[dict, dict] | None:
    """The shared volume that holds the checkpoint directory, mounted read-only."""
    storage = c.spec.shared_storage
    if storage is None or not storage.checkpoint_dir:
        return None
    volumes, mounts = _shared_volumes(c)
    for volume, mount in zip(volumes, mounts):
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
        args += ["--checkpoint-root", c.spec.shared_storage.checkpoint_dir]
    return _container(
        c, "agent", "controller",
        env={"SLURMK8S_CLUSTER": c.name},
        mounts=mounts,
        ports=[{"name": "agent", "containerPort": names.AGENT_PORT}],
        resources={"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
        args=args,
        readinessProbe=http,
        livenessProbe={**http, "failureThreshold": 6},
        # munged and the Slurm commands need root in this image (it defaults to uid 10001).
        securityContext={"runAsUser": 0, "runAsGroup": 0},
    )


def _workers(b: _Builder) -> list[dict]:
    c = b.c
    svc_name = names.workers_service(c)
    out = [b.obj("v1", "Service", b.meta(svc_name, "worker"), spec={
        "clusterIP": "None",
        "publishNotReadyAddresses": True,
        "selector": names.selector(c, "worker"),
        "ports": [{"name": "slurmd", "port": names.SLURMD_PORT, "targetPort": "slurmd"}],
    })]
    shared_vols, shared_mounts = _shared_volumes(c)
    for ns in c.spec.node_sets:
        name = names.nodeset(c, ns.name)
        sel = names.selector(c, "worker", **{names.NODESET_LABEL: ns.name})
        labels = names.labels(c, "worker", **{names.NODESET_LABEL: ns.name})
        volumes, mounts = _base_volumes(c, config=False)
        volumes += [*shared_vols, _shm_volume(ns.shm_size)]
        mounts += [*shared_mounts, {"name": "shm", "mountPath": "/dev/shm"}]
        # The limit bounds jobs too: they run inside the pod's memory cgroup.
        resources = {"requests": {"cpu": str(ns.cpus), "memory": ns.memory},
                     "limits": {"memory": ns.pod_memory_limit()}}
        if ns.gpus:
            resources["limits"]["nvidia.com/gpu"] = str(ns.gpus.count)
        # A worker pod deleted outside the operator's scale-in (a node drain, an
        # eviction, kubectl delete) gives its jobs the node set's grace too.
        env = {**_common_env(c), "SLURMK8S_NODESET": ns.name, "SLURMK8S_NODE_CONF": node_conf(c, ns),
               "SLURMK8S_DRAIN_TIMEOUT": str(ns.drain.grace_period)}
        if ns.gpus:
            env |= {"SLURMK8S_GPU_TYPE": ns.gpus.type, "SLURMK8S_GPU_COUNT": str(ns.gpus.count)}
        container = _container(
            c, "slurmd", "slurmd", env=env, mounts=mounts,
            ports=[{"name": "slurmd", "containerPort": names.SLURMD_PORT}],
            resources=resources,
            readinessProbe=_probe("ready"),
            securityContext={"privileged": True} if c.spec.slurm_config.cgroups else {},
        )
        if not container["securityContext"]:
            del container["securityContext"]
        pod_spec = {
            # Time for the entrypoint to drain the node, wait out the drain
            # grace, and requeue what still runs (Slurm's KillWait). Not part
            # of the restart hash: running pods keep theirs.
            "terminationGracePeriodSeconds": ns.drain.grace_period + c.spec.slurm_config.kill_wait + 60,
        }
        if ns.node_selector:
            pod_spec["nodeSelector"] = dict(ns.node_selector)
        if ns.tolerations:
            pod_spec["tolerations"] = [t.dump() for t in ns.tolerations]
        out.append(b.obj("apps/v1", "StatefulSet", b.meta(name, "worker", **{names.NODESET_LABEL: ns.name}), spec={
            "serviceName": svc_name,
            "replicas": ns.replicas,
            "podManagementPolicy": "Parallel",
            # The operator restarts pods itself on an image update, one at a
            # time and each drained first (operator/workers.py).
            "updateStrategy": {"type": "OnDelete"},
            "selector": {"matchLabels": sel},
            "template": _worker_template(_pod_template(c, sel, labels, [container], volumes, **pod_spec)),
        }))
        # Busy nodes (the operator labels pods that run jobs) may not be evicted.
        out.append(b.obj("policy/v1", "PodDisruptionBudget",
                         b.meta(f"{name}-busy", "worker", **{names.NODESET_LABEL: ns.name}), spec={
            "maxUnavailable": 0,
            "selector": {"matchLabels": {**sel, names.BUSY_LABEL: "true"}},
        }))
    return out


def _login(b: _Builder) -> list[dict]:
    c = b.c
    login = c.spec.login
    name = names.login(c)
    sel = names.selector(c, "login")
    volumes, mounts = _base_volumes(c, config=True)
    volumes.append({"name": "ssh-host-keys", "secret": {
        "secretName": names.ssh_host_keys_secret(c), "defaultMode": 0o400}})
    mounts.append({"name": "ssh-host-keys", "mountPath": SSH_HOST_KEYS_DIR, "readOnly": True})
    sources = [
        {"secret": {"name": u.ssh_public_keys_from.name,
                    "items": [{"key": u.ssh_public_keys_from.key, "path": u.name}]}}
        for u in login.users if u.ssh_public_keys_from
    ]
    if sources:
        volumes.append({"name": "user-keys", "projected": {"sources": sources, "defaultMode": 0o444}})
        mounts.append({"name": "user-keys", "mountPath": USER_KEYS_DIR, "readOnly": True})
    shared_vols, shared_mounts = _shared_volumes(c)
    volumes += shared_vols
    mounts += shared_mounts
    container = _container(
        c, "login", "login", env=_login_env(c), mounts=mounts,
        ports=[{"name": "ssh", "containerPort": names.SSH_PORT}],
        resources=_resources(login.resources),
        readinessProbe={"tcpSocket": {"port": "ssh"}, "periodSeconds": 10},
    )
    out = [
        b.obj("v1", "Service", b.meta(name, "login"), spec={
            "type": login.service.type,
            "selector": sel,
            "ports": [{"name": "ssh", "port": login.service.port, "targetPort": "ssh"}],
        }),
        b.obj("apps/v1", "Deployment", b.meta(name, "login"), spec={
            "replicas": login.replicas,
            "selector": {"matchLabels": sel},
            "template": _pod_template(c, sel, names.labels(c, "login"), [container], volumes),
        }),
    ]
    if login.replicas > 1:
        out.append(b.obj("policy/v1", "PodDisruptionBudget", b.meta(name, "login"), spec={
            "maxUnavailable": 1, "selector": {"matchLabels": sel}}))
    return out


def _restapi(b: _Builder) -> list[dict]:
    c = b.c
    name = names.restapi(c)
    sel = names.selector(c, "restapi")
    volumes, mounts = _base_volumes(c, config=True)
    release = versions.release(c.spec.slurm.version)
    env = {**_common_env(c), "SLURMK8S_RESTD_OPENAPI": release.rest_openapi_plugin}
    if release.rest_data_parser:
        env["SLURMK8S_RESTD_DATA_PARSER"] = release.rest_data_parser
    container = _container(
        c, "slurmrestd", "slurmrestd", env=env, mounts=mounts,
        ports=[{"name": "http", "containerPort": names.SLURMRESTD_PORT}],
        resources={},
        readinessProbe={"tcpSocket": {"port": "http"}, "periodSeconds": 10},
        # slurmrestd refuses to run as root or as SlurmUser.
        securityContext={"runAsUser": 65534, "runAsGroup": 65534, "runAsNonRoot": True},
    )
    return [
        b.obj("v1", "Service", b.meta(name, "restapi"), spec={
            "selector": sel,
            "ports": [{"name": "http", "port": names.SLURMRESTD_PORT, "targetPort": "http"}],
        }),
        b.obj("apps/v1", "Deployment", b.meta(name, "restapi"), spec={
            "replicas": c.spec.rest_api.replicas,
            "selector": {"matchLabels": sel},
            "template": _pod_template(c, sel, names.labels(c, "restapi"), [container], volumes),
        }),
    ]


def _secret(b: _Builder, name: str, component: str, data: dict[str, bytes]) -> dict:
    meta = b.meta(name, component)
    meta["annotations"][names.CREATE_ONLY] = "true"
    return b.obj("v1", "Secret", meta, type="Opaque", immutable=True,
                 data={k: _b64(v) for k, v in data.items()})


def _claims(b: _Builder) -> list[dict]:
    c = b.c
    storage = c.spec.shared_storage
    out = []
    for v in storage.volumes if storage else []:
        if v.existing_claim:
            continue
        retain = c.spec.deletion_policy == "Retain"
        # A retained claim has no owner, so deleting the cluster never garbage-collects it.
        meta = b.meta(names.shared_claim(c, v.name), "storage", owned=not retain)
        meta["annotations"][names.DELETION_POLICY] = c.spec.deletion_policy
        spec = {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": v.size}}}
        if v.storage_class_name:
            spec["storageClassName"] = v.storage_class_name
        out.append(b.obj("v1", "PersistentVolumeClaim", meta, spec=spec))
    return out


def _agent_network_policy(b: _Builder, clients: AgentClients) -> dict:
    """Only ``clients`` reach the agent's port; slurmctld's port stays open to
    every pod (workers, login pods, lent slurmd pods, slurmrestd). Not
    enforced without a CNI that implements NetworkPolicy (decision record 13)."""
    c = b.c
    peers = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": clients.namespace}},
        "podSelector": {
            "matchLabels": {"app.kubernetes.io/instance": clients.release},
            "matchExpressions": [{"key": "app.kubernetes.io/component", "operator": "In",
                                  "values": sorted(clients.components)}],
        },
    }
    return b.obj("networking.k8s.io/v1", "NetworkPolicy", b.meta(f"{names.controller(c)}-agent", "controller"),
                 spec={
                     "podSelector": {"matchLabels": names.selector(c, "controller")},
                     "policyTypes": ["Ingress"],
                     "ingress": [
                         {"ports": [{"protocol": "TCP", "port": names.AGENT_PORT}], "from": [peers]},
                         {"ports": [{"protocol": "TCP", "port": names.SLURMCTLD_PORT}]},
                     ],
                 })


def render(
    cluster: SlurmCluster,
    keys: ClusterKeys,
    topology_nodes: Sequence[TopologyNode] = (),
    *,
    agent_clients: AgentClients | None = None,
) -> list[dict]:
    """Every Kubernetes object of ``cluster``, in apply order.

    ``keys`` are the cluster's generated secrets (see :mod:`.keys`);
    ``topology_nodes`` feed topology.conf when ``spec.topology`` is set;
    with ``agent_clients``, a NetworkPolicy admits only them to the agent's
    port (without, there is none: the renderer does not know who they are).
    """
    c = cluster
    files = config_files(c, topology_nodes)
    chash = config_hash(files)
    b = _Builder(c, chash)
    objs = [
        b.obj("v1", "ConfigMap", b.meta(names.slurm_config(c), "config"), data=files),
        b.obj("v1", "ConfigMap", b.meta(names.users_config(c), "config"), data=user_files(c)),
        _secret(b, names.munge_secret(c), "config", {"munge.key": keys.munge_key}),
        _secret(b, names.ssh_host_keys_secret(c), "login", {
            "ssh_host_ed25519_key": keys.ssh_host_key,
            "ssh_host_ed25519_key.pub": keys.ssh_host_public_key().encode() + b"\n",
        }),
    ]
    objs.append(_secret(b, names.agent_token_secret(c), "controller", {"token": keys.agent_token}))
    if c.spec.rest_api.enabled:
        objs.append(_secret(b, names.jwt_secret(c), "restapi", {"jwt_hs256.key": keys.jwt_key}))
    objs += _claims(b)
    objs += _controller(b, with_jwt=c.spec.rest_api.enabled)
    objs += _workers(b)
    objs += _login(b)
    if c.spec.rest_api.enabled:
        objs += _restapi(b)
    if agent_clients is not None:
        objs.append(_agent_network_policy(b, agent_clients))
    return objs


#: Memory a lent slurmd pod requests: it is bound to its node without the
#: scheduler, so the kubelet admits it only if this fits beside the node's
#: DaemonSet pods. Its limit is the node's allocatable memory.
LENT_MEMORY_REQUEST = "256Mi"


def lent_slurmd_pod(cluster: SlurmCluster, chash: str, *, name: str, node: str, conf: str, gres_conf: str,
                    gpus: int, memory_mib: int, shm_size: str, labels: dict[str, str], taint_key: str) -> dict:
    """The slurmd pod the bridge starts on a lent Kubernetes node.

    Pinned to ``node`` (``spec.nodeName``), tolerating the lending taint
    ``taint_key``, holding the node's ``gpus``. Its slurmd registers as the
    dynamic Slurm node ``node`` with ``conf`` and reads the cluster's config
    files with ``gres_conf`` (one line, for this node) as gres.conf (see
    :mod:`.lent`). It mounts the same shared storage as the cluster's own
    workers, at the same paths. ``chash`` is the cluster's config hash
    (an annotation, as on every object rendered for it). Its memory limit
    is ``memory_mib``, the RealMemory the node registers with (the node's
    allocatable memory), so jobs cannot take the node's own share; its
    /dev/shm is bounded by ``shm_size``.
    """
    c = cluster
    b = _Builder(c, chash)
    volumes, mounts = _base_volumes(c, config=True)
    shared_vols, shared_mounts = _shared_volumes(c)
    volumes += [*shared_vols, _shm_volume(shm_size)]
    mounts += [*shared_mounts, {"name": "shm", "mountPath": "/dev/shm"}]
    env = {**_common_env(c), "SLURMK8S_NODE_NAME": node, "SLURMK8S_NODE_CONF": conf,
           "SLURMK8S_GRES_CONF": gres_conf, "SLURMK8S_GPU_COUNT": str(gpus)}
    container = _container(
        c, "slurmd", "slurmd", env=env, mounts=mounts,
        ports=[{"name": "slurmd", "containerPort": names.SLURMD_PORT}],
        resources={"requests": {"memory": LENT_MEMORY_REQUEST},
                   "limits": {"nvidia.com/gpu": str(gpus), "memory": f"{memory_mib}Mi"}},
        readinessProbe=_probe("ready"),
    )
    meta = b.meta(name, "lent-slurmd")
    meta["labels"].update({"app.kubernetes.io/managed-by": "slurmk8s-bridge", **labels})
    return b.obj("v1", "Pod", meta, spec={
        "nodeName": node,
        "containers": [container],
        "volumes": volumes,
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        # The bridge deletes the pod only once Slurm has no job on the node.
        "terminationGracePeriodSeconds": 30,
        "restartPolicy": "Always",
        "tolerations": [{"key": taint_key, "operator": "Exists", "effect": "NoSchedule"},
                        {"key": taint_key, "operator": "Exists", "effect": "NoExecute"}],
    })
