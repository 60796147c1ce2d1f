"""Which pod runtime the sandbox's kubelet uses: the one place that chooses.

``runtime`` (the default) runs each container on an overlay of this host's
root file system with the files its Dockerfile copies; ``runcruntime`` runs
the images themselves with runc (``slurmk8s images build`` builds them).
``SLURMK8S_SANDBOX_RUNTIME=runc`` in the environment of ``slurmk8s sandbox
up`` (which the kubelet inherits) selects runc. A pod keeps the runtime it
was started with: stopping and exec find it from the pod's holder.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

from . import runcruntime, runtime

ENV = "SLURMK8S_SANDBOX_RUNTIME"
RUNTIMES = {"namespaces": runtime, "runc": runcruntime}


def selected(value: str | None = None) -> ModuleType:
    """The runtime ``value`` (else $SLURMK8S_SANDBOX_RUNTIME) names; the default when unset."""
    name = (value if value is not None else os.environ.get(ENV, "")) or "namespaces"
    try:
        return RUNTIMES[name]
    except KeyError:
        raise runtime.SandboxError(f"{ENV}={name!r} names no pod runtime: use one of "
                                   f"{', '.join(RUNTIMES)}") from None


def of_pod(pod_dir: Path) -> ModuleType:
    """The runtime a pod was prepared by (runc writes ``runc.json``)."""
    return runcruntime if (pod_dir / "runc.json").exists() else runtime


def stop(holder: int | None, grace: float) -> None:
    """Stop a pod, whichever runtime started it."""
    (runcruntime if runcruntime.is_holder(holder) else runtime).stop(holder, grace)


def container_pid(holder: int | None, pod_dir: Path, index: int = 0) -> int | None:
    if holder is None:
        return None
    return of_pod(pod_dir).container_pid(holder, pod_dir, index)


def exec_argv(holder: int | None, pod_dir: Path, argv, env=None, container: int = 0, tty: bool = False) -> list[str]:
    if holder is None:
        raise runtime.SandboxError("the pod or its container is not running")
    return of_pod(pod_dir).exec_argv(holder, pod_dir, argv, env, container=container, tty=tty)
