"""The shared model cache: one PersistentVolumeClaim per model revision, filled once by one Job.

Why a field of the InferenceService and not a resource of its own (as NIMCache or KServe's
LocalModelCache): the cache is keyed by what it holds (source and revision), so every
InferenceService in the namespace that names the same revision finds the same claim without a
second object to create, name and keep in step with the model field; its state is shown where the
user looks, on the InferenceService. The claim and the Job have no owner: deleting the last
InferenceService that uses them leaves the data, and reclaiming it is an explicit
`kubectl delete pvc,job -l pagoda.dev/model-cache=<key>`.

A pvc:// model (the user's own claim) is not downloaded, but it is sized the same way: unless the
spec names a family or an architecture, one sizing Job per source runs `pagoda-runtime inspect` on
the claim, read-only, and reports the checkpoint's shape in its termination message as the download
Job does; its state is shown in the same status field.

Pure: the spec in, manifests out; the Job, its pod and its log in, a CacheStatus out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pagoda_runtime.contract.cache_layout import MANIFEST, MODEL_DIR
from pagoda_runtime.contract.download_progress import parse_progress
from pagoda_runtime.contract.eagle_sizing import EagleHeadShape
from pagoda_runtime.contract.sizing import ModelArchitecture
from pagoda_runtime.contract.sources import cache_key, parse_pvc

from pagoda_operator.models import AdapterSpec, InferenceServiceSpec, ModelCacheSpec, ModelSpec, VariantSpec
from pagoda_operator.names import LABEL_MODEL_CACHE
from pagoda_operator.plan import Checkpoint

CACHE_MOUNT = "/model-cache"  # where the download Job writes
# Where the download Job of an s3:// model with s3.serviceAccountName finds its ServiceAccount token.
S3_TOKEN_MOUNT = "/var/run/secrets/pagoda.dev/s3"
S3_TOKEN_SECONDS = 3600
SIZING_MOUNT = "/model"  # where the sizing Job reads a pvc:// claim
DOWNLOAD_CONTAINER = "download"
SIZING_CONTAINER = "inspect"
WAIT_CONTAINER = "wait-for-model"
VOLUME = "model"
# A Job retries a failed download this often, each attempt resuming the previous one's files.
BACKOFF_LIMIT = 4
# Reading metadata fails the same way each time; one retry covers a volume that mounted late.
SIZING_BACKOFF_LIMIT = 1


def cached_scheme(model: ModelSpec) -> bool:
    return model.scheme in ("hf", "s3")


@dataclass(frozen=True)
class CacheRef:
    key: str
    prefix: str = "pagoda-model"  # pagoda-size for the sizing Job of a pvc:// model
    label: str = LABEL_MODEL_CACHE  # the label whose value is the key (adapter_cache.py has its own)

    @property
    def name(self) -> str:
        """Name of the Job, and of the claim it fills when it downloads."""
        return f"{self.prefix}-{self.key}"


def cache_ref(spec: InferenceServiceSpec) -> CacheRef | None:
    """The shared download cache of an hf:// or s3:// model."""
    model = spec.model
    if not cached_scheme(model):
        return None
    return CacheRef(
        cache_key(model.source, model.revision, tuple(model.allow_patterns), tuple(model.ignore_patterns))
    )


def sizing_ref(spec: InferenceServiceSpec) -> CacheRef | None:
    """The sizing Job of a pvc:// model the spec does not size itself (no family, no architecture)."""
    model = spec.model
    if model.scheme != "pvc" or model.sizing_architecture() is not None:
        return None
    return CacheRef(cache_key(model.source, None), prefix="pagoda-size")


def job_ref(spec: InferenceServiceSpec) -> CacheRef | None:
    """The Job whose outcome the status shows and the plan is sized by, if any."""
    return cache_ref(spec) or sizing_ref(spec)


def draft_spec(spec: InferenceServiceSpec, variant: VariantSpec) -> InferenceServiceSpec | None:
    """The variant's draft model (or EAGLE head) as the model of the service otherwise unchanged
    (its runtime image, tolerations and security), so that a draft is downloaded, sized and mounted
    as any model is; None where the variant has no draft model."""
    draft = variant.speculative.draft if variant.speculative else None
    return None if draft is None else spec.model_copy(update={"model": draft})


def draft_specs(spec: InferenceServiceSpec) -> dict[str, InferenceServiceSpec]:
    """draft_spec of each variant that speculates with a draft model, by variant name."""
    return {v.name: d for v in spec.variants if (d := draft_spec(spec, v)) is not None}


def _labels(ref: CacheRef) -> dict[str, str]:
    return {ref.label: ref.key, "app.kubernetes.io/managed-by": "pagoda-operator"}


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


def download_env(model: ModelSpec | AdapterSpec) -> list[dict]:
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
        if s3.service_account_name:
            env.append({"name": "AWS_WEB_IDENTITY_TOKEN_FILE", "value": f"{S3_TOKEN_MOUNT}/token"})
            env.append({"name": "AWS_ROLE_SESSION_NAME", "value": "pagoda-model-download"})
            if s3.role_arn:
                env.append({"name": "AWS_ROLE_ARN", "value": s3.role_arn})
            if s3.sts_endpoint:
                env.append({"name": "AWS_ENDPOINT_URL_STS", "value": s3.sts_endpoint})
    return env


def service_account_token(model: ModelSpec | AdapterSpec) -> tuple[dict, dict] | None:
    """The (volume, mount) of a short-lived token of s3.serviceAccountName, for the download Job only;
    the API token stays unmounted (the Job never calls the Kubernetes API)."""
    if model.s3 is None or not model.s3.service_account_name:
        return None
    source = {"audience": model.s3.token_audience, "expirationSeconds": S3_TOKEN_SECONDS, "path": "token"}
    volume = {"name": "s3-token", "projected": {"sources": [{"serviceAccountToken": source}]}}
    return volume, {"name": "s3-token", "mountPath": S3_TOKEN_MOUNT, "readOnly": True}


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
    command += [arg for pattern in model.allow_patterns for arg in ("--allow-pattern", pattern)]
    command += [arg for pattern in model.ignore_patterns for arg in ("--ignore-pattern", pattern)]
    token = service_account_token(model)
    return cache_job(
        spec,
        namespace,
        ref,
        placement,
        container={
            "name": DOWNLOAD_CONTAINER,
            "command": command,
            "env": download_env(model),
            "volumeMounts": [{"name": VOLUME, "mountPath": CACHE_MOUNT}, *([token[1]] if token else [])],
        },
        claim={"claimName": ref.name},
        backoff_limit=BACKOFF_LIMIT,
        service_account=(model.s3.service_account_name, token[0]) if token else None,
    )


def sizing_job_manifest(
    spec: InferenceServiceSpec, namespace: str, ref: CacheRef, placement: JobPlacement
) -> dict:
    source = parse_pvc(spec.model.source)
    return cache_job(
        spec,
        namespace,
        ref,
        placement,
        container={
            "name": SIZING_CONTAINER,
            "command": ["pagoda-runtime", "inspect", source.under(SIZING_MOUNT)],
            "env": [{"name": "HOME", "value": "/tmp"}],
            "volumeMounts": [{"name": VOLUME, "mountPath": SIZING_MOUNT, "readOnly": True}],
        },
        claim={"claimName": source.claim, "readOnly": True},
        backoff_limit=SIZING_BACKOFF_LIMIT,
        annotations={"pagoda.dev/model-source": spec.model.source},
    )


def cache_job(
    spec: InferenceServiceSpec,
    namespace: str,
    ref: CacheRef,
    placement: JobPlacement,
    *,
    container: dict,
    claim: dict,
    backoff_limit: int,
    annotations: dict | None = None,
    service_account: tuple[str, dict] | None = None,
    volumes: tuple[dict, ...] = (),
) -> dict:
    """A one-container Job of the runtime's image on one claim, with the replicas' security and
    tolerations; it never calls the Kubernetes API. `service_account`: the ServiceAccount it runs as
    and the projected volume of its token, for credentials from a token rather than a Secret;
    `volumes`: more volumes its container mounts."""
    container = {
        **container,
        "image": spec.runtime.image,
        "imagePullPolicy": spec.runtime.image_pull_policy,
        "volumeMounts": [*container["volumeMounts"], {"name": "tmp", "mountPath": "/tmp"}],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": placement.security.container,
    }
    pod = {
        "restartPolicy": "Never",
        "securityContext": placement.security.pod,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "containers": [container],
        "volumes": [
            {"name": VOLUME, "persistentVolumeClaim": claim},
            {"name": "tmp", "emptyDir": {}},
            *volumes,
        ],
    }
    if spec.runtime.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": s} for s in spec.runtime.image_pull_secrets]
    if service_account is not None:
        pod["serviceAccountName"] = service_account[0]
        pod["volumes"].append(service_account[1])
    if placement.tolerations:
        pod["tolerations"] = placement.tolerations
    metadata = {"name": ref.name, "namespace": namespace, "labels": _labels(ref)}
    if annotations:
        metadata["annotations"] = annotations
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {
            "backoffLimit": backoff_limit,
            "template": {"metadata": {"labels": _labels(ref)}, "spec": pod},
        },
    }


def cache_manifests(spec: InferenceServiceSpec, namespace: str, placement: JobPlacement) -> list[dict]:
    """Created once and never updated: the claim and the download Job (whoever comes first fills the
    cache), or the sizing Job of a pvc:// model."""
    if (ref := cache_ref(spec)) is not None:
        return [claim_manifest(spec, namespace, ref), job_manifest(spec, namespace, ref, placement)]
    if (ref := sizing_ref(spec)) is not None:
        return [sizing_job_manifest(spec, namespace, ref, placement)]
    return []


def replica_model_path(mount: str) -> str:
    """The runtime's --model: the cache's model folder, whose manifest names a GGUF entry file if any."""
    return f"{mount}/{MODEL_DIR}"


def pod_labels(spec: InferenceServiceSpec) -> dict[str, str]:
    """Replicas carry their cache key: `kubectl get pods -l pagoda.dev/model-cache=KEY` lists its users."""
    ref = cache_ref(spec)
    return {LABEL_MODEL_CACHE: ref.key} if ref is not None else {}


def replica_volume(ref: CacheRef, name: str = VOLUME) -> dict:
    return {"name": name, "persistentVolumeClaim": {"claimName": ref.name, "readOnly": True}}


def wait_container(
    spec: InferenceServiceSpec,
    mount: str,
    security: PodSecurity,
    *,
    volume: str = VOLUME,
    name: str = WAIT_CONTAINER,
) -> dict:
    """Holds a replica until the cache is complete: the manifest appears with the final folder."""
    marker = f"{mount}/{MODEL_DIR}/{MANIFEST}"
    return {
        "name": name,
        "image": spec.runtime.image,
        "imagePullPolicy": spec.runtime.image_pull_policy,
        "command": [
            "sh",
            "-c",
            f'until [ -f "{marker}" ]; do echo "waiting for the model cache"; sleep 5; done',
        ],
        "volumeMounts": [{"name": volume, "mountPath": mount, "readOnly": True}],
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
    phase: str  # Pending, Downloading (Sizing for a pvc:// model), Ready, Failed
    message: str
    progress: int | None = None  # percent, while downloading
    checkpoint: Checkpoint | None = None  # what the Job read from the files, once Ready
    holds_replicas: bool = False  # a sizing Job under way: no pods until it says whether they fit

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


def terminated_message(pod: dict, container: str = DOWNLOAD_CONTAINER) -> str:
    for cs in pod.get("status", {}).get("containerStatuses", []):
        if cs.get("name") == container:
            terminated = (
                cs.get("state", {}).get("terminated") or cs.get("lastState", {}).get("terminated") or {}
            )
            return (terminated.get("message") or "").strip()
    return ""


def job_condition(job: dict, type_: str) -> dict | None:
    return next(
        (
            c
            for c in job.get("status", {}).get("conditions", [])
            if c.get("type") == type_ and c.get("status") == "True"
        ),
        None,
    )


def _reported_checkpoint(pods: list[dict], container: str) -> Checkpoint | None:
    """What the Job's succeeded pod left in its termination message, if it says."""
    facts = {}
    for pod in pods:
        if pod.get("status", {}).get("phase") != "Succeeded":
            continue
        try:
            facts = json.loads(terminated_message(pod, container))
        except ValueError:
            continue
    if not isinstance(facts, dict):
        return None
    if head := facts.get("eagleHead"):
        shape = EagleHeadShape.from_facts(head)
        return Checkpoint(shape.architecture, eagle_head=shape)
    arch = facts.get("architecture")
    return Checkpoint(ModelArchitecture.from_facts(arch), facts.get("storedQuantization")) if arch else None


def failure_reason(job: dict, pods: list[dict], container: str) -> str | None:
    failed = job_condition(job, "Failed")
    if not failed:
        return None
    reasons = [m for p in pods if (m := terminated_message(p, container))]
    return reasons[-1] if reasons else failed.get("message") or failed.get("reason", "the Job failed")


def cache_status(
    ref: CacheRef, claim: dict | None, job: dict | None, pods: list[dict], log_tail: str
) -> CacheStatus:
    """pods: the Job's pods; log_tail: the last lines of the running one's log ("" if none)."""
    if job is None:
        return CacheStatus(ref.name, "Pending", "the download Job is being created")
    if job_condition(job, "Complete"):
        return CacheStatus(
            ref.name,
            "Ready",
            f"the model is cached in PersistentVolumeClaim {ref.name}",
            checkpoint=_reported_checkpoint(pods, DOWNLOAD_CONTAINER),
        )
    if (reason := failure_reason(job, pods, DOWNLOAD_CONTAINER)) is not None:
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


def sizing_status(
    ref: CacheRef, spec: InferenceServiceSpec, job: dict | None, pods: list[dict]
) -> CacheStatus:
    """The sizing Job of a pvc:// model: reading, read (with the checkpoint), or why it could not."""
    claim = parse_pvc(spec.model.source).claim
    if job is None:
        return CacheStatus(claim, "Pending", "the sizing Job is being created", holds_replicas=True)
    if job_condition(job, "Complete"):
        checkpoint = _reported_checkpoint(pods, SIZING_CONTAINER)
        if checkpoint is not None:
            message = f"sized from the checkpoint in PersistentVolumeClaim {claim}"
            return CacheStatus(claim, "Ready", message, checkpoint=checkpoint)
        return CacheStatus(
            claim,
            "Sizing",
            f"Job {ref.name} completed but no pod of it reports the checkpoint (yet); if its pod is "
            f"gone, `kubectl delete job {ref.name}` to read it again",
            holds_replicas=True,
        )
    if (reason := failure_reason(job, pods, SIZING_CONTAINER)) is not None:
        return CacheStatus(
            claim,
            "Failed",
            f"{reason} (the replicas would fail to load it too; fix the checkpoint in "
            f"PersistentVolumeClaim {claim} or set model.family, then `kubectl delete job {ref.name}` "
            "to read it again)",
        )
    return CacheStatus(
        claim,
        "Sizing",
        f"reading config.json / GGUF metadata from PersistentVolumeClaim {claim}; the variants get "
        "pods once it is known that they fit",
        holds_replicas=True,
    )
