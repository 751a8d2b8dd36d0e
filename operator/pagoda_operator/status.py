"""The InferenceService's status from what the cluster reports. Pure: objects in, status dict out.

Conditions keep their lastTransitionTime while their status stays the same, so recomputing the
status of a settled service yields exactly the stored one and the handler writes nothing.
"""

from __future__ import annotations

from pagoda_operator.model_cache import CacheStatus
from pagoda_operator.names import LABEL_VARIANT, service_url, workload_name
from pagoda_operator.plan import ServicePlan

# Container waiting reasons that mean the pod will not get better on its own.
_STUCK_REASONS = (
    "CrashLoopBackOff",
    "ImagePullBackOff",
    "ErrImagePull",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
)


# Ready=False reasons that no waiting cures: the spec, a child in the way, the cluster must change.
BLOCKED_REASONS = (
    "InvalidSpec",
    "ChildRejected",
    "NameClash",
    "NoVariantFits",
    "InvalidParallelism",
    "LeaderWorkerSetMissing",
    "ModelCacheFailed",
)


def _condition(type_: str, status: bool | None, reason: str, message: str) -> dict:
    return {
        "type": type_,
        "status": "Unknown" if status is None else str(status),
        "reason": reason,
        "message": message,
    }


def model_fits_condition(plan: ServicePlan) -> dict:
    misfits, unknown = [], []
    for variant in plan.variants:
        if variant.fit is None:
            unknown.append(variant.name)
        elif not variant.fit.fits:
            misfits.append(f"variant {variant.name} ({variant.quantization}) {variant.fit.describe()}")
    if misfits:
        return _condition(
            "ModelFits",
            False,
            "InsufficientMemory",
            "; ".join(misfits)
            + ": pick a smaller quantization or kvCacheDtype fp8, a shorter maxModelLen or a larger GPU",
        )
    if unknown:
        return _condition(
            "ModelFits",
            None,
            "SizeUnknown",
            f"cannot size variants {', '.join(unknown)}: set model.family or model.architecture (an "
            "hf://, s3:// or pvc:// model is sized from its files once read), and resources.gpuMemory "
            "(resources.memory for CPU pods)",
        )
    return _condition("ModelFits", True, "Fits", "every variant fits its pods")


def pod_problems(pods: list[dict]) -> list[tuple[str, str]]:
    """(reason, message) for each pod that is stuck, most telling message first per pod."""
    problems = []
    for pod in pods:
        pod_name = pod["metadata"]["name"]
        status = pod.get("status", {})
        for cond in status.get("conditions", []):
            if cond.get("type") == "PodScheduled" and cond.get("reason") == "Unschedulable":
                problems.append(("Unschedulable", f"pod {pod_name}: {cond.get('message', '')}".strip()))
        for cs in status.get("initContainerStatuses", []) + status.get("containerStatuses", []):
            waiting = cs.get("state", {}).get("waiting") or {}
            reason = waiting.get("reason")
            if reason not in _STUCK_REASONS:
                continue
            terminated = cs.get("lastState", {}).get("terminated") or {}
            # The runtime writes its fatal start-up error to the termination log: the real cause.
            detail = (terminated.get("message") or waiting.get("message") or "").strip()
            problems.append((reason, f"pod {pod_name} container {cs['name']}: {detail}".rstrip(": ")))
    return problems


def deployment_problems(deployments: list[dict]) -> list[tuple[str, str]]:
    """The Deployment controller's own failures: pods it could not create (quota, PriorityClass)."""
    problems = []
    for deployment in deployments:
        for cond in deployment.get("status", {}).get("conditions", []):
            if cond.get("type") == "ReplicaFailure" and cond.get("status") == "True":
                message = f"Deployment {deployment['metadata']['name']}: {cond.get('message', '')}"
                problems.append((cond.get("reason") or "FailedCreate", message.strip()))
    return problems


def hpa_problems(hpas: list[dict]) -> list[tuple[str, str]]:
    """An HPA that cannot scale, most often because no metrics adapter serves the queue depth."""
    problems = []
    for hpa in hpas:
        for cond in hpa.get("status", {}).get("conditions", []):
            if cond.get("type") == "ScalingActive" and cond.get("status") == "False":
                message = f"HorizontalPodAutoscaler {hpa['metadata']['name']}: {cond.get('message', '')}"
                problems.append((cond.get("reason") or "ScalingInactive", message.strip()))
    return problems


def _variant_status(workload_of, variant, deployments: dict[str, dict]) -> dict:
    deployment = deployments.get(workload_of(variant.name), {})
    dep_status = deployment.get("status", {})
    entry = {
        "name": variant.name,
        "replicas": dep_status.get("replicas", 0),
        "readyReplicas": dep_status.get("readyReplicas", 0),
    }
    if variant.fit is not None:
        entry["fits"] = variant.fit.fits
    return entry


def _rolling_out(deployment: dict) -> bool:
    spec, status = deployment.get("spec", {}), deployment.get("status", {})
    desired = spec.get("replicas", 1)
    return (
        status.get("observedGeneration", 0) < deployment["metadata"].get("generation", 0)
        or status.get("updatedReplicas", 0) < desired
        or status.get("replicas", 0) > desired
        or status.get("readyReplicas", 0) < desired
    )


def _stamped(conditions: list[dict], previous: dict, generation: int, now: str) -> list[dict]:
    """A condition keeps its lastTransitionTime while its status stays the same."""
    old_conditions = {c["type"]: c for c in previous.get("conditions", [])}
    for cond in conditions:
        old = old_conditions.get(cond["type"])
        cond["lastTransitionTime"] = (
            old["lastTransitionTime"] if old and old.get("status") == cond["status"] else now
        )
        cond["observedGeneration"] = generation
    return conditions


def kstatus_conditions(ready: dict, progressing: dict, degraded: dict | None) -> list[dict]:
    """Reconciling and Stalled, the conditions kstatus (Flux's health checks, kpt) reads on any
    custom resource: abnormal-true, derived from Ready, Progressing and Degraded."""
    serving = ready["status"] == "True"
    stalled = not serving and (
        ready["reason"] in BLOCKED_REASONS or (degraded is not None and degraded["status"] == "True")
    )
    if stalled:
        cause = degraded if ready["reason"] not in BLOCKED_REASONS and degraded else ready
        return [
            _condition("Reconciling", False, "Stalled", "waiting cannot help: see Stalled"),
            _condition("Stalled", True, cause["reason"], cause["message"]),
        ]
    if not serving:
        reconciling = _condition("Reconciling", True, ready["reason"], ready["message"])
    elif progressing["status"] == "True":
        reconciling = _condition("Reconciling", True, progressing["reason"], progressing["message"])
    else:
        reconciling = _condition("Reconciling", False, "Serving", ready["message"])
    return [reconciling, _condition("Stalled", False, "Healthy", "nothing blocks the service")]


def invalid_status(previous: dict | None, *, reason: str, message: str, generation: int, now: str) -> dict:
    """Ready=False with why the spec or a child was refused; the other conditions stay as they were."""
    previous = previous or {}
    ready = _condition("Ready", False, reason, message)
    kept = [
        c for c in previous.get("conditions", []) if c.get("type") not in ("Ready", "Reconciling", "Stalled")
    ]
    progressing = next(
        (c for c in kept if c["type"] == "Progressing"), _condition("Progressing", None, "", "")
    )
    stamped = _stamped([ready, *kstatus_conditions(ready, progressing, None)], previous, generation, now)
    return {"conditions": [stamped[0], *kept, *stamped[1:]], "observedGeneration": generation}


def compute_status(
    plan: ServicePlan,
    *,
    namespace: str,
    name: str,
    generation: int,
    deployments: list[dict],
    pods: list[dict],
    previous: dict | None,
    now: str,
    hpas: list[dict] = (),
    clashes: list[str] = (),
    retiring: dict | None = None,
    cache: CacheStatus | None = None,
    upgrade_queued: list[str] = (),
) -> dict:
    """`deployments` (its Deployments and LeaderWorkerSets, whose replicas count groups), `pods` and
    `hpas`: the InferenceService's own; `clashes`: objects in the way that
    belong to someone else; `retiring`: old children kept serving (RetiringStatus's fields); `cache`:
    the shared model cache of an hf:// or s3:// source, or the sizing Job of a pvc:// one (the plan
    was made with its checkpoint); `upgrade_queued`: workloads whose operator upgrade waits its turn
    (upgrade.py)."""
    by_name = {d["metadata"]["name"]: d for d in deployments}

    def workload_of(variant: str) -> str:
        return workload_name(name, variant, spans_nodes=plan.spec.spans_nodes)

    # A variant that no longer fits keeps its pods while they serve: it is waited on like the others.
    servable = [v for v in plan.variants if v.servable or workload_of(v.name) in by_name]
    variants = [_variant_status(workload_of, v, by_name) for v in plan.variants]

    missing = [v.name for v in servable if workload_of(v.name) not in by_name]
    rolling = [v.name for v in servable if (d := by_name.get(workload_of(v.name))) and _rolling_out(d)]
    if retiring:
        progressing = _condition(
            "Progressing",
            True,
            "ReplacingVariants",
            f"{', '.join(retiring['deployments'])} keep serving until the variants that "
            f"replace them have ready pods (waiting since {retiring['since']})",
        )
    elif upgrade_queued:
        progressing = _condition(
            "Progressing",
            True,
            "UpgradeQueued",
            "a new operator renders new pods; they roll one workload of the cluster at a time: "
            + "; ".join(upgrade_queued),
        )
    elif missing or rolling:
        progressing = _condition(
            "Progressing", True, "RollingOut", f"variants rolling out: {', '.join(missing + rolling)}"
        )
    else:
        progressing = _condition("Progressing", False, "Stable", "every variant has its desired replicas")

    servable_names = {v.name for v in servable}
    own_pods = [p for p in pods if p["metadata"].get("labels", {}).get(LABEL_VARIANT) in servable_names]
    clash_problems = [
        (
            "NameClash",
            f"{clash} exists and does not belong to this InferenceService; the operator leaves "
            "it alone: delete or rename it, or rename the InferenceService",
        )
        for clash in clashes
    ]
    # A model whose shape the apiserver could not check (an explicit architecture, a downloaded
    # checkpoint) and that does not split over the ranks: the same sentence the apiserver would say.
    split_problems = [
        ("InvalidParallelism", f"variant {v.name}: {v.split_error}") for v in plan.variants if v.split_error
    ]
    problems = (
        clash_problems
        + split_problems
        + deployment_problems(deployments)
        + hpa_problems(list(hpas))
        + pod_problems(own_pods)
    )
    if problems:
        degraded = _condition("Degraded", True, problems[0][0], "; ".join(message for _, message in problems))
    else:
        degraded = _condition("Degraded", False, "Healthy", "no pod is failing")

    fits = model_fits_condition(plan)
    not_ready = [
        entry["name"]
        for entry in variants
        if entry["name"] in servable_names
        and (entry["name"] in missing or entry["readyReplicas"] < 1)
        and not _scaled_to_zero(by_name.get(workload_of(entry["name"])))
    ]
    if clashes:
        ready = _condition("Ready", False, "NameClash", clash_problems[0][1])
    elif not servable:
        ready = _condition(
            "Ready", False, *(split_problems[0] if split_problems else ("NoVariantFits", fits["message"]))
        )
    elif cache is not None and not cache.ready:
        ready = _condition(
            "Ready", False, f"ModelCache{cache.phase}", f"model cache {cache.summary()}: {cache.message}"
        )
    elif not_ready:
        reason = degraded["reason"] if problems else "Starting"
        ready = _condition("Ready", False, reason, f"variants not ready: {', '.join(not_ready)}")
    else:
        ready = _condition("Ready", True, "Serving", f"serving at {service_url(name, namespace)}")

    conditions = _stamped(
        [ready, progressing, degraded, fits, *kstatus_conditions(ready, progressing, degraded)],
        previous or {},
        generation,
        now,
    )

    desired = sum(
        by_name[workload_of(v.name)].get("spec", {}).get("replicas", 0)
        for v in servable
        if workload_of(v.name) in by_name
    )
    return {
        "conditions": conditions,
        "variants": variants,
        "url": service_url(name, namespace),
        "observedGeneration": generation,
        "variantNames": ",".join(v.name for v in plan.variants),
        "replicaSummary": f"{sum(e['readyReplicas'] for e in variants)}/{desired}",
        "retiring": retiring,
        "modelCache": cache.to_status() if cache is not None else None,
    }


def _scaled_to_zero(deployment: dict | None) -> bool:
    return deployment is not None and deployment.get("spec", {}).get("replicas", 1) == 0


def status_changed(previous: dict | None, new: dict) -> bool:
    """Whether the stored status differs from the new one in anything the new one says."""
    previous = previous or {}
    return any(previous.get(key) != value for key, value in new.items())
