"""The shared model cache in the cluster: creating its claim and Job, reading their state, finding
the InferenceServices that use it. What those objects are and what their state means is
model_cache.py's (pure); this module makes the calls."""

from __future__ import annotations

from pagoda_operator import model_cache
from pagoda_operator.inference_service import namespace_services
from pagoda_operator.kube import Kube
from pagoda_operator.model_cache import CacheStatus
from pagoda_operator.models import InferenceServiceSpec
from pagoda_operator.render import POD_SECURITY, pod_tolerations


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


def ensure_model_cache(k: Kube, spec: InferenceServiceSpec, namespace: str) -> CacheStatus | None:
    """Creates the claim and the download Job unless they exist, and reads their state. Both are
    shared by every user of the model revision: created once by whoever comes first, never updated,
    never owned (deleting a user keeps the data). `spec`: with its runtime image resolved
    (render.with_runtime_image)."""
    placement = model_cache.JobPlacement(POD_SECURITY, pod_tolerations(spec))
    for shared in model_cache.cache_manifests(spec, namespace, placement):
        k.create_if_absent(shared)
    return read_cache_status(k, spec, namespace)


def read_draft_cache_statuses(k: Kube, spec: InferenceServiceSpec, namespace: str) -> dict[str, CacheStatus]:
    """read_cache_status of each variant's draft model that has a cache or sizing Job, by variant."""
    drafts = model_cache.draft_specs(spec).items()
    return {name: status for name, draft in drafts if (status := read_cache_status(k, draft, namespace))}


def ensure_draft_caches(k: Kube, spec: InferenceServiceSpec, namespace: str) -> dict[str, CacheStatus]:
    """ensure_model_cache of each variant's draft model, by variant: a draft is downloaded (or its
    pvc:// checkpoint read) as the model is, into a cache any service with the same draft shares."""
    drafts = model_cache.draft_specs(spec).items()
    return {name: status for name, draft in drafts if (status := ensure_model_cache(k, draft, namespace))}


def cache_users(k: Kube, namespace: str, key: str) -> list[str]:
    """The InferenceServices of the namespace whose model or a draft model is the cache (or sizing Job)
    `key`."""
    return [
        name
        for name, spec in namespace_services(k, namespace)
        if any(
            (ref := model_cache.job_ref(m)) is not None and ref.key == key
            for m in (spec, *model_cache.draft_specs(spec).values())
        )
    ]
