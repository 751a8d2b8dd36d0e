"""One reconcile of an InferenceService: makes the children match the spec and the status match the
children.

Parse the spec, create or read the shared model cache, plan, render, server-side apply (unchanged
objects are not written; objects of someone else are never touched), retire children that should no
longer exist (make before break, retire.py), recompute the status and patch it only when it changed
(status_refresh.py). Failures become kopf's errors: an invalid spec or a refused child is permanent
and reported on the status, a transient API error is retried.
"""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import UTC, datetime

import kopf
from kubernetes.client import ApiException
from pydantic import ValidationError

from pagoda_operator import adapter_cluster, metrics, settings, upgrade
from pagoda_operator.inference_service import error_text, ids, parse, plan_with_cache
from pagoda_operator.kube import (
    CHILD_KINDS,
    OPTIONAL_KINDS,
    REPLICAS_FIELD_MANAGER,
    Kube,
    api_message,
    being_deleted,
    owned,
    workload_kinds,
)
from pagoda_operator.leader_worker_set import LWS_GROUP
from pagoda_operator.model_cache_cluster import ensure_draft_caches, ensure_model_cache
from pagoda_operator.models import InferenceServiceSpec
from pagoda_operator.names import LABEL_ISVC, LABEL_VARIANT, WORKLOAD_KINDS, child_selector
from pagoda_operator.plan import ServicePlan
from pagoda_operator.render import RenderOptions, render, with_runtime_image
from pagoda_operator.replicas import replicas_manifest, replicas_to_apply
from pagoda_operator.retire import plan_retirement, replacements_ready, serving_variants
from pagoda_operator.scaled_object import KEDA_GROUP
from pagoda_operator.status_refresh import Observed, observe, refresh_status, report_invalid


def _missing_requirement(spec: InferenceServiceSpec, installed: dict[str, bool]) -> tuple[str, str] | None:
    """(reason, message) when the spec needs an API the cluster lacks; a route without the Gateway
    API is not one of them: the status says so and the pods serve meanwhile."""
    if spec.spans_nodes and not installed["LeaderWorkerSet"]:
        return "LeaderWorkerSetMissing", (
            f"parallelism.nodes {spec.parallelism.nodes} needs LeaderWorkerSet ({LWS_GROUP}) installed in "
            "the cluster: install it (see README), or serve from one node"
        )
    zero = [v.name for v in spec.variants if v.replicas.min == 0 < v.replicas.max]
    wants_keda = spec.autoscaling.actuator == "keda" or (zero and spec.autoscaling.enabled)
    if wants_keda and not installed["ScaledObject"]:
        why = f"variants {', '.join(zero)} scale to zero" if zero else "autoscaling.actuator is keda"
        return "KEDAMissing", (
            f"{why}, which needs KEDA ({KEDA_GROUP}) installed in the cluster: install it (see "
            "docs/operator.md), or give those variants replicas.min 1 and actuator hpa"
        )
    return None


def _with_installed(
    options: RenderOptions,
    spec: InferenceServiceSpec,
    installed: dict[str, bool],
    keda: settings.KedaSettings,
) -> RenderOptions:
    """The render options with the optional APIs this cluster has."""
    scales_with_keda = installed["ScaledObject"] and spec.autoscaling.actuator != "hpa"
    return replace(
        options,
        service_monitor=installed["ServiceMonitor"],
        gateway_api=installed["HTTPRoute"],
        keda=keda if scales_with_keda else None,
    )


def watched_workloads(k: Kube) -> list[dict]:
    """The InferenceServices' workloads in the namespaces this operator watches."""
    workloads = [w for kind in workload_kinds(k) for w in k.list_all(kind, LABEL_ISVC)]
    return upgrade.in_namespaces(workloads, settings.current().namespaces)


def _apply_workload(k: Kube, body, manifest: dict, variant, live: dict | None) -> str | None:
    """Applies a variant's workload; an operator-driven change of its pods waits its turn (upgrade.py):
    returns what it waits for, else None."""
    generation = ids(body)[3]
    manifest = upgrade.stamped(manifest, generation)
    count = replicas_to_apply(variant, live)
    if live is None:
        # Created with its count, then co-owned by the replicas manager, so that the main manager
        # can leave spec.replicas out from now on without the apiserver resetting it.
        k.apply({**manifest, "spec": {**manifest["spec"], "replicas": count}}, force=False)
    if count is not None:
        k.apply(replicas_manifest(manifest, count), force=True, manager=REPLICAS_FIELD_MANAGER)
    if live is None:
        return None
    if not upgrade.operator_change(manifest, live, generation):
        k.apply(manifest, force=True)
        return None
    meta = manifest["metadata"]
    blocker = upgrade.GATE.run_if_idle(
        lambda: watched_workloads(k),
        (manifest["kind"], meta["namespace"], meta["name"]),
        lambda: k.apply(manifest, force=True),
    )
    if blocker is None:
        k.post_event(
            body,
            "Normal",
            "OperatorUpgrade",
            f"rolling {manifest['kind']} {meta['name']} to the pods this operator renders (one workload "
            "at a time among the services it watches, within rollout.maxSurge and rollout.maxUnavailable)",
        )
        return None
    return f"{manifest['kind']} {meta['name']} waits for {blocker} to finish rolling out"


def _apply_children(
    k: Kube, body, plan: ServicePlan, manifests: list[dict], uid: str
) -> tuple[list[str], list[str]]:
    """Applies what is ours or new; returns the objects in the way that belong to someone else, and
    the workloads whose operator upgrade waits its turn."""
    variants = {v.name: v for v in plan.variants}
    clashes, queued = [], []
    for manifest in manifests:
        meta = manifest["metadata"]
        live = k.get(manifest["kind"], meta["namespace"], meta["name"])
        if live is not None and not owned(live, uid):
            clashes.append(f"{manifest['kind']} {meta['namespace']}/{meta['name']}")
        elif manifest["kind"] in WORKLOAD_KINDS:
            if waiting := _apply_workload(k, body, manifest, variants[meta["labels"][LABEL_VARIANT]], live):
                queued.append(waiting)
        else:
            k.apply(manifest, force=live is not None)
    return clashes, queued


def _retire(k: Kube, body, plan: ServicePlan, manifests: list[dict], kinds: list[str]) -> dict | None:
    """Deletes the children the render no longer produces, once their replacements serve."""
    if plan.held:
        # No variant is rendered while the checkpoint is read: the serving ones stay as they are.
        return (body.get("status") or {}).get("retiring")
    namespace, name, uid, _ = ids(body)
    owned_children = [
        {**child, "kind": kind}
        for kind in kinds
        for child in k.list(kind, namespace, child_selector(name))
        if owned(child, uid)
    ]
    wanted = {(m["kind"], m["metadata"]["name"]) for m in manifests}
    deployments = [c for c in owned_children if c["kind"] in WORKLOAD_KINDS]
    unfit = {v.name for v in plan.variants if not v.servable}
    retiring = (body.get("status") or {}).get("retiring") or {}
    retirement = plan_retirement(
        wanted=wanted,
        owned=owned_children,
        kept_variants=unfit & serving_variants(deployments),
        replacements_are_ready=replacements_ready(
            [d for d in deployments if (d["kind"], d["metadata"]["name"]) in wanted]
        ),
        since=retiring.get("since"),
        now=datetime.now(UTC),
        timeout_seconds=plan.spec.rollout.replacement_timeout_seconds,
    )
    for kind, child in retirement.delete:
        k.delete(kind, namespace, child)
    if retirement.timed_out:
        k.post_event(
            body,
            "Warning",
            "ReplacementNotReady",
            f"removed {', '.join(retiring.get('deployments', []))} after "
            f"{plan.spec.rollout.replacement_timeout_seconds}s although the variants replacing them "
            "have no ready pod yet",
        )
    if not retirement.waiting:
        return None
    return {"since": retirement.since, "deployments": list(retirement.waiting)}


def _invalid(k: Kube, body, exc: ValidationError | ValueError, *, announce: bool) -> None:
    metrics.RECONCILES.labels(result="invalid").inc()
    report_invalid(k, body, "InvalidSpec", error_text(exc), announce=announce)
    raise kopf.PermanentError(f"invalid spec: {error_text(exc)}") from exc


def _refused(k: Kube, body, exc: ApiException, *, announce: bool) -> None:
    """Raises what a refusal from the API means for kopf; returns when the object is going away."""
    if being_deleted(exc):
        return  # the InferenceService or its namespace goes; the garbage collector does the rest
    metrics.RECONCILES.labels(result="error").inc()
    if exc.status in (0, 409, 429) or exc.status >= 500:
        raise kopf.TemporaryError(
            f"Kubernetes API error {exc.status} {exc.reason}; retrying", delay=10
        ) from exc
    # Not the spec's fault alone: RBAC, quotas and admission policies refuse children too.
    message = f"the API refused a child object ({exc.status} {exc.reason}): {api_message(exc)}"
    report_invalid(k, body, "ChildRejected", message, announce=announce)
    raise kopf.PermanentError(message) from exc


def reconcile(k: Kube, body, *, announce: bool) -> None:
    """Makes the children match the spec and the status match the children."""
    namespace, name, uid, _ = ids(body)
    started = time.monotonic()
    try:
        spec = parse(body)
    except (ValidationError, ValueError) as exc:
        _invalid(k, body, exc, announce=announce)
    operator_settings = settings.current()
    options = RenderOptions(
        runtime_image=operator_settings.runtime_image,
        service_monitor_labels=tuple(sorted(operator_settings.service_monitor_labels.items())),
        operator_namespace=operator_settings.operator_namespace,
    )
    try:
        cache = ensure_model_cache(k, with_runtime_image(spec, options), namespace)
        drafts = ensure_draft_caches(k, with_runtime_image(spec, options), namespace)
        adapter_cluster.ensure_adapter_cache(k, with_runtime_image(spec, options), namespace)
    except ApiException as exc:
        _refused(k, body, exc, announce=announce)
        return
    installed = {kind: k.has_api(*api) for kind, api in OPTIONAL_KINDS.items()}
    try:
        plan = plan_with_cache(spec, cache, drafts)
        manifests = render(
            plan,
            namespace=namespace,
            name=name,
            uid=uid,
            options=_with_installed(options, spec, installed, operator_settings.keda),
        )
    except (ValidationError, ValueError) as exc:
        _invalid(k, body, exc, announce=announce)
    if (missing := _missing_requirement(spec, installed)) is not None:
        reason, message = missing
        report_invalid(k, body, reason, message, announce=announce)
        raise kopf.PermanentError(message)
    try:
        clashes, queued = _apply_children(k, body, plan, manifests, uid)
        kinds = [kind for kind in CHILD_KINDS if installed.get(kind, True)]
        retiring = _retire(k, body, plan, manifests, kinds)
        observe(namespace, name, Observed(tuple(clashes), retiring, tuple(queued)))
        adapter_cluster.sync_adapters(k, spec, namespace, name)
        refresh_status(k, namespace, name)
    except ApiException as exc:
        _refused(k, body, exc, announce=announce)
        return
    metrics.RECONCILES.labels(result="ok").inc()
    metrics.RECONCILE_SECONDS.observe(time.monotonic() - started)
