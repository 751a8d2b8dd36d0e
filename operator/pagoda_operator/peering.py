"""kopf's peering objects, created by the operator where kopf looks for them.

Replicas of the operator elect one active instance through kopf's peering, on an object that kopf
updates but never creates, and kopf keeps the operator paused while that object is missing. A
cluster-wide operator peers on the ClusterKopfPeering `--peering-name`; one started with
--namespace peers on a KopfPeering of that name in every namespace it watches, and one missing in
any of them pauses all of its work, also when a namespace matching a --namespace glob is created
later. So the operator creates them at start, and those of later namespaces from a thread that
watches namespaces: kopf's own handlers are paused at exactly the moment one is needed.
"""

from __future__ import annotations

import logging
import threading

from kubernetes import client, watch

from pagoda_operator.kube import Kube, api_message, being_deleted
from pagoda_operator.watched_namespaces import watched

logger = logging.getLogger(__name__)

# How long one watch of the namespaces lasts; each new one lists them all again, which also
# recreates a peering object deleted in the meantime.
WATCH_SECONDS = 300
RETRY_SECONDS = 5.0


def start(k: Kube, name: str, namespaces: tuple[str, ...], stop: threading.Event) -> None:
    """The peering objects of an operator watching these --namespace patterns (none: the cluster).

    Those of the namespaces that exist now are there before kopf's first keep-alive; a thread adds
    those of namespaces created later."""
    if not namespaces:
        k.ensure_peering(name)
        return
    listed = client.CoreV1Api(k.api).list_namespace()
    for namespace in listed.items:
        if watched(namespace.metadata.name, namespaces):
            ensure_namespaced(k, name, namespace.metadata.name)
    args = (k, name, namespaces, listed.metadata.resource_version, stop)
    threading.Thread(target=keep_namespaced, args=args, name="peering", daemon=True).start()


def keep_namespaced(
    k: Kube, name: str, namespaces: tuple[str, ...], resource_version: str | None, stop: threading.Event
) -> None:
    """Creates the KopfPeering `name` in each watched namespace that appears after `resource_version`
    (then in each one every WATCH_SECONDS), until `stop` is set."""
    core = client.CoreV1Api(k.api)
    while not stop.is_set():
        try:
            stream = watch.Watch().stream(
                core.list_namespace, resource_version=resource_version, timeout_seconds=WATCH_SECONDS
            )
            for event in stream:
                namespace = event["object"].metadata.name
                if event["type"] == "ADDED" and watched(namespace, namespaces):
                    ensure_namespaced(k, name, namespace)
        except Exception:
            logger.exception("Watching namespaces for kopf's peering objects failed; retrying")
            stop.wait(RETRY_SECONDS)
        # A watch from no version starts with every namespace that exists.
        resource_version = None


def ensure_namespaced(k: Kube, name: str, namespace: str) -> None:
    try:
        k.ensure_peering(name, namespace)
    except client.ApiException as exc:
        if exc.status == 403 and being_deleted(exc):
            return  # a namespace being deleted, which kopf stops watching
        logger.error(
            f"Cannot create kopf's KopfPeering {name!r} in namespace {namespace!r}, without which the "
            f"operator stays paused: {api_message(exc)} (install manifests/kopf-peering-crd.yaml and "
            "the kopfpeerings rule of manifests/rbac.yaml)"
        )
