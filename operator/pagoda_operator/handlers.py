"""kopf handlers: thin glue from cluster events to the reconcile (reconcile.py), the status
refresh (status_refresh.py) and the periodic work (resync.py).

A resync thread repeats the reconcile (`schedule_resync`), which corrects drift on the children;
events of our Deployments, LeaderWorkerSets, HTTPRoutes, Pods and model cache Jobs refresh the status between
resyncs. No handler needs a finalizer (the periodic work runs as threads for that reason, see
resync.py): deleting an InferenceService, its namespace or the whole install works while the
operator is down, and the garbage collector removes the children by their owner.
"""

from __future__ import annotations

import logging
import threading

import kopf

from pagoda_operator import adapter_cluster, model_cache_cluster, peering, resync
from pagoda_operator import settings as operator_settings
from pagoda_operator.http_route import GATEWAY_GROUP, GATEWAY_VERSION, HTTP_ROUTE_API
from pagoda_operator.kube import kube
from pagoda_operator.leader_worker_set import LWS_GROUP, LWS_PLURAL, LWS_VERSION
from pagoda_operator.models import GROUP, PLURAL, VERSION
from pagoda_operator.names import LABEL_ADAPTER_CACHE, LABEL_ISVC, LABEL_MODEL_CACHE
from pagoda_operator.reconcile import reconcile
from pagoda_operator.status_refresh import refresh_status

# Ends the thread that creates kopf's namespaced peering objects (peering.py).
_stop_peering = threading.Event()


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
    if not settings.peering.standalone:
        peering.start(kube(), settings.peering.name, operator_settings.current().namespaces, _stop_peering)
    kube()


@kopf.on.cleanup()
def stop_peering(**_) -> None:
    _stop_peering.set()


@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
@kopf.on.resume(GROUP, VERSION, PLURAL)
def on_spec(body, **_) -> None:
    reconcile(kube(), body, announce=True)


@kopf.on.event(GROUP, VERSION, PLURAL)
def remember(type, namespace, name, **_) -> None:
    resync.remember(type, namespace, name)


def schedule_resync(interval: float) -> None:
    """Reconciles every InferenceService again each `interval` seconds (the CLI's --resync-seconds)."""
    stop = threading.Event()

    @kopf.on.startup()
    def start_resync(**_) -> None:
        args = (resync.resync_once, interval, stop, "Resync failed with an exception")
        threading.Thread(target=resync.repeat, args=args, name="resync", daemon=True).start()

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


@kopf.on.event(GATEWAY_GROUP, GATEWAY_VERSION, HTTP_ROUTE_API[2], labels={LABEL_ISVC: kopf.PRESENT})
def http_route_changed(namespace, labels, **_) -> None:
    """The Gateway accepted the route or resolved its backends; kopf watches the kind once its CRD
    exists."""
    refresh_status(kube(), namespace, labels[LABEL_ISVC])


@kopf.on.event("v1", "pods", labels={LABEL_ISVC: kopf.PRESENT})
def pod_changed(namespace, labels, body, **_) -> None:
    """A pod that became ready gets the declared adapters before the status is recomputed."""
    k = kube()
    if adapter_cluster.ready_serving_pod(body):
        adapter_cluster.sync_by_name(k, namespace, labels[LABEL_ISVC])
    refresh_status(k, namespace, labels[LABEL_ISVC])


@kopf.on.event("batch", "v1", "jobs", labels={LABEL_MODEL_CACHE: kopf.PRESENT})
def cache_job_changed(namespace, labels, **_) -> None:
    """A download or sizing Job started, finished or failed: every InferenceService using it shows it."""
    k = kube()
    for name in model_cache_cluster.cache_users(k, namespace, labels[LABEL_MODEL_CACHE]):
        refresh_status(k, namespace, name)


@kopf.on.event("batch", "v1", "jobs", labels={LABEL_ADAPTER_CACHE: kopf.PRESENT})
def adapter_job_changed(namespace, labels, **_) -> None:
    """An adapter's copy finished or failed: every InferenceService declaring it loads it or says why."""
    k = kube()
    for name, spec in adapter_cluster.adapter_users(k, namespace, labels[LABEL_ADAPTER_CACHE]):
        adapter_cluster.sync_adapters(k, spec, namespace, name)
        refresh_status(k, namespace, name)


_CACHE_PROGRESS_STOP = threading.Event()


def _repeat_in_background(work, name: str, failure: str) -> None:
    """`work` every CACHE_PROGRESS_SECONDS in a thread of its own until cleanup."""
    args = (work, resync.CACHE_PROGRESS_SECONDS, _CACHE_PROGRESS_STOP, failure)
    threading.Thread(target=resync.repeat, args=args, name=name, daemon=True).start()


@kopf.on.startup()
def start_cache_progress(**_) -> None:
    _repeat_in_background(
        resync.refresh_downloading,
        "cache-progress",
        "Refreshing model cache progress failed with an exception",
    )
    _repeat_in_background(
        resync.sync_unsettled_adapters,
        "adapter-sync",
        "Loading LoRA adapters into pods failed with an exception",
    )


@kopf.on.cleanup()
def stop_cache_progress(**_) -> None:
    _CACHE_PROGRESS_STOP.set()
