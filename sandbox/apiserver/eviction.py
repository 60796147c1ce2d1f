"""Whether the eviction subresource may delete a pod, as kube-apiserver 1.33's
``EvictionREST`` decides it (pkg/registry/core/pod/storage/eviction.go). Pure.

:func:`budget_to_spend` takes the pod and the PodDisruptionBudgets of its
namespace and returns the one budget the eviction spends a disruption of, or
None when the pod may go without one; it raises the refusal a real API server
gives:

- a pod that is Pending, Succeeded or Failed, or already being deleted, goes
  without a budget (``canIgnorePDB``: it disrupts nothing that runs);
- a budget matches when its selector parses, is not empty and selects the
  pod's labels (an empty selector matches nothing here, as in the eviction
  code); more than one: 500, the eviction subresource does not support it;
- a pod that is not Ready goes without spending the budget under
  ``unhealthyPodEvictionPolicy: AlwaysAllow``, or under the default
  ``IfHealthyBudget`` while the budget is met (``currentHealthy >=
  desiredHealthy > 0``);
- otherwise the budget must be up to date with its spec
  (``status.observedGeneration`` not behind ``metadata.generation``: 429,
  ``still being processed``), its ``disruptionsAllowed`` not negative (403),
  its ``disruptedPods`` not over 2000 (403), and at least 1 (429 with the
  cause ``DisruptionBudget``: ``The disruption budget <name> needs <d>
  healthy pods and has <c> currently``).

The caller (``API.evict``) then writes the budget's status, one disruption
less and the pod named in ``disruptedPods``, and deletes the pod.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .errors import APIError
from .selectors import from_label_selector_object, labels_match
from .strategy import pod_ready

__all__ = ["budget_to_spend", "MAX_DISRUPTED_PODS", "TOO_MANY_REQUESTS"]

#: kube-apiserver's MaxDisruptedPodSize: more evictions unconfirmed by the
#: disruption controller than this are refused.
MAX_DISRUPTED_PODS = 2000
TOO_MANY_REQUESTS = "Cannot evict pod as it would violate the pod's disruption budget."


def _meta(obj: dict) -> dict:
    return obj.get("metadata") or {}


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _refused(message: str) -> APIError:
    """429 with the DisruptionBudget cause (kube-apiserver's NewTooManyRequests, no Retry-After)."""
    return APIError(429, TOO_MANY_REQUESTS, "TooManyRequests",
                    {"causes": [{"reason": "DisruptionBudget", "message": message}]})


def _matching(pod: dict, budgets: Sequence[dict]) -> list[dict]:
    out = []
    for pdb in budgets:
        sel = from_label_selector_object((pdb.get("spec") or {}).get("selector"))
        if sel and labels_match(sel, _meta(pod).get("labels")):
            out.append(pdb)
    return out


def budget_to_spend(pod: dict, budgets: Sequence[dict]) -> dict | None:
    """The PodDisruptionBudget whose disruption the eviction of ``pod`` spends
    (``budgets``: those of the pod's namespace); None: the pod may be deleted
    without one. Raises :class:`APIError` where kube-apiserver refuses."""
    phase = (pod.get("status") or {}).get("phase")
    if phase in ("Pending", "Succeeded", "Failed") or _meta(pod).get("deletionTimestamp"):
        return None
    matching = _matching(pod, budgets)
    if not matching:
        return None
    if len(matching) > 1:
        raise APIError(500, "This pod has more than one PodDisruptionBudget, which the eviction subresource "
                            "does not support.", "InternalError")
    pdb = matching[0]
    spec, status = pdb.get("spec") or {}, pdb.get("status") or {}
    if not pod_ready(pod):
        if spec.get("unhealthyPodEvictionPolicy") == "AlwaysAllow":
            return None
        desired = _int(status.get("desiredHealthy"))
        if _int(status.get("currentHealthy")) >= desired > 0:
            return None
    name = _meta(pdb).get("name", "")
    if _int(status.get("observedGeneration")) < _int(_meta(pdb).get("generation")):
        raise _refused(f"The disruption budget {name} is still being processed by the server.")
    allowed = _int(status.get("disruptionsAllowed"))
    if allowed < 0:
        raise APIError(403, f'poddisruptionbudgets.policy "{name}" is forbidden: pdb disruptions allowed is '
                            "negative", "Forbidden", {"name": name, "group": "policy", "kind": "poddisruptionbudgets"})
    if len(status.get("disruptedPods") or {}) > MAX_DISRUPTED_PODS:
        raise APIError(403, f'poddisruptionbudgets.policy "{name}" is forbidden: DisruptedPods map too big - too '
                            "many evictions not confirmed by PDB controller", "Forbidden",
                       {"name": name, "group": "policy", "kind": "poddisruptionbudgets"})
    if allowed == 0:
        raise _refused(f"The disruption budget {name} needs {_int(status.get('desiredHealthy'))} healthy pods "
                       f"and has {_int(status.get('currentHealthy'))} currently")
    return pdb
