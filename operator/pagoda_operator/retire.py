"""Which of an InferenceService's children go, and when: make before break. Pure.

A child that the render no longer produces belongs to a removed, renamed or replaced variant, or to
a feature switched off (an HPA, a NetworkPolicy), or to a variant moved between a Deployment and a
LeaderWorkerSet (one node, several). Old workloads (either kind) that still have ready pods are kept
until every rendered workload has a ready pod (a LeaderWorkerSet: a ready group), or until
rollout.replacementTimeoutSeconds has passed since the wait began; the top-level Service selects old
and new pods alike meanwhile. A variant that no longer fits keeps its children while its pods serve:
the fit gate refuses new pods, it does not stop working ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from pagoda_operator.names import LABEL_VARIANT, WORKLOAD_KINDS

TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


@dataclass(frozen=True)
class Retirement:
    delete: tuple[tuple[str, str], ...]  # (kind, name)
    waiting: tuple[str, ...]  # old workloads kept serving meanwhile
    since: str | None  # when the wait began
    timed_out: bool  # old workloads deleted although their replacements are not ready


def _ready(workload: dict) -> bool:
    """A Deployment with a ready pod, a LeaderWorkerSet with a ready group."""
    return workload.get("status", {}).get("readyReplicas", 0) >= 1


def replacements_ready(workloads: list[dict]) -> bool:
    """Every rendered workload serves, or is meant to have no pods at all."""
    return all(_ready(w) or w.get("spec", {}).get("replicas", 1) == 0 for w in workloads)


def serving_variants(workloads: list[dict]) -> set[str]:
    return {w["metadata"]["labels"].get(LABEL_VARIANT) for w in workloads if _ready(w)}


def plan_retirement(
    *,
    wanted: set[tuple[str, str]],
    owned: list[dict],
    kept_variants: set[str],
    replacements_are_ready: bool,
    since: str | None,
    now: datetime,
    timeout_seconds: int,
) -> Retirement:
    """`owned`: every child of ours with its kind; `kept_variants`: unfitting variants still serving."""
    candidates = [
        child
        for child in owned
        if (child["kind"], child["metadata"]["name"]) not in wanted
        and child["metadata"].get("labels", {}).get(LABEL_VARIANT) not in kept_variants
    ]
    serving = tuple(
        sorted(c["metadata"]["name"] for c in candidates if c["kind"] in WORKLOAD_KINDS and _ready(c))
    )
    delete = tuple(sorted((c["kind"], c["metadata"]["name"]) for c in candidates))
    if not serving or replacements_are_ready:
        return Retirement(delete, (), None, False)
    started = since or now.strftime(TIME_FORMAT)
    waited = (now - datetime.strptime(started, TIME_FORMAT).replace(tzinfo=now.tzinfo)).total_seconds()
    if waited >= timeout_seconds:
        return Retirement(delete, (), None, True)
    return Retirement((), serving, started, False)
