"""Writing an InferenceService's status: recomputed from the stored object and its children by the
pure status.py, patched only when it changed, with an Event when something a user must act on
starts, changes or ends."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import UTC, datetime

import kopf
from kubernetes.client import ApiException
from pydantic import ValidationError

from pagoda_operator import adapter_cluster, metrics
from pagoda_operator.http_route import HTTP_ROUTE_API
from pagoda_operator.inference_service import ids, parse, plan_with_cache
from pagoda_operator.kube import Kube, being_deleted, owned, workload_kinds
from pagoda_operator.model_cache_cluster import read_cache_status, read_draft_cache_statuses
from pagoda_operator.models import InferenceServiceStatus
from pagoda_operator.names import child_selector
from pagoda_operator.retire import TIME_FORMAT
from pagoda_operator.status import compute_status, invalid_status, status_changed, status_patch


@dataclass(frozen=True)
class Observed:
    """What the last reconcile found that the cluster's objects alone do not show."""

    clashes: tuple[str, ...] = ()
    retiring: dict | None = None
    upgrade_queued: tuple[str, ...] = ()  # workloads whose operator upgrade waits its turn


_observed: dict[tuple[str, str], Observed] = {}
# The spec handler, the resync and Deployment and Pod events may refresh one object's status at
# once; each must see the others' writes, or a transition (and its Warning) is reported twice.
_STATUS_LOCKS = [threading.Lock() for _ in range(64)]


def observe(namespace: str, name: str, observed: Observed) -> None:
    _observed[(namespace, name)] = observed


def forget(namespace: str, name: str) -> None:
    _observed.pop((namespace, name), None)


def _now() -> str:
    return datetime.now(UTC).strftime(TIME_FORMAT)


def refresh_status(k: Kube, namespace: str, name: str) -> None:
    """Recomputes the status from the stored object, so that it compares with the latest write."""
    with _STATUS_LOCKS[hash((namespace, name)) % len(_STATUS_LOCKS)]:
        body = k.get_inference_service(namespace, name)
        if body is None:
            return
        try:
            spec = parse(body)
        except (ValidationError, ValueError):
            return  # the spec handler reports it
        cache = read_cache_status(k, spec, namespace)
        drafts = read_draft_cache_statuses(k, spec, namespace)
        plan = plan_with_cache(spec, cache, drafts)
        _, _, uid, generation = ids(body)
        selector = child_selector(name)
        observed = _observed.get((namespace, name), Observed())
        previous = dict(body.get("status") or {})
        gateway_api = spec.route is not None and k.has_api(*HTTP_ROUTE_API)
        route = k.get("HTTPRoute", namespace, name) if gateway_api else None
        status = compute_status(
            plan,
            namespace=namespace,
            name=name,
            generation=generation,
            deployments=[
                w for kind in workload_kinds(k) for w in k.list(kind, namespace, selector) if owned(w, uid)
            ],
            pods=k.list("Pod", namespace, selector),
            hpas=[h for h in k.list("HorizontalPodAutoscaler", namespace, selector) if owned(h, uid)],
            clashes=list(observed.clashes),
            retiring=observed.retiring,
            upgrade_queued=list(observed.upgrade_queued),
            previous=previous,
            now=_now(),
            cache=cache,
            draft_caches=drafts,
            adapters=adapter_cluster.variant_adapters(spec, namespace, name),
            route=route if route is not None and owned(route, uid) else None,
            gateway_api=gateway_api,
        )
        new = status_patch(status)
        if not status_changed(previous, new):
            return
        try:
            k.patch_status(namespace, name, new)
        except ApiException as exc:
            if exc.status == 404:
                return  # deleted since it was read
            raise
        metrics.STATUS_WRITES.inc()
        _announce_transitions(k, body, previous, status)


def _announce_transitions(k: Kube, body, previous: dict, new: InferenceServiceStatus) -> None:
    """Events on the InferenceService when what a user must act on starts, changes or ends."""
    was = {c["type"]: c for c in previous.get("conditions", [])}
    now = {c.type: c for c in new.conditions}
    fits, fitted = now["ModelFits"], was.get("ModelFits", {})
    if fits.status == "False" and fitted.get("status") != "False":
        k.post_event(body, "Warning", "ModelDoesNotFit", fits.message)
    degraded, before = now["Degraded"], was.get("Degraded", {})
    if degraded.status == "True" and (before.get("status"), before.get("reason")) != (
        "True",
        degraded.reason,
    ):
        k.post_event(body, "Warning", degraded.reason, degraded.message)
    elif degraded.status == "False" and before.get("status") == "True":
        k.post_event(body, "Normal", "Recovered", "no child reports a failure any more")


def report_invalid(k: Kube, body, reason: str, message: str, *, announce: bool) -> None:
    """The status of an InferenceService the operator cannot act on, and a Warning when `announce`."""
    namespace, name, _, generation = ids(body)
    previous = dict(body.get("status") or {})
    new = status_patch(
        invalid_status(previous, reason=reason, message=message, generation=generation, now=_now())
    )
    if status_changed(previous, new):
        try:
            k.patch_status(namespace, name, new)
        except ApiException as exc:
            if not being_deleted(exc):
                raise
            return
    if announce:
        kopf.warn(body, reason=reason, message=message)
