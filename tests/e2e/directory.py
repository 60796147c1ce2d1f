"""A site's directory for the sandbox: OpenLDAP (the project's ldap image) in a namespace of
its own, with TLS from a CA of the test's, and the SlurmCluster's ``spec.identity.ldap``
pointing at it. It starts as a site's directory is: with the account SSSD binds as, the
groups physics (alice, bob) and chemistry (carol), and alice and carol with their keys;
the tests add and change entries with ldapadd and ldapmodify, as a site's admin would, and
cut it off with a NetworkPolicy (:func:`isolated`)."""

from __future__ import annotations

import base64
import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path

from sandbox.apiserver import tls
from slurmk8s import __version__

NAMESPACE = "directory"
HOST = f"ldap.{NAMESPACE}.svc.cluster.local"
SUFFIX = "dc=example,dc=org"
PEOPLE = f"ou=people,{SUFFIX}"
GROUPS = f"ou=groups,{SUFFIX}"
READER = f"cn=reader,{SUFFIX}"
ADMIN = f"cn=admin,{SUFFIX}"


@dataclass(frozen=True)
class Directory:
    admin_password: str
    reader_password: str
    ca_pem: str
    #: user -> (private key file, public key line): alice, bob, carol
    keys: dict[str, tuple[Path, str]]


def make(work: Path) -> tuple[Directory, list[dict]]:
    """The directory's certificate, passwords and users' keys, and its Kubernetes objects (its
    namespace, Secrets, Deployment and Service); not the cluster's side (:func:`cluster_objects`)."""
    pki = tls.ensure(work / "ldap-tls", [HOST], common_name=HOST, ca_name="site-directory-ca")
    keys = {name: keypair(work, name) for name in ("alice", "bob", "carol")}
    d = Directory(secrets.token_urlsafe(24), secrets.token_urlsafe(24), pki.ca_pem, keys)
    seed = "\n".join([ldif_reader(d), ldif_group("physics", 5000, ["alice", "bob"]),
                      ldif_group("chemistry", 5100, ["carol"]), ldif_user("alice", 5001, 5000, keys["alice"][1]),
                      ldif_user("carol", 5003, 5100, keys["carol"][1])])
    labels = {"app": "ldap"}
    docs = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
         "metadata": {"name": "ldap-tls", "namespace": NAMESPACE},
         "data": {"tls.crt": _b64(pki.server_cert.read_bytes()), "tls.key": _b64(pki.server_key.read_bytes())}},
        {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
         "metadata": {"name": "ldap-admin", "namespace": NAMESPACE},
         "data": {"password": _b64(d.admin_password.encode())}},
        {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
         "metadata": {"name": "ldap-seed", "namespace": NAMESPACE},
         "data": {"10-site.ldif": _b64(seed.encode())}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "ldap", "namespace": NAMESPACE},
         "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
             "metadata": {"labels": labels},
             "spec": {"containers": [{
                 "name": "slapd", "image": f"ghcr.io/slurmk8s/ldap:{__version__}",
                 "env": [{"name": "LDAP_SUFFIX", "value": SUFFIX}],
                 "ports": [{"name": "ldap", "containerPort": 389}, {"name": "ldaps", "containerPort": 636}],
                 "readinessProbe": {"exec": {"command": ["/usr/local/bin/slurmk8s-entrypoint", "ready"]},
                                    "periodSeconds": 2},
                 "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "512Mi"}},
                 "volumeMounts": [{"name": "tls", "mountPath": "/run/slurmk8s/ldap/tls", "readOnly": True},
                                  {"name": "admin", "mountPath": "/run/slurmk8s/ldap/admin", "readOnly": True},
                                  {"name": "seed", "mountPath": "/run/slurmk8s/ldap/seed", "readOnly": True}]}],
                 "volumes": [{"name": "tls", "secret": {"secretName": "ldap-tls", "defaultMode": 0o400}},
                             {"name": "admin", "secret": {"secretName": "ldap-admin", "defaultMode": 0o400}},
                             {"name": "seed", "secret": {"secretName": "ldap-seed", "defaultMode": 0o400}}]}}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "ldap", "namespace": NAMESPACE},
         "spec": {"selector": labels, "ports": [{"name": "ldap", "port": 389, "targetPort": "ldap"},
                                                {"name": "ldaps", "port": 636, "targetPort": "ldaps"}]}},
    ]
    return d, docs


def cluster_objects(d: Directory, namespace: str) -> list[dict]:
    """The CA and the bind password where the SlurmCluster is, labelled for their use (the
    password also for the directory's host)."""
    return [
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": "ldap-ca", "namespace": namespace, "labels": {"slurmk8s.dev/configmap-use": "ldap-ca"}},
         "data": {"ca.crt": d.ca_pem}},
        {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
         "metadata": {"name": "ldap-bind", "namespace": namespace,
                      "labels": {"slurmk8s.dev/secret-use": "ldap-bind-password"},
                      "annotations": {"slurmk8s.dev/allowed-hosts": HOST}},
         "data": {"password": _b64(d.reader_password.encode())}},
    ]


#: spec.accounting.accounts that follow the directory's groups.
ACCOUNTS = [{"name": "physics", "groups": ["physics"]}, {"name": "chemistry", "groups": ["chemistry"]}]


def identity(login_groups: list[str], cache_seconds: int = 15) -> dict:
    """spec.identity of the SlurmCluster: this directory over LDAPS, checked against its CA."""
    return {"ldap": {
        "uris": [f"ldaps://{HOST}"], "ca": {"configMap": {"name": "ldap-ca", "key": "ca.crt"}},
        "bindDn": READER, "bindPasswordSecret": {"name": "ldap-bind", "key": "password"},
        "userSearchBase": PEOPLE, "groupSearchBase": GROUPS, "loginGroups": login_groups,
        # The directory's ids (5000-5100) above the example's login user (2001).
        "minId": 5000, "cacheSeconds": cache_seconds}}


def other_ca(work: Path) -> str:
    """A CA that did not sign the directory's certificate: a wrong spec.identity.ldap.ca."""
    return tls.ensure(work / "other-tls", ["elsewhere.example.org"], common_name="elsewhere.example.org",
                      ca_name="another-ca").ca_pem


def isolated() -> dict:
    """A NetworkPolicy that cuts the directory off: its pods admit nobody."""
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "directory-down", "namespace": NAMESPACE},
            "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}


def ldif_reader(d: Directory) -> str:
    return (f"dn: {READER}\nobjectClass: organizationalRole\nobjectClass: simpleSecurityObject\ncn: reader\n"
            f"userPassword: {d.reader_password}\n")


def ldif_group(name: str, gid: int, members: list[str]) -> str:
    return (f"dn: cn={name},{GROUPS}\nobjectClass: posixGroup\ncn: {name}\ngidNumber: {gid}\n"
            + "".join(f"memberUid: {m}\n" for m in members))


def ldif_user(name: str, uid: int, gid: int, key: str) -> str:
    return (f"dn: uid={name},{PEOPLE}\nobjectClass: inetOrgPerson\nobjectClass: posixAccount\n"
            f"objectClass: ldapPublicKey\nuid: {name}\ncn: {name}\nsn: {name}\nuidNumber: {uid}\n"
            f"gidNumber: {gid}\nhomeDirectory: /home/{name}\nloginShell: /bin/bash\nsshPublicKey: {key}\n")


def ldap_apply(kubectl, tool: str, ldif: str) -> str:
    """ldapadd / ldapmodify / ldapdelete as the directory's admin, in its pod."""
    argv = ["exec", "-i", "-n", NAMESPACE, "deploy/ldap", "--", "sh", "-c",
            f'head -n 1 /run/slurmk8s/ldap/admin/password | tr -d "\\n" > /tmp/pw && '
            f"{tool} -x -H ldap://127.0.0.1 -D {ADMIN} -y /tmp/pw; rc=$?; rm -f /tmp/pw; exit $rc"]
    proc = kubectl(*argv, input=ldif)
    return proc


def keypair(work: Path, name: str) -> tuple[Path, str]:
    """An ed25519 key of ``name``: its private key file and its public key line."""
    path = work / f"{name}.key"
    if not path.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(path)], check=True)
    return path, path.with_suffix(".key.pub").read_text().strip()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
