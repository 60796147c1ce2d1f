"""The operator's validating webhook (slurmk8s/operator/webhook.py): what it
refuses, and what it must let through (metadata-only updates, deletes), as
AdmissionReviews; its HTTPS server against real connections. The corpus
through the API server and this webhook is tests/apiserver/test_corpus_crd.py."""

from __future__ import annotations

import copy
import json
import ssl
import urllib.request

import pytest

from sandbox.apiserver import tls
from slurmk8s import versions
from slurmk8s.operator.webhook import PATH, WebhookServer, refusal, review

#: The site's StorageClass for shared volumes that name none (the chart's sharedStorage.storageClassName).
SITE_CLASS = "nfs"


def request(kind: str, operation: str, obj, old=None) -> dict:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-1", "kind": {"group": "slurmk8s.dev", "version": "v1alpha1", "kind": kind},
        "operation": operation, "object": obj, "oldObject": old, "namespace": "hpc", "name": "demo"}}


def test_an_invalid_spec_is_refused_with_its_field_paths_as_the_validator_words_them(example_doc):
    bad = copy.deepcopy(example_doc)
    bad["spec"]["nodeSets"][0]["replicas"] = -1
    answer = review(request("SlurmCluster", "CREATE", bad), shared_storage_class=SITE_CLASS)
    assert answer["response"]["uid"] == "u-1" and answer["response"]["allowed"] is False
    assert answer["response"]["status"]["code"] == 422
    assert "spec.nodeSets[0].replicas" in answer["response"]["status"]["message"]
    assert review(request("SlurmCluster", "CREATE", example_doc), shared_storage_class=SITE_CLASS)["response"] == \
        {"uid": "u-1", "allowed": True}


def test_a_shared_volume_that_names_no_class_is_refused_unless_the_operator_has_a_default(example_doc):
    """Issue 43: the example's shared volume names no StorageClass; a cluster's default is
    usually block storage, which leaves the ReadWriteMany claim Pending. Without the
    operator's --shared-storage-class the webhook refuses it, naming the field; with it, or
    with a class or an existing claim in the spec, it passes. A cluster stored before can
    still be finalized (an update that leaves the spec alone)."""
    why = refusal("SlurmCluster", "CREATE", example_doc, None)
    assert why is not None and "spec.sharedStorage.volumes[0].storageClassName: required" in why
    assert refusal("SlurmCluster", "CREATE", example_doc, None, shared_storage_class=SITE_CLASS) is None
    named = copy.deepcopy(example_doc)
    named["spec"]["sharedStorage"]["volumes"][0]["storageClassName"] = "efs-sc"
    assert refusal("SlurmCluster", "CREATE", named, None) is None
    existing = copy.deepcopy(example_doc)
    existing["spec"]["sharedStorage"]["volumes"][0] = {"name": "shared", "mountPath": "/shared",
                                                      "existingClaim": "team-shared"}
    assert refusal("SlurmCluster", "CREATE", existing, None) is None
    finalized = copy.deepcopy(example_doc)
    finalized["metadata"]["finalizers"] = ["slurmk8s.dev/teardown"]
    assert refusal("SlurmCluster", "UPDATE", finalized, example_doc) is None


def test_an_update_that_leaves_the_spec_alone_passes_even_when_the_spec_is_invalid(example_doc):
    """kopf's finalizer and annotations, labels: a cluster that became invalid (a newer
    validator) can still be finalized and deleted."""
    bad = copy.deepcopy(example_doc)
    bad["spec"]["nodeSets"][0]["replicas"] = -1
    relabelled = copy.deepcopy(bad)
    relabelled["metadata"]["finalizers"] = ["slurmk8s.dev/teardown"]
    assert refusal("SlurmCluster", "UPDATE", relabelled, bad) is None
    assert refusal("SlurmCluster", "DELETE", None, bad) is None
    assert refusal("SlurmCluster", "UPDATE", bad, example_doc) is not None


def test_a_slurm_step_backwards_from_the_running_release_is_refused_on_update(example_doc):
    newest, older = versions.SUPPORTED[-1], versions.SUPPORTED[0]
    running = copy.deepcopy(example_doc)
    running["spec"]["slurm"]["version"] = newest
    running["status"] = {"slurmVersion": newest}
    back = copy.deepcopy(running)
    back["spec"]["slurm"]["version"] = older
    why = refusal("SlurmCluster", "UPDATE", back, running, shared_storage_class=SITE_CLASS)
    assert why == f"spec.slurm.version: {versions.upgrade_problem(newest, older)}"
    assert refusal("SlurmCluster", "CREATE", back, None, shared_storage_class=SITE_CLASS) is None
    # Judged against what runs, not the old spec: a rollout the operator holds can be taken back.
    held = copy.deepcopy(running)
    held["spec"]["slurm"]["version"] = older
    held["status"] = {"slurmVersion": newest}
    assert refusal("SlurmCluster", "UPDATE", running, held, shared_storage_class=SITE_CLASS) is None
    # Before the operator reported a release, no step is judged (the operator still refuses it).
    del running["status"]
    assert refusal("SlurmCluster", "UPDATE", back, running, shared_storage_class=SITE_CLASS) is None


def test_a_policy_is_checked_by_the_policy_validator():
    policy = {"apiVersion": "slurmk8s.dev/v1alpha1", "kind": "NodeLendingPolicy",
              "metadata": {"name": "p", "namespace": "hpc"},
              "spec": {"cluster": "demo", "partition": "gpu", "reclaim": {"deadlineSeconds": 5}}}
    why = refusal("NodeLendingPolicy", "CREATE", policy, None)
    assert why is not None and "spec.reclaim.deadlineSeconds" in why


def test_what_is_not_a_review_of_our_kinds_is_a_bad_request():
    for body in ({"kind": "AdmissionReview"}, [], request("Pod", "CREATE", {})):
        with pytest.raises(ValueError):
            review(body)


def test_the_server_answers_reviews_over_https_and_nothing_else(tmp_path, example_doc):
    pki = tls.ensure(tmp_path / "pki", ["localhost"], "webhook")
    certs = tmp_path / "certs"
    certs.mkdir()
    (certs / "tls.crt").write_bytes(pki.server_cert.read_bytes())
    (certs / "tls.key").write_bytes(pki.server_key.read_bytes())
    server = WebhookServer(0, certs, addr="127.0.0.1", shared_storage_class=SITE_CLASS).start()
    ctx = ssl.create_default_context(cafile=str(pki.ca_cert))
    try:
        def post(path: str, body: bytes) -> tuple[int, dict]:
            req = urllib.request.Request(f"https://localhost:{server.port}{path}", data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
                    return resp.status, json.loads(resp.read())
            except urllib.error.HTTPError as exc:
                return exc.code, json.loads(exc.read())

        status, answer = post(PATH + "?timeout=10s", json.dumps(request("SlurmCluster", "CREATE", example_doc)).encode())
        assert status == 200 and answer["response"]["allowed"] is True
        assert post("/other", b"{}")[0] == 404
        assert post(PATH, b"not json")[0] == 400
        # The Secret renewed: the next connection gets the new certificate, from the new CA.
        renewed = tls.ensure(tmp_path / "pki2", ["localhost"], "webhook", ca_name="renewed-ca")
        (certs / "tls.key").write_bytes(renewed.server_key.read_bytes())
        (certs / "tls.crt").write_bytes(renewed.server_cert.read_bytes())
        ctx = ssl.create_default_context(cafile=str(renewed.ca_cert))
        assert post(PATH, json.dumps(request("SlurmCluster", "CREATE", example_doc)).encode())[0] == 200
    finally:
        server.stop()
    with pytest.raises(RuntimeError, match="tls.crt and tls.key"):
        WebhookServer(0, tmp_path / "missing")


def _tls_get(port: int, cafile: str, path: str = "/healthz") -> tuple[int, dict]:
    ctx = ssl.create_default_context(cafile=cafile)
    with urllib.request.urlopen(f"https://localhost:{port}{path}", context=ctx, timeout=10) as resp:
        return resp.status, json.loads(resp.read())


def test_a_server_without_a_directory_serves_the_certificate_it_is_given(tmp_path):
    """As the certificate keeper hands it over (decision record 53): nothing until then,
    then that one, then a renewed one from the next connection on."""
    server = WebhookServer(0, addr="127.0.0.1").start()
    try:
        first = tls.ensure(tmp_path / "pki", ["localhost"], "webhook")
        with pytest.raises(OSError):  # closed unanswered: no certificate yet
            _tls_get(server.port, str(first.ca_cert))
        server.use(first.server_cert.read_bytes(), first.server_key.read_bytes())
        assert _tls_get(server.port, str(first.ca_cert)) == (200, {"ok": True})
        renewed = tls.ensure(tmp_path / "pki2", ["localhost"], "webhook", ca_name="renewed-ca")
        server.use(renewed.server_cert.read_bytes(), renewed.server_key.read_bytes())
        assert _tls_get(server.port, str(renewed.ca_cert))[0] == 200
        assert list(tmp_path.glob("**/webhook-cert-*")) == []
    finally:
        server.stop()


def test_the_webhook_command_serves_alone_and_stops_on_sigterm(tmp_path, example_doc):
    """`slurmk8s webhook`, as the chart runs it with webhook.hostNetwork and cert-manager: the
    example's shared volume names no class, and takes the one the command is given."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time
    from pathlib import Path

    pki = tls.ensure(tmp_path / "pki", ["localhost"], "webhook")
    certs = tmp_path / "certs"
    certs.mkdir()
    (certs / "tls.crt").write_bytes(pki.server_cert.read_bytes())
    (certs / "tls.key").write_bytes(pki.server_key.read_bytes())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([str(Path(sys.executable).parent / "slurmk8s"), "webhook", "--port", str(port),
                             "--cert-dir", str(certs), "--shared-storage-class", "shared"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "POD_NAMESPACE": ""})
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                assert _tls_get(port, str(pki.ca_cert)) == (200, {"ok": True})
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stdout and proc.stdout.read()
                time.sleep(0.2)
        body = json.dumps(request("SlurmCluster", "CREATE", example_doc)).encode()
        req = urllib.request.Request(f"https://localhost:{port}{PATH}", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, context=ssl.create_default_context(cafile=str(pki.ca_cert)),
                                    timeout=10) as resp:
            assert json.loads(resp.read())["response"]["allowed"] is True
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("args,message", [
    (["operator", "-n", "hpc", "--no-leader-election", "--webhook-port", "9443", "--webhook-secret", "s"],
     "pass --webhook-secret, --webhook-configuration and --webhook-service together"),
    (["operator", "-n", "hpc", "--no-leader-election", "--webhook-port", "9443", "--webhook-secret", "s",
      "--webhook-configuration", "c", "--webhook-service", "v", "--webhook-cert-dir", "/d"],
     "not both"),
    (["webhook", "--port", "9443", "--secret", "s", "--configuration", "c", "--service", "v"],
     "--secret needs the namespace it is in: --namespace NS"),
])
def test_certificate_options_say_what_is_missing(args, message):
    from click.testing import CliRunner

    from slurmk8s import cli

    result = CliRunner().invoke(cli.main, args, env={"POD_NAMESPACE": ""})
    assert result.exit_code == 2 and message in result.output, result.output
