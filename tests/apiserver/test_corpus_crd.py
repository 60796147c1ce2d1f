"""The hostile-input corpus (tests/test_corpus.py) through the CRD schema.

Each case is created, as a dry run, in a real API server (the stand-in, which
validates custom resources against the CRDs the chart installs). What the
validator accepts the API server must accept: otherwise a manifest that
`slurmk8s validate` passes fails at `kubectl apply`. The other way round is
allowed only for the rules that span fields, which a CRD schema cannot state
(the API server accepts, the operator reports the field error in the status).
"""

from __future__ import annotations

import json

import pytest
import urllib3
import yaml
from kubernetes.client.exceptions import ApiException

from slurmk8s.api import InvalidSpec, load_cluster, load_policy

from ..test_corpus import Case, corpus
from .conftest import CRDS, Cluster

GROUP, VERSION = "slurmk8s.dev", "v1alpha1"
PLURAL = {"SlurmCluster": "slurmclusters", "NodeLendingPolicy": "nodelendingpolicies"}

#: Filled by the test; printed in the session's summary (tests/conftest.py).
COUNTS: dict[str, int] = {}
SERVER_ERRORS: list[str] = []


@pytest.fixture(scope="module")
def crds(cluster: Cluster) -> None:
    for f in sorted(CRDS.glob("*.yaml")):
        for doc in yaml.safe_load_all(f.read_text()):
            if doc:
                cluster.ext.create_custom_resource_definition(doc)
    cluster.core.create_namespace({"metadata": {"name": "hpc"}})


def _validator_accepts(kind: str, doc) -> bool:
    try:
        (load_policy if kind == "NodeLendingPolicy" else load_cluster)(doc)
    except InvalidSpec:
        return False
    return True


def _api_accepts(cluster: Cluster, kind: str, doc) -> bool:
    """Create ``doc`` as a dry run; True when the API server takes it. A 5xx fails the test."""
    meta = doc.get("metadata") if isinstance(doc, dict) else None
    ns = meta.get("namespace") if isinstance(meta, dict) else None
    ns = ns if ns in ("hpc", "default") else "hpc"
    try:
        # call_api, not create_namespaced_custom_object: that refuses a body that
        # is not a mapping before sending it, and the server must see those too.
        api = cluster.api_client
        request = api.param_serialize(
            "POST", f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/{PLURAL[kind]}", body=doc,
            query_params=[("dryRun", "All")], header_params={"Content-Type": "application/json"},
            auth_settings=["BearerToken"])
        response = api.call_api(*request)
        response.read()
        if response.status >= 300:
            raise ApiException(http_resp=response)
    except urllib3.exceptions.ProtocolError as exc:
        SERVER_ERRORS.append(f"connection closed: {exc} for {str(doc)[:200]}")
        return False
    except ApiException as exc:
        if exc.status >= 500:
            SERVER_ERRORS.append(f"{exc.status}: {str(exc.body)[:300]} for {str(doc)[:200]}")
        return False
    return True


def _both(cluster: Cluster, case: Case) -> tuple[bool, bool]:
    if case.kind == "Pair":
        return (all(_validator_accepts("SlurmCluster", d) for d in case.docs),
                all(_api_accepts(cluster, "SlurmCluster", d) for d in case.docs))
    return _validator_accepts(case.kind, case.doc), _api_accepts(cluster, case.kind, case.doc)


def test_what_the_validator_accepts_the_crd_accepts(cluster: Cluster, crds) -> None:
    SERVER_ERRORS.clear()
    counts = {"cases": 0, "not sendable": 0, "both refuse": 0, "both accept": 0,
              "only the CRD accepts (cross-field rules)": 0, "only the validator accepts": 0}
    disagree = []
    for case in corpus():
        if not case.sendable:
            try:
                json.dumps(case.doc)
            except RecursionError:
                counts["not sendable"] += 1
                continue
        counts["cases"] += 1
        ours, theirs = _both(cluster, case)
        if ours and theirs:
            counts["both accept"] += 1
        elif not ours and not theirs:
            counts["both refuse"] += 1
        elif theirs:
            counts["only the CRD accepts (cross-field rules)"] += 1
        else:
            counts["only the validator accepts"] += 1
            disagree.append(case.id)
    # The stand-in answered some hostile bodies with a 500 or closed the
    # connection: counted as refusals (nothing was created), and shown here.
    counts["stand-in failures (counted as refused)"] = len(SERVER_ERRORS)
    COUNTS.clear()
    COUNTS.update(counts)
    assert not disagree, f"{counts}\nthe CRD refuses what the validator accepts:\n" + "\n".join(disagree[:30])
    assert counts["both accept"] and counts["both refuse"], counts
