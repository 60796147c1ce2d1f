"""The Kubernetes REST protocol over aiohttp: paths, verbs, content negotiation,
watch streams, authentication (:mod:`.authn`), impersonation, RBAC
authorization (:mod:`.rbac`), the review APIs and the audit log. Thin: the
semantics are in :mod:`.api`.

Over 500 lines because it is the one router from every URL of the Kubernetes
API (resources, subresources, watch, discovery, openapi, reviews,
TokenRequest) to ``API``, with authentication, impersonation, authorization
and the audit line around each request, as kube-apiserver's handler chain.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from slurmk8s.log import get as get_logger

from . import audit, authn, discovery, podproxy, protobuf, rbac, tables, timeutil, webhooks
from .api import API, DeleteOptions, Options
from .errors import APIError, FieldError, bad_request, gone, invalid, not_found
from .resources import REVIEWS, ResourceType
from .selectors import parse_field_selector, parse_label_selector, selectable_fields
from .store import TooOld, meta

log = get_logger("slurmk8s.apiserver")
#: kube-apiserver's --max-request-bytes default: a larger body is refused (413) before it is read.
MAX_REQUEST_BYTES = 3 * 1024 * 1024
DEFAULT_WATCH_TIMEOUT = 1800


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), default=str).encode()


def json_response(obj: Any, status: int = 200, warnings: list[str] | None = None) -> web.Response:
    resp = web.Response(body=dumps(obj), status=status, content_type="application/json")
    for w in warnings or []:
        # A warning may quote a field name from the request: control characters
        # in it would break the header (aiohttp drops the connection), and
        # non-ASCII has no place in one. Both are escaped.
        w = "".join(c if " " <= c <= "~" else f"\\u{ord(c):04x}" for c in w)
        resp.headers.add("Warning", '299 - "' + w.replace("\\", "\\\\").replace('"', '\\"') + '"')
    return resp


@dataclass
class Target:
    group: str
    version: str
    rt: ResourceType
    namespace: str | None
    name: str | None
    sub: str | None
    watch_path: bool


@dataclass
class Accept:
    table: bool = False
    metadata: bool = False


def parse_accept(header: str) -> Accept:
    out = Accept()
    if not header:
        return out
    json_ok = False
    for part in header.split(","):
        fields = [f.strip() for f in part.split(";")]
        mtype = fields[0].lower()
        params = dict(f.split("=", 1) for f in fields[1:] if "=" in f)
        if mtype in ("application/json", "*/*", "application/*", "application/yaml"):
            json_ok = True
            as_ = params.get("as")
            if as_ == "Table" and not out.metadata:
                out.table = True
                return out
            if as_ in ("PartialObjectMetadata", "PartialObjectMetadataList"):
                out.metadata = True
                return out
            if as_ is None:
                return out
    if not json_ok:
        raise APIError(406, f"only application/json is served (asked for {header!r})", "NotAcceptable")
    return out


_key = getattr(web, "RequestKey", None)  # aiohttp >= 3.12; plain strings before
USER_KEY: Any = _key("user", rbac.User) if _key else "user"
AUDIT_KEY: Any = _key("audit", object) if _key else "audit"  # writes the request's audit line once
AUDIT_ANNOTATIONS: Any = _key("audit-annotations", dict) if _key else "audit-annotations"  # admission's, for that line
PUBLIC_PATHS = ("/healthz", "/livez", "/readyz", "/version")
RBAC_GROUP = "rbac.authorization.k8s.io"
RBAC_STORAGES = tuple((RBAC_GROUP, p) for p in ("roles", "clusterroles", "rolebindings", "clusterrolebindings"))


class Authorizer:
    """RBAC decisions over the objects in the store (the policy is re-indexed
    when the store has changed since the last decision)."""

    def __init__(self, api: API) -> None:
        self.api = api
        self._policy: rbac.Policy | None = None
        self._rv = -1

    def policy(self) -> rbac.Policy:
        store = self.api.store
        if self._policy is None or self._rv != store.rv:
            self._policy = rbac.Policy(*(store.list(s) for s in RBAC_STORAGES))
            self._rv = store.rv
        return self._policy

    def authorize(self, user: rbac.User, attrs: rbac.Attributes) -> tuple[bool, str]:
        return rbac.authorize(user, attrs, policy=self.policy())

    def rules_for(self, user: rbac.User, namespace: str) -> tuple[list[dict], list[dict]]:
        return rbac.rules_for(user, namespace, policy=self.policy())

    def require(self, user: rbac.User, attrs: rbac.Attributes) -> None:
        allowed, reason = self.authorize(user, attrs)
        if not allowed:
            err = forbidden(user, attrs, reason)
            err.attrs = attrs  # type: ignore[attr-defined]  # what the audit line records
            raise err


def forbidden(user: rbac.User, attrs: rbac.Attributes, reason: str = "") -> APIError:
    return APIError(403, rbac.forbidden_message(user, attrs, reason), "Forbidden", rbac.forbidden_details(attrs))


class Routes:
    def __init__(self, api: API, authenticator: authn.Authenticator, server_address: Callable[[], str],
                 bookmark_interval: float = 30.0, audit_log: audit.AuditLog | None = None,
                 kubelet_client: tuple[Path, Path] | None = None) -> None:
        self.api = api
        self.podproxy = podproxy.PodProxy(api, kubelet_client)
        self.authn = authenticator
        self.authz = Authorizer(api)
        self.server_address = server_address
        self.bookmark_interval = bookmark_interval
        self.audit = audit_log

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware], client_max_size=MAX_REQUEST_BYTES)
        app.router.add_route("*", "/{tail:.*}", self.dispatch)
        return app

    def _authenticate(self, request: web.Request) -> rbac.User:
        header = request.headers.get("Authorization", "")
        if not header and request.path.rstrip("/") in PUBLIC_PATHS:
            return rbac.User(rbac.ANONYMOUS, (rbac.UNAUTHENTICATED,))
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            try:
                return self.authn.authenticate(value)
            except authn.TokenError as e:
                log.info("token refused", path=request.path, why=str(e))
        raise APIError(401, "Unauthorized: send 'Authorization: Bearer <token>' with a token this server knows: the sandbox "
                       "kubeconfig's, one from tokens.csv in its data directory, or a ServiceAccount token from TokenRequest "
                       "(one that has not expired, whose ServiceAccount and Pod still exist)", "Unauthorized")

    def _impersonate(self, request: web.Request, user: rbac.User) -> tuple[rbac.User, rbac.User | None]:
        """The user the request acts as, and who asked (if impersonating)."""
        h = request.headers
        name = h.get("Impersonate-User")
        groups = h.getall("Impersonate-Group", [])
        uid = h.get("Impersonate-Uid")
        extra_keys = [k for k in h if k.lower().startswith("impersonate-extra-")]
        if name is None:
            if groups or uid or extra_keys:
                raise bad_request("requested impersonation of groups, a uid or extra fields without impersonating a user "
                                  "(add Impersonate-User, kubectl --as)")
            return user, None
        sa = rbac.split_service_account(name)
        if sa is not None:
            self.authz.require(user, rbac.Attributes("impersonate", namespace=sa[0], resource="serviceaccounts", name=sa[1]))
            all_groups = list(rbac.service_account_groups(sa[0])[:2])
        else:
            self.authz.require(user, rbac.Attributes("impersonate", resource="users", name=name))
            all_groups = []
        for g in groups:
            self.authz.require(user, rbac.Attributes("impersonate", resource="groups", name=g))
            if g not in all_groups:
                all_groups.append(g)
        if uid is not None:
            self.authz.require(user, rbac.Attributes("impersonate", api_group="authentication.k8s.io", resource="uids", name=uid))
        extra: dict[str, tuple[str, ...]] = {}
        for k in extra_keys:
            key = k[len("impersonate-extra-"):].lower()
            for v in h.getall(k):
                self.authz.require(user, rbac.Attributes("impersonate", api_group="authentication.k8s.io",
                                                         resource="userextras", subresource=key, name=v))
            extra[key] = tuple(h.getall(k))
        if name != rbac.ANONYMOUS and not any(g in (rbac.AUTHENTICATED, rbac.UNAUTHENTICATED) for g in all_groups):
            all_groups.append(rbac.AUTHENTICATED)
        return rbac.User(name, tuple(all_groups), uid or "", extra), user

    def _audit_once(self, user: rbac.User | None, attrs: rbac.Attributes | None, by: rbac.User | None, path: str,
                    annotations: dict[str, str] | None = None):
        """The request's audit line, written once; ``annotations`` (admission's, as Pod
        Security's audit mode) are those of the request when it is written."""
        written = False

        def write(code: int) -> None:
            nonlocal written
            if written or self.audit is None:
                return
            written = True
            try:
                self.audit.write(audit.entry(user, attrs, code, by, path=path, annotations=annotations))
            except OSError as e:  # a full disk must not stop the API
                log.warning("cannot write the audit log", error=str(e))

        return write

    @web.middleware
    async def _middleware(self, request: web.Request, handler):
        user: rbac.User | None = None
        by: rbac.User | None = None
        attrs: rbac.Attributes | None = None
        code = 500
        try:
            try:
                user = self._authenticate(request)
                user, by = self._impersonate(request, user)
                attrs = rbac.request_attributes(request.method, request.path, request.query)
                request[USER_KEY] = user
                self.authz.require(user, attrs)
                request[AUDIT_ANNOTATIONS] = {}
                # a watch writes it when it starts
                request[AUDIT_KEY] = self._audit_once(user, attrs, by, request.path, request[AUDIT_ANNOTATIONS])
                resp = await handler(request)
                code = resp.status
                return resp
            except APIError as e:
                code = e.code
                if attrs is None:  # refused while impersonating: record the impersonation asked for
                    attrs = getattr(e, "attrs", None)
                if e.code >= 500:
                    log.warning("request failed", method=request.method, path=request.path, code=e.code, error=e.message)
                return json_response(e.status(), e.code)
            except (asyncio.CancelledError, web.HTTPException, ConnectionResetError):
                raise
            except Exception as e:  # a bug: say so, keep serving
                log.exception("internal error", method=request.method, path=request.path)
                return json_response(APIError(500, f"internal error in the Kubernetes stand-in: {type(e).__name__}: {e}").status(), 500)
        finally:
            write = request.get(AUDIT_KEY) or self._audit_once(user, attrs, by, request.path)
            write(code)

    # --- dispatch ---------------------------------------------------------------

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        path = request.path.rstrip("/") or "/"
        parts = [p for p in path.split("/") if p]
        method = request.method
        if path in ("/healthz", "/livez", "/readyz"):
            return web.Response(text="ok")
        if path == "/version":
            return json_response(discovery.VERSION)
        if parts and parts[0] == "openapi":
            return self._openapi(parts, request.headers.get("Accept", ""))
        if not parts or parts[0] not in ("api", "apis"):
            raise APIError(404, f"the server could not find the requested resource ({path})", "NotFound")
        if method != "GET" and (len(parts) <= (2 if parts[0] == "api" else 3)):
            raise APIError(405, f"{method} is not supported on {path}", "MethodNotAllowed")
        if parts == ["api"]:
            return json_response(discovery.api_versions(self.server_address()))
        if parts == ["apis"]:
            return json_response(discovery.api_group_list(self.api.registry))
        if parts[0] == "apis" and len(parts) == 2:
            doc = discovery.api_group(self.api.registry, parts[1])
            if doc is None:
                raise APIError(404, f"the server could not find the requested resource (API group {parts[1]!r})", "NotFound")
            return json_response(doc)
        if parts[0] == "api":
            group, version, rest = "", parts[1], parts[2:]
        else:
            group, version, rest = parts[1], parts[2], parts[3:]
        if not rest:
            doc = discovery.resource_list(self.api.registry, group, version)
            if doc is None:
                gv = f"{group}/{version}" if group else version
                raise APIError(404, f"the server could not find the requested resource (group version {gv!r})", "NotFound")
            return json_response(doc)
        target = self._target(group, version, rest)
        return await self._serve(request, target)

    def _target(self, group: str, version: str, rest: list[str]) -> Target:
        watch_path = False
        if rest[0] == "watch":
            watch_path, rest = True, rest[1:]
            if not rest:
                raise APIError(404, "the server could not find the requested resource", "NotFound")
        namespace = None
        if rest[0] == "namespaces" and len(rest) >= 3 and not (group == "" and len(rest) == 3 and rest[2] in ("status", "finalize")):
            namespace, rest = rest[1], rest[2:]
        if len(rest) > 3:
            raise APIError(404, "the server could not find the requested resource", "NotFound")
        rt = self.api.resource(group, version, rest[0])
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if namespace is not None and not rt.namespaced:
            raise APIError(404, f"{rt.plural} are cluster-scoped: use {rt.base_path}/{rt.plural} (without /namespaces/{namespace})", "NotFound")
        if sub in (*podproxy.SERVED, *podproxy.REFUSED) and rt.storage == ("", "pods"):
            podproxy.refuse_unserved(sub)
        elif sub is not None and sub not in rt.subresources:
            raise APIError(404, f"{rt.plural} has no subresource {sub!r} here (served: {', '.join(rt.subresources) or 'none'})", "NotFound")
        if name is not None and rt.namespaced and namespace is None:
            raise APIError(404, f"{rt.plural} are namespaced: use {rt.base_path}/namespaces/<namespace>/{rt.plural}/{name}", "NotFound")
        return Target(group, version, rt, namespace, name, sub, watch_path)

    def _openapi(self, parts: list[str], accept: str = "") -> web.Response:
        if parts == ["openapi", "v2"]:
            if "protobuf" in accept and "json" not in accept:
                # client-go asks for protobuf only (kubectl's and Helm's validators load it)
                return web.Response(body=discovery.OPENAPI_V2_PROTOBUF, content_type=discovery.OPENAPI_V2_PROTOBUF_TYPE)
            return json_response(discovery.openapi_v2(self.api.registry))
        if parts == ["openapi", "v3"]:
            return json_response(discovery.openapi_root(self.api.registry))
        if len(parts) >= 4 and parts[1] == "v3":
            rest = parts[2:]
            if rest[0] == "api" and len(rest) == 2:
                doc = discovery.openapi_gv(self.api.registry, "", rest[1])
            elif rest[0] == "apis" and len(rest) == 3:
                doc = discovery.openapi_gv(self.api.registry, rest[1], rest[2])
            else:
                doc = None
            if doc is not None:
                return json_response(doc)
        raise APIError(404, "the server could not find the requested resource: OpenAPI documents are at "
                       "/openapi/v2 and /openapi/v3/<api|apis/group>/<version>", "NotFound")

    # --- bodies and options ------------------------------------------------------

    async def _admitted(self, request: web.Request, rt: ResourceType, t, operation: str, opts: Options, write):
        """``write(opts)``, once the validating webhooks that match it allowed what it would
        store (a dry run of it first: the object with defaults and built-in admission)."""
        api = self.api
        configs = api.store.list(webhooks.STORAGE)
        probe = webhooks.Target(rt.group, rt.version, rt.kind, rt.plural, t.sub or "", rt.namespaced, operation,
                                t.namespace or "", t.name or "", None, None)
        if not configs or not any(webhooks.rule_matches(r, probe) for c in configs
                                  for h in c.get("webhooks") or [] for r in h.get("rules") or []):
            return write(opts)
        old = api.store.get(rt.storage, t.namespace or "", t.name or "") if t.name else None
        dry = dataclasses.replace(opts, dry_run=True, warnings=[])
        result = write(dry)
        obj = result[0] if isinstance(result, tuple) else result
        name = (obj.get("metadata") or {}).get("name", "")
        target = dataclasses.replace(probe, name=name, obj=obj, old=copy.deepcopy(old) if old else None)
        ns = api.store.get(("", "namespaces"), "", t.namespace) if rt.namespaced and t.namespace else None
        hooks = webhooks.matching(configs, target, ((ns or {}).get("metadata") or {}).get("labels") or {})
        if hooks:
            await webhooks.admit(hooks, target, request[USER_KEY].info(), opts.dry_run, opts.warnings,
                                 self._service_endpoint)
        return write(opts)

    def _service_endpoint(self, namespace: str, name: str, port: int) -> tuple[str, int] | None:
        """A Ready endpoint (pod address, target port) of Service ``namespace/name`` on ``port``."""
        store = self.api.store
        svc = store.get(("", "services"), namespace, name)
        if svc is None:
            return None
        spec = svc.get("spec") or {}
        sp = next((p for p in spec.get("ports") or [] if p.get("port") == port), None)
        selector = spec.get("selector")
        if sp is None or not selector:
            return None
        target = sp.get("targetPort", port)
        for pod in store.list(("", "pods"), namespace):
            labels = (pod.get("metadata") or {}).get("labels") or {}
            status = pod.get("status") or {}
            ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
            if not ready or not status.get("podIP") or any(labels.get(k) != v for k, v in selector.items()):
                continue
            number = target
            if isinstance(target, str):
                number = next((p["containerPort"] for c in (pod.get("spec") or {}).get("containers") or []
                               for p in c.get("ports") or [] if p.get("name") == target), None)
            if number is not None:
                return status["podIP"], int(number)
        return None

    @staticmethod
    async def _read(request: web.Request) -> bytes:
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise APIError(413, f"Request entity too large: limit is {MAX_REQUEST_BYTES}",
                           "RequestEntityTooLarge") from None

    async def _body(self, request: web.Request) -> Any:
        raw = await self._read(request)
        if not raw:
            return None
        ctype = (request.content_type or "application/json").lower()
        if "protobuf" in ctype:
            try:
                return protobuf.decode(raw)  # the review and token kinds kubectl sends as protobuf
            except protobuf.DecodeError:
                pass
        if "protobuf" in ctype or "cbor" in ctype:
            raise APIError(415, f"{ctype} is not supported by this Kubernetes stand-in, which reads JSON and YAML only; "
                           "kubectl's `create <kind>` generators send protobuf: pipe `kubectl create ... --dry-run=client -o yaml` "
                           "into `kubectl apply -f -` (or `kubectl create -f -`) instead", "UnsupportedMediaType")
        try:
            if "yaml" in ctype:
                return yaml.safe_load(raw)
            return json.loads(raw)
        except (ValueError, yaml.YAMLError) as e:
            raise bad_request(f"the request body is not valid {'YAML' if 'yaml' in ctype else 'JSON'}: {e}") from e

    @staticmethod
    def _options(q) -> Options:
        dry = q.getall("dryRun", [])
        for d in dry:
            if d != "All":
                raise bad_request(f"dryRun must be 'All', not {d!r}")
        fv = q.get("fieldValidation") or "Warn"
        if fv not in ("Strict", "Warn", "Ignore"):
            raise bad_request(f"fieldValidation must be Strict, Warn or Ignore, not {fv!r}")
        manager = q.get("fieldManager")
        if manager is not None and len(manager) > 128:
            raise bad_request("fieldManager must not be longer than 128 characters")
        return Options(dry_run=bool(dry), field_manager=manager, field_validation=fv, force=q.get("force") == "true")

    # --- serve ------------------------------------------------------------------

    async def _serve(self, request: web.Request, t: Target) -> web.StreamResponse:
        method, q, rt, api = request.method, request.query, t.rt, self.api
        if t.sub in podproxy.SERVED and rt.storage == ("", "pods"):  # to the pod's kubelet
            return await self.podproxy.serve(request, t.namespace or "", t.name or "", t.sub)
        verb = None
        if method == "GET":
            if t.name is None:
                verb = "watch" if t.watch_path or q.get("watch") in ("true", "1") else "list"
            else:
                verb = "watch" if t.watch_path else "get"
        elif method == "POST":
            verb = "create"
        elif method == "PUT":
            verb = "update"
        elif method == "PATCH":
            verb = "patch"
        elif method == "DELETE":
            verb = "delete" if t.name else "deletecollection"
        if verb is None or (t.sub is None and verb not in rt.verbs):
            raise APIError(405, f"{method} is not supported on {rt.plural}" + (f" (verb {verb!r}; this resource supports: {', '.join(rt.verbs)})" if verb else ""),
                           "MethodNotAllowed", {"kind": rt.plural, "group": rt.group} if rt.group else {"kind": rt.plural})
        if verb == "watch":
            if t.name is not None:
                q = dict(q)
                q["fieldSelector"] = ",".join(filter(None, [q.get("fieldSelector"), f"metadata.name={t.name}"]))
            return await self._watch(request, t, q)
        accept = parse_accept(request.headers.get("Accept", ""))
        if verb == "list":
            return self._list(t, q, accept)
        if verb == "get":
            if t.sub == "scale":
                return json_response(api.get_scale(rt, t.namespace, t.name))
            if t.sub not in (None, "status"):
                raise APIError(405, f"GET is not supported on {rt.plural}/{t.sub}", "MethodNotAllowed")
            obj = api.get(rt, t.namespace, t.name)
            return self._render_one(rt, obj, accept, q)
        if verb == "create":
            body = await self._body(request)
            opts = self._options(q)
            opts.admit = self._escalation_check(request[USER_KEY])
            opts.audit_annotations = request[AUDIT_ANNOTATIONS]
            if rt.storage in REVIEWS:
                return json_response(self._review(request, t, body), 201)
            if t.sub == "token" and t.name and rt.storage == ("", "serviceaccounts"):
                return json_response(self._token_request(t.namespace or "", t.name, body, opts), 201)
            if t.sub == "binding" and t.name:
                return json_response(api.bind(t.namespace or "", t.name, body, opts), 201)
            if t.sub == "eviction" and t.name:
                return json_response(api.evict(t.namespace or "", t.name, body), 201)
            if rt.storage == ("", "bindings") and t.name is None:
                pod = ((body or {}).get("metadata") or {}).get("name") if isinstance(body, dict) else None
                if not pod:
                    raise bad_request("a Binding names the pod to bind in metadata.name")
                return json_response(api.bind(t.namespace or "", pod, body, opts), 201)
            if t.name is not None:
                raise APIError(405, f"POST is not supported on a named {rt.singular}: create with POST {rt.base_path}"
                               + (f"/namespaces/{t.namespace}" if t.namespace else "") + f"/{rt.plural}", "MethodNotAllowed")
            if rt.namespaced and t.namespace is None:
                raise APIError(405, f"create {rt.plural} under {rt.base_path}/namespaces/<namespace>/{rt.plural}", "MethodNotAllowed")
            obj = await self._admitted(request, rt, t, "CREATE", opts,
                                       lambda o: api.create(rt, t.namespace, copy.deepcopy(body), o))
            return json_response(obj, 201, opts.warnings)
        if verb == "update":
            body = await self._body(request)
            opts = self._options(q)
            opts.admit = self._escalation_check(request[USER_KEY])
            opts.audit_annotations = request[AUDIT_ANNOTATIONS]
            if t.sub == "scale":
                return json_response(api.update_scale(rt, t.namespace, t.name, body, opts))
            if t.sub == "finalize":
                return json_response(self._finalize(t.name, body, opts))
            if t.sub not in (None, "status"):
                raise APIError(405, f"PUT is not supported on {rt.plural}/{t.sub}", "MethodNotAllowed")
            obj = await self._admitted(request, rt, t, "UPDATE", opts, lambda o: api.update(
                rt, t.namespace, t.name, copy.deepcopy(body), o, subresource=t.sub))
            return json_response(obj, 200, opts.warnings)
        if verb == "patch":
            body = await self._body_for_patch(request)
            opts = self._options(q)
            opts.admit = self._escalation_check(request[USER_KEY])
            opts.audit_annotations = request[AUDIT_ANNOTATIONS]
            ctype = request.headers.get("Content-Type", "")
            if t.sub == "scale":
                return json_response(api.patch_scale(rt, t.namespace, t.name, ctype, body, opts))
            if t.sub not in (None, "status"):
                raise APIError(405, f"PATCH is not supported on {rt.plural}/{t.sub}", "MethodNotAllowed")
            exists = api.store.get(rt.storage, t.namespace or "", t.name or "") is not None
            obj, created = await self._admitted(request, rt, t, "UPDATE" if exists else "CREATE", opts, lambda o: api.patch(
                rt, t.namespace, t.name, ctype, copy.deepcopy(body), o, subresource=t.sub))
            return json_response(obj, 201 if created else 200, opts.warnings)
        if verb == "delete":
            if t.sub is not None:
                raise APIError(405, f"DELETE is not supported on {rt.plural}/{t.sub}", "MethodNotAllowed")
            body = await self._body(request)
            dopts = DeleteOptions.from_body(body, dict(q))
            out, code = api.delete(rt, t.namespace, t.name, dopts)
            return json_response(out, code)
        # deletecollection
        body = await self._body(request)
        dopts = DeleteOptions.from_body(body, dict(q))
        labels = parse_label_selector(q.get("labelSelector"))
        fields = parse_field_selector(q.get("fieldSelector"), selectable_fields(rt.storage, rt.selectable))
        return json_response(api.delete_collection(rt, t.namespace, labels, fields, dopts))

    def _escalation_check(self, user: rbac.User):
        """Kubernetes' escalation prevention for Roles, ClusterRoles and bindings:
        you may only grant what you hold, unless RBAC gives you ``escalate``
        (roles) or ``bind`` (the role a binding references)."""

        def check(rt: ResourceType, obj: dict, old: dict | None) -> None:
            if rt.group != RBAC_GROUP or rbac.MASTERS in user.groups:
                return
            md = meta(obj)
            ns, name = md.get("namespace") or "", md.get("name") or ""
            is_role = rt.plural in ("roles", "clusterroles")
            fields = ("rules", "aggregationRule") if is_role else ("roleRef", "subjects")
            if old is not None and all(old.get(f) == obj.get(f) for f in fields):
                return  # metadata-only changes grant nothing
            if is_role:
                if self.authz.authorize(user, rbac.Attributes("escalate", namespace=ns, api_group=RBAC_GROUP, resource=rt.plural, name=name))[0]:
                    return
                if obj.get("aggregationRule"):
                    raise APIError(403, f'{rt.plural}.{RBAC_GROUP} "{name}" is forbidden: must have cluster-admin privileges '
                                   "(or escalate on clusterroles) to use the aggregationRule", "Forbidden",
                                   {"name": name, "group": RBAC_GROUP, "kind": rt.plural})
                wanted = list(obj.get("rules") or [])
            else:
                ref = obj.get("roleRef") or {}
                target = "clusterroles" if ref.get("kind") == "ClusterRole" else "roles"
                if self.authz.authorize(user, rbac.Attributes("bind", namespace=ns, api_group=RBAC_GROUP, resource=target,
                                                              name=ref.get("name") or ""))[0]:
                    return
                found = self.authz.policy().role_rules(ref, ns)
                wanted = found[0] if found else []
            held, held_urls = self.authz.rules_for(user, ns)
            missing = rbac.uncovered(held + held_urls, wanted)
            if missing:
                raise APIError(403, f'{rt.plural}.{RBAC_GROUP} "{name}" is forbidden: {rbac.escalation_message(user, missing)}',
                               "Forbidden", {"name": name, "group": RBAC_GROUP, "kind": rt.plural})

        return check

    # --- reviews and tokens (answered, not stored) --------------------------------

    def _review(self, request: web.Request, t: Target, body: Any) -> dict:
        rt = t.rt
        if not isinstance(body, dict):
            raise bad_request(f"the request body must be a {rt.kind}")
        if body.get("kind") not in (None, "", rt.kind) or body.get("apiVersion") not in (None, "", rt.group_version):
            raise bad_request(f"the body is a {body.get('apiVersion')}/{body.get('kind')}, expected {rt.group_version}/{rt.kind}")
        me: rbac.User = request[USER_KEY]
        spec = body.get("spec") if isinstance(body.get("spec"), dict) else {}
        out: dict[str, Any] = {"kind": rt.kind, "apiVersion": rt.group_version,
                               "metadata": dict(body.get("metadata") or {}, creationTimestamp=None), "spec": spec}
        plural = rt.plural
        if plural == "selfsubjectreviews":
            out.pop("spec")
            out["status"] = {"userInfo": me.info()}
            return out
        if plural == "tokenreviews":
            token = spec.get("token") or ""
            audiences = list(spec.get("audiences") or []) or None
            try:
                who = self.authn.authenticate(token, audiences)
                out["status"] = {"authenticated": True, "user": who.info(), "audiences": audiences or [self.authn.issuer]}
            except authn.TokenError as e:
                out["status"] = {"authenticated": False, "user": {}, "error": f"[invalid bearer token, {e}]"}
            return out
        if plural == "selfsubjectrulesreviews":
            ns = spec.get("namespace") or ""
            res, nonres = self.authz.rules_for(me, ns)
            out["status"] = {"resourceRules": res, "nonResourceRules": nonres, "incomplete": False}
            return out
        if plural == "selfsubjectaccessreviews":
            subject = me
        else:
            if not spec.get("user") and not spec.get("groups"):
                raise APIError(422, f"{rt.kind}.{rt.group} \"\" is invalid: spec.user: Invalid value: \"\": at least one of user or group must be specified",
                               "Invalid", {"kind": rt.kind, "group": rt.group})
            extra = {k: tuple(v or ()) for k, v in (spec.get("extra") or {}).items()}
            subject = rbac.User(spec.get("user") or "", tuple(spec.get("groups") or ()), spec.get("uid") or "", extra)
        ra, nra = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
        if bool(ra) == bool(nra):
            raise APIError(422, f'{rt.kind}.{rt.group} "" is invalid: spec.resourceAttributes: Invalid value: "null": '
                           "exactly one of nonResourceAttributes or resourceAttributes must be specified", "Invalid",
                           {"kind": rt.kind, "group": rt.group})
        if ra:
            if plural == "localsubjectaccessreviews" and (ra.get("namespace") or "") != (t.namespace or ""):
                raise APIError(422, f'{rt.kind}.{rt.group} "" is invalid: spec.resourceAttributes.namespace: Invalid value: '
                               f'"{ra.get("namespace") or ""}": must match metadata.namespace', "Invalid", {"kind": rt.kind, "group": rt.group})
            attrs = rbac.Attributes(verb=ra.get("verb") or "", namespace=ra.get("namespace") or "", api_group=ra.get("group") or "",
                                    api_version=ra.get("version") or "", resource=ra.get("resource") or "",
                                    subresource=ra.get("subresource") or "", name=ra.get("name") or "")
        else:
            attrs = rbac.Attributes(verb=nra.get("verb") or "", resource_request=False, path=nra.get("path") or "")
        allowed, reason = self.authz.authorize(subject, attrs)
        status: dict[str, Any] = {"allowed": allowed}
        if reason:
            status["reason"] = reason
        out["status"] = status
        if plural == "localsubjectaccessreviews":
            out["metadata"]["namespace"] = t.namespace
        return out

    def _token_request(self, namespace: str, name: str, body: Any, opts: Options) -> dict:
        """TokenRequest (authentication.k8s.io/v1) for ServiceAccount ``namespace/name``."""
        api = self.api
        sa = api.raw(api.resource("", "v1", "serviceaccounts"), namespace, name)
        if sa is None:
            raise not_found("serviceaccounts", "", name)
        if not isinstance(body, dict):
            raise bad_request("the body must be an authentication.k8s.io/v1 TokenRequest")
        if body.get("kind") not in (None, "", "TokenRequest") or body.get("apiVersion") not in (None, "", "authentication.k8s.io/v1"):
            raise bad_request(f"the body is a {body.get('apiVersion')}/{body.get('kind')}, expected authentication.k8s.io/v1 TokenRequest")
        spec = dict(body.get("spec") or {})
        try:
            expiration = authn.expiration_of(spec)
        except ValueError as e:
            raise invalid("TokenRequest", "authentication.k8s.io", name, [FieldError("spec.expirationSeconds", "Invalid", str(e), spec.get("expirationSeconds"))]) from e
        audiences = [a for a in spec.get("audiences") or [] if a] or [self.authn.issuer]
        pod = None
        ref = spec.get("boundObjectRef")
        if ref:
            kind, ref_name = ref.get("kind"), ref.get("name") or ""
            if kind != "Pod" or ref.get("apiVersion", "v1") != "v1":
                raise invalid("TokenRequest", "authentication.k8s.io", name, [FieldError("spec.boundObjectRef.kind", "NotSupported",
                              'supported values: "Pod" (v1); Secret and Node bindings are not served by this stand-in', kind)])
            pobj = api.raw(api.resource("", "v1", "pods"), namespace, ref_name)
            if pobj is None:
                raise not_found("pods", "", ref_name)
            uid = meta(pobj).get("uid")
            if ref.get("uid") and ref["uid"] != uid:
                raise APIError(409, f'Operation cannot be fulfilled on pods "{ref_name}": the UID in the bound object reference '
                               f'({ref["uid"]}) does not match the UID in record. The object might have been deleted and then recreated',
                               "Conflict", {"name": ref_name, "kind": "pods"})
            if meta(pobj).get("deletionTimestamp"):
                raise bad_request(f"pod {namespace}/{ref_name} is being deleted: no new tokens are bound to it")
            if (pobj.get("spec") or {}).get("serviceAccountName", "default") != name:
                raise bad_request(f"pod {namespace}/{ref_name} runs as service account "
                                  f"{(pobj.get('spec') or {}).get('serviceAccountName')!r}, not {name!r}")
            pod = (ref_name, uid)
            spec["boundObjectRef"] = {"kind": "Pod", "apiVersion": "v1", "name": ref_name, "uid": uid}
        spec["audiences"] = audiences
        spec["expirationSeconds"] = expiration
        token, exp = ("", 0) if opts.dry_run else self.authn.issue(namespace, name, meta(sa)["uid"], audiences, expiration, pod)
        md = dict(body.get("metadata") or {})
        md.update(name=name, namespace=namespace, creationTimestamp=timeutil.rfc3339())
        return {"kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1", "metadata": md, "spec": spec,
                "status": {"token": token, "expirationTimestamp": timeutil.rfc3339(datetime.fromtimestamp(exp, UTC)) if exp else None}}

    async def _body_for_patch(self, request: web.Request) -> Any:
        ctype = (request.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        raw = await self._read(request)
        if not raw:
            raise bad_request("a PATCH needs a body")
        try:
            if ctype.endswith("yaml"):
                return yaml.safe_load(raw)
            return json.loads(raw)
        except (ValueError, yaml.YAMLError) as e:
            raise bad_request(f"the patch is not valid {'YAML' if ctype.endswith('yaml') else 'JSON'}: {e}") from e

    def _finalize(self, name: str | None, body: Any, opts: Options) -> dict:
        api = self.api
        rt = api.resource("", "v1", "namespaces")
        current = api.raw(rt, None, name or "")
        if current is None:
            raise APIError(404, f'namespaces "{name}" not found', "NotFound", {"name": name, "kind": "namespaces"})
        if not isinstance(body, dict):
            raise bad_request("the body must be a Namespace")
        new = json.loads(json.dumps(current))
        new.setdefault("spec", {})["finalizers"] = list((body.get("spec") or {}).get("finalizers") or [])
        rv = (body.get("metadata") or {}).get("resourceVersion")
        if rv:
            new["metadata"]["resourceVersion"] = rv
        return api.update(rt, None, name or "", new, opts, old=current)

    def _render_one(self, rt: ResourceType, obj: dict, accept: Accept, q) -> web.Response:
        if accept.table:
            return json_response(tables.table(rt, [obj], q.get("includeObject", "Metadata"), meta(obj).get("resourceVersion")))
        if accept.metadata:
            return json_response({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta(obj)})
        return json_response(obj)

    def _list(self, t: Target, q, accept: Accept) -> web.Response:
        rt, api = t.rt, self.api
        labels = parse_label_selector(q.get("labelSelector"))
        fields = parse_field_selector(q.get("fieldSelector"), selectable_fields(rt.storage, rt.selectable))
        current = api.store.rv
        rv_s, match = q.get("resourceVersion", ""), q.get("resourceVersionMatch", "")
        if match and not rv_s:
            raise bad_request("resourceVersionMatch is forbidden unless resourceVersion is provided")
        if match not in ("", "NotOlderThan", "Exact"):
            raise bad_request(f"resourceVersionMatch must be NotOlderThan or Exact, not {match!r}")
        if rv_s not in ("", "0"):
            try:
                rv = int(rv_s)
            except ValueError as e:
                raise bad_request(f"resourceVersion must be an integer, not {rv_s!r}") from e
            if rv > current:
                raise APIError(504, f"Too large resource version: {rv}, current: {current}", "Timeout",
                               {"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}], "retryAfterSeconds": 1})
            if match == "Exact" and rv != current:
                raise gone(f"too old resource version: {rv} ({current}); this server lists only its current state")
        items = api.select(rt, t.namespace, labels, fields)
        cont_in, limit_s = q.get("continue"), q.get("limit")
        if cont_in:
            try:
                token = json.loads(base64.urlsafe_b64decode(cont_in.encode()))
                start = tuple(token["start"])
            except (ValueError, KeyError, TypeError) as e:
                raise bad_request(f"continue token is not valid: {e}") from e
            items = [o for o in items if ((meta(o).get("namespace") or ""), meta(o)["name"]) > start]
        cont = None
        remaining = None
        if limit_s:
            try:
                limit = int(limit_s)
            except ValueError as e:
                raise bad_request(f"limit must be an integer, not {limit_s!r}") from e
            if 0 < limit < len(items):
                last = items[limit - 1]
                remaining = len(items) - limit
                items = items[:limit]
                cont = base64.urlsafe_b64encode(json.dumps({"rv": current, "start": [meta(last).get("namespace") or "", meta(last)["name"]]}).encode()).decode()
        items = [api.present(rt, o) for o in items]
        if accept.table:
            return json_response(tables.table(rt, items, q.get("includeObject", "Metadata"), str(current), cont, remaining))
        md: dict[str, Any] = {"resourceVersion": str(current)}
        if cont:
            md["continue"] = cont
            md["remainingItemCount"] = remaining
        if accept.metadata:
            return json_response({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": md,
                                  "items": [{"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta(o)} for o in items]})
        return json_response({"kind": f"{rt.kind}List", "apiVersion": rt.group_version, "metadata": md, "items": items})

    async def _watch(self, request: web.Request, t: Target, q) -> web.StreamResponse:
        rt, api, store = t.rt, self.api, self.api.store
        accept = parse_accept(request.headers.get("Accept", ""))
        labels = parse_label_selector(q.get("labelSelector"))
        fields = parse_field_selector(q.get("fieldSelector"), selectable_fields(rt.storage, rt.selectable))
        predicate = api.matcher(rt, labels, fields)
        namespace = t.namespace if rt.namespaced else None
        rv_s = q.get("resourceVersion", "")
        send_initial = q.get("sendInitialEvents") == "true"
        bookmarks = q.get("allowWatchBookmarks") == "true"
        try:
            timeout = int(q.get("timeoutSeconds") or DEFAULT_WATCH_TIMEOUT)
        except ValueError as e:
            raise bad_request(f"timeoutSeconds must be an integer, not {q.get('timeoutSeconds')!r}") from e
        if send_initial and not bookmarks:
            raise bad_request("sendInitialEvents=true requires allowWatchBookmarks=true")
        error = None
        watcher = None
        start_rv = store.rv
        if send_initial or rv_s in ("", "0"):
            watcher = store.watch(rt.storage, namespace, predicate, None, api.select(rt, namespace, labels, fields))
        else:
            try:
                since = int(rv_s)
            except ValueError as e:
                raise bad_request(f"resourceVersion must be an integer, not {rv_s!r}") from e
            try:
                watcher = store.watch(rt.storage, namespace, predicate, since)
            except TooOld as e:
                error = APIError(410, str(e), "Expired").status()
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json", "Cache-Control": "no-cache"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        request[AUDIT_KEY](resp.status)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(1, timeout)
        first = True

        def encode(kind: str, obj: dict) -> bytes:
            nonlocal first
            if kind not in ("ERROR", "BOOKMARK"):
                obj = api.present(rt, obj)
                if accept.table:
                    obj = tables.table(rt, [obj], q.get("includeObject", "Metadata"), meta(obj).get("resourceVersion"), columns=first)
                    first = False
                elif accept.metadata:
                    obj = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta(obj)}
            return dumps({"type": kind, "object": obj}) + b"\n"

        def bookmark(rv: int, initial_end: bool = False) -> dict:
            md: dict[str, Any] = {"resourceVersion": str(rv)}
            if initial_end:
                md["annotations"] = {"k8s.io/initial-events-end": "true"}
            return {"kind": rt.kind, "apiVersion": rt.group_version, "metadata": md}

        try:
            if error is not None:
                await resp.write(encode("ERROR", error))
                return resp
            assert watcher is not None
            if send_initial:
                # everything queued so far is the initial state
                pending = []
                while not watcher.queue.empty():
                    pending.append(watcher.queue.get_nowait())
                for item in pending:
                    if item is None:
                        return resp
                    await resp.write(encode(item[0], item[1]))
                await resp.write(encode("BOOKMARK", bookmark(start_rv, True)))
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                wait = min(remaining, self.bookmark_interval) if bookmarks else remaining
                try:
                    item = await asyncio.wait_for(watcher.queue.get(), wait)
                except TimeoutError:
                    if bookmarks and watcher.queue.empty() and loop.time() < deadline:
                        await resp.write(encode("BOOKMARK", bookmark(store.rv)))
                    continue
                if item is None:
                    break
                await resp.write(encode(item[0], item[1]))
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        finally:
            if watcher is not None:
                store.unwatch(watcher)
        return resp
