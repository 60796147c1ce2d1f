"""A stand-in stopped (or killed) and started again on the same data directory
keeps its objects, token and CA, and continues the resourceVersion sequence."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from kubernetes import watch
from kubernetes.client.rest import ApiException

from .conftest import CRDS, ROOT, start_server, wait_for


def test_objects_survive_a_restart(tmp_path) -> None:
    a = start_server(tmp_path)
    ns = a.namespace()
    created = a.core.create_namespaced_config_map(ns, {"metadata": {"name": "kept", "labels": {"k": "v"}}, "data": {"x": "1"}})
    a.kubectl("apply", "-f", str(CRDS) + "/")
    before_rv = int(a.core.list_namespaced_config_map(ns).metadata.resource_version)
    token, ca = a.srv.token, a.srv.ca_pem
    a.api_client.close()
    a.srv.stop()

    b = start_server(tmp_path)
    try:
        assert (b.srv.token, b.srv.ca_pem) == (token, ca)
        kept = b.core.read_namespaced_config_map("kept", ns)
        assert (kept.metadata.uid, kept.data, kept.metadata.resource_version) == (created.metadata.uid, {"x": "1"}, created.metadata.resource_version)
        after = b.core.create_namespaced_config_map(ns, {"metadata": {"name": "new"}})
        assert int(after.metadata.resource_version) > before_rv
        assert "slurmclusters" in b.kubectl("api-resources", "--api-group=slurmk8s.dev", "-o", "name").stdout
        # the watch history is not kept: a watch from before the restart is told to relist
        with pytest.raises(ApiException) as e:
            for _ in watch.Watch().stream(b.core.list_namespaced_config_map, ns, resource_version=str(before_rv - 1), timeout_seconds=5):
                pass
        assert e.value.status == 410
        w = watch.Watch()
        for ev in w.stream(b.core.list_namespaced_config_map, ns, resource_version=after.metadata.resource_version, timeout_seconds=1):
            raise AssertionError(f"nothing happened after the last write, got {ev['type']}")
    finally:
        b.api_client.close()
        b.srv.stop()


def test_the_foreground_process_is_killed_and_restarted(tmp_path) -> None:
    data, kubeconfig = tmp_path / "data", tmp_path / "kubeconfig"

    def launch() -> tuple[subprocess.Popen, str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sandbox.apiserver", "--data-dir", str(data), "--kubeconfig", str(kubeconfig),
             "--crds", str(CRDS)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        line = proc.stdout.readline().strip()
        assert line.startswith("https://127.0.0.1:"), (line, proc.stderr.read() if proc.poll() is not None else "")
        return proc, line

    def kubectl(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), "--cache-dir", str(tmp_path / "kcache"), *args],
                              capture_output=True, text=True, timeout=60, env=dict(os.environ, HOME=str(tmp_path)))

    proc, url = launch()
    try:
        assert kubectl("get", "crd", "slurmclusters.slurmk8s.dev", "-o", "name").stdout.strip() == "customresourcedefinition.apiextensions.k8s.io/slurmclusters.slurmk8s.dev"
        created = kubectl("apply", "-f", str(ROOT / "examples" / "slurmcluster.yaml"))
        assert created.returncode == 0, created.stderr
        rv_before = kubectl("get", "slurmcluster", "demo", "-o", "jsonpath={.metadata.resourceVersion}").stdout
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    proc, url = launch()
    try:
        got = kubectl("get", "slurmcluster", "demo", "-o", "jsonpath={.metadata.resourceVersion}")
        assert got.returncode == 0 and got.stdout == rv_before, got.stderr
        changed = kubectl("patch", "slurmcluster", "demo", "--type", "merge", "-p", '{"spec":{"login":{"replicas":2}}}')
        assert changed.returncode == 0, changed.stderr
        rv_after = kubectl("get", "slurmcluster", "demo", "-o", "jsonpath={.metadata.resourceVersion}").stdout
        assert int(rv_after) > int(rv_before)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0


def test_identities_survive_a_restart_and_bootstrap_policy_is_reconciled(tmp_path) -> None:
    from kubernetes import client

    a = start_server(tmp_path)
    ns = a.namespace()
    a.core.create_namespaced_service_account(ns, {"metadata": {"name": "bot"}})
    sa_token = a.srv.issue_token(ns, "bot")
    kubelet_token = a.srv.kubelet_token
    rbac = client.RbacAuthorizationV1Api(a.api_client)
    # The roles aggregated into view and edit (view's and edit's own rules are the aggregation controller's).
    view = a.api_client.sanitize_for_serialization(rbac.read_cluster_role("system:aggregate-to-view"))
    view["rules"] = view["rules"][:1]
    rbac.replace_cluster_role("system:aggregate-to-view", view)
    edit = a.api_client.sanitize_for_serialization(rbac.read_cluster_role("system:aggregate-to-edit"))
    edit["rules"] = edit["rules"][:1]
    edit["metadata"]["annotations"]["rbac.authorization.kubernetes.io/autoupdate"] = "false"
    rbac.replace_cluster_role("system:aggregate-to-edit", edit)
    wait_for("view down to one rule", lambda: len(rbac.read_cluster_role("view").rules or []) == 1)
    rbac.create_cluster_role({"metadata": {"name": "mine"}, "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]})
    a.api_client.close()
    a.srv.stop()

    b = start_server(tmp_path)
    try:
        assert b.srv.kubelet_token == kubelet_token
        rbac = client.RbacAuthorizationV1Api(b.api_client)
        assert len(rbac.read_cluster_role("system:aggregate-to-view").rules) > 1  # put back
        assert len(rbac.read_cluster_role("system:aggregate-to-edit").rules) == 1  # autoupdate "false": left alone
        wait_for("view aggregated again", lambda: len(rbac.read_cluster_role("view").rules or []) > 1)
        assert [r.resources for r in rbac.read_cluster_role("mine").rules] == [["pods"]]
        from .test_authz import whoami

        code, me = whoami(b, sa_token)
        assert code == 201 and me["status"]["userInfo"]["username"] == f"system:serviceaccount:{ns}:bot"
        code, me = whoami(b, kubelet_token)
        assert me["status"]["userInfo"]["username"] == "system:node:sandbox"
    finally:
        b.api_client.close()
        b.srv.stop()


def test_the_foreground_process_writes_the_kubelet_kubeconfig(tmp_path) -> None:
    import yaml

    data, admin, kubelet = tmp_path / "data", tmp_path / "admin", tmp_path / "kubelet"
    proc = subprocess.Popen([sys.executable, "-m", "sandbox.apiserver", "--data-dir", str(data), "--kubeconfig", str(admin),
                             "--kubelet-kubeconfig", str(kubelet)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout.readline().startswith("https://127.0.0.1:")

        def whoami(path):
            out = subprocess.run(["kubectl", "--kubeconfig", str(path), "--cache-dir", str(tmp_path / "kcache"), "auth", "whoami", "-o",
                                  "jsonpath={.status.userInfo.username}"], capture_output=True, text=True, timeout=60,
                                 env=dict(os.environ, HOME=str(tmp_path)))
            assert out.returncode == 0, out.stderr
            return out.stdout

        assert whoami(admin) == "sandbox-admin"
        assert whoami(kubelet) == "system:node:sandbox"
        assert yaml.safe_load(kubelet.read_text())["users"][0]["user"]["token"] != yaml.safe_load(admin.read_text())["users"][0]["user"]["token"]
        assert oct(kubelet.stat().st_mode & 0o777) == "0o600"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
