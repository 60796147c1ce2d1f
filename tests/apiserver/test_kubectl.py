"""kubectl 1.32 (the one on PATH) against the stand-in, through the kubeconfig
the server writes."""

from __future__ import annotations

import json
import re
import uuid

import pytest
import yaml

from .conftest import CRDS, EXAMPLE, Cluster, wait_for

CRD_NAME = "slurmclusters.slurmk8s.dev"


@pytest.fixture(scope="module")
def applied_crds(cluster: Cluster) -> dict:
    out = cluster.kubectl("apply", "-f", str(CRDS) + "/")
    assert f"customresourcedefinition.apiextensions.k8s.io/{CRD_NAME} created" in out.stdout
    cluster.kubectl("wait", "--for", "condition=established", f"crd/{CRD_NAME}", "--timeout=20s")
    return yaml.safe_load((CRDS / f"{CRD_NAME}.yaml").read_text())


def manifest(ns: str, tmp_path, change=None) -> str:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["namespace"] = ns
    if change:
        change(doc)
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_apply_create_change_and_unchanged(cluster: Cluster, applied_crds, ns: str, tmp_path) -> None:
    out = cluster.kubectl("apply", "-f", manifest(ns, tmp_path))
    assert out.stdout.strip() == "slurmcluster.slurmk8s.dev/demo created"
    out = cluster.kubectl("apply", "-f", manifest(ns, tmp_path, lambda d: d["spec"]["nodeSets"][1].update(replicas=3)))
    assert out.stdout.strip() == "slurmcluster.slurmk8s.dev/demo configured"
    assert cluster.kubectl_json("get", "slurmcluster", "demo", "-n", ns)["spec"]["nodeSets"][1]["replicas"] == 3
    before = cluster.kubectl_json("get", "slurmcluster", "demo", "-n", ns)["metadata"]["resourceVersion"]
    # kubectl sends the lists whose items the schema defaulted (as against a real API server);
    # the result is the same object, so nothing is written
    cluster.kubectl("apply", "-f", manifest(ns, tmp_path, lambda d: d["spec"]["nodeSets"][1].update(replicas=3)))
    assert cluster.kubectl_json("get", "slurmcluster", "demo", "-n", ns)["metadata"]["resourceVersion"] == before
    # the CRDs themselves re-apply cleanly
    assert f"{CRD_NAME} unchanged" in cluster.kubectl("apply", "-f", str(CRDS) + "/").stdout


def test_get_shows_the_printer_columns(cluster: Cluster, applied_crds, ns: str, tmp_path) -> None:
    cluster.kubectl("apply", "-f", manifest(ns, tmp_path))
    columns = applied_crds["spec"]["versions"][0]["additionalPrinterColumns"]
    out = cluster.kubectl("get", "slurmclusters", "-n", ns).stdout.splitlines()
    header = out[0].split()
    assert header == ["NAME"] + [c["name"].upper() for c in columns if not c.get("priority")]
    version_at = header.index("VERSION")
    row = out[1].split()
    assert row[0] == "demo"
    assert yaml.safe_load(EXAMPLE.read_text())["spec"]["slurm"]["version"] in row  # .spec.slurm.version; empty status columns print nothing
    wide = cluster.kubectl("get", "slurm", "-n", ns, "-o", "wide").stdout.splitlines()[0].split()
    assert wide == ["NAME"] + [c["name"].upper() for c in columns]
    assert version_at > 0


def test_get_json_and_explain(cluster: Cluster, applied_crds, ns: str, tmp_path) -> None:
    cluster.kubectl("apply", "-f", manifest(ns, tmp_path))
    obj = cluster.kubectl_json("get", "slurmcluster", "demo", "-n", ns)
    assert (obj["apiVersion"], obj["kind"], obj["metadata"]["name"]) == ("slurmk8s.dev/v1alpha1", "SlurmCluster", "demo")
    listing = cluster.kubectl_json("get", "slurmclusters", "-n", ns)
    assert listing["kind"] == "List" and [i["metadata"]["name"] for i in listing["items"]] == ["demo"]
    out = cluster.kubectl("explain", "slurmcluster.spec.nodeSets").stdout
    described = applied_crds["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["nodeSets"]
    assert "KIND:       SlurmCluster" in out
    assert described["items"]["properties"]["gpus"]["description"].split("\n")[0][:40] in out


def test_replace(cluster: Cluster, applied_crds, ns: str, tmp_path) -> None:
    cluster.kubectl("create", "-f", manifest(ns, tmp_path))
    current = cluster.kubectl_json("get", "slurmcluster", "demo", "-n", ns)
    current["spec"]["login"]["replicas"] = 2
    path = tmp_path / "replace.json"
    path.write_text(json.dumps(current))
    assert cluster.kubectl("replace", "-f", str(path)).stdout.strip() == "slurmcluster.slurmk8s.dev/demo replaced"
    assert cluster.kubectl_json("get", "slurmcluster", "demo", "-n", ns)["spec"]["login"]["replicas"] == 2
    # a replace from the stale copy is refused by resourceVersion
    out = cluster.kubectl("replace", "-f", str(path), check=False)
    assert out.returncode != 0 and "the object has been modified" in out.stderr


def deployment_yaml(name: str, image: str = "app:1", replicas: int = 1) -> str:
    return yaml.safe_dump({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}, "template": {
            "metadata": {"labels": {"app": name}},
            "spec": {"containers": [{"name": "app", "image": image, "env": [{"name": "A", "value": "1"}]}]}}}})


def test_patch_three_ways_and_scale(cluster: Cluster, ns: str) -> None:
    cluster.kubectl("apply", "-n", ns, "-f", "-", stdin=deployment_yaml("web"))
    cluster.kubectl("patch", "-n", ns, "deployment", "web", "--type", "merge", "-p", '{"metadata":{"labels":{"via":"merge"}}}')
    cluster.kubectl("patch", "-n", ns, "deployment", "web", "--type", "json", "-p",
                    '[{"op":"add","path":"/metadata/annotations/via","value":"json"}]')
    cluster.kubectl("patch", "-n", ns, "deployment", "web", "-p",
                    '{"spec":{"template":{"spec":{"containers":[{"name":"app","env":[{"name":"B","value":"2"}]}]}}}}')
    out = cluster.kubectl("scale", "-n", ns, "deployment", "web", "--replicas=0")
    assert out.stdout.strip() == "deployment.apps/web scaled"
    d = cluster.kubectl_json("get", "-n", ns, "deployment", "web")
    assert d["metadata"]["labels"]["via"] == "merge" and d["metadata"]["annotations"]["via"] == "json"
    assert [e["name"] for e in d["spec"]["template"]["spec"]["containers"][0]["env"]] == ["A", "B"]
    assert d["spec"]["replicas"] == 0


def test_apply_changes_a_deployment_with_a_three_way_merge(cluster: Cluster, ns: str) -> None:
    cluster.kubectl("apply", "-n", ns, "-f", "-", stdin=deployment_yaml("tw", "app:1"))
    # someone else adds an env var; apply must keep it (it never owned it)
    cluster.kubectl("patch", "-n", ns, "deployment", "tw", "-p",
                    '{"spec":{"template":{"spec":{"containers":[{"name":"app","env":[{"name":"EXTRA","value":"x"}]}]}}}}')
    out = cluster.kubectl("apply", "-n", ns, "-f", "-", stdin=deployment_yaml("tw", "app:2"))
    assert out.stdout.strip() == "deployment.apps/tw configured"
    c = cluster.kubectl_json("get", "-n", ns, "deployment", "tw")["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == "app:2" and [e["name"] for e in c["env"]] == ["A", "EXTRA"]


def test_server_side_apply(cluster: Cluster, ns: str) -> None:
    def cm(labels: dict) -> str:
        return yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa", "labels": labels}, "data": {"k": "v"}})

    out = cluster.kubectl("apply", "--server-side", "-n", ns, "-f", "-", stdin=cm({"a": "1", "b": "2"}))
    assert "serverside-applied" in out.stdout
    cluster.kubectl("label", "-n", ns, "configmap", "ssa", "other=kept")
    cluster.kubectl("apply", "--server-side", "-n", ns, "-f", "-", stdin=cm({"a": "1"}))
    got = cluster.kubectl_json("get", "-n", ns, "configmap", "ssa", "--show-managed-fields")
    assert got["metadata"]["labels"] == {"a": "1", "other": "kept"}
    managers = {m["manager"]: m for m in got["metadata"]["managedFields"]}
    assert managers["kubectl"]["operation"] == "Apply"
    assert managers["kubectl"]["fieldsV1"]["f:metadata"]["f:labels"] == {"f:a": {}}


def test_delete_and_clear_errors(cluster: Cluster, ns: str) -> None:
    out = cluster.kubectl("create", "service", "clusterip", "-n", ns, "gone", "--tcp=80:80", check=False)
    assert out.returncode != 0 and "--dry-run=client -o yaml" in out.stderr  # protobuf is refused, with the way around
    # ConfigMaps and Secrets are read as protobuf too (Helm stores its releases in them)
    cluster.kubectl("create", "configmap", "-n", ns, "gone", "--from-literal=a=b")
    assert cluster.core.read_namespaced_config_map("gone", ns).data == {"a": "b"}
    # kubectl 1.32 says 'configmap "gone" deleted'; newer ones add 'from <ns> namespace'
    assert cluster.kubectl("delete", "-n", ns, "configmap", "gone").stdout.startswith('configmap "gone" deleted')
    out = cluster.kubectl("get", "-n", ns, "configmap", "gone", check=False)
    assert out.returncode != 0 and 'configmaps "gone" not found' in out.stderr
    out = cluster.kubectl("get", "daemonsets", check=False)
    assert out.returncode != 0 and 'the server doesn\'t have a resource type "daemonsets"' in out.stderr
    out = cluster.kubectl("get", "--raw", "/apis/apps/v1/daemonsets", check=False)
    assert out.returncode != 0 and "could not find the requested resource" in out.stderr
    out = cluster.kubectl("get", "pods", "-n", ns, "--field-selector", "spec.volumes=x", check=False)
    assert out.returncode != 0 and "field label not supported: spec.volumes" in out.stderr


def test_wait_describe_and_events(cluster: Cluster, ns: str) -> None:
    cluster.node("kubectl-node")
    cluster.pod(ns, "waited")
    wait_for("the pod to be scheduled", lambda: cluster.core.read_namespaced_pod("waited", ns).spec.node_name)
    cluster.report_running(ns, "waited")
    cluster.kubectl("wait", "-n", ns, "--for=condition=Ready", "pod/waited", "--timeout=20s")
    out = cluster.kubectl("describe", "-n", ns, "pod", "waited").stdout
    assert "Status:           Running" in out
    assert re.search(r"Normal\s+Scheduled\s+\S+\s+default-scheduler\s+Successfully assigned " + ns + "/waited to kubectl-node", out)
    table = cluster.kubectl("get", "pods", "-n", ns, "-o", "wide").stdout.splitlines()
    assert table[0].split()[:5] == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert table[1].split()[:3] == ["waited", "1/1", "Running"] and "kubectl-node" in table[1]


def test_the_create_generators_a_site_uses_are_read_from_protobuf(cluster: Cluster) -> None:
    """kubectl's `create <kind>` generators send protobuf: each one the docs
    and a platform engineer use makes the object it says."""
    run = cluster.kubectl
    name = f"gen-{uuid.uuid4().hex[:6]}"
    run("create", "namespace", name)
    assert cluster.core.read_namespace(name).spec.finalizers == ["kubernetes"]
    run("create", "serviceaccount", "-n", name, "robot")
    assert cluster.core.read_namespaced_service_account("robot", name).metadata.name == "robot"
    run("create", "quota", "-n", name, "team", "--hard=limits.cpu=64,requests.memory=32Gi,pods=20")
    assert cluster.kubectl_json("get", "-n", name, "quota", "team")["spec"]["hard"] == {
        "limits.cpu": "64", "requests.memory": "32Gi", "pods": "20"}
    run("create", "role", "-n", name, "reader", "--verb=get,list", "--resource=pods,configmaps")
    assert cluster.kubectl_json("get", "-n", name, "role", "reader")["rules"] == [
        {"verbs": ["get", "list"], "apiGroups": [""], "resources": ["pods", "configmaps"]}]
    run("create", "rolebinding", "-n", name, "reads", "--role=reader", f"--serviceaccount={name}:robot")
    binding = cluster.kubectl_json("get", "-n", name, "rolebinding", "reads")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "robot", "namespace": name}]
    run("create", "clusterrole", f"{name}-nodes", "--verb=get", "--resource=nodes")
    run("create", "clusterrolebinding", f"{name}-nodes", f"--clusterrole={name}-nodes", "--user=alice")
    assert cluster.kubectl_json("get", "clusterrolebinding", f"{name}-nodes")["subjects"] == [
        {"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "alice"}]
    # The robot may now do what the role says, and nothing more.
    can = run("auth", "can-i", "list", "pods", "-n", name, f"--as=system:serviceaccount:{name}:robot", check=False)
    assert can.stdout.strip() == "yes"
    cannot = run("auth", "can-i", "delete", "pods", "-n", name, f"--as=system:serviceaccount:{name}:robot", check=False)
    assert cannot.stdout.strip() == "no"
    run("delete", "clusterrolebinding,clusterrole", f"{name}-nodes")
