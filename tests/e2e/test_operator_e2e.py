"""The operator end to end, the way a platform engineer works: kubectl against
the sandbox's API, a SlurmCluster changed while real Slurm runs a job on it."""

from __future__ import annotations

import base64
import json
import re
import subprocess

import pytest
import yaml

from sandbox import install
from sandbox.apiserver.storage import DEFAULT_CLASS
from slurmk8s.bridge import permissions as bridge_permissions
from slurmk8s.operator import permissions
from slurmk8s.permissions import grants

from ..conftest import EXAMPLE
from .common import running_sandbox, wait_for
from .conftest import default_release_only
from .platform import Platform

pytestmark = pytest.mark.slurm
SUBNET = "10.253.93.0/24"


@pytest.fixture(scope="module")
def platform(tmp_path_factory, release):
    doc = {
        "apiVersion": "slurmk8s.dev/v1alpha1", "kind": "SlurmCluster", "metadata": {"name": "ops"},
        "spec": {
            "nodeSets": [{"name": "cpu", "replicas": 2, "cpus": 1, "memory": "1Gi",
                          "drain": {"gracePeriod": 15}}],
            "partitions": [{"name": "cpu", "nodeSets": ["cpu"], "default": True}],
        },
    }
    with running_sandbox(tmp_path_factory.mktemp("operator-e2e"), doc, SUBNET, release) as (box, _, _):
        yield Platform(box)


def test_kubectl_shows_the_cluster_with_its_printer_columns(platform):
    table = platform.kubectl("get", "slurmclusters").stdout
    header, row = table.splitlines()[:2]
    assert header.split()[:4] == ["NAME", "PHASE", "READY", "VERSION"]
    assert row.split()[:3] == ["ops", "Ready", "True"]


def test_a_config_change_is_applied_by_reconfigure_without_losing_a_job(platform):
    job = platform.sbatch("--wrap", "sleep 300", "-o", "/dev/null")
    wait_for("the job to run", lambda: platform.job(job)["JobState"] == "RUNNING")
    pid = platform.ctld_pid()
    assert pid
    # A slurm.conf-only setting: no pod template changes, so no pod restarts.
    platform.kubectl("patch", "slurmcluster", "ops", "--type", "merge", "-p",
                     json.dumps({"spec": {"slurmConfig": {"schedulerParameters": ["bf_max_job_test=321"]}}}))
    wait_for("slurmctld to read the new SchedulerParameters",
             lambda: "bf_max_job_test=321" in platform.scontrol("show", "config"), timeout=120)
    assert platform.job(job)["JobState"] == "RUNNING"  # the job kept running
    assert platform.ctld_pid() == pid  # reconfigured, not restarted
    wait_for("the cluster Ready again", platform.ready)
    subprocess.run(platform.box.exec("ops-controller-0", ["scancel", str(job)]), check=True, timeout=30)
    wait_for("the job cancelled", lambda: platform.job(job)["JobState"] == "CANCELLED", timeout=90)


def can_i_list(platform: Platform, account: str, namespace: str) -> set[tuple[str, str, str]]:
    """`kubectl auth can-i --list --as=<ServiceAccount>` as (verb, group, resource) triples;
    the self-reviews every authenticated user may make are left out."""
    out = platform.kubectl("auth", "can-i", "--list", "-n", namespace,
                           f"--as=system:serviceaccount:{install.RELEASE_NAMESPACE}:{account}").stdout
    found = set()
    for line in out.splitlines()[1:]:
        match = re.match(r"^(\S+)\s+\[\]\s+\[\]\s+\[(.*)\]$", line)
        if not match:
            continue  # non-resource URLs (discovery)
        resource, _, sub = match.group(1).partition("/")
        plural, _, group = resource.partition(".")
        if group in ("authentication.k8s.io", "authorization.k8s.io"):
            continue
        found |= {(verb, group, plural + (f"/{sub}" if sub else "")) for verb in match.group(2).split()}
    return found


@default_release_only
def test_the_operator_and_the_bridge_run_as_the_charts_pods_with_exactly_its_rbac(platform):
    """What a platform engineer checks after `helm install`: the components'
    pods run under their ServiceAccounts, `kubectl auth can-i --list` shows
    what the chart grants (what slurmk8s/operator/permissions.py and
    slurmk8s/bridge/permissions.py declare), and `kubectl logs`/`exec` reach the pods."""
    components = platform.box.status()["components"]
    assert {k: (v["ready"], v["serviceAccount"]) for k, v in components.items()} == {
        "operator": (True, "slurmk8s"), "bridge": (True, "slurmk8s-bridge")}
    for account, declared in (("slurmk8s", permissions.OPERATOR), ("slurmk8s-bridge", bridge_permissions.BRIDGE)):
        granted = grants(declared, ["default"])
        want = granted.get("default", set()) | granted.get(None, set())
        assert can_i_list(platform, account, "default") == want, account
    assert ("get", "", "secrets") not in can_i_list(platform, "slurmk8s-bridge", "kube-system")
    logs = platform.kubectl("-n", install.RELEASE_NAMESPACE, "logs", "deployment/slurmk8s", "--tail", "50").stdout
    assert logs.strip()
    ping = platform.kubectl("exec", platform.controller, "-c", "slurmctld", "--", "scontrol", "ping").stdout
    assert "UP" in ping


#: Tries each HOST:PORT argument with bash's /dev/tcp; a dropped connection times out.
PROBE = ('for t in "$@"; do if timeout 3 bash -c "exec 3<>/dev/tcp/${t%:*}/${t##*:}" 2>/dev/null; '
         'then echo "$t open"; else echo "$t closed"; fi; done')


@default_release_only  # the chart's policies and the sandbox's network: no Slurm release changes them
def test_the_charts_network_policies_admit_a_clusters_pod_to_the_webhook_alone(platform):
    """The chart's NetworkPolicies (decision record 47) in the sandbox's pod network: a pod
    of the SlurmCluster's namespace reaches the operator's webhook port and none of the
    operator's or the bridge's metrics and health ports, while the kubelet's probes (from
    the node) keep both Ready and the operator still reaches the cluster's agent."""
    pods = json.loads(platform.kubectl("-n", install.RELEASE_NAMESPACE, "get", "pods", "-o", "json").stdout)["items"]
    want = {}
    for pod in pods:
        component = pod["metadata"]["labels"].get("app.kubernetes.io/component")
        if component not in ("operator", "bridge") or not pod["status"].get("podIP"):
            continue
        for port in pod["spec"]["containers"][0]["ports"]:
            target = f"{pod['status']['podIP']}:{port['containerPort']}"
            want[target] = "open" if port["name"] == "webhook" else "closed"
    assert "open" in want.values() and "closed" in want.values()
    proc = subprocess.run(platform.box.exec(platform.controller, ["bash", "-c", PROBE, "probe", *want]),
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert dict(line.split() for line in proc.stdout.splitlines()) == want
    components = platform.box.status()["components"]
    assert all(v["ready"] for v in components.values()), components
    wait_for("the cluster Ready (the operator reaches its agent)", platform.ready)


@default_release_only
def test_the_examples_shared_storage_on_the_default_class_alone_is_named_pending_in_ready(platform):
    """Issue 43: on a managed cluster the default StorageClass is block storage, which
    refuses ReadWriteMany. A cluster with the example's shared storage on the stand-in's
    default class (as at a site whose only class it is): the claim stays Pending, the
    provisioner's refusal is in StorageReady and first in Ready, and the controller pod
    that mounts it is never placed."""
    example = yaml.safe_load(EXAMPLE.read_text())
    shared = example["spec"]["sharedStorage"]
    shared["volumes"][0]["storageClassName"] = DEFAULT_CLASS
    doc = {"apiVersion": "slurmk8s.dev/v1alpha1", "kind": "SlurmCluster",
           "metadata": {"name": "blocked", "namespace": platform.cluster()["metadata"]["namespace"]},
           "spec": {"nodeSets": [{"name": "cpu", "replicas": 1, "cpus": 1, "memory": "1Gi"}],
                    "partitions": [{"name": "cpu", "nodeSets": ["cpu"], "default": True}],
                    "login": {"replicas": 0}, "sharedStorage": shared, "deletionPolicy": "Delete"}}
    platform.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))
    claim = f"blocked-{shared['volumes'][0]['name']}"

    def conditions() -> dict:
        got = json.loads(platform.kubectl("get", "slurmcluster", "blocked", "-o", "json").stdout)
        return {c["type"]: c for c in (got.get("status") or {}).get("conditions") or []}

    try:
        storage = wait_for("StorageReady to name the provisioner's refusal", lambda: (
            (c := conditions().get("StorageReady")) and c["status"] == "False" and "MULTI_NODE_MULTI_WRITER" in c["message"]
            and c), timeout=180, show=conditions)
        assert storage["reason"] == "ProvisioningFailed"
        assert f'claim {claim} is Pending: ProvisioningFailed: failed to provision volume with StorageClass ' \
               f'"{DEFAULT_CLASS}"' in storage["message"]
        ready = conditions()["Ready"]
        assert (ready["status"], ready["reason"]) == ("False", "StorageNotReady")
        assert ready["message"].startswith(f"StorageReady: {storage['message']}")
        pvc = json.loads(platform.kubectl("get", "pvc", claim, "-o", "json").stdout)
        assert pvc["status"]["phase"] == "Pending" and pvc["spec"]["accessModes"] == ["ReadWriteMany"]
        pod = json.loads(platform.kubectl("get", "pod", "blocked-controller-0", "-o", "json").stdout)
        assert not pod["spec"].get("nodeName")
    finally:
        platform.kubectl("delete", "slurmcluster", "blocked", "--wait=false", check=False)


@default_release_only  # the chart's webhook and its certificate: no Slurm release changes them
def test_the_operator_keeps_the_webhooks_certificate_and_the_api_server_trusts_it(platform):
    """Decision record 53: the chart rendered the webhook's Secret empty and no caBundle;
    the operator filled both, so the API server reaches the webhook and verifies it: a
    spec it refuses is refused by it (not with an x509 error), and a label change, which
    its matchConditions keep from it, goes through."""
    ns = install.RELEASE_NAMESPACE
    secret = json.loads(platform.kubectl("-n", ns, "get", "secret", f"{install.RELEASE}-webhook-certs",
                                         "-o", "json").stdout)
    assert set(secret["data"]) == {"ca.crt", "ca.key", "tls.crt", "tls.key"}
    config = json.loads(platform.kubectl("get", "validatingwebhookconfiguration", f"{install.RELEASE}-{ns}",
                                         "-o", "json").stdout)
    assert {h["clientConfig"]["caBundle"] for h in config["webhooks"]} == {secret["data"]["ca.crt"]}
    assert base64.b64decode(secret["data"]["ca.crt"]).startswith(b"-----BEGIN CERTIFICATE-----")
    proc = platform.kubectl("patch", "slurmcluster", "ops", "--type", "merge", "-p",
                            json.dumps({"spec": {"slurmConfig": {"srunPortRange": "70000-70100"}}}), check=False)
    assert proc.returncode != 0
    assert 'admission webhook "slurmclusters.validate.slurmk8s.dev" denied the request' in proc.stderr, proc.stderr
    platform.kubectl("label", "slurmcluster", "ops", "example.com/checked=yes", "--overwrite")
