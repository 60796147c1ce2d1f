"""Where kopf remembers the last spec it handled: a digest, not a copy.

kopf keeps a "diff base" per object so it can tell an update from a resume.
Its annotation storage keeps a copy of the whole spec in an annotation; a
SlurmCluster with several hundred login users then carries a copy of
hundreds of KB, and with ``kubectl apply``'s own copy its annotations pass
the 256 KiB that the API server allows an object's annotations together:
every later write to the object is refused, the operator's included.

The operator needs no old spec: every handler reconciles from the spec as
it is now. So this storage keeps only a SHA-256 of what kopf would have
stored (``slurmk8s.dev/last-handled-digest``). When the object's essence
hashes to it, kopf is told that essence (nothing changed); when not, kopf is
told an essence that differs from it, so the update handler runs and
reconciles. A copy left by an older operator
(``slurmk8s.dev/last-handled-configuration``) is read once and removed at
the next store.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

import kopf

from ..api.cluster import GROUP

__all__ = ["DigestDiffBaseStorage", "DIGEST_KEY", "LEGACY_KEY"]

DIGEST_KEY = "last-handled-digest"
LEGACY_KEY = "last-handled-configuration"
#: The field of the stand-in essence kopf is told when the digest differs.
_CHANGED = f"{GROUP}/changed-since"


def digest(essence: Any) -> str:
    """sha256 of the essence as kopf encodes it (compact JSON, keys sorted)."""
    return hashlib.sha256(json.dumps(essence, separators=(",", ":"), sort_keys=True).encode()).hexdigest()


class DigestDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """kopf's diff base as a digest in one annotation (the module's docstring)."""

    def __init__(self) -> None:
        super().__init__(prefix=GROUP, key=DIGEST_KEY, v1=False)

    def build(self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None) -> Any:
        essence = super().build(body=body, extra_fields=extra_fields)
        self.remove_annotations(essence, set(self.make_keys(LEGACY_KEY, body=body)))
        self.remove_empty_stanzas(essence)
        return essence

    def fetch(self, *, body: kopf.Body) -> Any:
        annotations = body.metadata.annotations
        stored = next((annotations[k] for k in self.make_keys(DIGEST_KEY, body=body) if k in annotations), None)
        if stored is None:
            legacy = next((annotations[k] for k in self.make_keys(LEGACY_KEY, body=body) if k in annotations), None)
            return json.loads(legacy) if legacy else None
        current = self.build(body=body)
        if digest(current) == stored.strip():
            return current
        return {"spec": {_CHANGED: stored.strip()}}

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: Any) -> None:
        for key in self.make_keys(DIGEST_KEY, body=body):
            patch.metadata.annotations[key] = digest(essence)
        for key in self.make_keys(LEGACY_KEY, body=body):
            if key in body.metadata.annotations:
                patch.metadata.annotations[key] = None
        self._store_marker(prefix=self.prefix, patch=patch, body=body)
