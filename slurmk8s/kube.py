"""A thin client for the Kubernetes REST API, used by the operator (beside kopf,
which watches and patches SlurmClusters itself) and by the bridge.

Plain HTTP on the documented paths, so it works against any API server
(a real one, or the sandbox's stand-in) without discovery. Credentials come
from a kubeconfig or the pod's service account, through the ``kubernetes``
package's loaders (token refresh, exec plugins). What it uses:

- ``GET`` (list with ``labelSelector``, following ``continue``; watch from a
  resourceVersion, for the bridge's informers), ``POST``,
  ``DELETE`` with ``propagationPolicy`` and a uid precondition;
- ``PATCH`` as server-side apply (``application/apply-patch+yaml``,
  ``force=true``) for the objects the operator renders, falling back to a JSON
  merge patch when the server does not take apply patches (415);
- ``PATCH`` as JSON merge patch for pod annotations and the status subresource;
- ``PUT`` with the resourceVersion read, for the leader election's Lease.

Every write carries one field manager: ``slurmk8s-operator`` by default
(the bridge passes its own). Every failure is an :class:`ApiError`: the
server's refusal, or no answer (``status`` 0). A busy server (429, or a 5xx
with ``Retry-After``: API Priority and Fairness) is asked again after what
it asks for, a few times within the request's timeout
(:func:`slurmk8s.backoff.patiently`); past that its answer is the error.
"""

from __future__ import annotations

import builtins
import datetime
import json
import secrets
import ssl
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import urllib3

from slurmk8s.api.cluster import API_VERSION
from slurmk8s.api.cluster import PLURAL as CLUSTER_PLURAL
from slurmk8s.api.lending import PLURAL as POLICY_PLURAL
from slurmk8s.backoff import busy, patiently, retry_after
from slurmk8s.render.names import FIELD_MANAGER

__all__ = ["Kube", "ApiError", "RESOURCES", "Resource", "load_configuration"]


@dataclass(frozen=True)
class Resource:
    api_version: str
    plural: str
    namespaced: bool = True

    @property
    def prefix(self) -> str:
        return "api/v1" if self.api_version == "v1" else f"apis/{self.api_version}"


RESOURCES: dict[str, Resource] = {
    "ConfigMap": Resource("v1", "configmaps"),
    "Secret": Resource("v1", "secrets"),
    "Service": Resource("v1", "services"),
    "PersistentVolumeClaim": Resource("v1", "persistentvolumeclaims"),
    "Pod": Resource("v1", "pods"),
    "Node": Resource("v1", "nodes", namespaced=False),
    "StatefulSet": Resource("apps/v1", "statefulsets"),
    "Deployment": Resource("apps/v1", "deployments"),
    "PodDisruptionBudget": Resource("policy/v1", "poddisruptionbudgets"),
    "NetworkPolicy": Resource("networking.k8s.io/v1", "networkpolicies"),
    "SlurmCluster": Resource(API_VERSION, CLUSTER_PLURAL),
    "NodeLendingPolicy": Resource(API_VERSION, POLICY_PLURAL),
    "Event": Resource("v1", "events"),
    "Lease": Resource("coordination.k8s.io/v1", "leases"),
    "ValidatingWebhookConfiguration": Resource("admissionregistration.k8s.io/v1", "validatingwebhookconfigurations",
                                               namespaced=False),
}


#: What to do about a 403: the chart grants exactly the declared permissions, in the watched namespaces.
FORBIDDEN_HINT = ("RBAC refused it: installed with the Helm chart, the operator and the bridge may act only in "
                  "their watched namespaces (watchNamespaces, else the release namespace): list this one there; "
                  "slurmk8s/operator/permissions.py and slurmk8s/bridge/permissions.py say what each needs")


class ApiError(RuntimeError):
    """The API server refused a request; ``status`` is the HTTP code, ``reason``
    its Status reason. ``status`` 0: no answer (connection, timeout)."""

    def __init__(self, method: str, path: str, status: int, reason: str, message: str):
        self.method, self.path, self.status, self.reason, self.message = method, path, status, reason, message
        hint = f" ({FORBIDDEN_HINT})" if status == 403 else ""
        super().__init__(f"{method} {path}: {status} {reason}: {message}{hint}")

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def unreachable(self) -> bool:
        return self.status == 0


def load_configuration(kubeconfig: str | None = None):
    """A ``kubernetes.client.Configuration``: from ``kubeconfig`` when given,
    else the pod's service account when in a cluster, else the default
    kubeconfig (``$KUBECONFIG`` or ``~/.kube/config``)."""
    import os

    from kubernetes import client, config

    cfg = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=cfg)
    else:
        config.load_kube_config(client_configuration=cfg)
    return cfg


class Kube:
    def __init__(self, configuration: Any, *, timeout: float = 30, field_manager: str = FIELD_MANAGER):
        self.configuration = configuration
        #: Every write's fieldManager, and the User-Agent.
        self.field_manager = field_manager
        self.server = configuration.host.rstrip("/")
        self.timeout = timeout
        kwargs: dict[str, Any] = {"timeout": urllib3.Timeout(total=timeout), "retries": False}
        if self.server.startswith("https"):
            if configuration.verify_ssl:
                kwargs["cert_reqs"] = ssl.CERT_REQUIRED
                if configuration.ssl_ca_cert:
                    kwargs["ca_certs"] = configuration.ssl_ca_cert
            else:
                kwargs["cert_reqs"] = ssl.CERT_NONE
            if configuration.cert_file:
                kwargs["cert_file"] = configuration.cert_file
                kwargs["key_file"] = configuration.key_file
        # Room for the long-lived watch streams (slurmk8s/bridge/view.py: 2 + 2 per namespace) beside the requests.
        self._http = urllib3.PoolManager(num_pools=4, maxsize=32, **kwargs)

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | None = None, **kwargs: Any) -> Kube:
        return cls(load_configuration(kubeconfig), **kwargs)

    def bearer_token(self) -> str | None:
        """The current token (refreshed by the loader's hook when it expires)."""
        # auth_settings() runs the loader's refresh hook; the key's name differs between client versions.
        value = (self.configuration.auth_settings().get("BearerToken") or {}).get("value")
        if not value:
            return None
        return value.split(" ", 1)[1] if value.lower().startswith("bearer ") else value

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": self.field_manager}
        token = self.bearer_token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        elif self.configuration.username:
            headers.update(urllib3.make_headers(
                basic_auth=f"{self.configuration.username}:{self.configuration.password}"))
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    def request(self, method: str, path: str, *, query: Iterable[tuple[str, str]] = (), body: Any = None,
                content_type: str = "application/json", timeout: float | None = None) -> dict:
        """One request, answered within ``timeout`` seconds (default the
        client's), busy answers and the waits they ask for included."""
        q = list(query)
        url = f"{self.server}/{path}" + (f"?{urlencode(q)}" if q else "")
        data = None if body is None else json.dumps(body).encode()
        seconds = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + seconds
        headers = self._headers(content_type if data else None)

        def send() -> Any:
            left = deadline - time.monotonic()
            if left <= 0:
                raise urllib3.exceptions.TimeoutError(f"no answer within {seconds:g} s")
            return self._http.request(method, url, body=data, headers=headers, timeout=urllib3.Timeout(total=left))

        def wait_of(resp: Any) -> float | None:
            header = resp.headers.get("Retry-After")
            return retry_after(header, cap=seconds / 3) if busy(resp.status, header) else None

        try:
            resp = patiently(send, wait_of, budget=seconds / 2)
        except urllib3.exceptions.HTTPError as exc:  # no answer: the connection, or the time ran out
            raise ApiError(method, "/" + path, 0, "Unreachable", str(exc) or type(exc).__name__) from None
        payload: dict = {}
        if resp.data:
            try:
                payload = json.loads(resp.data)
            except ValueError:
                payload = {"message": resp.data[:500].decode(errors="replace")}
        if resp.status >= 400:
            raise ApiError(method, "/" + path, resp.status, payload.get("reason") or resp.reason or "",
                           payload.get("message") or "")
        return payload

    @staticmethod
    def path(kind: str, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        try:
            r = RESOURCES[kind]
        except KeyError:
            raise ValueError(f"the operator does not handle kind {kind!r}") from None
        parts = [r.prefix]
        if r.namespaced and namespace:
            parts += ["namespaces", quote(namespace, safe="")]
        parts.append(r.plural)
        if name:
            parts.append(quote(name, safe=""))
        if subresource:
            parts.append(subresource)
        return "/".join(parts)

    # Reads.

    def list(self, kind: str, namespace: str | None = None, selector: str | None = None,
             fields: str | None = None) -> list[dict]:
        """Every object of ``kind`` (in ``namespace``, matching the label
        ``selector`` and the field selector ``fields``), each with kind and apiVersion."""
        return self.list_versioned(kind, namespace, selector, fields)[0]

    def list_versioned(self, kind: str, namespace: str | None = None,
                       selector: str | None = None, fields: str | None = None) -> tuple[builtins.list[dict], str]:
        """:meth:`list`, and the list's resourceVersion (its first page's): a
        watch from it sees every change after the list (what an informer needs)."""
        items: list[dict] = []
        token = ""
        version = ""
        while True:
            query = [("limit", "500")]
            if selector:
                query.append(("labelSelector", selector))
            if fields:
                query.append(("fieldSelector", fields))
            if token:
                query.append(("continue", token))
            page = self.request("GET", self.path(kind, namespace), query=query)
            for item in page.get("items") or []:
                item.setdefault("kind", kind)
                item.setdefault("apiVersion", RESOURCES[kind].api_version)
                items.append(item)
            version = version or (page.get("metadata") or {}).get("resourceVersion") or ""
            token = (page.get("metadata") or {}).get("continue") or ""
            if not token:
                return items, version

    def watch(self, kind: str, namespace: str | None, resource_version: str, *,
              timeout_seconds: int = 300) -> Iterator[dict]:
        """The watch events (``{"type", "object"}``, as the API sends them) of
        ``kind`` after ``resource_version``, with bookmarks, until the server
        ends the stream after ``timeout_seconds``. Every read is bounded: a
        stream silent for ``timeout_seconds`` plus a margin is a dead
        connection (urllib3 raises). A 410 for the request itself raises
        :class:`ApiError`; one the server sends in the stream is an ``ERROR``
        event, left to the caller."""
        query = [("watch", "true"), ("allowWatchBookmarks", "true"),
                 ("timeoutSeconds", str(int(timeout_seconds)))]
        if resource_version:
            query.append(("resourceVersion", resource_version))
        path = self.path(kind, namespace)
        url = f"{self.server}/{path}?{urlencode(query)}"
        resp = self._http.request("GET", url, headers=self._headers(None), preload_content=False,
                                  timeout=urllib3.Timeout(connect=min(self.timeout, 10.0),
                                                          read=timeout_seconds + 30))
        done = False
        try:
            if resp.status >= 400:
                data = resp.read()
                try:
                    payload = json.loads(data) if data else {}
                except ValueError:
                    payload = {"message": data[:500].decode(errors="replace")}
                raise ApiError("GET", "/" + path, resp.status, payload.get("reason") or resp.reason or "",
                               payload.get("message") or "")
            pending = b""
            for chunk in resp.stream(64 * 1024, decode_content=True):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield json.loads(line)
            if pending.strip():
                yield json.loads(pending)
            done = True
        finally:
            if not done:  # left early: the rest of the stream must not reach the next request
                resp.close()
            resp.release_conn()

    def get(self, kind: str, namespace: str | None, name: str, *, timeout: float | None = None) -> dict | None:
        try:
            obj = self.request("GET", self.path(kind, namespace, name), timeout=timeout)
        except ApiError as exc:
            if exc.not_found:
                return None
            raise
        obj.setdefault("kind", kind)
        obj.setdefault("apiVersion", RESOURCES[kind].api_version)
        return obj

    # Writes, all as ``field_manager``.

    def create(self, obj: Mapping, *, timeout: float | None = None) -> dict:
        meta = obj["metadata"]
        return self.request("POST", self.path(obj["kind"], meta.get("namespace")),
                            query=[("fieldManager", self.field_manager)], body=obj, timeout=timeout)

    def apply(self, obj: Mapping) -> dict:
        """Server-side apply of ``obj`` (creates it when missing)."""
        meta = obj["metadata"]
        path = self.path(obj["kind"], meta.get("namespace"), meta["name"])
        try:
            return self.request("PATCH", path, query=[("fieldManager", self.field_manager), ("force", "true")],
                                body=obj, content_type="application/apply-patch+yaml")
        except ApiError as exc:
            if exc.status != 415:
                raise
        # A server without server-side apply: merge patch, or create.
        try:
            return self.request("PATCH", path, query=[("fieldManager", self.field_manager)], body=obj,
                                content_type="application/merge-patch+json")
        except ApiError as exc:
            if not exc.not_found:
                raise
        return self.create(obj)

    def replace(self, obj: Mapping, *, timeout: float | None = None) -> dict:
        """``PUT`` of the whole object; with its metadata.resourceVersion, a
        write that someone else's came between is refused with 409."""
        meta = obj["metadata"]
        return self.request("PUT", self.path(obj["kind"], meta.get("namespace"), meta["name"]),
                            query=[("fieldManager", self.field_manager)], body=obj, timeout=timeout)

    def patch(self, kind: str, namespace: str | None, name: str, patch: Mapping, *,
              subresource: str | None = None) -> dict:
        """JSON merge patch (``subresource``: e.g. ``status``)."""
        return self.request("PATCH", self.path(kind, namespace, name, subresource),
                            query=[("fieldManager", self.field_manager)], body=patch,
                            content_type="application/merge-patch+json")

    def delete(self, kind: str, namespace: str | None, name: str, *, uid: str | None = None,
               propagation: str = "Background") -> bool:
        """Delete; False when it was gone already. With ``uid``, only that very object."""
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            self.request("DELETE", self.path(kind, namespace, name), body=body)
        except ApiError as exc:
            if exc.not_found:
                return False
            raise
        return True

    def event(self, involved: Mapping, type_: str, reason: str, message: str, *, component: str,
              name: str | None = None) -> dict:
        """Record a core/v1 Event about ``involved`` (an object as the API
        returns it: kind, apiVersion, metadata). Events of cluster-scoped
        objects (Nodes) go to the ``default`` namespace, as the kubelet's do.
        ``name``: the Event's name, for an Event that must exist only once
        (creating it again is refused with 409); by default a fresh one."""
        meta = involved["metadata"]
        namespace = meta.get("namespace") or "default"
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        ref = {"kind": involved["kind"], "apiVersion": involved.get("apiVersion", "v1"), "name": meta["name"]}
        for key in ("namespace", "uid", "resourceVersion"):
            if meta.get(key):
                ref[key] = meta[key]
        return self.create({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name or f"{meta['name']}.{secrets.token_hex(8)}", "namespace": namespace},
            "involvedObject": ref, "type": type_, "reason": reason, "message": message[:1024],
            "source": {"component": component}, "reportingComponent": component,
            "firstTimestamp": now, "lastTimestamp": now, "eventTime": None, "count": 1,
        })
