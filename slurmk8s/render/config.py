"""Slurm configuration files, written from the jinja2 templates in ``templates/``.

``config_files`` is pure: the same cluster (and topology inventory) gives the
same bytes. This module builds the *values*; the templates hold all of the
text. Every value that comes from the user was checked by the API model.
"""

from __future__ import annotations

import importlib.resources
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jinja2

from .. import versions
from ..api.cluster import SlurmCluster
from ..api.fields import RESERVED_USERS, SYSTEM_GROUPS, quantity_value
from ..slurm.model import config_hash  # noqa: F401 (re-exported: the rendered files' digest)
from . import names

#: Where the images expect things (see images/README.md).
STATE_DIR = "/var/spool/slurmctld"
SLURMD_SPOOL = "/var/spool/slurmd"
JWT_KEY_PATH = "/run/slurmk8s/jwt/jwt_hs256.key"
#: What a GPU slurmd's entrypoint replaces with the devices of its pod (``/dev/nvidia[4-7]``).
GPU_FILES = "@GPU_FILES@"
#: The slurmd image's TaskProlog (images/slurmd/task-prolog.sh): it gives jobs
#: SLURMK8S_CHECKPOINT_DIR under the directory slurm.conf names beside it.
TASK_PROLOG = "/usr/local/lib/slurmk8s/task-prolog"
#: The slurmd image's Prolog with a directory (images/slurmd/prolog.sh): it looks the
#: job's user up on each of its nodes, so their sssd caches hold them.
PROLOG = "/usr/local/lib/slurmk8s/prolog"
#: slurmctld's PrologSlurmctld (templates/prolog-slurmctld.j2, in the slurm-config ConfigMap): it
#: turns every SLURM_GET_USER_ENV=1 left in a batch job's stored environment into =0 before the
#: job launches. The controller pod mounts it executable here (render/controller.py).
PROLOG_SLURMCTLD_DIR = "/run/slurmk8s/slurmctld"
PROLOG_SLURMCTLD_FILE = "prolog-slurmctld"
PROLOG_SLURMCTLD = f"{PROLOG_SLURMCTLD_DIR}/{PROLOG_SLURMCTLD_FILE}"
#: slurmk8s's HealthCheckProgram in the slurmd image (images/slurmd/healthcheck.sh).
HEALTH_CHECK_PROGRAM = "/usr/local/lib/slurmk8s/healthcheck"
#: Every release has auth/munge (`versions.Release.auth_types`), and the images run munged.
AUTH_TYPE = "auth/munge"
#: Database and user slurmdbd gets in the managed MariaDB (images/mariadb creates them).
MANAGED_DATABASE = "slurm_acct_db"
MANAGED_DB_USER = "slurm"


@dataclass(frozen=True)
class TopologyNode:
    """A Slurm node and the labels of the Kubernetes node it runs on."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)


def _env() -> jinja2.Environment:
    root = importlib.resources.files("slurmk8s.templates")
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(root)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


_ENV = _env()


def render_template(name: str, **context) -> str:
    return _ENV.get_template(f"{name}.j2").render(**context)


def dynamic_node_conf(*, cpus: int, memory_mib: int, gpus: int, gpu_type: str, features: Sequence[str]) -> str:
    """The node definition a dynamic slurmd registers with (``slurmd -Z --conf``):
    a node set's worker and a lent node alike."""
    return render_template("node-conf", cpus=cpus, memory_mib=memory_mib, gpus=gpus, gpu_type=gpu_type,
                           features=list(features)).strip()


def memory_mib(quantity: str) -> int:
    return int(quantity_value(quantity) // 2**20)


def _default_partition(c: SlurmCluster) -> str | None:
    parts = c.spec.partitions
    chosen = next((p for p in parts if p.default), parts[0] if parts else None)
    return chosen.name if chosen else None


def _health(c: SlurmCluster) -> dict | None:
    """What the HealthCheckProgram reads from its ``#slurmk8s:Health*`` lines:
    the checks (disk and memory when a threshold is set), the shared volumes'
    mount points, the thresholds in bytes."""
    h = c.spec.health_check
    if not h.enabled:
        return None
    checks = list(h.checks) + (["disk"] if h.min_free_disk else []) + (["memory"] if h.min_available_memory else [])
    storage = c.spec.shared_storage
    return {
        "interval": h.interval_seconds,
        "node_states": ",".join(h.node_states),
        "checks": " ".join(checks),
        "shared_paths": " ".join(v.mount_path for v in storage.volumes) if storage else "",
        "min_free_disk": int(quantity_value(h.min_free_disk)) if h.min_free_disk else None,
        "min_available_memory": int(quantity_value(h.min_available_memory)) if h.min_available_memory else None,
    }


def slurm_conf_context(c: SlurmCluster) -> dict:
    spec = c.spec
    cfg = spec.slurm_config
    release = versions.release(spec.slurm.version)
    preempting = any(p.preemption.mode != "off" for p in spec.partitions)
    # Preempted jobs get the signal they asked for with --signal, so they can
    # checkpoint. Which key says so depends on the release.
    params = {"SlurmctldParameters": ["enable_configless"], "PreemptParameters": []}
    if preempting:
        key, value = release.preempt_user_signal
        params[key].append(value)
    default = _default_partition(c)
    lending = [p for p in spec.partitions if p.accept_lent_nodes]
    storage = spec.shared_storage
    return {
        "namespace": c.namespace,
        "cluster": c.name,
        "version": spec.slurm.version,
        "controller_host": names.controller_pod(c),
        "controller_addr": names.controller_fqdn(c),
        "ctld_port": names.SLURMCTLD_PORT,
        "slurmd_port": names.SLURMD_PORT,
        "state_dir": STATE_DIR,
        "slurmd_spool": SLURMD_SPOOL,
        "rest_api": spec.rest_api.enabled,
        "jwt_key_path": JWT_KEY_PATH,
        "cgroups": cfg.cgroups,
        # Lent nodes are GPU nodes: their slurmd registers a gpu GRES.
        "gpus": any(ns.gpus for ns in spec.node_sets) or bool(lending),
        "ctld_params": ",".join(params["SlurmctldParameters"]),
        "preempt_params": ",".join(params["PreemptParameters"]),
        "auth_type": AUTH_TYPE,
        "select_type": release.select_type,
        "prolog_slurmctld": PROLOG_SLURMCTLD,
        "topology_plugin": release.topology_tree_plugin,
        "preempting": preempting,
        "cfg": cfg,
        "scheduler_parameters": ",".join(cfg.scheduler_parameters),
        "topology": spec.topology is not None,
        "checkpoint_dir": storage.checkpoint_dir if storage else None,
        "task_prolog": TASK_PROLOG,
        "prolog": PROLOG if spec.identity.ldap is not None else None,
        "health": _health(c),
        "health_program": HEALTH_CHECK_PROGRAM,
        "node_sets": [
            {"name": ns.name, "feature": ns.name} for ns in spec.node_sets
        ],
        "lent_node_sets": [
            {"name": names.lent_nodeset(p.name), "feature": names.lent_nodeset(p.name),
             "partition": p.name}
            for p in lending
        ],
        "partitions": [
            {
                "name": p.name,
                "nodes": ",".join(
                    [*p.node_sets, *([names.lent_nodeset(p.name)] if p.accept_lent_nodes else [])]
                ),
                "default": p.name == default,
                "max_time": p.max_time,
                "priority_tier": p.priority,
                "preempt_mode": p.preemption.mode.upper(),
                "grace_time": p.preemption.grace_time,
            }
            for p in spec.partitions
        ],
        "extra_lines": cfg.extra_lines,
        "accounting": {
            "host": names.slurmdbd_fqdn(c),
            "port": names.SLURMDBD_PORT,
            "enforce": ",".join(spec.accounting.enforce),
        } if spec.accounting.enabled else None,
        "fair_share": spec.accounting.fair_share if spec.accounting.enabled else None,
    }


def slurmdbd_conf(c: SlurmCluster) -> str:
    """slurmdbd.conf without its password and host (the entrypoint adds both)."""
    db = c.spec.accounting.database
    if db.external is not None:
        host, port, loc, user = db.external.host, db.external.port, db.external.database, db.external.user
    else:
        host, port, loc, user = names.database_fqdn(c), names.MARIADB_PORT, MANAGED_DATABASE, MANAGED_DB_USER
    return render_template(
        "slurmdbd.conf", namespace=c.namespace, cluster=c.name, version=c.spec.slurm.version,
        auth_type=AUTH_TYPE, dbd_port=names.SLURMDBD_PORT, storage_host=host, storage_port=port,
        storage_loc=loc, storage_user=user)


def gres_context(c: SlurmCluster) -> dict:
    """The cluster's gres.conf: no line of its own (:func:`gpu_gres_conf`)."""
    return {"cluster": c.name, "gpu": None}


def gpu_gres_conf(cluster: str, gpu_type: str) -> str:
    """The gres.conf of one GPU slurmd: its GPUs of ``gpu_type``, with
    :data:`GPU_FILES` where the entrypoint puts the devices its pod was given.

    Which devices a pod gets is the NVIDIA device plugin's choice, made when
    the pod starts: it hands over the host's own ``/dev/nvidiaN`` (GPUs 4-7 of
    an 8-GPU node are ``/dev/nvidia4``..``/dev/nvidia7``). So no gres.conf can
    name them ahead of time; every GPU slurmd, of a node set or lent, reads
    this one with its devices filled in (``File=/dev/nvidia[4-7]``). Slurm
    numbers a node's GPUs in that order for the jobs' CUDA_VISIBLE_DEVICES,
    as CUDA numbers the devices the pod sees."""
    return render_template("gres.conf", cluster=cluster, gpu={"type": gpu_type, "files": GPU_FILES})


def topology_context(c: SlurmCluster, nodes: Sequence[TopologyNode]) -> dict:
    """Switches of a topology/tree from node labels, top tier first."""
    topo = c.spec.topology
    if topo is None:
        return {"cluster": c.name, "enabled": False, "switches": [], "keys": []}
    keys = topo.label_keys
    depth = len(keys)
    # A path is a tuple of switch names, top tier first (names.switch): the
    # label values of the node's path, or the unlabelled switches when the
    # node lacks a label.
    children: dict[tuple[str, ...], set[str]] = {}
    leaves: dict[tuple[str, ...], list[str]] = {}
    for node in sorted(nodes, key=lambda n: n.name):
        values = tuple(node.labels.get(k, "") for k in keys)
        if all(values):
            path = tuple(names.switch(values[: d + 1]) for d in range(depth))
        else:
            path = tuple(names.unlabelled_switch(d + 1) for d in range(depth))
        leaves.setdefault(path, []).append(node.name)
        for d in range(1, depth):
            children.setdefault(path[:d], set()).add(path[d])

    switches = []
    for path in sorted(children):
        switches.append({"name": path[-1], "switches": ",".join(sorted(children[path]))})
    for path in sorted(leaves):
        switches.append({"name": path[-1], "nodes": ",".join(leaves[path])})
    tops = sorted({p[0] for p in leaves})
    if len(tops) > 1:
        # Join the top tier so that jobs may span all of it.
        switches.insert(0, {"name": names.ROOT_SWITCH, "switches": ",".join(tops)})
    return {"cluster": c.name, "enabled": True, "switches": switches, "keys": keys}


def config_files(c: SlurmCluster, topology_nodes: Sequence[TopologyNode] = ()) -> dict[str, str]:
    """The files of the ``<cluster>-slurm-config`` ConfigMap."""
    return {
        "slurm.conf": render_template("slurm.conf", **slurm_conf_context(c)),
        "gres.conf": render_template("gres.conf", **gres_context(c)),
        "cgroup.conf": render_template("cgroup.conf", cluster=c.name, cgroups=c.spec.slurm_config.cgroups),
        "topology.conf": render_template("topology.conf", **topology_context(c, topology_nodes)),
        "job_submit.lua": render_template("job_submit.lua", namespace=c.namespace, cluster=c.name),
        PROLOG_SLURMCTLD_FILE: render_template("prolog-slurmctld", namespace=c.namespace, cluster=c.name,
                                               state_dir=STATE_DIR),
    }


def user_files(c: SlurmCluster) -> dict[str, str]:
    """passwd/group fragments and inline authorized_keys of the login users."""
    users: list[dict[str, Any]] = [
        {"name": u.name, "uid": u.uid, "gid": u.gid or u.uid, "keys": u.ssh_public_keys}
        for u in c.spec.login.users
    ]
    groups: dict[int, str] = {}
    for u in users:  # a group per gid, named after the first user who has it
        groups.setdefault(u["gid"], u["name"])
    files = {
        "passwd": render_template("passwd", users=users),
        "group": render_template(
            "group", groups=[{"name": n, "gid": g} for g, n in groups.items()]
        ),
    }
    for u in users:
        files[f"{u['name']}.authorized_keys"] = render_template("authorized_keys", user=u)
    return files




#: Where the sssd container finds the directory's CA (spec.identity.ldap.ca), and its domain's name.
LDAP_CA_FILE = "/run/slurmk8s/ldap-ca/ca.crt"
SSSD_DOMAIN = "directory"


def followed_groups(c: SlurmCluster) -> str:
    """The directory groups accounts follow (spec.accounting.accounts[].groups), one per line,
    for the controller pod's sssd container, which lists their members (images/sssd/probe.sh)."""
    acct = c.spec.accounting
    groups = sorted({g for a in acct.accounts for g in a.groups}) if acct.enabled else []
    return render_template("sssd-groups", cluster=c.name, groups=groups)


def sssd_conf(c: SlurmCluster) -> str | None:
    """sssd.conf of spec.identity.ldap (None without a directory); the bind password is
    added by the sssd container from its Secret."""
    ldap = c.spec.identity.ldap
    if ldap is None:
        return None
    # login.users win: the directory's entries of their names (their groups are named after
    # them, user_files) are not read, as those of the images' own accounts and groups.
    local = [u.name for u in c.spec.login.users]
    return render_template(
        "sssd.conf", cluster=c.name, domain=SSSD_DOMAIN, uris=ldap.uris, start_tls=ldap.start_tls,
        ca_file=LDAP_CA_FILE if ldap.ca is not None else None, bind_dn=ldap.bind_dn,
        user_search_base=ldap.user_search_base, user_filter=ldap.user_filter,
        group_search_base=ldap.group_search_base, group_filter=ldap.group_filter,
        ssh_key_attribute=ldap.ssh_public_key_attribute, login_groups=ldap.login_groups,
        min_id=ldap.min_id, max_id=ldap.max_id, cache_seconds=ldap.cache_seconds,
        filter_users=sorted(RESERVED_USERS | set(local)), filter_groups=sorted(SYSTEM_GROUPS | set(local)))
