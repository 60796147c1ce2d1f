"""``APIServer``: the stand-in as an object with a life cycle. It runs its own
event loop in a background thread (HTTP routes, store, controllers), keeps its
state, token and certificates in a data directory, and writes kubeconfigs."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import os
import secrets
import ssl
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

import yaml
from aiohttp import web

from slurmk8s.log import get as get_logger

from . import audit, authn, policy, storage, timeutil, tls
from .api import API, CRD_STORAGE, Options
from .errors import APIError
from .resources import Registry
from .routes import Routes
from .store import Store, meta

log = get_logger("slurmk8s.apiserver")

BOOTSTRAP_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
#: The first address of the Service range, which Kubernetes gives the ``kubernetes`` Service.
KUBERNETES_SERVICE_IP = "10.96.0.1"
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def doc_without(doc: dict, annotation: str) -> dict:
    out = copy.deepcopy(doc)
    ann = (out.get("metadata") or {}).get("annotations") or {}
    ann.pop(annotation, None)
    return out


class StartupError(RuntimeError):
    """The stand-in could not start; the message says why and what to do."""


def load_crd_documents(paths: Iterable[Path]) -> list[dict]:
    """CustomResourceDefinitions from files or directories of YAML files."""
    docs: list[dict] = []
    for p in paths:
        p = Path(p)
        files = sorted(list(p.glob("*.yaml")) + list(p.glob("*.yml")) + list(p.glob("*.json"))) if p.is_dir() else [p]
        if not files:
            raise StartupError(f"no CRD files (*.yaml, *.yml, *.json) in {p}")
        for f in files:
            try:
                for doc in yaml.safe_load_all(f.read_text()):
                    if not doc:
                        continue
                    if doc.get("kind") != "CustomResourceDefinition":
                        raise StartupError(f"{f}: expected only CustomResourceDefinitions, found kind {doc.get('kind')!r}")
                    docs.append(doc)
            except (OSError, yaml.YAMLError) as e:
                raise StartupError(f"cannot read CRDs from {f}: {e}") from e
    return docs


class APIServer:
    """A Kubernetes API server stand-in on ``host:port`` (HTTPS, bearer token).

    >>> with APIServer(Path("/tmp/k")) as srv:          # doctest: +SKIP
    ...     srv.write_kubeconfig(Path("/tmp/k/kubeconfig"))
    """

    def __init__(
        self,
        data_dir: Path,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        history_limit: int = 10000,
        tls_sans: Sequence[str] = (),
        crds: Sequence[Path] = (),
        controllers: bool = True,
        bookmark_interval: float = 30.0,
        advertise_address: str | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.host = host
        self.port = port
        #: The address pods reach the API server at (kube-apiserver's
        #: --advertise-address): listened on as well, in the certificate, and
        #: the endpoint of the ``kubernetes`` Service in ``default``.
        self.advertise_address = advertise_address
        self.history_limit = history_limit
        self.tls_sans = tuple(tls_sans)
        self.crd_files = tuple(Path(p) for p in crds)
        self.run_controllers = controllers
        self.bookmark_interval = bookmark_interval
        self.token = ""
        self.kubelet_token = ""
        self.authenticator: authn.Authenticator | None = None
        self.pki: tls.Pki | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._stop: asyncio.Event | None = None
        self.api: API | None = None

    # --- public -----------------------------------------------------------------

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "", "::") else self.host
        if ":" in host:
            host = f"[{host}]"
        return f"https://{host}:{self.port}"

    @property
    def ca_path(self) -> Path:
        assert self.pki is not None, "start() the server first"
        return self.pki.ca_cert

    @property
    def ca_pem(self) -> str:
        return self.ca_path.read_text()

    def start(self) -> APIServer:
        if self._thread is not None:
            raise RuntimeError("this APIServer is already started")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.token = self._load_token()
        self._token_rows, self.kubelet_token = authn.ensure_token_file(self.data_dir / "tokens.csv", self.token)
        names = ["127.0.0.1", "localhost", *self.tls_sans]
        for address in (self.host, self.advertise_address):
            if address and address not in ("0.0.0.0", "", "::") and address not in names:
                names.append(address)
        self.pki = tls.ensure(self.data_dir / "pki", names)
        self._sa_key = authn.load_or_create_key(self.data_dir / "pki" / "sa.key")
        self._crd_docs = load_crd_documents(self.crd_files)
        self._ready.clear()
        self._thread = threading.Thread(target=self._run, name="slurmk8s-apiserver", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join(timeout=5)
            self._thread = None
            err = self._error
            self._error = None
            if isinstance(err, OSError):
                raise StartupError(f"cannot listen on {self.host}:{self.port}: {err.strerror or err}; "
                                   "pick another --port (or 0 for any free port)") from err
            raise StartupError(f"the Kubernetes stand-in failed to start: {err}") from err
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(stop.set)
        self._thread.join(timeout=30)
        self._thread = None

    def wait(self) -> None:
        """Block until the server stops (for the foreground process)."""
        if self._thread is not None:
            while self._thread.is_alive():
                self._thread.join(timeout=0.5)

    def __enter__(self) -> APIServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def kubeconfig(self, namespace: str = "default", identity: str = "admin") -> dict:
        """A kubeconfig for ``identity``: ``admin`` (``sandbox-admin``, group
        ``system:masters``) or ``kubelet`` (``system:node:sandbox``, group ``system:nodes``)."""
        tokens = {"admin": self.token, "kubelet": self.kubelet_token}
        if identity not in tokens:
            raise ValueError(f"identity must be one of {', '.join(tokens)}, not {identity!r}")
        ca = base64.b64encode(self.ca_pem.encode()).decode()
        name = "slurmk8s-sandbox"
        user = name if identity == "admin" else f"{name}-{identity}"
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": name, "cluster": {"server": self.url, "certificate-authority-data": ca}}],
            "users": [{"name": user, "user": {"token": tokens[identity]}}],
            "contexts": [{"name": user, "context": {"cluster": name, "user": user, "namespace": namespace}}],
            "current-context": user,
            "preferences": {},
        }

    def write_kubeconfig(self, path: Path, namespace: str = "default", identity: str = "admin") -> Path:
        if not self.port:
            raise RuntimeError("start() the server before writing a kubeconfig: its port is not known yet")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            yaml.safe_dump(self.kubeconfig(namespace, identity), f, sort_keys=False)
        os.replace(tmp, path)
        return path

    @property
    def audit_path(self) -> Path:
        return self.data_dir / "audit.log"

    def issue_token(self, namespace: str, service_account: str, audiences: list[str] | None = None,
                    expiration: int = authn.DEFAULT_EXPIRATION) -> str:
        """A ServiceAccount token, as TokenRequest gives (for tools and tests)."""
        def issue(api: API) -> str:
            sa = api.raw(api.resource("", "v1", "serviceaccounts"), namespace, service_account)
            if sa is None:
                raise APIError(404, f'serviceaccounts "{service_account}" not found in namespace {namespace}', "NotFound")
            assert self.authenticator is not None
            return self.authenticator.issue(namespace, service_account, meta(sa)["uid"], audiences, expiration)[0]
        return self.call(issue)

    def call(self, fn, *args, timeout: float = 30):
        """Run ``fn(api, *args)`` on the server's loop and return its result (for tools and tests)."""
        if self._loop is None or self.api is None:
            raise RuntimeError("the server is not running")

        async def run():
            return fn(self.api, *args)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    # --- internals ----------------------------------------------------------------

    def _load_token(self) -> str:
        path = self.data_dir / "token"
        if path.exists():
            token = path.read_text().strip()
            if token:
                return token
        token = secrets.token_urlsafe(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        return token

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._main())
        except BaseException as e:  # reported to start()
            if not self._ready.is_set():
                self._error = e
            else:
                log.exception("the Kubernetes stand-in stopped on an error")
        finally:
            self._ready.set()
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()
                self._loop = None

    async def _main(self) -> None:
        from .controllers import Manager

        self._stop = asyncio.Event()
        store = Store(self.data_dir / "store.sqlite", self.history_limit)
        registry = Registry()
        for crd in store.list(CRD_STORAGE):
            if not meta(crd).get("deletionTimestamp") or meta(crd).get("finalizers"):
                registry.set_crd(crd)
        api = API(store, registry, self.pki.ca_pem if self.pki else "")
        self.api = api
        self._bootstrap(api)
        self.authenticator = authn.Authenticator(self._token_rows, self._sa_key, service_account=self._sa_uid, pod=self._pod_state)
        audit_log = audit.AuditLog(self.audit_path)
        routes = Routes(api, self.authenticator, lambda: f"{self.host}:{self.port}", self.bookmark_interval, audit_log,
                        tls.ensure_kubelet_client(self.data_dir / "pki"))
        runner = web.AppRunner(routes.app(), handle_signals=False, shutdown_timeout=2.0, handler_cancellation=True, access_log=None)
        await runner.setup()
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        assert self.pki is not None
        ctx.load_cert_chain(str(self.pki.server_cert), str(self.pki.server_key))
        site = web.TCPSite(runner, self.host, self.port, ssl_context=ctx, reuse_address=True)
        manager = Manager(api) if self.run_controllers else None
        try:
            await site.start()
            self.port = runner.addresses[0][1]
            if self.advertise_address and self.advertise_address != self.host:
                await web.TCPSite(runner, self.advertise_address, self.port, ssl_context=ctx, reuse_address=True).start()
            self._kubernetes_service(api)
            if manager is not None:
                manager.start()
            log.info("Kubernetes stand-in listening", url=self.url, data_dir=str(self.data_dir), resource_version=store.rv)
            self._ready.set()
            await self._stop.wait()
        finally:
            if manager is not None:
                await manager.stop()
            for w in list(store.watchers):
                w.close()
            await runner.cleanup()
            audit_log.close()
            store.close()
            self.api = None

    def _kubernetes_service(self, api: API) -> None:
        """The ``kubernetes`` Service in ``default`` with this server as its endpoint, as
        kube-apiserver keeps it; kubelets give pods KUBERNETES_SERVICE_HOST/PORT from it."""
        if not self.advertise_address:
            return
        svc_rt, ep_rt = api.resource("", "v1", "services"), api.resource("", "v1", "endpoints")
        labels = {"component": "apiserver", "provider": "kubernetes"}
        opts = Options(field_manager="slurmk8s-apiserver")
        if api.raw(svc_rt, "default", "kubernetes") is None:
            api.create(svc_rt, "default", {"metadata": {"name": "kubernetes", "namespace": "default", "labels": labels},
                                           "spec": {"type": "ClusterIP", "clusterIP": str(KUBERNETES_SERVICE_IP),
                                                    "ports": [{"name": "https", "port": 443, "protocol": "TCP",
                                                               "targetPort": self.port}]}}, opts)
        endpoints = {"metadata": {"name": "kubernetes", "namespace": "default", "labels": labels},
                     "subsets": [{"addresses": [{"ip": self.advertise_address}],
                                  "ports": [{"name": "https", "port": self.port, "protocol": "TCP"}]}]}
        current = api.raw(ep_rt, "default", "kubernetes")
        if current is None:
            api.create(ep_rt, "default", endpoints, opts)
        elif current.get("subsets") != endpoints["subsets"]:
            endpoints["metadata"]["resourceVersion"] = meta(current)["resourceVersion"]
            api.update(ep_rt, "default", "kubernetes", endpoints, opts)

    def _sa_uid(self, namespace: str, name: str) -> str | None:
        api = self.api
        if api is None:
            return None
        sa = api.store.get(("", "serviceaccounts"), namespace, name)
        return meta(sa).get("uid") if sa is not None else None

    def _pod_state(self, namespace: str, name: str) -> tuple[str, float | None] | None:
        api = self.api
        if api is None:
            return None
        pod = api.store.get(("", "pods"), namespace, name)
        if pod is None:
            return None
        deleted = timeutil.parse(meta(pod).get("deletionTimestamp") or "")
        return meta(pod).get("uid"), deleted.timestamp() if deleted else None

    def _bootstrap(self, api: API) -> None:
        ns_rt = api.resource("", "v1", "namespaces")
        for ns in BOOTSTRAP_NAMESPACES:
            if api.raw(ns_rt, None, ns) is None:
                api.create(ns_rt, None, {"metadata": {"name": ns}})
        self._bootstrap_rbac(api)
        sc_rt = api.resource("storage.k8s.io", "v1", "storageclasses")
        for sc in storage.bootstrap_classes():  # as a cloud's add-on manager: made again when missing
            if api.raw(sc_rt, None, sc["metadata"]["name"]) is None:
                api.create(sc_rt, None, sc, Options(field_manager="slurmk8s-apiserver"))
        crd_rt = api.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
        for doc in self._crd_docs:
            name = (doc.get("metadata") or {}).get("name", "")
            # as `kubectl create --save-config` does, so a later `kubectl apply` of the same files merges cleanly
            doc = copy.deepcopy(doc)
            annotations = doc.setdefault("metadata", {}).setdefault("annotations", {}) or {}
            doc["metadata"]["annotations"] = annotations
            annotations[LAST_APPLIED] = json.dumps(doc_without(doc, LAST_APPLIED), separators=(",", ":"), sort_keys=True) + "\n"
            try:
                current = api.raw(crd_rt, None, name)
                if current is None:
                    api.create(crd_rt, None, doc, Options(field_manager="slurmk8s-apiserver"))
                else:
                    body = dict(doc)
                    body["metadata"] = dict(doc.get("metadata") or {}, resourceVersion=meta(current)["resourceVersion"])
                    api.update(crd_rt, None, name, body, Options(field_manager="slurmk8s-apiserver"))
            except APIError as e:
                raise StartupError(f"CRD {name!r} was refused: {e.message}") from e

    def _bootstrap_rbac(self, api: API) -> None:
        """Creates the bootstrap ClusterRoles and ClusterRoleBindings, and brings
        back what is missing from them on restart (as kube-apiserver's
        reconciliation: objects annotated ``autoupdate: "false"`` are left alone)."""
        opts = Options(field_manager="slurmk8s-apiserver")
        for plural, docs in (("clusterroles", policy.cluster_roles()), ("clusterrolebindings", policy.cluster_role_bindings())):
            rt = api.resource("rbac.authorization.k8s.io", "v1", plural)
            for doc in docs:
                current = api.raw(rt, None, doc["metadata"]["name"])
                body = policy.reconcile(current, doc)
                if body is None:
                    continue
                if current is None:
                    api.create(rt, None, body, opts)
                else:
                    api.update(rt, None, doc["metadata"]["name"], body, opts, old=current)
