"""Admission on pod create, as Kubernetes 1.32's plugins: ServiceAccount
(``plugin/pkg/admission/serviceaccount``), and ExtendedResourceToleration
(``plugin/pkg/admission/extendedresourcetoleration``), which managed clusters
enable with their tainted GPU node pools. Pure: the caller looks up the
ServiceAccount and supplies the volume name suffix."""

from __future__ import annotations

from .errors import APIError

TOKEN_VOLUME_PREFIX = "kube-api-access-"
TOKEN_MOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_EXPIRATION = 3607  # what Kubernetes asks the kubelet for (1h + 7s, to spot legacy-token use)


def service_account_name(pod: dict) -> str:
    spec = pod.get("spec") or {}
    return spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"


def token_volume(name: str) -> dict:
    return {
        "name": name,
        "projected": {
            "defaultMode": 420,
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": TOKEN_EXPIRATION, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
            ],
        },
    }


def should_automount(pod: dict, sa: dict) -> bool:
    spec_value = (pod.get("spec") or {}).get("automountServiceAccountToken")
    if spec_value is not None:
        return bool(spec_value)
    sa_value = sa.get("automountServiceAccountToken")
    return True if sa_value is None else bool(sa_value)


def admit_pod(pod: dict, sa: dict | None, suffix: str) -> None:
    """Sets the pod's ServiceAccount (default ``default``) and mounts its token
    volume, in place; raises 403 if the ServiceAccount does not exist."""
    spec = pod.setdefault("spec", {})
    if not isinstance(spec, dict):
        return  # validation reports it
    name = service_account_name(pod)
    spec["serviceAccountName"] = name
    spec["serviceAccount"] = name
    md = pod.get("metadata") or {}
    if sa is None:
        ns = md.get("namespace") or ""
        pod_name = md.get("name") or ""
        what = f'pods "{pod_name}"' if pod_name else "pods"
        raise APIError(403, f"{what} is forbidden: error looking up service account {ns}/{name}: serviceaccount \"{name}\" not found",
                       "Forbidden", {"name": pod_name, "kind": "pods"} if pod_name else {"kind": "pods"})
    if not should_automount(pod, sa):
        return
    volumes = spec.get("volumes") or []
    existing = next((v.get("name") for v in volumes if isinstance(v, dict) and str(v.get("name", "")).startswith(TOKEN_VOLUME_PREFIX)), None)
    volume_name = existing or TOKEN_VOLUME_PREFIX + suffix
    needs_volume = False
    for key in ("initContainers", "containers"):
        for c in spec.get(key) or []:
            if not isinstance(c, dict):
                continue
            mounts = c.get("volumeMounts") or []
            if any(isinstance(m, dict) and m.get("mountPath") == TOKEN_MOUNT_PATH for m in mounts):
                continue
            c["volumeMounts"] = [*mounts, {"name": volume_name, "readOnly": True, "mountPath": TOKEN_MOUNT_PATH}]
            needs_volume = True
    if existing is None and needs_volume:
        spec["volumes"] = [*volumes, token_volume(volume_name)]


def _extended(resource: str) -> bool:
    """An extended resource: a domain-prefixed name outside kubernetes.io (IsExtendedResourceName)."""
    domain, slash, _ = resource.partition("/")
    return bool(slash) and domain != "kubernetes.io" and not domain.endswith(".kubernetes.io") \
        and not resource.startswith("requests.")


def tolerate_extended_resources(pod: dict) -> None:
    """ExtendedResourceToleration: a pod that requests an extended resource
    (``nvidia.com/gpu``) tolerates the NoSchedule taint of that name, in place."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return
    wanted = set()
    for key in ("initContainers", "containers"):
        for c in spec.get(key) or []:
            res = (c.get("resources") or {}) if isinstance(c, dict) else {}
            for section in ("requests", "limits"):
                wanted |= {r for r in (res.get(section) or {}) if isinstance(r, str) and _extended(r)}
    tolerations = spec.get("tolerations") or []
    for r in sorted(wanted):
        t = {"key": r, "operator": "Exists", "effect": "NoSchedule"}
        if t not in tolerations:
            tolerations = [*tolerations, t]
    if wanted:
        spec["tolerations"] = tolerations
