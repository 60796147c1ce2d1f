"""An in-memory API server with the operator's client interface, for tests of a round.

It keeps objects by (kind, namespace, name), assigns uid and resourceVersion,
honours uid preconditions and label selectors, and keeps status apart from
what the operator applies. :meth:`FakeKube.run_controllers` plays the
StatefulSet and Deployment controllers (pods per ordinal, revision labels,
OnDelete, claims from volumeClaimTemplates) and binds claims, but those a
test names in ``pending`` (they stay Pending, as a provisioner that refuses
them leaves them), for as long as a test needs.
It is a test double of :class:`slurmk8s.kube.Kube`, not a sandbox.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
from collections.abc import Mapping

from sandbox.apiserver.patch import merge_patch
from slurmk8s.kube import RESOURCES, ApiError, Kube
from slurmk8s.permissions import allows, of_kind

_ids = itertools.count(1)



def claim_name(template: Mapping, pod: str) -> str:
    """The claim the StatefulSet controller makes from a volumeClaimTemplate for ``pod``."""
    return f"{template['metadata']['name']}-{pod}"

class FakeKube:
    """``granted``: what the client may do, as ``permissions.grants`` returns
    it; any other request is refused with 403, as RBAC refuses it. None: everything."""

    def __init__(self, granted: Mapping[str | None, set] | None = None):
        self.objects: dict[tuple[str, str, str], dict] = {}
        self.writes: list[tuple[str, str, str]] = []  # (verb, kind, name)
        self.fail: dict[tuple[str, str], ApiError] = {}  # (verb, kind) -> error to raise
        #: Every request as RBAC sees it: (verb, API group, resource[/subresource], namespace or None).
        self.requests: list[tuple[str, str, str, str | None]] = []
        self.granted = granted
        #: Claims that no provisioner binds: run_controllers leaves them Pending.
        self.pending: set[str] = set()

    # The operator's client interface.

    def _authorize(self, verb: str, kind: str, namespace: str | None, subresource: str | None = None) -> None:
        group, resource = of_kind(kind)
        resource += f"/{subresource}" if subresource else ""
        namespace = namespace if RESOURCES[kind].namespaced else None
        self.requests.append((verb, group, resource, namespace))
        if self.granted is not None and not allows(self.granted, verb, group, resource, namespace):
            where = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
            raise ApiError(verb.upper(), "/", 403, "Forbidden",
                           f'cannot {verb} resource "{resource}" in API group "{group}" {where}')

    def _key(self, kind: str, namespace: str | None, name: str) -> tuple[str, str, str]:
        return kind, namespace or "", name

    def _check(self, verb: str, kind: str) -> None:
        if (verb, kind) in self.fail:
            raise self.fail[(verb, kind)]

    def list(self, kind: str, namespace: str | None = None, selector: str | None = None,
             fields: str | None = None) -> list[dict]:
        self._authorize("list", kind, namespace)
        self._check("list", kind)
        want = dict(part.split("=", 1) for part in selector.split(",")) if selector else {}
        field_want = dict(part.split("=", 1) for part in fields.split(",")) if fields else {}

        def field(o: dict, path: str):
            for part in path.split("."):
                o = o.get(part) if isinstance(o, dict) else None
            return o

        out = []
        for (k, ns, _), o in sorted(self.objects.items()):
            labels = o["metadata"].get("labels") or {}
            if k == kind and (namespace is None or ns == namespace) and all(labels.get(a) == b for a, b in want.items()) \
                    and all(field(o, a) == b for a, b in field_want.items()):
                out.append(copy.deepcopy(o))
        return out

    def get(self, kind: str, namespace: str | None, name: str) -> dict | None:
        self._authorize("get", kind, namespace)
        self._check("get", kind)
        o = self.objects.get(self._key(kind, namespace, name))
        return copy.deepcopy(o) if o else None

    def _store(self, obj: dict, previous: dict | None) -> dict:
        obj = copy.deepcopy(obj)
        meta = obj["metadata"]
        meta["uid"] = (previous or {}).get("metadata", {}).get("uid") or f"uid-{next(_ids)}"
        meta["resourceVersion"] = str(next(_ids))
        meta["generation"] = (previous or {}).get("metadata", {}).get("generation", 0) + 1
        if previous and "status" in previous:
            obj["status"] = previous["status"]
        obj.setdefault("apiVersion", RESOURCES[obj["kind"]].api_version)
        self.objects[self._key(obj["kind"], meta.get("namespace"), meta["name"])] = obj
        return copy.deepcopy(obj)

    #: Kube's own: it builds the core/v1 Event and creates it (409 when the name exists).
    event = Kube.event

    def create(self, obj: Mapping) -> dict:
        self._authorize("create", obj["kind"], obj["metadata"].get("namespace"))
        self._check("create", obj["kind"])
        key = self._key(obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"])
        if key in self.objects:
            raise ApiError("POST", "/", 409, "AlreadyExists", f"{key} already exists")
        self.writes.append(("create", obj["kind"], obj["metadata"]["name"]))
        return self._store(dict(obj), None)

    def apply(self, obj: Mapping) -> dict:
        self._authorize("patch", obj["kind"], obj["metadata"].get("namespace"))  # server-side apply is a PATCH
        self._check("apply", obj["kind"])
        key = self._key(obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"])
        self.writes.append(("apply", obj["kind"], obj["metadata"]["name"]))
        return self._store(dict(obj), self.objects.get(key))

    def patch(self, kind: str, namespace: str | None, name: str, patch: Mapping, *,
              subresource: str | None = None) -> dict:
        self._authorize("patch", kind, namespace, subresource)
        self._check("patch", kind)
        key = self._key(kind, namespace, name)
        o = self.objects.get(key)
        if o is None:
            raise ApiError("PATCH", "/", 404, "NotFound", f"{key} not found")
        uid = (patch.get("metadata") or {}).get("uid")
        if uid and uid != o["metadata"]["uid"]:
            raise ApiError("PATCH", "/", 409, "Conflict", "Precondition failed: UID in precondition")
        self.writes.append(("patch" + (f"/{subresource}" if subresource else ""), kind, name))
        if subresource == "status":
            o["status"] = merge_patch(o.get("status") or {}, patch.get("status") or {})
        else:
            body = {k: v for k, v in patch.items() if k != "status"}
            self.objects[key] = merge_patch(o, body)
        self.objects[key]["metadata"]["resourceVersion"] = str(next(_ids))
        return copy.deepcopy(self.objects[key])

    def delete(self, kind: str, namespace: str | None, name: str, *, uid: str | None = None,
               propagation: str = "Background") -> bool:
        self._authorize("delete", kind, namespace)
        self._check("delete", kind)
        key = self._key(kind, namespace, name)
        o = self.objects.get(key)
        if o is None:
            return False
        if uid and o["metadata"]["uid"] != uid:
            raise ApiError("DELETE", "/", 409, "Conflict", "Precondition failed: UID in precondition")
        self.writes.append(("delete", kind, name))
        del self.objects[key]
        return True

    # Test helpers.

    def add(self, obj: dict) -> dict:
        return self._store(obj, None)

    def of_kind(self, kind: str) -> dict[str, dict]:
        return {k[2]: o for k, o in self.objects.items() if k[0] == kind}

    def run_controllers(self, *, ready: bool = True, pod_ips: Mapping[str, str] = {}) -> None:
        """One pass of the StatefulSet and Deployment controllers (and the kubelet's Ready)."""
        for (kind, ns, name), o in list(self.objects.items()):
            if kind == "StatefulSet":
                self._statefulset(ns, name, o, ready, pod_ips)
            elif kind == "Deployment":
                o["status"] = {"replicas": o["spec"]["replicas"], "availableReplicas": o["spec"]["replicas"]}
        for (kind, _, name), o in list(self.objects.items()):
            if kind == "PersistentVolumeClaim":
                o["status"] = {"phase": "Pending" if name in self.pending else "Bound"}

    def _statefulset(self, ns: str, name: str, sts: dict, ready: bool, pod_ips: Mapping[str, str]) -> None:
        spec = sts["spec"]
        template = spec["template"]
        revision = f"{name}-" + hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]
        replicas = spec.get("replicas", 1)
        on_delete = (spec.get("updateStrategy") or {}).get("type") == "OnDelete"
        pods = {o["metadata"]["name"]: o for (k, pns, _), o in self.objects.items() if k == "Pod" and pns == ns}
        for i in range(replicas):
            pod_name = f"{name}-{i}"
            pod = pods.get(pod_name)
            if pod is not None and (on_delete or pod["metadata"]["labels"].get("controller-revision-hash") == revision):
                continue
            if pod is not None:
                del self.objects[("Pod", ns, pod_name)]
            self.add({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod_name, "namespace": ns,
                             "labels": {**template["metadata"]["labels"], "controller-revision-hash": revision},
                             "annotations": dict(template["metadata"].get("annotations") or {})},
                "spec": copy.deepcopy(template["spec"]),
                "status": {"podIP": pod_ips.get(pod_name, "10.0.0.9"),
                           "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
            })
            for tpl in spec.get("volumeClaimTemplates", []):
                claim = claim_name(tpl, pod_name)
                if ("PersistentVolumeClaim", ns, claim) not in self.objects:
                    self.add({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                              "metadata": {"name": claim, "namespace": ns, "labels": tpl["metadata"]["labels"]},
                              "spec": tpl["spec"]})
        for pod_name in pods:
            base, _, ordinal = pod_name.rpartition("-")
            if base == name and ordinal.isdigit() and int(ordinal) >= replicas:
                del self.objects[("Pod", ns, pod_name)]
        mine = [o for (k, pns, n), o in self.objects.items()
                if k == "Pod" and pns == ns and n.rpartition("-")[0] == name]
        sts["status"] = {
            "replicas": len(mine),
            "readyReplicas": sum(1 for p in mine if p["status"]["conditions"][0]["status"] == "True"),
            "updateRevision": revision,
        }
