"""kopf's diff base as a digest (slurmk8s/operator/diffbase.py): what kopf is
told for an unchanged, a changed and an older operator's object."""

from __future__ import annotations

import json

import kopf

from slurmk8s.operator.diffbase import DigestDiffBaseStorage, digest

DIGEST = "slurmk8s.dev/last-handled-digest"
LEGACY = "slurmk8s.dev/last-handled-configuration"


def body(spec: dict, **annotations: str) -> kopf.Body:
    return kopf.Body({"apiVersion": "slurmk8s.dev/v1alpha1", "kind": "SlurmCluster",
                      "metadata": {"name": "demo", "namespace": "hpc", "annotations": annotations}, "spec": spec})


def stored(storage: DigestDiffBaseStorage, b: kopf.Body) -> dict:
    patch = kopf.Patch()
    storage.store(body=b, patch=patch, essence=storage.build(body=b))
    return dict(patch["metadata"]["annotations"])


def test_an_unchanged_object_is_its_own_base_and_a_changed_one_differs_in_its_spec():
    s = DigestDiffBaseStorage()
    old = body({"login": {"users": [{"name": "alice"}]}})
    written = stored(s, old)
    assert written[DIGEST] == digest(s.build(body=old)) and len(written[DIGEST]) == 64
    same = body(old["spec"], **written)
    assert s.fetch(body=same) == s.build(body=same)          # kopf sees no change
    changed = body({"login": {"users": [{"name": "bob"}]}}, **written)
    base = s.fetch(body=changed)
    assert base is not None and base["spec"] != changed["spec"]  # kopf sees a spec update


def test_a_never_handled_object_has_no_base_and_an_older_operators_copy_is_read_then_removed():
    s = DigestDiffBaseStorage()
    assert s.fetch(body=body({"x": 1})) is None              # kopf sees a creation
    copy = {"spec": {"x": 1}}
    legacy = body({"x": 1}, **{LEGACY: json.dumps(copy)})
    assert s.fetch(body=legacy) == copy
    written = stored(s, legacy)
    assert written[LEGACY] is None and DIGEST in written
    assert LEGACY not in json.dumps(s.build(body=legacy))    # nor part of what is hashed


def test_the_digest_stays_small_whatever_the_spec():
    s = DigestDiffBaseStorage()
    users = [{"name": f"u{i}", "sshPublicKeys": ["ssh-ed25519 " + "A" * 300]} for i in range(1000)]
    written = stored(s, body({"login": {"users": users}}))
    assert sum(len(k) + len(v or "") for k, v in written.items()) < 200
