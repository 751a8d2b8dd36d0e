"""Who owns a Deployment's (or LeaderWorkerSet's) spec.replicas, so that no transition between fixed
and autoscaled kills a pod.

Server-side apply removes a field once its last owner stops applying it, and the apiserver then
defaults spec.replicas to 1: a variant moved from {min: 3, max: 3} to {min: 3, max: 6} lost two pods
before its new HPA scaled back up. So the operator's main field manager applies spec.replicas only
when it creates a Deployment, and a second manager owns nothing but spec.replicas. That one sets the
count of a fixed variant; of an autoscaled one it only raises the count to min and otherwise leaves
the field to the HPA, whose scale updates take the field over. The field always keeps an owner.
"""

from __future__ import annotations

from pagoda_operator.kube import FIELD_MANAGER
from pagoda_operator.plan import VariantPlan


def _applies_replicas(deployment: dict, manager: str) -> bool:
    for entry in deployment["metadata"].get("managedFields", []):
        applied = entry.get("manager") == manager and entry.get("operation") == "Apply"
        if applied and "f:replicas" in entry.get("fieldsV1", {}).get("f:spec", {}):
            return True
    return False


def replicas_to_apply(variant: VariantPlan, live: dict | None) -> int | None:
    """The count the replicas manager applies now; None leaves the field to its present owners."""
    replicas = variant.variant.replicas
    if not variant.autoscales:
        return replicas.min
    current = None if live is None else live.get("spec", {}).get("replicas")
    if current is None:
        # A variant that may scale to zero still starts with a pod: its model is loaded and checked
        # once, and the autoscaler takes it to zero when it stays idle.
        return max(replicas.min, 1)
    if current < replicas.min:
        return replicas.min
    if _applies_replicas(live, FIELD_MANAGER):
        # Set by an operator version whose main manager owned the field: hand it over unchanged.
        return current
    return None


def replicas_manifest(workload: dict, count: int) -> dict:
    """What the replicas manager applies to a Deployment or LeaderWorkerSet: its identity and
    spec.replicas only."""
    meta = workload["metadata"]
    return {
        "apiVersion": workload["apiVersion"],
        "kind": workload["kind"],
        "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
        "spec": {"replicas": count},
    }
