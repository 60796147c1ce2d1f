"""The site's directory in the Slurm pods (``spec.identity.ldap``): an sssd container beside
the login, slurmctld and slurmd containers. Pure.

The sssd container reads ``sssd.conf`` (the ``<cluster>-sssd`` ConfigMap), the bind
password and the CA, and answers on its sockets in ``/var/lib/sss/pipes``, an emptyDir it
shares with the pod's Slurm container. There, glibc's ``sss`` module (``passwd: files
sss`` in the images) resolves the directory's users and groups, and the login pod's sshd
asks the sssd container for their keys on a root-only socket (``sss_ssh_authorizedkeys``
runs there). Only the sssd container mounts the password (readable by root alone); the
Slurm containers see the sockets, read-only.
Why a container of its own rather than sssd inside each image: docs/decisions/0041.
"""

from __future__ import annotations

from ..api.cluster import SlurmCluster
from . import names
from .config import LDAP_CA_FILE, config_hash, sssd_conf
from .pods import ENTRYPOINT, security_context

__all__ = ["SSSD_CONFIG_DIR", "LDAP_BIND_DIR", "PIPES_DIR", "with_directory", "SSSD_RESOURCES"]

#: Mount points of the sssd image (images/sssd/entrypoint.sh reads them).
SSSD_CONFIG_DIR = "/run/slurmk8s/sssd"
LDAP_BIND_DIR = "/run/slurmk8s/ldap-bind"
LDAP_CA_DIR = LDAP_CA_FILE.rsplit("/", 1)[0]
#: SSSD's sockets (nss, ssh; pam and the rest under private/, root's), and its memory cache.
PIPES_DIR = "/var/lib/sss/pipes"
MC_DIR = "/var/lib/sss/mc"
DB_DIR = "/var/lib/sss/db"
SSSD_RESOURCES = {"requests": {"cpu": "20m", "memory": "64Mi"}, "limits": {"cpu": "500m", "memory": "256Mi"}}


def _volumes(c: SlurmCluster) -> tuple[list[dict], list[dict]]:
    ldap = c.spec.identity.ldap
    assert ldap is not None
    volumes: list[dict] = [
        {"name": "sssd-config", "configMap": {"name": names.sssd_config(c), "defaultMode": 0o400}},
        {"name": "sss-pipes", "emptyDir": {"sizeLimit": "16Mi"}},
        {"name": "sss-mc", "emptyDir": {"sizeLimit": "64Mi"}},
        # The cache, sssd's alone: it outlives a restart of the sssd container.
        {"name": "sss-db", "emptyDir": {"sizeLimit": "256Mi"}},
    ]
    mounts: list[dict] = [
        {"name": "sssd-config", "mountPath": SSSD_CONFIG_DIR, "readOnly": True},
        {"name": "sss-pipes", "mountPath": PIPES_DIR},
        {"name": "sss-mc", "mountPath": MC_DIR},
        {"name": "sss-db", "mountPath": DB_DIR},
    ]
    if ldap.bind_password_secret is not None:
        ref = ldap.bind_password_secret
        volumes.append({"name": "ldap-bind", "secret": {
            "secretName": ref.name, "items": [{"key": ref.key, "path": "password"}], "defaultMode": 0o400}})
        mounts.append({"name": "ldap-bind", "mountPath": LDAP_BIND_DIR, "readOnly": True})
    if ldap.ca is not None:
        cm, secret = ldap.ca.config_map, ldap.ca.secret
        ca = cm if cm is not None else secret
        assert ca is not None  # the API takes exactly one of the two
        items = [{"key": ca.key, "path": "ca.crt"}]
        source = {"configMap": {"name": ca.name, "items": items, "defaultMode": 0o444}} if cm is not None else \
            {"secret": {"secretName": ca.name, "items": items, "defaultMode": 0o444}}
        volumes.append({"name": "ldap-ca", **source})
        mounts.append({"name": "ldap-ca", "mountPath": LDAP_CA_DIR, "readOnly": True})
    return volumes, mounts


#: How often the controller pod's sssd container probes the directory (images/sssd/probe.sh):
#: one bind per interval, from that pod only.
PROBE_SECONDS = 10


def _container(c: SlurmCluster, mounts: list[dict], probe: bool) -> dict:
    return {
        "name": "sssd",
        **({"env": [{"name": "PROBE_SECONDS", "value": str(PROBE_SECONDS)}]} if probe else {}),
        "image": names.image(c, "sssd"),
        "imagePullPolicy": c.spec.slurm.image.pull_policy,
        "volumeMounts": mounts,
        "resources": SSSD_RESOURCES,
        # Ready once its sockets answer; a directory that is down does not make it unready
        # (cached users keep resolving), the status says so instead.
        "readinessProbe": {"exec": {"command": [ENTRYPOINT, "ready"]}, "periodSeconds": 10, "timeoutSeconds": 5},
        "securityContext": security_context(None),
    }


def with_directory(c: SlurmCluster, template: dict, *clients: str, probe: bool = False) -> dict:
    """The pod ``template`` with the sssd container and its volumes when the spec names a
    directory (its containers named in ``clients`` see sssd's sockets and cache, read-only;
    a change of sssd.conf rolls the pods); unchanged otherwise. With ``probe`` (the
    controller pod), the sssd container also probes the directory every PROBE_SECONDS and
    leaves its verdict beside its sockets, for the agent (slurm/directory.py)."""
    conf = sssd_conf(c)
    if conf is None:
        return template
    vols, mounts = _volumes(c)
    shared = [{"name": "sss-pipes", "mountPath": PIPES_DIR, "readOnly": True},
              {"name": "sss-mc", "mountPath": MC_DIR, "readOnly": True}]
    spec = template["spec"]
    assert clients and set(clients) <= {ct["name"] for ct in spec["containers"]}, clients
    containers = [{**ct, "volumeMounts": [*ct.get("volumeMounts", []), *shared]} if ct["name"] in clients else ct
                  for ct in spec["containers"]]
    meta = template.get("metadata", {})
    annotations = {**meta.get("annotations", {}), names.SSSD_HASH: config_hash({"sssd.conf": conf})}
    return {**template, "metadata": {**meta, "annotations": annotations},
            "spec": {**spec, "containers": [*containers, _container(c, mounts, probe)],
                     "volumes": [*spec.get("volumes", []), *vols]}}
