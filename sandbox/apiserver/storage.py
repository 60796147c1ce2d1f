"""Storage as a managed cluster has it: StorageClasses, the claims they provision
and the pods that wait for their claims (pure).

A managed cluster's default StorageClass is block storage (EBS, PD, Azure
Disk): it provisions ReadWriteOnce volumes and refuses ReadWriteMany, and it
binds a claim where its first pod lands (``WaitForFirstConsumer``). Shared
file storage (NFS, EFS, Filestore, Azure Files) is another class, which a
claim must name. The stand-in has both (:func:`bootstrap_classes`), made by
the server at start as a cloud's add-on manager makes them:

- ``standard``, the default (``storageclass.kubernetes.io/is-default-class``),
  provisioner :data:`BLOCK`, ``WaitForFirstConsumer``: ReadWriteOnce and
  ReadWriteOncePod only;
- ``shared``, provisioner :data:`SHARED`, ``Immediate``: every access mode.

What each part of Kubernetes does, in its words:

- :func:`admit_claim`, the DefaultStorageClass admission plugin: a claim
  created without ``storageClassName`` gets the default class (the newest
  if several are marked); ``""`` asks for no class and is left alone.
- :func:`provision`, the persistent volume controller and the external
  provisioners: a claim with no class waits for a volume nobody makes
  (``FailedBinding``); one naming a class that does not exist fails
  (``ProvisioningFailed``: ``storageclass.storage.k8s.io "x" not found``);
  a ``WaitForFirstConsumer`` claim waits (``WaitForFirstConsumer``) until
  the scheduler picks a node for its first pod (the
  ``volume.kubernetes.io/selected-node`` annotation) or a pod that uses it
  is bound to a node already; a class whose provisioner is not the
  stand-in's waits for it (``ExternalProvisioning``); the stand-in's
  provisioners refuse an access mode their storage has not, as the EBS CSI
  driver words it, and otherwise bind the claim to the volume
  ``pvc-<uid>`` (``ProvisioningSucceeded``).
- :func:`pod_claims`, the scheduler's VolumeBinding plugin: a pod whose
  claim is missing, being deleted, or unbound with an ``Immediate`` class is
  unschedulable, with the scheduler's reason; one whose unbound claims all
  wait for their first consumer is placed, the claims are given the node,
  and the pod is bound once they are.

Not done: PersistentVolume objects (a bound claim names ``pvc-<uid>``, which
no object describes; the pod runtime keeps the data per claim), zones and
volume topology, attachments, expansion, reclaim policies, and a claim that
names a ``volumeName`` is bound at once (static provisioning without the
volume).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .store import meta

STORAGECLASSES = ("storage.k8s.io", "storageclasses")
DEFAULT_ANNOTATION = "storageclass.kubernetes.io/is-default-class"
SELECTED_NODE = "volume.kubernetes.io/selected-node"
PROVISIONER_ANNOTATIONS = ("volume.beta.kubernetes.io/storage-provisioner", "volume.kubernetes.io/storage-provisioner")
BIND_ANNOTATIONS = {"pv.kubernetes.io/bind-completed": "yes", "pv.kubernetes.io/bound-by-controller": "yes"}

#: The component that records the persistent volume controller's Events.
CONTROLLER = "persistentvolume-controller"
#: The stand-in's provisioners: block storage (one node writes) and shared file storage.
BLOCK = "block.storage.sandbox.slurmk8s.dev"
SHARED = "shared.storage.sandbox.slurmk8s.dev"
#: The access modes each of the stand-in's provisioners can give a volume.
PROVISIONERS: dict[str, tuple[str, ...]] = {
    BLOCK: ("ReadWriteOnce", "ReadWriteOncePod"),
    SHARED: ("ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"),
}
#: An access mode as a CSI driver names the volume capability it asks for.
CSI_MODES = {"ReadWriteOnce": "SINGLE_NODE_WRITER", "ReadOnlyMany": "MULTI_NODE_READER_ONLY",
             "ReadWriteMany": "MULTI_NODE_MULTI_WRITER", "ReadWriteOncePod": "SINGLE_NODE_SINGLE_WRITER"}

DEFAULT_CLASS = "standard"
SHARED_CLASS = "shared"


def bootstrap_classes() -> list[dict]:
    """The StorageClasses the stand-in starts with, as a managed cluster's."""
    labels = {"addonmanager.kubernetes.io/mode": "EnsureExists"}
    return [
        {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
         "metadata": {"name": DEFAULT_CLASS, "labels": labels, "annotations": {DEFAULT_ANNOTATION: "true"}},
         "provisioner": BLOCK, "reclaimPolicy": "Delete", "volumeBindingMode": "WaitForFirstConsumer",
         "allowVolumeExpansion": True},
        {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
         "metadata": {"name": SHARED_CLASS, "labels": labels},
         "provisioner": SHARED, "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate"},
    ]


def is_default(sc: Mapping) -> bool:
    return (meta(sc).get("annotations") or {}).get(DEFAULT_ANNOTATION) == "true"


def default_class(classes: Iterable[Mapping]) -> str | None:
    """The class a claim without one gets: the default, the newest of several (as Kubernetes 1.26+)."""
    marked = [sc for sc in classes if is_default(sc)]
    if not marked:
        return None
    newest = max(marked, key=lambda sc: (meta(sc).get("creationTimestamp") or "", meta(sc).get("name") or ""))
    return meta(newest).get("name")


def admit_claim(claim: dict, classes: Iterable[Mapping]) -> None:
    """DefaultStorageClass admission, in place: a claim that names no class gets the default."""
    spec = claim.get("spec")
    if not isinstance(spec, dict) or spec.get("storageClassName") is not None:
        return
    name = default_class(classes)
    if name is not None:
        spec["storageClassName"] = name


# --- the persistent volume controller and the provisioners --------------------------


@dataclass(frozen=True)
class Note:
    """An Event to record about the claim: who says it, its type, reason and message."""

    component: str
    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class Provision:
    """What happens to an unbound claim now: annotations to add, Events, and
    whether it is bound (to ``volume``)."""

    annotations: Mapping[str, str] = field(default_factory=dict)
    notes: tuple[Note, ...] = ()
    volume: str | None = None


def provisioner_component(provisioner: str) -> str:
    """Who records an external provisioner's Events, as the CSI provisioner sidecar names itself."""
    return f"{provisioner}_{provisioner.split('.')[0]}-csi-controller-0"


def _unsupported(claim: Mapping, provisioner: str) -> str | None:
    modes = ((claim.get("spec") or {}).get("accessModes") or [])
    allowed = PROVISIONERS[provisioner]
    for m in modes:
        if m not in allowed:
            shown = ",".join(a for a in allowed if a != "ReadWriteOncePod")
            return f"Volume capabilities {CSI_MODES.get(m, m)} not supported. Only AccessModes[{shown}] supported."
    return None


def provision(claim: Mapping, classes: Mapping[str, Mapping], consumer_node: str | None = None) -> Provision:
    """What the persistent volume controller and the provisioners do with an
    unbound ``claim``; ``classes`` by name; ``consumer_node``: the node of a
    pod that uses the claim and is bound already (a pod that was given a node
    without the scheduler)."""
    m = meta(claim)
    spec = claim.get("spec") or {}
    key = f"{m.get('namespace')}/{m.get('name')}"
    volume = f"pvc-{m.get('uid')}"
    if spec.get("volumeName"):
        return Provision(volume=spec["volumeName"])
    name = spec.get("storageClassName") or ""
    if not name:
        return Provision(notes=(Note(CONTROLLER, "Normal", "FailedBinding",
                                     "no persistent volumes available for this claim and no storage class is set"),))
    sc = classes.get(name)
    if sc is None:
        return Provision(notes=(Note(CONTROLLER, "Warning", "ProvisioningFailed",
                                     f'storageclass.storage.k8s.io "{name}" not found'),))
    annotations = dict(m.get("annotations") or {})
    added: dict[str, str] = {}
    if sc.get("volumeBindingMode") == "WaitForFirstConsumer" and not annotations.get(SELECTED_NODE):
        if consumer_node is None:
            return Provision(notes=(Note(CONTROLLER, "Normal", "WaitForFirstConsumer",
                                         "waiting for first consumer to be created before binding"),))
        added[SELECTED_NODE] = consumer_node
    provisioner = sc.get("provisioner") or ""
    for a in PROVISIONER_ANNOTATIONS:
        if annotations.get(a) != provisioner:
            added[a] = provisioner
    waiting = Note(CONTROLLER, "Normal", "ExternalProvisioning",
                   f"Waiting for a volume to be created either by the external provisioner '{provisioner}' or manually "
                   "by the system administrator. If volume creation is delayed, please verify that the provisioner is "
                   "running and correctly registered.")
    if provisioner not in PROVISIONERS:
        return Provision(annotations=added, notes=(waiting,))
    who = provisioner_component(provisioner)
    started = Note(who, "Normal", "Provisioning", f'External provisioner is provisioning volume for claim "{key}"')
    refused = _unsupported(claim, provisioner)
    if refused is not None:
        return Provision(annotations=added, notes=(waiting, started, Note(
            who, "Warning", "ProvisioningFailed",
            f'failed to provision volume with StorageClass "{name}": rpc error: code = InvalidArgument desc = {refused}')))
    done = Note(who, "Normal", "ProvisioningSucceeded", f"Successfully provisioned volume {volume}")
    return Provision(annotations={**added, **BIND_ANNOTATIONS}, notes=(waiting, started, done), volume=volume)


def bound_status(claim: Mapping) -> dict:
    """A bound claim's status: its access modes and the requested size as capacity."""
    spec = claim.get("spec") or {}
    return {"phase": "Bound", "accessModes": list(spec.get("accessModes") or ["ReadWriteOnce"]),
            "capacity": {"storage": ((spec.get("resources") or {}).get("requests") or {}).get("storage", "0")}}


# --- the scheduler's VolumeBinding ----------------------------------------------------


def claim_names(pod: Mapping) -> list[str]:
    """The claims a pod's volumes use, in order."""
    return [v["persistentVolumeClaim"]["claimName"] for v in (pod.get("spec") or {}).get("volumes") or []
            if isinstance(v, Mapping) and isinstance(v.get("persistentVolumeClaim"), Mapping)
            and v["persistentVolumeClaim"].get("claimName")]


@dataclass(frozen=True)
class PodClaims:
    """Whether a pod's claims let it be scheduled: ``unschedulable`` (the
    scheduler's reason), ``select`` (unbound claims waiting for their first
    consumer: the node the pod is placed on is theirs), ``waiting`` (claims
    being provisioned for a node already picked: the pod waits unbound)."""

    unschedulable: str | None = None
    select: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()


def bound(claim: Mapping) -> bool:
    return (claim.get("status") or {}).get("phase") == "Bound"


def pod_claims(pod: Mapping, claims: Mapping[str, Mapping], classes: Mapping[str, Mapping]) -> PodClaims:
    """The VolumeBinding plugin's view of ``pod``; ``claims`` of its namespace and ``classes``, by name."""
    select: list[str] = []
    waiting: list[str] = []
    for name in claim_names(pod):
        claim = claims.get(name)
        if claim is None:
            return PodClaims(unschedulable=f'persistentvolumeclaim "{name}" not found')
        if meta(claim).get("deletionTimestamp"):
            return PodClaims(unschedulable=f'persistentvolumeclaim "{name}" is being deleted')
        if bound(claim):
            continue
        sc = classes.get((claim.get("spec") or {}).get("storageClassName") or "")
        if sc is None or sc.get("volumeBindingMode") != "WaitForFirstConsumer":
            return PodClaims(unschedulable="pod has unbound immediate PersistentVolumeClaims")
        if (meta(claim).get("annotations") or {}).get(SELECTED_NODE):
            waiting.append(name)
        else:
            select.append(name)
    return PodClaims(select=tuple(select), waiting=tuple(waiting))


def consumer_node(claim: Mapping, pods: Sequence[Mapping]) -> str | None:
    """The node of a live pod of the claim's namespace that uses it and is bound already, if any."""
    m = meta(claim)
    for p in pods:
        pm = meta(p)
        node = (p.get("spec") or {}).get("nodeName")
        if node and pm.get("namespace") == m.get("namespace") and not pm.get("deletionTimestamp") \
                and m.get("name") in claim_names(p):
            return node
    return None


# --- the API's rules for StorageClass objects -----------------------------------------


def class_defaults(sc: dict) -> None:
    sc.setdefault("reclaimPolicy", "Delete")
    sc.setdefault("volumeBindingMode", "Immediate")


#: What Kubernetes says when an update changes a StorageClass field that may not change.
IMMUTABLE = {"parameters": "updates to parameters are forbidden.", "provisioner": "updates to provisioner are forbidden.",
             "reclaimPolicy": "updates to reclaimPolicy are forbidden.", "volumeBindingMode": "field is immutable"}
