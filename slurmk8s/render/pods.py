"""What every Slurm pod of a cluster is made of: the images' mount points,
the common metadata, environment, volumes, probes, containers and pod
templates; and how a site's pod template shapes a slurmd pod
(:func:`with_site_template`). Pure; the components (:mod:`.controller`,
:mod:`.slurmd`, :mod:`.login`, :mod:`.restapi`) build their objects from these.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from ..api.cluster import Resources, SlurmCluster
from ..api.podtemplate import PodTemplate
from . import names

__all__ = [
    "CONFIG_DIR", "MUNGE_DIR", "USERS_DIR", "USER_KEYS_DIR", "SSH_HOST_KEYS_DIR", "AGENT_TOKEN_DIR", "ENTRYPOINT",
    "Builder", "resources_of", "env_list", "common_env", "shared_volumes", "base_volumes", "shm_volume", "probe",
    "slurm_container", "pod_template", "with_site_template",
]

# Mount points inside every Slurm container (the images' contract).
CONFIG_DIR = "/etc/slurm"
MUNGE_DIR = "/run/slurmk8s/munge"
USERS_DIR = "/run/slurmk8s/users"
USER_KEYS_DIR = "/run/slurmk8s/user-keys"
SSH_HOST_KEYS_DIR = "/run/slurmk8s/ssh-host-keys"
AGENT_TOKEN_DIR = "/run/slurmk8s/agent"
ENTRYPOINT = "/usr/local/bin/slurmk8s-entrypoint"


class Builder:
    """Helpers that stamp the common metadata; one per render call."""

    def __init__(self, c: SlurmCluster, chash: str):
        self.c = c
        self.chash = chash

    def meta(self, name: str, component: str, *, owned: bool = True,
             extra_labels: Mapping[str, str] | None = None) -> dict:
        meta: dict[str, Any] = {
            "name": name,
            "namespace": self.c.namespace,
            "labels": names.labels(self.c, component, **(extra_labels or {})),
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


def resources_of(r: Resources, default: Resources) -> dict:
    """A container's requests and limits of cpu and memory: ``r``, filled from
    the component's ``default`` (:meth:`Resources.filled`)."""
    full = r.filled(default)
    return {section: values for section in ("requests", "limits") if (values := getattr(full, section).dump())}


def env_list(pairs: dict[str, str]) -> list[dict]:
    return [{"name": k, "value": v} for k, v in pairs.items()]


def common_env(c: SlurmCluster) -> dict[str, str]:
    env = {
        "SLURMK8S_CLUSTER": c.name,
        "SLURMK8S_CONTROLLER": names.controller_fqdn(c),
        "SLURMK8S_CONTROLLER_PORT": str(names.SLURMCTLD_PORT),
    }
    storage = c.spec.shared_storage
    if storage and storage.checkpoint_dir:
        env["SLURMK8S_CHECKPOINT_ROOT"] = storage.checkpoint_dir
    return env


def shared_volumes(c: SlurmCluster) -> tuple[list[dict], list[dict]]:
    storage = c.spec.shared_storage
    if storage is None:
        return [], []
    volumes, mounts = [], []
    for v in storage.volumes:
        claim = v.existing_claim or names.shared_claim(c, v.name)
        volumes.append({"name": f"shared-{v.name}", "persistentVolumeClaim": {"claimName": claim}})
        mount: dict[str, Any] = {"name": f"shared-{v.name}", "mountPath": v.mount_path}
        if v.read_only:
            mount["readOnly"] = True
        mounts.append(mount)
    return volumes, mounts


def base_volumes(c: SlurmCluster, *, config: bool) -> tuple[list[dict], list[dict]]:
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


def shm_volume(size: str) -> dict:
    """/dev/shm: memory-backed, so bounded (what is written there counts
    against the pod's memory limit)."""
    return {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": size}}


def probe(kind: str, period: int = 10) -> dict:
    return {
        "exec": {"command": [ENTRYPOINT, kind]},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": 3,
    }


#: The capabilities a root daemon of a Slurm image keeps: containerd's
#: default set without NET_RAW (raw sockets: spoofing on the pod network)
#: and MKNOD. They are what sshd, munged, slurmctld, slurmd, slurmstepd and
#: mysqld use to drop to their users (SETUID, SETGID), own their files
#: (CHOWN, FOWNER, FSETID, DAC_OVERRIDE), signal jobs (KILL), bind sshd's
#: port (NET_BIND_SERVICE) and chroot sshd's privilege separation (SYS_CHROOT).
ROOT_CAPABILITIES = ("AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "NET_BIND_SERVICE",
                     "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT")
#: A pod's securityContext where nothing runs user code: containerd's seccomp
#: profile (slurmd and login are left Unconfined: jobs and users may need
#: what it forbids, such as the namespaces of container runtimes).
DAEMON_POD_SECURITY = {"seccompProfile": {"type": "RuntimeDefault"}}


def security_context(given: dict | None) -> dict:
    """A container's securityContext: no privilege escalation (setuid
    binaries gain nothing), every capability dropped but
    :data:`ROOT_CAPABILITIES` (none for a container that runs as non-root),
    and ``given`` over that; a privileged container is left as ``given``."""
    given = dict(given or {})
    if given.get("privileged"):
        return given
    nonroot = given.get("runAsNonRoot") is True
    return {"allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"], **({} if nonroot else {"add": list(ROOT_CAPABILITIES)})},
            **given}


def slurm_container(c: SlurmCluster, name: str, component: str, *, env: dict, mounts: list,
               ports: list, resources: dict, **extra) -> dict:
    extra["securityContext"] = security_context(extra.get("securityContext"))
    container: dict[str, Any] = {
        "name": name,
        "image": names.image(c, component),
        "imagePullPolicy": c.spec.slurm.image.pull_policy,
        "env": env_list(env),
        "ports": ports,
        "volumeMounts": mounts,
    }
    if resources:
        container["resources"] = resources
    container.update(extra)
    return container


def pull_secrets(c: SlurmCluster) -> dict:
    """``imagePullSecrets`` of every pod of the cluster, when the spec names any."""
    return {"imagePullSecrets": [{"name": n} for n in c.spec.image_pull_secrets]} if c.spec.image_pull_secrets else {}


def pod_template(c: SlurmCluster, selector: dict, labels: dict, containers: list, volumes: list,
                  **spec) -> dict:
    return {
        "metadata": {"labels": {**labels, **selector}},
        "spec": {"containers": containers, "volumes": volumes, "enableServiceLinks": False,
                 # Slurm pods never call the Kubernetes API: no token for jobs and SSH users to read.
                 "automountServiceAccountToken": False, **pull_secrets(c), **spec},
    }


def _as_kubernetes(model: BaseModel) -> dict:
    """A template's part as Kubernetes writes it back: what is unset, empty or false left
    out, as Go's omitempty leaves it out (so the operator's plan finds it unchanged)."""
    return model.model_dump(by_alias=True, exclude_none=True, exclude_defaults=True, mode="json")


def _shaped_container(container: dict, t: PodTemplate) -> dict:
    """The slurmd ``container`` with the template's mounts after its own, its resources
    requested and limited alike (beside slurmk8s's, which it cannot name), and its
    capabilities added to those the container keeps (a privileged one has them all)."""
    out = dict(container)
    if t.volume_mounts:
        out["volumeMounts"] = [*out.get("volumeMounts", []), *(_as_kubernetes(m) for m in t.volume_mounts)]
    if t.resources:
        res = out.get("resources", {})
        out["resources"] = {**res, **{section: {**t.resources, **res.get(section, {})}
                                      for section in ("requests", "limits")}}
    security = out.get("securityContext", {})
    if t.capabilities and not security.get("privileged"):
        caps = security.get("capabilities", {})
        have = caps.get("add", [])
        out["securityContext"] = {**security, "capabilities": {
            **caps, "add": [*have, *(c for c in t.capabilities if c not in have)]}}
    return out


def with_site_template(pod: dict, template: PodTemplate | None, container: str = "slurmd") -> dict:
    """``pod`` (a Pod, or a workload's pod template: its ``metadata`` and ``spec``) shaped
    by a site's ``template``, which the validator has checked (decision record 48): its
    labels and annotations beside slurmk8s's (which win: the validator refuses a template
    that names one), its runtimeClassName, priorityClassName, affinity and dnsConfig, its
    tolerations and volumes after slurmk8s's, and in the ``container`` its mounts,
    resources and capabilities. The one place a template is applied: the workers'
    StatefulSets (:func:`.slurmd.workers`) and the lent slurmd pods
    (:func:`.slurmd.lent_slurmd_pod`) both come through it. ``pod`` itself without one."""
    if template is None:
        return pod
    t = template
    meta = dict(pod.get("metadata", {}))
    if t.labels:
        meta["labels"] = {**t.labels, **meta.get("labels", {})}
    if t.annotations:
        meta["annotations"] = {**t.annotations, **meta.get("annotations", {})}
    spec = dict(pod["spec"])
    assert container in {ct["name"] for ct in spec["containers"]}, container
    spec["containers"] = [_shaped_container(ct, t) if ct["name"] == container else ct for ct in spec["containers"]]
    for key, value in (("runtimeClassName", t.runtime_class_name), ("priorityClassName", t.priority_class_name)):
        if value is not None:
            spec[key] = value
    if t.affinity is not None:
        spec["affinity"] = _as_kubernetes(t.affinity)
    if t.dns_config is not None:
        spec["dnsConfig"] = _as_kubernetes(t.dns_config)
    if t.tolerations:
        spec["tolerations"] = [*spec.get("tolerations", []), *(tol.dump() for tol in t.tolerations)]
    if t.volumes:
        spec["volumes"] = [*spec.get("volumes", []), *(_as_kubernetes(v) for v in t.volumes)]
    return {**pod, "metadata": meta, "spec": spec}
