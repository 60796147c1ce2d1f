"""The webhook's certificate kept by the process that serves it
(slurmk8s/operator/certkeeper.py; decision record 53), against the stand-in:
from the chart's empty Secret to a CA, a serving certificate and the
configuration's caBundle, with nothing but the rights the chart grants; the
API server then reaches the webhook and verifies it; renewals and two
replicas starting at once keep it so."""

from __future__ import annotations

import base64
import datetime as dt
import json
import ssl
import threading

import pytest
import yaml
from cryptography import x509

from slurmk8s.operator import certs

from ..test_chart import NAMESPACE, objects
from .chartwebhook import ChartWebhook
from .conftest import EXAMPLE, Cluster, wait_for

HPC = "hpc-certs"


@pytest.fixture(scope="module")
def crds(cluster: Cluster) -> None:
    cluster.install_crds()
    cluster.core.create_namespace({"metadata": {"name": HPC}})


@pytest.fixture(scope="module")
def served(cluster: Cluster, crds, tmp_path_factory):
    hook = ChartWebhook(cluster, objects({"watchNamespaces": [HPC]}), NAMESPACE, tmp_path_factory.mktemp("keeper"),
                        shared_storage_class="shared")
    yield hook
    hook.stop()


def served_certificate(port: int) -> x509.Certificate:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            ctx.wrap_socket(raw, server_hostname="x") as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def cluster_doc(name: str, **spec) -> dict:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"] = {"name": name, "namespace": HPC}
    doc["spec"].update(spec)
    return doc


def apply(cluster: Cluster, doc: dict, check: bool = True):
    return cluster.kubectl("apply", "-f", "-", stdin=json.dumps(doc), check=check)


def test_the_empty_secret_gets_a_ca_and_certificate_and_the_api_server_trusts_it(cluster, served):
    data = served.secret_data()
    assert set(data) == {"ca.crt", "ca.key", "tls.crt", "tls.key"}
    assert served.ca_bundle() == data["ca.crt"]
    leaf = served_certificate(served.hooks[0].port)
    assert leaf == x509.load_pem_x509_certificate(data["tls.crt"])
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert f"{served.service['metadata']['name']}.{NAMESPACE}.svc" in names.get_values_for_type(x509.DNSName)
    # The API server reaches the webhook, verifies it with caBundle, and it judges.
    bad = cluster_doc("bad", slurmConfig={"srunPortRange": "70000-70100"})
    proc = apply(cluster, bad, check=False)
    assert 'admission webhook "slurmclusters.validate.slurmk8s.dev" denied the request' in proc.stderr, proc.stderr
    assert "spec.slurmConfig.srunPortRange" in proc.stderr
    apply(cluster, cluster_doc("good"))


def test_the_keeper_may_touch_its_secret_and_configuration_and_nothing_else(cluster, served):
    sa = f"--as=system:serviceaccount:{NAMESPACE}:{served.kept.secret.rsplit('-webhook-certs', 1)[0]}"
    def can(*args: str) -> str:
        return cluster.kubectl("auth", "can-i", *args, sa, check=False).stdout.strip()

    assert can("update", f"secret/{served.kept.secret}", "-n", NAMESPACE) == "yes"
    assert can("update", "secret/other", "-n", NAMESPACE) == "no"
    assert can("update", f"validatingwebhookconfiguration/{served.kept.configuration}") == "yes"
    assert can("update", "validatingwebhookconfiguration/someone-elses") == "no"
    assert can("create", "secrets", "-n", NAMESPACE) == "no"


def plant(cluster: Cluster, served: ChartWebhook, data: dict[str, str]) -> None:
    """The Secret and caBundle as a keeper left them some time ago."""
    name = served.kept.secret
    cluster.core.patch_namespaced_secret(name, NAMESPACE, {"data": data})
    config = served.live_config()
    for hook in config["webhooks"]:
        hook["clientConfig"]["caBundle"] = data["ca.crt"]
    cluster.kubectl("replace", "-f", "-", stdin=json.dumps(config))


def test_a_renewal_and_a_new_ca_are_served_without_a_refusal(cluster, served):
    hook = served.hooks[0]
    keeper = hook.keeper
    assert keeper is not None
    now = dt.datetime.now(dt.UTC)
    # Made when less than a third of the serving certificate is left today.
    made = now - (certs.LEAF_LIFETIME - certs.LEAF_RENEW_BEFORE) - dt.timedelta(days=1)
    old = certs.renew(certs.Stored(), certs.Plan(new_ca=True, new_leaf=True), keeper.names, made, "old CA")
    plant(cluster, served, old)
    keeper.once()
    data = served.secret_data()
    after = x509.load_pem_x509_certificate(data["tls.crt"])
    assert data["ca.crt"] == base64.b64decode(old["ca.crt"]), "the same CA"
    assert after != certs.read(old).leaf and served_certificate(hook.port) == after
    apply(cluster, cluster_doc("after-renewal"))
    # A CA near its end (and a serving certificate of it from yesterday): a new CA, trusted
    # beside the old, the old certificate still served; at the next check, one from the new CA.
    ca_made = now - (certs.CA_LIFETIME - certs.CA_RENEW_BEFORE) - dt.timedelta(days=1)
    aged = certs.read(certs.renew(certs.Stored(), certs.Plan(new_ca=True), keeper.names, ca_made, "aged CA"))
    aged = certs.Stored(trusted=aged.trusted, ca_key=aged.ca_key)
    planted = certs.renew(aged, certs.Plan(new_leaf=True), keeper.names, now - dt.timedelta(days=1), "aged CA")
    plant(cluster, served, planted)
    keeper.once()
    trusted = x509.load_pem_x509_certificates(served.ca_bundle() or b"")
    assert len(trusted) == 2 and trusted[1] == aged.ca
    assert served_certificate(hook.port) == certs.read(planted).leaf
    apply(cluster, cluster_doc("after-new-ca"))
    keeper.once()
    served_certificate(hook.port).verify_directly_issued_by(trusted[0])
    apply(cluster, cluster_doc("from-the-new-ca"))


def test_replicas_starting_together_agree_on_one_ca(cluster, served):
    # The Secret emptied (an administrator renews it so), then two replicas' keepers at once.
    name = served.kept.secret
    cluster.core.replace_namespaced_secret(name, NAMESPACE, {"metadata": {"name": name}, "type": "Opaque"})
    second = served.serve("operator-2")
    keepers = [h.keeper for h in served.hooks]
    barrier = threading.Barrier(len(keepers))
    errors: list[BaseException] = []

    def run(k) -> None:
        try:
            barrier.wait()
            k.once()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in keepers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    data = served.secret_data()
    assert served.ca_bundle() == data["ca.crt"]
    ca = x509.load_pem_x509_certificates(data["ca.crt"])[0]
    for hook in (served.hooks[0], second):
        served_certificate(hook.port).verify_directly_issued_by(ca)
    wait_for("a write through either replica", lambda: apply(cluster, cluster_doc("two-replicas")) is not None)
