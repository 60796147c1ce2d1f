"""The login pods: sshd with the cluster's users, their keys and shared
storage; a Service and, with more than one replica, a PodDisruptionBudget. Pure.
"""

from __future__ import annotations

from ..api.cluster import LOGIN_RESOURCES, SlurmCluster
from . import names
from .identity import with_directory
from .pods import (
    SSH_HOST_KEYS_DIR,
    USER_KEYS_DIR,
    Builder,
    base_volumes,
    common_env,
    pod_template,
    resources_of,
    shared_volumes,
    slurm_container,
)

__all__ = ["objects"]


def _login_env(c: SlurmCluster) -> dict[str, str]:
    """The login pods prepare each user's directories on shared storage."""
    env = common_env(c)
    storage = c.spec.shared_storage
    if storage:
        env["SLURMK8S_SHARED_DIRS"] = " ".join(v.mount_path for v in storage.volumes if not v.read_only)
    ldap = c.spec.identity.ldap
    if ldap is not None:  # sshd asks SSSD for directory users' keys; only these groups log in
        env["SLURMK8S_DIRECTORY"] = "ldap"
        if ldap.login_groups:
            env["SLURMK8S_LOGIN_GROUPS"] = " ".join(ldap.login_groups)
    return env


def _service_meta(b: Builder, name: str) -> dict:
    """The login Service's metadata: the spec's annotations, then the operator's."""
    meta = b.meta(name, "login")
    meta["annotations"] = {**b.c.spec.login.service.annotations, **meta["annotations"]}
    return meta


def _service_spec(c: SlurmCluster, selector: dict) -> dict:
    service = c.spec.login.service
    spec: dict = {
        "type": service.type,
        "selector": selector,
        "ports": [{"name": "ssh", "port": service.port, "targetPort": "ssh"}],
    }
    policy = c.spec.login_traffic_policy()
    if policy is not None:
        spec["externalTrafficPolicy"] = policy
    if service.load_balancer_source_ranges:
        spec["loadBalancerSourceRanges"] = list(service.load_balancer_source_ranges)
    return spec


def objects(b: Builder) -> list[dict]:
    c = b.c
    login = c.spec.login
    name = names.login(c)
    sel = names.selector(c, "login")
    volumes, mounts = base_volumes(c, config=True)
    volumes.append({"name": "ssh-host-keys", "secret": {
        "secretName": names.ssh_host_keys_secret(c), "defaultMode": 0o400}})
    mounts.append({"name": "ssh-host-keys", "mountPath": SSH_HOST_KEYS_DIR, "readOnly": True})
    sources = [
        {"secret": {"name": u.ssh_public_keys_from.name,
                    "items": [{"key": u.ssh_public_keys_from.key, "path": u.name}]}}
        for u in login.users if u.ssh_public_keys_from
    ]
    if sources:
        # Readable by root only: the entrypoint (root) copies each user's keys into the
        # user's ~/.ssh/authorized_keys; no login user reads another's Secret.
        volumes.append({"name": "user-keys", "projected": {"sources": sources, "defaultMode": 0o400}})
        mounts.append({"name": "user-keys", "mountPath": USER_KEYS_DIR, "readOnly": True})
    shared_vols, shared_mounts = shared_volumes(c)
    volumes += shared_vols
    mounts += shared_mounts
    container = slurm_container(
        c, "login", "login", env=_login_env(c), mounts=mounts,
        ports=[{"name": "ssh", "containerPort": names.SSH_PORT}],
        resources=resources_of(login.resources, LOGIN_RESOURCES),
        readinessProbe={"tcpSocket": {"port": "ssh"}, "periodSeconds": 10},
    )
    out = [
        b.obj("v1", "Service", _service_meta(b, name), spec=_service_spec(c, sel)),
        b.obj("apps/v1", "Deployment", b.meta(name, "login"), spec={
            "replicas": login.replicas,
            "selector": {"matchLabels": sel},
            "template": with_directory(c, pod_template(c, sel, names.labels(c, "login"), [container], volumes),
                                       "login"),
        }),
    ]
    if login.replicas > 1:
        out.append(b.obj("policy/v1", "PodDisruptionBudget", b.meta(name, "login"), spec={
            "maxUnavailable": 1, "selector": {"matchLabels": sel}}))
    return out
