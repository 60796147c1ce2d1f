"""SlurmCluster -> Kubernetes objects. Pure: no I/O, no clock, no randomness.

:func:`render` composes the components, each in its own module: the
controller (:mod:`.controller`: slurmctld and the agent), the slurmd pods
(:mod:`.slurmd`: workers, and the lent node's pod), the login pods
(:mod:`.login`) and slurmrestd (:mod:`.restapi`), from what every pod is made
of (:mod:`.pods`), and the NetworkPolicies of their traffic (:mod:`.network`). The config and users ConfigMaps, the key Secrets and
the shared claims are here.

The objects and what the images expect of them (paths, variables) are
described in docs/architecture.md and images/README.md.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence

from ..api.cluster import SlurmCluster
from . import accounting, controller, login, names, network, restapi, slurmd
from .config import TopologyNode, config_files, config_hash, followed_groups, sssd_conf, user_files
from .controller import AgentClients
from .keys import ClusterKeys
from .pods import Builder
from .slurmd import lent_budget, lent_slurmd_pod, node_conf

__all__ = ["render", "node_conf", "lent_slurmd_pod", "lent_budget", "AgentClients"]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _secret(b: Builder, name: str, component: str, data: dict[str, bytes]) -> dict:
    meta = b.meta(name, component)
    meta["annotations"][names.CREATE_ONLY] = "true"
    return b.obj("v1", "Secret", meta, type="Opaque", immutable=True,
                 data={k: _b64(v) for k, v in data.items()})


def _claims(b: Builder) -> list[dict]:
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
    with ``agent_clients``, the NetworkPolicies admit only them to the agent's
    port (without, any pod: the renderer does not know who they are).
    """
    c = cluster
    files = config_files(c, topology_nodes)
    chash = config_hash(files)
    b = Builder(c, chash)
    objs = [
        b.obj("v1", "ConfigMap", b.meta(names.slurm_config(c), "config"), data=files),
        b.obj("v1", "ConfigMap", b.meta(names.users_config(c), "config"), data=user_files(c)),
        # groups: read at each probe, so a change of them rolls no pod (the hash is sssd.conf's).
        *([b.obj("v1", "ConfigMap", b.meta(names.sssd_config(c), "config"),
                 data={"sssd.conf": sssd, "groups": followed_groups(c)})]
          if (sssd := sssd_conf(c)) is not None else []),
        _secret(b, names.munge_secret(c), "config", {"munge.key": keys.munge_key}),
        _secret(b, names.ssh_host_keys_secret(c), "login", {
            "ssh_host_ed25519_key": keys.ssh_host_key,
            "ssh_host_ed25519_key.pub": keys.ssh_host_public_key().encode() + b"\n",
        }),
    ]
    objs.append(_secret(b, names.agent_token_secret(c), "controller", {"token": keys.agent_token}))
    if c.spec.rest_api.enabled:
        objs.append(_secret(b, names.jwt_secret(c), "restapi", {"jwt_hs256.key": keys.jwt_key}))
    acct = c.spec.accounting
    if acct.enabled and acct.database.external is None:
        objs.append(_secret(b, names.db_password_secret(c), "database", {"password": keys.db_password}))
    objs += _claims(b)
    if acct.enabled:
        # Before the controller: slurmdbd comes up first (docs/decisions/0024).
        objs += accounting.objects(b)
    objs += controller.objects(b, with_jwt=c.spec.rest_api.enabled)
    objs += slurmd.workers(b)
    objs += login.objects(b)
    if c.spec.rest_api.enabled:
        objs += restapi.objects(b)
    objs += network.policies(b, agent_clients)
    return objs
