"""The chart's life cycle as a platform engineer lives it: `helm install`,
`upgrade` and `uninstall` of charts/slurmk8s with the real Helm engine
(helm-python-sdk) against the Kubernetes stand-in, as its administrator,
with the stand-in enforcing RBAC (Helm creates the chart's Roles and
bindings, which it may only do holding what they grant)."""

from __future__ import annotations

import shutil

import pytest
import yaml
from kubernetes.client.rest import ApiException

from sandbox import install
from slurmk8s.kube import Kube
from slurmk8s.operator.certkeeper import CertKeeper

from .apiserver.conftest import start_server, wait_for
from .conftest import EXAMPLE, ROOT

CHART = ROOT / "charts" / "slurmk8s"
SYSTEM = install.RELEASE_NAMESPACE
CRD = "slurmclusters.slurmk8s.dev"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_server(tmp_path_factory.mktemp("helm"))
    yield c
    c.api_client.close()
    c.srv.stop()


def operator_args(c) -> list[str]:
    return c.apps.read_namespaced_deployment("slurmk8s", SYSTEM).spec.template.spec.containers[0].args


def webhook_state(c) -> tuple[dict, list]:
    """The webhook's certificate Secret's data, and the caBundle of each webhook of its configuration."""
    data = c.core.read_namespaced_secret("slurmk8s-webhook-certs", SYSTEM).data or {}
    config = c.kubectl_json("get", "validatingwebhookconfiguration", f"slurmk8s-{SYSTEM}")
    return data, [h["clientConfig"].get("caBundle") for h in config["webhooks"]]


def newer_chart(tmp_path):
    """The chart as a next version ships it: a CRD with a changed description."""
    chart = tmp_path / "slurmk8s"
    shutil.copytree(CHART, chart)
    path = chart / "files" / "crds" / f"{CRD}.yaml"
    crd = yaml.safe_load(path.read_text())
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["description"] = "A Slurm cluster (next version)."
    path.write_text(yaml.safe_dump(crd))
    return chart


def test_install_upgrade_and_uninstall(cluster, tmp_path):
    c = cluster
    ns = c.namespace("hpc")
    values = {"watchNamespaces": [ns]}

    first = install.install(c.kubeconfig, values)
    assert (first["status"], first["revision"]) == ("deployed", 1)
    crds = {o.metadata.name for o in c.ext.list_custom_resource_definition().items}
    assert {CRD, "nodelendingpolicies.slurmk8s.dev"} <= crds
    assert "--namespace" in operator_args(c) and ns in operator_args(c)
    # The Deployments' pods exist, admitted with their ServiceAccounts' token volumes.
    pods = wait_for("the operator's and bridge's pods, two of each", lambda: [
        p for p in c.core.list_namespaced_pod(SYSTEM).items] if len(c.core.list_namespaced_pod(SYSTEM).items) == 4
        else None)
    assert sorted(p.spec.service_account_name for p in pods) == ["slurmk8s"] * 2 + ["slurmk8s-bridge"] * 2
    assert all(any(v.name.startswith("kube-api-access-") for v in p.spec.volumes) for p in pods)
    # The chart's Roles exist, and the operator may do in ns what it needs, and nothing in kube-system.
    can = c.kubectl("auth", "can-i", "create", "statefulsets", "-n", ns,
                    f"--as=system:serviceaccount:{SYSTEM}:slurmk8s", check=False)
    assert can.stdout.strip() == "yes", can.stderr
    cannot = c.kubectl("auth", "can-i", "get", "secrets", "-n", "kube-system",
                       f"--as=system:serviceaccount:{SYSTEM}:slurmk8s", check=False)
    assert cannot.stdout.strip() == "no"
    # A team bound to the built-in edit role in ns may create SlurmClusters: the chart's
    # ClusterRoles are aggregated into it (decision record 53).
    c.kubectl("create", "rolebinding", "team", "--clusterrole=edit", "--group=team", "-n", ns)

    def team_may_create() -> str:
        return c.kubectl("auth", "can-i", "create", "slurmclusters.slurmk8s.dev", "-n", ns, "--as=someone",
                         "--as-group=team", check=False).stdout.strip()

    wait_for("edit to aggregate the chart's roles", lambda: team_may_create() == "yes")
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["namespace"] = ns
    # No kubelet runs the operator here: its webhook refuses every SlurmCluster (failurePolicy
    # Fail) until it runs, or passes it unchecked once the chart says Ignore.
    with pytest.raises(ApiException) as refused:
        c.custom.create_namespaced_custom_object("slurmk8s.dev", "v1alpha1", ns, "slurmclusters", doc)
    assert refused.value.status == 500 and "no endpoints available" in refused.value.body
    # What the operator's keeper writes (decision record 53): the Secret's data and caBundle.
    CertKeeper(Kube.from_kubeconfig(str(c.kubeconfig)), SYSTEM, "slurmk8s-webhook-certs", f"slurmk8s-{SYSTEM}",
               "slurmk8s-webhook", lambda *_: None).once()
    kept = webhook_state(c)
    assert set(kept[0]) == {"ca.crt", "ca.key", "tls.crt", "tls.key"} and kept[1] == [kept[0]["ca.crt"]] * 2
    values["webhook"] = {"failurePolicy": "Ignore"}
    install.install(c.kubeconfig, values)
    created = c.custom.create_namespaced_custom_object("slurmk8s.dev", "v1alpha1", ns, "slurmclusters", doc)

    # A newer chart: its CRD changes with the release, and the operator is rolled.
    old_template = c.apps.read_namespaced_deployment("slurmk8s", SYSTEM).spec.template
    second = install.install(c.kubeconfig, {**values, "logLevel": "debug"}, chart=newer_chart(tmp_path))
    assert (second["status"], second["revision"]) == ("deployed", 3)
    # Upgrades leave the webhook's certificate and caBundle as the operator wrote them:
    # the chart renders neither, so the API server's caBundle stays valid throughout.
    assert webhook_state(c) == kept
    crd = c.ext.read_custom_resource_definition(CRD)
    assert crd.spec.versions[0].schema.open_apiv3_schema.description == "A Slurm cluster (next version)."
    args = operator_args(c)
    assert args[args.index("--log-level") + 1] == "debug"
    assert c.apps.read_namespaced_deployment("slurmk8s", SYSTEM).spec.template != old_template
    def operator_replica_sets():
        return sorted(r.spec.replicas for r in c.apps.list_namespaced_replica_set(
            SYSTEM, label_selector="app.kubernetes.io/component=operator").items)

    # One ReplicaSet per pod template: the upgrade rolls the operator. No kubelet
    # runs these pods, so none turns Ready: with maxUnavailable 0 the old two stay
    # while one new pod surges.
    wait_for("the operator rolling to its new ReplicaSet", lambda: operator_replica_sets() == [1, 2])

    # Uninstall: the controllers and their RBAC go; the CRDs and the SlurmCluster stay.
    install.uninstall(c.kubeconfig)
    wait_for("the Deployments gone", lambda: not c.apps.list_namespaced_deployment(SYSTEM).items)
    assert not [s for s in c.core.list_namespaced_service_account(SYSTEM).items if s.metadata.name != "default"]
    rbac = c.kubectl_json("get", "clusterroles,clusterrolebindings", "-l", "app.kubernetes.io/instance=slurmk8s")
    assert rbac["items"] == []
    wait_for("edit to lose the uninstalled chart's roles", lambda: team_may_create() == "no")
    assert c.kubectl_json("get", "roles", "-n", ns)["items"] == []
    assert {CRD, "nodelendingpolicies.slurmk8s.dev"} <= {
        o.metadata.name for o in c.ext.list_custom_resource_definition().items}
    kept = c.custom.get_namespaced_custom_object("slurmk8s.dev", "v1alpha1", ns, "slurmclusters", doc["metadata"]["name"])
    assert kept["metadata"]["uid"] == created["metadata"]["uid"]  # the very object, not a new one

    # Installing again adopts the kept CRDs.
    third = install.install(c.kubeconfig, values)
    assert (third["status"], third["revision"]) == ("deployed", 1)
