"""What runs again and again between cluster events: the resync, which reconciles every
InferenceService to correct drift on its children, and the refresh of model downloads' progress.

Both visit the InferenceServices that kopf's scope lets the operator see (`remember`). They run as
threads rather than kopf timers: kopf puts a finalizer on every object a timer runs for, and a
finalizer makes deletion hang whenever the operator is down.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import kopf

from pagoda_operator import adapter_cluster, status_refresh
from pagoda_operator.kube import Kube, kube
from pagoda_operator.reconcile import reconcile

logger = logging.getLogger(__name__)

# How often the status of an InferenceService whose model downloads shows the download's progress.
CACHE_PROGRESS_SECONDS = 15.0

_known: set[tuple[str, str]] = set()
_UNDER_WAY = ("Pending", "Downloading", "Sizing")  # cache phases whose status the refresh follows


def remember(event_type: str, namespace: str, name: str) -> None:
    """Keeps the set of InferenceServices the resync visits: those kopf's scope lets us see."""
    if event_type == "DELETED":
        _known.discard((namespace, name))
        status_refresh.forget(namespace, name)
        adapter_cluster.forget(namespace, name)
    else:
        _known.add((namespace, name))


def resync_once(k: Kube) -> None:
    for namespace, name in sorted(_known):
        body = k.get_inference_service(namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            continue
        try:
            reconcile(k, body, announce=False)
        except kopf.PermanentError:
            continue  # already reported when the spec changed; the resync must not repeat the event
        except kopf.TemporaryError as exc:
            logger.warning(f"[{namespace}/{name}] Resync will retry: {exc}")
            continue
        except Exception:
            logger.exception(f"[{namespace}/{name}] Resync failed with an exception")
            continue
        logger.info(f"[{namespace}/{name}] Resync succeeded")


def refresh_downloading(k: Kube) -> None:
    """The Job changes only when a download ends; its progress is in its log, read this often."""
    for namespace, name in sorted(_known):
        body = k.get_inference_service(namespace, name)
        status = (body or {}).get("status") or {}
        cache = status.get("modelCache") or {}
        # Ready's reason covers a draft model's cache too, which status.modelCache does not show.
        ready = next((c for c in status.get("conditions", []) if c.get("type") == "Ready"), {})
        if cache.get("phase") in _UNDER_WAY or ready.get("reason") in {f"ModelCache{p}" for p in _UNDER_WAY}:
            status_refresh.refresh_status(k, namespace, name)


def sync_unsettled_adapters(k: Kube) -> None:
    """Adapters still downloading or loading: the copy's progress, and pods that did not answer."""
    for namespace, name in sorted(_known):
        body = k.get_inference_service(namespace, name)
        if body is not None and adapter_cluster.unsettled(body.get("status")):
            adapter_cluster.sync_by_name(k, namespace, name)
            status_refresh.refresh_status(k, namespace, name)


def repeat(step: Callable[[Kube], None], interval: float, stop: threading.Event, failure: str) -> None:
    """Runs `step` each `interval` seconds until `stop` is set; a failure is logged, never fatal."""
    while not stop.wait(interval):
        try:
            step(kube())
        except Exception:
            logger.exception(failure)
