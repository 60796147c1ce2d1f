"""LimitRanger admission for pods and ResourceQuota admission for every
namespaced kind, as Kubernetes 1.33's plugins, and a quota's usage. Pure: the
caller passes the namespace's LimitRanges, ResourceQuotas and objects.

LimitRanger (``Container`` items): a container's missing limits get the
item's ``default`` and its missing requests ``defaultRequest`` (a LimitRange
is stored with Kubernetes' defaults: ``default`` from ``max``,
``defaultRequest`` from ``default`` then ``min``); then ``min``, ``max`` and
``maxLimitRequestRatio`` are checked, and a pod outside them is refused.

ResourceQuota: a pod is charged ``pods``, ``count/pods``, ``requests.<r>``
(and ``<r>`` for cpu and memory) and ``limits.<r>``; a quota that limits a
compute resource refuses a pod whose containers do not all say it, and any
quota refuses a pod that would take its usage past ``hard``. Terminal pods
(Succeeded, Failed) are not charged. Every other object is charged
``count/<resource>[.<group>]``; Services, Secrets, ConfigMaps,
PersistentVolumeClaims and ResourceQuotas also by their legacy names
(``services``, ...); a Service ``services.loadbalancers`` and
``services.nodeports`` by its type; a claim ``requests.storage`` and, with a
storage class, ``<class>.storageclass.storage.k8s.io/requests.storage`` and
``/persistentvolumeclaims``. Quota is checked on create.
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal

from .quantity import parse

__all__ = ["limitrange_defaults", "apply_limit_ranges", "pod_usage", "object_usage", "usage", "quota_errors",
           "format_quantity"]

_COMPUTE = ("cpu", "memory")


def format_quantity(value: Decimal, key: str = "") -> str:
    """A quantity as the API prints quota figures: whole numbers plain, cpu in m below 1, and
    memory and storage (``key`` names the resource) with the largest binary suffix that is
    exact (4Gi), as Kubernetes keeps the binary format of such quantities."""
    if value != value.to_integral_value():
        return f"{int(value * 1000)}m"
    number = int(value)
    if number and key.endswith(("memory", "storage")):
        for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
            unit = 1024 ** ("KMGTPE".index(suffix[0]) + 1)
            if number % unit == 0:
                return f"{number // unit}{suffix}"
    return str(number)


def limitrange_defaults(lr: dict) -> dict:
    """The LimitRange as Kubernetes stores it: SetDefaults_LimitRangeItem on its Container items."""
    for item in (lr.get("spec") or {}).get("limits") or []:
        if item.get("type") != "Container":
            continue
        default = item.setdefault("default", {})
        request = item.setdefault("defaultRequest", {})
        for k, v in (item.get("max") or {}).items():
            default.setdefault(k, v)
        for k, v in default.items():
            request.setdefault(k, v)
        for k, v in (item.get("min") or {}).items():
            request.setdefault(k, v)
        if not default:
            del item["default"]
        if not request:
            del item["defaultRequest"]
    return lr


def _containers(pod: dict) -> list[dict]:
    spec = pod.get("spec") or {}
    return [c for key in ("initContainers", "containers") for c in spec.get(key) or [] if isinstance(c, dict)]


def apply_limit_ranges(pod: dict, ranges: Iterable[dict]) -> list[str]:
    """Fill the pod's containers' defaults from ``ranges`` (in place) and
    return what violates them, worded as LimitRanger words it."""
    items = [i for lr in ranges for i in (lr.get("spec") or {}).get("limits") or [] if i.get("type") == "Container"]
    errors: list[str] = []
    if not items:
        return errors
    for c in _containers(pod):
        res = c.setdefault("resources", {})
        for item in items:
            limits = res.setdefault("limits", {})
            requests = res.setdefault("requests", {})
            for k, v in (item.get("default") or {}).items():
                limits.setdefault(k, v)
            for k, v in (item.get("defaultRequest") or {}).items():
                requests.setdefault(k, v)
            for k, v in limits.items():  # the API server's own default: a request is its limit
                requests.setdefault(k, v)
            for k, lo in (item.get("min") or {}).items():
                if k in requests and parse(requests[k]) < parse(lo):
                    errors.append(f"minimum {k} usage per Container is {lo}, but request is {requests[k]}")
                elif k not in requests:
                    errors.append(f"minimum {k} usage per Container is {lo}.  No request is specified")
            for k, hi in (item.get("max") or {}).items():
                if k in limits and parse(limits[k]) > parse(hi):
                    errors.append(f"maximum {k} usage per Container is {hi}, but limit is {limits[k]}")
                elif k not in limits:
                    errors.append(f"maximum {k} usage per Container is {hi}.  No limit is specified")
            for k, ratio in (item.get("maxLimitRequestRatio") or {}).items():
                if k in limits and k in requests and parse(requests[k]) > 0 and \
                        parse(limits[k]) / parse(requests[k]) > parse(ratio):
                    errors.append(f"{k} max limit to request ratio per Container is {ratio}, but provided ratio "
                                  f"is {float(parse(limits[k]) / parse(requests[k])):.6f}")
        if not res.get("limits"):
            res.pop("limits", None)
        if not res.get("requests"):
            res.pop("requests", None)
        if not res:
            c.pop("resources", None)
    return errors


def _sums(pod: dict, section: str) -> dict[str, Decimal]:
    """What the pod requests or limits of each resource: the containers' sum,
    or any one init container's where that is larger."""
    spec = pod.get("spec") or {}
    total: dict[str, Decimal] = {}
    for c in spec.get("containers") or []:
        for k, v in ((c.get("resources") or {}).get(section) or {}).items():
            total[k] = total.get(k, Decimal(0)) + parse(v)
    for c in spec.get("initContainers") or []:
        for k, v in ((c.get("resources") or {}).get(section) or {}).items():
            total[k] = max(total.get(k, Decimal(0)), parse(v))
    return total


def pod_usage(pod: dict) -> dict[str, Decimal]:
    """What a pod is charged against a quota."""
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return {}
    out = {"pods": Decimal(1), "count/pods": Decimal(1)}
    for k, v in _sums(pod, "requests").items():
        out[f"requests.{k}"] = v
        if k in _COMPUTE:
            out[k] = v
    for k, v in _sums(pod, "limits").items():
        out[f"limits.{k}"] = v
    return out


#: The legacy quota names of counted core kinds.
_LEGACY = {("", "services"): "services", ("", "secrets"): "secrets", ("", "configmaps"): "configmaps",
           ("", "persistentvolumeclaims"): "persistentvolumeclaims", ("", "resourcequotas"): "resourcequotas",
           ("", "replicationcontrollers"): "replicationcontrollers"}
_ONE = Decimal(1)


def object_usage(storage: tuple[str, str], obj: dict) -> dict[str, Decimal]:
    """What an object of ``storage`` (group, resource) is charged against a quota."""
    if storage == ("", "pods"):
        return pod_usage(obj)
    group, plural = storage
    out = {f"count/{plural}" + (f".{group}" if group else ""): _ONE}
    if storage in _LEGACY:
        out[_LEGACY[storage]] = _ONE
    spec = obj.get("spec") or {}
    if storage == ("", "services"):
        kind = spec.get("type") or "ClusterIP"
        if kind == "LoadBalancer":
            out["services.loadbalancers"] = _ONE
        if kind in ("NodePort", "LoadBalancer"):
            out["services.nodeports"] = Decimal(len(spec.get("ports") or []))
    if storage == ("", "persistentvolumeclaims"):
        size = parse(((spec.get("resources") or {}).get("requests") or {}).get("storage") or "0")
        out["requests.storage"] = size
        if spec.get("storageClassName"):
            prefix = f"{spec['storageClassName']}.storageclass.storage.k8s.io"
            out[f"{prefix}/requests.storage"] = size
            out[f"{prefix}/persistentvolumeclaims"] = _ONE
    return out


def _used(objects: Iterable[tuple[tuple[str, str], dict]], keys: Iterable[str]) -> dict[str, Decimal]:
    """Each of ``keys``, summed over what ``objects`` ((storage, object) pairs) are charged."""
    used = {k: Decimal(0) for k in keys}
    for storage, obj in objects:
        for k, v in object_usage(storage, obj).items():
            if k in used:
                used[k] += v
    return used


def usage(objects: Iterable[tuple[tuple[str, str], dict]], hard: dict) -> dict[str, str]:
    """A quota's status.used: each of ``hard``'s keys, summed over the namespace's ``objects``."""
    return {k: format_quantity(v, k) for k, v in _used(objects, hard).items()}


def quota_errors(obj: dict, quotas: Iterable[dict], others: Iterable[dict],
                 storage: tuple[str, str] = ("", "pods")) -> list[str]:
    """Why the quotas refuse creating ``obj`` of ``storage`` (``others``: the namespace's objects of
    that storage), as the plugin words it."""
    pods = [(storage, o) for o in others]
    pod = obj
    charge = object_usage(storage, obj)
    for quota in sorted(quotas, key=lambda q: (q.get("metadata") or {}).get("name", "")):
        qname = (quota.get("metadata") or {}).get("name", "")
        hard = {k: parse(v) for k, v in ((quota.get("spec") or {}).get("hard") or {}).items()}
        missing = []
        for key in sorted(hard) if storage == ("", "pods") else ():
            section, _, resource = key.partition(".")
            if section in ("requests", "limits") and resource in _COMPUTE or key in _COMPUTE:
                section, resource = (section, resource) if resource else ("requests", key)
                lacking = [c.get("name", "") for c in _containers(pod)
                           if resource not in ((c.get("resources") or {}).get(section) or {})]
                if lacking:
                    missing.append(f"{key} for: {','.join(lacking)}")
        if missing:
            return [f"failed quota: {qname}: must specify {'; '.join(missing)}"]
        used = _used(pods, hard)
        over = [k for k in sorted(hard) if k in charge and used[k] + charge[k] > hard[k]]
        if over:
            def fmt(values) -> str:
                return ",".join(f"{k}={format_quantity(values[k], k)}" for k in over)  # noqa: B023 - called within this iteration
            return [f"exceeded quota: {qname}, requested: {fmt(charge)}, used: {fmt(used)}, limited: {fmt(hard)}"]
    return []
