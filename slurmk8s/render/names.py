"""How slurmk8s names and labels the objects of a cluster.

The renderer, the operator, the bridge and the sandbox all derive names from
here, so they agree on them without looking anything up.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping

from ..api.cluster import GROUP, LENT_PREFIX, SlurmCluster, lent_nodeset  # noqa: F401 (re-exported)
from ..slurm import control
from ..strict import count

CONFIG_HASH = f"{GROUP}/config-hash"
#: On pod templates whose pods run sssd: the digest of sssd.conf, so that a change rolls them.
SSSD_HASH = f"{GROUP}/sssd-config-hash"
#: Set by the operator on worker pods that run Slurm jobs; the busy-worker
#: PodDisruptionBudget selects on it.
BUSY_LABEL = f"{GROUP}/slurm-busy"
CLUSTER_LABEL = f"{GROUP}/cluster"
#: The app.kubernetes.io/managed-by of every object the operator renders
#: (a lent slurmd pod is the bridge's: ``render.slurmd.LENT_MANAGER``).
OPERATOR_MANAGER = "slurmk8s-operator"
#: The Slurm release an object was rendered for (spec.slurm.version); the
#: controller StatefulSet's says which release the cluster runs (slurmk8s/operator/upgrade.py).
VERSION_LABEL = "app.kubernetes.io/version"
NODESET_LABEL = f"{GROUP}/nodeset"
#: Secrets holding generated keys carry this; they are created once, never updated.
CREATE_ONLY = f"{GROUP}/create-only"
DELETION_POLICY = f"{GROUP}/deletion-policy"

#: On worker pods the operator is emptying: the evacuation's record
#: (slurmk8s.evacuation.Record): when the drain started, what for (scale-in,
#: rolling update, pod terminating), when the jobs were signalled and which
#: (to start them again at once once they requeue themselves), and when what
#: still ran after the grace period was requeued or cancelled (RFC 3339).
#: They make a drain's grace period survive an operator restart.
DRAIN_STARTED = f"{GROUP}/drain-started"
DRAIN_PURPOSE = f"{GROUP}/drain-purpose"
JOBS_SIGNALLED = f"{GROUP}/jobs-signalled"
SIGNALLED_JOBS = f"{GROUP}/signalled-jobs"
JOBS_FORCED = f"{GROUP}/jobs-forced"
#: On worker pod templates (and so on their pods): a digest of the template
#: without terminationGracePeriodSeconds. The operator restarts a worker only
#: when its pod's digest differs from the StatefulSet's. The grace period
#: follows slurmConfig.killWait, which `scontrol reconfigure` applies: a
#: killWait change alone restarts no worker.
RESTART_HASH = f"{GROUP}/restart-hash"
#: Field manager of every write the operator makes.
FIELD_MANAGER = "slurmk8s-operator"

SLURMCTLD_PORT = 6817
SLURMD_PORT = 6818
SLURMRESTD_PORT = 6820
SLURMDBD_PORT = 6819
MARIADB_PORT = 3306
SSH_PORT = 22
#: The Slurm agent, a sidecar of slurmctld (slurmk8s.slurm.agent).
AGENT_PORT = control.AGENT_PORT
METRICS_PORT = control.METRICS_PORT


def network_policy(c: SlurmCluster, component: str) -> str:
    """The NetworkPolicy of one component's pods (:mod:`.network`), named by a reserved word."""
    return f"{c.name}-" + {"worker": "workers", "database": "mariadb"}.get(component, component)


def controller(c: SlurmCluster) -> str:
    """StatefulSet and headless Service of slurmctld."""
    return f"{c.name}-controller"


def controller_pod(c: SlurmCluster) -> str:
    return f"{controller(c)}-0"


def controller_fqdn(c: SlurmCluster) -> str:
    """The address slurmd, srun and the login pods use to reach slurmctld."""
    return f"{controller_pod(c)}.{controller(c)}.{c.namespace}.svc.{c.spec.cluster_domain}"


def workers_service(c: SlurmCluster) -> str:
    return f"{c.name}-workers"


def nodeset(c: SlurmCluster, nodeset_name: str) -> str:
    """StatefulSet of one node set; its pods (and Slurm nodes) are ``<this>-<ordinal>``."""
    return f"{c.name}-{nodeset_name}"


def busy_budget(statefulset: str) -> str:
    """The PodDisruptionBudget that keeps a node set's busy workers (``BUSY_LABEL``) from eviction."""
    return f"{statefulset}-busy"


def login(c: SlurmCluster) -> str:
    return f"{c.name}-login"


def restapi(c: SlurmCluster) -> str:
    return f"{c.name}-restapi"


def slurmdbd(c: SlurmCluster) -> str:
    """Deployment and Service of slurmdbd."""
    return f"{c.name}-slurmdbd"


def slurmdbd_fqdn(c: SlurmCluster) -> str:
    """The address slurmctld and sacct reach slurmdbd at (AccountingStorageHost)."""
    return f"{slurmdbd(c)}.{c.namespace}.svc.{c.spec.cluster_domain}"


def slurmdbd_config(c: SlurmCluster) -> str:
    return f"{c.name}-slurmdbd-config"


def database(c: SlurmCluster) -> str:
    """StatefulSet and headless Service of the managed MariaDB."""
    return f"{c.name}-mariadb"


def database_fqdn(c: SlurmCluster) -> str:
    return f"{database(c)}.{c.namespace}.svc.{c.spec.cluster_domain}"


def slurm_config(c: SlurmCluster) -> str:
    return f"{c.name}-slurm-config"


def users_config(c: SlurmCluster) -> str:
    return f"{c.name}-users"


def sssd_config(c: SlurmCluster) -> str:
    """The ConfigMap of sssd.conf (spec.identity.ldap)."""
    return f"{c.name}-sssd"


# The generated key Secrets take the cluster or only its name: a teardown
# finds them by name even when the SlurmCluster's spec no longer loads.


def _cluster_name(c: SlurmCluster | str) -> str:
    return c if isinstance(c, str) else c.name


def munge_secret(c: SlurmCluster | str) -> str:
    return f"{_cluster_name(c)}-munge-key"


def jwt_secret(c: SlurmCluster | str) -> str:
    return f"{_cluster_name(c)}-jwt-key"


def ssh_host_keys_secret(c: SlurmCluster | str) -> str:
    return f"{_cluster_name(c)}-ssh-host-keys"


def agent_token_secret(c: SlurmCluster | str) -> str:
    return f"{_cluster_name(c)}-agent-token"


def db_password_secret(c: SlurmCluster | str) -> str:
    """The generated password of the managed database's user."""
    return f"{_cluster_name(c)}-db-password"


def shared_claim(c: SlurmCluster, volume_name: str) -> str:
    return f"{c.name}-{volume_name}"


def selector(c: SlurmCluster, component: str, **extra: str) -> dict[str, str]:
    """Stable labels used in selectors: they never change over a cluster's life."""
    return {
        "app.kubernetes.io/name": "slurm",
        "app.kubernetes.io/instance": c.name,
        "app.kubernetes.io/component": component,
        **extra,
    }


def labels(c: SlurmCluster, component: str, **extra: str) -> dict[str, str]:
    """Every object's labels: the recommended app.kubernetes.io set plus ours."""
    return {
        **selector(c, component),
        "app.kubernetes.io/part-of": "slurmk8s",
        "app.kubernetes.io/managed-by": OPERATOR_MANAGER,
        VERSION_LABEL: c.spec.slurm.version,
        CLUSTER_LABEL: c.name,
        **extra,
    }


def rendered_for(labels: Mapping[str, str]) -> str | None:
    """The name of the SlurmCluster that ``labels`` say the operator rendered
    the object for (:func:`labels`: ``slurmk8s.dev/cluster`` and
    ``managed-by=slurmk8s-operator``); None for any other object. Anyone who
    may write such an object can forge these labels: they say what an object
    claims to be, not who made it."""
    if labels.get("app.kubernetes.io/managed-by") != OPERATOR_MANAGER:
        return None
    return labels.get(CLUSTER_LABEL) or None


def claim_labels(c: SlurmCluster, component: str) -> dict[str, str]:
    """Labels of a StatefulSet's volumeClaimTemplates: :func:`labels` less the version.
    Kubernetes forbids changing a StatefulSet's claim templates, and the version
    changes with spec.slurm.version."""
    return {k: v for k, v in labels(c, component).items() if k != VERSION_LABEL}


def image(c: SlurmCluster, component: str) -> str:
    img = c.spec.slurm.image
    if component in ("slurmdbd", "mariadb") and c.spec.accounting.slurmdbd.image is not None:
        img = c.spec.accounting.slurmdbd.image
    return f"{img.repository}/{component}:{img.tag or c.spec.slurm.version}"


#: Between the cluster part and the node's name in a lent pod's name. No other
#: object name has a '.' (cluster names are DNS-1035 labels, member names and
#: the words after ``<cluster>-`` have none), and the first '.' of a lent
#: pod's name is this one: so a lent pod's name is no other object's name, and
#: names one (cluster, node) pair (docs/decisions/0026-names-that-cannot-collide.md).
LENT_SEPARATOR = "-lent."


def lent_slurmd(c: SlurmCluster | str, node: str) -> str:
    """The slurmd pod of Kubernetes node ``node`` lent to the cluster:
    ``<cluster>-lent.<node>`` (deterministic, so that the bridge finds it
    again after a restart). A name over 253 characters keeps its first 242
    and ends in a digest of the cluster and the node."""
    cluster = _cluster_name(c)
    name = f"{cluster}{LENT_SEPARATOR}{node}"
    if len(name) <= 253:
        return name
    digest = hashlib.sha256(f"{cluster}/{node}".encode()).hexdigest()[:10]
    return f"{name[:242].rstrip('.-')}-{digest}"


#: On a lent slurmd pod: its node (:func:`lent_node_label`), which its
#: PodDisruptionBudget (``render.slurmd.lent_budget``) selects it by.
#: The taint the bridge puts on a node while Slurm has it (the value: the
#: SlurmCluster's name): it keeps new Kubernetes pods off, the lent slurmd pod
#: tolerates it, and the operator's maintenance rule knows it for the bridge's.
LENT_TAINT_KEY = f"{GROUP}/lent"
LENT_TAINT_EFFECT = "NoSchedule"

LENT_NODE_LABEL = f"{GROUP}/lent-node"


def lent_node_label(node: str) -> str:
    """The value of :data:`LENT_NODE_LABEL` for Kubernetes node ``node``: its
    name, which fits a label value up to 63 characters (a node name is a DNS
    subdomain); a longer one keeps its first 52 and ends in a digest of the
    whole name."""
    if len(node) <= 63:
        return node
    digest = hashlib.sha256(node.encode()).hexdigest()[:10]
    return f"{node[:52].rstrip('.-')}-{digest}"


def lent_budget(c: SlurmCluster | str, node: str) -> str:
    """The PodDisruptionBudget that guards the lent slurmd pod of ``node`` while
    Slurm runs jobs there: the pod's own name (:func:`lent_slurmd`)."""
    return lent_slurmd(c, node)


def legacy_lent_slurmd(c: SlurmCluster | str, node: str) -> str:
    """The name lent pods had before :func:`lent_slurmd` (``<cluster>-lent-<node>``),
    which another cluster's worker pod could also have. The bridge still
    recognises a pod of this name as the node's lent pod when the pod says it
    is one (its labels and node), so that an upgrade leaves none behind."""
    name = f"{_cluster_name(c)}-lent-{node}"
    if len(name) <= 253:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:10]
    return f"{name[:242].rstrip('.-')}-{digest}"


#: The highest ordinal a worker's name may carry (a node set holds at most 1024 nodes).
MAX_ORDINAL = 99999


def worker_ordinal(statefulset: str, name: str) -> int | None:
    """The ordinal of the worker pod (and Slurm node) ``name`` of the StatefulSet
    ``statefulset``: ``<statefulset>-<ordinal>``, the ordinal in ASCII digits
    without a leading zero, as the StatefulSet controller names pods, and at
    most :data:`MAX_ORDINAL`; None for any other name. The one reading of a
    worker's name."""
    digits = name[len(statefulset) + 1:] if name.startswith(statefulset + "-") else ""
    if digits.startswith("0") and digits != "0":
        return None
    return count(digits, MAX_ORDINAL)


def is_worker_node_name(cluster: str, node: str) -> bool:
    """Whether ``node`` has the shape of a name a worker of ``cluster`` (or its
    controller pod) has or may get: ``<cluster>-<word>-<ordinal>``. A
    Kubernetes node of such a name is not lent to the cluster: its Slurm node
    would share a name with one of the cluster's own."""
    return re.fullmatch(rf"{re.escape(cluster)}-[a-z][a-z0-9]*-[0-9]+", node) is not None


# -- topology.conf switch names ---------------------------------------------------------------
#
# A switch of the tree is named after the label values on its path from the
# top tier: ``sw_`` and the values joined by '_', each value's own '_'
# doubled. A label value starts and ends with a letter or digit, so a single
# '_' between two values can only be a separator and a run of them inside a
# value is always even: the name gives back the path (labels (a_b, c) make
# sw_a__b_c, (a, b_c) make sw_a_b__c). The switches slurmk8s adds itself
# start with "sw-", which no path gives.

#: The switch over the top tier, when it has more than one switch.
ROOT_SWITCH = "sw-root"


def switch(path: tuple[str, ...]) -> str:
    """The switch of the tree at ``path``: label values, top tier first."""
    return "sw_" + "_".join(value.replace("_", "__") for value in path)


def unlabelled_switch(depth: int) -> str:
    """The switch at tier ``depth`` (1 the top) above the nodes whose Kubernetes
    node lacks one of the topology labels."""
    return f"sw-unlabelled-{depth}"
