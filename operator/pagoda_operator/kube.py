"""The few Kubernetes API calls the operator makes, as plain JSON over the kubernetes client.

Plain dicts rather than the client's typed models: server-side apply sends exactly the rendered
manifest, and responses from a newer apiserver never fail to parse.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

from kubernetes import client, config

from pagoda_operator.http_route import GATEWAY_GROUP, GATEWAY_VERSION, HTTP_ROUTE_API
from pagoda_operator.leader_worker_set import LWS_GROUP, LWS_PLURAL, LWS_VERSION
from pagoda_operator.models import GROUP, PLURAL, VERSION
from pagoda_operator.names import WORKLOAD_KINDS
from pagoda_operator.scaled_object import KEDA_GROUP, KEDA_VERSION, SCALED_OBJECT_API

logger = logging.getLogger(__name__)

FIELD_MANAGER = "pagoda-operator"
# Owns only a Deployment's spec.replicas, apart from everything else: see replicas.py.
REPLICAS_FIELD_MANAGER = "pagoda-operator-replicas"

# kind → (API prefix, plural) of every child kind the operator manages.
CHILD_KINDS: dict[str, tuple[str, str]] = {
    "Deployment": ("/apis/apps/v1", "deployments"),
    "LeaderWorkerSet": (f"/apis/{LWS_GROUP}/{LWS_VERSION}", LWS_PLURAL),
    "Service": ("/api/v1", "services"),
    "HorizontalPodAutoscaler": ("/apis/autoscaling/v2", "horizontalpodautoscalers"),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets"),
    "NetworkPolicy": ("/apis/networking.k8s.io/v1", "networkpolicies"),
    "ServiceMonitor": ("/apis/monitoring.coreos.com/v1", "servicemonitors"),
    "HTTPRoute": (f"/apis/{GATEWAY_GROUP}/{GATEWAY_VERSION}", HTTP_ROUTE_API[2]),
    "ScaledObject": (f"/apis/{KEDA_GROUP}/{KEDA_VERSION}", SCALED_OBJECT_API[2]),
}
# kind → (API prefix, plural) of the objects shared between InferenceServices (the model cache).
SHARED_KINDS: dict[str, tuple[str, str]] = {
    "PersistentVolumeClaim": ("/api/v1", "persistentvolumeclaims"),
    "Job": ("/apis/batch/v1", "jobs"),
}
# kind → (API prefix, plural) of the objects the operator only reads.
READ_KINDS: dict[str, tuple[str, str]] = {"Pod": ("/api/v1", "pods"), "Secret": ("/api/v1", "secrets")}
SERVICE_MONITOR_API = ("monitoring.coreos.com", "v1", "servicemonitors")
LEADER_WORKER_SET_API = (LWS_GROUP, LWS_VERSION, LWS_PLURAL)
# The child kinds that exist only where their CRDs are installed, and the API that tells.
OPTIONAL_KINDS = {
    "ServiceMonitor": SERVICE_MONITOR_API,
    "LeaderWorkerSet": LEADER_WORKER_SET_API,
    "HTTPRoute": HTTP_ROUTE_API,
    "ScaledObject": SCALED_OBJECT_API,
}


def load_credentials() -> None:
    """In-cluster credentials in a pod, the kubeconfig elsewhere."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()


def owned(obj: dict, uid: str) -> bool:
    """Whether the object with this uid is the controller of `obj`."""
    return any(
        ref.get("uid") == uid and ref.get("controller") for ref in obj["metadata"].get("ownerReferences", [])
    )


def api_message(exc: client.ApiException) -> str:
    """The apiserver's own sentence from its Status body (which object, what is wrong), else the body."""
    try:
        return json.loads(exc.body)["message"]
    except (TypeError, ValueError, KeyError):
        return str(exc.body)


def being_deleted(exc: client.ApiException) -> bool:
    """The object or its namespace is gone, or the namespace refuses new objects while it terminates."""
    return exc.status == 404 or (exc.status == 403 and "NamespaceTerminating" in str(exc.body))


class Kube:
    def __init__(self, api_client: client.ApiClient | None = None):
        self.api = api_client or client.ApiClient()

    def request(
        self,
        method: str,
        path: str,
        *,
        query: list | None = None,
        body=None,
        content_type: str = "application/json",
    ) -> dict:
        method, url, headers, body, _ = self.api.param_serialize(
            method,
            path,
            query_params=query or [],
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self.api.call_api(method, url, headers, body)
        data = response.read()
        if not 200 <= response.status < 300:
            raise client.ApiException(status=response.status, reason=response.reason, body=data.decode())
        return json.loads(data) if data else {}

    def _path(self, kind: str, namespace: str, name: str = "") -> str:
        prefix, plural = (CHILD_KINDS | SHARED_KINDS | READ_KINDS)[kind]
        return f"{prefix}/namespaces/{namespace}/{plural}" + (f"/{name}" if name else "")

    def apply(self, manifest: dict, *, force: bool, manager: str = FIELD_MANAGER) -> dict:
        """Server-side apply; `force` takes fields over from other managers, so only for our own objects."""
        meta = manifest["metadata"]
        query = [("fieldManager", manager)] + ([("force", "true")] if force else [])
        return self.request(
            "PATCH",
            self._path(manifest["kind"], meta["namespace"], meta["name"]),
            query=query,
            body=manifest,
            content_type="application/apply-patch+yaml",
        )

    def get(self, kind: str, namespace: str, name: str) -> dict | None:
        try:
            return self.request("GET", self._path(kind, namespace, name))
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def post_event(self, owner: dict, type_: str, reason: str, message: str) -> None:
        """A Normal or Warning event on the InferenceService, which `kubectl describe` shows."""
        meta = owner["metadata"]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": owner.get("apiVersion", f"{GROUP}/{VERSION}"),
                "kind": owner.get("kind", "InferenceService"),
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": FIELD_MANAGER},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self.request("POST", f"/api/v1/namespaces/{meta['namespace']}/events", body=event)
        except client.ApiException as exc:
            # As kopf does with its own events: a namespace being deleted refuses them, and an event
            # lost must not fail the reconcile it reports on.
            logger.warning(f"[{meta['namespace']}/{meta['name']}] event {reason} not posted: {exc.reason}")

    def list(self, kind: str, namespace: str, label_selector: str) -> list[dict]:
        found = self.request("GET", self._path(kind, namespace), query=[("labelSelector", label_selector)])
        return found.get("items", [])

    def list_all(self, kind: str, label_selector: str) -> list[dict]:
        """Objects of `kind` in every namespace, each with its kind (a list's items carry none)."""
        prefix, plural = CHILD_KINDS[kind]
        found = self.request("GET", f"{prefix}/{plural}", query=[("labelSelector", label_selector)])
        return [{**item, "kind": kind} for item in found.get("items", [])]

    def delete(self, kind: str, namespace: str, name: str) -> None:
        try:
            self.request(
                "DELETE",
                self._path(kind, namespace, name),
                body={"propagationPolicy": "Background"},
            )
        except client.ApiException as exc:
            if exc.status != 404:
                raise

    def create_if_absent(self, manifest: dict) -> None:
        """Creates an object the operator shares between InferenceServices and never updates."""
        try:
            self.request(
                "POST", self._path(manifest["kind"], manifest["metadata"]["namespace"]), body=manifest
            )
        except client.ApiException as exc:
            if exc.status != 409:
                raise

    def log_tail(self, namespace: str, pod: str, container: str, lines: int = 5) -> str:
        """The last lines of a container's log; "" while it has none (a log that cannot be read only
        delays the progress figure, so it is not an error)."""
        method, url, headers, body, _ = self.api.param_serialize(
            "GET",
            f"/api/v1/namespaces/{namespace}/pods/{pod}/log",
            query_params=[("container", container), ("tailLines", lines)],
            header_params={"Accept": "text/plain"},
            auth_settings=["BearerToken"],
        )
        response = self.api.call_api(method, url, headers, body)
        data = response.read()
        return data.decode(errors="replace") if 200 <= response.status < 300 else ""

    def get_inference_service(self, namespace: str, name: str) -> dict | None:
        try:
            return self.request("GET", f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}")
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def patch_status(self, namespace: str, name: str, status: dict) -> None:
        self.request(
            "PATCH",
            f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}/status",
            query=[("fieldManager", FIELD_MANAGER)],
            body={"status": status},
            content_type="application/merge-patch+json",
        )

    def has_api(self, group: str, version: str, plural: str) -> bool:
        try:
            resources = self.request("GET", f"/apis/{group}/{version}")
        except client.ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return any(r.get("name") == plural for r in resources.get("resources", []))

    def ensure_peering(self, name: str, namespace: str | None = None) -> None:
        """Creates kopf's peering object through which replicas elect the active one: the
        ClusterKopfPeering `name`, or with a namespace the KopfPeering `name` in it."""
        if namespace:
            kind, path = "KopfPeering", f"/apis/kopf.dev/v1/namespaces/{namespace}/kopfpeerings"
            metadata = {"name": name, "namespace": namespace}
        else:
            kind, path = "ClusterKopfPeering", "/apis/kopf.dev/v1/clusterkopfpeerings"
            metadata = {"name": name}
        try:
            self.request("POST", path, body={"apiVersion": "kopf.dev/v1", "kind": kind, "metadata": metadata})
        except client.ApiException as exc:
            if exc.status != 409:
                raise


_kube: Kube | None = None


def kube() -> Kube:
    """The operator process's one client, created with the credentials on first use."""
    global _kube
    if _kube is None:
        load_credentials()
        _kube = Kube()
    return _kube


def workload_kinds(k: Kube) -> list[str]:
    """Deployment, and LeaderWorkerSet where its CRD is installed (listing it elsewhere is a 404)."""
    return [kind for kind in WORKLOAD_KINDS if kind != "LeaderWorkerSet" or k.has_api(*LEADER_WORKER_SET_API)]
