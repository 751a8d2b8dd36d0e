"""The LoRA adapters' cache: one claim per namespace that every replica of a service with LoRA mounts
read-only, and one Job per adapter revision that copies it in (`pagoda-runtime fetch --adapter`:
downloaded and verified as a model is, or copied from the user's pvc:// claim, and checked as a PEFT
LoRA adapter whose rank it reports).

Why one claim for every adapter rather than a claim per adapter, as models have: the pods mount it
whatever adapters are declared, so that adding or removing one changes no pod template and restarts
no pod; the adapters are loaded through the runtime's API instead (adapter_loading.py). Like the
model cache, the claim and the Jobs are keyed by what they hold and have no owner: deleting the last
InferenceService keeps the data (`kubectl delete pvc,job -l pagoda.dev/adapter-cache` reclaims it).

Pure: the spec in, manifests out; a Job, its pods and its log in, an AdapterDownload out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from pagoda_runtime.contract.cache_layout import MODEL_DIR
from pagoda_runtime.contract.download_progress import parse_progress
from pagoda_runtime.contract.sources import cache_key, parse_pvc

from pagoda_operator import model_cache
from pagoda_operator.model_cache import CacheRef, JobPlacement
from pagoda_operator.models import AdapterSpec, InferenceServiceSpec
from pagoda_operator.names import LABEL_ADAPTER_CACHE

CLAIM = "pagoda-adapters"
CLAIM_KEY = "claim"  # the claim's own value of LABEL_ADAPTER_CACHE
VOLUME = "adapters"
REPLICA_MOUNT = "/adapters"  # in the replicas, read-only
JOB_MOUNT = "/adapter-cache"  # in the download Job
SOURCE_MOUNT = "/source"  # a pvc:// adapter's claim, in its Job


def adapter_ref(adapter: AdapterSpec) -> CacheRef:
    """The adapter revision's Job, and its folder in the claim: `<key>/model`."""
    return CacheRef(
        cache_key(adapter.source, adapter.revision), prefix="pagoda-adapter", label=LABEL_ADAPTER_CACHE
    )


def replica_path(adapter: AdapterSpec) -> str:
    """The lora_path the replicas load the adapter from."""
    return f"{REPLICA_MOUNT}/{adapter_ref(adapter).key}/{MODEL_DIR}"


def claim_manifest(spec: InferenceServiceSpec, namespace: str) -> dict:
    cache = spec.adapter_cache
    claim_spec = {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": cache.size}}}
    if cache.storage_class_name:
        claim_spec["storageClassName"] = cache.storage_class_name
    labels = {LABEL_ADAPTER_CACHE: CLAIM_KEY, "app.kubernetes.io/managed-by": "pagoda-operator"}
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": CLAIM, "namespace": namespace, "labels": labels},
        "spec": claim_spec,
    }


def job_manifest(
    spec: InferenceServiceSpec, adapter: AdapterSpec, namespace: str, placement: JobPlacement
) -> dict:
    ref = adapter_ref(adapter)
    target = ["--adapter", "--cache-dir", f"{JOB_MOUNT}/{ref.key}"]
    mounts = [{"name": model_cache.VOLUME, "mountPath": JOB_MOUNT}]
    volumes: tuple[dict, ...] = ()
    if adapter.scheme == "pvc":
        source = parse_pvc(adapter.source)
        command = ["pagoda-runtime", "fetch", source.under(SOURCE_MOUNT), *target]
        mounts.append({"name": "source", "mountPath": SOURCE_MOUNT, "readOnly": True})
        volumes = (
            {"name": "source", "persistentVolumeClaim": {"claimName": source.claim, "readOnly": True}},
        )
    else:
        command = ["pagoda-runtime", "fetch", adapter.source, *target]
        if adapter.revision:
            command += ["--revision", adapter.revision]
    token = model_cache.service_account_token(adapter)
    return model_cache.cache_job(
        spec,
        namespace,
        ref,
        placement,
        container={
            "name": model_cache.DOWNLOAD_CONTAINER,
            "command": command,
            "env": model_cache.download_env(adapter),
            "volumeMounts": [*mounts, *([token[1]] if token else [])],
        },
        claim={"claimName": CLAIM},
        backoff_limit=model_cache.BACKOFF_LIMIT,
        annotations={
            "pagoda.dev/adapter-source": adapter.source,
            "pagoda.dev/adapter-revision": adapter.revision or "",
        },
        service_account=(adapter.s3.service_account_name, token[0]) if token else None,
        volumes=volumes,
    )


def cache_manifests(spec: InferenceServiceSpec, namespace: str, placement: JobPlacement) -> list[dict]:
    """Created once and never updated: the claim, while the pods serve LoRA, and one Job per adapter."""
    if not spec.lora_enabled:
        return []
    return [
        claim_manifest(spec, namespace),
        *(job_manifest(spec, a, namespace, placement) for a in spec.adapters),
    ]


def replica_volume() -> dict:
    return {"name": VOLUME, "persistentVolumeClaim": {"claimName": CLAIM, "readOnly": True}}


def replica_mount() -> dict:
    return {"name": VOLUME, "mountPath": REPLICA_MOUNT, "readOnly": True}


# ---- status ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AdapterDownload:
    """One adapter's copy into the cache."""

    phase: Literal["Downloading", "Ready", "Failed"]
    message: str
    rank: int | None = None  # read from adapter_config.json by the Job, once Ready


def _reported_rank(pods: list[dict]) -> int | None:
    for pod in pods:
        if pod.get("status", {}).get("phase") != "Succeeded":
            continue
        try:
            facts = json.loads(model_cache.terminated_message(pod))
        except ValueError:
            continue
        rank = (facts.get("adapter") or {}).get("rank") if isinstance(facts, dict) else None
        if isinstance(rank, int):
            return rank
    return None


def download_status(
    adapter: AdapterSpec, job: dict | None, pods: list[dict], log_tail: str
) -> AdapterDownload:
    """`pods`: the Job's; `log_tail`: the last lines of the running one's log ("" if none)."""
    ref = adapter_ref(adapter)
    if job is None:
        return AdapterDownload("Downloading", f"Job {ref.name} is being created")
    if model_cache.job_condition(job, "Complete"):
        rank = _reported_rank(pods)
        return AdapterDownload("Ready", f"copied into PersistentVolumeClaim {CLAIM}", rank)
    if (reason := model_cache.failure_reason(job, pods, model_cache.DOWNLOAD_CONTAINER)) is not None:
        return AdapterDownload(
            "Failed",
            f"{reason} (fix the cause, then `kubectl delete job {ref.name}` to copy it again)",
        )
    progress = parse_progress(log_tail)
    if progress is None:
        return AdapterDownload("Downloading", f"Job {ref.name} is starting")
    return AdapterDownload("Downloading", f"{progress.percent}% of {progress.total / 1e6:.1f} MB")
