"""The hostile-input corpus (tests/test_corpus.py) through the CRD schema,
then through the chart's validating webhook as well.

Each case is created, as a dry run, in a real API server (the stand-in, which
validates custom resources against the CRDs the chart installs). What the
validator accepts the API server must accept: otherwise a manifest that
`slurmk8s validate` passes fails at `kubectl apply`. With the CRDs alone, the
other way round is allowed only for the rules that span fields, which a CRD
schema cannot state, and of those only the ones the CRDs' CEL rules
(``x-kubernetes-validations``, slurmk8s/api/celrules.py) cannot state: every case
the validator refuses for a rule a CEL rule mirrors, the API server refuses with
the webhook absent. With the operator's webhook registered as the chart
registers it (its Service and ValidatingWebhookConfiguration, the certificate
kept by the webhook's server),
the API server and the validator agree on every case.
"""

from __future__ import annotations

import json

import pytest
import urllib3
import yaml
from kubernetes.client.exceptions import ApiException

from slurmk8s.api import InvalidSpec, load_cluster, load_policy
from slurmk8s.api.celrules import RULES, mirrored

from ..test_corpus import Case, corpus
from .conftest import CRDS, Cluster

GROUP, VERSION = "slurmk8s.dev", "v1alpha1"
PLURAL = {"SlurmCluster": "slurmclusters", "NodeLendingPolicy": "nodelendingpolicies"}

#: Filled by the tests; printed in the session's summary (tests/conftest.py).
COUNTS: dict[str, int] = {}
SERVER_ERRORS: list[str] = []
#: The message of the API server's last refusal (_api_accepts).
REFUSAL: list[str] = [""]


@pytest.fixture(scope="module")
def crds(cluster: Cluster) -> None:
    cluster.install_crds()
    cluster.core.create_namespace({"metadata": {"name": "hpc"}})


def _validator_accepts(kind: str, doc) -> bool:
    return not _validator_errors(kind, doc)


def _validator_errors(kind: str, doc) -> list[str]:
    """The validator's ``<path>: <message>`` errors of ``doc``; none when it accepts it."""
    try:
        (load_policy if kind == "NodeLendingPolicy" else load_cluster)(doc)
    except InvalidSpec as exc:
        return [f"{e.path}: {e.message}" for e in exc.errors] or ["(refused)"]
    return []


def _cel_states(case: Case) -> bool:
    """Whether a CEL rule of the CRDs mirrors one of the validator's reasons to refuse the case."""
    if case.kind == "Pair":
        return any(mirrored("SlurmCluster", e) for d in case.docs for e in _validator_errors("SlurmCluster", d))
    return any(mirrored(case.kind, e) for e in _validator_errors(case.kind, case.doc))


def _api_accepts(cluster: Cluster, kind: str, doc, strict: bool = False) -> bool:
    """Create ``doc`` as a dry run; True when the API server takes it. A 5xx fails the test.
    ``strict``: unknown fields are refused, as `kubectl apply` asks (fieldValidation=Strict)."""
    meta = doc.get("metadata") if isinstance(doc, dict) else None
    ns = meta.get("namespace") if isinstance(meta, dict) else None
    ns = ns if ns in ("hpc", "default") else "hpc"
    REFUSAL[0] = ""
    try:
        # call_api, not create_namespaced_custom_object: that refuses a body that
        # is not a mapping before sending it, and the server must see those too.
        api = cluster.api_client
        request = api.param_serialize(
            "POST", f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/{PLURAL[kind]}", body=doc,
            query_params=[("dryRun", "All")] + ([("fieldValidation", "Strict")] if strict else []),
            header_params={"Content-Type": "application/json"},
            auth_settings=["BearerToken"])
        response = api.call_api(*request)
        response.read()
        if response.status >= 300:
            raise ApiException(http_resp=response)
    except urllib3.exceptions.ProtocolError as exc:
        SERVER_ERRORS.append(f"connection closed: {exc} for {str(doc)[:200]}")
        return False
    except ApiException as exc:
        try:
            REFUSAL[0] = str(json.loads(exc.body).get("message", ""))
        except (TypeError, ValueError, AttributeError):
            REFUSAL[0] = str(exc.body)
        if exc.status >= 500:
            SERVER_ERRORS.append(f"{exc.status}: {str(exc.body)[:300]} for {str(doc)[:200]}")
        return False
    return True


def _both(cluster: Cluster, case: Case, strict: bool = False) -> tuple[bool, bool]:
    if case.kind == "Pair":
        return (all(_validator_accepts("SlurmCluster", d) for d in case.docs),
                all(_api_accepts(cluster, "SlurmCluster", d, strict) for d in case.docs))
    return _validator_accepts(case.kind, case.doc), _api_accepts(cluster, case.kind, case.doc, strict)


def test_what_the_validator_accepts_the_crd_accepts(cluster: Cluster, crds) -> None:
    SERVER_ERRORS.clear()
    counts = {"cases": 0, "not sendable": 0, "both refuse": 0, "both accept": 0,
              "only the CRD accepts (cross-field rules)": 0, "only the validator accepts": 0,
              "refused by CEL": 0, "cross-field, refused by the webhook only": 0}
    disagree, missed = [], []
    for case in corpus():
        if not case.sendable:
            try:
                json.dumps(case.doc)
            except RecursionError:
                counts["not sendable"] += 1
                continue
        counts["cases"] += 1
        ours, theirs = _both(cluster, case)
        cel = not ours and _cel_states(case)
        if ours and theirs:
            counts["both accept"] += 1
        elif not ours and not theirs:
            counts["both refuse"] += 1
            counts["refused by CEL"] += any(f'Invalid value: "{t}": {r.message}' in REFUSAL[0]
                                            for r in RULES for t in ("object", "array"))
        elif theirs:
            counts["only the CRD accepts (cross-field rules)"] += 1
            counts["cross-field, refused by the webhook only"] += 1
            if cel:
                missed.append(case.id)
        else:
            counts["only the validator accepts"] += 1
            disagree.append(case.id)
    # The stand-in answered some hostile bodies with a 500 or closed the
    # connection: counted as refusals (nothing was created), and shown here.
    counts["stand-in failures (counted as refused)"] = len(SERVER_ERRORS)
    COUNTS.update({f"CRD: {k}": v for k, v in counts.items()})
    assert not disagree, f"{counts}\nthe CRD refuses what the validator accepts:\n" + "\n".join(disagree[:30])
    assert not missed, f"{counts}\nCEL rules mirror these, yet the CRD accepts them:\n" + "\n".join(missed[:30])
    assert counts["both accept"] and counts["both refuse"] and counts["refused by CEL"], counts


@pytest.fixture(scope="module")
def webhook(cluster: Cluster, crds, tmp_path_factory):
    """The operator's webhook server, with the certificate it keeps itself, behind the chart's
    Service and ValidatingWebhookConfiguration (watching the corpus's namespaces)."""
    from ..test_chart import NAMESPACE, objects
    from .chartwebhook import ChartWebhook

    # As a site installs it, with the class of shared claims that name none: the validator
    # (load_cluster) knows no site, and this is the one rule it leaves to the operator.
    served = ChartWebhook(cluster, objects({"watchNamespaces": ["hpc", "default"]}), NAMESPACE,
                          tmp_path_factory.mktemp("webhook"), shared_storage_class="nfs")
    yield
    served.stop()


def test_with_the_webhook_the_api_refuses_exactly_what_the_validator_refuses(cluster: Cluster, webhook) -> None:
    SERVER_ERRORS.clear()
    counts = {"cases": 0, "refused by the API": 0, "accepted by both": 0,
              "accepted by the API, refused by the validator": 0, "refused by the API, accepted by the validator": 0}
    disagree = []
    for case in corpus():
        try:
            json.dumps(case.doc)
        except RecursionError:
            continue
        counts["cases"] += 1
        ours, theirs = _both(cluster, case, strict=True)
        if not theirs:
            counts["refused by the API"] += 1
        if ours and theirs:
            counts["accepted by both"] += 1
        elif theirs:
            counts["accepted by the API, refused by the validator"] += 1
            disagree.append(f"accepted: {case.id}")
        elif ours:
            counts["refused by the API, accepted by the validator"] += 1
            disagree.append(f"refused: {case.id}")
    counts["stand-in failures (counted as refused)"] = len(SERVER_ERRORS)
    counts["refused by neither (CEL, webhook)"] = counts["accepted by the API, refused by the validator"]
    COUNTS.update({f"webhook: {k}": v for k, v in counts.items()})
    assert not disagree, f"{counts}\n" + "\n".join(disagree[:30])
    assert counts["accepted by both"] and counts["refused by the API"], counts


def test_kubectl_apply_of_an_invalid_spec_is_refused_at_once_with_its_field_paths(cluster: Cluster, webhook) -> None:
    doc = yaml.safe_load((CRDS.parents[3] / "examples" / "slurmcluster.yaml").read_text())
    doc["metadata"]["namespace"] = "hpc"
    doc["spec"]["slurmConfig"] = {"srunPortRange": "70000-70100"}
    proc = cluster.kubectl("apply", "-f", "-", stdin=json.dumps(doc), check=False)
    assert proc.returncode != 0
    assert 'admission webhook "slurmclusters.validate.slurmk8s.dev" denied the request' in proc.stderr
    assert "spec.slurmConfig.srunPortRange" in proc.stderr
    # A rule the CRD states in CEL is refused by the API server itself, before any webhook.
    doc["spec"]["partitions"][0]["nodeSets"] = ["nosuchset"]
    proc = cluster.kubectl("apply", "-f", "-", stdin=json.dumps(doc), check=False)
    assert proc.returncode != 0
    assert ('spec.partitions: Invalid value: "object": a partition names a node set that is not in '
            "spec.nodeSets") in proc.stderr, proc.stderr
    assert cluster.custom.list_namespaced_custom_object(GROUP, VERSION, "hpc", "slurmclusters")["items"] == []
