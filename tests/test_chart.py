"""The Helm chart, rendered and linted by the real Helm engine (helm-python-sdk, offline).

Over 500 lines because the chart is rendered once per module by the real Helm engine and
every value's effect is checked against that.

Each set of values is rendered once per module; every rendered object is checked
against the official Kubernetes schemas.
"""

from __future__ import annotations

import functools
import json
import re

import click
import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from slurmk8s import cli, log
from slurmk8s.api import load_cluster
from slurmk8s.api.crd import all_crds
from slurmk8s.bridge.permissions import BRIDGE
from slurmk8s.leader import LEASE_SECONDS_MAX, LEASE_SECONDS_MIN, lease_name, legacy_lease_name
from slurmk8s.operator.certkeeper import PERMISSIONS as CERT_KEEPER
from slurmk8s.operator.permissions import OPERATOR
from slurmk8s.operator.plan import MANAGED_KINDS
from slurmk8s.permissions import allows, grants, of_kind
from slurmk8s.render import render

from .conftest import EXAMPLE, ROOT

CHART = ROOT / "charts" / "slurmk8s"
RELEASE, NAMESPACE = "ops", "slurmk8s-system"
K8S_VERSIONS = sorted({"1.29.0", kubernetes_validate.latest_version()})
#: A second set of values that switches every optional part the other way.
WATCHED = ["hpc-a", "hpc-b"]
#: The webhook's Service, the Secret its server keeps its certificate in, its configuration.
WEBHOOK_SERVICE = f"{RELEASE}-slurmk8s-webhook"
KEPT_SECRET = f"{WEBHOOK_SERVICE}-certs"
CONFIGURATION = f"{RELEASE}-slurmk8s-{NAMESPACE}"


@pytest.fixture(scope="module")
def chart():
    with helm.Chart.load(CHART) as loaded:
        yield loaded


@functools.cache
def _render(values_json: str) -> tuple[tuple[str, str], ...]:
    with helm.Chart.load(CHART) as loaded:
        out = loaded.render(json.loads(values_json), name=RELEASE, namespace=NAMESPACE)
    return tuple(sorted(out.items()))


def rendered(values: dict | None = None) -> dict[str, str]:
    """Template path -> rendered text, as `helm template` would print it."""
    return dict(_render(json.dumps(values or {}, sort_keys=True)))


def objects(values: dict | None = None) -> list[dict]:
    out = []
    for path, text in rendered(values).items():
        if path.endswith("NOTES.txt"):
            continue
        out += [d for d in yaml.safe_load_all(text) if d]
    return out


def of(objs: list[dict], component: str) -> list[dict]:
    """The objects of one component: "operator" or "bridge"."""
    return [o for o in objs if o["metadata"]["labels"]["app.kubernetes.io/component"] == component]


def one(objs: list[dict], kind: str, name: str | None = None) -> dict:
    found = [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def metrics_service(objs: list[dict]) -> dict:
    [svc] = [o for o in objs if o["kind"] == "Service" and o["metadata"]["name"].endswith("-metrics")]
    return svc


def deployment(objs: list[dict], component: str = "operator") -> dict:
    return one(of(objs, component), "Deployment")


def container(objs: list[dict], component: str = "operator") -> dict:
    pod = deployment(objs, component)["spec"]["template"]["spec"]
    assert len(pod["containers"]) == 1
    assert pod["containers"][0]["name"] == component
    return pod["containers"][0]


def rbac_rules(objs: list[dict], component: str = "operator") -> list[dict]:
    return [r for o in of(objs, component) if o["kind"] in ("Role", "ClusterRole") for r in o["rules"]]


#: Every bridge value set away from its default (watchNamespaces: the operator's).
BRIDGE_OVERRIDES = {
    "interval": 0.5,
    "metrics": {"port": 9190, "service": {"port": 81, "annotations": {"team": "lending"}}},
    "health": {"port": 9191},
    "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
    "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
    "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
        "weight": 1, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname", "labelSelector": {
            "matchLabels": {"app.kubernetes.io/component": "operator"}}}}]}},
    "podAnnotations": {"example.com/owner": "lending"},
    "podLabels": {"example.com/tier": "control"},
    "priorityClassName": "system-node-critical",
    "serviceAccount": {"name": "slurm-bridge", "annotations": {"iam.example.com/role": "lending"}},
}

VALUE_SETS = {
    "defaults": {},
    "namespaced": {
        "watchNamespaces": WATCHED,
        "interval": 30,
        "image": {"tag": "v9.9.9", "pullPolicy": "Always", "pullSecrets": ["regcred"]},
        "logLevel": "debug",
        "logFormat": "console",
        "metrics": {"port": 9090, "service": {"port": 80, "annotations": {"team": "hpc"}}},
        "health": {"port": 9091},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}]}}},
        "podAnnotations": {"example.com/owner": "platform"},
        "priorityClassName": "system-cluster-critical",
        "serviceAccount": {"name": "slurm-operator", "annotations": {"iam.example.com/role": "ops"}},
        "sharedStorage": {"storageClassName": "efs-sc"},
        "bridge": BRIDGE_OVERRIDES,
        "networkPolicy": {
            "webhookFrom": ["192.0.2.0/24"],
            "metricsFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                             "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}],
            "healthFrom": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.9.0.0/16"]}}],
            "egress": {"apiServer": {"ports": [6443], "cidrs": ["198.51.100.0/28"]},
                       "extraRules": [{"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}]},
        },
    },
    "bare": {"networkPolicy": {"enabled": False}, "crds": {"install": False},
             "rbac": {"create": False, "aggregateClusterRoles": False}, "serviceAccount": {"create": False},
             "metrics": {"service": {"enabled": False}}, "webhook": {"enabled": False},
             "bridge": {"serviceAccount": {"create": False}, "metrics": {"service": {"enabled": False}}}},
    "bridgeless": {"bridge": {"enabled": False}},
    "clusterwide": {"watchAllNamespaces": True},
}


# --- Helm itself ------------------------------------------------------------------


@pytest.mark.parametrize("name", VALUE_SETS)
def test_helm_lint_is_clean(name):
    report = helm.lint(CHART, VALUE_SETS[name], strict=True, namespace=NAMESPACE,
                       kube_version=f"v{K8S_VERSIONS[0]}")
    assert report["total_charts_linted"] == 1
    assert report["errors"] == []
    # 1 = info ("icon is recommended"); warnings (2) and errors (3) fail.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("k8s_version", K8S_VERSIONS)
@pytest.mark.parametrize("name", VALUE_SETS)
def test_every_rendered_object_validates_against_the_official_schemas(name, k8s_version):
    objs = objects(VALUE_SETS[name])
    assert any(o["kind"] == "Deployment" for o in objs)
    assert len({(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objs}) == len(objs)
    for o in objs:
        kubernetes_validate.validate(o, k8s_version, strict=True)


def test_the_release_holds_the_generated_crds_and_keeps_them_on_uninstall(chart):
    # The files' content is checked against `slurmk8s crd` in test_api.py; here:
    # the release renders every one of them unchanged but for its labels and the keep policy.
    assert chart.crds == []  # not Helm's crds/ folder, which is never upgraded
    shipped = [o for o in objects() if o["kind"] == "CustomResourceDefinition"]
    generated = {o["metadata"]["name"]: o for o in all_crds()}
    assert sorted(o["metadata"]["name"] for o in shipped) == sorted(generated)
    for o in shipped:
        assert o["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        assert o["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
        assert o["spec"] == generated[o["metadata"]["name"]]["spec"]
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(o, version, strict=True)
    assert not [o for o in objects({"crds": {"install": False}}) if o["kind"] == "CustomResourceDefinition"]


def test_chart_yaml_is_what_the_templates_use(chart):
    meta = chart.metadata
    assert meta["apiVersion"] == "v2" and meta["type"] == "application"
    labels = deployment(objects())["metadata"]["labels"]
    assert labels["app.kubernetes.io/version"] == meta["appVersion"]
    assert labels["helm.sh/chart"] == f"{meta['name']}-{meta['version']}"
    assert labels["app.kubernetes.io/instance"] == RELEASE
    assert labels["app.kubernetes.io/managed-by"] == "Helm"


# --- the operator Deployment --------------------------------------------------------


def test_default_deployment_runs_one_operator_safely(chart):
    objs = objects()
    dep = deployment(objs)
    assert dep["metadata"]["namespace"] == NAMESPACE
    assert dep["spec"]["replicas"] == chart.values["replicas"] == 2
    assert dep["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    selector = dep["spec"]["selector"]["matchLabels"]
    pod = dep["spec"]["template"]
    assert selector.items() <= pod["metadata"]["labels"].items()
    assert pod["spec"]["automountServiceAccountToken"] is True
    assert pod["spec"]["serviceAccountName"] == one(of(objs, "operator"), "ServiceAccount")["metadata"]["name"]

    c = container(objs)
    assert c["image"] == f"{chart.values['image']['repository']}:{chart.metadata['appVersion']}"
    assert {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}} in c["env"]
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in c["env"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"metrics": chart.values["metrics"]["port"], "health": chart.values["health"]["port"],
                     "webhook": chart.values["webhook"]["port"]}
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]


@pytest.mark.parametrize("component", ["operator", "bridge"])
def test_replicas_are_spread_and_kept_through_drains_and_only_the_lease_holder_acts(component):
    """Two replicas by default, spread over nodes, one at a time evictable;
    the Lease Role lets them read and renew only their own Lease; one
    replica has neither spreading nor a budget (a budget would block drains)."""
    objs = of(objects(), component)
    dep = deployment(objs, component)
    selector = dep["spec"]["selector"]["matchLabels"]
    [spread] = dep["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname" and spread["labelSelector"]["matchLabels"] == selector
    pdb = one(objs, "PodDisruptionBudget")
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": selector}}
    role = one(objs, "Role", f"{dep['metadata']['name']}-lease")
    assert role["metadata"]["namespace"] == NAMESPACE
    named = [r for r in role["rules"] if r.get("resourceNames")]
    lease = lease_name(component, RELEASE)
    assert named == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                      "resourceNames": [lease], "verbs": ["get", "update"]},
                     {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                      "resourceNames": [legacy_lease_name(component)], "verbs": ["get"]}]
    args = container(objects(), component)["args"]
    assert args[args.index("--lease-namespace") + 1] == NAMESPACE
    # The Lease the command takes is the one the Role names: this release's.
    command = {"operator": cli.operator_cmd, "bridge": cli.bridge_cmd}[component]
    params = command.make_context(component, args[args.index(component) + 1:]).params
    assert lease_name(component, params["release_name"]) == lease
    single = of(objects({"replicas": 1, "bridge": {"replicas": 1}}), component)
    assert deployment(single, component)["spec"]["replicas"] == 1
    assert "topologySpreadConstraints" not in deployment(single, component)["spec"]["template"]["spec"]
    assert not [o for o in single if o["kind"] == "PodDisruptionBudget"]


def test_default_args_watch_the_release_namespace_with_the_global_flags_first(chart):
    args = container(objects())["args"]
    v = chart.values
    assert args == ["--log-level", v["logLevel"], "--log-format", v["logFormat"], "operator",
                    "--metrics-port", str(v["metrics"]["port"]), "--health-port", str(v["health"]["port"]),
                    "--namespace", NAMESPACE, "--interval", str(v["interval"]), "--lease-namespace", NAMESPACE,
                    "--lease-duration", str(v["leaderElection"]["leaseDurationSeconds"]),
                    "--release-namespace", NAMESPACE, "--release-name", RELEASE,
                    "--trusted-repository", "ghcr.io/slurmk8s",
                    "--webhook-port", str(v["webhook"]["port"]), "--webhook-secret", KEPT_SECRET,
                    "--webhook-configuration", CONFIGURATION, "--webhook-service", WEBHOOK_SERVICE]


def test_the_operator_trusts_the_repositories_the_chart_names_for_privileged_slurmd():
    """What the platform team lists in trustedRepositories reaches the operator's validator;
    the chart refuses what is no image repository."""
    from slurmk8s.api import InvalidSpec, load_cluster

    mirror = "registry.example.org:5000/hpc"
    args = container(objects({"trustedRepositories": ["ghcr.io/slurmk8s", mirror]}))["args"]
    params = cli.operator_cmd.make_context("operator", args[args.index("operator") + 1:]).params
    assert params["trusted_repositories"] == ("ghcr.io/slurmk8s", mirror)
    doc = yaml.safe_load((ROOT / "examples" / "slurmcluster.yaml").read_text())
    doc["spec"]["slurmConfig"] = {"cgroups": True}
    doc["spec"]["partitions"] = [{k: v for k, v in p.items() if k != "acceptLentNodes"}
                                 for p in doc["spec"]["partitions"]]
    doc["spec"]["slurm"]["image"] = {"repository": mirror}
    assert load_cluster(doc, trusted_repositories=params["trusted_repositories"]).spec.slurm_config.cgroups
    with pytest.raises(InvalidSpec) as refused:
        load_cluster(doc)  # the project's repository alone
    assert "spec.slurm.image.repository" in str(refused.value) and "trustedRepositories" in str(refused.value)
    with pytest.raises(Exception, match="trustedRepositories"):
        objects({"trustedRepositories": ["https://example.org/x"]})


def test_the_operator_gives_shared_claims_the_storage_class_the_chart_names():
    """Issue 43: sharedStorage.storageClassName reaches the operator (and so its webhook),
    which gives it to a shared claim whose spec names no class; unset, it passes nothing,
    and such a spec is refused naming the field. The schema refuses what is no class name."""
    from slurmk8s.api import InvalidSpec, load_cluster
    from slurmk8s.api.storageclass import with_storage_class

    def params(values):
        args = container(objects(values))["args"]
        return cli.operator_cmd.make_context("operator", args[args.index("operator") + 1:]).params

    doc = yaml.safe_load((ROOT / "examples" / "slurmcluster.yaml").read_text())
    named = params({"sharedStorage": {"storageClassName": "efs-sc"}})["shared_storage_class"]
    assert named == "efs-sc"
    assert with_storage_class(load_cluster(doc), named).spec.shared_storage.volumes[0].storage_class_name == "efs-sc"
    unset = params(None)["shared_storage_class"]
    assert unset is None
    with pytest.raises(InvalidSpec, match=re.escape("spec.sharedStorage.volumes[0].storageClassName")):
        with_storage_class(load_cluster(doc), unset)
    with pytest.raises(Exception, match="sharedStorage/storageClassName"):
        objects({"sharedStorage": {"storageClassName": "EFS_sc"}})


@pytest.mark.parametrize("trusted", [None, ["ghcr.io/slurmk8s", "registry.example.org:5000/hpc"]])
def test_the_bridge_judges_clusters_with_the_operators_trusted_repositories(trusted):
    """The operator (and its webhook) and the bridge load a SlurmCluster by
    one rule with one setting: a cluster the operator runs is never one the
    bridge finds invalid (issue 41, item 1)."""
    objs = objects({"trustedRepositories": trusted} if trusted else None)
    parsed = {}
    for component, command in (("operator", cli.operator_cmd), ("bridge", cli.bridge_cmd)):
        args = container(objs, component)["args"]
        parsed[component] = command.make_context(component, args[args.index(component) + 1:]).params
    assert parsed["bridge"]["trusted_repositories"] == parsed["operator"]["trusted_repositories"] \
        == tuple(trusted or ["ghcr.io/slurmk8s"])


def test_the_operator_learns_which_pods_its_agent_network_policies_admit(chart):
    """The chart's operator and bridge pods are what the NetworkPolicy of each
    cluster's Slurm agent admits: the release's namespace and instance label,
    and their component labels."""
    from slurmk8s.render.manifests import AgentClients

    args = container(objects())["args"]
    at = args.index("operator")
    params = cli.operator_cmd.make_context("operator", args[at + 1:]).params
    clients = AgentClients(params["release_namespace"], params["release_name"])
    assert clients.namespace == NAMESPACE
    for component in ("operator", "bridge"):
        labels = deployment(objects(), component)["spec"]["template"]["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == clients.release
        assert labels["app.kubernetes.io/component"] in clients.components


def test_the_operators_default_interval_is_the_clis():
    with helm.Chart.load(CHART) as loaded:
        default = loaded.values["interval"]
    option = next(p for p in cli.operator_cmd.params if p.name == "interval")
    assert default == option.default == 10
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["interval"]
    assert (schema["minimum"], schema["maximum"]) == (option.type.min, option.type.max)


@pytest.mark.parametrize("name", ["defaults", "namespaced", "clusterwide"])
def test_the_cli_accepts_the_options_the_chart_passes(chart, name):
    values = chart.merge_values(VALUE_SETS[name])
    args = container(objects(VALUE_SETS[name]))["args"]
    at = args.index("operator")
    # Everything before the subcommand is the `slurmk8s` group's own options.
    ctx = cli.main.make_context("slurmk8s", args[:at])
    assert ctx.params == {"log_level": args[1], "log_format": args[3]}
    assert ctx.args == []
    params = cli.operator_cmd.make_context("operator", args[at + 1:]).params
    assert params["interval"] == values["interval"]
    assert params["metrics_port"] == values["metrics"]["port"]
    if values["watchAllNamespaces"]:
        assert params["namespaces"] == () and params["all_namespaces"] is True
    else:
        assert params["namespaces"] == tuple(values["watchNamespaces"] or [NAMESPACE])
        assert params["all_namespaces"] is False
    assert params["kubeconfig"] is None  # in the cluster: the pod's ServiceAccount
    assert (params["release_namespace"], params["release_name"]) == (NAMESPACE, RELEASE)


def test_two_releases_in_one_namespace_have_their_own_leases():
    """Issue 41, item 8: with one Lease name per component, a second release in
    the namespace never led. Each release's commands take, and its Roles name,
    a Lease of its own."""
    taken: dict[str, set] = {"operator": set(), "bridge": set()}
    for release in ("ops", "hpc"):
        with helm.Chart.load(CHART) as loaded:
            texts = loaded.render({}, name=release, namespace=NAMESPACE)
        objs = [d for path, text in texts.items() if not path.endswith("NOTES.txt")
                for d in yaml.safe_load_all(text) if d]
        for component, command in (("operator", cli.operator_cmd), ("bridge", cli.bridge_cmd)):
            args = container(objs, component)["args"]
            params = command.make_context(component, args[args.index(component) + 1:]).params
            lease = lease_name(component, params["release_name"])
            role = one(of(objs, component), "Role", f"{deployment(objs, component)['metadata']['name']}-lease")
            assert any(r.get("resourceNames") == [lease] and "update" in r["verbs"] for r in role["rules"])
            taken[component].add(lease)
    assert all(len(leases) == 2 for leases in taken.values()), taken


def test_the_lease_duration_is_bounded_by_the_schema_and_the_cli_alike():
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["leaderElection"]
    bounds = schema["properties"]["leaseDurationSeconds"]
    for command in (cli.operator_cmd, cli.bridge_cmd):
        option = next(p for p in command.params if p.name == "lease_duration")
        assert (bounds["minimum"], bounds["maximum"]) == (option.type.min, option.type.max) \
            == (LEASE_SECONDS_MIN, LEASE_SECONDS_MAX)
    for bad in (0, 4, 301, 10**9):
        with pytest.raises(Exception, match="leaseDurationSeconds"):
            objects({"leaderElection": {"leaseDurationSeconds": bad}})
    args = container(objects({"leaderElection": {"leaseDurationSeconds": 60}}), "bridge")["args"]
    params = cli.bridge_cmd.make_context("bridge", args[args.index("bridge") + 1:]).params
    assert params["lease_duration"] == 60
    with pytest.raises(click.BadParameter, match="not in the range 5<=x<=300"):
        cli.bridge_cmd.make_context("bridge", ["-A", "--lease-duration", "1000"])


def test_schema_log_choices_are_the_clis():
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]
    assert schema["logLevel"]["enum"] == list(log.LEVELS)
    fmt = next(p for p in cli.main.params if p.name == "log_format")
    assert schema["logFormat"]["enum"] == list(fmt.type.choices)


@pytest.mark.parametrize("component", ["operator", "bridge"])
def test_pod_runs_as_the_images_non_root_user_with_nothing_extra(component):
    dockerfile = (ROOT / "images" / "controller" / "Dockerfile").read_text()
    uid, gid = map(int, re.findall(r"^USER (\d+):(\d+)$", dockerfile, re.M)[-1])
    objs = objects()
    pod = deployment(objs, component)["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]) == (uid, gid)
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container(objs, component)["securityContext"]
    assert sc["runAsUser"] == uid and sc["runAsNonRoot"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    # A read-only root still needs a writable /tmp.
    assert {"name": "tmp", "mountPath": "/tmp"} in container(objs, component)["volumeMounts"]


def test_overrides_reach_the_deployment():
    values = VALUE_SETS["namespaced"]
    objs = objects(values)
    pod = deployment(objs)["spec"]["template"]["spec"]
    c = container(objs)
    assert c["image"].endswith(":v9.9.9") and c["imagePullPolicy"] == "Always"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert c["args"][:5] == ["--log-level", "debug", "--log-format", "console", "operator"]
    assert c["args"][5:9] == ["--metrics-port", "9090", "--health-port", "9091"]
    assert c["args"][9:] == ["--namespace", "hpc-a", "--namespace", "hpc-b", "--interval", "30",
                             "--lease-namespace", NAMESPACE, "--lease-duration", "15",
                             "--release-namespace", NAMESPACE, "--release-name", RELEASE,
                             "--trusted-repository", "ghcr.io/slurmk8s", "--shared-storage-class", "efs-sc",
                             "--webhook-port", "9443", "--webhook-secret", KEPT_SECRET,
                             "--webhook-configuration", CONFIGURATION,
                             "--webhook-service", WEBHOOK_SERVICE]
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"metrics": 9090, "health": 9091, "webhook": 9443}
    for key in ("nodeSelector", "tolerations", "affinity", "priorityClassName"):
        assert pod[key] == values[key]
    assert pod["serviceAccountName"] == "slurm-operator"
    assert deployment(objs)["spec"]["template"]["metadata"]["annotations"] == values["podAnnotations"]
    sa = one(objs, "ServiceAccount", "slurm-operator")
    assert sa["metadata"]["annotations"] == values["serviceAccount"]["annotations"]


@pytest.mark.parametrize("name", ["defaults", "namespaced"])
def test_metrics_service_targets_the_metrics_port(chart, name):
    values = VALUE_SETS[name]
    objs = of(objects(values), "operator")
    svc = metrics_service(objs)
    port = next(p for p in container(objs)["ports"] if p["name"] == "metrics")["containerPort"]
    assert svc["spec"]["selector"] == deployment(objs)["spec"]["selector"]["matchLabels"]
    assert [p["targetPort"] for p in svc["spec"]["ports"]] == ["metrics"]
    annotations = svc["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(port)
    assert annotations["prometheus.io/path"] == "/metrics"
    service_values = values.get("metrics", {}).get("service", {})
    assert service_values.get("annotations", {}).items() <= annotations.items()
    merged = chart.merge_values(values)["metrics"]["service"]
    assert svc["spec"]["ports"][0]["port"] == merged["port"]


def test_bare_values_create_only_the_deployments():
    objs = objects(VALUE_SETS["bare"])
    assert sorted((o["kind"], o["metadata"]["labels"]["app.kubernetes.io/component"]) for o in objs) == [
        ("Deployment", "bridge"), ("Deployment", "operator"),
        ("PodDisruptionBudget", "bridge"), ("PodDisruptionBudget", "operator")]
    for component in ("operator", "bridge"):
        assert deployment(objs, component)["spec"]["template"]["spec"]["serviceAccountName"] == "default"


def notes(values: dict | None = None) -> str:
    return rendered(values)[f"{CHART.name}/templates/NOTES.txt"]


@pytest.mark.parametrize("name,namespace", [("defaults", NAMESPACE), ("namespaced", WATCHED[0]),
                                            ("clusterwide", "default")])
def test_notes_tell_how_to_create_a_first_cluster_where_it_is_watched(name, namespace):
    text = notes(VALUE_SETS[name])
    example = EXAMPLE.relative_to(ROOT)
    # The example is in "default"; elsewhere the notes move it to a watched namespace.
    assert yaml.safe_load(EXAMPLE.read_text())["metadata"]["namespace"] == "default"
    if namespace == "default":
        assert f"kubectl apply -f {example}" in text
    else:
        assert f"sed 's/namespace: default$/namespace: {namespace}/' {example} | kubectl apply -f -" in text
    assert f"kubectl get slurmclusters -n {namespace}" in text
    assert "`helm upgrade` updates the CRDs" in text
    # The Secret the example's login user needs, by the name the example uses, where the cluster goes.
    secret = load_cluster(yaml.safe_load(EXAMPLE.read_text())).spec.login.users[0].ssh_public_keys_from.name
    assert f"kubectl create secret generic {secret} -n {namespace} " in text


def test_notes_say_which_storage_class_the_examples_shared_storage_gets_or_how_to_name_one():
    assert 'gets the StorageClass "efs-sc"' in notes(VALUE_SETS["namespaced"])
    text = notes()
    assert "no sharedStorage.storageClassName\nis set: it is refused" in text
    assert "--reuse-values --set sharedStorage.storageClassName=<class>" in text


def test_notes_say_which_namespaces_are_watched_and_what_every_namespace_costs():
    assert f"It watches SlurmClusters in this namespace only ({NAMESPACE})." in notes()
    assert "--set 'watchNamespaces={X}'" in notes()
    assert f"the namespaces: {', '.join(WATCHED)}." in notes(VALUE_SETS["namespaced"])
    assert "every namespace (watchAllNamespaces: it may read,\ncreate and delete Secrets" in notes(
        VALUE_SETS["clusterwide"])


def test_notes_tell_how_to_lend_a_first_node():
    text = notes()
    policy = ROOT / "examples" / "nodelendingpolicy.yaml"
    assert yaml.safe_load(policy.read_text())["metadata"]["namespace"] == "default"
    assert f"sed 's/namespace: default$/namespace: {NAMESPACE}/' {policy.relative_to(ROOT)} | kubectl apply -f -" \
        in text
    assert f"kubectl apply -f {policy.relative_to(ROOT)}" in notes(VALUE_SETS["clusterwide"])
    labels = yaml.safe_load(policy.read_text())["spec"]["nodeSelector"]["matchLabels"]
    for key, value in labels.items():
        assert f"kubectl label node <gpu-node> {key}={value}" in text
    assert f"logs deployment/{deployment(objects(), 'bridge')['metadata']['name']}" in text
    own = notes({"bridge": {"watchNamespaces": ["lending"]}})
    assert "acts on NodeLendingPolicies in the namespaces: lending." in own
    assert "its metadata.namespace changed to one of: lending" in own


# --- RBAC ---------------------------------------------------------------------------

#: Value sets whose RBAC is checked against the declared permissions, and
#: through SubjectAccessReviews (tests/test_chart_rbac.py).
RBAC_VALUE_SETS = {
    "defaults": {},
    "namespaced": VALUE_SETS["namespaced"],
    "clusterwide": VALUE_SETS["clusterwide"],
    "bridge-own": {"watchNamespaces": WATCHED, "bridge": {"watchNamespaces": ["lending"]}},
    "bridge-own-clusterwide": {"watchAllNamespaces": True, "bridge": {"watchNamespaces": ["lending"]}},
    "bridge-default-listed": {"bridge": {"watchNamespaces": ["default", "lending"]}},
    "webhook-on-hosts": {"watchNamespaces": WATCHED, "webhook": {"hostNetwork": True}},
    "cert-manager": {"webhook": {"certManager": {"enabled": True}}},
}
DECLARED = {"operator": OPERATOR, "bridge": BRIDGE}


def keeper(values: dict) -> str | None:
    """The component that keeps the webhook's certificate with these values (decision
    record 53), None where none does (no webhook, or cert-manager)."""
    hook = {"enabled": True, "hostNetwork": False, "certManager": {"enabled": False}}
    for key, value in (values.get("webhook") or {}).items():
        hook[key] = value
    if not hook["enabled"] or hook["certManager"].get("enabled"):
        return None
    return "webhook" if hook["hostNetwork"] else "operator"


def watched(values: dict, component: str) -> list[str] | None:
    """The namespaces a component watches with these values (None: every namespace),
    as the chart documents them: an empty watchNamespaces is the release namespace."""
    own = (values.get("bridge") or {}).get("watchNamespaces") if component == "bridge" else None
    if own:
        return list(own)
    if values.get("watchAllNamespaces"):
        return None
    return list(values.get("watchNamespaces") or [NAMESPACE])


def declared(values: dict, component: str) -> dict[str | None, set]:
    """Namespace (None: cluster-wide) -> (verb, group, resource) the component declares it needs."""
    keeping = CERT_KEEPER if keeper(values) == component else ()
    return grants((*DECLARED.get(component, ()), *keeping), watched(values, component), NAMESPACE)


def _triples(rules: list[dict]) -> set[tuple[str, str, str]]:
    """(verb, group, resource) of every combination the rules grant."""
    return {(v, g, r) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def granted(objs: list[dict], component: str, named: bool = True) -> dict[str | None, set]:
    """Namespace (None: cluster-wide) -> what the component's ServiceAccount may do
    there, following each of its bindings to its role (``named``: also by rules
    narrowed to objects by name)."""
    mine = of(objs, component)
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o
             for o in mine if o["kind"] in ("Role", "ClusterRole")}
    sa = one(mine, "ServiceAccount")["metadata"]
    out: dict[str | None, set] = {}
    for b in (o for o in mine if o["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": sa["name"], "namespace": sa["namespace"]}]
        namespace = b["metadata"].get("namespace")
        ref = b["roleRef"]
        role = roles[(ref["kind"], namespace if ref["kind"] == "Role" else None, ref["name"])]
        rules = [r for r in role["rules"] if named or not r.get("resourceNames")]
        out.setdefault(namespace, set()).update(_triples(rules))
    assert len(roles) == sum(1 for o in mine if o["kind"].endswith("Binding")), "a role without a binding"
    return out


def rbac_rules_of(objs: list[dict], kind: str) -> list[dict]:
    return [r for o in objs if o["kind"] == kind for r in o["rules"]]


def aggregated(o: dict) -> bool:
    """A ClusterRole the chart ships for the built-in admin, edit and view roles
    (tenant-roles.yaml): bound to no one by the chart; tests/test_chart_tenants.py."""
    return any(k.startswith("rbac.authorization.k8s.io/aggregate-to-") for k in o["metadata"]["labels"])


@pytest.mark.parametrize("component", ["operator", "bridge"])
@pytest.mark.parametrize("name", RBAC_VALUE_SETS)
def test_rbac_grants_exactly_the_declared_permissions_where_they_are_needed(name, component):
    values = RBAC_VALUE_SETS[name]
    have, want = granted(objects(values), component), declared(values, component)
    for namespace in sorted(set(want) | set(have), key=str):
        missing = want.get(namespace, set()) - have.get(namespace, set())
        assert not missing, f"{component} lacks {sorted(missing)} in {namespace or 'the cluster'}"
        surplus = have.get(namespace, set()) - want.get(namespace, set())
        assert not surplus, f"{component} is granted {sorted(surplus)} in {namespace or 'the cluster'}, undeclared"
    assert have == want


#: What may be granted cluster-wide without watchAllNamespaces: cluster-scoped
#: reads, Node patches (lending state), and listing pods (the bridge's view of GPU demand).
CLUSTER_WIDE_ALLOWED = {
    # The webhook's own configuration only (its caBundle), by name.
    ("get", "admissionregistration.k8s.io", "validatingwebhookconfigurations"),
    ("update", "admissionregistration.k8s.io", "validatingwebhookconfigurations"),
    ("list", "apiextensions.k8s.io", "customresourcedefinitions"),
    ("watch", "apiextensions.k8s.io", "customresourcedefinitions"),
    ("list", "", "namespaces"), ("watch", "", "namespaces"),
    ("get", "", "nodes"), ("list", "", "nodes"), ("watch", "", "nodes"), ("patch", "", "nodes"),
    ("list", "", "pods"), ("watch", "", "pods"),
}


@pytest.mark.parametrize("name", ["defaults", "namespaced", "bridge-own", "bridge-default-listed"])
def test_without_the_opt_in_no_namespaced_power_is_cluster_wide(name):
    objs = objects(RBAC_VALUE_SETS[name])
    # The tenant roles go to whoever a site binds to admin, edit or view; no binding of the chart names them.
    tenants = {o["metadata"]["name"] for o in objs if aggregated(o)}
    assert tenants and not {o["roleRef"]["name"] for o in objs if o["kind"].endswith("Binding")} & tenants
    cluster_wide = _triples(rbac_rules_of([o for o in objs if not aggregated(o)], "ClusterRole"))
    assert cluster_wide <= CLUSTER_WIDE_ALLOWED
    assert not {t for t in cluster_wide if t[2] in ("secrets", "deployments", "statefulsets", "configmaps",
                                                   "events", "slurmclusters", "nodelendingpolicies")}
    assert not {t for t in cluster_wide if t[2] == "pods" and t[0] not in ("list", "watch")}
    for component in ("operator", "bridge"):
        assert set(granted(objs, component).get(None, set())) <= CLUSTER_WIDE_ALLOWED


@pytest.mark.parametrize("name", ["defaults", "namespaced"])
def test_the_bridge_cannot_run_pods_or_read_secrets_in_kube_system(name):
    have = granted(objects(RBAC_VALUE_SETS[name]), "bridge")
    for verb, resource in (("create", "pods"), ("delete", "pods"), ("get", "secrets"), ("list", "secrets")):
        assert not allows(have, verb, "", resource, "kube-system"), f"bridge may {verb} {resource} in kube-system"
    # ... while it may where its policies are.
    (namespace, *_) = watched(RBAC_VALUE_SETS[name], "bridge")
    assert allows(have, "create", "", "pods", namespace) and allows(have, "get", "", "secrets", namespace)


@pytest.mark.parametrize("name", RBAC_VALUE_SETS)
def test_neither_can_list_or_change_secrets_anywhere(name):
    """... but the webhook's server its own certificate's Secret, named (decision record 53)."""
    values = RBAC_VALUE_SETS[name]
    objs = objects(values)
    for component in ("operator", "bridge"):
        have = granted(objs, component, named=False)
        for namespace in [None, "kube-system", NAMESPACE, *WATCHED, *filter(None, have)]:
            for verb in ("list", "watch", "update", "patch"):
                assert not allows(have, verb, "", "secrets", namespace), (component, verb, namespace)
    if not values.get("watchAllNamespaces"):
        assert not allows(granted(objs, "operator"), "get", "", "secrets", "kube-system")
    named = [(o["kind"], o["metadata"].get("namespace"), r) for o in objs if o["kind"] in ("Role", "ClusterRole")
             for r in o["rules"] if "secrets" in r["resources"] and set(r["verbs"]) & {"update", "patch"}]
    assert named == ([("Role", NAMESPACE, {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [KEPT_SECRET],
                                           "verbs": ["get", "update"]})] if keeper(values) else [])


@pytest.mark.parametrize("name", RBAC_VALUE_SETS)
def test_rbac_has_no_wildcards_no_exec_and_no_escalation(name):
    objs = objects(RBAC_VALUE_SETS[name])
    rules = rbac_rules(objs, "operator") + rbac_rules(objs, "bridge") + rbac_rules(objs, "webhook")
    assert len(rules) > 5
    # resourceNames only to narrow rules to the component's own Lease, and to the
    # webhook's own certificate Secret and configuration.
    own = {"secrets": [KEPT_SECRET], "validatingwebhookconfigurations": [CONFIGURATION]}
    for rule in rules:
        # No nonResourceURLs.
        assert set(rule) - {"resourceNames"} == {"apiGroups", "resources", "verbs"}, rule
        assert "resourceNames" not in rule or rule["resources"] == ["leases"] or (
            len(rule["resources"]) == 1 and rule["resourceNames"] == own.get(rule["resources"][0])), rule
        if rule["resources"] == ["validatingwebhookconfigurations"]:
            assert rule.get("resourceNames") == [CONFIGURATION], rule
        for field in ("apiGroups", "resources", "verbs"):
            assert not any("*" in x for x in rule[field]), f"wildcard in {rule}"
        assert not {"escalate", "bind", "impersonate", "deletecollection"} & set(rule["verbs"])
    resources = {r for rule in rules for r in rule["resources"]}
    assert not {r for r in resources if r.startswith("pods/")}, "no pods/exec, attach, portforward, eviction"
    assert {r for r in resources if "/" in r} == {"slurmclusters/status", "slurmclusters/finalizers",
                                                  "nodelendingpolicies/status"}


def test_the_declared_kinds_are_exactly_the_kinds_the_renderer_creates(keys):
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["restApi"] = {"enabled": True}
    doc["metadata"]["uid"] = "0b5e2c6e-1111-4c2b-9c57-3a9a4d3c2e01"
    from slurmk8s.render.manifests import AgentClients

    objs = render(load_cluster(doc), keys, agent_clients=AgentClients(NAMESPACE, RELEASE))
    plural = {"NetworkPolicy": "networkpolicies"}
    rendered_kinds = {(o["apiVersion"].rpartition("/")[0], plural.get(o["kind"], o["kind"].lower() + "s"))
                      for o in objs}
    assert rendered_kinds == {of_kind(k) for k in MANAGED_KINDS}
    assert len(rendered_kinds) >= 6
    created = {(g, r) for v, g, r, _ in OPERATOR if v == "create"}
    assert created == rendered_kinds | {("", "events"), ("coordination.k8s.io", "leases")}, \
        "the operator creates only what it renders, Events and its Lease"
    assert not {p for p in OPERATOR if p.resource == "secrets" and p.verb in ("list", "watch", "patch", "update")}


def test_a_role_per_watched_namespace_bound_to_the_operator_only():
    def not_lease(o: dict) -> bool:
        """Not the Lease's, nor the webhook certificate's (by name, in the release namespace)."""
        return not o["metadata"]["name"].endswith(("-lease", "-webhook-certs"))

    objs = [o for o in of(objects(VALUE_SETS["namespaced"]), "operator") if not_lease(o)]
    roles = [o for o in objs if o["kind"] == "Role"]
    bindings = [o for o in objs if o["kind"] == "RoleBinding"]
    assert sorted(r["metadata"]["namespace"] for r in roles) == WATCHED
    assert sorted(b["metadata"]["namespace"] for b in bindings) == WATCHED
    for b in bindings:
        assert b["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                "name": roles[0]["metadata"]["name"]}
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": "slurm-operator", "namespace": NAMESPACE}]
    # With defaults: one Role, in the release namespace.
    defaults = [o for o in of(objects(), "operator") if not_lease(o)]
    assert [(o["kind"], o["metadata"]["namespace"]) for o in defaults if o["kind"] in ("Role", "RoleBinding")] \
        == [("Role", NAMESPACE), ("RoleBinding", NAMESPACE)]


def test_watch_all_namespaces_uses_cluster_roles_and_refuses_a_list_beside_it():
    objs = [o for o in of(objects(VALUE_SETS["clusterwide"]), "operator")
            if not o["metadata"]["name"].endswith("-webhook-certs")]
    # Namespaced: only the Lease's, in the release namespace (and the webhook certificate's, left out here).
    assert {(o["kind"], o["metadata"]["name"], o["metadata"]["namespace"])
            for o in objs if o["kind"] in ("Role", "RoleBinding")} == {
        ("Role", f"{RELEASE}-slurmk8s-lease", NAMESPACE), ("RoleBinding", f"{RELEASE}-slurmk8s-lease", NAMESPACE)}
    assert sorted(o["kind"] for o in objs if "Cluster" in o["kind"]) == [
        "ClusterRole", "ClusterRole", "ClusterRoleBinding", "ClusterRoleBinding"]
    with pytest.raises(helm.HelmRenderError, match=re.escape(
            "watchAllNamespaces is true and watchNamespaces lists hpc-a, hpc-b: empty watchNamespaces")):
        objects({"watchAllNamespaces": True, "watchNamespaces": WATCHED})


def test_rbac_rules_each_say_why():
    templates = sorted((CHART / "templates").glob("*.*"))
    checked = 0
    for path in templates:
        lines = path.read_text().splitlines()
        rules = [i for i, line in enumerate(lines) if re.match(r"\s*- apiGroups:", line)]
        checked += len(rules)
        for i in rules:
            assert lines[i - 1].strip().startswith("#"), (
                f"{path.name}:{i + 1}: add a comment above this rule saying which operation needs it")
    assert checked > 15


# --- the node-lending bridge ----------------------------------------------------------

def test_bridge_renders_by_default_beside_the_operator(chart):
    objs = objects()
    bridge = of(objs, "bridge")
    assert sorted((o["kind"], o["metadata"].get("namespace")) for o in bridge
                  if o["kind"] not in ("Deployment", "Service", "ServiceAccount")) == [
        ("ClusterRole", None), ("ClusterRoleBinding", None),
        ("NetworkPolicy", NAMESPACE), ("PodDisruptionBudget", NAMESPACE),
        # Its policies' namespace, and Events about Nodes in "default"; its Lease.
        ("Role", "default"), ("Role", NAMESPACE), ("Role", NAMESPACE),
        ("RoleBinding", "default"), ("RoleBinding", NAMESPACE), ("RoleBinding", NAMESPACE)]
    assert sorted(o["kind"] for o in bridge if o["kind"] in ("Deployment", "Service", "ServiceAccount")) == [
        "Deployment", "Service", "ServiceAccount"]
    dep = deployment(objs, "bridge")
    assert dep["metadata"]["namespace"] == NAMESPACE
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["strategy"]["type"] == "RollingUpdate"
    selector = dep["spec"]["selector"]["matchLabels"]
    assert selector.items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    # Neither Deployment's selector picks the other's pods.
    operator_selector = deployment(objs)["spec"]["selector"]["matchLabels"]
    assert not selector.items() <= deployment(objs)["spec"]["template"]["metadata"]["labels"].items()
    assert not operator_selector.items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    pod = dep["spec"]["template"]["spec"]
    sa = one(bridge, "ServiceAccount")["metadata"]["name"]
    assert pod["serviceAccountName"] == sa != deployment(objs)["spec"]["template"]["spec"]["serviceAccountName"]
    c = container(objs, "bridge")
    assert c["image"] == container(objs)["image"]
    v = chart.values["bridge"]
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {
        "metrics": v["metrics"]["port"], "health": v["health"]["port"]}
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert c["resources"] == v["resources"]
    svc = one(bridge, "Service")
    assert svc["spec"]["selector"] == selector
    assert svc["spec"]["ports"] == [{"name": "metrics", "port": v["metrics"]["service"]["port"],
                                     "targetPort": "metrics", "protocol": "TCP"}]
    assert svc["metadata"]["annotations"]["prometheus.io/port"] == str(v["metrics"]["port"])
    assert svc["metadata"]["name"] != metrics_service(of(objs, "operator"))["metadata"]["name"]


@pytest.mark.parametrize("name", ["defaults", "namespaced"])
def test_bridge_args_are_what_the_bridge_command_accepts(chart, name):
    values = chart.merge_values(VALUE_SETS[name])
    args = container(objects(VALUE_SETS[name]), "bridge")["args"]
    at = args.index("bridge")
    assert args[:at] == ["--log-level", values["logLevel"], "--log-format", values["logFormat"]]
    group = cli.main.make_context("slurmk8s", args[:at])
    assert group.params == {"log_level": values["logLevel"], "log_format": values["logFormat"]}
    assert group.args == []
    params = cli.bridge_cmd.make_context("bridge", args[at + 1:]).params
    v = values["bridge"]
    assert params["metrics_port"] == v["metrics"]["port"]
    assert params["health_port"] == v["health"]["port"]
    assert params["interval"] == v["interval"]
    assert params["namespaces"] == tuple(values["watchNamespaces"] or [NAMESPACE])
    assert params["all_namespaces"] is False
    assert params["kubeconfig"] is None  # in the cluster: the pod's ServiceAccount


def test_bridge_values_reach_its_deployment_and_not_the_operators():
    objs = objects(VALUE_SETS["namespaced"])
    v = BRIDGE_OVERRIDES
    dep = deployment(objs, "bridge")
    pod = dep["spec"]["template"]["spec"]
    for key in ("nodeSelector", "tolerations", "affinity", "priorityClassName"):
        assert pod[key] == v[key]
        assert deployment(objs)["spec"]["template"]["spec"][key] == VALUE_SETS["namespaced"][key]
    assert dep["spec"]["template"]["metadata"]["annotations"] == v["podAnnotations"]
    assert v["podLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert "example.com/tier" not in deployment(objs)["spec"]["template"]["metadata"]["labels"]
    c = container(objs, "bridge")
    # Helm merges the values into the chart's: the default CPU limit stays.
    assert c["resources"] == {"requests": v["resources"]["requests"],
                              "limits": {"cpu": "1", **v["resources"]["limits"]}}
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"metrics": 9190, "health": 9191}
    assert c["args"][c["args"].index("--interval") + 1] == "0.5"
    # The top-level image settings are shared.
    assert c["image"].endswith(":v9.9.9") and c["imagePullPolicy"] == "Always"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["serviceAccountName"] == "slurm-bridge"
    sa = one(objs, "ServiceAccount", "slurm-bridge")
    assert sa["metadata"]["annotations"] == v["serviceAccount"]["annotations"]
    svc = one(of(objs, "bridge"), "Service")
    assert svc["spec"]["ports"][0]["port"] == 81
    assert svc["metadata"]["annotations"]["team"] == "lending"
    assert svc["metadata"]["annotations"]["prometheus.io/port"] == "9190"



def test_a_long_full_name_keeps_the_bridges_names_apart_and_valid():
    objs = objects({"fullnameOverride": "x" * 63})
    names = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objs}
    assert len(names) == len(objs)
    for o in objs:
        if o["kind"] in ("Service", "Deployment", "ServiceAccount"):
            assert len(o["metadata"]["name"]) <= 63, o["metadata"]["name"]
    assert deployment(objs, "bridge")["metadata"]["name"] == "x" * 56 + "-bridge"

def test_bridge_disabled_renders_none_of_its_objects():
    objs = objects(VALUE_SETS["bridgeless"])
    assert of(objs, "bridge") == []
    # The same operator (and tenant role) objects.
    assert [o for o in objs if o["kind"] != "CustomResourceDefinition"] == [
        o for o in objects() if o["kind"] != "CustomResourceDefinition"
        and o["metadata"]["labels"]["app.kubernetes.io/component"] != "bridge"]
    notes = rendered(VALUE_SETS["bridgeless"])[f"{CHART.name}/templates/NOTES.txt"]
    assert "bridge" not in notes


def test_the_bridge_reads_secrets_only_by_name_and_never_changes_specs_or_creates_nodes():
    have = set().union(*granted(objects(VALUE_SETS["clusterwide"]), "bridge").values())
    assert {t for t in have if t[2] == "secrets"} == {("get", "", "secrets")}, "Secrets: get by name only"
    assert not {t for t in have if t[2] == "nodes" and t[0] in ("create", "update", "delete")}
    assert not {t for t in have if t[1] == "slurmk8s.dev" and t[0] in ("create", "delete", "patch")
                and "/" not in t[2]}, "the bridge never changes a SlurmCluster or a policy's spec"
    # Its own cluster-wide ClusterRole holds only Nodes and listing and watching pods.
    objs = objects()
    cluster = one(of(objs, "bridge"), "ClusterRole", f"{deployment(objs, 'bridge')['metadata']['name']}-cluster")
    assert _triples(cluster["rules"]) == {("list", "", "nodes"), ("watch", "", "nodes"), ("patch", "", "nodes"),
                                          ("list", "", "pods"), ("watch", "", "pods")}


@pytest.mark.parametrize("values,scoped", [
    ({}, [NAMESPACE]),
    ({"watchNamespaces": WATCHED}, WATCHED),
    ({"bridge": {"watchNamespaces": ["lending"]}}, ["lending"]),
    ({"watchNamespaces": WATCHED, "bridge": {"watchNamespaces": ["lending"]}}, ["lending"]),
    ({"watchAllNamespaces": True, "bridge": {"watchNamespaces": ["lending"]}}, ["lending"]),
    ({"watchAllNamespaces": True}, []),
    ({"bridge": {"watchNamespaces": ["default", "lending"]}}, ["default", "lending"]),
], ids=["defaults", "operators", "own", "own-over-operators", "own-over-all", "all", "default-listed"])
def test_bridge_watch_namespaces_confine_the_namespaced_rules_to_roles(values, scoped):
    objs = objects(values)
    args = container(objs, "bridge")["args"]
    if scoped:
        assert args[args.index("--health-port") + 2:] == [
            *(x for ns in scoped for x in ("--namespace", ns)), "--interval", "2", "--lease-namespace", NAMESPACE,
            "--lease-duration", "15", "--release-name", RELEASE, "--trusted-repository", "ghcr.io/slurmk8s"]
    bridge = [o for o in of(objs, "bridge") if not o["metadata"]["name"].endswith("-lease")]
    if not scoped:
        assert "--all-namespaces" in args and "--namespace" not in args
        assert not [o for o in bridge if o["kind"] in ("Role", "RoleBinding")]
        return
    # Node Events go to "default": a Role there unless it is one of the namespaces.
    expected = sorted({*scoped, "default"})
    for kind in ("Role", "RoleBinding"):
        assert sorted(o["metadata"]["namespace"] for o in bridge if o["kind"] == kind) == expected


# --- bad values ---------------------------------------------------------------------


@pytest.mark.parametrize("values,message", [
    ({"logLevel": "verbose"}, "at '/logLevel': value must be one of 'debug', 'info', 'warning', 'error'"),
    ({"logFormat": "xml"}, "at '/logFormat'"),
    ({"metrics": {"port": 70000}}, "at '/metrics/port'"),
    ({"health": {"port": "8081x"}}, "at '/health/port': got string, want integer"),
    ({"image": {"tag": 1.5}}, "at '/image/tag': got number, want string"),
    ({"image": {"pullPolicy": "Sometimes"}}, "at '/image/pullPolicy'"),
    ({"watchNamespaces": "hpc"}, "at '/watchNamespaces': got string, want array"),
    ({"watchNamespaces": ["Bad_NS"]}, "at '/watchNamespaces/0'"),
    ({"replicaCount": 2}, "additional properties 'replicaCount' not allowed"),
    ({"serviceAccount": {"create": "yes"}}, "at '/serviceAccount/create': got string, want boolean"),
    ({"rbac": {"enable": True}}, "additional properties 'enable' not allowed"),
    ({"bridge": {"replica": 2}}, "at '/bridge': additional properties 'replica' not allowed"),
    ({"bridge": {"replicas": 0}}, "at '/bridge/replicas'"),
    ({"bridge": {"metrics": {"port": 8090.5}}}, "at '/bridge/metrics/port': got number, want integer"),
    ({"bridge": {"health": {"port": "8091"}}}, "at '/bridge/health/port': got string, want integer"),
    ({"bridge": {"interval": 0}}, "at '/bridge/interval'"),
    ({"bridge": {"interval": "2s"}}, "at '/bridge/interval': got string, want number"),
    ({"bridge": {"enabled": "false"}}, "at '/bridge/enabled': got string, want boolean"),
    ({"bridge": {"watchNamespaces": "hpc"}}, "at '/bridge/watchNamespaces'"),
    ({"watchAllNamespaces": "yes"}, "at '/watchAllNamespaces': got string, want boolean"),
    ({"interval": 0.5}, "at '/interval'"),
    ({"interval": "10s"}, "at '/interval': got string, want number"),
    ({"bridge": {"serviceAccount": {"role": "x"}}}, "additional properties 'role' not allowed"),
    ({"networkPolicy": {"enabled": "no"}}, "at '/networkPolicy/enabled': got string, want boolean"),
    ({"networkPolicy": {"webhookFrom": ["10.0.0.1"]}}, "at '/networkPolicy/webhookFrom/0'"),
    ({"networkPolicy": {"metricsFrom": [{"namespace": "monitoring"}]}},
     "at '/networkPolicy/metricsFrom/0': additional properties 'namespace' not allowed"),
    ({"networkPolicy": {"healthFrom": [{}]}}, "at '/networkPolicy/healthFrom/0'"),
    ({"networkPolicy": {"egress": {"apiServer": {"ports": []}}}}, "at '/networkPolicy/egress/apiServer/ports'"),
    ({"networkPolicy": {"egress": {"extraRules": [{"from": []}]}}},
     "at '/networkPolicy/egress/extraRules/0': additional properties 'from' not allowed"),
])
def test_schema_refuses_bad_values_naming_the_field(chart, values, message):
    with pytest.raises(helm.HelmValuesError) as err:
        chart.render(values, name=RELEASE, namespace=NAMESPACE)
    assert "values don't meet the specifications of the schema" in str(err.value)
    assert message in str(err.value)


@pytest.mark.parametrize("values,message", [
    ({"health": {"port": 8080}}, "metrics.port and health.port are both 8080: give them different ports"),
    ({"bridge": {"health": {"port": 8090}}},
     "bridge.metrics.port and bridge.health.port are both 8090: give them different ports"),
    ({"image": {"repository": "ghcr.io/slurmk8s/controller:0.1.0"}},
     "holds a tag or digest: set image.repository to the part before it and image.tag to the tag"),
    ({"watchAllNamespaces": True, "watchNamespaces": ["hpc"]},
     "watchAllNamespaces is true and watchNamespaces lists hpc: empty watchNamespaces to watch every namespace, "
     "or set watchAllNamespaces=false to watch only those"),
    ({"bridge": {"watchNamespaces": []}},
     "bridge.watchNamespaces is empty: list the namespaces of the bridge's NodeLendingPolicies, or leave it "
     "unset (null) to follow watchNamespaces (with watchAllNamespaces=true: every namespace)"),
])
def test_templates_refuse_inconsistent_values_saying_what_to_do(chart, values, message):
    with pytest.raises(helm.HelmRenderError, match=re.escape(message)):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)


def test_registry_with_a_port_is_not_mistaken_for_a_tag():
    c = container(objects({"image": {"repository": "registry.local:5000/slurmk8s/controller"}}))
    assert c["image"].startswith("registry.local:5000/slurmk8s/controller:")


# --- documentation ------------------------------------------------------------------


def _leaf_paths(node, prefix=""):
    if isinstance(node, dict) and node and prefix not in DOCUMENTED_WHOLE:
        for key, child in node.items():
            yield from _leaf_paths(child, f"{prefix}.{key}" if prefix else key)
    else:
        yield prefix


#: Values documented as one block rather than field by field.
DOCUMENTED_WHOLE = {"resources", "podSecurityContext", "securityContext", "bridge.resources"}


def _commented_keys(lines: list[str]) -> dict[str, bool]:
    """Dotted path of each key in a values.yaml -> whether a comment sits right above it."""
    out, stack = {}, []  # stack of (indent, key)
    for i, line in enumerate(lines):
        m = re.match(r"^( *)([A-Za-z][\w.-]*):", line)
        if not m:
            continue
        indent = len(m.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, m.group(2)))
        above = lines[i - 1].strip() if i else ""
        out[".".join(k for _, k in stack)] = above.startswith("#")
    return out


def test_every_value_is_commented_and_in_the_readme(chart):
    commented = _commented_keys((CHART / "values.yaml").read_text().splitlines())
    readme = (ROOT / "charts" / "README.md").read_text()
    paths = list(_leaf_paths(chart.values))
    assert len(paths) > 20
    for path in paths:
        assert commented.get(path), f"values.yaml: document {path} in a comment right above it"
        assert f"`{path}`" in readme, f"charts/README.md: add `{path}` to the values table"
