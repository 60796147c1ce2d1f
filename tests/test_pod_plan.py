"""The sandbox kubelet's pure pod plan: what a container's environment and
volumes hold, as a kubelet builds them from the pod spec and the API's objects."""

from __future__ import annotations

import base64

import pytest

from sandbox.plan import pod_plan, token_requests

SERVICE_ENV = {"KUBERNETES_SERVICE_HOST": "10.253.0.1", "KUBERNETES_SERVICE_PORT": "6443"}


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def pod(containers: list[dict], volumes: list[dict] | None = None, **spec) -> dict:
    return {"metadata": {"name": "op-1", "namespace": "sys", "uid": "u-1", "labels": {"app": "op"},
                         "annotations": {"a": "b"}},
            "spec": {"nodeName": "node-0", "serviceAccountName": "op", "containers": containers,
                     "volumes": volumes or [], **spec}}


def container(**fields) -> dict:
    return {"name": "main", "image": "ghcr.io/slurmk8s/controller:0.1.0", **fields}


API_ACCESS = {"name": "kube-api-access-abcde", "projected": {"defaultMode": 420, "sources": [
    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
    {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1",
                                                                  "fieldPath": "metadata.namespace"}}]}}]}}
MOUNT = {"name": "kube-api-access-abcde", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
         "readOnly": True}
ROOT_CA = {"kube-root-ca.crt": {"data": {"ca.crt": "-----BEGIN CERTIFICATE-----\n"}}}


def test_the_service_account_volume_holds_the_token_the_ca_and_the_namespace():
    p = pod([container(volumeMounts=[MOUNT])], [API_ACCESS])
    assert token_requests(p) == [("kube-api-access-abcde", "token", None, 3607)]
    plan = pod_plan(p, ROOT_CA, {}, "10.253.0.9", tokens={("kube-api-access-abcde", "token"): "jwt"},
                    service_env=SERVICE_ENV)
    files = {f.path: (f.content, f.mode) for f in plan.files}
    base = "volumes/kube-api-access-abcde"
    assert files == {f"{base}/token": (b"jwt", 420), f"{base}/ca.crt": (b"-----BEGIN CERTIFICATE-----\n", 420),
                     f"{base}/namespace": (b"sys", 420)}
    mount = plan.main.mounts[0]
    assert (mount.source, mount.target, mount.read_only) == (base, MOUNT["mountPath"], True)
    assert plan.main.env == SERVICE_ENV  # in-cluster config finds the API server


def test_a_pod_waits_for_its_token_and_its_root_ca():
    p = pod([container(volumeMounts=[MOUNT])], [API_ACCESS])
    with pytest.raises(LookupError, match="token"):
        pod_plan(p, ROOT_CA, {}, "10.253.0.9")
    with pytest.raises(LookupError, match="kube-root-ca.crt"):
        pod_plan(p, {}, {}, "10.253.0.9", tokens={("kube-api-access-abcde", "token"): "jwt"})


def test_env_value_from_fields_config_maps_and_secrets():
    env = [
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
        {"name": "LEVEL", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "level"}}},
        {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
        {"name": "MISSING", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "nope", "optional": True}}},
        {"name": "PLAIN", "value": "x"},
        {"name": "KUBERNETES_SERVICE_PORT", "value": "443"},  # the pod spec wins
    ]
    p = pod([container(env=env, envFrom=[{"configMapRef": {"name": "cfg"}, "prefix": "CFG_"}])])
    plan = pod_plan(p, {"cfg": {"data": {"level": "debug"}}}, {"creds": {"data": {"password": b64("s3cret")}}},
                    "10.253.0.9", service_env=SERVICE_ENV)
    assert plan.main.env == {
        "KUBERNETES_SERVICE_HOST": "10.253.0.1", "KUBERNETES_SERVICE_PORT": "443", "CFG_level": "debug",
        "POD_NAMESPACE": "sys", "POD_NAME": "op-1", "POD_IP": "10.253.0.9", "NODE": "node-0", "APP": "op",
        "LEVEL": "debug", "PASSWORD": "s3cret", "PLAIN": "x"}


@pytest.mark.parametrize("ref, missing", [
    ({"secretKeyRef": {"name": "creds", "key": "password"}}, "secret sys/creds does not exist"),
    ({"configMapKeyRef": {"name": "cfg", "key": "nope"}}, "configMap sys/cfg has no key 'nope'"),
])
def test_a_missing_env_source_makes_the_pod_wait(ref, missing):
    p = pod([container(env=[{"name": "X", "valueFrom": ref}])])
    with pytest.raises(LookupError, match=missing):
        pod_plan(p, {"cfg": {"data": {}}}, {}, "10.253.0.9")


def test_projected_secret_items_and_a_downward_api_volume():
    volumes = [
        {"name": "keys", "projected": {"sources": [{"secret": {"name": "k", "items": [{"key": "a", "path": "x/a"}]}}]}},
        {"name": "info", "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
    ]
    mounts = [{"name": "keys", "mountPath": "/keys"}, {"name": "info", "mountPath": "/info"}]
    plan = pod_plan(pod([container(volumeMounts=mounts)], volumes), {}, {"k": {"data": {"a": b64("A"), "b": b64("B")}}},
                    "10.253.0.9")
    files = {f.path: f.content for f in plan.files}
    assert files == {"volumes/keys/x/a": b"A", "volumes/info/labels": b'app="op"'}


@pytest.mark.root
def test_with_an_fs_group_the_pods_volume_files_are_that_groups_to_read(tmp_path):
    """As the kubelet's volume ownership management: a non-root container reads a Secret
    mounted 0400 when the pod's fsGroup owns it (mode | 0440)."""
    import os

    from sandbox.runtime import refresh_volumes, write_files

    volumes = [{"name": "cert", "secret": {"secretName": "tls", "defaultMode": 0o400}}]
    mounts = [{"name": "cert", "mountPath": "/etc/cert", "readOnly": True}]
    secrets = {"tls": {"data": {"tls.key": b64("KEY")}}}
    plan = pod_plan(pod([container(volumeMounts=mounts)], volumes, securityContext={"fsGroup": 10001}),
                    {}, secrets, "10.253.0.9")
    assert plan.fs_group == 10001
    write_files(plan, tmp_path / "pod")
    key = tmp_path / "pod" / "volumes" / "cert" / "tls.key"
    assert (key.stat().st_gid, key.stat().st_mode & 0o777) == (10001, 0o440)
    refresh_volumes(plan, tmp_path / "pod")
    assert (key.stat().st_gid, key.stat().st_mode & 0o777) == (10001, 0o440)
    bare = pod_plan(pod([container(volumeMounts=mounts)], volumes), {}, secrets, "10.253.0.9")
    write_files(bare, tmp_path / "bare")
    key = tmp_path / "bare" / "volumes" / "cert" / "tls.key"
    assert (key.stat().st_gid, key.stat().st_mode & 0o777) == (os.getgid(), 0o400)


@pytest.mark.root
def test_an_empty_dir_is_empty_and_any_user_of_the_pod_may_write_there(tmp_path):
    """As the kubelet makes an emptyDir: mode 0777, nothing in it; with an fsGroup, that
    group owns it with the setgid bit (a non-root Prometheus writes its data there)."""
    from sandbox.runtime import refresh_volumes, write_files

    volumes = [{"name": "data", "emptyDir": {}}]
    mounts = [{"name": "data", "mountPath": "/data"}]
    for name, security, gid, mode in (("bare", {}, 0, 0o777), ("grouped", {"fsGroup": 65534}, 65534, 0o2777)):
        plan = pod_plan(pod([container(volumeMounts=mounts)], volumes, securityContext=security), {}, {}, "10.253.0.9")
        write_files(plan, tmp_path / name)
        data = tmp_path / name / "volumes" / "data"
        assert (data.stat().st_gid, data.stat().st_mode & 0o7777) == (gid, mode)
        assert list(data.iterdir()) == []
        (data / "written-by-the-pod").write_text("x")
        refresh_volumes(plan, tmp_path / name)  # a ConfigMap's refresh leaves it as the pod left it
        assert [p.name for p in data.iterdir()] == ["written-by-the-pod"]


def test_an_optional_config_map_or_secret_that_is_missing_is_an_empty_volume_and_a_required_one_waits():
    volumes = [{"name": "rules", "configMap": {"name": "absent", "optional": True}},
               {"name": "creds", "secret": {"secretName": "absent", "optional": True}}]
    mounts = [{"name": "rules", "mountPath": "/rules"}, {"name": "creds", "mountPath": "/creds"}]
    plan = pod_plan(pod([container(volumeMounts=mounts)], volumes), {}, {}, "10.253.0.9")
    assert [f.path for f in plan.files] == []
    required = [{"name": "rules", "configMap": {"name": "absent"}}]
    with pytest.raises(LookupError, match="configMap .*/absent .*does not exist"):
        pod_plan(pod([container(volumeMounts=mounts[:1])], required), {}, {}, "10.253.0.9")
