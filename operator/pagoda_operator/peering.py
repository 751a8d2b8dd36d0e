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
# How long the start waits for the namespaces that exist to have theirs, so that kopf's first
# keep-alive finds them.
FIRST_PASS_SECONDS = 10.0


def start(k: Kube, name: str, namespaces: tuple[str, ...], stop: threading.Event) -> None:
    """The peering objects of an operator watching these --namespace patterns (none: the cluster)."""
    if not namespaces:
        k.ensure_peering(name)
        return
    first_pass = threading.Event()
    args = (k, name, namespaces, stop, first_pass)
    threading.Thread(target=keep_namespaced, args=args, name="peering", daemon=True).start()
    first_pass.wait(FIRST_PASS_SECONDS)


def keep_namespaced(
    k: Kube, name: str, namespaces: tuple[str, ...], stop: threading.Event, first_pass: threading.Event
) -> None:
    """Creates the KopfPeering `name` in each watched namespace, those that exist (then sets
    `first_pass`) and those created later, until `stop` is set; after a failure it tries them all
    again."""
    while not stop.is_set():
        if not _list_and_watch(k, name, namespaces, first_pass):
            stop.wait(RETRY_SECONDS)


def _list_and_watch(k: Kube, name: str, namespaces: tuple[str, ...], first_pass: threading.Event) -> bool:
    """One list of the namespaces and one watch from it; False after a failure."""
    core = client.CoreV1Api(k.api)
    try:
        listed = core.list_namespace()
        existing = [n.metadata.name for n in listed.items if watched(n.metadata.name, namespaces)]
        if not all([ensure_namespaced(k, name, namespace) for namespace in existing]):
            return False
        first_pass.set()
        stream = watch.Watch().stream(
            core.list_namespace,
            resource_version=listed.metadata.resource_version,
            timeout_seconds=WATCH_SECONDS,
            # A connection that silently died must not end the watching for good.
            _request_timeout=WATCH_SECONDS + 30,
        )
        for event in stream:
            namespace = event["object"].metadata.name
            added = event["type"] == "ADDED" and watched(namespace, namespaces)
            if added and not ensure_namespaced(k, name, namespace):
                return False
        return True
    except Exception:
        logger.exception("Watching namespaces for kopf's peering objects failed; retrying")
        return False


def ensure_namespaced(k: Kube, name: str, namespace: str) -> bool:
    """Whether the namespace has its KopfPeering (or needs none: it is being deleted)."""
    try:
        k.ensure_peering(name, namespace)
    except client.ApiException as exc:
        if exc.status == 403 and being_deleted(exc):
            return True  # kopf stops watching a namespace being deleted
        logger.error(
            f"Cannot create kopf's KopfPeering {name!r} in namespace {namespace!r}, without which the "
            f"operator stays paused: {api_message(exc)} (install manifests/kopf-peering-crd.yaml and "
            "the kopfpeerings rule of manifests/rbac.yaml); retrying"
        )
        return False
    return True
