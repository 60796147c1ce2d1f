"""The chart's validating webhook (templates/webhook.yaml; decision records 34
and 51), rendered by the real Helm engine: the same objects at every render
(GitOps), its certificate kept by the process that serves it or made by
cert-manager, served by the operator or from the nodes' network, the
conditions that spare writes it has nothing to say about, and nothing of it
when it is off."""

from __future__ import annotations

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from sandbox.apiserver.selectors import selects
from slurmk8s import cli
from slurmk8s.api import load_cluster
from slurmk8s.operator.certkeeper import PERMISSIONS as CERT_KEEPER
from slurmk8s.permissions import grants
from slurmk8s.render import ClusterKeys, names, render
from slurmk8s.render.manifests import AgentClients

from . import certmanager
from .conftest import EXAMPLE
from .test_chart import (
    CHART,
    CONFIGURATION,
    K8S_VERSIONS,
    KEPT_SECRET,
    NAMESPACE,
    RELEASE,
    WEBHOOK_SERVICE,
    container,
    deployment,
    granted,
    objects,
    of,
    one,
)

SETS = {
    "kept": {},
    "kept-on-hosts": {"webhook": {"hostNetwork": True}},
    "cert-manager": {"webhook": {"certManager": {"enabled": True}}},
    "cert-manager-on-hosts": {"webhook": {"certManager": {"enabled": True}, "hostNetwork": True}},
}
OPERATOR_SA = f"system:serviceaccount:{NAMESPACE}:{RELEASE}-slurmk8s"


def config(objs: list[dict]) -> dict:
    return one(objs, "ValidatingWebhookConfiguration")


def service(objs: list[dict]) -> dict:
    return one(objs, "Service", WEBHOOK_SERVICE)


def args_of(c: dict, command) -> dict:
    """The params the chart's arguments give ``command`` (a click command)."""
    args = c["args"]
    return command.make_context(command.name, args[args.index(command.name) + 1:]).params


@pytest.mark.parametrize("name", SETS)
def test_helm_lint_is_clean_and_the_kubernetes_objects_validate(name):
    report = helm.lint(CHART, SETS[name], strict=True, namespace=NAMESPACE, kube_version=f"v{K8S_VERSIONS[0]}")
    assert report["errors"] == [] and [m for m in report["messages"] if m["severity"] >= 2] == []
    for o in objects(SETS[name]):
        if o["apiVersion"] != "cert-manager.io/v1":  # cert-manager's kinds: below
            for version in K8S_VERSIONS:
                kubernetes_validate.validate(o, version, strict=True)


@pytest.mark.parametrize("name", SETS)
def test_helm_template_renders_the_same_objects_every_time(name):
    """Nothing is generated at render time: `helm template` (Argo CD) gives what the
    cluster runs, so a GitOps tool syncs once and stays synced."""
    with helm.Chart.load(CHART) as chart:
        first = chart.render(SETS[name], name=RELEASE, namespace=NAMESPACE)
        second = chart.render(SETS[name], name=RELEASE, namespace=NAMESPACE)
    assert first == second
    # And no field a process fills in later: Helm and Argo CD leave those alone.
    objs = objects(SETS[name])
    assert all("caBundle" not in h["clientConfig"] for h in config(objs)["webhooks"])
    assert not [o for o in objs if o["kind"] == "Secret" and o.get("data")]


def test_by_default_the_operator_keeps_the_certificate_in_a_secret_the_chart_makes_empty():
    objs = objects()
    secret = one(objs, "Secret", KEPT_SECRET)
    assert secret["type"] == "Opaque" and "data" not in secret and "stringData" not in secret
    assert service(objs)["spec"]["selector"] == deployment(objs)["spec"]["selector"]["matchLabels"]
    params = args_of(container(objs), cli.operator_cmd)
    assert (params["webhook_port"], params["webhook_cert_dir"]) == (9443, None)
    assert (params["webhook_secret"], params["webhook_configuration"], params["webhook_service"]) == (
        KEPT_SECRET, CONFIGURATION, WEBHOOK_SERVICE)
    assert config(objs)["metadata"]["name"] == CONFIGURATION
    # $POD_NAMESPACE: the Secret's and the Service's namespace.
    env = {e["name"]: e for e in container(objs)["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    # Nothing mounted: the operator reads its Secret through the API.
    assert [m["name"] for m in container(objs)["volumeMounts"]] == ["tmp"]
    # Its rights on them, by name, and nothing more than the keeper declares.
    rules = {(o["kind"], o["metadata"].get("namespace")): o["rules"] for o in of(objs, "operator")
             if o["metadata"]["name"].endswith("-webhook-certs") and o["kind"] in ("Role", "ClusterRole")}
    assert rules == {
        ("Role", NAMESPACE): [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": [KEPT_SECRET],
                               "verbs": ["get", "update"]}],
        ("ClusterRole", None): [{"apiGroups": ["admissionregistration.k8s.io"],
                                 "resources": ["validatingwebhookconfigurations"],
                                 "resourceNames": [CONFIGURATION], "verbs": ["get", "update"]}]}
    assert {(v, g, r) for v, g, r, _ in CERT_KEEPER} == {
        (v, g, r) for rs in rules.values() for rule in rs for g in rule["apiGroups"] for r in rule["resources"]
        for v in rule["verbs"]}


def test_the_configuration_calls_the_service_for_the_watched_namespaces_with_its_conditions():
    objs = objects({"watchNamespaces": ["hpc-a", "hpc-b"], "bridge": {"watchNamespaces": ["lending"]}})
    cfg = config(objs)
    assert service(objs)["spec"]["ports"] == [{"name": "https", "port": 443, "targetPort": "webhook",
                                              "protocol": "TCP"}]
    hooks = {h["name"]: h for h in cfg["webhooks"]}
    assert {n: h["rules"][0]["resources"] for n, h in hooks.items()} == {
        "slurmclusters.validate.slurmk8s.dev": ["slurmclusters"],
        "nodelendingpolicies.validate.slurmk8s.dev": ["nodelendingpolicies"]}
    assert hooks["slurmclusters.validate.slurmk8s.dev"]["namespaceSelector"]["matchExpressions"][0]["values"] == [
        "hpc-a", "hpc-b"]
    assert hooks["nodelendingpolicies.validate.slurmk8s.dev"]["namespaceSelector"]["matchExpressions"][0][
        "values"] == ["lending"]
    for hook in hooks.values():
        assert hook["clientConfig"]["service"] == {"namespace": NAMESPACE, "name": WEBHOOK_SERVICE,
                                                   "path": "/validate", "port": 443}
        assert hook["failurePolicy"] == "Fail" and hook["sideEffects"] == "None"
        conditions = {c["name"]: c["expression"] for c in hook["matchConditions"]}
        assert set(conditions) == {"spec-changed", "not-the-operator"}
        assert "object.spec != oldObject.spec" in conditions["spec-changed"]
        assert conditions["not-the-operator"] == f"request.userInfo.username != '{OPERATOR_SA}'"
    # Every namespace: no namespaceSelector.
    assert "namespaceSelector" not in config(objects({"watchAllNamespaces": True}))["webhooks"][0]


def test_the_values_reach_the_port_the_service_and_the_policy():
    objs = objects({"webhook": {"port": 10250, "service": {"port": 8443}, "failurePolicy": "Ignore",
                                "timeoutSeconds": 5}})
    assert {p["name"]: p["containerPort"] for p in container(objs)["ports"]}["webhook"] == 10250
    assert args_of(container(objs), cli.operator_cmd)["webhook_port"] == 10250
    assert service(objs)["spec"]["ports"][0]["port"] == 8443
    for hook in config(objs)["webhooks"]:
        assert hook["clientConfig"]["service"]["port"] == 8443
        assert (hook["failurePolicy"], hook["timeoutSeconds"]) == ("Ignore", 5)
    policy = one(of(objs, "operator"), "NetworkPolicy")
    assert [r["ports"] for r in policy["spec"]["ingress"]] == [[{"protocol": "TCP", "port": 10250}]]


def test_with_cert_manager_a_ca_issues_the_certificate_and_is_injected():
    objs = objects(SETS["cert-manager"])
    managed = [o for o in objs if o["apiVersion"] == "cert-manager.io/v1"]
    for o in managed:
        assert certmanager.problems(o) == [], (o["kind"], o["metadata"]["name"])
    issuers = {o["metadata"]["name"]: o for o in managed if o["kind"] == "Issuer"}
    certificates = {o["metadata"]["name"]: o for o in managed if o["kind"] == "Certificate"}
    assert len(issuers) == 2 and len(certificates) == 2
    serving = certificates[WEBHOOK_SERVICE]
    ca = next(c for c in certificates.values() if c["spec"].get("isCA"))
    # self-signed Issuer -> CA Certificate -> CA Issuer (its Secret) -> serving Certificate.
    assert "selfSigned" in issuers[ca["spec"]["issuerRef"]["name"]]["spec"]
    ca_issuer = issuers[serving["spec"]["issuerRef"]["name"]]
    assert ca_issuer["spec"]["ca"]["secretName"] == ca["spec"]["secretName"]
    assert all(o["metadata"]["namespace"] == NAMESPACE for o in managed)
    assert f"{WEBHOOK_SERVICE}.{NAMESPACE}.svc" in serving["spec"]["dnsNames"]
    assert "server auth" in serving["spec"]["usages"]
    # The CA injector fills caBundle from the serving Certificate's Secret's ca.crt.
    assert config(objs)["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == \
        f"{NAMESPACE}/{WEBHOOK_SERVICE}"
    # The operator serves the Secret cert-manager writes, mounted; nothing kept, no rights to keep it.
    params = args_of(container(objs), cli.operator_cmd)
    assert params["webhook_cert_dir"] == "/etc/slurmk8s/webhook" and params["webhook_secret"] is None
    pod = deployment(objs)["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "webhook-cert")
    assert volume["secret"]["secretName"] == serving["spec"]["secretName"]
    assert {"name": "webhook-cert", "mountPath": params["webhook_cert_dir"], "readOnly": True} in \
        container(objs)["volumeMounts"]
    assert not [o for o in objs if o["kind"] == "Secret"]
    assert not [o for o in objs if o["metadata"]["name"].endswith("-webhook-certs")]


def test_certmanager_schema_refuses_what_cert_manager_would():
    """The schema the test above relies on is not vacuous."""
    good = next(o for o in objects(SETS["cert-manager"]) if o["kind"] == "Certificate" and not o["spec"].get("isCA"))
    assert certmanager.problems(good) == []
    for change, why in (({"dnsName": ["x"]}, "Additional properties"), ({"usages": ["server-auth"]}, "is not one of"),
                        ({"privateKey": {"algorithm": "ECDSA", "size": 2048}}, "not a size"),
                        ({"renewBefore": "9000h"}, "less than spec.duration"), ({"issuerRef": {}}, "'name'")):
        bad = {**good, "spec": {**good["spec"], **change}}
        assert any(why in p for p in certmanager.problems(bad)), (change, certmanager.problems(bad))
    issuer = {"apiVersion": "cert-manager.io/v1", "kind": "Issuer", "metadata": {"name": "x"},
              "spec": {"selfSigned": {}, "ca": {"secretName": "s"}}}
    assert certmanager.problems(issuer)


@pytest.mark.parametrize("name", ["kept-on-hosts", "cert-manager-on-hosts"])
def test_on_the_host_network_a_deployment_of_its_own_serves_it_and_the_operator_stays_on_the_pod_network(name):
    objs = objects(SETS[name])
    kept = name == "kept-on-hosts"
    hook = deployment(objs, "webhook")
    pod = hook["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    c = container(objs, "webhook")
    params = args_of(c, cli.webhook_cmd)
    assert params["port"] == 9443 and params["trusted_repositories"] == ("ghcr.io/slurmk8s",)
    if kept:
        assert (params["secret"], params["configuration"], params["service"]) == (
            KEPT_SECRET, CONFIGURATION, WEBHOOK_SERVICE)
    else:
        assert params["cert_dir"] == "/etc/slurmk8s/webhook" and params["secret"] is None
    assert c["ports"] == [{"name": "webhook", "containerPort": 9443, "protocol": "TCP"}]
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "webhook", "scheme": "HTTPS"}
    # A token only to keep the certificate: with cert-manager it needs none.
    assert pod["automountServiceAccountToken"] is kept
    assert pod["serviceAccountName"] == one(of(objs, "webhook"), "ServiceAccount")["metadata"]["name"]
    have = granted(objs, "webhook") if kept else {}
    assert have == (grants(CERT_KEEPER, [NAMESPACE], NAMESPACE) if kept else {})
    assert service(objs)["spec"]["selector"] == hook["spec"]["selector"]["matchLabels"]
    assert one(of(objs, "webhook"), "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1

    # The operator: on the pod network, no webhook, no rights to its certificate, no port open for it.
    operator = deployment(objs)["spec"]["template"]["spec"]
    assert "hostNetwork" not in operator
    assert "webhook" not in {p["name"] for p in container(objs)["ports"]}
    assert not {a for a in container(objs)["args"] if a.startswith("--webhook")}
    assert not [o for o in of(objs, "operator") if o["metadata"]["name"].endswith("-webhook-certs")]
    assert one(of(objs, "operator"), "NetworkPolicy")["spec"]["ingress"] == []
    # ... so each cluster's Slurm agent admits it as before: its policy selects the operator's pods.
    params = args_of(container(objs), cli.operator_cmd)
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["namespace"] = "hpc"
    policy = next(o for o in render(load_cluster(doc), ClusterKeys.generate(),
                                    agent_clients=AgentClients(params["release_namespace"], params["release_name"]))
                  if o["kind"] == "NetworkPolicy" and o["metadata"]["name"].endswith("-controller"))
    labels = deployment(objs)["spec"]["template"]["metadata"]["labels"]
    namespace_labels = {"kubernetes.io/metadata.name": NAMESPACE}
    agent = [rule for rule in policy["spec"]["ingress"] if any(p["port"] == names.AGENT_PORT for p in rule["ports"])]
    assert agent and all(
        any(selects(peer.get("podSelector"), labels) and selects(peer.get("namespaceSelector"), namespace_labels)
            for peer in rule.get("from", [])) for rule in agent)


def test_turned_off_nothing_of_it_is_rendered():
    objs = objects({"webhook": {"enabled": False, "hostNetwork": True, "certManager": {"enabled": True}}})
    assert not [o for o in objs if o["kind"] in ("ValidatingWebhookConfiguration", "Secret", "Issuer", "Certificate")]
    assert not [o for o in objs if "webhook" in o["metadata"]["name"]]
    assert of(objs, "webhook") == []
    c = container(objs)
    assert not {a for a in c["args"] if a.startswith("--webhook")}
    assert "webhook" not in {p["name"] for p in c["ports"]}
    assert one(of(objs, "operator"), "NetworkPolicy")["spec"]["ingress"] == []


@pytest.mark.parametrize("values,message", [
    ({"webhook": {"port": 443}}, "at '/webhook/port'"),
    ({"webhook": {"hostNetwork": "yes"}}, "at '/webhook/hostNetwork': got string, want boolean"),
    ({"webhook": {"replicas": 0}}, "at '/webhook/replicas'"),
    ({"webhook": {"service": {"port": 0}}}, "at '/webhook/service/port'"),
    ({"webhook": {"certManager": {"issuer": "mine"}}}, "additional properties 'issuer' not allowed"),
])
def test_schema_refuses_bad_webhook_values_naming_the_field(values, message):
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError) as err:
        chart.render(values, name=RELEASE, namespace=NAMESPACE)
    assert message in str(err.value)


def test_the_kubelets_port_is_refused_on_the_host_network():
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmRenderError, match="the kubelet listens there"):
        chart.render({"webhook": {"hostNetwork": True, "port": 10250}}, name=RELEASE, namespace=NAMESPACE)
