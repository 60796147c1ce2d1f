"""Authentication pieces without a server: the token file, JWT claims, the
protobuf bodies kubectl sends for reviews, ServiceAccount admission."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandbox.apiserver import admission, authn, protobuf
from sandbox.apiserver.errors import APIError


def test_token_file_round_trips_and_keeps_other_users(tmp_path) -> None:
    path = tmp_path / "tokens.csv"
    path.write_text('# comment\nabc,alice,u1,"dev,ops"\nold,sandbox-admin,x,\n')
    rows, kubelet = authn.ensure_token_file(path, "admintoken")
    assert [(r.user, r.groups) for r in rows] == [("alice", ("dev", "ops")), ("sandbox-admin", ("system:masters",)),
                                                  ("system:node:sandbox", ("system:nodes",))]
    assert rows[1].token == "admintoken" and rows[2].token == kubelet
    again, kubelet2 = authn.ensure_token_file(path, "admintoken")
    assert again == rows and kubelet2 == kubelet  # stable across restarts
    assert path.stat().st_mode & 0o777 == 0o600
    user = authn.static_user(rows[0])
    assert user.groups == ("dev", "ops", "system:authenticated")


@given(st.lists(st.tuples(st.text("abcdef0123456789", min_size=1), st.text("abcxyz:-", min_size=1),
                          st.lists(st.text("abc:-", min_size=1), max_size=3)), max_size=4))
def test_token_file_rendering_parses_back(rows) -> None:
    tokens = [authn.StaticToken(t, u, u, tuple(g)) for t, u, g in rows]
    assert authn.parse_token_file(authn.render_token_file(tokens)) == tokens


def test_claims_are_checked(tmp_path) -> None:
    key = authn.load_or_create_key(tmp_path / "sa.key")
    claims = authn.service_account_claims(issuer=authn.ISSUER, audiences=["a"], now=1000, expiration=600, namespace="n",
                                          sa_name="s", sa_uid="u", pod=("p", "pu"))
    token = authn.sign(key, claims)
    assert authn.verify(key.public_key(), token) == claims
    c = authn.check_claims(claims, issuer=authn.ISSUER, audiences=["a"], now=1500)
    assert (c.namespace, c.name, c.uid, c.pod_name, c.pod_uid) == ("n", "s", "u", "p", "pu")
    with pytest.raises(authn.TokenError, match="expired"):
        authn.check_claims(claims, issuer=authn.ISSUER, audiences=["a"], now=1000 + 600 + 61)
    with pytest.raises(authn.TokenError, match="audiences"):
        authn.check_claims(claims, issuer=authn.ISSUER, audiences=["b"], now=1500)
    with pytest.raises(authn.TokenError, match="signature"):
        authn.verify(key.public_key(), token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB"))


def test_authenticator_checks_the_account_and_pod_still_exist(tmp_path) -> None:
    key = authn.load_or_create_key(tmp_path / "sa.key")
    accounts = {("n", "s"): "u"}
    pods: dict = {("n", "p"): ("pu", None)}
    a = authn.Authenticator([], key, service_account=lambda ns, n: accounts.get((ns, n)), pod=lambda ns, n: pods.get((ns, n)),
                            clock=lambda: 1000)
    token, exp = a.issue("n", "s", "u", None, 3600, ("p", "pu"))
    assert exp == 4600
    assert a.authenticate(token).name == "system:serviceaccount:n:s"
    pods[("n", "p")] = ("pu", 1000 + 30.0)  # being deleted, grace period not over: still valid
    assert a.authenticate(token).name == "system:serviceaccount:n:s"
    pods[("n", "p")] = ("pu", 1000 - 61.0)  # deleted more than 60 s ago
    with pytest.raises(authn.TokenError, match="deleted more than 60 s ago"):
        a.authenticate(token)
    pods[("n", "p")] = ("other", None)
    with pytest.raises(authn.TokenError, match="does not match"):
        a.authenticate(token)
    accounts[("n", "s")] = "u2"
    with pytest.raises(authn.TokenError, match="UID"):
        a.authenticate(token)
    with pytest.raises(authn.TokenError):
        a.authenticate("nope")


def test_expiration_seconds_bounds() -> None:
    assert authn.expiration_of({}) == 3600
    assert authn.expiration_of({"expirationSeconds": 600}) == 600
    with pytest.raises(ValueError, match="10 minutes"):
        authn.expiration_of({"expirationSeconds": 599})


def test_protobuf_review_bodies_decode() -> None:
    ssar = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview", "metadata": {},
            "spec": {"resourceAttributes": {"namespace": "x", "verb": "list", "resource": "secrets"}}}
    assert protobuf.decode(protobuf.encode(ssar)) == ssar
    tr = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "metadata": {"name": "s"},
          "spec": {"audiences": ["a", "b"], "expirationSeconds": 3607, "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "p"}}}
    assert protobuf.decode(protobuf.encode(tr)) == tr
    with pytest.raises(protobuf.DecodeError):
        protobuf.decode(protobuf.encode({"apiVersion": "v1", "kind": "Pod"}))
    with pytest.raises(protobuf.DecodeError):
        protobuf.decode(b'{"kind": "Secret"}')


def test_protobuf_secrets_and_config_maps_decode_as_helm_stores_releases() -> None:
    release = {"apiVersion": "v1", "kind": "Secret", "type": "helm.sh/release.v1", "immutable": True,
               "metadata": {"name": "sh.helm.release.v1.slurmk8s.v1", "namespace": "sys", "resourceVersion": "42",
                            "labels": {"name": "slurmk8s", "owner": "helm", "status": "deployed", "version": "1"}},
               "data": {"release": "SDRzSUFBQUFBQUFDLzZ4Vw=="}}
    assert protobuf.decode(protobuf.encode(release)) == release
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "annotations": {"a": "b"}},
          "data": {"k": "v\n"}, "binaryData": {"b": "AAE="}}
    assert protobuf.decode(protobuf.encode(cm)) == cm
    delete = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background", "gracePeriodSeconds": 0,
              "preconditions": {"uid": "u-1", "resourceVersion": "7"}}
    assert protobuf.decode(protobuf.encode(delete)) == delete


@given(st.binary(max_size=64))
def test_protobuf_decoding_never_crashes_on_garbage(data: bytes) -> None:
    try:
        protobuf.decode(protobuf.MAGIC + data)
    except (protobuf.DecodeError, UnicodeDecodeError):
        pass


def pod(**spec) -> dict:
    return {"metadata": {"name": "p", "namespace": "n"}, "spec": {"containers": [{"name": "c"}], **spec}}


def test_admission_mounts_once_and_respects_existing_mounts() -> None:
    p = pod(containers=[{"name": "a"}, {"name": "b", "volumeMounts": [{"name": "mine", "mountPath": admission.TOKEN_MOUNT_PATH}]}])
    admission.admit_pod(p, {"metadata": {"name": "default"}}, "abcde")
    assert [v["name"] for v in p["spec"]["volumes"]] == ["kube-api-access-abcde"]
    assert p["spec"]["containers"][0]["volumeMounts"][0]["name"] == "kube-api-access-abcde"
    assert p["spec"]["containers"][1]["volumeMounts"] == [{"name": "mine", "mountPath": admission.TOKEN_MOUNT_PATH}]
    all_mounted = pod(containers=[{"name": "b", "volumeMounts": [{"name": "mine", "mountPath": admission.TOKEN_MOUNT_PATH}]}])
    admission.admit_pod(all_mounted, {}, "abcde")
    assert "volumes" not in all_mounted["spec"]


def test_admission_automount_precedence_and_missing_account() -> None:
    off = {"automountServiceAccountToken": False}
    p = pod()
    admission.admit_pod(p, off, "x")
    assert "volumes" not in p["spec"]
    p = pod(automountServiceAccountToken=True)
    admission.admit_pod(p, off, "x")
    assert p["spec"]["volumes"]
    with pytest.raises(APIError) as e:
        admission.admit_pod(pod(serviceAccountName="ghost"), None, "x")
    assert e.value.code == 403
    assert e.value.message == 'pods "p" is forbidden: error looking up service account n/ghost: serviceaccount "ghost" not found'


def test_audit_lines_and_rotation(tmp_path) -> None:
    from sandbox.apiserver import audit
    from sandbox.apiserver.rbac import Attributes, User

    sa = User("system:serviceaccount:x:y", ("system:serviceaccounts",))
    line = audit.entry(sa, Attributes("list", namespace="x", resource="secrets"), 403, time="T")
    assert line == {"time": "T", "user": "system:serviceaccount:x:y", "groups": ["system:serviceaccounts"], "verb": "list",
                    "apiGroup": "", "resource": "secrets", "namespace": "x", "code": 403}
    admin = User("sandbox-admin", ("system:masters",))
    line = audit.entry(sa, Attributes("get", resource_request=False, path="/api"), 200, impersonated_by=admin, time="T")
    assert line["impersonatedBy"] == "sandbox-admin" and line["path"] == "/api" and "resource" not in line
    log = audit.AuditLog(tmp_path / "audit.log", max_bytes=400)
    for i in range(10):
        log.write(audit.entry(sa, Attributes("get", namespace="x", resource="pods", name=f"p{i}"), 200 if i % 2 else 403))
    log.close()
    assert (tmp_path / "audit.log.1").exists()
    lines = audit.read(tmp_path / "audit.log")
    names = [ln["name"] for ln in lines]
    assert names == sorted(names, key=lambda n: int(n[1:])) and names[-1] == "p9"
    assert [ln["name"] for ln in audit.forbidden(lines)] == [n for n in names if int(n[1:]) % 2 == 0]
    assert audit.forbidden(lines, ("someone-else",)) == []
