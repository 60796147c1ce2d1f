"""The SlurmCluster resource (group slurmk8s.dev, version v1alpha1).

Over 500 lines because it is the spec, one tree of declarative models with one
reason to change (what users may write in a SlurmCluster), and it reads
top-down as the API reference that ``kubectl explain`` shows. Nearly every
line is a field and its description; there is little logic to split off, and
splitting the tree by component would make a reader follow imports to see one
resource.

These models are the one source of truth: the CRD under ``charts/`` is
generated from them (``slurmk8s crd``), the renderer consumes them, and
``slurmk8s validate`` checks manifests against them. The status the
operator writes is in :mod:`.status`, the field types in :mod:`.fields`.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import AfterValidator, Field

from .. import versions
from .base import GROUP, MAX_EXACT_INTEGER, ApiModel, list_map  # noqa: F401 (GROUP re-exported: callers import it from here)
from .fields import (
    DATA_KEY_RE,
    PERSON_ID_LOW_MAX,
    PERSON_ID_MIN,
    SACCTMGR_NAME_RE,
    AbsPath,
    AnnotationKey,
    AnnotationValue,
    Cidr,
    ClusterName,
    DnsLabel,
    DnsSubdomain,
    ExtraLine,
    LabelKey,
    LabelValue,
    MemberName,
    NamespaceName,
    PartitionName,
    PortRange,
    PosixUser,
    Quantity,
    SlurmDuration,
    SlurmName,
    SlurmVersion,
    SlurmWord,
    SshPublicKey,
    constrained,
    credential_host,
    quantity_value,
    refuse,
)
from .identity import IdentitySpec, PosixGroup
from .podtemplate import PodTemplate
from .scheduling import Toleration
from .status import SlurmClusterStatus

VERSION = "v1alpha1"
API_VERSION: Final = "slurmk8s.dev/v1alpha1"  # GROUP/VERSION, spelled out: the models' Literal types say it so
KIND: Final = "SlurmCluster"
PLURAL = "slurmclusters"

ImageRepository = Annotated[str, constrained(
    r"[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*",
    "use an image repository such as ghcr.io/slurmk8s or registry.example.com:5000/hpc",
    255,
    slurm=False,
)]
ImageTag = Annotated[str, constrained(
    r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}",
    "use an image tag of letters, digits, '_', '.' and '-'",
    128,
    slurm=False,
)]
ObjectUid = Annotated[str, constrained(r"[A-Za-z0-9-]+", "use the uid the API server set (a UUID)", 128, slurm=False)]
SecretKey = Annotated[str, constrained(
    DATA_KEY_RE, "use a Secret key of letters, digits, '-', '_' and '.'", 253, slurm=False
)]

#: Slurm node sets and features of lent nodes start with this. Node set names
#: are DNS labels (no '_'), so no node set can take a lent node set's name.
LENT_PREFIX = "lent_"


def lent_nodeset(partition: str) -> str:
    """The node set, and the Slurm feature, of the nodes lent to ``partition``.

    A lent node's slurmd registers with this feature and so joins the
    partition, whose Nodes list names this node set.
    """
    return f"{LENT_PREFIX}{partition}"




#: Where the project publishes its images: the only repository whose images
#: may run privileged (slurmd with slurmConfig.cgroups).
PROJECT_REPOSITORY = "ghcr.io/slurmk8s"


class ImageSpec(ApiModel):
    repository: ImageRepository = PROJECT_REPOSITORY
    """Registry and path the component images are pulled from; each component
    appends its own name (`<repository>/slurmd:<tag>`). With
    slurmConfig.cgroups the slurmd pods are privileged, and the repository
    must then be one the operator trusts (ghcr.io/slurmk8s unless the site
    says otherwise)."""
    tag: ImageTag | None = None
    """Image tag; defaults to the Slurm version."""
    pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    """Kubernetes imagePullPolicy of every Slurm container."""


class SlurmSpec(ApiModel):
    version: SlurmVersion = versions.DEFAULT
    """Slurm release the images run (YY.MM): one of the releases slurmk8s
    supports. Settings that differ between releases are written the way this
    release expects."""
    image: ImageSpec = ImageSpec()
    """Where the slurmctld, slurmd, login and slurmrestd images come from."""


class ResourceList(ApiModel):
    cpu: Quantity | None = None
    """CPU, e.g. 500m or 2."""
    memory: Quantity | None = None
    """Memory, e.g. 512Mi or 4Gi."""


class Resources(ApiModel):
    requests: ResourceList = ResourceList()
    """Resources the scheduler reserves for the container. One not given is
    the component's default, or the limit where that is smaller."""
    limits: ResourceList = ResourceList()
    """Upper bounds enforced on the container. One not given is the
    component's default, or the request where that is larger: every
    container has both, so a namespace's quota on limits admits it and a
    LimitRange's defaults do not apply."""

    def filled(self, default: Resources) -> Resources:
        """These, with what they leave out taken from ``default``: a request
        kept at or under the limit given, a limit at or over the request."""
        requests, limits = {}, {}
        for key in ("cpu", "memory"):
            req, lim = getattr(self.requests, key), getattr(self.limits, key)
            if lim is None:
                lim = getattr(default.limits, key)
                if req is not None and lim is not None and quantity_value(req) > quantity_value(lim):
                    lim = req
            if req is None:
                req = getattr(default.requests, key)
                if req is not None and lim is not None and quantity_value(req) > quantity_value(lim):
                    req = lim
            requests[key], limits[key] = req, lim
        return Resources(requests=ResourceList(**requests), limits=ResourceList(**limits))


def _resources(cpu: str, memory: str, cpu_limit: str, memory_limit: str) -> Resources:
    return Resources(requests=ResourceList(cpu=cpu, memory=memory),
                     limits=ResourceList(cpu=cpu_limit, memory=memory_limit))


#: Each component's defaults: where a spec leaves a request or limit out, these hold.
CONTROLLER_RESOURCES = _resources("500m", "1Gi", "2", "4Gi")
LOGIN_RESOURCES = _resources("250m", "512Mi", "2", "4Gi")
RESTAPI_RESOURCES = _resources("100m", "128Mi", "1", "512Mi")
MARIADB_RESOURCES = _resources("250m", "512Mi", "2", "4Gi")
SLURMDBD_RESOURCES = _resources("100m", "256Mi", "1", "1Gi")


class VolumeSpec(ApiModel):
    storage_class_name: DnsSubdomain | None = None
    """StorageClass of the claim; the cluster default when unset."""
    size: Quantity = "10Gi"
    """Requested capacity."""


class ControllerSpec(ApiModel):
    resources: Resources = CONTROLLER_RESOURCES
    """Resources of the slurmctld container."""
    state_volume: VolumeSpec = VolumeSpec()
    """Persistent volume for slurmctld's StateSaveLocation: queued and running
    jobs survive a controller restart because of it."""


class GpuSpec(ApiModel):
    type: SlurmName = "gpu"
    """GRES type name Slurm users ask for, e.g. h100 in `--gpus=h100:2`."""
    count: int = Field(1, ge=1, le=64)
    """GPUs per node; requested from Kubernetes as nvidia.com/gpu."""


Signal = Literal["USR1", "USR2", "TERM", "INT", "HUP", "CONT"]


class DrainSpec(ApiModel):
    """How the operator empties a node before its pod goes away (scale-in, image update, a deleted pod)."""

    grace_period: int = Field(300, ge=0, le=604800)
    """Seconds the jobs on a drained node get to finish (counted from the
    signal when one is set, else from the drain). Then they are requeued,
    eligible to start again at once (jobs submitted with --no-requeue are
    cancelled), and the pod is removed. A job that requeues itself on the
    signal starts again at once too. A worker pod deleted outside scale-in
    (a node drain, an eviction) is emptied the same way."""
    signal: Signal | None = None
    """Signal sent to the batch shell of each job on the node when the grace
    period starts, for jobs that checkpoint on it (`trap ... USR1`). A batch
    script that does not trap it ends, so none is sent unless you set one."""


#: Memory slurmd, munged and slurmstepd use beside what Slurm hands to jobs:
#: a worker's default memory limit is its memory plus this.
SLURMD_MEMORY_OVERHEAD = 512 * 2**20
#: /dev/shm of slurmd pods, unless set: enough for NCCL and data loaders of a
#: few GPUs. A tmpfs counts against the pod's memory limit.
DEFAULT_SHM_SIZE = "1Gi"


def _mebibytes(n: int) -> str:
    return f"{n // 2**20}Mi" if n % 2**20 == 0 else str(n)


class NodeSet(ApiModel):
    """A group of identical slurmd pods; each pod is one Slurm dynamic node."""

    name: MemberName
    """Name of the node set: lower-case letters and digits, starting with a
    letter, not a reserved word. Its pods and Slurm nodes are called
    `<cluster>-<name>-<ordinal>`, and its nodes carry the Slurm feature `<name>`."""
    replicas: int = Field(1, ge=0, le=1024)
    """Number of slurmd pods (Slurm nodes)."""
    cpus: int = Field(1, ge=1, le=4096)
    """CPUs each node offers to Slurm; also the pod's CPU request."""
    memory: Quantity = "1Gi"
    """Memory each node offers to Slurm (RealMemory, at least 1Mi); also the pod's memory request."""
    memory_limit: Quantity | None = None
    """Memory limit of each slurmd pod, jobs included: a job cannot take more
    of the Kubernetes node than this. At least memory; default memory +
    512Mi (slurmd, munged and slurmstepd)."""
    shm_size: Quantity = DEFAULT_SHM_SIZE
    """Size limit of /dev/shm (a memory-backed emptyDir) in each slurmd pod;
    what jobs write there counts against memoryLimit, so at most that."""
    gpus: GpuSpec | None = None
    """GPUs per node, as Slurm GRES `gpu:<type>:<count>`."""
    features: list[SlurmName] = Field(default_factory=list, max_length=32)
    """Extra Slurm features for `--constraint`; not a node set's name (each
    node has its own node set's already) and not starting with `lent_`."""
    node_selector: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=32)
    """Kubernetes node labels the pods must land on."""
    tolerations: list[Toleration] = Field(default_factory=list, max_length=32)
    """Taints the pods tolerate, e.g. the GPU nodes' taint."""
    drain: DrainSpec = DrainSpec()
    """How a node is emptied before the operator removes its pod: on scale-in
    (the highest ordinals go first) and when an image update restarts it."""
    pod_template: PodTemplate | None = None
    """How the site shapes this node set's pods: runtime class, labels and
    annotations, priority class, affinity, tolerations, extra volumes and
    mounts, extra resources (RDMA devices, huge pages), capabilities for
    RDMA, DNS. A change restarts the workers, one drained pod at a time."""

    def pod_memory_limit(self) -> str:
        """memoryLimit, or memory + SLURMD_MEMORY_OVERHEAD."""
        if self.memory_limit is not None:
            return self.memory_limit
        return _mebibytes(int(quantity_value(self.memory)) + SLURMD_MEMORY_OVERHEAD)


class Preemption(ApiModel):
    mode: Literal["off", "requeue", "cancel"] = "off"
    """What happens to this partition's jobs when a job from a partition with a
    higher priority needs their nodes: nothing (off), requeue, or cancel."""
    grace_time: int = Field(0, ge=0, le=86400)
    """Seconds a preempted job gets after its signal (its --signal, else SIGTERM)
    before it is requeued or cancelled: the time to write a checkpoint."""


class Partition(ApiModel):
    """A Slurm partition (queue) made of node sets."""

    name: PartitionName
    """Partition name users pass to `--partition` (not `default`, Slurm's keyword)."""
    node_sets: list[DnsLabel] = Field(default_factory=list, max_length=64)
    """Node sets whose nodes belong to this partition."""
    default: bool = False
    """Jobs without `--partition` go here. At most one partition is the default."""
    max_time: SlurmDuration = "UNLIMITED"
    """Longest time limit a job may have, in Slurm's time format."""
    priority: int = Field(1, ge=0, le=65533)
    """PriorityTier: jobs in higher tiers are scheduled first and may preempt
    jobs of lower tiers whose preemption mode is not off."""
    preemption: Preemption = Preemption()
    """How this partition's jobs are preempted."""
    accept_lent_nodes: bool = False
    """Accept idle Kubernetes GPU nodes that a NodeLendingPolicy lends to this
    partition. slurm.conf then gets a node set `lent_<partition>` (Slurm
    feature `lent_<partition>`) in the partition's nodes, so a lent node joins
    by registering with that feature: no config change per node. Jobs on lent
    nodes get the policy's signal, then are requeued, when Kubernetes takes
    the node back."""


class SecretKeyRef(ApiModel):
    name: DnsSubdomain
    """Secret in the SlurmCluster's namespace, labelled
    `slurmk8s.dev/secret-use: ssh-keys` by its owner (the operator mounts no
    other, and none that slurmk8s generates); an Opaque Secret."""
    key: SecretKey
    """Key whose value is an authorized_keys text (one public key per line)."""


class LoginUser(ApiModel):
    """A researcher who logs in over SSH; exists with the same uid in every Slurm pod."""

    name: PosixUser
    """User name, the same in every Slurm pod."""
    uid: int = Field(ge=PERSON_ID_MIN, le=PERSON_ID_LOW_MAX)
    """Numeric user id, the same in every pod: files on shared storage belong to it.
    Ids above 60000 are the images' own accounts (SlurmUser, nobody). With a
    directory (spec.identity.ldap) it lies outside the directory's minId-maxId."""
    gid: int | None = Field(None, ge=PERSON_ID_MIN, le=PERSON_ID_LOW_MAX)
    """Primary group id; defaults to the uid (a group named like the user)."""
    ssh_public_keys: list[SshPublicKey] = Field(default_factory=list, max_length=32)
    """OpenSSH public keys allowed to log in as this user."""
    ssh_public_keys_from: SecretKeyRef | None = None
    """More public keys, read from a Secret key. The Secret must carry the
    label `slurmk8s.dev/secret-use: ssh-keys`; the login pods mount it
    readable by root only, which copies the keys into the user's
    ~/.ssh/authorized_keys."""


#: Kubernetes' limit on one object's annotations, keys and values together (TotalAnnotationSizeLimitB).
ANNOTATIONS_MAX_BYTES = 256 * 1024


def _service_annotations(value: dict[str, str]) -> dict[str, str]:
    for key in value:
        prefix = key.rpartition("/")[0].lower()
        if prefix == GROUP or prefix.endswith("." + GROUP):
            raise refuse(key, f"is under {GROUP}/, where the operator writes its own annotations; use another prefix")
    size = sum(len(k.encode()) + len(v.encode()) for k, v in value.items())
    if size > ANNOTATIONS_MAX_BYTES:
        raise ValueError(f"keys and values take {size} bytes; Kubernetes allows at most {ANNOTATIONS_MAX_BYTES} "
                         "(256 KiB) in one object's annotations")
    return value


class LoginService(ApiModel):
    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = "ClusterIP"
    """How the login Service is exposed."""
    port: int = Field(22, ge=1, le=65535)
    """Service port for SSH."""
    annotations: Annotated[dict[AnnotationKey, AnnotationValue], AfterValidator(_service_annotations)] = Field(
        default_factory=dict, max_length=64)
    """Annotations on the login Service, for the cloud's load balancer
    controller. Most are read only when the load balancer is created: set
    them together with the type. An internal load balancer is, on AWS,
    `service.beta.kubernetes.io/aws-load-balancer-scheme: internal`; on GKE,
    `networking.gke.io/load-balancer-type: Internal`; on AKS,
    `service.beta.kubernetes.io/azure-load-balancer-internal: "true"`. Keys
    are checked as Kubernetes checks them, none under slurmk8s.dev/ (the
    operator's own); values are one line of printable text; keys and values
    together take at most 256 KiB."""
    load_balancer_source_ranges: list[Cidr] = Field(default_factory=list, max_length=32)
    """With type LoadBalancer only: the address blocks (CIDR) the cloud's
    load balancer admits, where the provider supports it; empty: any
    address. spec.network.sshFrom is checked again at the login pods."""
    external_traffic_policy: Literal["Cluster", "Local"] | None = None
    """With type NodePort or LoadBalancer only. Local: connections go only
    to nodes that run a login pod, with the client's address kept. Cluster:
    any node takes them and passes them on with its own address in place of
    the client's. Unset: Local when spec.network.sshFrom is enforced
    (spec.network.policies on and address blocks listed), so that the
    login pods' NetworkPolicy sees the clients' addresses; otherwise
    Kubernetes' default, Cluster. Cluster together with an enforced
    sshFrom is refused: the policy would see node addresses, not clients."""


class LoginSpec(ApiModel):
    replicas: int = Field(1, ge=0, le=16)
    """Number of login pods behind the login Service."""
    users: list[LoginUser] = Field(default_factory=list, max_length=1000, json_schema_extra=list_map())
    """Researchers who may log in over SSH and submit jobs (at most 1000, and
    their inline keys must fit the users ConfigMap; more keys go in
    sshPublicKeysFrom)."""
    service: LoginService = LoginService()
    """The SSH Service."""
    resources: Resources = LOGIN_RESOURCES
    """Resources of the login container."""


class RestApiSpec(ApiModel):
    enabled: bool = False
    """Run slurmrestd (JWT authentication) behind a Service."""
    replicas: int = Field(1, ge=1, le=8)
    """Number of slurmrestd pods."""
    resources: Resources = RESTAPI_RESOURCES
    """Resources of the slurmrestd container."""


class MetricsSpec(ApiModel):
    enabled: bool = True
    """Serve Slurm's own metrics for Prometheus: nodes, GPUs, jobs, pending
    reasons, queue wait, the scheduler and slurmdbd, from the Slurm agent
    beside slurmctld (port 6831, GET /metrics, no token; docs/metrics.md).
    Slurm is read once per interval, however often it is scraped."""
    interval_seconds: int = Field(15, ge=5, le=600)
    """Seconds between two readings of Slurm for the metrics."""
    scrape_from: list[NamespaceName] = Field(default_factory=list, max_length=16)
    """Namespaces whose pods may scrape the Slurm metrics, when
    spec.network.policies renders NetworkPolicies; empty: only pods of the
    cluster's own namespace (name the monitoring namespace here)."""


class NetworkSpec(ApiModel):
    policies: bool = True
    """Render NetworkPolicies that admit into the cluster's pods only its own
    traffic (slurmctld, slurmd, srun's callbacks, slurmdbd, MariaDB, the
    agent from the operator and the bridge) and SSH and slurmrestd from where
    they are served, so that the cluster works in a namespace whose
    default-deny policy cuts everything else, and no other pod reaches
    slurmd, the agent or MariaDB. A job's own server (a notebook, a
    dashboard) is then reached only from the cluster's pods, unless a policy
    of the site's admits more."""
    egress: bool = False
    """Also render egress rules: the cluster's own traffic and DNS, for a
    namespace with a default-deny egress policy. On, the cluster's pods are
    egress-isolated: jobs reach nothing outside the cluster (storage, the
    internet) unless another NetworkPolicy allows it."""
    ssh_from: list[Cidr] = Field(default_factory=list, max_length=32)
    """Address blocks (CIDR) that may reach the login pods' SSH port; empty:
    any address. Enforced by the login pods' NetworkPolicy (policies on),
    which sees the clients' addresses only if they are kept on the way in:
    with a NodePort or LoadBalancer login Service, its
    externalTrafficPolicy is then Local."""

    def limits_ssh(self) -> bool:
        """Whether a NetworkPolicy admits SSH only from :attr:`ssh_from`."""
        return self.policies and bool(self.ssh_from)


#: The checks slurmk8s's HealthCheckProgram runs (images/slurmd/healthcheck.sh).
HealthCheckName = Literal["gpus", "munge", "sharedStorage"]
#: HealthCheckNodeState's words: on nodes in which states the check runs.
HealthNodeState = Literal["ANY", "ALLOC", "MIXED", "IDLE", "CYCLE"]
_DEFAULT_NODE_STATES: tuple[HealthNodeState, ...] = ("ANY",)
_DEFAULT_CHECKS: tuple[HealthCheckName, ...] = ("gpus", "munge", "sharedStorage")


def _distinct(values: list) -> list:
    seen = [v for i, v in enumerate(values) if v in values[:i]]
    if seen:
        raise ValueError(f"{seen[0]!r} is listed twice; list each once")
    return values


class HealthCheckSpec(ApiModel):
    """Slurm's HealthCheckProgram on every slurmd (the cluster's workers and
    lent nodes): a node that fails a check is drained with the reason
    `slurmk8s: health: <check>`, and takes jobs again once it passes. A drain
    someone else set is never touched."""

    enabled: bool = True
    """Run the checks (HealthCheckProgram)."""
    interval_seconds: int = Field(120, ge=10, le=86400)
    """Seconds between two runs on each node (HealthCheckInterval); slurmd
    also runs it when it starts."""
    node_states: Annotated[list[HealthNodeState], AfterValidator(_distinct)] = Field(
        default_factory=lambda: list(_DEFAULT_NODE_STATES), min_length=1, max_length=5)
    """On nodes in which states the checks run (HealthCheckNodeState): ANY,
    or some of ALLOC, MIXED, IDLE; CYCLE spreads the runs over the interval
    instead of running them on every node at once."""
    checks: Annotated[list[HealthCheckName], AfterValidator(_distinct)] = Field(
        default_factory=lambda: list(_DEFAULT_CHECKS), max_length=3)
    """gpus: the node has the GPU devices its gres says, and where the slurmd
    image has nvidia-smi, the driver answers for each with no uncorrectable
    ECC error, retired page or row remapping pending; munge: a credential
    made on the node decodes; sharedStorage: every shared volume is mounted,
    and read-write (its mount options; nothing is written, so root-squashed
    NFS passes)."""
    min_free_disk: Quantity | None = None
    """Fail when the file system of slurmd's spool directory (the pod's
    local disk, where /tmp is too) has less free space than this, counting
    what the running jobs' users hold in /tmp and /var/tmp as free: a job
    filling its scratch never fails the node."""
    min_available_memory: Quantity | None = None
    """Fail when the pod's memory limit leaves less than this after
    everything but the jobs (the anonymous memory of processes that are not
    a job user's): a job using its own memory never fails the node."""
    site_checks: DnsSubdomain | None = None
    """A ConfigMap in the cluster's namespace whose every key is a check
    script of the site's, labelled slurmk8s.dev/configmap-use=health-checks
    by its owner (the operator refuses the round otherwise, naming it). Each
    runs as nobody, in key order, with 10 seconds to
    exit 0; every process it leaves is killed; the key names the check in the
    drain reason."""


class SharedVolume(ApiModel):
    """A ReadWriteMany volume mounted at the same path in every Slurm pod."""

    name: MemberName
    """Volume name (lower-case letters and digits, starting with a letter);
    a created claim is called `<cluster>-<name>`."""
    mount_path: AbsPath
    """Where the volume appears, the same path in every Slurm pod and in the
    Kubernetes workloads that mount the claim."""
    existing_claim: DnsSubdomain | None = None
    """Use this ReadWriteMany PersistentVolumeClaim; set this or size."""
    storage_class_name: DnsSubdomain | None = None
    """StorageClass of a claim the operator creates (ReadWriteMany)."""
    size: Quantity | None = None
    """Capacity of a claim the operator creates; set this or existingClaim."""
    read_only: bool = False
    """Mount read-only in the Slurm pods."""


class SharedStorage(ApiModel):
    volumes: list[SharedVolume] = Field(min_length=1, max_length=16, json_schema_extra=list_map())
    """ReadWriteMany volumes mounted in every Slurm pod."""
    checkpoint_dir: AbsPath | None = None
    """Directory for job checkpoints, inside one of the volumes."""


DebugLevel = Literal["quiet", "fatal", "error", "info", "verbose", "debug", "debug2", "debug3"]


class SlurmConfig(ApiModel):
    max_node_count: int = Field(1024, ge=1, le=65533)
    """Most dynamic nodes slurmctld accepts (MaxNodeCount)."""
    select_type_parameters: Literal["CR_Core", "CR_Core_Memory", "CR_CPU", "CR_CPU_Memory"] = "CR_Core"
    """What select/cons_tres treats as consumable. The *_Memory forms need
    defMemPerCPU, or each job takes a whole node's memory."""
    def_mem_per_cpu: int | None = Field(None, ge=1, le=MAX_EXACT_INTEGER, alias="defMemPerCPU")
    """MiB per allocated CPU for jobs that give no --mem (DefMemPerCPU; Slurm
    keeps it in 63 bits of a uint64, the top bit marking per-CPU)."""
    kill_wait: int = Field(30, ge=0, le=65533)
    """Seconds between SIGTERM and SIGKILL when a job's time runs out (KillWait).
    Worker pods get their node set's drain.gracePeriod + killWait + 60
    seconds to terminate. A change is applied by
    `scontrol reconfigure`; running workers keep their termination grace
    period until they restart for another reason (it alone restarts no pod)."""
    credential_lifetime: int = Field(120, ge=10, le=86400)
    """Seconds a job credential stays valid (AuthInfo cred_expire). Slurm also
    holds a requeued job back this long plus one second before it may start
    again, which is when a self-requeueing checkpoint job resumes."""
    return_to_service: int = Field(2, ge=0, le=2)
    """ReturnToService: 2 lets a node that re-registers healthy become available again."""
    scheduler_parameters: list[SlurmWord] = Field(default_factory=list, max_length=64)
    """SchedulerParameters items, e.g. bf_continue or bf_max_job_test=500."""
    slurmctld_debug: DebugLevel = "info"
    """SlurmctldDebug log level."""
    slurmd_debug: DebugLevel = "info"
    """SlurmdDebug log level."""
    srun_port_range: PortRange = "60001-63000"
    """The ports srun (and salloc) listen on for slurmctld and the job's
    slurmstepds to call back (SrunPortRange): the rendered NetworkPolicies
    open exactly these on login and worker pods."""
    cgroups: bool = False
    """Track and confine jobs with cgroups (proctrack/cgroup, task/cgroup).
    slurmd creates a cgroup per job, so its pods run privileged (root on
    their Kubernetes node): the images must then come from ghcr.io/slurmk8s,
    and no partition may accept lent nodes (their slurmd runs unprivileged
    on other teams' nodes). Off, jobs are tracked by process tree and no
    pod is privileged."""
    extra_lines: list[ExtraLine] = Field(default_factory=list, max_length=256)
    """Extra `Key=Value` lines appended to slurm.conf. Only scheduling, limit
    and timing keys may be set this way (the allowlist in
    docs/decisions/0012-extra-lines-allowlist.md); keys that name programs,
    plugins or files, and keys the operator sets itself, are refused; so are
    comments, whitespace, control characters and a trailing backslash."""


class Topology(ApiModel):
    label_keys: list[LabelKey] = Field(min_length=1, max_length=4)
    """Node label keys naming the switch of each network tier, from the top
    tier down to the leaf switch the node is attached to. topology.conf
    (topology/tree) is built from the labels of the nodes the pods run on."""


# --- Accounting (slurmdbd) -------------------------------------------------------------------

#: Words sacctmgr reads as keywords wherever a name stands alone on its
#: command line (`add account set` adds nothing and skips the word after it):
#: an account, QOS or login user may not be called so.
SACCTMGR_KEYWORDS = frozenset({"where", "set"})
def _account_name(value: str) -> str:
    if value in SACCTMGR_KEYWORDS:
        raise refuse(value, f"is a sacctmgr keyword ({', '.join(sorted(SACCTMGR_KEYWORDS))}); choose another name")
    return value


#: A Slurm account or QOS name as sacctmgr stores it (it lower-cases names), not one of its keywords.
AccountName = Annotated[str, constrained(
    SACCTMGR_NAME_RE,
    "use lower-case letters, digits, '_' and '-', starting with a letter or digit (sacctmgr lower-cases names)",
    64,
), AfterValidator(_account_name)]
DatabaseName = Annotated[str, constrained(r"[A-Za-z0-9_]{1,64}", "use letters, digits and '_'", 64, slurm=False)]
DatabaseUser = Annotated[str, constrained(r"[A-Za-z0-9_]{1,32}", "use letters, digits and '_'", 32, slurm=False)]

#: AccountingStorageEnforce options, as Slurm names them.
EnforceOption = Literal["associations", "limits", "qos", "safe", "wckeys", "nojobs", "nosteps"]
_DEFAULT_ENFORCE: tuple[EnforceOption, ...] = ("associations", "limits", "qos")


class PasswordRef(ApiModel):
    name: DnsSubdomain
    """Secret in the SlurmCluster's namespace, labelled
    `slurmk8s.dev/secret-use: database-password` by its owner (the operator
    sends no other, and none that slurmk8s generates); an Opaque Secret."""
    key: SecretKey
    """Key whose value is the database user's password (one line)."""


class ManagedDatabase(ApiModel):
    """MariaDB run by the operator: a one-pod StatefulSet from the project's
    mariadb image (Debian's mariadb-server), its data on a claim, its
    password generated once into a Secret. No backups, no replicas, no
    major-version upgrades of the data: see README.md, Accounting."""

    volume: VolumeSpec = VolumeSpec()
    """The claim holding the database files (ReadWriteOnce). Deleting the
    SlurmCluster keeps it unless spec.deletionPolicy is Delete."""
    resources: Resources = MARIADB_RESOURCES
    """Resources of the mariadb container. InnoDB's buffer pool is half its memory
    limit (its request without one): slurmdbd of 24.11 and later wants at least
    2 GiB, 22.05 at least 512 MiB."""


#: Where slurmdbd sends the database password: a DNS name or a plain IPv4 address (see fields.credential_host).
DatabaseHost = Annotated[DnsSubdomain, AfterValidator(credential_host)]


class ExternalDatabase(ApiModel):
    """A MariaDB or MySQL the site runs (mariadb-operator, a cloud database)."""

    host: DatabaseHost
    """Host name or IPv4 address (a.b.c.d) slurmdbd connects to; not loopback,
    link-local (169.254.0.0/16, cloud metadata), multicast or reserved."""
    port: int = Field(3306, ge=1, le=65535)
    """Its port."""
    database: DatabaseName = "slurm_acct_db"
    """Database slurmdbd keeps its tables in (it creates them)."""
    user: DatabaseUser = "slurm"
    """Database user; it needs all privileges on that database."""
    password_secret: PasswordRef
    """Secret key holding that user's password."""
    egress_cidrs: list[Cidr] = Field(default_factory=list, max_length=16)
    """Address blocks (CIDR) the database is in. With spec.network.egress,
    slurmdbd may reach the database's port at these addresses and at the
    host's own when it is an IPv4 address, and nowhere else; required then
    when host is a name (a NetworkPolicy admits addresses, not names)."""


class AccountingDatabase(ApiModel):
    """Where slurmdbd keeps the records: set one of managed or external."""

    managed: ManagedDatabase | None = None
    """The operator runs MariaDB (the default when external is unset)."""
    external: ExternalDatabase | None = None
    """An existing MariaDB or MySQL."""


class SlurmdbdSpec(ApiModel):
    image: ImageSpec | None = None
    """Where the slurmdbd (and managed mariadb) images come from; spec.slurm.image when unset."""
    resources: Resources = SLURMDBD_RESOURCES
    """Resources of the slurmdbd container."""


class Account(ApiModel):
    """A Slurm account, the login users whose default account it is, and the
    directory groups whose members it holds."""

    name: AccountName
    """Account name (`sbatch --account`)."""
    users: list[PosixUser] = Field(default_factory=list, max_length=1000)
    """Login users (spec.login.users) in this account; the first account that
    lists a user is the user's default account."""
    groups: list[PosixGroup] = Field(default_factory=list, max_length=64)
    """Groups of the directory (spec.identity.ldap) whose members this account holds:
    a member gets an association here within cacheSeconds and a round of the
    operator, and one who leaves every group of the account can submit no new
    job to it (MaxSubmitJobs=0; the association, and so the history, stays). The
    first such account of a user's is the user's default. An account with groups
    is the directory's: an association in it of someone in none of its groups and
    not listed in users is closed the same way."""


class Qos(ApiModel):
    """A Slurm QOS (`sbatch --qos`); limits are enforced with enforce: [qos, limits]."""

    name: AccountName
    """QOS name."""
    priority: int = Field(0, ge=0, le=65533)
    """Priority of its jobs (counts with fairShare.weightQos)."""
    max_wall: SlurmDuration | None = None
    """Longest time limit of a job in this QOS (MaxWall)."""
    max_jobs_per_user: int | None = Field(None, ge=0, le=1000000)
    """Running jobs per user (MaxJobsPerUser)."""
    max_submit_jobs_per_user: int | None = Field(None, ge=0, le=1000000)
    """Queued and running jobs per user (MaxSubmitJobsPerUser)."""


class FairShare(ApiModel):
    """priority/multifactor: a job's priority from its owner's fair share and more."""

    weight_fairshare: int = Field(10000, ge=0, le=1000000)
    """PriorityWeightFairshare."""
    weight_age: int = Field(1000, ge=0, le=1000000)
    """PriorityWeightAge: how much time in the queue counts."""
    weight_job_size: int = Field(0, ge=0, le=1000000)
    """PriorityWeightJobSize."""
    weight_partition: int = Field(0, ge=0, le=1000000)
    """PriorityWeightPartition."""
    weight_qos: int = Field(0, ge=0, le=1000000)
    """PriorityWeightQOS."""
    decay_half_life: SlurmDuration = "7-0"
    """PriorityDecayHalfLife: how fast past usage is forgotten."""


class AccountingSpec(ApiModel):
    """Job accounting: slurmdbd and its database; `sacct`, `sreport`, associations, QOS, fair share."""

    enabled: bool = False
    """Run slurmdbd and record every job. Off: `sacct` answers that accounting is disabled."""
    database: AccountingDatabase = AccountingDatabase()
    """Where the records are kept: managed (default) or external."""
    slurmdbd: SlurmdbdSpec = SlurmdbdSpec()
    """The slurmdbd Deployment."""
    enforce: list[EnforceOption] = Field(default_factory=lambda: list(_DEFAULT_ENFORCE),
                                         max_length=7)
    """AccountingStorageEnforce. With associations only users with an
    association may submit: the operator gives every login user one."""
    accounts: list[Account] = Field(default_factory=list, max_length=1000, json_schema_extra=list_map())
    """Accounts; a login user listed in none gets an account named after the user."""
    qos: list[Qos] = Field(default_factory=list, max_length=100, json_schema_extra=list_map())
    """QOS definitions, open to every login user."""
    fair_share: FairShare | None = None
    """Schedule by priority/multifactor with these weights; unset, priority/basic (first in, first out)."""


class SlurmClusterSpec(ApiModel):
    slurm: SlurmSpec = SlurmSpec()
    """Slurm release and images."""
    controller: ControllerSpec = ControllerSpec()
    """The slurmctld StatefulSet."""
    node_sets: list[NodeSet] = Field(default_factory=list, max_length=64, json_schema_extra=list_map())
    """Groups of identical slurmd pods that join as Slurm dynamic nodes (at most 64)."""
    partitions: list[Partition] = Field(default_factory=list, max_length=64, json_schema_extra=list_map())
    """Slurm partitions (queues)."""
    login: LoginSpec = LoginSpec()
    """SSH login pods where researchers run sbatch, srun and squeue."""
    rest_api: RestApiSpec = RestApiSpec()
    """Optional slurmrestd."""
    shared_storage: SharedStorage | None = None
    """Shared ReadWriteMany storage and the checkpoint directory."""
    slurm_config: SlurmConfig = SlurmConfig()
    """slurm.conf settings."""
    topology: Topology | None = None
    """Network topology (topology/tree) from node labels."""
    accounting: AccountingSpec = AccountingSpec()
    """Job accounting with slurmdbd (off by default)."""
    identity: IdentitySpec = IdentitySpec()
    """Where researchers come from besides login.users: an LDAP directory, through SSSD."""
    network: NetworkSpec = NetworkSpec()
    """The NetworkPolicies rendered for the cluster's traffic."""
    health_check: HealthCheckSpec = HealthCheckSpec()
    """Node health checks that drain a failing node and undrain it once it passes."""
    metrics: MetricsSpec = MetricsSpec()
    """Slurm's metrics for Prometheus."""
    image_pull_secrets: list[DnsSubdomain] = Field(default_factory=list, max_length=16)
    """Secrets of type kubernetes.io/dockerconfigjson in the cluster's
    namespace that the kubelet pulls every image of the cluster with (the
    slurmd pods of lent nodes too): a registry that asks for credentials."""
    cluster_domain: DnsSubdomain = "cluster.local"
    """DNS domain of the Kubernetes cluster, for the controller's address."""
    deletion_policy: Literal["Retain", "Delete"] = "Retain"
    """What happens to the controller state, the accounting database's claim
    and the claims the operator created when the SlurmCluster is deleted:
    Retain keeps the data."""

    def login_traffic_policy(self) -> Literal["Cluster", "Local"] | None:
        """The login Service's externalTrafficPolicy: none for a ClusterIP
        Service (Kubernetes refuses one there), else the spec's, else Local
        where spec.network.sshFrom is enforced (the NetworkPolicy must see
        the clients' addresses), else none (Kubernetes' default, Cluster).
        The validator refuses the spec's Cluster where sshFrom is enforced."""
        service = self.login.service
        if service.type == "ClusterIP":
            return None
        if service.external_traffic_policy is not None:
            return service.external_traffic_policy
        return "Local" if self.network.limits_ssh() else None


class ObjectMeta(ApiModel):
    """The parts of Kubernetes object metadata that slurmk8s reads."""

    # The API server adds fields slurmk8s does not read (resourceVersion,
    # managedFields, ...): they are dropped, not kept, so nothing unchecked
    # travels on with the object.
    model_config = ApiModel.model_config | {"extra": "ignore"}
    name: ClusterName
    """Cluster name; also Slurm's ClusterName and the prefix of every object."""
    namespace: DnsLabel = "default"
    """Namespace of the cluster and all its objects."""
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict)
    """Labels copied to nothing; Kubernetes' own."""
    annotations: dict[LabelKey, str] = Field(default_factory=dict)
    """Annotations; Kubernetes' own (free text, rendered nowhere)."""
    uid: ObjectUid | None = None
    """Set by the API server; used for ownerReferences."""
    generation: int | None = None
    """Set by the API server."""


class SlurmCluster(ApiModel):
    """A Slurm cluster run as Kubernetes pods: slurmctld, slurmd node sets,
    login pods and optional slurmrestd."""

    api_version: Literal["slurmk8s.dev/v1alpha1"] = Field(API_VERSION, alias="apiVersion")
    kind: Literal["SlurmCluster"] = KIND
    metadata: ObjectMeta
    spec: SlurmClusterSpec = SlurmClusterSpec()
    status: SlurmClusterStatus | None = None

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def namespace(self) -> str:
        return self.metadata.namespace
