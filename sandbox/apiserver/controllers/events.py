"""Recording Events the way Kubernetes components do: one Event per
(object, reason, message), its ``count`` and ``lastTimestamp`` bumped on repeats."""

from __future__ import annotations

import copy
import secrets

from .. import timeutil
from ..api import API, Options
from ..errors import APIError
from ..store import meta


class Recorder:
    def __init__(self, api: API, component: str) -> None:
        self.api = api
        self.component = component
        self._names: dict[tuple, str] = {}

    def event(self, obj: dict, type_: str, reason: str, message: str) -> None:
        rt = self.api.resource("", "v1", "events")
        m = meta(obj)
        ns = m.get("namespace") or "default"
        key = (m.get("uid"), type_, reason, message)
        now = timeutil.rfc3339()
        existing_name = self._names.get(key)
        existing = self.api.raw(rt, ns, existing_name) if existing_name else None
        try:
            if existing is not None:
                body = copy.deepcopy(existing)
                body["count"] = int(body.get("count") or 1) + 1
                body["lastTimestamp"] = now
                self.api.update(rt, ns, existing_name, body, Options(field_manager=self.component), old=existing)
                return
            name = f"{m.get('name')}.{secrets.token_hex(8)}"
            body = {
                "metadata": {"name": name, "namespace": ns},
                "involvedObject": {
                    "apiVersion": obj.get("apiVersion"),
                    "kind": obj.get("kind"),
                    "name": m.get("name"),
                    "namespace": m.get("namespace"),
                    "uid": m.get("uid"),
                    "resourceVersion": m.get("resourceVersion"),
                },
                "reason": reason,
                "message": message,
                "type": type_,
                "source": {"component": self.component},
                "firstTimestamp": now,
                "lastTimestamp": now,
                "count": 1,
                "reportingComponent": self.component,
                "reportingInstance": self.component,
            }
            if not m.get("namespace"):
                body["involvedObject"].pop("namespace")
            self.api.create(rt, ns, body, Options(field_manager=self.component))
            self._names[key] = name
            if len(self._names) > 10000:
                self._names.clear()
        except APIError:
            pass  # events are best effort, as in Kubernetes (e.g. the namespace is going away)
