"""Model-version rollouts: roll a serving Deployment when training publishes a model.

A Slurm job publishes model versions in its checkpoint directory (a version
directory, then the one-line file ``LATEST`` naming it, replaced by a rename:
``examples/train.sh``). A Deployment that serves them names that directory in
its annotation ``slurmk8s.dev/model-dir`` (the path as the Slurm pods see it,
e.g. ``/shared/checkpoints/researcher/train``). Every round the bridge reads
each such directory's ``LATEST`` and, when it names a version the pod template
does not carry yet, sets the pod-template annotation
``slurmk8s.dev/model-version`` to it: the Deployment rolls its pods, so
servers that load a model only at start pick up the new one.

The model directory must be a normalised absolute path inside one of the
allowed roots (the clusters' ``spec.sharedStorage.checkpointDir``), so that a
Deployment cannot make the bridge read other files. A Deployment whose
annotation breaks that gets a Warning Event (``InvalidModelDir``) and is left
alone. A Deployment whose ``LATEST`` cannot be read, or whose patch fails,
gets a Warning Event (``RolloutFailed``, once while Kubernetes keeps it) and
is tried again next round; the bridge's round report, log and metrics count
both. Only a plain version name (``slurmk8s.published_model.VERSION``) from ``LATEST``
ever reaches an annotation.

:func:`rollout_patch` and :func:`check_model_dir` are pure;
:func:`apply_rollouts` is the thin I/O around them that the bridge calls once
per round.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import log
from ..published_model import LATEST, LATEST_MAX, VERSION, BadModelDir, check_model_dir  # noqa: F401 (re-exported)

__all__ = [
    "MODEL_DIR_ANNOTATION", "MODEL_VERSION_ANNOTATION", "BadModelDir", "RolloutReport",
    "check_model_dir", "parse_latest", "rollout_patch", "apply_rollouts",
]

MODEL_DIR_ANNOTATION = "slurmk8s.dev/model-dir"
MODEL_VERSION_ANNOTATION = "slurmk8s.dev/model-version"
#: The reason of the Warning Event a Deployment with a bad model-dir gets.
INVALID_REASON = "InvalidModelDir"
#: The reason of the Warning Event a Deployment gets when its LATEST cannot be read or its patch fails.
FAILED_REASON = "RolloutFailed"
COMPONENT = "slurmk8s-bridge"

_log = log.get("slurmk8s.bridge.rollout")


def parse_latest(text: str) -> str | None:
    """The version a LATEST file's text names, or None if it names none."""
    version = text[:LATEST_MAX].strip()
    return version if VERSION.fullmatch(version) else None


def _annotations(obj: Any) -> dict:
    value = obj.get("annotations") if isinstance(obj, dict) else None
    return value if isinstance(value, dict) else {}


def rollout_patch(deployment: dict, published_version: str | None) -> dict | None:
    """The merge patch that rolls ``deployment`` to ``published_version``, or None.

    None when the Deployment does not follow a model directory (no
    ``slurmk8s.dev/model-dir`` annotation), nothing is published (None), the
    version is not a plain version name, or its pod template already carries
    that version.
    """
    if MODEL_DIR_ANNOTATION not in _annotations(deployment.get("metadata")):
        return None
    if published_version is None or not VERSION.fullmatch(published_version):
        return None
    template = (deployment.get("spec") or {}).get("template") or {}
    if _annotations(template.get("metadata")).get(MODEL_VERSION_ANNOTATION) == published_version:
        return None
    return {"spec": {"template": {"metadata": {"annotations": {MODEL_VERSION_ANNOTATION: published_version}}}}}


@dataclass
class RolloutReport:
    """What one round did, by ``namespace/name``."""

    rolled: dict[str, str] = field(default_factory=dict)  # -> the version now on the pod template
    invalid: dict[str, str] = field(default_factory=dict)  # -> why the annotation was refused
    unpublished: list[str] = field(default_factory=list)  # no LATEST (yet), or it names no version
    failed: dict[str, str] = field(default_factory=dict)  # -> the error reading LATEST or patching


def _event_name(deployment: dict, message: str, reason: str = INVALID_REASON) -> str:
    """The name of a Warning Event about a Deployment. It depends on the
    Deployment, the reason and ``message`` only, so a lasting problem gives
    one Event, not one per round (creating it again is refused as AlreadyExists)."""
    meta = deployment["metadata"]
    digest = hashlib.sha256(f"{meta.get('uid', '')}\n{message}".encode()).hexdigest()[:12]
    return f"{meta['name'][:200]}.{reason.lower()}.{digest}"


def apply_rollouts(kube: Any, read_file: Callable[[str], str], allowed_roots: Sequence[str], *,
                   namespace: str | None = None, events: bool = True) -> RolloutReport:
    """One round: roll every Deployment whose model directory published a new version.

    ``kube`` is the bridge's :class:`slurmk8s.kube.Kube`;
    ``read_file(path)`` returns the text of the file at ``path`` as the Slurm
    pods name it (raising ``FileNotFoundError`` when there is none),
    ``allowed_roots`` the directories model directories must lie in.
    ``namespace`` None: every namespace. ``events`` False: a refused
    annotation is only logged. Errors on one Deployment do not stop the others.
    """
    report = RolloutReport()
    for dep in kube.list("Deployment", namespace):
        meta = dep.get("metadata") or {}
        model_dir = _annotations(meta).get(MODEL_DIR_ANNOTATION)
        if model_dir is None:
            continue
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        try:
            check_model_dir(model_dir, allowed_roots)
        except BadModelDir as exc:
            message = f"annotation {MODEL_DIR_ANNOTATION} {exc}; the Deployment is not rolled to new model versions"
            report.invalid[key] = message
            _warn(kube if events else None, dep, message)
            continue
        try:
            version = parse_latest(read_file(f"{model_dir}/{LATEST}"))
        except FileNotFoundError:
            version = None
        except (OSError, UnicodeDecodeError) as exc:
            report.failed[key] = f"cannot read {model_dir}/{LATEST}: {exc}"
            _log.warning("cannot read the published model version", deployment=key, error=str(exc))
            _failed(kube if events else None, dep, f"cannot read {model_dir}/{LATEST}", report.failed[key])
            continue
        patch = rollout_patch(dep, version)
        if version is None:
            report.unpublished.append(key)
            continue
        if patch is None:
            continue
        try:
            kube.patch("Deployment", meta["namespace"], meta["name"], patch)
        except Exception as exc:  # noqa: BLE001 - an ApiError, or the connection
            report.failed[key] = f"patch failed: {exc}"
            _log.warning("could not roll the Deployment", deployment=key, version=version, error=str(exc))
            _failed(kube if events else None, dep, "patch failed", f"rolling to {version}: {report.failed[key]}")
            continue
        report.rolled[key] = version
        _log.info("rolling the Deployment to a new model version", deployment=key, version=version,
                  model_dir=model_dir)
    return report


def _failed(kube: Any, dep: dict, what: str, message: str) -> None:
    """A Warning Event that the Deployment could not be rolled; named by
    ``what`` failed, not by the error's words, so a lasting failure is told once."""
    if kube is None:
        return
    key = f"{dep['metadata'].get('namespace')}/{dep['metadata'].get('name')}"
    try:
        kube.event(dep, "Warning", FAILED_REASON, f"not rolled to the published model version: {message}",
                   component=COMPONENT, name=_event_name(dep, what, FAILED_REASON))
    except Exception as exc:  # noqa: BLE001 - the report and the log say it all the same
        if getattr(exc, "status", None) != 409:  # 409: the same Event exists, told already
            _log.warning("could not record an Event", deployment=key, error=str(exc))


def _warn(kube: Any, dep: dict, message: str) -> None:
    key = f"{dep['metadata'].get('namespace')}/{dep['metadata'].get('name')}"
    if kube is None:
        _log.warning("refused a model directory", deployment=key, problem=message)
        return
    try:
        kube.event(dep, "Warning", INVALID_REASON, message, component=COMPONENT, name=_event_name(dep, message))
    except Exception as exc:  # noqa: BLE001 - a 409 is told already; anything else is logged
        if getattr(exc, "status", None) == 409:  # the same Event exists: told already
            _log.debug("refused a model directory (Event exists)", deployment=key)
            return
        _log.warning("could not record an Event", deployment=key, error=str(exc))
    _log.warning("refused a model directory", deployment=key, problem=message)
