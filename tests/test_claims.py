"""StorageReady (slurmk8s.operator.claims): which claims a cluster's pods mount,
and why one that is not bound waits, in its provisioner's words; Ready names it
first. Pure: claims and Events as the API returns them (issue 43)."""

from __future__ import annotations

import copy

from slurmk8s.api import load_cluster
from slurmk8s.api.storageclass import with_storage_class
from slurmk8s.operator import claims, status
from slurmk8s.render import ClusterKeys, names, render

from .fakekube import claim_name

KEYS = ClusterKeys.generate()
NOW = "2026-11-21T00:00:00Z"
REFUSED = ('failed to provision volume with StorageClass "gp3": rpc error: code = InvalidArgument desc = '
           "Volume capabilities MULTI_NODE_MULTI_WRITER not supported. Only AccessModes[ReadWriteOnce] supported.")


def rendered(doc):
    c = with_storage_class(load_cluster(doc), "nfs")
    return c, render(c, KEYS)


def pvc(name: str, phase: str = "Bound", uid: str = "u-1") -> dict:
    return {"kind": "PersistentVolumeClaim", "metadata": {"name": name, "uid": uid}, "status": {"phase": phase}}


def event(claim: str, type_: str, reason: str, message: str, at: str, uid: str = "u-1") -> dict:
    return {"involvedObject": {"kind": "PersistentVolumeClaim", "name": claim, "uid": uid},
            "type": type_, "reason": reason, "message": message, "lastTimestamp": at}


def test_the_claims_of_the_rendered_workloads_shared_state_and_database(doc):
    c, objs = rendered(doc)
    wanted = claims.used(c, objs)
    stateful = {o["metadata"]["name"]: o for o in objs if o["kind"] == "StatefulSet"}
    expected = {names.shared_claim(c, "shared")}
    for sts in stateful.values():
        for t in sts["spec"].get("volumeClaimTemplates") or []:
            expected |= {claim_name(t, f"{sts['metadata']['name']}-{i}") for i in range(sts["spec"]["replicas"])}
    assert {w.name for w in wanted} == expected and len(wanted) == len(expected) >= 3
    assert all(w.field is None for w in wanted)
    mine = copy.deepcopy(doc)
    mine["spec"]["sharedStorage"]["volumes"][0] = {"name": "shared", "mountPath": "/shared", "existingClaim": "team"}
    c, objs = rendered(mine)
    assert claims.Claim("team", "spec.sharedStorage.volumes[0].existingClaim") in claims.used(c, objs)


def test_every_claim_bound_is_ready():
    wanted = [claims.Claim("a"), claims.Claim("b")]
    assert claims.condition(wanted, {"a": pvc("a"), "b": pvc("b")}) == ("True", "Bound", "2 claims bound")
    assert claims.condition([], {})[0] == "True"


def test_a_pending_claim_is_named_with_its_latest_warning_of_its_own():
    wanted = [claims.Claim("shared")]
    events = [
        event("shared", "Normal", "ExternalProvisioning", "Waiting for a volume", "2026-01-01T00:00:05Z"),
        event("shared", "Warning", "ProvisioningFailed", REFUSED, "2026-01-01T00:00:03Z"),
        event("shared", "Warning", "ProvisioningFailed", "an older claim's", "2026-01-01T00:00:09Z", uid="u-0"),
        event("other", "Warning", "ProvisioningFailed", "another claim's", "2026-01-01T00:00:09Z"),
    ]
    assert claims.condition(wanted, {"shared": pvc("shared", "Pending")}, events) == \
        ("False", "ProvisioningFailed", f"claim shared is Pending: ProvisioningFailed: {REFUSED}")
    waiting = [event("shared", "Normal", "WaitForFirstConsumer", "waiting for first consumer to be created before "
                     "binding", "2026-01-01T00:00:01Z")]
    assert claims.condition(wanted, {"shared": pvc("shared", "Pending")}, waiting) == \
        ("False", "ClaimPending", "claim shared is Pending: WaitForFirstConsumer: waiting for first consumer to be "
                                  "created before binding")
    assert claims.condition(wanted, {"shared": pvc("shared", "Pending")}) == \
        ("False", "ClaimPending", "claim shared is Pending")
    odd = [event("shared", "Warning", "provisioning failed!", "x", "2026-01-01T00:00:01Z")]
    assert claims.condition(wanted, {"shared": pvc("shared", "Pending")}, odd)[1] == "ClaimPending"


def test_a_missing_claim_the_spec_names_says_its_field_and_a_lost_one_is_lost():
    named = claims.Claim("team", "spec.sharedStorage.volumes[0].existingClaim")
    st, reason, message = claims.condition([named, claims.Claim("state-0")], {"state-0": pvc("state-0", "Lost")})
    assert (st, reason) == ("False", "ClaimNotFound")
    assert message == ("claim team (spec.sharedStorage.volumes[0].existingClaim) does not exist: create it "
                       "(ReadWriteMany), or set size instead; claim state-0 is Lost")
    assert claims.condition([claims.Claim("state-0")], {})[1:] == ("ClaimNotCreated", "claim state-0 does not exist yet")


def test_ready_names_a_pending_claim_first(doc):
    c, objs = rendered(doc)
    storage = claims.condition([claims.Claim("demo-shared")], {"demo-shared": pvc("demo-shared", "Pending")},
                               [event("demo-shared", "Warning", "ProvisioningFailed", REFUSED, NOW)])
    st = status.compute(c, None, observed=objs, nodes=None, applied_hash=None, rendered_hash="h", now=NOW,
                        storage=storage)
    conds = {x.type: x for x in st.conditions}
    assert [x.type for x in st.conditions][:2] == ["Ready", claims.CONDITION]
    assert conds["Ready"].reason == "StorageNotReady"
    assert conds["Ready"].message.startswith(f"StorageReady: claim demo-shared is Pending: ProvisioningFailed: {REFUSED}")
    without = status.compute(c, None, observed=objs, nodes=None, applied_hash=None, rendered_hash="h", now=NOW)
    assert claims.CONDITION not in {x.type for x in without.conditions}
