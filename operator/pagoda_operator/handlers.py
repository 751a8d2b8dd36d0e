"""kopf handlers: thin glue from cluster events to render (what should exist) and status (what does).

Every path ends in the same reconcile: render, server-side apply (unchanged objects are not
written), prune children that should no longer exist, recompute the status and patch it only
when it changed. A timer repeats it (`schedule_resync`), which corrects drift on the children;
events of our Deployments and Pods refresh the status between timer ticks.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from datetime import UTC, datetime

import kopf
from kubernetes.client import ApiException
from pydantic import ValidationError

from pagoda_operator import metrics
from pagoda_operator.kube import CHILD_KINDS, SERVICE_MONITOR_API, Kube, load_credentials
from pagoda_operator.models import GROUP, PLURAL, VERSION, InferenceServiceSpec
from pagoda_operator.names import LABEL_ISVC, child_selector
from pagoda_operator.plan import plan_service
from pagoda_operator.render import RenderOptions, render
from pagoda_operator.status import compute_status, invalid_status, status_changed

_kube: Kube | None = None
# The spec handler, the timer and Deployment and Pod events may refresh one object's status at
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
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _ids(body) -> tuple[str, str, str, int]:
    meta = body["metadata"]
    return meta["namespace"], meta["name"], meta["uid"], meta.get("generation", 1)


def _parse(body) -> InferenceServiceSpec:
    return InferenceServiceSpec.model_validate(dict(body.get("spec") or {}))


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


def _report_invalid(k: Kube, body, reason: str, message: str, *, announce: bool) -> None:
    namespace, name, _, generation = _ids(body)
    previous = dict(body.get("status") or {})
    new = invalid_status(previous, reason=reason, message=message, generation=generation, now=_now())
    if status_changed(previous, new):
        k.patch_status(namespace, name, new)
    if announce:
        kopf.warn(body, reason=reason, message=message)


def refresh_status(k: Kube, namespace: str, name: str) -> None:
    """Recomputes the status from the stored object, so that it compares with the latest write."""
    with _STATUS_LOCKS[hash((namespace, name)) % len(_STATUS_LOCKS)]:
        body = k.get_inference_service(namespace, name)
        if body is None:
            return
        try:
            plan = plan_service(_parse(body))
        except (ValidationError, ValueError):
            return  # the spec handler reports it
        _, _, _, generation = _ids(body)
        selector = child_selector(name)
        previous = dict(body.get("status") or {})
        new = compute_status(
            plan,
            namespace=namespace,
            name=name,
            generation=generation,
            deployments=k.list("Deployment", namespace, selector),
            pods=k.list("Pod", namespace, selector),
            previous=previous,
            now=_now(),
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
    fits = next(c for c in new["conditions"] if c["type"] == "ModelFits")
    was = next((c for c in previous.get("conditions", []) if c["type"] == "ModelFits"), {})
    if fits["status"] == "False" and was.get("status") != "False":
        kopf.warn(body, reason="ModelDoesNotFit", message=fits["message"])


def _prune(k: Kube, body, manifests: list[dict], kinds: list[str]) -> None:
    """Deletes our children that the render no longer produces: removed or unfitting variants."""
    namespace, name, uid, _ = _ids(body)
    wanted = {(m["kind"], m["metadata"]["name"]) for m in manifests}
    for kind in kinds:
        for child in k.list(kind, namespace, child_selector(name)):
            meta = child["metadata"]
            owned = any(ref.get("uid") == uid for ref in meta.get("ownerReferences", []))
            if owned and (kind, meta["name"]) not in wanted:
                k.delete(kind, namespace, meta["name"])


def reconcile(body, *, announce: bool) -> None:
    """Makes the children match the spec and the status match the children."""
    k = kube()
    namespace, name, uid, _ = _ids(body)
    started = time.monotonic()
    try:
        plan = plan_service(_parse(body))
        service_monitor = k.has_api(*SERVICE_MONITOR_API)
        manifests = render(
            plan,
            namespace=namespace,
            name=name,
            uid=uid,
            options=RenderOptions(service_monitor=service_monitor),
        )
    except (ValidationError, ValueError) as exc:
        metrics.RECONCILES.labels(result="invalid").inc()
        _report_invalid(k, body, "InvalidSpec", _error_text(exc), announce=announce)
        raise kopf.PermanentError(f"invalid spec: {_error_text(exc)}") from exc
    try:
        for manifest in manifests:
            k.apply(manifest)
        kinds = [kind for kind in CHILD_KINDS if kind != "ServiceMonitor" or service_monitor]
        _prune(k, body, manifests, kinds)
        refresh_status(k, namespace, name)
    except ApiException as exc:
        metrics.RECONCILES.labels(result="error").inc()
        if exc.status in (0, 409, 429) or exc.status >= 500:
            raise kopf.TemporaryError(
                f"Kubernetes API error {exc.status} {exc.reason}; retrying", delay=10
            ) from exc
        # Not the spec's fault alone: RBAC, quotas and admission policies refuse children too.
        message = f"the API refused a child object ({exc.status} {exc.reason}): {_api_message(exc)}"
        _report_invalid(k, body, "ChildRejected", message, announce=announce)
        raise kopf.PermanentError(message) from exc
    metrics.RECONCILES.labels(result="ok").inc()
    metrics.RECONCILE_SECONDS.observe(time.monotonic() - started)


@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
@kopf.on.resume(GROUP, VERSION, PLURAL)
def on_spec(body, **_) -> None:
    reconcile(body, announce=True)


def resync(body, **_) -> None:
    try:
        reconcile(body, announce=False)
    except kopf.PermanentError:
        # Already reported when the spec changed; the timer must not repeat the event.
        return


def schedule_resync(interval: float) -> None:
    """Reconciles every InferenceService again each `interval` seconds (the CLI's --resync-seconds)."""
    kopf.timer(GROUP, VERSION, PLURAL, interval=interval, initial_delay=interval)(resync)


@kopf.on.event("apps", "v1", "deployments", labels={LABEL_ISVC: kopf.PRESENT})
def deployment_changed(namespace, labels, **_) -> None:
    refresh_status(kube(), namespace, labels[LABEL_ISVC])


@kopf.on.event("v1", "pods", labels={LABEL_ISVC: kopf.PRESENT})
def pod_changed(namespace, labels, **_) -> None:
    refresh_status(kube(), namespace, labels[LABEL_ISVC])
