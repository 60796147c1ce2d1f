"""The eviction subresource's rules (sandbox/apiserver/eviction.py), as
kube-apiserver's EvictionREST applies them: which budget an eviction spends,
and each refusal with its code and message."""

from __future__ import annotations

import pytest

from sandbox.apiserver.errors import APIError
from sandbox.apiserver.eviction import MAX_DISRUPTED_PODS, TOO_MANY_REQUESTS, budget_to_spend


def pod(phase: str = "Running", ready: bool = True, labels: dict | None = None, deleting: bool = False) -> dict:
    meta: dict = {"name": "p", "namespace": "ns", "labels": {"app": "a"} if labels is None else labels}
    if deleting:
        meta["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    return {"metadata": meta, "status": {"phase": phase, "conditions": [
        {"type": "Ready", "status": "True" if ready else "False"}]}}


def budget(name: str = "b", selector: dict | None = None, generation: int = 1, observed: int | None = 1,
           policy: str | None = None, **status) -> dict:
    spec: dict = {"maxUnavailable": 0,
                  "selector": {"matchLabels": {"app": "a"}} if selector is None else selector}
    if policy:
        spec["unhealthyPodEvictionPolicy"] = policy
    st = {"disruptionsAllowed": 0, "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1, **status}
    if observed is not None:
        st["observedGeneration"] = observed
    return {"metadata": {"name": name, "namespace": "ns", "generation": generation}, "spec": spec, "status": st}


def refusal(p: dict, budgets: list[dict]) -> APIError:
    with pytest.raises(APIError) as e:
        budget_to_spend(p, budgets)
    return e.value


def test_a_budget_with_no_disruption_left_refuses_with_429_and_its_cause():
    err = refusal(pod(), [budget()])
    assert (err.code, err.reason, err.message) == (429, "TooManyRequests", TOO_MANY_REQUESTS)
    assert err.details == {"causes": [{"reason": "DisruptionBudget",
                                       "message": "The disruption budget b needs 1 healthy pods and has 1 currently"}]}


def test_a_disruption_left_is_spent():
    b = budget(disruptionsAllowed=1, currentHealthy=2)
    assert budget_to_spend(pod(), [b, budget("other", selector={"matchLabels": {"app": "x"}})]) is b


@pytest.mark.parametrize("p", [pod("Pending", ready=False), pod("Succeeded", ready=False), pod("Failed", ready=False),
                               pod(deleting=True)], ids=["pending", "succeeded", "failed", "deleting"])
def test_a_pod_that_runs_nothing_or_is_going_already_needs_no_budget(p):
    assert budget_to_spend(p, [budget()]) is None


@pytest.mark.parametrize("selector", [{}, {"matchLabels": {"app": "x"}},
                                      {"matchExpressions": [{"key": "app", "operator": "Bogus"}]}])
def test_a_budget_that_does_not_select_the_pod_is_not_in_the_way(selector):
    assert budget_to_spend(pod(), [budget(selector=selector)]) is None


def test_two_budgets_for_one_pod_are_an_internal_error():
    err = refusal(pod(), [budget("one", disruptionsAllowed=1), budget("two", disruptionsAllowed=1)])
    assert err.code == 500
    assert err.message == "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."


def test_a_budget_whose_spec_changed_since_the_controller_saw_it_refuses_until_it_has():
    for observed in (None, 1):
        err = refusal(pod(), [budget(generation=2, observed=observed, disruptionsAllowed=5)])
        assert err.code == 429
        assert err.details["causes"][0]["message"] == "The disruption budget b is still being processed by the server."


@pytest.mark.parametrize("status,message", [
    ({"disruptionsAllowed": -1}, "pdb disruptions allowed is negative"),
    ({"disruptionsAllowed": 1, "disruptedPods": {f"p{i}": "2025-01-01T00:00:00Z" for i in range(MAX_DISRUPTED_PODS + 1)}},
     "DisruptedPods map too big"),
])
def test_a_budget_in_a_state_the_controller_never_leaves_is_forbidden(status, message):
    err = refusal(pod(), [budget(**status)])
    assert err.code == 403 and message in err.message


def test_an_unready_pod_goes_when_the_budget_is_met_or_the_policy_always_allows():
    unready = pod(ready=False)
    assert budget_to_spend(unready, [budget(currentHealthy=2, desiredHealthy=2)]) is None  # met: nothing spent
    assert budget_to_spend(unready, [budget(policy="AlwaysAllow", currentHealthy=0)]) is None
    # Not met (its only pod is the unready one): it counts against the budget.
    assert refusal(unready, [budget(currentHealthy=0, desiredHealthy=1)]).code == 429
    # A budget that wants nobody healthy is not "met" by that rule: it spends what it allows.
    b = budget(currentHealthy=0, desiredHealthy=0, disruptionsAllowed=1)
    assert budget_to_spend(unready, [b]) is b
