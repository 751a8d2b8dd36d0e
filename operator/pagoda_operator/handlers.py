"""kopf handlers: thin glue from cluster events to render (what should exist) and status (what does).

Every path ends in the same reconcile: render, server-side apply (unchanged objects are not
written), prune children that should no longer exist, recompute the status and patch it only
when it changed. A timer repeats it, which corrects drift on the children; events of our
Deployments and Pods refresh the status between timer ticks.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

import kopf
from kubernetes.client import ApiException
from pydantic import ValidationError

from pagoda_operator import metrics
from pagoda_operator.kube import CHILD_KINDS, SERVICE_MONITOR_API, Kube, load_credentials
from pagoda_operator.models import GROUP, PLURAL, VERSION, InferenceServiceSpec
from pagoda_operator.render import LABEL_ISVC, RenderOptions, render
from pagoda_operator.status import compute_status, status_changed

RESYNC_SECONDS = 30
_kube: Kube | None = None


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


def _report_invalid(k: Kube, body, message: str, *, announce: bool) -> None:
    namespace, name, _, generation = _ids(body)
    previous = dict(body.get("status") or {})
    ready = {
        "type": "Ready",
        "status": "False",
        "reason": "InvalidSpec",
        "message": message,
        "observedGeneration": generation,
    }
    others = [c for c in previous.get("conditions", []) if c.get("type") != "Ready"]
    old_ready = next((c for c in previous.get("conditions", []) if c.get("type") == "Ready"), {})
    ready["lastTransitionTime"] = (
        old_ready.get("lastTransitionTime") if old_ready.get("status") == "False" else _now()
    )
    new = {"conditions": [ready, *others], "observedGeneration": generation}
    if status_changed(previous, new):
        k.patch_status(namespace, name, new)
    if announce:
        kopf.warn(body, reason="InvalidSpec", message=message)


def refresh_status(k: Kube, body, spec: InferenceServiceSpec) -> None:
    namespace, name, _, generation = _ids(body)
    selector = f"{LABEL_ISVC}={name}"
    previous = dict(body.get("status") or {})
    new = compute_status(
        spec,
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
    k.patch_status(namespace, name, new)
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
        for child in k.list(kind, namespace, f"{LABEL_ISVC}={name}"):
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
        spec = _parse(body)
        service_monitor = k.has_api(*SERVICE_MONITOR_API)
        manifests = render(
            spec,
            namespace=namespace,
            name=name,
            uid=uid,
            options=RenderOptions(service_monitor=service_monitor),
        )
    except (ValidationError, ValueError) as exc:
        metrics.RECONCILES.labels(result="invalid").inc()
        _report_invalid(k, body, _error_text(exc), announce=announce)
        raise kopf.PermanentError(f"invalid spec: {_error_text(exc)}") from exc
    try:
        for manifest in manifests:
            k.apply(manifest)
        kinds = [kind for kind in CHILD_KINDS if kind != "ServiceMonitor" or service_monitor]
        _prune(k, body, manifests, kinds)
        refresh_status(k, body, spec)
    except ApiException as exc:
        metrics.RECONCILES.labels(result="error").inc()
        if exc.status in (0, 409, 429) or exc.status >= 500:
            raise kopf.TemporaryError(
                f"Kubernetes API error {exc.status} {exc.reason}; retrying", delay=10
            ) from exc
        message = f"the API refused a child object ({exc.status} {exc.reason}): {exc.body}"
        _report_invalid(k, body, message, announce=announce)
        raise kopf.PermanentError(message) from exc
    metrics.RECONCILES.labels(result="ok").inc()
    metrics.RECONCILE_SECONDS.observe(time.monotonic() - started)


@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
@kopf.on.resume(GROUP, VERSION, PLURAL)
def on_spec(body, **_) -> None:
    reconcile(body, announce=True)


@kopf.timer(GROUP, VERSION, PLURAL, interval=RESYNC_SECONDS, initial_delay=RESYNC_SECONDS)
def resync(body, **_) -> None:
    try:
        reconcile(body, announce=False)
    except kopf.PermanentError:
        # Already reported when the spec changed; the timer must not repeat the event.
        return


def _refresh_owner(namespace: str, labels) -> None:
    k = kube()
    parent = k.get_inference_service(namespace, labels[LABEL_ISVC])
    if parent is None:
        return
    try:
        spec = _parse(parent)
    except (ValidationError, ValueError):
        return
    refresh_status(k, parent, spec)


@kopf.on.event("apps", "v1", "deployments", labels={LABEL_ISVC: kopf.PRESENT})
def deployment_changed(namespace, labels, **_) -> None:
    _refresh_owner(namespace, labels)


@kopf.on.event("v1", "pods", labels={LABEL_ISVC: kopf.PRESENT})
def pod_changed(namespace, labels, **_) -> None:
    _refresh_owner(namespace, labels)
