"""Pod Security admission, as Kubernetes 1.33's built-in plugin
(``k8s.io/pod-security-admission``). Pure.

A namespace chooses a level per mode with labels:
``pod-security.kubernetes.io/<mode>: privileged | baseline | restricted``
(``<mode>``: enforce, audit, warn; ``<mode>-version`` pins a version, which
the stand-in reads as ``latest``: the checks below are the latest ones).
``enforce`` refuses a pod that violates its level; ``warn`` returns the
violations as warnings to the client, for pods and for the pod templates of
workloads (whose pods are then refused or admitted when their controller
creates them); ``audit`` puts them, for the same objects, in the request's
audit event as the annotation ``pod-security.kubernetes.io/audit-violations``.

:func:`check` evaluates a pod spec against a level and returns the
violations as Kubernetes words them: ``(reason, detail)`` pairs, e.g.
``("privileged", 'container "slurmd" must not set securityContext.privileged=true')``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["LEVELS", "MODES", "check", "forbidden_message", "warning", "namespace_levels", "label_errors"]

LEVELS = ("privileged", "baseline", "restricted")
MODES = ("enforce", "audit", "warn")
PREFIX = "pod-security.kubernetes.io/"

#: Capabilities baseline lets a container add.
BASELINE_CAPABILITIES = frozenset({"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                                   "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"})
#: Volume types restricted allows.
RESTRICTED_VOLUMES = ("configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret")
#: Sysctls baseline allows.
SAFE_SYSCTLS = frozenset({"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                          "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                          "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                          "net.ipv4.tcp_keepalive_probes"})


def _containers(spec: dict) -> list[dict]:
    return [c for key in ("initContainers", "containers", "ephemeralContainers")
            for c in spec.get(key) or [] if isinstance(c, dict)]


def _names(kind: str, names: list[str]) -> str:
    quoted = ", ".join(f'"{n}"' for n in names)
    return f"{kind} {quoted}" if len(names) == 1 else f"{kind}s {quoted}"


def _quoted(items: list[str]) -> str:
    return ", ".join(f'"{x}"' for x in items)


def _sc(c: dict) -> dict:
    sc = c.get("securityContext")
    return sc if isinstance(sc, dict) else {}


def _baseline(spec: dict) -> Iterable[tuple[str, str]]:
    pod_sc = spec.get("securityContext") if isinstance(spec.get("securityContext"), dict) else {}
    containers = _containers(spec)
    host = [f"{k}=true" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    if host:
        yield "host namespaces", ", ".join(host)
    privileged = [c.get("name", "") for c in containers if _sc(c).get("privileged")]
    if privileged:
        yield "privileged", f"{_names('container', privileged)} must not set securityContext.privileged=true"
    added: dict[str, list[str]] = {}
    for c in containers:
        for cap in ((_sc(c).get("capabilities") or {}).get("add") or []):
            if cap not in BASELINE_CAPABILITIES:
                added.setdefault(c.get("name", ""), []).append(cap)
    if added:
        yield "non-default capabilities", ", ".join(
            f'container "{n}" must not include {_quoted(caps)} in securityContext.capabilities.add'
            for n, caps in added.items())
    host_paths = [v.get("name", "") for v in spec.get("volumes") or [] if isinstance(v, dict) and "hostPath" in v]
    if host_paths:
        yield "hostPath volumes", _names("volume", host_paths)
    ports = [(c.get("name", ""), p["hostPort"]) for c in containers for p in c.get("ports") or []
             if isinstance(p, dict) and p.get("hostPort")]
    if ports:
        yield "hostPort", ", ".join(f'container "{n}" uses hostPort {p}' for n, p in ports)
    if any(_sc(c).get("procMount") not in (None, "Default") for c in containers):
        yield "procMount", "containers must not set securityContext.procMount to Unmasked"
    unconfined = []
    if ((pod_sc.get("seccompProfile") or {}).get("type")) == "Unconfined":
        unconfined.append("pod")
    unconfined += [f'container "{c.get("name", "")}"' for c in containers
                   if (_sc(c).get("seccompProfile") or {}).get("type") == "Unconfined"]
    if unconfined:
        yield "seccompProfile", f'{", ".join(unconfined)} must not set securityContext.seccompProfile.type to "Unconfined"'
    sysctls = [s.get("name", "") for s in pod_sc.get("sysctls") or [] if s.get("name") not in SAFE_SYSCTLS]
    if sysctls:
        yield "forbidden sysctls", ", ".join(sysctls)


def _restricted(spec: dict) -> Iterable[tuple[str, str]]:
    pod_sc = spec.get("securityContext") if isinstance(spec.get("securityContext"), dict) else {}
    containers = _containers(spec)
    bad_volumes = []
    for v in spec.get("volumes") or []:
        kind = next((k for k in v if k != "name"), None) if isinstance(v, dict) else None
        if kind is not None and kind not in RESTRICTED_VOLUMES:
            bad_volumes.append(f'volume "{v.get("name", "")}" uses restricted volume type "{kind}"')
    if bad_volumes:
        yield "restricted volume types", ", ".join(bad_volumes)
    escalating = [c.get("name", "") for c in containers if _sc(c).get("allowPrivilegeEscalation") is not False]
    if escalating:
        yield "allowPrivilegeEscalation != false", \
            f"{_names('container', escalating)} must set securityContext.allowPrivilegeEscalation=false"
    drop = [c.get("name", "") for c in containers
            if "ALL" not in ((_sc(c).get("capabilities") or {}).get("drop") or [])]
    adds = {c.get("name", ""): [x for x in (_sc(c).get("capabilities") or {}).get("add") or []
                                if x != "NET_BIND_SERVICE"] for c in containers}
    details = []
    if drop:
        details.append(f'{_names("container", drop)} must set securityContext.capabilities.drop=["ALL"]')
    for n, caps in adds.items():
        if caps:
            details.append(f'container "{n}" must not include {_quoted(caps)} in securityContext.capabilities.add')
    if details:
        yield "unrestricted capabilities", "; ".join(details)
    pod_nonroot = pod_sc.get("runAsNonRoot")
    not_nonroot = [c.get("name", "") for c in containers
                   if _sc(c).get("runAsNonRoot") is False or (_sc(c).get("runAsNonRoot") is None and pod_nonroot is not True)]
    if pod_nonroot is False or not_nonroot:
        who = "pod" if pod_nonroot is False else f"pod or {_names('container', not_nonroot)}"
        yield "runAsNonRoot != true", f"{who} must {'not set' if pod_nonroot is False else 'set'} " \
                                      f"securityContext.runAsNonRoot={'false' if pod_nonroot is False else 'true'}"
    root = (["pod"] if pod_sc.get("runAsUser") == 0 else []) + \
        [f'container "{c.get("name", "")}"' for c in containers if _sc(c).get("runAsUser") == 0]
    if root:
        yield "runAsUser=0", f"{', '.join(root)} must not set runAsUser=0"
    pod_profile = (pod_sc.get("seccompProfile") or {}).get("type")
    unset = [c.get("name", "") for c in containers
             if (_sc(c).get("seccompProfile") or {}).get("type") not in ("RuntimeDefault", "Localhost")
             and not ((_sc(c).get("seccompProfile") or {}).get("type") is None
                      and pod_profile in ("RuntimeDefault", "Localhost"))]
    if unset:
        yield "seccompProfile", (f"pod or {_names('container', unset)} must set securityContext.seccompProfile.type "
                                 'to "RuntimeDefault" or "Localhost"')


def check(spec: Any, level: str) -> list[tuple[str, str]]:
    """The violations of ``level`` by a pod spec, as (reason, detail)."""
    if not isinstance(spec, dict) or level == "privileged":
        return []
    out = list(_baseline(spec))
    if level == "restricted":
        out += list(_restricted(spec))
    return out


def _joined(violations: list[tuple[str, str]]) -> str:
    return ", ".join(f"{r} ({d})" for r, d in violations)


def forbidden_message(level: str, violations: list[tuple[str, str]]) -> str:
    """What follows ``pods "x" is forbidden: `` in the 403."""
    return f'violates PodSecurity "{level}:latest": {_joined(violations)}'


def warning(level: str, violations: list[tuple[str, str]]) -> str:
    """The warning returned for ``warn`` (and for workloads' pod templates)."""
    return f'would violate PodSecurity "{level}:latest": {_joined(violations)}'


def namespace_levels(labels: dict | None) -> dict[str, str]:
    """mode -> level the namespace's labels set (a mode without a label is privileged)."""
    labels = labels or {}
    return {m: labels.get(PREFIX + m, "privileged") for m in MODES}


def label_errors(labels: dict | None) -> list[tuple[str, str]]:
    """(label, why) for each pod-security label a namespace may not carry."""
    out = []
    for key, value in (labels or {}).items():
        if not key.startswith(PREFIX):
            continue
        mode = key[len(PREFIX):]
        if mode in MODES and value not in LEVELS:
            out.append((key, f'must be one of {", ".join(LEVELS)}'))
        elif mode.endswith("-version") and mode[:-len("-version")] in MODES and not (
                value == "latest" or (value.startswith("v1.") and value[3:].isdigit())):
            out.append((key, 'must be "latest" or "v1.X"'))
    return out
