"""Pod Security admission in the stand-in: the namespace's labels, the checks
of each level, the 403 of enforce, the warnings kubectl prints, and the
FailedCreate Events of the workload controllers whose pods are refused."""

from __future__ import annotations

import json

import pytest
from kubernetes.client.rest import ApiException

from sandbox.apiserver import podsecurity

from .conftest import Cluster, wait_for

PLAIN = {"containers": [{"name": "main", "image": "busybox:1.36"}]}
PRIVILEGED = {"containers": [{"name": "main", "image": "busybox:1.36", "securityContext": {"privileged": True}}]}
HARDENED = {"securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "main", "image": "busybox:1.36", "securityContext": {
                "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}]}


def labelled(c: Cluster, **levels: str) -> str:
    ns = c.namespace("psa")
    c.core.patch_namespace(ns, {"metadata": {"labels": {
        f"pod-security.kubernetes.io/{mode}": level for mode, level in levels.items()}}})
    return ns


def test_the_checks_of_each_level():
    assert podsecurity.check(PRIVILEGED, "privileged") == []
    assert podsecurity.check(PRIVILEGED, "baseline") == [
        ("privileged", 'container "main" must not set securityContext.privileged=true')]
    assert podsecurity.check(PLAIN, "baseline") == []
    assert [r for r, _ in podsecurity.check(PLAIN, "restricted")] == [
        "allowPrivilegeEscalation != false", "unrestricted capabilities", "runAsNonRoot != true", "seccompProfile"]
    assert podsecurity.check(HARDENED, "restricted") == []
    host = {**PLAIN, "hostNetwork": True, "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
            "containers": [{"name": "main", "image": "x", "ports": [{"containerPort": 22, "hostPort": 22}],
                            "securityContext": {"capabilities": {"add": ["SYS_ADMIN", "CHOWN"]}}}]}
    assert podsecurity.check(host, "baseline") == [
        ("host namespaces", "hostNetwork=true"),
        ("non-default capabilities", 'container "main" must not include "SYS_ADMIN" in securityContext.capabilities.add'),
        ("hostPath volumes", 'volume "root"'),
        ("hostPort", 'container "main" uses hostPort 22')]


def test_enforce_refuses_a_pod_that_violates_its_level_and_admits_one_that_does_not(cluster: Cluster):
    c = cluster
    ns = labelled(c, enforce="baseline")
    with pytest.raises(ApiException) as refused:
        c.core.create_namespaced_pod(ns, {"metadata": {"name": "root"}, "spec": PRIVILEGED})
    assert refused.value.status == 403
    assert json.loads(refused.value.body)["message"] == (
        'pods "root" is forbidden: violates PodSecurity "baseline:latest": privileged '
        '(container "main" must not set securityContext.privileged=true)')
    c.core.create_namespaced_pod(ns, {"metadata": {"name": "plain"}, "spec": PLAIN})


def test_warn_is_what_kubectl_prints_and_workload_templates_are_warned_not_refused(cluster: Cluster, tmp_path):
    c = cluster
    ns = labelled(c, enforce="baseline", warn="restricted")
    pod = c.kubectl("run", "plain", "-n", ns, "--image", "busybox:1.36")
    assert 'Warning: would violate PodSecurity "restricted:latest": allowPrivilegeEscalation != false' in pod.stderr
    sts = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "root", "namespace": ns},
           "spec": {"replicas": 1, "serviceName": "root", "selector": {"matchLabels": {"app": "root"}},
                    "template": {"metadata": {"labels": {"app": "root"}}, "spec": PRIVILEGED}}}
    made = c.kubectl("apply", "-f", "-", stdin=json.dumps(sts))
    assert 'Warning: would violate PodSecurity "baseline:latest": privileged' in made.stderr  # enforce's level too
    events = wait_for("the StatefulSet's FailedCreate", lambda: c.core.list_namespaced_event(
        ns, field_selector="involvedObject.name=root,reason=FailedCreate").items)
    assert events[0].type == "Warning" and events[0].message.startswith(
        'create Pod root-0 in StatefulSet root failed error: pods "root-0" is forbidden: '
        'violates PodSecurity "baseline:latest": privileged')
    assert c.core.list_namespaced_pod(ns, label_selector="app=root").items == []


def test_a_namespace_label_with_no_such_level_is_refused_with_its_field(cluster: Cluster):
    c = cluster
    ns = c.namespace("psa")
    with pytest.raises(ApiException) as refused:
        c.core.patch_namespace(ns, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "strict"}}})
    assert refused.value.status == 422
    assert "metadata.labels[pod-security.kubernetes.io/enforce]" in refused.value.body
    assert "must be one of privileged, baseline, restricted" in refused.value.body


def test_audit_writes_the_violations_into_the_requests_audit_line_admitted_or_not(cluster: Cluster):
    from sandbox.apiserver import audit

    c = cluster
    ns = labelled(c, enforce="baseline", audit="restricted")
    c.core.create_namespaced_pod(ns, {"metadata": {"name": "plain"}, "spec": PLAIN})
    c.core.create_namespaced_pod(ns, {"metadata": {"name": "hardened"}, "spec": HARDENED})
    with pytest.raises(ApiException):
        c.core.create_namespaced_pod(ns, {"metadata": {"name": "root"}, "spec": PRIVILEGED})
    lines = [ln for ln in audit.read(c.srv.audit_path)
             if ln.get("namespace") == ns and ln.get("resource") == "pods" and ln.get("verb") == "create"]
    notes = [(ln["code"], (ln.get("annotations") or {}).get("pod-security.kubernetes.io/audit-violations", ""))
             for ln in lines]
    assert [code for code, _ in notes] == [201, 201, 403]
    assert notes[0][1].startswith('would violate PodSecurity "restricted:latest": allowPrivilegeEscalation != false')
    assert notes[1][1] == ""  # nothing to say about a pod that passes
    assert 'privileged (container "main" must not set securityContext.privileged=true)' in notes[2][1]
