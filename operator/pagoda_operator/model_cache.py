"""The shared model cache: one PersistentVolumeClaim per model revision, filled once by one Job.

Why a field of the InferenceService and not a resource of its own (as NIMCache or KServe's
LocalModelCache): the cache is keyed by what it holds (source and revision), so every
InferenceService in the namespace that names the same revision finds the same claim without a
second object to create, name and keep in step with the model field; its state is shown where the
user looks, on the InferenceService. The claim and the Job have no owner: deleting the last
InferenceService that uses them leaves the data, and reclaiming it is an explicit
`kubectl delete pvc,job -l pagoda.dev/model-cache=<key>`.

Pure: the spec in, manifests out; the Job, its pod and its log in, a CacheStatus out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pagoda_runtime.model_cache.layout import MANIFEST, MODEL_DIR
from pagoda_runtime.model_cache.progress import parse_progress
from pagoda_runtime.model_cache.sources import cache_key
from pagoda_runtime.sizing import ModelArchitecture

from pagoda_operator.models import InferenceServiceSpec, ModelCacheSpec, ModelSpec
from pagoda_operator.names import LABEL_MODEL_CACHE
from pagoda_operator.plan import Checkpoint

CACHE_MOUNT = "/model-cache"  # where the download Job writes
DOWNLOAD_CONTAINER = "download"
WAIT_CONTAINER = "wait-for-model"
VOLUME = "model"
# A Job retries a failed download this often, each attempt resuming the previous one's files.
BACKOFF_LIMIT = 4


def cached_scheme(model: ModelSpec) -> bool:
    return model.scheme in ("hf", "s3")


@dataclass(frozen=True)
class CacheRef:
    key: str

    @property
    def name(self) -> str:
        """Name of both the claim and the Job."""
        return f"pagoda-model-{self.key}"


def cache_ref(spec: InferenceServiceSpec) -> CacheRef | None:
    model = spec.model
    return CacheRef(cache_key(model.source, model.revision)) if cached_scheme(model) else None


def _labels(ref: CacheRef) -> dict[str, str]:
    return {LABEL_MODEL_CACHE: ref.key, "app.kubernetes.io/managed-by": "pagoda-operator"}


def claim_manifest(spec: InferenceServiceSpec, namespace: str, ref: CacheRef) -> dict:
    cache = spec.model.cache or ModelCacheSpec()
    claim_spec = {
        "accessModes": [cache.access_mode],
        "resources": {"requests": {"storage": cache.size}},
    }
    if cache.storage_class_name:
        claim_spec["storageClassName"] = cache.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": ref.name,
            "namespace": namespace,
            "labels": _labels(ref),
            "annotations": {
                "pagoda.dev/model-source": spec.model.source,
                "pagoda.dev/model-revision": spec.model.revision or "",
            },
        },
        "spec": claim_spec,
    }


def _secret_env(name: str, secret: str, key: str) -> dict:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def _download_env(model: ModelSpec) -> list[dict]:
    env = [{"name": "HOME", "value": "/tmp"}, {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"}]
    if model.scheme == "hf":
        # The runtime image is offline by default (HF_HUB_OFFLINE=1): only this Job may download.
        env.append({"name": "HF_HUB_OFFLINE", "value": "0"})
        env.append({"name": "HF_HUB_DISABLE_PROGRESS_BARS", "value": "1"})
        if model.hub_endpoint:
            env.append({"name": "HF_ENDPOINT", "value": model.hub_endpoint})
        if model.token_secret_ref is not None:
            env.append(_secret_env("HF_TOKEN", model.token_secret_ref.name, model.token_secret_ref.key))
    elif model.s3 is not None:
        s3 = model.s3
        env.append({"name": "AWS_ENDPOINT_URL", "value": s3.endpoint})
        if s3.region:
            env.append({"name": "AWS_REGION", "value": s3.region})
        if s3.credentials_secret_name:
            env.append(_secret_env("AWS_ACCESS_KEY_ID", s3.credentials_secret_name, "AWS_ACCESS_KEY_ID"))
            env.append(
                _secret_env("AWS_SECRET_ACCESS_KEY", s3.credentials_secret_name, "AWS_SECRET_ACCESS_KEY")
            )
    return env


@dataclass(frozen=True)
class PodSecurity:
    """The replicas' security contexts, which the Job's pod shares (same image, same user)."""

    pod: dict
    container: dict


@dataclass(frozen=True)
class JobPlacement:
    """Where the download runs: the replicas' security and tolerations, so that it may run on the
    nodes they run on (which a ReadWriteOnce volume needs)."""

    security: PodSecurity
    tolerations: list[dict]


def job_manifest(spec: InferenceServiceSpec, namespace: str, ref: CacheRef, placement: JobPlacement) -> dict:
    model = spec.model
    command = ["pagoda-runtime", "fetch", model.source, "--cache-dir", CACHE_MOUNT]
    if model.revision:
        command += ["--revision", model.revision]
    container = {
        "name": DOWNLOAD_CONTAINER,
        "image": spec.runtime.image,
        "imagePullPolicy": spec.runtime.image_pull_policy,
        "command": command,
        "env": _download_env(model),
        "volumeMounts": [{"name": VOLUME, "mountPath": CACHE_MOUNT}, {"name": "tmp", "mountPath": "/tmp"}],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": placement.security.container,
    }
    pod = {
        "restartPolicy": "Never",
        "securityContext": placement.security.pod,
        # The download never calls the Kubernetes API.
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "containers": [container],
        "volumes": [
            {"name": VOLUME, "persistentVolumeClaim": {"claimName": ref.name}},
            {"name": "tmp", "emptyDir": {}},
        ],
    }
    if spec.runtime.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": s} for s in spec.runtime.image_pull_secrets]
    if placement.tolerations:
        pod["tolerations"] = placement.tolerations
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": ref.name, "namespace": namespace, "labels": _labels(ref)},
        "spec": {
            "backoffLimit": BACKOFF_LIMIT,
            "template": {"metadata": {"labels": _labels(ref)}, "spec": pod},
        },
    }


def cache_manifests(spec: InferenceServiceSpec, namespace: str, placement: JobPlacement) -> list[dict]:
    """The claim and the Job, created once and never updated: whoever comes first fills the cache."""
    ref = cache_ref(spec)
    if ref is None:
        return []
    return [claim_manifest(spec, namespace, ref), job_manifest(spec, namespace, ref, placement)]


def replica_model_path(mount: str) -> str:
    """The runtime's --model: the cache's model folder, whose manifest names a GGUF entry file if any."""
    return f"{mount}/{MODEL_DIR}"


def pod_labels(spec: InferenceServiceSpec) -> dict[str, str]:
    """Replicas carry their cache key: `kubectl get pods -l pagoda.dev/model-cache=KEY` lists its users."""
    ref = cache_ref(spec)
    return {LABEL_MODEL_CACHE: ref.key} if ref is not None else {}


def replica_volume(ref: CacheRef) -> dict:
    return {"name": VOLUME, "persistentVolumeClaim": {"claimName": ref.name, "readOnly": True}}


def wait_container(spec: InferenceServiceSpec, mount: str, security: PodSecurity) -> dict:
    """Holds a replica until the cache is complete: the manifest appears with the final folder."""
    marker = f"{mount}/{MODEL_DIR}/{MANIFEST}"
    return {
        "name": WAIT_CONTAINER,
        "image": spec.runtime.image,
        "imagePullPolicy": spec.runtime.image_pull_policy,
        "command": [
            "sh",
            "-c",
            f'until [ -f "{marker}" ]; do echo "waiting for the model cache"; sleep 5; done',
        ],
        "volumeMounts": [{"name": VOLUME, "mountPath": mount, "readOnly": True}],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": security.container,
    }


def shares_one_node(spec: InferenceServiceSpec) -> bool:
    return (spec.model.cache or ModelCacheSpec()).access_mode == "ReadWriteOnce"


def same_node_affinity(ref: CacheRef) -> dict:
    """ReadWriteOnce: the replicas (and a running download) share one node, the one the volume is on."""
    term = {
        "labelSelector": {"matchLabels": {LABEL_MODEL_CACHE: ref.key}},
        "topologyKey": "kubernetes.io/hostname",
    }
    return {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}


# ---- status ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CacheStatus:
    claim_name: str
    phase: str  # Pending, Downloading, Ready, Failed
    message: str
    progress: int | None = None  # percent, while downloading
    checkpoint: Checkpoint | None = None  # what the Job read from the files, once Ready

    @property
    def ready(self) -> bool:
        return self.phase == "Ready"

    def summary(self) -> str:
        """The printed column: Downloading 42%, Ready, Failed."""
        return (
            f"{self.phase} {self.progress}%"
            if self.progress is not None and self.phase == "Downloading"
            else self.phase
        )

    def to_status(self) -> dict:
        out = {
            "claimName": self.claim_name,
            "phase": self.phase,
            "message": self.message,
            "summary": self.summary(),
        }
        if self.progress is not None:
            out["progress"] = self.progress
        return out


def _terminated_message(pod: dict) -> str:
    for cs in pod.get("status", {}).get("containerStatuses", []):
        if cs.get("name") == DOWNLOAD_CONTAINER:
            terminated = (
                cs.get("state", {}).get("terminated") or cs.get("lastState", {}).get("terminated") or {}
            )
            return (terminated.get("message") or "").strip()
    return ""


def _job_condition(job: dict, type_: str) -> dict | None:
    return next(
        (
            c
            for c in job.get("status", {}).get("conditions", [])
            if c.get("type") == type_ and c.get("status") == "True"
        ),
        None,
    )


def cache_status(
    ref: CacheRef, claim: dict | None, job: dict | None, pods: list[dict], log_tail: str
) -> CacheStatus:
    """pods: the Job's pods; log_tail: the last lines of the running one's log ("" if none)."""
    if job is None:
        return CacheStatus(ref.name, "Pending", "the download Job is being created")
    if _job_condition(job, "Complete"):
        succeeded = [p for p in pods if p.get("status", {}).get("phase") == "Succeeded"]
        facts = {}
        for pod in succeeded:
            try:
                facts = json.loads(_terminated_message(pod))
            except ValueError:
                continue
        arch = facts.get("architecture")
        return CacheStatus(
            ref.name,
            "Ready",
            f"the model is cached in PersistentVolumeClaim {ref.name}",
            checkpoint=Checkpoint(ModelArchitecture(**arch), facts.get("storedQuantization"))
            if arch
            else None,
        )
    failed = _job_condition(job, "Failed")
    if failed:
        reasons = [m for p in pods if (m := _terminated_message(p))]
        reason = reasons[-1] if reasons else failed.get("message") or failed.get("reason", "the Job failed")
        return CacheStatus(
            ref.name,
            "Failed",
            f"{reason} (after {BACKOFF_LIMIT + 1} attempts; fix the cause, then "
            f"`kubectl delete job {ref.name}` to retry: the files already fetched are kept)",
        )
    if claim is not None and claim.get("status", {}).get("phase") == "Pending":
        return CacheStatus(
            ref.name,
            "Pending",
            f"PersistentVolumeClaim {ref.name} is not bound yet; if its storage class cannot provide "
            f"{claim['spec']['accessModes'][0]}, set model.cache.accessMode ReadWriteOnce or a "
            "storageClassName that can",
        )
    progress = parse_progress(log_tail)
    if progress is None:
        return CacheStatus(ref.name, "Downloading", "the download is starting", progress=0)
    return CacheStatus(
        ref.name,
        "Downloading",
        f"downloaded {progress.done / 1e9:.2f} of {progress.total / 1e9:.2f} GB "
        f"({progress.bytes_per_second / 1e6:.1f} MB/s)",
        progress=progress.percent,
    )
