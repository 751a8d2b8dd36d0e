"""Operator upgrades that change rendered pods roll one workload at a time across the cluster.

A spec edit is the user's decision and rolls at once. A new operator (a new --runtime-image default,
new arguments, a new probe) can change the pods of every InferenceService at the same moment; applied
at once, every variant of every service would roll together and, with a GPU variant's default
maxSurge 0, each one-replica variant would be down at the same time. So each workload carries the
spec generation and the hash of the pod template it was rendered from; a template that differs while
the generation is the same is the operator's change, and it is applied only while no other workload
of any InferenceService in the namespaces this operator watches is rolling out: workloads elsewhere
are another operator's to roll, or none's. Inside one workload its own rollout rules (maxSurge,
maxUnavailable) hold as for any rollout. The workloads waiting keep their pods and say so in status.
"""

from __future__ import annotations

import hashlib
import json
import threading

from pagoda_operator.models import GROUP
from pagoda_operator.watched_namespaces import watched

SPEC_GENERATION = f"{GROUP}/spec-generation"
TEMPLATE_HASH = f"{GROUP}/pod-template-hash"


def _templates(manifest: dict) -> object:
    spec = manifest["spec"]
    # A LeaderWorkerSet's pods are in its leaderWorkerTemplate; a Deployment's in its template.
    return spec.get("leaderWorkerTemplate", spec.get("template"))


def template_hash(manifest: dict) -> str:
    text = json.dumps(_templates(manifest), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def stamped(manifest: dict, generation: int) -> dict:
    """The workload with the generation and the pod-template hash it was rendered from."""
    meta = manifest["metadata"]
    annotations = {
        **meta.get("annotations", {}),
        SPEC_GENERATION: str(generation),
        TEMPLATE_HASH: template_hash(manifest),
    }
    return {**manifest, "metadata": {**meta, "annotations": annotations}}


def operator_change(manifest: dict, live: dict | None, generation: int) -> bool:
    """Whether applying `manifest` would replace `live`'s pods although the spec is the one they were
    rendered from (or a workload of an operator that kept no record of it)."""
    if live is None:
        return False
    annotations = live["metadata"].get("annotations") or {}
    if annotations.get(TEMPLATE_HASH) == template_hash(manifest):
        return False
    return annotations.get(SPEC_GENERATION) in (None, str(generation))


def in_namespaces(workloads: list[dict], namespaces: tuple[str, ...]) -> list[dict]:
    """The workloads in the namespaces given as the operator's --namespace globs; every one when none
    are given (an operator watching the whole cluster)."""
    return [w for w in workloads if watched(w["metadata"]["namespace"], namespaces)]


def _deadline_exceeded(workload: dict) -> bool:
    return any(
        c.get("type") == "Progressing" and c.get("reason") == "ProgressDeadlineExceeded"
        for c in workload.get("status", {}).get("conditions", [])
    )


def rolling_out(workload: dict) -> bool:
    """A Deployment or LeaderWorkerSet (counted in groups) whose pods are not all updated and ready.
    One past its progress deadline no longer counts: a broken service must not hold every other
    service's upgrade for ever."""
    if _deadline_exceeded(workload):
        return False
    spec, status = workload.get("spec", {}), workload.get("status", {})
    desired = spec.get("replicas", 1)
    observed = status.get("observedGeneration")
    return (
        (observed is not None and observed < workload["metadata"].get("generation", 0))
        or status.get("updatedReplicas", 0) < desired
        or status.get("replicas", 0) > desired
        or status.get("readyReplicas", 0) < desired
    )


class UpgradeGate:
    """Admits one operator-driven rollout at a time: the cluster's workloads say whether another one
    is under way (so that a restarted operator knows it too), and a lock keeps two reconciles of this
    process from both seeing none."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def run_if_idle(self, list_workloads, own: tuple[str, str, str], apply) -> str | None:
        """Calls `apply` unless a workload other than `own` (kind, namespace, name) rolls out; returns
        the one it waits for, else None. The workloads are listed inside the lock: a list made before
        another reconcile's apply would miss the rollout that apply starts."""
        with self._lock:
            for workload in list_workloads():
                key = (workload["kind"], workload["metadata"]["namespace"], workload["metadata"]["name"])
                if key != own and rolling_out(workload):
                    return f"{key[0]} {key[1]}/{key[2]}"
            apply()
            return None


GATE = UpgradeGate()
