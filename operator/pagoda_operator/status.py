"""The InferenceService's status from what the cluster reports. Pure: objects in, the typed status
(models.InferenceServiceStatus, from which the CRD's status schema is generated) out, one small
function per condition.

Conditions keep their lastTransitionTime while their status stays the same, so recomputing the
status of a settled service yields exactly the stored one and the handler writes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from pagoda_operator.http_route import GATEWAY_GROUP, variant_path
from pagoda_operator.model_cache import CacheStatus
from pagoda_operator.models import (
    AdapterStatus,
    Condition,
    InferenceServiceStatus,
    ModelCacheStatus,
    RetiringStatus,
    VariantStatus,
)
from pagoda_operator.names import (
    LABEL_VARIANT,
    service_url,
    variant_model_names,
    variant_object_name,
    workload_name,
)
from pagoda_operator.plan import ServicePlan, VariantPlan, draft_noun, draft_source, drafts_with_mtp

# Container waiting reasons that mean the pod will not get better on its own.
_STUCK_REASONS = (
    "CrashLoopBackOff",
    "ImagePullBackOff",
    "ErrImagePull",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
)

Problem = tuple[str, str]  # (reason, message)

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


def _condition(type_: str, status: bool | None, reason: str, message: str) -> Condition:
    return Condition(
        type=type_, status="Unknown" if status is None else str(status), reason=reason, message=message
    )


def model_fits_condition(plan: ServicePlan) -> Condition:
    misfits, unknown = [], []
    for variant in plan.variants:
        if variant.fit is None:
            unknown.append(variant.name)
        elif not variant.fit.fits:
            draft = draft_source(variant.variant)
            with_draft = f" with {draft_noun(variant.variant)} {draft}" if draft else ""
            if drafts_with_mtp(variant.variant):
                with_draft = " with its MTP layer"
            misfits.append(
                f"variant {variant.name} ({variant.quantization}){with_draft} {variant.fit.describe()}"
            )
    if misfits:
        drafts = sorted({draft_noun(v.variant) for v in plan.variants if draft_source(v.variant)})
        return _condition(
            "ModelFits",
            False,
            "InsufficientMemory",
            "; ".join(misfits)
            + ": pick a smaller quantization or kvCacheDtype fp8, a shorter maxModelLen"
            + "".join(f", a smaller {noun}" for noun in drafts)
            + " or a larger GPU",
        )
    if unknown:
        drafts = (
            " (and speculative.model's, for a draft model; an EAGLE head is sized once read)"
            if any(draft_source(v.variant) for v in plan.variants)
            else ""
        )
        return _condition(
            "ModelFits",
            None,
            "SizeUnknown",
            f"cannot size variants {', '.join(unknown)}: set model.family or model.architecture{drafts} "
            "(an hf://, s3:// or pvc:// model is sized from its files once read), and resources.gpuMemory "
            "(resources.memory for CPU pods)",
        )
    return _condition("ModelFits", True, "Fits", "every variant fits its pods")


def pod_problems(pods: list[dict]) -> list[Problem]:
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


def deployment_problems(deployments: list[dict]) -> list[Problem]:
    """The Deployment controller's own failures: pods it could not create (quota, PriorityClass)."""
    problems = []
    for deployment in deployments:
        for cond in deployment.get("status", {}).get("conditions", []):
            if cond.get("type") == "ReplicaFailure" and cond.get("status") == "True":
                message = f"Deployment {deployment['metadata']['name']}: {cond.get('message', '')}"
                problems.append((cond.get("reason") or "FailedCreate", message.strip()))
    return problems


def hpa_problems(hpas: list[dict]) -> list[Problem]:
    """An HPA that cannot scale, most often because no metrics adapter serves the queue depth."""
    problems = []
    for hpa in hpas:
        for cond in hpa.get("status", {}).get("conditions", []):
            if cond.get("type") == "ScalingActive" and cond.get("status") == "False":
                message = f"HorizontalPodAutoscaler {hpa['metadata']['name']}: {cond.get('message', '')}"
                problems.append((cond.get("reason") or "ScalingInactive", message.strip()))
    return problems


@dataclass(frozen=True)
class _Workloads:
    """The variants' Deployments (or LeaderWorkerSets, whose replicas count groups) as the cluster
    reports them."""

    plan: ServicePlan
    name: str
    by_name: dict[str, dict]
    adapters: Mapping[str, list[AdapterStatus]]  # by variant

    def of(self, variant: str) -> dict | None:
        return self.by_name.get(workload_name(self.name, variant, spans_nodes=self.plan.spec.spans_nodes))

    @property
    def servable(self) -> list[VariantPlan]:
        """A variant that no longer fits keeps its pods while they serve: it is waited on like the others."""
        return [v for v in self.plan.variants if v.servable or self.of(v.name) is not None]

    @property
    def missing(self) -> list[str]:
        return [v.name for v in self.servable if self.of(v.name) is None]

    @property
    def rolling(self) -> list[str]:
        return [v.name for v in self.servable if (w := self.of(v.name)) is not None and _rolling_out(w)]

    @property
    def not_ready(self) -> list[str]:
        """Servable variants without a ready pod, unless scaled to zero on purpose."""
        return [
            v.name
            for v in self.servable
            if (w := self.of(v.name)) is None
            or (w.get("status", {}).get("readyReplicas", 0) < 1 and w.get("spec", {}).get("replicas", 1) != 0)
        ]

    @property
    def desired(self) -> int:
        return sum(w.get("spec", {}).get("replicas", 0) for v in self.servable if (w := self.of(v.name)))

    def variant_status(self, variant: VariantPlan, served_name: str) -> VariantStatus:
        status = (self.of(variant.name) or {}).get("status", {})
        known_fit = {} if variant.fit is None else {"fits": variant.fit.fits}  # unknown: left out
        routed = {"path": variant_path(self.name, variant.name)} if self.plan.spec.route is not None else {}
        served = {"service": variant_object_name(self.name, variant.name)} if variant.servable else {}
        return VariantStatus(
            name=variant.name,
            replicas=status.get("replicas", 0),
            ready_replicas=status.get("readyReplicas", 0),
            **known_fit,
            **({"adapters": self.adapters[variant.name]} if variant.name in self.adapters else {}),
            **served,
            **routed,
            model_names=list(variant_model_names(served_name, variant.name)),
        )


def _rolling_out(deployment: dict) -> bool:
    spec, status = deployment.get("spec", {}), deployment.get("status", {})
    desired = spec.get("replicas", 1)
    return (
        status.get("observedGeneration", 0) < deployment["metadata"].get("generation", 0)
        or status.get("updatedReplicas", 0) < desired
        or status.get("replicas", 0) > desired
        or status.get("readyReplicas", 0) < desired
    )


@dataclass(frozen=True)
class _Problems:
    clashes: list[Problem]  # objects in the way that belong to someone else
    # Variants whose model does not split over their ranks, or cannot be drafted for as they ask.
    splits: list[Problem]
    children: list[Problem]  # what the Deployments, HPAs and pods report

    @property
    def all(self) -> list[Problem]:
        return self.clashes + self.splits + self.children


def adapter_problems(adapters: Mapping[str, list[AdapterStatus]]) -> list[Problem]:
    """Adapters that cannot be served: the copy failed, the rank is too large, a pod refused it."""
    return [
        ("AdapterFailed", f"adapter {a.name} in variant {variant}: {a.message}")
        for variant, states in adapters.items()
        for a in states
        if a.state == "Failed"
    ]


def _problems(
    workloads: _Workloads, deployments: list[dict], pods: list[dict], hpas: list[dict], clashes: list[str]
) -> _Problems:
    servable = {v.name for v in workloads.servable}
    own_pods = [p for p in pods if p["metadata"].get("labels", {}).get(LABEL_VARIANT) in servable]
    return _Problems(
        clashes=[
            (
                "NameClash",
                f"{clash} exists and does not belong to this InferenceService; the operator leaves "
                "it alone: delete or rename it, or rename the InferenceService",
            )
            for clash in clashes
        ],
        # A model whose shape the apiserver could not check (an explicit architecture, a downloaded
        # checkpoint) and that does not split over the ranks: the same sentence the apiserver would say.
        splits=[
            ("InvalidParallelism", f"variant {v.name}: {v.split_error}")
            for v in workloads.plan.variants
            if v.split_error
        ]
        + [
            ("InvalidSpeculation", f"variant {v.name}: {v.speculation_error}")
            for v in workloads.plan.variants
            if v.speculation_error
        ],
        children=deployment_problems(deployments)
        + hpa_problems(hpas)
        + pod_problems(own_pods)
        + adapter_problems(workloads.adapters),
    )


def progressing_condition(
    workloads: _Workloads, retiring: RetiringStatus | None, upgrade_queued: list[str] = ()
) -> Condition:
    if retiring is not None:
        return _condition(
            "Progressing",
            True,
            "ReplacingVariants",
            f"{', '.join(retiring.deployments)} keep serving until the variants that "
            f"replace them have ready pods (waiting since {retiring.since})",
        )
    if upgrade_queued:
        return _condition(
            "Progressing",
            True,
            "UpgradeQueued",
            "a new operator renders new pods; they roll one workload at a time: " + "; ".join(upgrade_queued),
        )
    if changing := workloads.missing + workloads.rolling:
        return _condition("Progressing", True, "RollingOut", f"variants rolling out: {', '.join(changing)}")
    return _condition("Progressing", False, "Stable", "every variant has its desired replicas")


def degraded_condition(problems: _Problems) -> Condition:
    if found := problems.all:
        return _condition("Degraded", True, found[0][0], "; ".join(message for _, message in found))
    return _condition("Degraded", False, "Healthy", "no pod is failing")


def ready_condition(
    workloads: _Workloads,
    problems: _Problems,
    fits: Condition,
    cache: CacheStatus | None,
    url: str,
    draft_caches: Mapping[str, CacheStatus] = MappingProxyType({}),
) -> Condition:
    if problems.clashes:
        return _condition("Ready", False, *problems.clashes[0])
    if not workloads.servable:
        return _condition("Ready", False, *(problems.splits[:1] or [("NoVariantFits", fits.message)])[0])
    if cache is not None and not cache.ready:
        return _condition(
            "Ready", False, f"ModelCache{cache.phase}", f"model cache {cache.summary()}: {cache.message}"
        )
    for variant, draft in draft_caches.items():
        if not draft.ready:
            return _condition(
                "Ready",
                False,
                f"ModelCache{draft.phase}",
                f"variant {variant}'s speculative.model cache {draft.summary()}: {draft.message}",
            )
    if not_ready := workloads.not_ready:
        reason = problems.all[0][0] if problems.all else "Starting"
        return _condition("Ready", False, reason, f"variants not ready: {', '.join(not_ready)}")
    return _condition("Ready", True, "Serving", f"serving at {url}")


ROUTE_CONDITIONS = ("Accepted", "ResolvedRefs")


def _our_parent(parent: dict, namespace: str, gateway: str, gateway_namespace: str | None) -> bool:
    ref = parent.get("parentRef", {})
    return (
        ref.get("name") == gateway
        and ref.get("namespace", namespace) == (gateway_namespace or namespace)
        and ref.get("group", GATEWAY_GROUP) == GATEWAY_GROUP
    )


def route_conditions(
    plan: ServicePlan, route: dict | None, *, gateway_api: bool, namespace: str
) -> list[Condition]:
    """RouteAccepted and RouteResolvedRefs: the HTTPRoute's conditions as its Gateway wrote them;
    none without spec.route."""
    wanted = plan.spec.route
    if wanted is None:
        return []
    if not gateway_api:
        message = (
            "spec.route needs the Gateway API (gateway.networking.k8s.io) installed in the cluster, with a "
            "gateway implementation: install them (docs/operator.md); the variants serve through their "
            "Services meanwhile"
        )
        return [_condition(f"Route{t}", False, "GatewayAPIMissing", message) for t in ROUTE_CONDITIONS]
    gateway = wanted.gateway_ref
    parents = [] if route is None else route.get("status", {}).get("parents", [])
    ours = next((p for p in parents if _our_parent(p, namespace, gateway.name, gateway.namespace)), None)
    found = {c.get("type"): c for c in (ours or {}).get("conditions", [])}
    conditions = []
    for type_ in ROUTE_CONDITIONS:
        cond = found.get(type_)
        if cond is None:
            message = (
                f"Gateway {gateway.namespace or namespace}/{gateway.name} has not reported on the route yet"
            )
            conditions.append(_condition(f"Route{type_}", None, "Pending", message))
            continue
        status = {"True": True, "False": False}.get(cond.get("status"))
        conditions.append(
            _condition(f"Route{type_}", status, cond.get("reason") or type_, cond.get("message", ""))
        )
    return conditions


def kstatus_conditions(
    ready: Condition, progressing: Condition, degraded: Condition | None
) -> list[Condition]:
    """Reconciling and Stalled, the conditions kstatus (Flux's health checks, kpt) reads on any
    custom resource: abnormal-true, derived from Ready, Progressing and Degraded."""
    serving = ready.status == "True"
    blocked = ready.reason in BLOCKED_REASONS
    if not serving and (blocked or (degraded is not None and degraded.status == "True")):
        cause = ready if blocked or degraded is None else degraded
        return [
            _condition("Reconciling", False, "Stalled", "waiting cannot help: see Stalled"),
            _condition("Stalled", True, cause.reason, cause.message),
        ]
    if not serving:
        reconciling = _condition("Reconciling", True, ready.reason, ready.message)
    elif progressing.status == "True":
        reconciling = _condition("Reconciling", True, progressing.reason, progressing.message)
    else:
        reconciling = _condition("Reconciling", False, "Serving", ready.message)
    return [reconciling, _condition("Stalled", False, "Healthy", "nothing blocks the service")]


def _stamped(conditions: list[Condition], previous: dict, generation: int, now: str) -> list[Condition]:
    """A condition keeps its lastTransitionTime while its status stays the same."""
    old_conditions = {c["type"]: c for c in previous.get("conditions", [])}
    stamped = []
    for cond in conditions:
        old = old_conditions.get(cond.type)
        since = old["lastTransitionTime"] if old and old.get("status") == cond.status else now
        stamped.append(
            cond.model_copy(update={"last_transition_time": since, "observed_generation": generation})
        )
    return stamped


def invalid_status(
    previous: dict | None, *, reason: str, message: str, generation: int, now: str
) -> InferenceServiceStatus:
    """Ready=False with why the spec or a child was refused (and kstatus's Stalled); the other
    conditions stay as they were."""
    previous = previous or {}
    ready = _condition("Ready", False, reason, message)
    kept = [
        Condition.model_validate(c)
        for c in previous.get("conditions", [])
        if c.get("type") not in ("Ready", "Reconciling", "Stalled")
    ]
    progressing = next((c for c in kept if c.type == "Progressing"), _condition("Progressing", None, "", ""))
    ready, *kstatus = _stamped(
        [ready, *kstatus_conditions(ready, progressing, None)], previous, generation, now
    )
    return InferenceServiceStatus(conditions=[ready, *kept, *kstatus], observed_generation=generation)


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
    route: dict | None = None,
    gateway_api: bool = False,
    upgrade_queued: list[str] = (),
    draft_caches: Mapping[str, CacheStatus] = MappingProxyType({}),
    adapters: Mapping[str, list[AdapterStatus]] | None = None,
) -> InferenceServiceStatus:
    """`deployments` (its Deployments and LeaderWorkerSets), `pods` and `hpas`: the
    InferenceService's own; `previous`: the stored status, as JSON; `clashes`: objects in the way
    that belong to someone else; `retiring`: old children kept serving (RetiringStatus's fields);
    `cache`: the shared model cache of an hf:// or s3:// source, or the sizing Job of a pvc:// one
    (the plan was made with its checkpoint); `route`: its HTTPRoute as stored, `gateway_api`: whether
    that kind exists; `upgrade_queued`: workloads whose operator upgrade waits its turn (upgrade.py);
    `draft_caches`: the same as `cache` for the variants' draft models, by variant name; `adapters`:
    each variant's adapters as the pods were last found (adapter_cluster.py)."""
    workloads = _Workloads(plan, name, {d["metadata"]["name"]: d for d in deployments}, adapters or {})
    problems = _problems(workloads, deployments, pods, list(hpas), list(clashes))
    retiring_status = RetiringStatus.model_validate(retiring) if retiring else None
    url = service_url(name, namespace)
    fits = model_fits_condition(plan)
    ready = ready_condition(workloads, problems, fits, cache, url, draft_caches)
    progressing = progressing_condition(workloads, retiring_status, list(upgrade_queued))
    degraded = degraded_condition(problems)
    conditions = [
        ready,
        progressing,
        degraded,
        fits,
        *route_conditions(plan, route, gateway_api=gateway_api, namespace=namespace),
        *kstatus_conditions(ready, progressing, degraded),
    ]
    served_name = plan.spec.model.served_name or name
    variants = [workloads.variant_status(v, served_name) for v in plan.variants]
    return InferenceServiceStatus(
        conditions=_stamped(conditions, previous or {}, generation, now),
        variants=variants,
        url=url,
        observed_generation=generation,
        variant_names=",".join(v.name for v in plan.variants),
        replica_summary=f"{sum(v.ready_replicas for v in variants)}/{workloads.desired}",
        retiring=retiring_status,
        model_cache=ModelCacheStatus.model_validate(cache.to_status()) if cache is not None else None,
    )


def status_patch(status: InferenceServiceStatus) -> dict:
    """The status as the merge patch that writes it: every field the status was given, a None one as
    null (which removes what is stored), and none it was not given (which keeps what is stored)."""
    return status.model_dump(mode="json", by_alias=True, exclude_unset=True)


def status_changed(previous: dict | None, new: dict) -> bool:
    """Whether the stored status differs from the new patch in anything the patch says."""
    previous = previous or {}
    return any(previous.get(key) != value for key, value in new.items())
