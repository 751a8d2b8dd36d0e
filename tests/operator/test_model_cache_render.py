"""The shared model cache: its claim and download Job, and the status read back from them."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict

import pytest
from kubernetes_schema import validate
from operator_specs import spec
from pagoda_operator.model_cache import (
    JobPlacement,
    cache_manifests,
    cache_ref,
    cache_status,
    sizing_ref,
    sizing_status,
)
from pagoda_operator.plan import plan_service
from pagoda_operator.render import POD_SECURITY, RenderOptions, pod_tolerations, render
from pagoda_operator.status import compute_status, status_patch
from pagoda_runtime.contract.download_progress import Progress
from pagoda_runtime.contract.model_catalogue import KNOWN_ARCHITECTURES
from pydantic import ValidationError

COMMIT = "0e9e39f249a16976918f6564b8830bc894c89659"
HF = {"source": "hf://meta-llama/Llama-3.1-8B-Instruct", "revision": COMMIT}


def _manifests(model: dict, namespace: str = "ml") -> dict[str, dict]:
    s = spec(model=model)
    placement = JobPlacement(POD_SECURITY, pod_tolerations(s))
    return {m["kind"]: m for m in cache_manifests(s, namespace, placement)}


def test_one_claim_and_one_job_per_revision_shared_by_every_service():
    a = spec(model=HF, variants=[{"name": "bf16"}])
    b = spec(model={**HF, "servedName": "other"}, variants=[{"name": "int4", "quantization": "int4"}])
    assert cache_ref(a) == cache_ref(b)
    assert cache_ref(spec(model={**HF, "revision": "1" * 40})) != cache_ref(a)
    assert cache_ref(spec(model={"source": "pvc://models/x"})) is None

    objects = _manifests({**HF, "cache": {"size": "20Gi", "storageClassName": "nfs"}})
    for manifest in objects.values():
        validate(manifest)
        assert "ownerReferences" not in manifest["metadata"]  # deleting a user leaves the data
    claim = objects["PersistentVolumeClaim"]["spec"]
    assert claim == {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": "20Gi"}},
        "storageClassName": "nfs",
    }
    job = objects["Job"]
    assert job["metadata"]["name"] == objects["PersistentVolumeClaim"]["metadata"]["name"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["command"] == [
        "pagoda-runtime",
        "fetch",
        HF["source"],
        "--cache-dir",
        "/model-cache",
        "--revision",
        COMMIT,
    ]
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    # It may run where the GPU replicas run (a ReadWriteOnce volume must), holding no GPU itself.
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in job["spec"]["template"][
        "spec"
    ]["tolerations"]
    assert "resources" not in container


def test_download_credentials_come_from_secrets():
    hub = _manifests(
        {**HF, "tokenSecretRef": {"name": "hf", "key": "token"}, "hubEndpoint": "http://mirror:8080"}
    )
    env = {e["name"]: e for e in hub["Job"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf", "key": "token"}}
    assert env["HF_ENDPOINT"]["value"] == "http://mirror:8080"
    assert env["HF_HUB_OFFLINE"]["value"] == "0"  # the runtime image is offline by default

    s3 = _manifests(
        {
            "source": "s3://models/llama",
            "s3": {"endpoint": "http://minio:9000", "credentialsSecretName": "s3"},
        }
    )
    env = {e["name"]: e for e in s3["Job"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["AWS_ENDPOINT_URL"]["value"] == "http://minio:9000"
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "s3",
        "key": "AWS_SECRET_ACCESS_KEY",
    }
    assert "HF_TOKEN" not in env


def test_patterns_select_the_files_and_name_a_cache_of_their_own():
    quant = {"source": "hf://acme/Llama-GGUF", "revision": COMMIT, "allowPatterns": ["*Q4_K_M.gguf"]}
    job = _manifests(quant)["Job"]
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[-2:] == ["--allow-pattern", "*Q4_K_M.gguf"]
    other_quant = {**quant, "allowPatterns": ["*Q8_0.gguf"]}
    assert cache_ref(spec(model=quant)) != cache_ref(spec(model=other_quant))
    assert cache_ref(spec(model=quant)) != cache_ref(spec(model={**quant, "allowPatterns": []}))
    # One file named in the source is a cache of its own too.
    one_file = spec(model={"source": "hf://acme/Llama-GGUF/llama.Q4_K_M.gguf", "revision": COMMIT})
    assert one_file.model.is_gguf and cache_ref(one_file) != cache_ref(
        spec(model={**quant, "allowPatterns": []})
    )


@pytest.mark.parametrize(
    "model, message",
    [
        ({"source": "s3://models/x", "allowPatterns": ["*.gguf"]}, "apply only to hf://"),
        (
            {"source": "hf://acme/m/f.gguf", "revision": COMMIT, "allowPatterns": ["*.gguf"]},
            "names its one file already",
        ),
        (
            {"source": "s3://models/x", "s3": {"credentialsSecretName": "k", "serviceAccountName": "sa"}},
            "not both",
        ),
    ],
)
def test_pattern_and_credential_rules(model, message):
    with pytest.raises(ValidationError, match=message):
        spec(model=model)


def test_s3_credentials_from_a_service_account_token_in_the_download_job_only():
    model = {
        "source": "s3://models/llama",
        "s3": {
            "serviceAccountName": "model-reader",
            "roleArn": "arn:aws:iam::123456789012:role/models",
            "stsEndpoint": "http://minio:9000",
        },
    }
    objects = _manifests(model)
    pod = objects["Job"]["spec"]["template"]["spec"]
    validate(objects["Job"])
    assert pod["serviceAccountName"] == "model-reader"
    assert pod["automountServiceAccountToken"] is False  # no Kubernetes API token, only the audience's
    (token,) = [v for v in pod["volumes"] if v["name"] == "s3-token"]
    (projected,) = token["projected"]["sources"]
    assert projected["serviceAccountToken"]["audience"] == "sts.amazonaws.com"
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["AWS_WEB_IDENTITY_TOKEN_FILE"] == "/var/run/secrets/pagoda.dev/s3/token"
    assert env["AWS_ROLE_ARN"] == "arn:aws:iam::123456789012:role/models"
    assert env["AWS_ENDPOINT_URL_STS"] == "http://minio:9000"
    assert "AWS_ACCESS_KEY_ID" not in env
    assert {"name": "s3-token", "mountPath": "/var/run/secrets/pagoda.dev/s3", "readOnly": True} in container[
        "volumeMounts"
    ]
    # The replicas run as the namespace's default account, with no token of any kind.
    s = spec(model=model)
    rendered = render(plan_service(s), namespace="ml", name="llama", uid="u", options=RenderOptions())
    replica = next(o for o in rendered if o["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert "serviceAccountName" not in replica and replica["automountServiceAccountToken"] is False
    assert all("projected" not in v for v in replica["volumes"])


def _job(condition: str | None = None, active: int = 0) -> dict:
    status = {"active": active} if active else {}
    if condition:
        status["conditions"] = [
            {
                "type": condition,
                "status": "True",
                "reason": "BackoffLimitExceeded",
                "message": "Job has reached the specified backoff limit",
            }
        ]
    return {"metadata": {"name": "j"}, "status": status}


def _pod(phase: str, message: str = "", container: str = "download") -> dict:
    terminated = {"terminated": {"exitCode": 0 if phase == "Succeeded" else 1, "message": message}}
    return {
        "metadata": {"name": "p"},
        "status": {
            "phase": phase,
            "containerStatuses": [
                {"name": container, "state": terminated if phase != "Running" else {"running": {}}}
            ],
        },
    }


def test_status_follows_the_download():
    ref = cache_ref(spec(model=HF))
    bound = {"spec": {"accessModes": ["ReadWriteMany"]}, "status": {"phase": "Bound"}}
    assert cache_status(ref, None, None, [], "").phase == "Pending"

    tail = "starting\n" + Progress(42_000_000, 100_000_000, 5e6).line() + "\n"
    running = cache_status(ref, bound, _job(active=1), [_pod("Running")], tail)
    assert (running.phase, running.progress, running.summary()) == ("Downloading", 42, "Downloading 42%")
    assert "5.0 MB/s" in running.message

    failed = cache_status(
        ref, bound, _job("Failed"), [_pod("Failed", "downloading hf://x failed: 401 gated")], ""
    )
    assert failed.phase == "Failed" and "401 gated" in failed.message
    assert f"kubectl delete job {ref.name}" in failed.message

    arch = asdict(KNOWN_ARCHITECTURES["llama-3.1-8b"])
    done = json.dumps({"revision": COMMIT, "architecture": arch, "storedQuantization": None})
    ready = cache_status(ref, bound, _job("Complete"), [_pod("Succeeded", done)], "")
    assert ready.ready and ready.checkpoint.architecture == KNOWN_ARCHITECTURES["llama-3.1-8b"]

    unbound = {"spec": {"accessModes": ["ReadWriteMany"]}, "status": {"phase": "Pending"}}
    pending = cache_status(ref, unbound, _job(active=1), [], "")
    assert pending.phase == "Pending" and "ReadWriteOnce" in pending.message


def test_a_cache_filled_before_the_architecture_took_hugging_face_names_still_sizes():
    """A claim keeps the manifest its download wrote; a re-run Job reports it as it is."""
    ref = cache_ref(spec(model=HF))
    bound = {"spec": {"accessModes": ["ReadWriteMany"]}, "status": {"phase": "Bound"}}
    earlier = {
        "num_layers": 32,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_kv_heads": 8,
        "head_dim": 128,
        "vocab_size": 128256,
        "tie_word_embeddings": False,
        "max_position_embeddings": 131072,
        "attention_bias": False,
    }
    done = json.dumps({"revision": COMMIT, "architecture": earlier, "storedQuantization": None})
    ready = cache_status(ref, bound, _job("Complete"), [_pod("Succeeded", done)], "")
    assert ready.ready and ready.checkpoint.architecture == KNOWN_ARCHITECTURES["llama-3.1-8b"]


def _status(s, cache):
    return status_patch(
        compute_status(
            plan_service(s, cache.checkpoint, held=cache.holds_replicas),
            namespace="ml",
            name="llama",
            generation=1,
            deployments=[],
            pods=[],
            previous=None,
            now="2026-01-01T00:00:00Z",
            cache=cache,
        )
    )


def test_service_status_shows_the_cache_and_sizes_from_the_checkpoint():
    # No family: only the downloaded config.json can size it.
    s = spec(
        model=HF,
        resources={"gpus": 1, "gpuMemory": "24Gi"},
        variants=[{"name": "bf16", "quantization": "none"}, {"name": "int4", "quantization": "int4"}],
    )
    ref = cache_ref(s)
    downloading = cache_status(ref, None, _job(active=1), [_pod("Running")], Progress(1, 4).line())
    status = _status(s, downloading)
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Ready"]["reason"] == "ModelCacheDownloading"
    assert status["modelCache"]["summary"] == "Downloading 25%"
    assert conditions["ModelFits"]["status"] == "Unknown"

    arch = asdict(KNOWN_ARCHITECTURES["llama-3.1-8b"])
    done = json.dumps({"architecture": arch, "storedQuantization": None})
    ready = cache_status(ref, None, _job("Complete"), [_pod("Succeeded", done)], "")
    conditions = {c["type"]: c for c in _status(s, ready)["conditions"]}
    # 8B in bf16 with a 128k context does not fit 24 GiB; int4 with the same context does not either,
    # but both are now judged from the checkpoint instead of being unknown.
    assert (
        conditions["ModelFits"]["status"] == "False" and "variant bf16" in conditions["ModelFits"]["message"]
    )
    ids = {"namespace": "ml", "name": "llama", "uid": "u", "options": RenderOptions()}
    served = render(plan_service(s, ready.checkpoint), **ids)
    unserved = render(plan_service(s), **ids)
    assert len([m for m in served if m["kind"] == "Deployment"]) < len(
        [m for m in unserved if m["kind"] == "Deployment"]
    )


PVC = {"source": "pvc://checkpoints/llama/8b"}


def test_a_pvc_model_the_spec_does_not_size_gets_one_sizing_job_reading_its_claim():
    a = spec(model=PVC)
    b = spec(model={**PVC, "servedName": "other"}, variants=[{"name": "int4", "quantization": "int4"}])
    assert sizing_ref(a) == sizing_ref(b) and cache_ref(a) is None
    assert sizing_ref(spec(model={**PVC, "family": "llama-3.1-8b"})) is None  # sized before, no Job
    assert sizing_ref(spec(model={"source": "pvc://checkpoints/other"})) != sizing_ref(a)

    objects = _manifests(PVC)
    assert list(objects) == ["Job"]  # the claim is the user's own: nothing to create or fill
    job = objects["Job"]
    validate(job)
    assert job["metadata"]["name"] == sizing_ref(a).name
    assert "ownerReferences" not in job["metadata"]
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["pagoda-runtime", "inspect", "/model/llama/8b"]
    model_volume = next(v for v in pod["volumes"] if v["name"] == "model")
    assert model_volume["persistentVolumeClaim"] == {"claimName": "checkpoints", "readOnly": True}
    assert {"name": "model", "mountPath": "/model", "readOnly": True} in container["volumeMounts"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["automountServiceAccountToken"] is False
    assert _manifests({"source": "pvc://checkpoints"})["Job"]["spec"]["template"]["spec"]["containers"][0][
        "command"
    ] == ["pagoda-runtime", "inspect", "/model"]


def test_a_pvc_model_is_sized_from_what_its_sizing_job_read():
    s = spec(
        model=PVC,
        resources={"gpus": 1, "gpuMemory": "24Gi"},
        variants=[{"name": "bf16", "quantization": "none"}],
    )
    ref = sizing_ref(s)
    assert sizing_status(ref, s, None, []).phase == "Pending"
    reading = sizing_status(ref, s, _job(active=1), [_pod("Running", container="inspect")])
    status = _status(s, reading)
    conditions = {c["type"]: c for c in status["conditions"]}
    assert (status["modelCache"]["summary"], status["modelCache"]["claimName"]) == ("Sizing", "checkpoints")
    assert conditions["Ready"]["reason"] == "ModelCacheSizing"
    assert conditions["ModelFits"]["status"] == "Unknown"
    # No pods until it is known whether they fit: a pod started now might not.
    ids = {"namespace": "ml", "name": "llama", "uid": "u", "options": RenderOptions()}
    held = render(plan_service(s, held=reading.holds_replicas), **ids)
    assert not [m for m in held if m["kind"] == "Deployment"]

    broken = "reading the checkpoint /model/llama/8b failed: FileNotFoundError: no config.json"
    failed = sizing_status(ref, s, _job("Failed"), [_pod("Failed", broken, container="inspect")])
    assert failed.phase == "Failed" and "no config.json" in failed.message
    assert f"kubectl delete job {ref.name}" in failed.message

    # Done, but no pod says what it read: still no pods, and the way out is named.
    unreported = sizing_status(ref, s, _job("Complete"), [_pod("Succeeded", "", container="inspect")])
    assert unreported.phase == "Sizing" and unreported.holds_replicas
    assert f"kubectl delete job {ref.name}" in unreported.message

    arch = asdict(KNOWN_ARCHITECTURES["llama-3.1-8b"])
    facts = json.dumps({"architecture": arch, "storedQuantization": None})
    read = sizing_status(ref, s, _job("Complete"), [_pod("Succeeded", facts, container="inspect")])
    assert read.ready and read.checkpoint.architecture == KNOWN_ARCHITECTURES["llama-3.1-8b"]
    conditions = {c["type"]: c for c in _status(s, read)["conditions"]}
    # 8B in bf16 with its 128k context does not fit 24 GiB: known now, from the claim's own files.
    assert conditions["ModelFits"]["status"] == "False", conditions["ModelFits"]
    assert "variant bf16" in conditions["ModelFits"]["message"]
    assert not [m for m in render(plan_service(s, read.checkpoint), **ids) if m["kind"] == "Deployment"]
    roomy = spec(model=PVC, resources={"gpus": 1, "gpuMemory": "80Gi"}, variants=[{"name": "bf16"}])
    conditions = {c["type"]: c for c in _status(roomy, read)["conditions"]}
    assert conditions["ModelFits"]["status"] == "True"
    assert [m for m in render(plan_service(roomy, read.checkpoint), **ids) if m["kind"] == "Deployment"]


def test_a_source_without_patterns_keeps_its_cache_key():
    # The key existing caches were created under: sha256 of "<source>@<revision>", 12 hex digits.
    expected = hashlib.sha256(f"{HF['source']}@{COMMIT}".encode()).hexdigest()[:12]
    assert cache_ref(spec(model=HF)).key == expected
