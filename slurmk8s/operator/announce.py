"""Posting a round's Events about its SlurmCluster, as ``slurmk8s-operator``. Shell.

A Warning about an object (a failed write, a refused Slurm action) is named
after the cluster, its reason and that object (:func:`event_name`, pure), so
posting it again while Kubernetes keeps it (an hour by default) is refused
with 409: a failure that lasts is announced once per reason and object,
whatever its message says. Other Events are posted as they come.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

from slurmk8s import log
from slurmk8s.events import Event
from slurmk8s.kube import ApiError, Kube
from slurmk8s.render import names

__all__ = ["post", "event_name"]

_log = log.get("slurmk8s.operator")


def post(kube: Kube, body: Mapping, events: Sequence[Event]) -> None:
    """Post ``events`` about the SlurmCluster ``body``; a failure to post one is logged, not raised."""
    for e in events:
        name = event_name(body, e) if e.type == "Warning" and e.about else None
        try:
            kube.event(body, e.type, e.reason, e.message, component=names.FIELD_MANAGER, name=name)
        except ApiError as exc:
            if not exc.conflict:
                _log.warning("could not post an Event", reason=e.reason, error=str(exc))
        except OSError as exc:
            _log.warning("could not post an Event", reason=e.reason, error=str(exc))


def event_name(body: Mapping, e: Event) -> str:
    """The one name of a failure Event: cluster, reason and object."""
    meta = body["metadata"]
    digest = hashlib.sha256(f"{meta.get('uid', '')}\0{e.reason}\0{e.about}".encode()).hexdigest()[:16]
    return f"{meta['name']}.{digest}"
