"""kopf handlers: thin glue from cluster events to render (what should exist) and status (what does).

Every path ends in the same reconcile: render, server-side apply (unchanged objects are not
written; objects of someone else are never touched), retire children that should no longer exist
(make before break, retire.py), recompute the status and patch it only when it changed. A resync
thread repeats it (`schedule_resync`), which corrects drift on the children; events of our
Deployments and Pods refresh the status between resyncs. No handler needs a finalizer (kopf's
timers would add one): deleting an InferenceService, its namespace or the whole install works
while the operator is down, and the garbage collector removes the children by their owner.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import kopf
from kubernetes.client import ApiException
from pydantic import ValidationError

from pagoda_operator import metrics, model_cache
from pagoda_operator.kube import (
    CHILD_KINDS,
    LEADER_WORKER_SET_API,
    REPLICAS_FIELD_MANAGER,
    SERVICE_MONITOR_API,
    Kube,
    load_credentials,
)
from pagoda_operator.leader_worker_set import LWS_GROUP, LWS_PLURAL, LWS_VERSION
from pagoda_operator.model_cache import CacheStatus
from pagoda_operator.models import GROUP, PLURAL, VERSION, InferenceServiceSpec
from pagoda_operator.names import (
    LABEL_ISVC,
    LABEL_MODEL_CACHE,
    LABEL_VARIANT,
    NAME_RULES,
    WORKLOAD_KINDS,
    child_selector,
)
from pagoda_operator.plan import ServicePlan, plan_service
from pagoda_operator.render import POD_SECURITY, RenderOptions, pod_tolerations, render
from pagoda_operator.replicas import replicas_manifest, replicas_to_apply
from pagoda_operator.retire import TIME_FORMAT, plan_retirement, replacements_ready, serving_variants
from pagoda_operator.rules import enforce
from pagoda_operator.status import compute_status, invalid_status, status_changed

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Observed:
    """What the last reconcile found that the cluster's objects alone do not show."""

    clashes: tuple[str, ...] = ()
    retiring: dict | None = None


_kube: Kube | None = None
# How often the status of an InferenceService whose model downloads shows the download's progress.
CACHE_PROGRESS_SECONDS = 15.0
_observed: dict[tuple[str, str], Observed] = {}
_known: set[tuple[str, str]] = set()
# The spec handler, the resync and Deployment and Pod events may refresh one object's status at
# once; each must see the others' writes, or a transition (and its Warning) is reported twice.
_STATUS_LOCKS = [threading.Lock() for _ in range(64)]


def kube() -> Kube:
    global _kube
    if _kube is None:
        load_credentials()
        _kube = Kube()
    return _kube


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_) -> None:
    # Progress lives in annotations: the status belongs to the InferenceService's own schema.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    # Events are for what a user must act on; routine handler chatter stays in the logs.
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.execution.max_workers = 8
    if settings.peering.clusterwide and not settings.peering.standalone:
        kube().ensure_cluster_peering(settings.peering.name)
    kube()


def _now() -> str:
    return datetime.now(UTC).strftime(TIME_FORMAT)


def _ids(body) -> tuple[str, str, str, int]:
    meta = body["metadata"]
    return meta["namespace"], meta["name"], meta["uid"], meta.get("generation", 1)


def _parse(body) -> InferenceServiceSpec:
    enforce(body["metadata"]["name"], NAME_RULES)
    return InferenceServiceSpec.model_validate(dict(body.get("spec") or {}))


def _owned(obj: dict, uid: str) -> bool:
    return any(
        ref.get("uid") == uid and ref.get("controller") for ref in obj["metadata"].get("ownerReferences", [])
    )


def _error_text(exc: ValidationError | ValueError) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(f"spec.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors())
    return str(exc)


def _api_message(exc: ApiException) -> str:
    """The apiserver's own sentence from its Status body (which object, what is wrong), else the body."""
    try:
        return json.loads(exc.body)["message"]
    except (TypeError, ValueError, KeyError):
        return str(exc.body)


def _being_deleted(exc: ApiException) -> bool:
    """The object or its namespace is gone, or the namespace refuses new objects while it terminates."""
    return exc.status == 404 or (exc.status == 403 and "NamespaceTerminating" in str(exc.body))


def _report_invalid(k: Kube, body, reason: str, message: str, *, announce: bool) -> None:
    namespace, name, _, generation = _ids(body)
    previous = dict(body.get("status") or {})
    new = invalid_status(previous, reason=reason, message=message, generation=generation, now=_now())
    if status_changed(previous, new):
        try:
            k.patch_status(namespace, name, new)
        except ApiException as exc:
            if not _being_deleted(exc):
                raise
            return
    if announce:
        kopf.warn(body, reason=reason, message=message)


def read_cache_status(k: Kube, spec: InferenceServiceSpec, namespace: str) -> CacheStatus | None:
    """The model cache's state from its claim, its Job, the Job's pods and the running pod's log; or
    the sizing Job's of a pvc:// model."""
    ref = model_cache.job_ref(spec)
    if ref is None:
        return None
    job = k.get("Job", namespace, ref.name)
    pods = k.list("Pod", namespace, f"job-name={ref.name}") if job is not None else []
    if model_cache.cache_ref(spec) is None:
        return model_cache.sizing_status(ref, spec, job, pods)
    running = [p for p in pods if p.get("status", {}).get("phase") == "Running"]
    log_tail = ""
    if running:
        log_tail = k.log_tail(namespace, running[0]["metadata"]["name"], model_cache.DOWNLOAD_CONTAINER)
    claim = k.get("PersistentVolumeClaim", namespace, ref.name)
    return model_cache.cache_status(ref, claim, job, pods, log_tail)


def _plan(spec: InferenceServiceSpec, cache: CacheStatus | None) -> ServicePlan:
    if cache is None:
        return plan_service(spec)
    return plan_service(spec, cache.checkpoint, held=cache.holds_replicas)


def ensure_model_cache(k: Kube, spec: InferenceServiceSpec, namespace: str) -> CacheStatus | None:
    """Creates the claim and the download Job unless they exist, and reads their state. Both are
    shared by every user of the model revision: created once by whoever comes first, never updated,
    never owned (deleting a user keeps the data)."""
    placement = model_cache.JobPlacement(POD_SECURITY, pod_tolerations(spec))
    for shared in model_cache.cache_manifests(spec, namespace, placement):
        k.create_if_absent(shared)
    return read_cache_status(k, spec, namespace)


def _workload_kinds(k: Kube) -> list[str]:
    """Deployment, and LeaderWorkerSet where its CRD is installed (listing it elsewhere is a 404)."""
    return [kind for kind in WORKLOAD_KINDS if kind != "LeaderWorkerSet" or k.has_api(*LEADER_WORKER_SET_API)]


def refresh_status(k: Kube, namespace: str, name: str) -> None:
    """Recomputes the status from the stored object, so that it compares with the latest write."""
    with _STATUS_LOCKS[hash((namespace, name)) % len(_STATUS_LOCKS)]:
        body = k.get_inference_service(namespace, name)
        if body is None:
            return
        try:
            spec = _parse(body)
        except (ValidationError, ValueError):
            return  # the spec handler reports it
        cache = read_cache_status(k, spec, namespace)
        plan = _plan(spec, cache)
        _, _, uid, generation = _ids(body)
        selector = child_selector(name)
        observed = _observed.get((namespace, name), Observed())
        previous = dict(body.get("status") or {})
        new = compute_status(
            plan,
            namespace=namespace,
            name=name,
            generation=generation,
            deployments=[
                w for kind in _workload_kinds(k) for w in k.list(kind, namespace, selector) if _owned(w, uid)
            ],
            pods=k.list("Pod", namespace, selector),
            hpas=[h for h in k.list("HorizontalPodAutoscaler", namespace, selector) if _owned(h, uid)],
            clashes=list(observed.clashes),
            retiring=observed.retiring,
            previous=previous,
            now=_now(),
            cache=cache,
        )
        if not status_changed(previous, new):
            return
        try:
            k.patch_status(namespace, name, new)
        except ApiException as exc:
            if exc.status == 404:
                return  # deleted since it was read
            raise
        metrics.STATUS_WRITES.inc()
        _announce_transitions(k, body, previous, new)


def _announce_transitions(k: Kube, body, previous: dict, new: dict) -> None:
    """Events on the InferenceService when what a user must act on starts, changes or ends."""
    was = {c["type"]: c for c in previous.get("conditions", [])}
    now = {c["type"]: c for c in new["conditions"]}
    fits, fitted = now["ModelFits"], was.get("ModelFits", {})
    if fits["status"] == "False" and fitted.get("status") != "False":
        k.post_event(body, "Warning", "ModelDoesNotFit", fits["message"])
    degraded, before = now["Degraded"], was.get("Degraded", {})
    if degraded["status"] == "True" and (before.get("status"), before.get("reason")) != (
        "True",
        degraded["reason"],
    ):
        k.post_event(body, "Warning", degraded["reason"], degraded["message"])
    elif degraded["status"] == "False" and before.get("status") == "True":
        k.post_event(body, "Normal", "Recovered", "no child reports a failure any more")


def _apply_workload(k: Kube, manifest: dict, variant, live: dict | None) -> None:
    count = replicas_to_apply(variant, live)
    if live is None:
        # Created with its count, then co-owned by the replicas manager, so that the main manager
        # can leave spec.replicas out from now on without the apiserver resetting it.
        k.apply({**manifest, "spec": {**manifest["spec"], "replicas": count}}, force=False)
    if count is not None:
        k.apply(replicas_manifest(manifest, count), force=True, manager=REPLICAS_FIELD_MANAGER)
    if live is not None:
        k.apply(manifest, force=True)


def _apply_children(k: Kube, plan: ServicePlan, manifests: list[dict], uid: str) -> list[str]:
    """Applies what is ours or new; returns the objects in the way that belong to someone else."""
    variants = {v.name: v for v in plan.variants}
    clashes = []
    for manifest in manifests:
        meta = manifest["metadata"]
        live = k.get(manifest["kind"], meta["namespace"], meta["name"])
        if live is not None and not _owned(live, uid):
            clashes.append(f"{manifest['kind']} {meta['namespace']}/{meta['name']}")
        elif manifest["kind"] in WORKLOAD_KINDS:
            _apply_workload(k, manifest, variants[meta["labels"][LABEL_VARIANT]], live)
        else:
            k.apply(manifest, force=live is not None)
    return clashes


def _retire(k: Kube, body, plan: ServicePlan, manifests: list[dict], kinds: list[str]) -> dict | None:
    """Deletes the children the render no longer produces, once their replacements serve."""
    if plan.held:
        # No variant is rendered while the checkpoint is read: the serving ones stay as they are.
        return (body.get("status") or {}).get("retiring")
    namespace, name, uid, _ = _ids(body)
    owned = [
        {**child, "kind": kind}
        for kind in kinds
        for child in k.list(kind, namespace, child_selector(name))
        if _owned(child, uid)
    ]
    wanted = {(m["kind"], m["metadata"]["name"]) for m in manifests}
    deployments = [c for c in owned if c["kind"] in WORKLOAD_KINDS]
    unfit = {v.name for v in plan.variants if not v.servable}
    retiring = (body.get("status") or {}).get("retiring") or {}
    retirement = plan_retirement(
        wanted=wanted,
        owned=owned,
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
    _report_invalid(k, body, "InvalidSpec", _error_text(exc), announce=announce)
    raise kopf.PermanentError(f"invalid spec: {_error_text(exc)}") from exc


def _refused(k: Kube, body, exc: ApiException, *, announce: bool) -> None:
    """Raises what a refusal from the API means for kopf; returns when the object is going away."""
    if _being_deleted(exc):
        return  # the InferenceService or its namespace goes; the garbage collector does the rest
    metrics.RECONCILES.labels(result="error").inc()
    if exc.status in (0, 409, 429) or exc.status >= 500:
        raise kopf.TemporaryError(
            f"Kubernetes API error {exc.status} {exc.reason}; retrying", delay=10
        ) from exc
    # Not the spec's fault alone: RBAC, quotas and admission policies refuse children too.
    message = f"the API refused a child object ({exc.status} {exc.reason}): {_api_message(exc)}"
    _report_invalid(k, body, "ChildRejected", message, announce=announce)
    raise kopf.PermanentError(message) from exc


def reconcile(body, *, announce: bool) -> None:
    """Makes the children match the spec and the status match the children."""
    k = kube()
    namespace, name, uid, _ = _ids(body)
    started = time.monotonic()
    try:
        spec = _parse(body)
    except (ValidationError, ValueError) as exc:
        _invalid(k, body, exc, announce=announce)
    try:
        cache = ensure_model_cache(k, spec, namespace)
    except ApiException as exc:
        _refused(k, body, exc, announce=announce)
        return
    try:
        plan = _plan(spec, cache)
        service_monitor = k.has_api(*SERVICE_MONITOR_API)
        manifests = render(
            plan,
            namespace=namespace,
            name=name,
            uid=uid,
            options=RenderOptions(service_monitor=service_monitor),
        )
    except (ValidationError, ValueError) as exc:
        _invalid(k, body, exc, announce=announce)
    lws_installed = k.has_api(*LEADER_WORKER_SET_API)
    if spec.spans_nodes and not lws_installed:
        message = (
            f"parallelism.nodes {spec.parallelism.nodes} needs LeaderWorkerSet ({LWS_GROUP}) installed in "
            "the cluster: install it (see README), or serve from one node"
        )
        _report_invalid(k, body, "LeaderWorkerSetMissing", message, announce=announce)
        raise kopf.PermanentError(message)
    try:
        clashes = _apply_children(k, plan, manifests, uid)
        kinds = [
            kind
            for kind in CHILD_KINDS
            if (kind != "ServiceMonitor" or service_monitor) and (kind != "LeaderWorkerSet" or lws_installed)
        ]
        retiring = _retire(k, body, plan, manifests, kinds)
        _observed[(namespace, name)] = Observed(tuple(clashes), retiring)
        refresh_status(k, namespace, name)
    except ApiException as exc:
        _refused(k, body, exc, announce=announce)
        return
    metrics.RECONCILES.labels(result="ok").inc()
    metrics.RECONCILE_SECONDS.observe(time.monotonic() - started)


@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
@kopf.on.resume(GROUP, VERSION, PLURAL)
def on_spec(body, **_) -> None:
    reconcile(body, announce=True)


@kopf.on.event(GROUP, VERSION, PLURAL)
def remember(type, namespace, name, **_) -> None:
    """Keeps the set of InferenceServices the resync visits: those kopf's scope lets us see."""
    if type == "DELETED":
        _known.discard((namespace, name))
        _observed.pop((namespace, name), None)
    else:
        _known.add((namespace, name))


def _resync_once(k: Kube) -> None:
    for namespace, name in sorted(_known):
        body = k.get_inference_service(namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            continue
        try:
            reconcile(body, announce=False)
        except kopf.PermanentError:
            continue  # already reported when the spec changed; the resync must not repeat the event
        except kopf.TemporaryError as exc:
            logger.warning(f"[{namespace}/{name}] Resync will retry: {exc}")
            continue
        except Exception:
            logger.exception(f"[{namespace}/{name}] Resync failed with an exception")
            continue
        logger.info(f"[{namespace}/{name}] Resync succeeded")


def schedule_resync(interval: float) -> None:
    """Reconciles every InferenceService again each `interval` seconds (the CLI's --resync-seconds).

    A thread rather than a kopf timer: kopf puts a finalizer on every object a timer runs for, and a
    finalizer makes deletion hang whenever the operator is down.
    """
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval):
            try:
                _resync_once(kube())
            except Exception:
                logger.exception("Resync failed with an exception")

    @kopf.on.startup()
    def start_resync(**_) -> None:
        threading.Thread(target=loop, name="resync", daemon=True).start()

    @kopf.on.cleanup()
    def stop_resync(**_) -> None:
        stop.set()


@kopf.on.event("apps", "v1", "deployments", labels={LABEL_ISVC: kopf.PRESENT})
def deployment_changed(namespace, labels, **_) -> None:
    refresh_status(kube(), namespace, labels[LABEL_ISVC])


@kopf.on.event(LWS_GROUP, LWS_VERSION, LWS_PLURAL, labels={LABEL_ISVC: kopf.PRESENT})
def leader_worker_set_changed(namespace, labels, **_) -> None:
    """Ready groups; kopf watches the kind once its CRD exists."""
    refresh_status(kube(), namespace, labels[LABEL_ISVC])


@kopf.on.event("v1", "pods", labels={LABEL_ISVC: kopf.PRESENT})
def pod_changed(namespace, labels, **_) -> None:
    refresh_status(kube(), namespace, labels[LABEL_ISVC])


def _cache_users(k: Kube, namespace: str, key: str) -> list[str]:
    users = []
    for item in k.request("GET", f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}").get("items", []):
        try:
            ref = model_cache.job_ref(_parse(item))
        except (ValidationError, ValueError):
            continue
        if ref is not None and ref.key == key:
            users.append(item["metadata"]["name"])
    return users


@kopf.on.event("batch", "v1", "jobs", labels={LABEL_MODEL_CACHE: kopf.PRESENT})
def cache_job_changed(namespace, labels, **_) -> None:
    """A download or sizing Job started, finished or failed: every InferenceService using it shows it."""
    k = kube()
    for name in _cache_users(k, namespace, labels[LABEL_MODEL_CACHE]):
        refresh_status(k, namespace, name)


_CACHE_PROGRESS_STOP = threading.Event()


def _refresh_downloading(k: Kube) -> None:
    """The Job changes only when a download ends; its progress is in its log, read this often."""
    for namespace, name in sorted(_known):
        body = k.get_inference_service(namespace, name)
        cache = ((body or {}).get("status") or {}).get("modelCache") or {}
        if cache.get("phase") in ("Pending", "Downloading", "Sizing"):
            refresh_status(k, namespace, name)


@kopf.on.startup()
def start_cache_progress(**_) -> None:
    def loop() -> None:
        while not _CACHE_PROGRESS_STOP.wait(CACHE_PROGRESS_SECONDS):
            try:
                _refresh_downloading(kube())
            except Exception:
                logger.exception("Refreshing model cache progress failed with an exception")

    threading.Thread(target=loop, name="cache-progress", daemon=True).start()


@kopf.on.cleanup()
def stop_cache_progress(**_) -> None:
    _CACHE_PROGRESS_STOP.set()
