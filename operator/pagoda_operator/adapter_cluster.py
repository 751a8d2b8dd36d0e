"""The adapters in the cluster: creating the adapter cache's claim and Jobs, reading the Jobs' state,
and bringing every ready pod to the declared adapters. What those objects and answers mean is
adapter_cache.py's and adapter_loading.py's (pure); this module makes the calls and remembers, per
InferenceService, what the last sync found, which the status shows (status_refresh.py)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from pydantic import ValidationError

from pagoda_operator import adapter_cache, adapter_loading, runtime_api_key
from pagoda_operator.adapter_cache import AdapterDownload
from pagoda_operator.adapter_loading import PodAdapters, PodMemory
from pagoda_operator.inference_service import namespace_services, parse
from pagoda_operator.kube import Kube
from pagoda_operator.leader_worker_set import LABEL_WORKER_INDEX
from pagoda_operator.model_cache import DOWNLOAD_CONTAINER, JobPlacement
from pagoda_operator.models import AdapterStatus, InferenceServiceSpec
from pagoda_operator.names import LABEL_VARIANT, PORT, child_selector
from pagoda_operator.render import POD_SECURITY, pod_tolerations


@dataclass(frozen=True)
class AdapterObservation:
    """What the last sync of one InferenceService found."""

    downloads: dict[str, AdapterDownload] = field(default_factory=dict)
    pods: dict[str, list[PodAdapters]] = field(default_factory=dict)  # by variant: its ready pods
    blocked: str | None = None  # why the pods could not be called at all


_seen: dict[tuple[str, str], AdapterObservation] = {}
# By InferenceService, then by pod uid: forgotten when the pod is gone.
_memory: dict[tuple[str, str], dict[str, PodMemory]] = {}
_LOCKS = [threading.Lock() for _ in range(64)]
PODS_AT_ONCE = 16


def read_downloads(k: Kube, spec: InferenceServiceSpec, namespace: str) -> dict[str, AdapterDownload]:
    downloads = {}
    for adapter in spec.adapters:
        ref = adapter_cache.adapter_ref(adapter)
        job = k.get("Job", namespace, ref.name)
        pods = k.list("Pod", namespace, f"job-name={ref.name}") if job is not None else []
        running = [p for p in pods if p.get("status", {}).get("phase") == "Running"]
        log_tail = (
            k.log_tail(namespace, running[0]["metadata"]["name"], DOWNLOAD_CONTAINER) if running else ""
        )
        downloads[adapter.name] = adapter_cache.download_status(adapter, job, pods, log_tail)
    return downloads


def ensure_adapter_cache(k: Kube, spec: InferenceServiceSpec, namespace: str) -> None:
    """Creates the claim and each adapter's Job unless they exist. `spec`: with its runtime image
    resolved (render.with_runtime_image)."""
    placement = JobPlacement(POD_SECURITY, pod_tolerations(spec))
    for shared in adapter_cache.cache_manifests(spec, namespace, placement):
        k.create_if_absent(shared)


def ready_serving_pod(pod: dict) -> bool:
    """A ready pod that serves HTTP (not a LeaderWorkerSet worker): one the adapters are loaded into."""
    return _ready(pod) and _serving(pod)


def _ready(pod: dict) -> bool:
    status = pod.get("status", {})
    return bool(status.get("podIP")) and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", [])
    )


def _serving(pod: dict) -> bool:
    """A pod that serves HTTP: every pod of a Deployment, a LeaderWorkerSet group's leader."""
    return pod["metadata"].get("labels", {}).get(LABEL_WORKER_INDEX, "0") == "0"


def sync_adapters(k: Kube, spec: InferenceServiceSpec, namespace: str, name: str) -> None:
    """Brings each ready pod of the InferenceService to the declared adapters, and remembers what it
    found for the status."""
    with _LOCKS[hash((namespace, name)) % len(_LOCKS)]:
        if not spec.lora_enabled:
            forget(namespace, name)
            return
        downloads = read_downloads(k, spec, namespace)
        paths = {a.name: adapter_cache.replica_path(a) for a in spec.adapters}
        wanted = adapter_loading.wanted_adapters(spec, downloads, paths)
        by_variant: dict[str, list[PodAdapters]] = {v.name: [] for v in spec.variants}
        try:
            api_key = runtime_api_key.read_api_key(k, spec, namespace)
        except runtime_api_key.KeyUnavailable as exc:
            _seen[(namespace, name)] = AdapterObservation(downloads, by_variant, blocked=str(exc))
            return
        every_pod = k.list("Pod", namespace, child_selector(name))
        memories = {
            uid: memory
            for uid, memory in _memory.get((namespace, name), {}).items()
            if any(p["metadata"]["uid"] == uid for p in every_pod)
        }
        _memory[(namespace, name)] = memories
        pods = [
            p
            for p in sorted(every_pod, key=lambda p: p["metadata"]["name"])
            if ready_serving_pod(p) and p["metadata"].get("labels", {}).get(LABEL_VARIANT) in by_variant
        ]

        for pod in pods:
            memories.setdefault(pod["metadata"]["uid"], PodMemory())

        def sync(pod: dict) -> PodAdapters:
            memory = memories[pod["metadata"]["uid"]]
            base_url = f"http://{pod['status']['podIP']}:{PORT}"
            return adapter_loading.sync_pod(
                pod["metadata"]["name"], base_url, wanted, memory, paths.keys(), api_key
            )

        # At once: a pod that does not answer costs its timeout, not every other pod's wait too.
        with ThreadPoolExecutor(max_workers=PODS_AT_ONCE) as pool:
            for pod, found in zip(pods, pool.map(sync, pods), strict=True):
                by_variant[pod["metadata"]["labels"][LABEL_VARIANT]].append(found)
        _seen[(namespace, name)] = AdapterObservation(downloads, by_variant)


def sync_by_name(k: Kube, namespace: str, name: str) -> None:
    """sync_adapters for the InferenceService as stored now; one whose spec is invalid is left alone
    (its spec handler reports it)."""
    body = k.get_inference_service(namespace, name)
    if body is None or body["metadata"].get("deletionTimestamp"):
        return
    try:
        spec = parse(body)
    except (ValidationError, ValueError):
        return
    sync_adapters(k, spec, namespace, name)


def unsettled(status: dict | None) -> bool:
    """Whether a stored status shows an adapter not yet loaded everywhere (or not yet looked at)."""
    variants = (status or {}).get("variants") or []
    return any(
        a.get("state") in ("Downloading", "Loading") for v in variants for a in v.get("adapters") or []
    )


def variant_adapters(spec: InferenceServiceSpec, namespace: str, name: str) -> dict[str, list[AdapterStatus]]:
    """Each variant's adapters as the last sync found them (none before the first)."""
    seen = _seen.get((namespace, name))
    if seen is None or not spec.adapters:
        return {}
    return {
        variant: adapter_loading.adapter_statuses(spec, seen.downloads, pods, seen.blocked)
        for variant, pods in seen.pods.items()
    }


def forget(namespace: str, name: str) -> None:
    _seen.pop((namespace, name), None)
    _memory.pop((namespace, name), None)


def adapter_users(k: Kube, namespace: str, key: str) -> list[tuple[str, InferenceServiceSpec]]:
    """The InferenceServices of the namespace that declare the adapter revision `key`."""
    return [
        (name, spec)
        for name, spec in namespace_services(k, namespace)
        if any(adapter_cache.adapter_ref(a).key == key for a in spec.adapters)
    ]
