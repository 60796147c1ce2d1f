"""Validating admission webhooks in the stand-in (sandbox/apiserver/webhooks.py):
a real HTTPS webhook behind a Service, verified with the configuration's
caBundle; rules, namespace and object selectors; what the webhook sees
(AdmissionReview v1 with the defaulted object and the old one); its denial,
warnings, timeouts and failurePolicy, as kubectl shows them."""

from __future__ import annotations

import base64
import json
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml
from kubernetes.client.rest import ApiException

from sandbox.apiserver import tls
from sandbox.apiserver.authn import ADMIN_USER

from .conftest import EXAMPLE, Cluster

HOOK_NS = "hooks"


class Webhook:
    """An HTTPS webhook on 127.0.0.1 that denies objects labelled ``verdict=deny``,
    answers late for ``verdict=slow``, and nonsense for ``verdict=garbage``."""

    def __init__(self, tmp):
        self.pki = tls.ensure(tmp / "hook-pki", [f"checker.{HOOK_NS}.svc"], "checker")
        self.reviews: list[dict] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_):
                pass

            def do_POST(self):
                sent = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                hook.reviews.append({"path": self.path, **sent})
                request = sent["request"]
                labels = ((request.get("object") or {}).get("metadata") or {}).get("labels") or {}
                verdict = labels.get("verdict", "allow")
                if verdict == "slow":
                    time.sleep(2.5)
                response = {"uid": request["uid"], "allowed": verdict != "deny"}
                if verdict == "deny":
                    response["status"] = {"code": 422, "reason": "Invalid",
                                          "message": "data.size: must be a number"}
                if verdict == "warn":
                    response["warnings"] = ["data.size is deprecated"]
                body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
                if verdict == "garbage":
                    body = {"hello": "world"}
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.pki.server_cert, self.pki.server_key)
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def ca_bundle(self) -> str:
        return base64.b64encode(self.pki.ca_cert.read_bytes()).decode()


@pytest.fixture(scope="module")
def hook(cluster: Cluster, tmp_path_factory):
    w = Webhook(tmp_path_factory.mktemp("webhook"))
    c = cluster
    if HOOK_NS not in {n.metadata.name for n in c.core.list_namespace().items}:
        c.core.create_namespace({"metadata": {"name": HOOK_NS}})
    # The webhook's pod and Service: the API server reaches a Ready endpoint of it.
    c.core.create_namespaced_pod(HOOK_NS, {"metadata": {"name": "checker", "labels": {"app": "checker"}}, "spec": {
        "containers": [{"name": "c", "image": "x", "ports": [{"name": "https", "containerPort": w.port}]}]}})
    c.core.patch_namespaced_pod_status("checker", HOOK_NS, {"status": {
        "phase": "Running", "podIP": "127.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]}})
    c.core.create_namespaced_service(HOOK_NS, {"metadata": {"name": "checker"}, "spec": {
        "selector": {"app": "checker"}, "ports": [{"port": 443, "targetPort": "https"}]}})
    yield w
    w.server.shutdown()


def configuration(hook: Webhook, config: str, **overrides) -> dict:
    webhook = {
        "name": f"{config}.checks.example.com",
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "clientConfig": {"service": {"namespace": HOOK_NS, "name": "checker", "path": f"/{config}"},
                         "caBundle": hook.ca_bundle()},
        "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"],
                   "resources": ["configmaps"]}],
        "namespaceSelector": {"matchLabels": {"checked": "yes"}},
        "objectSelector": {"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]},
        "timeoutSeconds": 1,
        **overrides,
    }
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": config}, "webhooks": [webhook]}


def configmap(name: str, **labels) -> dict:
    return {"metadata": {"name": name, "labels": labels}, "data": {"size": "big"}}


@pytest.fixture
def checked(cluster: Cluster, hook: Webhook):
    ns = cluster.namespace("checked")
    cluster.core.patch_namespace(ns, {"metadata": {"labels": {"checked": "yes"}}})
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(configuration(hook, "cm")))
    hook.reviews.clear()
    yield ns
    cluster.kubectl("delete", "validatingwebhookconfiguration", "cm", "--ignore-not-found")


def test_a_denied_object_is_refused_with_the_webhooks_message_and_nothing_is_stored(cluster, hook, checked):
    proc = cluster.kubectl("create", "-n", checked, "-f", "-", check=False,
                           stdin=json.dumps({"apiVersion": "v1", "kind": "ConfigMap", **configmap("bad", verdict="deny")}))
    assert proc.returncode != 0
    assert 'admission webhook "cm.checks.example.com" denied the request: data.size: must be a number' in proc.stderr
    with pytest.raises(ApiException) as err:
        cluster.core.create_namespaced_config_map(checked, configmap("bad", verdict="deny"))
    assert err.value.status == 422
    assert [c.metadata.name for c in cluster.core.list_namespaced_config_map(checked).items if c.metadata.name == "bad"] == []


def test_the_webhook_sees_the_object_as_it_would_be_stored_and_the_old_one_on_update(cluster, hook, checked):
    cluster.core.create_namespaced_config_map(checked, configmap("good"))
    cluster.core.patch_namespaced_config_map("good", checked, {"data": {"size": "small"}})
    create, update = [r["request"] for r in hook.reviews]
    assert hook.reviews[0]["path"].startswith("/cm?timeout=1s")
    assert (create["operation"], create["namespace"], create["name"]) == ("CREATE", checked, "good")
    assert create["kind"] == {"group": "", "version": "v1", "kind": "ConfigMap"}
    assert create["resource"] == {"group": "", "version": "v1", "resource": "configmaps"}
    assert create["object"]["metadata"]["uid"] and create["oldObject"] is None
    assert create["userInfo"]["username"] == ADMIN_USER and create["dryRun"] is False
    assert update["operation"] == "UPDATE"
    assert update["oldObject"]["data"] == {"size": "big"} and update["object"]["data"] == {"size": "small"}


def test_selectors_and_rules_decide_who_is_sent(cluster, hook, checked):
    unchecked = cluster.namespace("unchecked")
    cluster.core.create_namespaced_config_map(unchecked, configmap("elsewhere", verdict="deny"))
    cluster.core.create_namespaced_config_map(checked, configmap("skipped", verdict="deny", skip="yes"))
    cluster.core.create_namespaced_secret(checked, {"metadata": {"name": "s", "labels": {"verdict": "deny"}}})
    # A status update or a delete is not among the rules either.
    cluster.core.delete_namespaced_config_map("skipped", checked)
    assert hook.reviews == []


def test_warnings_reach_the_client(cluster, hook, checked):
    proc = cluster.kubectl("create", "-n", checked, "-f", "-",
                           stdin=json.dumps({"apiVersion": "v1", "kind": "ConfigMap", **configmap("warned", verdict="warn")}))
    assert "Warning: data.size is deprecated" in proc.stderr


def test_a_webhook_that_fails_refuses_the_write_unless_its_failure_policy_ignores_it(cluster, hook, checked):
    for verdict, why in (("slow", "context deadline exceeded"), ("garbage", "expected response.apiVersion")):
        with pytest.raises(ApiException) as err:
            cluster.core.create_namespaced_config_map(checked, configmap(f"cm-{verdict}", verdict=verdict))
        message = json.loads(err.value.body)["message"]
        assert err.value.status == 500, message
        assert 'failed calling webhook "cm.checks.example.com"' in message and why in message
    # No endpoint, and a CA the webhook's certificate is not from: Fail refuses, Ignore lets it through.
    other = tls.ensure(hook.pki.ca_cert.parent.parent / "other-pki", ["x"], "x")
    broken = [configuration(hook, "noendpoint", clientConfig={"service": {"namespace": HOOK_NS, "name": "missing"}}),
              configuration(hook, "wrongca", clientConfig={
                  "service": {"namespace": HOOK_NS, "name": "checker"},
                  "caBundle": base64.b64encode(other.ca_cert.read_bytes()).decode()})]
    cluster.kubectl("delete", "validatingwebhookconfiguration", "cm")
    for cfg, why in zip(broken, ("no endpoints available", "CERTIFICATE_VERIFY_FAILED"), strict=True):
        cluster.kubectl("apply", "-f", "-", stdin=json.dumps(cfg))
        with pytest.raises(ApiException) as err:
            cluster.core.create_namespaced_config_map(checked, configmap(f"cm-{cfg['metadata']['name']}"))
        assert err.value.status == 500 and why in json.loads(err.value.body)["message"], err.value.body
        cfg["webhooks"][0]["failurePolicy"] = "Ignore"
        cluster.kubectl("apply", "-f", "-", stdin=json.dumps(cfg))
        cluster.core.create_namespaced_config_map(checked, configmap(f"cm-{cfg['metadata']['name']}"))
        cluster.kubectl("delete", "validatingwebhookconfiguration", cfg["metadata"]["name"])


def test_the_api_refuses_a_configuration_it_cannot_call(cluster, hook):
    cfg = configuration(hook, "bad", name="short", sideEffects="Some", timeoutSeconds=60)
    proc = cluster.kubectl("apply", "-f", "-", stdin=json.dumps(cfg), check=False)
    assert proc.returncode != 0
    for path in ("webhooks[0].name", "webhooks[0].sideEffects", "webhooks[0].timeoutSeconds"):
        assert path in proc.stderr, proc.stderr


# --- matchConditions (CEL) ------------------------------------------------------------


def conditioned(hook: Webhook, config: str, conditions: list[dict], **overrides) -> dict:
    return configuration(hook, config, matchConditions=conditions, **overrides)


@pytest.fixture
def with_config(cluster: Cluster, hook: Webhook):
    """Apply a configuration for the test; remove it afterwards."""
    names = []

    def apply(cfg: dict) -> None:
        names.append(cfg["metadata"]["name"])
        cluster.kubectl("apply", "-f", "-", stdin=json.dumps(cfg))
        hook.reviews.clear()

    yield apply
    for name in names:
        cluster.kubectl("delete", "validatingwebhookconfiguration", name, "--ignore-not-found")


def test_a_false_match_condition_skips_the_webhook_and_true_ones_call_it(cluster, hook, with_config):
    ns = cluster.namespace("conds")
    cluster.core.patch_namespace(ns, {"metadata": {"labels": {"checked": "yes"}}})
    with_config(conditioned(hook, "conds", [
        {"name": "not-tiny", "expression": "object.data.size != 'tiny'"},
        {"name": "example.com/not-system", "expression": "!request.userInfo.username.startsWith('system:')"},
    ]))
    # False: the webhook, which would deny it, is not asked, and the write is made.
    cluster.core.create_namespaced_config_map(ns, {"metadata": {"name": "tiny", "labels": {"verdict": "deny"}},
                                                   "data": {"size": "tiny"}})
    assert hook.reviews == []
    # All true: asked, and its denial holds.
    with pytest.raises(ApiException) as err:
        cluster.core.create_namespaced_config_map(ns, configmap("big", verdict="deny"))
    assert err.value.status == 422 and len(hook.reviews) == 1
    # request.userInfo is the requester's: a ServiceAccount's write is exempt.
    cluster.kubectl("create", "serviceaccount", "writer", "-n", ns)
    cluster.kubectl("create", "rolebinding", "writer", "--clusterrole=edit", f"--serviceaccount={ns}:writer", "-n", ns)
    hook.reviews.clear()
    cluster.kubectl("create", "configmap", "by-sa", "-n", ns, "--from-literal=size=big",
                    f"--as=system:serviceaccount:{ns}:writer")
    assert hook.reviews == []


def test_a_condition_that_fails_refuses_under_fail_and_skips_under_ignore(cluster, hook, with_config):
    ns = cluster.namespace("conderr")
    cluster.core.patch_namespace(ns, {"metadata": {"labels": {"checked": "yes"}}})
    # oldObject is null on a create: selecting a field of it fails.
    broken = {"name": "old-size", "expression": "oldObject.data.size != 'tiny'"}
    with_config(conditioned(hook, "conderr", [broken]))
    with pytest.raises(ApiException) as err:
        cluster.core.create_namespaced_config_map(ns, configmap("a"))
    body = json.loads(err.value.body)
    assert err.value.status == 403 and body["reason"] == "Forbidden", body
    assert body["message"].startswith(
        "configmaps \"a\" is forbidden: expression 'oldObject.data.size != 'tiny'' resulted in error: "), body
    assert hook.reviews == []
    # A missing key, in cel-go's words.
    with_config(conditioned(hook, "conderr", [{"name": "colour", "expression": "object.data.colour == 'red'"}]))
    with pytest.raises(ApiException) as err:
        cluster.core.create_namespaced_config_map(ns, configmap("b"))
    assert "resulted in error: no such key: colour" in json.loads(err.value.body)["message"]
    # A false condition wins over one that fails: skipped, written.
    with_config(conditioned(hook, "conderr", [broken, {"name": "never", "expression": "false"}]))
    cluster.core.create_namespaced_config_map(ns, configmap("c", verdict="deny"))
    # Ignore: the webhook is skipped and the write made, unchecked.
    with_config(conditioned(hook, "conderr", [broken], failurePolicy="Ignore"))
    cluster.core.create_namespaced_config_map(ns, configmap("d", verdict="deny"))
    assert hook.reviews == []
    assert {"c", "d"} <= {c.metadata.name for c in cluster.core.list_namespaced_config_map(ns).items}


def test_the_api_refuses_conditions_that_do_not_compile_or_repeat_a_name(cluster, hook):
    cfg = conditioned(hook, "badconds", [
        {"name": "ok", "expression": "object.data.size != 'tiny'"},
        {"name": "ok", "expression": "true"},
        {"name": "broken", "expression": "object.data.size !="},
        {"name": "Not A Name!", "expression": "true"},
        {"name": "empty", "expression": ""},
    ])
    proc = cluster.kubectl("apply", "-f", "-", stdin=json.dumps(cfg), check=False)
    assert proc.returncode != 0
    for expected in ('webhooks[0].matchConditions[1].name: Duplicate value: "ok"',
                     "webhooks[0].matchConditions[2].expression: Invalid value: \"object.data.size !=\": "
                     "compilation failed",
                     "webhooks[0].matchConditions[3].name: Invalid value",
                     "webhooks[0].matchConditions[4].expression: Required value"):
        assert expected in proc.stderr, proc.stderr
    many = conditioned(hook, "manyconds", [{"name": f"c{i}", "expression": "true"} for i in range(65)])
    proc = cluster.kubectl("apply", "-f", "-", stdin=json.dumps(many), check=False)
    assert "webhooks[0].matchConditions: Too many: 65: must have at most 64 items" in proc.stderr, proc.stderr


def test_the_charts_conditions_spare_spec_less_updates_and_the_operators_own_writes(cluster, hook, with_config):
    """The chart's matchConditions (charts/slurmk8s/templates/webhook.yaml), evaluated by the
    stand-in: only a create, and a spec change by someone else than the operator, reach the
    webhook; kopf's finalizer, labels, status and the operator's own writes never wait for it."""
    from ..test_chart import NAMESPACE, RELEASE, objects

    cluster.install_crds()
    ns = cluster.namespace("slurm")
    rendered = next(o for o in objects({"watchNamespaces": [ns]}) if o["kind"] == "ValidatingWebhookConfiguration")
    chart_hook = rendered["webhooks"][0]
    with_config(configuration(hook, "chart", rules=chart_hook["rules"], namespaceSelector=chart_hook["namespaceSelector"],
                              objectSelector={}, matchConditions=chart_hook["matchConditions"], timeoutSeconds=5))
    operator = f"system:serviceaccount:{NAMESPACE}:{RELEASE}-slurmk8s"
    if NAMESPACE not in {n.metadata.name for n in cluster.core.list_namespace().items}:
        cluster.core.create_namespace({"metadata": {"name": NAMESPACE}})
    cluster.kubectl("create", "serviceaccount", f"{RELEASE}-slurmk8s", "-n", NAMESPACE, check=False)
    cluster.kubectl("create", "serviceaccount", "someone", "-n", ns)
    cluster.kubectl("create", "role", "writer", "--verb=get,patch", "--resource=slurmclusters.slurmk8s.dev", "-n", ns)
    for who in (f"{NAMESPACE}:{RELEASE}-slurmk8s", f"{ns}:someone"):
        cluster.kubectl("create", "rolebinding", f"writer-{who.split(':')[1]}", "--role=writer",
                        f"--serviceaccount={who}", "-n", ns)
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["namespace"] = ns
    name = doc["metadata"]["name"]

    def patch(body: dict, *extra: str) -> None:
        cluster.kubectl("patch", "slurmcluster", name, "-n", ns, "--type=merge", "-p", json.dumps(body), *extra)

    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(doc))
    assert [r["request"]["operation"] for r in hook.reviews] == ["CREATE"]
    hook.reviews.clear()
    patch({"metadata": {"labels": {"team": "a"}, "annotations": {"slurmk8s.dev/x": "1"}}})
    patch({"metadata": {"finalizers": ["slurmk8s.dev/teardown"]}})
    patch({"status": {"phase": "Ready"}}, "--subresource=status")
    patch({"spec": {"clusterDomain": "example.org"}}, f"--as={operator}")
    assert hook.reviews == []
    patch({"spec": {"clusterDomain": "example.net"}}, f"--as=system:serviceaccount:{ns}:someone")
    patch({"spec": {"clusterDomain": "example.com"}})
    assert [(r["request"]["operation"], r["request"]["userInfo"]["username"]) for r in hook.reviews] == [
        ("UPDATE", f"system:serviceaccount:{ns}:someone"), ("UPDATE", ADMIN_USER)]
    cluster.kubectl("patch", "slurmcluster", name, "-n", ns, "--type=json",
                    "-p", '[{"op": "remove", "path": "/metadata/finalizers"}]')
