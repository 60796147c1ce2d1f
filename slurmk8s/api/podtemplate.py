"""The pod template a site shapes the slurmd pods with (``spec.nodeSets[].podTemplate`` of a
SlurmCluster, ``spec.podTemplate`` of a NodeLendingPolicy for the pods of the nodes it
lends): runtime class, labels and annotations, priority class, affinity and tolerations,
extra volumes and mounts, extra resources (RDMA devices, hugepages), the capabilities
NCCL over RDMA needs, DNS settings. Pure.

What a template may say is a list of fields (the model): nothing else reaches the pod.
What would break slurmk8s or widen what a pod may do on its node is refused with its
field path (:func:`pod_template_errors`, and :func:`unknown_field_reason` for the fields a
PodSpec has and a template does not): slurmk8s's own labels, annotations, taints, volume
names and mount paths, the slurmd container's command and image, privileges, host
namespaces and host paths, Secrets (readable by every job of the node). Decision record
48 says why each; ``slurmk8s.render.pods.with_site_template`` applies a template.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Annotated

from pydantic import AfterValidator, Field

from .base import GROUP, ApiModel, in_group, list_map
from .errors import FieldError
from .fields import (
    DATA_KEY_RE,
    DNS_LABEL_RE,
    DNS_SUBDOMAIN_RE,
    LABEL_NAME_RE,
    AbsPath,
    DnsSubdomain,
    IpAddress,
    LabelKey,
    LabelValue,
    Quantity,
    bad_char,
    constrained,
    pattern_check,
    quantity_value,
    quote,
    refuse,
    schema_pattern,
)
from .mounts import overlap, system_mount_problem
from .scheduling import Affinity, Toleration, affinity_errors, toleration_errors

__all__ = [
    "PodTemplate", "TemplateVolume", "VolumeMount", "DnsConfig", "CAPABILITIES", "RESERVED_VOLUMES",
    "SHARED_VOLUME_PREFIX", "PRODUCT_LABEL_DOMAINS", "PROFILE_ANNOTATION_DOMAINS", "pod_template_errors",
    "mount_conflicts", "unknown_field_reason",
]

#: The capabilities a template may add to the slurmd container: what RDMA (NCCL, UCX,
#: MPI over InfiniBand or RoCE) needs to pin memory. IPC_LOCK lets root's processes
#: lock memory past RLIMIT_MEMLOCK; SYS_RESOURCE lets slurmd and slurmstepd (root)
#: raise RLIMIT_MEMLOCK, which Slurm hands to a job (its users' processes keep no
#: capability). Neither reaches past the pod: no device, mount, network or other
#: process of the node.
CAPABILITIES = ("IPC_LOCK", "SYS_RESOURCE")

#: Every volume name slurmk8s gives a pod of its own (render/: slurmd, login, slurmctld,
#: slurmdbd, MariaDB, sssd), and the prefix of the shared storage's volumes
#: (``shared-<name>``). tests/test_pod_template.py holds the list to the renderer's.
RESERVED_VOLUMES = frozenset(
    "agent-token data db-password jwt-key ldap-bind ldap-ca munge-key prolog-slurmctld shm site-checks "
    "slurm-config slurmdbd-config ssh-host-keys sss-db sss-mc sss-pipes sssd-config state user-keys users".split()
)
SHARED_VOLUME_PREFIX = "shared-"

#: Label domains whose keys slurmk8s sets on its pods (its selectors, PodDisruptionBudgets
#: and the bridge find pods by them): a template's labels take none.
PRODUCT_LABEL_DOMAINS = (GROUP, "app.kubernetes.io")
#: Annotation domains that set a container's seccomp or AppArmor profile, which slurmk8s
#: chooses; and slurmk8s's own (in_group).
PROFILE_ANNOTATION_DOMAINS = (
    "container.apparmor.security.beta.kubernetes.io", "seccomp.security.alpha.kubernetes.io",
    "container.seccomp.security.alpha.kubernetes.io",
)

#: The claims slurmk8s makes for its StatefulSets: slurmctld's state and the managed
#: database (``state-<cluster>-controller-0``, ``data-<cluster>-mariadb-0``). Their
#: data is no job's to read or write.
PRODUCT_CLAIM_RE = r"(state-.+-controller|data-.+-mariadb)-[0-9]+"

ANNOTATION_VALUE_MAX = 4096


def _annotation_value(value: str) -> str:
    if bad := bad_char(value):
        raise refuse(value[:40] + ("..." if len(value) > 40 else ""), bad)
    if len(value) > ANNOTATION_VALUE_MAX:
        raise refuse(value[:40] + "...", f"is {len(value)} characters long; at most {ANNOTATION_VALUE_MAX} are allowed")
    return value


#: An annotation's value: free text on one line (JSON, such as Multus' network list, fits).
AnnotationValue = Annotated[str, AfterValidator(_annotation_value),
                            Field(json_schema_extra={"maxLength": ANNOTATION_VALUE_MAX})]

#: A volume's name in a pod (a DNS-1123 label).
VolumeName = Annotated[str, constrained(
    DNS_LABEL_RE, "use lower-case letters, digits and '-', starting and ending with a letter or digit", 63,
    slurm=False)]
DataKey = Annotated[str, constrained(DATA_KEY_RE, "use a ConfigMap key of letters, digits, '-', '_' and '.'", 253,
                                     slurm=False)]

RELATIVE_PATH_RE = r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*"


def _relative_path(value: str) -> str:
    pattern_check(RELATIVE_PATH_RE, "use a relative path of letters, digits, '.', '_', '-' and '/'", 253,
                  slurm=False)(value)
    if ".." in value.split("/") or "." in value.split("/"):
        raise refuse(value, "contains '.' or '..' components; the file stays inside its volume")
    return value


RelativePath = Annotated[str, AfterValidator(_relative_path), schema_pattern(f"^{RELATIVE_PATH_RE}$", 253)]


def _priority_class(value: str) -> str:
    if value.startswith("system-"):
        raise refuse(value, "is one of Kubernetes' own priority classes (system-...), which only pods of "
                     "kube-system may use; name one the site made")
    return value


PriorityClassName = Annotated[DnsSubdomain, AfterValidator(_priority_class)]


def _capability(value: str) -> str:
    if value not in CAPABILITIES:
        shown = value if len(value) <= 40 else value[:40] + "..."
        hint = f"; write it as {value.upper().removeprefix('CAP_')}" \
            if value.upper().removeprefix("CAP_") in CAPABILITIES else ""
        raise refuse(shown, f"is not a capability a pod template may add{hint}: only {', '.join(CAPABILITIES)}, "
                     "which RDMA needs to pin memory; none that reaches the node")
    return value


Capability = Annotated[str, AfterValidator(_capability), Field(json_schema_extra={"enum": list(CAPABILITIES)})]

HUGEPAGES_RE = r"hugepages-[0-9]+(Ki|Mi|Gi)"
EXTENDED_RESOURCE_RE = rf"{DNS_SUBDOMAIN_RE}/{LABEL_NAME_RE}"


def _resource_name(value: str) -> str:
    if bad := bad_char(value):
        raise refuse(value, bad)
    if value in ("cpu", "memory"):
        raise refuse(value, "is set by slurmk8s: a node set's cpus, memory and memoryLimit (a lent node's: what "
                     "it lends), which Slurm is told of too")
    if value == "nvidia.com/gpu":
        raise refuse(value, "is set by slurmk8s: a node set's gpus.count (a lent node's: its free GPUs), which "
                     "Slurm is told of too")
    if value in ("requests", "limits"):
        raise refuse(value, "is not a resource: give each as name: amount, e.g. rdma/hca: 1 (it is both "
                     "requested and limited)")
    if re.fullmatch(HUGEPAGES_RE, value):
        return value
    prefix, _, _ = value.partition("/")
    if not re.fullmatch(EXTENDED_RESOURCE_RE, value) or len(value) > 253:
        raise refuse(value, "is not a resource a pod template may add: an extended resource <domain>/<name> "
                     "(rdma/hca, a device plugin's) or hugepages-<size> (hugepages-2Mi, hugepages-1Gi)")
    if prefix == "kubernetes.io" or prefix.endswith(".kubernetes.io"):
        raise refuse(value, "is in Kubernetes' own domain, which names no extended resource")
    return value


#: A resource a template adds to the slurmd container: an extended resource or hugepages.
ResourceName = Annotated[str, AfterValidator(_resource_name),
                         schema_pattern(f"^({HUGEPAGES_RE}|{EXTENDED_RESOURCE_RE})$", 253)]

DNS_OPTION_NAME_RE = r"[a-z][a-z0-9-]{0,31}"
DNS_OPTION_VALUE_RE = r"[A-Za-z0-9._-]{1,32}"
#: Kubernetes' bound of a pod's search list: its characters, spaces between included.
DNS_SEARCH_MAX_CHARS = 2048


class DnsOption(ApiModel):
    """A resolver option (resolv.conf's options line)."""

    name: Annotated[str, constrained(DNS_OPTION_NAME_RE, "use a resolver option such as ndots or timeout", 32,
                                     slurm=False)]
    """Option name, e.g. ndots, timeout, attempts, single-request-reopen."""
    value: Annotated[str, constrained(DNS_OPTION_VALUE_RE, "use letters, digits, '.', '_' and '-'", 32,
                                      slurm=False)] | None = None
    """Its value, where it takes one (ndots: "2")."""


class DnsConfig(ApiModel):
    """Resolver settings added to those of the cluster's DNS (a PodSpec's dnsConfig; the
    pods keep dnsPolicy ClusterFirst, which finds slurmctld)."""

    nameservers: list[IpAddress] = Field(default_factory=list, max_length=3)
    """Name servers asked besides the cluster's (at most 3)."""
    searches: list[DnsSubdomain] = Field(default_factory=list, max_length=32)
    """Search domains added to the cluster's (at most 32)."""
    options: list[DnsOption] = Field(default_factory=list, max_length=16)
    """Resolver options; one named like the cluster's replaces it."""


class EmptyDirSource(ApiModel):
    """A directory that lives as long as the pod: on the node's disk, in memory, or of huge pages."""

    medium: Annotated[str, constrained(r"(Memory|HugePages(-[0-9]+(Ki|Mi|Gi))?)",
                                       "use Memory, HugePages or HugePages-<size> (HugePages-2Mi); leave it "
                                       "out for the node's disk", 16, slurm=False)] | None = None
    """Memory (a tmpfs: counts against the pod's memory limit), HugePages or
    HugePages-<size> (needs the matching hugepages resource); unset, the node's disk."""
    size_limit: Quantity | None = None
    """Most it may hold; required with medium Memory, whose tmpfs would otherwise
    take what the jobs' memory limit leaves."""


class KeyToPath(ApiModel):
    """One key of a ConfigMap, as a file."""

    key: DataKey
    """The key."""
    path: RelativePath
    """Its file, relative to the mount (no '..')."""


class ConfigMapSource(ApiModel):
    """A ConfigMap of the pod's namespace, as files."""

    name: DnsSubdomain
    """The ConfigMap."""
    items: list[KeyToPath] = Field(default_factory=list, max_length=64)
    """Keys to project, each to a file; every key when empty."""
    default_mode: int | None = Field(None, ge=0, le=0o777)
    """Mode of the files (decimal in JSON: 292 is 0444); 0644 when unset."""
    optional: bool = False
    """Start the pod when the ConfigMap does not exist."""


class PersistentVolumeClaimSource(ApiModel):
    """A PersistentVolumeClaim of the pod's namespace."""

    claim_name: DnsSubdomain
    """The claim; not one slurmk8s makes for slurmctld's state or the managed database."""
    read_only: bool = False
    """Mount it read-only."""


class TemplateVolume(ApiModel):
    """A volume of the pod: exactly one of emptyDir, configMap and persistentVolumeClaim.
    No hostPath (the node's own files), Secret or projected volume (readable by every
    job of the node), and no other source: a claim reaches any storage a StorageClass
    or PersistentVolume provides, local disks and NFS included."""

    name: VolumeName
    """Its name in the pod; none of slurmk8s's own (munge-key, slurm-config, shm,
    users, shared-..., and the others decision record 48 lists)."""
    empty_dir: EmptyDirSource | None = None
    """A directory of the pod's own."""
    config_map: ConfigMapSource | None = None
    """A ConfigMap's keys as files."""
    persistent_volume_claim: PersistentVolumeClaimSource | None = None
    """A claim."""


class VolumeMount(ApiModel):
    """Where the slurmd container mounts one of the template's volumes."""

    name: VolumeName
    """The volume, one of the template's volumes."""
    mount_path: AbsPath
    """Absolute path: not at, in or over a system directory (/etc, /run, /dev, /usr,
    /var/lib, ...: slurmk8s's own mounts are in them), and apart from the
    cluster's shared storage and the template's other mounts."""
    read_only: bool = False
    """Mount it read-only."""


class PodTemplate(ApiModel):
    """How a site shapes the slurmd pods: what its nodes need of a pod (a runtime
    class, RDMA devices, huge pages), where the pods run, and what its tools read
    (labels, annotations). Applied to the pod slurmk8s renders; what slurmk8s sets
    itself (the container, its command, image, cpu, memory, GPUs, security context
    and volumes) is not the template's, and a template that would change it is refused."""

    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=32)
    """Labels added to the pods; none of slurmk8s's (slurmk8s.dev/..., app.kubernetes.io/...)."""
    annotations: dict[LabelKey, AnnotationValue] = Field(default_factory=dict, max_length=32)
    """Annotations added to the pods, e.g. k8s.v1.cni.cncf.io/networks for Multus'
    RDMA networks; none of slurmk8s's (slurmk8s.dev/...), and none that sets a
    seccomp or AppArmor profile."""
    runtime_class_name: DnsSubdomain | None = None
    """RuntimeClass the pods run with, e.g. nvidia where the GPU Operator does not make
    the NVIDIA runtime containerd's default (RKE2, k3s, several runtimes): without it
    such nodes give a pod its GPUs but no device in its containers."""
    priority_class_name: PriorityClassName | None = None
    """PriorityClass of the pods (one the site made; not system-...)."""
    affinity: Affinity | None = None
    """Node and pod affinity of the pods (not of lent pods: a lent pod is bound to
    the node the policy lends)."""
    tolerations: list[Toleration] = Field(default_factory=list, max_length=32)
    """Taints the pods tolerate, added to those slurmk8s gives them (a node set's
    own tolerations, a lent pod's of the lending taint); none of slurmk8s's own."""
    volumes: list[TemplateVolume] = Field(default_factory=list, max_length=16, json_schema_extra=list_map())
    """Volumes added to the pods."""
    volume_mounts: list[VolumeMount] = Field(default_factory=list, max_length=16,
                                             json_schema_extra=list_map("mountPath"))
    """Where the slurmd container mounts them."""
    resources: dict[ResourceName, Quantity] = Field(default_factory=dict, max_length=16)
    """Extended resources (rdma/hca, a device plugin's) and huge pages (hugepages-2Mi)
    the slurmd container asks for, each requested and limited alike (Kubernetes
    overcommits neither): an amount above 0, a whole number for an extended
    resource. Not cpu, memory or nvidia.com/gpu, which slurmk8s sets."""
    capabilities: list[Capability] = Field(default_factory=list, max_length=8)
    """Capabilities added to the slurmd container: IPC_LOCK and SYS_RESOURCE (for RDMA's
    pinned memory), no other. A pod with them passes Pod Security privileged only."""
    dns_config: DnsConfig | None = None
    """Resolver settings added to the cluster DNS's."""


def _domain(key: str) -> str:
    return key.rpartition("/")[0]


def mount_conflicts(t: PodTemplate, path: str, taken: Sequence[tuple[str, str]]) -> Iterator[FieldError]:
    """Template mounts at, in or over a path of ``taken`` ((field path, mount path) of the
    other mounts the spec gives the container: the cluster's shared storage)."""
    for i, m in enumerate(t.volume_mounts):
        for where, other in taken:
            if overlap(m.mount_path, other):
                yield FieldError(f"{path}.volumeMounts[{i}].mountPath",
                                 f"{quote(m.mount_path)} {'is' if m.mount_path == other else 'nests with'} "
                                 f"{where} {quote(other)}; mount volumes side by side")
                break


def pod_template_errors(t: PodTemplate, path: str, *, lent: bool = False,
                        taken_mounts: Sequence[tuple[str, str]] = (),
                        memory_limit: str | None = None) -> Iterator[FieldError]:
    """What the model alone cannot refuse in a template at ``path``. ``lent``: the template
    of lent slurmd pods (a NodeLendingPolicy's); ``taken_mounts``: see
    :func:`mount_conflicts`; ``memory_limit``: the pod's (a node set's), which a
    memory-backed emptyDir counts against."""
    for key in t.labels:
        if in_group(key) or _domain(key) in PRODUCT_LABEL_DOMAINS:
            yield FieldError(f"{path}.labels.{key}", f"{quote(key)} is in a domain whose labels slurmk8s sets "
                             f"on its pods ({', '.join(PRODUCT_LABEL_DOMAINS)}): its selectors and the bridge "
                             "find pods by them. Use a label of the site's domain")
    for key in t.annotations:
        if in_group(key):
            yield FieldError(f"{path}.annotations.{key}", f"{quote(key)} is an annotation of slurmk8s's own "
                             f"({GROUP}/...), which records what it did and decides by; use the site's domain")
        elif _domain(key) in PROFILE_ANNOTATION_DOMAINS:
            yield FieldError(f"{path}.annotations.{key}", f"{quote(key)} sets a container's seccomp or AppArmor "
                             "profile, which slurmk8s chooses for its containers")
    if t.affinity is not None:
        if lent:
            yield FieldError(f"{path}.affinity", "a lent slurmd pod is bound to the node the policy lends "
                             "(spec.nodeName): the scheduler never reads its affinity, and the kubelet refuses "
                             "a pod whose required node affinity its node does not meet. Choose the nodes with "
                             "spec.nodeSelector")
        else:
            yield from affinity_errors(t.affinity, f"{path}.affinity")
    for i, tol in enumerate(t.tolerations):
        yield from toleration_errors(f"{path}.tolerations[{i}]", tol)
    yield from _volume_errors(t, path, memory_limit)
    yield from _mount_errors(t, path)
    yield from mount_conflicts(t, path, taken_mounts)
    for name, amount in t.resources.items():
        value = quantity_value(amount)
        if value <= 0:
            yield FieldError(f"{path}.resources.{name}", f"{quote(amount)} is not above 0; leave the resource out")
        elif "/" in name and value != value.to_integral_value():
            yield FieldError(f"{path}.resources.{name}",
                             f"{quote(amount)} is not a whole number; Kubernetes hands out extended resources whole")
    for i, cap in enumerate(t.capabilities):
        if cap in t.capabilities[:i]:
            yield FieldError(f"{path}.capabilities[{i}]", f"{quote(cap)} is listed twice")
    if t.dns_config is not None:
        searches = t.dns_config.searches
        chars = sum(len(s) for s in searches) + max(len(searches) - 1, 0)
        if chars > DNS_SEARCH_MAX_CHARS:
            yield FieldError(f"{path}.dnsConfig.searches", f"holds {chars} characters (spaces between them "
                             f"included); Kubernetes allows at most {DNS_SEARCH_MAX_CHARS}")
        names = [o.name for o in t.dns_config.options]
        for i, name in enumerate(names):
            if name in names[:i]:
                yield FieldError(f"{path}.dnsConfig.options[{i}].name", f"{quote(name)} is listed twice")


def _volume_errors(t: PodTemplate, path: str, memory_limit: str | None) -> Iterator[FieldError]:
    names = [v.name for v in t.volumes]
    for i, v in enumerate(t.volumes):
        where = f"{path}.volumes[{i}]"
        if v.name in RESERVED_VOLUMES or v.name.startswith(SHARED_VOLUME_PREFIX):
            yield FieldError(f"{where}.name", f"{quote(v.name)} is a name slurmk8s gives a volume of its own "
                             f"({', '.join(sorted(RESERVED_VOLUMES))}, {SHARED_VOLUME_PREFIX}...); choose another")
        elif v.name in names[:i]:
            yield FieldError(f"{where}.name", f"{quote(v.name)} is already the name of {path}.volumes"
                             f"[{names.index(v.name)}]; volume names must be unique")
        sources = [s for s in (v.empty_dir, v.config_map, v.persistent_volume_claim) if s is not None]
        if len(sources) != 1:
            yield FieldError(where, f"gives {len(sources)} sources; give exactly one of emptyDir, configMap and "
                             "persistentVolumeClaim")
        empty = v.empty_dir
        if empty is not None and empty.medium == "Memory":
            if empty.size_limit is None:
                yield FieldError(f"{where}.emptyDir.sizeLimit", "is required with medium Memory: the tmpfs counts "
                                 "against the pod's memory limit, and without a bound could take what the jobs "
                                 "were given")
            elif memory_limit is not None and quantity_value(empty.size_limit) > quantity_value(memory_limit):
                yield FieldError(f"{where}.emptyDir.sizeLimit", f"{quote(empty.size_limit)} is more than the pod's "
                                 f"memory limit ({memory_limit}), which the tmpfs counts against")
        claim = v.persistent_volume_claim
        if claim is not None and re.fullmatch(PRODUCT_CLAIM_RE, claim.claim_name):
            yield FieldError(f"{where}.persistentVolumeClaim.claimName",
                             f"{quote(claim.claim_name)} is named like a claim slurmk8s makes for slurmctld's "
                             "state or the accounting database, whose data is no job's; name another claim")


def _mount_errors(t: PodTemplate, path: str) -> Iterator[FieldError]:
    names = {v.name for v in t.volumes}
    mounts = t.volume_mounts
    for i, m in enumerate(mounts):
        where = f"{path}.volumeMounts[{i}]"
        if m.name not in names:
            yield FieldError(f"{where}.name", f"{quote(m.name)} is not a volume of the template; known: "
                             f"{', '.join(sorted(names)) or '(none)'}")
        why = system_mount_problem(m.mount_path)
        if why is not None:
            yield FieldError(f"{where}.mountPath", f"{quote(m.mount_path)} {why}; slurmk8s's own mounts are there. "
                             "Mount under another path such as /scratch")
            continue
        for j, other in enumerate(mounts[:i]):
            if overlap(m.mount_path, other.mount_path):
                yield FieldError(f"{where}.mountPath", f"{quote(m.mount_path)} "
                                 f"{'is' if m.mount_path == other.mount_path else 'nests with'} {path}."
                                 f"volumeMounts[{j}].mountPath {quote(other.mount_path)}; mount volumes side by side")
                break


#: Fields a PodSpec (or its container, or a volume) has and a pod template does not, and why.
_CONTAINER = ("slurmk8s runs slurmd in a container of its own, from the cluster's image with its command, "
              "arguments and environment; a pod template shapes the pod, not what runs in it")
_PRIVILEGE = ("a pod template adds only the capabilities of `capabilities` (IPC_LOCK, SYS_RESOURCE): no slurmd "
              "pod is privileged or runs otherwise than slurmk8s sets it (slurmConfig.cgroups alone makes the "
              "cluster's own slurmd privileged)")
_HOST = "a slurmd pod shares no namespace with its node: jobs would see and reach the node's own processes"
REFUSED_FIELDS = {
    **dict.fromkeys(("command", "args", "image", "env", "envFrom", "workingDir", "containers", "initContainers",
                     "ephemeralContainers", "lifecycle", "livenessProbe", "readinessProbe", "startupProbe"),
                    _CONTAINER),
    **dict.fromkeys(("privileged", "securityContext", "allowPrivilegeEscalation", "runAsUser", "runAsGroup",
                     "runAsNonRoot", "seccompProfile", "appArmorProfile", "procMount", "shareProcessNamespace"),
                    _PRIVILEGE),
    **dict.fromkeys(("hostNetwork", "hostPID", "hostIPC", "hostUsers"), _HOST),
    "hostPath": ("a hostPath volume reaches the node's own files, which no slurmd pod gets (Pod Security baseline "
                 "refuses it too); use a persistentVolumeClaim (local volumes included), emptyDir or configMap, "
                 "and device plugins for devices (resources)"),
    "secret": ("a Secret mounted in a slurmd pod is readable by every job that runs there, and editing a "
               "SlurmCluster or a NodeLendingPolicy gives no right to read one (decision record 27)"),
    "projected": ("a projected volume may hold Secrets and tokens, which every job of the node could read; use "
                  "configMap"),
    "nodeName": "the scheduler places a node set's pods, and a lent pod runs on the node the bridge lends",
    "nodeSelector": "a node set has its own nodeSelector, and a lent pod runs on a node the policy's nodeSelector "
                    "chose",
    "serviceAccountName": "Slurm pods never call the Kubernetes API and mount no token that jobs could read",
    "automountServiceAccountToken": "Slurm pods never call the Kubernetes API and mount no token that jobs "
                                    "could read",
    "dnsPolicy": "slurmd finds slurmctld through the cluster's DNS (ClusterFirst); dnsConfig adds to it",
    "subPath": "a mount takes its whole volume (a subPath could follow a link out of it); give a configMap's "
               "items paths instead",
    "subPathExpr": "a mount takes its whole volume (a subPath could follow a link out of it)",
}
_VOLUME_SOURCE = ("is not a volume source a pod template may add (emptyDir, configMap and persistentVolumeClaim "
                  "are; a claim reaches any storage a StorageClass or PersistentVolume provides, NFS and local "
                  "disks included)")


def unknown_field_reason(loc: Sequence[str | int]) -> str | None:
    """The message for a field a pod template does not have, where it is one a PodSpec
    has: why it is refused (``loc``: pydantic's location of an unknown field); None
    elsewhere (the field is merely unknown)."""
    if "podTemplate" not in loc or not loc or not isinstance(loc[-1], str):
        return None
    name = loc[-1]
    if len(loc) >= 3 and loc[-3] == "volumes" and isinstance(loc[-2], int):
        if name in REFUSED_FIELDS:
            return f"is not a volume source a pod template may add: {REFUSED_FIELDS[name]}"
        return _VOLUME_SOURCE
    if name in REFUSED_FIELDS:
        return f"is not a field of a pod template: {REFUSED_FIELDS[name]}"
    return None
