"""Validating admission webhooks, as Kubernetes 1.33 calls them
(admissionregistration.k8s.io/v1 ValidatingWebhookConfiguration, AdmissionReview v1).

For a create, update or patch, the routes first run the write as a dry run
(defaults, validation, the built-in admission), then, for every webhook whose
rules, namespaceSelector and objectSelector match, send the resulting object
(and the old one) to the webhook, all at once, each within its
``timeoutSeconds``; only if all allow it is the write made. A webhook is
reached as the API server reaches it: a ``service`` (namespace, name, port,
path) goes to a Ready endpoint of that Service over HTTPS, verified with
``caBundle`` for the name ``<service>.<namespace>.svc``; a ``url`` directly.
A webhook that cannot be called, times out or answers nonsense fails the
request when ``failurePolicy`` is ``Fail`` (the default) and is skipped when
``Ignore``. Warnings in its response reach the client.

A webhook's ``matchConditions`` (CEL expressions, evaluated with the CEL
library ``cel-python``) are asked after its rules and selectors, as
Kubernetes asks them: with ``object``, ``oldObject`` (null on a create) and
``request`` (the AdmissionRequest less its objects and options). A condition
that is false skips the webhook; one that fails to evaluate, with none false,
refuses the request (403) under ``Fail`` and skips the webhook under
``Ignore``. The API refuses a configuration whose conditions do not compile.

The matching, the conditions and the review (:func:`matching`,
:func:`conditions_match`, :func:`review`, :func:`verdict`) are pure;
:func:`call` does the HTTP.
"""

from __future__ import annotations

import asyncio
import base64
import re
import ssl
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import celpy

from .cel import EvalErrors, compile_problem, eval_message, program
from .errors import APIError, FieldError, qualified
from .selectors import selects

STORAGE = ("admissionregistration.k8s.io", "validatingwebhookconfigurations")
DEFAULT_TIMEOUT = 10
OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")
#: At most this many matchConditions per webhook (the API's limit).
MAX_MATCH_CONDITIONS = 64
#: A matchCondition's name: a qualified name, as for a label key.
_QUALIFIED_NAME = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                             r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


@dataclass(frozen=True)
class Target:
    """What a request writes: the resource, the operation, and the objects."""

    group: str
    version: str
    kind: str
    resource: str
    subresource: str
    namespaced: bool
    operation: str
    namespace: str
    name: str
    obj: dict | None
    old: dict | None


def rule_matches(rule: Mapping, t: Target) -> bool:
    def has(key: str, value: str) -> bool:
        values = rule.get(key) or []
        return "*" in values or value in values

    if not (has("operations", t.operation) and has("apiGroups", t.group) and has("apiVersions", t.version)):
        return False
    scope = rule.get("scope") or "*"
    if scope != "*" and scope != ("Namespaced" if t.namespaced else "Cluster"):
        return False
    wanted = f"{t.resource}/{t.subresource}" if t.subresource else t.resource
    for r in rule.get("resources") or []:
        if r == "*/*" or r == wanted:
            return True
        main, _, sub = r.partition("/")
        if sub and main in ("*", t.resource) and sub in ("*", t.subresource or ""):
            return True
        if r == "*" and not t.subresource:
            return True
    return False



def _labels(obj: dict | None) -> dict[str, str]:
    return dict(((obj or {}).get("metadata") or {}).get("labels") or {})


def matching(configs: Sequence[dict], t: Target, namespace_labels: Mapping[str, str] | None) -> list[dict]:
    """The webhooks of ``configs`` that ``t`` goes to. ``namespace_labels``: of the
    object's namespace (None for a cluster-scoped object)."""
    out = []
    for cfg in sorted(configs, key=lambda c: c["metadata"]["name"]):
        for hook in cfg.get("webhooks") or []:
            if not any(rule_matches(r, t) for r in hook.get("rules") or []):
                continue
            ns_sel = hook.get("namespaceSelector") or {}
            if t.namespaced and not selects(ns_sel, namespace_labels or {}):
                continue
            obj_sel = hook.get("objectSelector") or {}
            if not (selects(obj_sel, _labels(t.obj)) or (t.old is not None and selects(obj_sel, _labels(t.old)))):
                continue
            out.append(hook)
    return out


def review(t: Target, user: Mapping[str, Any], dry_run: bool) -> dict:
    """The AdmissionReview v1 request the webhooks get."""
    gvk = {"group": t.group, "version": t.version, "kind": t.kind}
    gvr = {"group": t.group, "version": t.version, "resource": t.resource}
    request = {"uid": str(uuid.uuid4()), "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
               "name": t.name, "operation": t.operation, "userInfo": dict(user), "object": t.obj,
               "oldObject": t.old, "dryRun": dry_run,
               "options": {"apiVersion": "meta.k8s.io/v1",
                           "kind": {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions"}.get(t.operation, "DeleteOptions")}}
    if t.namespaced:
        request["namespace"] = t.namespace
    if t.subresource:
        request["subResource"] = t.subresource
        request["requestSubResource"] = t.subresource
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def conditions_match(hook: Mapping, t: Target, user: Mapping[str, Any], dry_run: bool) -> bool:
    """Whether ``hook`` is called for ``t`` after its ``matchConditions``, as Kubernetes
    decides: any condition false skips it; otherwise one that fails to evaluate
    refuses the request under ``failurePolicy: Fail`` (403) and skips the webhook
    under ``Ignore``; all true call it."""
    conditions = hook.get("matchConditions") or []
    if not conditions:
        return True
    request = review(t, user, dry_run)["request"]
    for key in ("object", "oldObject", "options"):
        request.pop(key, None)
    activation = {"object": celpy.json_to_cel(t.obj), "oldObject": celpy.json_to_cel(t.old),
                  "request": celpy.json_to_cel(request)}
    errors = []
    for cond in conditions:
        expression = cond.get("expression") or ""
        try:
            result = program(expression).evaluate(activation)
        except EvalErrors as exc:
            errors.append(f"expression '{expression}' resulted in error: {eval_message(exc)}")
            continue
        if not isinstance(result, celpy.celtypes.BoolType):
            errors.append(f"expression '{expression}' resulted in error: got {type(result).__name__}, "
                          "want bool")
        elif not result:
            return False
    if not errors:
        return True
    if (hook.get("failurePolicy") or "Fail") == "Ignore":
        return False
    # Kubernetes' utilerrors aggregate: one error as itself, several in brackets.
    why = errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
    details: dict[str, Any] = {"name": t.name, "kind": t.resource}
    if t.group:
        details["group"] = t.group
    raise APIError(403, f'{qualified(t.resource, t.group)} "{t.name}" is forbidden: {why}', "Forbidden", details)


class WebhookFailed(Exception):
    """The webhook could not be called, or answered something that is not a review."""


def verdict(hook: Mapping, sent: dict, answer: Any, warnings: list[str]) -> None:
    """Raise the API's error when ``answer`` denies the request; add its warnings."""
    name = hook["name"]
    if not isinstance(answer, dict) or answer.get("apiVersion") != "admission.k8s.io/v1" \
            or answer.get("kind") != "AdmissionReview" or not isinstance(answer.get("response"), dict):
        raise WebhookFailed("expected response.apiVersion of admission.k8s.io/v1 and kind AdmissionReview")
    response = answer["response"]
    if response.get("uid") != sent["request"]["uid"]:
        raise WebhookFailed(f"expected response.uid={sent['request']['uid']!r}, got {response.get('uid')!r}")
    if not isinstance(response.get("allowed"), bool):
        raise WebhookFailed("expected response.allowed to be set")
    for w in response.get("warnings") or []:
        warnings.append(str(w))
    if response["allowed"]:
        return
    # As the API server's ToStatusErr: a code below 400 becomes 400, the reason is kept and
    # stands for a missing message.
    status = response.get("status") or {}
    message = status.get("message") or status.get("reason") or ""
    text = f'admission webhook "{name}" denied the request' + (f": {message}" if message else " without explanation")
    code = status.get("code") if isinstance(status.get("code"), int) and status.get("code") >= 400 else 400
    raise APIError(code, text, status.get("reason") or None, status.get("details"))


def _endpoint(hook: Mapping, resolve: Callable[[str, str, int], tuple[str, int] | None]) -> tuple[str, str, int, str]:
    """(URL as the API names it, host to connect to, port, server name to verify)."""
    cc = hook.get("clientConfig") or {}
    timeout = hook.get("timeoutSeconds") or DEFAULT_TIMEOUT
    if cc.get("url"):
        u = urlsplit(cc["url"])
        return cc["url"], u.hostname or "", u.port or 443, u.hostname or ""
    svc = cc["service"]
    port = svc.get("port") or 443
    path = svc.get("path") or "/"
    name = f"{svc['name']}.{svc['namespace']}.svc"
    url = f"https://{name}:{port}{path}?timeout={timeout}s"
    found = resolve(svc["namespace"], svc["name"], port)
    if found is None:
        raise WebhookFailed(f'failed to call webhook: Post "{url}": no endpoints available for service '
                            f'"{svc["namespace"]}/{svc["name"]}"')
    return url, found[0], found[1], name


async def call(hook: Mapping, sent: dict, resolve: Callable[[str, str, int], tuple[str, int] | None]) -> Any:
    """POST the review to the webhook; its decoded answer."""
    url, host, port, server_name = _endpoint(hook, resolve)
    timeout = hook.get("timeoutSeconds") or DEFAULT_TIMEOUT
    ctx = ssl.create_default_context()
    bundle = (hook.get("clientConfig") or {}).get("caBundle")
    if bundle:
        ctx = ssl.create_default_context(cadata=base64.b64decode(bundle).decode())
    path = url.split("/", 3)[3] if url.count("/") >= 3 else ""
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
            async with session.post(f"https://{host}:{port}/{path}", json=sent, ssl=ctx,
                                    server_hostname=server_name) as resp:
                if resp.status != 200:
                    raise WebhookFailed(f'failed to call webhook: Post "{url}": the server responded '
                                        f"with the status code {resp.status}")
                return await resp.json(content_type=None)
    except TimeoutError:
        raise WebhookFailed(f'failed to call webhook: Post "{url}": context deadline exceeded') from None
    except (aiohttp.ClientError, ssl.SSLError, OSError, ValueError) as exc:
        raise WebhookFailed(f'failed to call webhook: Post "{url}": {exc}') from None


async def admit(hooks: Sequence[dict], t: Target, user: Mapping[str, Any], dry_run: bool, warnings: list[str],
                resolve: Callable[[str, str, int], tuple[str, int] | None]) -> None:
    """Call every hook whose match conditions hold at once; raise the first denial or
    failure (in the hooks' order)."""
    hooks = [h for h in hooks if conditions_match(h, t, user, dry_run)]
    sent = [review(t, user, dry_run) for _ in hooks]
    answers = await asyncio.gather(*(call(h, s, resolve) for h, s in zip(hooks, sent, strict=True)), return_exceptions=True)
    for hook, s, answer in zip(hooks, sent, answers, strict=True):
        if isinstance(answer, WebhookFailed):
            if (hook.get("failurePolicy") or "Fail") == "Ignore":
                continue
            raise APIError(500, f'Internal error occurred: failed calling webhook "{hook["name"]}": {answer}',
                           "InternalError")
        if isinstance(answer, BaseException):
            raise answer
        try:
            verdict(hook, s, answer, warnings)
        except WebhookFailed as exc:
            if (hook.get("failurePolicy") or "Fail") == "Ignore":
                continue
            raise APIError(500, f'Internal error occurred: failed calling webhook "{hook["name"]}": {exc}',
                           "InternalError") from None


def config_errors(cfg: dict) -> list[FieldError]:
    """What the API validates of a ValidatingWebhookConfiguration."""
    errs: list[FieldError] = []
    names = set()
    for i, hook in enumerate(cfg.get("webhooks") or []):
        path = f"webhooks[{i}]"
        name = hook.get("name") or ""
        if name.count(".") < 2:
            errs.append(FieldError(f"{path}.name", "Invalid", "should be a domain with at least three segments separated by dots", name))
        if name in names:
            errs.append(FieldError(f"{path}.name", "Duplicate", "", name))
        names.add(name)
        if "v1" not in (hook.get("admissionReviewVersions") or []) and "v1beta1" not in (hook.get("admissionReviewVersions") or []):
            errs.append(FieldError(f"{path}.admissionReviewVersions", "Required", "must specify one of v1, v1beta1"))
        if hook.get("sideEffects") not in ("None", "NoneOnDryRun"):
            errs.append(FieldError(f"{path}.sideEffects", "NotSupported", 'supported values: "None", "NoneOnDryRun"', hook.get("sideEffects")))
        if hook.get("failurePolicy", "Fail") not in ("Fail", "Ignore"):
            errs.append(FieldError(f"{path}.failurePolicy", "NotSupported", 'supported values: "Fail", "Ignore"', hook.get("failurePolicy")))
        timeout = hook.get("timeoutSeconds", DEFAULT_TIMEOUT)
        if not isinstance(timeout, int) or not 1 <= timeout <= 30:
            errs.append(FieldError(f"{path}.timeoutSeconds", "Invalid", "the timeout value must be between 1 and 30 seconds", timeout))
        cc = hook.get("clientConfig") or {}
        if bool(cc.get("url")) == bool(cc.get("service")):
            errs.append(FieldError(f"{path}.clientConfig", "Required", "exactly one of url or service is required"))
        elif cc.get("url") and not str(cc["url"]).startswith("https://"):
            errs.append(FieldError(f"{path}.clientConfig.url", "Invalid", "'https' is the only allowed URL scheme", cc["url"]))
        errs += _condition_errors(path, hook.get("matchConditions") or [])
        for j, rule in enumerate(hook.get("rules") or []):
            for op in rule.get("operations") or []:
                if op not in (*OPERATIONS, "*"):
                    errs.append(FieldError(f"{path}.rules[{j}].operations", "NotSupported", "", op))
    return errs


def _condition_errors(path: str, conditions: Sequence[Mapping]) -> list[FieldError]:
    """What the API validates of a webhook's matchConditions: at most 64, each with a
    unique qualified name and an expression that compiles."""
    errs: list[FieldError] = []
    if len(conditions) > MAX_MATCH_CONDITIONS:
        errs.append(FieldError(f"{path}.matchConditions", "TooMany",
                               f"{len(conditions)}: must have at most {MAX_MATCH_CONDITIONS} items"))
    seen = set()
    for k, cond in enumerate(conditions):
        where = f"{path}.matchConditions[{k}]"
        name = cond.get("name") or ""
        if not name:
            errs.append(FieldError(f"{where}.name", "Required", ""))
        elif not _QUALIFIED_NAME.match(name) or len(name.rpartition("/")[2]) > 63:
            errs.append(FieldError(f"{where}.name", "Invalid", "name part must consist of alphanumeric characters, "
                                   "'-', '_' or '.', and must start and end with an alphanumeric character", name))
        elif name in seen:
            errs.append(FieldError(f"{where}.name", "Duplicate", "", name))
        seen.add(name)
        expression = cond.get("expression") or ""
        if not expression:
            errs.append(FieldError(f"{where}.expression", "Required", ""))
            continue
        problem = compile_problem(expression)
        if problem is not None:
            errs.append(FieldError(f"{where}.expression", "Invalid", problem, expression))
    return errs
