"""Accounting: slurmdbd (a Deployment behind a Service) and, for a managed
database, MariaDB (a one-pod StatefulSet with its data on a claim). Pure.

slurmctld finds slurmdbd through the Service (slurm.conf's
AccountingStorageHost); slurmdbd finds the database through the MariaDB
Service or the external host. Passwords never enter a ConfigMap: the
slurmdbd entrypoint reads the password Secret when it writes the final
slurmdbd.conf, and the mariadb entrypoint when it creates the user.
"""

from __future__ import annotations

from ..api.cluster import MARIADB_RESOURCES, SLURMDBD_RESOURCES, ManagedDatabase, Resources, SlurmCluster
from ..api.quantities import parse_quantity
from ..slurm.model import config_hash
from . import names
from .config import MANAGED_DATABASE, MANAGED_DB_USER, slurmdbd_conf
from .pods import DAEMON_POD_SECURITY, ENTRYPOINT, MUNGE_DIR, Builder, pod_template, resources_of, slurm_container

__all__ = ["objects", "buffer_pool_mib", "DBD_CONFIG_DIR", "DB_PASSWORD_DIR", "DATA_DIR"]

#: Where the images expect things (images/README.md).
DBD_CONFIG_DIR = "/run/slurmk8s/slurmdbd"
DB_PASSWORD_DIR = "/run/slurmk8s/db"
DATA_DIR = "/var/lib/mysql"


def _password(c: SlurmCluster) -> tuple[str, str]:
    """(Secret, key) of the database user's password."""
    ext = c.spec.accounting.database.external
    if ext is not None:
        return ext.password_secret.name, ext.password_secret.key
    return names.db_password_secret(c), "password"


def buffer_pool_mib(resources: Resources) -> int:
    """InnoDB's buffer pool for the managed MariaDB, in MiB: half the container's memory
    limit (its request without one; 256 MiB with neither), at least 32. slurmdbd logs
    "Database settings not recommended values: innodb_buffer_pool_size" below half of
    SchedMD's recommendation (2 GiB for 24.11 and later, 512 MiB for 22.05); a pool as
    large as the limit would leave MariaDB no room for its connections and sorts, and
    the kernel would kill it. InnoDB takes the pool's pages as it uses them."""
    memory = resources.limits.memory or resources.requests.memory
    if memory is None:
        return 256
    return max(32, int(parse_quantity(memory) // 2**21))


def _exec_probe(period: int, failures: int) -> dict:
    return {"exec": {"command": [ENTRYPOINT, "ready"]}, "periodSeconds": period, "timeoutSeconds": 5,
            "failureThreshold": failures}


def objects(b: Builder) -> list[dict]:
    c = b.c
    out = [b.obj("v1", "ConfigMap", b.meta(names.slurmdbd_config(c), "slurmdbd"),
                 data={"slurmdbd.conf": slurmdbd_conf(c)})]
    if c.spec.accounting.database.external is None:
        out += _database(b)
    out += _slurmdbd(b)
    return out


def _slurmdbd(b: Builder) -> list[dict]:
    c = b.c
    acct = c.spec.accounting
    name = names.slurmdbd(c)
    sel = names.selector(c, "slurmdbd")
    secret, key = _password(c)
    volumes = [
        {"name": "munge-key", "secret": {"secretName": names.munge_secret(c), "defaultMode": 0o400}},
        {"name": "slurmdbd-config", "configMap": {"name": names.slurmdbd_config(c)}},
        {"name": "db-password", "secret": {"secretName": secret, "defaultMode": 0o400,
                                           "items": [{"key": key, "path": "password"}]}},
    ]
    mounts = [
        {"name": "munge-key", "mountPath": MUNGE_DIR, "readOnly": True},
        {"name": "slurmdbd-config", "mountPath": DBD_CONFIG_DIR, "readOnly": True},
        {"name": "db-password", "mountPath": DB_PASSWORD_DIR, "readOnly": True},
    ]
    db = acct.database.external
    env = {"SLURMK8S_CLUSTER": c.name,
           "SLURMK8S_DB_HOST": db.host if db else names.database_fqdn(c),
           "SLURMK8S_DB_PORT": str(db.port if db else names.MARIADB_PORT)}
    tcp = {"tcpSocket": {"port": "slurmdbd"}, "periodSeconds": 10, "timeoutSeconds": 5}
    container = slurm_container(
        c, "slurmdbd", "slurmdbd", env=env, mounts=mounts,
        ports=[{"name": "slurmdbd", "containerPort": names.SLURMDBD_PORT}],
        resources=resources_of(acct.slurmdbd.resources, SLURMDBD_RESOURCES),
        readinessProbe={**tcp, "failureThreshold": 3},
        livenessProbe={**tcp, "failureThreshold": 6, "initialDelaySeconds": 60},
    )
    template = pod_template(c, sel, names.labels(c, "slurmdbd"), [container], volumes,
                            terminationGracePeriodSeconds=30, securityContext=dict(DAEMON_POD_SECURITY))
    # A changed slurmdbd.conf takes a restart: the template carries its digest.
    template["metadata"]["annotations"] = {names.CONFIG_HASH: config_hash({"slurmdbd.conf": slurmdbd_conf(c)})}
    return [
        b.obj("v1", "Service", b.meta(name, "slurmdbd"), spec={
            "selector": sel,
            "ports": [{"name": "slurmdbd", "port": names.SLURMDBD_PORT, "targetPort": "slurmdbd"}],
        }),
        b.obj("apps/v1", "Deployment", b.meta(name, "slurmdbd"), spec={
            "replicas": 1,
            # Never two slurmdbd on one database.
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": sel},
            "template": template,
        }),
    ]


def _database(b: Builder) -> list[dict]:
    c = b.c
    # Managed is the default when external is unset.
    managed = c.spec.accounting.database.managed or ManagedDatabase()
    vol, resources = managed.volume, managed.resources
    name = names.database(c)
    sel = names.selector(c, "database")
    secret, key = _password(c)
    volumes = [{"name": "db-password", "secret": {"secretName": secret, "defaultMode": 0o400,
                                                  "items": [{"key": key, "path": "password"}]}}]
    mounts = [{"name": "data", "mountPath": DATA_DIR},
              {"name": "db-password", "mountPath": DB_PASSWORD_DIR, "readOnly": True}]
    container = slurm_container(
        c, "mariadb", "mariadb", mounts=mounts,
        env={"SLURMK8S_CLUSTER": c.name, "SLURMK8S_DB_NAME": MANAGED_DATABASE, "SLURMK8S_DB_USER": MANAGED_DB_USER,
             "SLURMK8S_DB_BUFFER_POOL_MIB": str(buffer_pool_mib(resources.filled(MARIADB_RESOURCES)))},
        ports=[{"name": "mysql", "containerPort": names.MARIADB_PORT}],
        resources=resources_of(resources, MARIADB_RESOURCES),
        readinessProbe=_exec_probe(10, 3),
        startupProbe=_exec_probe(5, 120),
        livenessProbe=_exec_probe(20, 6),
    )
    claim_spec = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": vol.size}}}
    if vol.storage_class_name:
        claim_spec["storageClassName"] = vol.storage_class_name
    return [
        b.obj("v1", "Service", b.meta(name, "database"), spec={
            "clusterIP": "None",
            "selector": sel,
            "ports": [{"name": "mysql", "port": names.MARIADB_PORT, "targetPort": "mysql"}],
        }),
        b.obj("apps/v1", "StatefulSet", b.meta(name, "database"), spec={
            "serviceName": name,
            "replicas": 1,
            "selector": {"matchLabels": sel},
            # The records outlive the SlurmCluster unless spec.deletionPolicy is Delete.
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": c.spec.deletion_policy,
                                                     "whenScaled": "Retain"},
            "template": pod_template(c, sel, names.labels(c, "database"), [container], volumes,
                                     terminationGracePeriodSeconds=60, securityContext=dict(DAEMON_POD_SECURITY)),
            "volumeClaimTemplates": [{
                "metadata": {"name": "data", "labels": names.claim_labels(c, "database")},
                "spec": claim_spec,
            }],
        }),
    ]
