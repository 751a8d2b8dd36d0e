"""A variant's speculative field: checked at the edge, rendered as the runtime's --speculative-config,
a draft model downloaded and mounted as the model is, and counted by the fit check."""

from __future__ import annotations

import json

import pytest
from kubernetes_schema import validate
from operator_specs import MINIMAL, NAME, NS, UID, first_status, spec
from pagoda_operator import resync
from pagoda_operator.inference_service import error_text, plan_with_cache
from pagoda_operator.model_cache import (
    CacheStatus,
    JobPlacement,
    cache_manifests,
    cache_ref,
    draft_spec,
    job_ref,
    replica_model_path,
)
from pagoda_operator.model_cache_cluster import cache_users
from pagoda_operator.models import InferenceServiceSpec
from pagoda_operator.names import group_set_name, variant_object_name
from pagoda_operator.plan import Checkpoint, plan_service, plan_variant
from pagoda_operator.render import DRAFT_MOUNT, POD_SECURITY, RenderOptions, pod_tolerations, render
from pagoda_operator.status import status_patch
from pagoda_runtime.contract.model_catalogue import KNOWN_ARCHITECTURES
from pagoda_runtime.contract.sizing import GIB, kv_bytes_for_context, mtp_draft, weight_bytes
from pagoda_runtime.contract.speculative import parse_speculative_config
from pydantic import ValidationError

COMMIT = "0e9e39f249a16976918f6564b8830bc894c89659"
DRAFT_HF = {"source": "hf://meta-llama/Llama-3.2-1B-Instruct", "revision": COMMIT, "family": "llama-3.2-1b"}
TARGET = {"source": "pvc://models/llama-3-8b", "family": "llama-3-8b", "maxModelLen": 8192}


def _variant(speculative: dict | None, name: str = "bf16") -> dict:
    return {"name": name, **({"speculative": speculative} if speculative is not None else {})}


def _draft(model: dict, k: int = 4) -> dict:
    return {"method": "draft_model", "numSpeculativeTokens": k, "model": model}


def _head(model: dict, method: str = "eagle3", k: int = 3) -> dict:
    return {"method": method, "numSpeculativeTokens": k, "model": model}


def _deployment(s, variant: str = "bf16") -> dict:
    objects = render(plan_service(s), namespace=NS, name=NAME, uid=UID, options=RenderOptions())
    for obj in objects:
        validate(obj)
    return next(
        o
        for o in objects
        if o["kind"] == "Deployment" and o["metadata"]["name"] == variant_object_name(NAME, variant)
    )


def _speculative_config(pod: dict) -> dict | None:
    args = pod["containers"][0]["args"]
    if "--speculative-config" not in args:
        return None
    return json.loads(args[args.index("--speculative-config") + 1])


# ---- the spec ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "speculative, message",
    [
        (
            {"method": "medusa", "numSpeculativeTokens": 4},
            "speculative.method: Input should be 'ngram', 'draft_model', 'eagle', 'eagle3' or 'mtp'",
        ),
        ({"method": "eagle3", "numSpeculativeTokens": 4}, "eagle and eagle3 need speculative.model"),
        ({"method": "ngram", "numSpeculativeTokens": 0}, "numSpeculativeTokens: Input should be greater"),
        (
            {"method": "ngram", "numSpeculativeTokens": 17},
            "numSpeculativeTokens: Input should be less than or equal to 16",
        ),
        ({"method": "ngram"}, "numSpeculativeTokens: Field required"),
        ({"method": "draft_model", "numSpeculativeTokens": 4}, "draft_model needs speculative.model"),
        (
            {"method": "ngram", "numSpeculativeTokens": 4, "model": {"source": "bundled://smollm2-135m"}},
            "speculative.model applies only to methods draft_model, eagle and eagle3",
        ),
        (
            {"method": "mtp", "numSpeculativeTokens": 1, "model": {"source": "bundled://smollm2-135m"}},
            "mtp drafts with the model's own multi-token-prediction layer",
        ),
        (
            {**_draft({"source": "bundled://smollm2-135m"}), "promptLookupMax": 3},
            "promptLookupMax and promptLookupMin apply only to method ngram",
        ),
        (
            {"method": "ngram", "numSpeculativeTokens": 4, "promptLookupMin": 5, "promptLookupMax": 3},
            "promptLookupMin must not exceed promptLookupMax",
        ),
        (
            {"method": "ngram", "numSpeculativeTokens": 4, "promptLookupMin": 0},
            "promptLookupMin: Input should be greater than or equal to 1",
        ),
        (_draft({"source": "gs://bucket/draft"}), "source: String should match pattern"),
        (_draft({"source": "hf://org/draft"}), "an hf:// source needs revision"),
        (
            _draft({**DRAFT_HF, "cache": {"accessMode": "ReadWriteOnce"}}),
            "speculative.model.cache.accessMode must be ReadWriteMany",
        ),
        (_draft({**DRAFT_HF, "servedName": "draft"}), "servedName: Extra inputs are not permitted"),
        (
            _head({"source": "pvc://heads/e3", "family": "llama-3.2-1b"}),
            "speculative.model.family names a whole model, not an EAGLE head",
        ),
        (_head({"source": "bundled://smollm2-135m"}), "an EAGLE head's speculative.model.source is a folder"),
    ],
)
def test_a_bad_speculative_field_is_refused_naming_the_field(speculative, message):
    with pytest.raises(ValidationError) as refused:
        InferenceServiceSpec.model_validate({**MINIMAL, "variants": [_variant(speculative)]})
    assert "spec.variants.0.speculative" in error_text(refused.value)
    assert message in error_text(refused.value)


# ---- the runtime's flag --------------------------------------------------------------------------


def test_ngram_is_rendered_as_the_json_the_runtime_parses():
    ngram = {"method": "ngram", "numSpeculativeTokens": 4, "promptLookupMax": 4, "promptLookupMin": 2}
    s = spec(variants=[_variant(ngram), _variant(None, "plain")])
    pod = _deployment(s)["spec"]["template"]["spec"]
    config = _speculative_config(pod)
    assert config == {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "prompt_lookup_max": 4,
        "prompt_lookup_min": 2,
    }
    parsed = parse_speculative_config(json.dumps(config))
    assert (parsed.num_speculative_tokens, parsed.prompt_lookup_max, parsed.prompt_lookup_min) == (4, 4, 2)
    # Unset bounds are left to the runtime's defaults, as vLLM's are.
    bare = spec(variants=[_variant({"method": "ngram", "numSpeculativeTokens": 3})])
    assert _speculative_config(_deployment(bare)["spec"]["template"]["spec"]) == {
        "method": "ngram",
        "num_speculative_tokens": 3,
    }
    # A variant that does not speculate gets no flag, and no draft volume.
    plain = _deployment(s, "plain")["spec"]["template"]["spec"]
    assert _speculative_config(plain) is None
    assert all(v["name"] != "draft" for v in plain["volumes"])


def test_a_cached_draft_is_downloaded_and_mounted_as_the_model_is():
    s = spec(model=TARGET, variants=[_variant(_draft(DRAFT_HF))])
    draft = draft_spec(s, s.variants[0])
    ref = cache_ref(draft)
    assert ref is not None and ref != cache_ref(s)

    # Its claim and download Job are the cache code's, for the draft's source and revision.
    placement = JobPlacement(POD_SECURITY, pod_tolerations(draft))
    shared = {m["kind"]: m for m in cache_manifests(draft, NS, placement)}
    assert set(shared) == {"PersistentVolumeClaim", "Job"}
    command = shared["Job"]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:3] == ["pagoda-runtime", "fetch", DRAFT_HF["source"]] and COMMIT in command

    pod = _deployment(s)["spec"]["template"]["spec"]
    assert _speculative_config(pod) == {
        "method": "draft_model",
        "num_speculative_tokens": 4,
        "model": replica_model_path(DRAFT_MOUNT),
    }
    parsed = parse_speculative_config(json.dumps(_speculative_config(pod)))
    assert (parsed.method, parsed.model) == ("draft_model", replica_model_path(DRAFT_MOUNT))
    volume = next(v for v in pod["volumes"] if v["name"] == "draft")
    assert volume["persistentVolumeClaim"] == {"claimName": ref.name, "readOnly": True}
    mounts = pod["containers"][0]["volumeMounts"]
    assert {"name": "draft", "mountPath": DRAFT_MOUNT, "readOnly": True} in mounts
    # The pod waits for the draft's cache as for the model's (here a pvc:// model: no wait of its own).
    (wait,) = pod["initContainers"]
    assert wait["name"] == "wait-for-draft" and wait["volumeMounts"][0]["name"] == "draft"
    assert f"{DRAFT_MOUNT}/" in wait["command"][-1]


def test_pvc_and_bundled_drafts_are_read_where_they_are():
    on_claim = spec(
        model=TARGET,
        variants=[_variant(_draft({"source": "pvc://drafts/llama-1b", "family": "llama-3.2-1b"}))],
    )
    pod = _deployment(on_claim)["spec"]["template"]["spec"]
    assert _speculative_config(pod)["model"] == f"{DRAFT_MOUNT}/llama-1b"
    volume = next(v for v in pod["volumes"] if v["name"] == "draft")
    assert volume["persistentVolumeClaim"] == {"claimName": "drafts", "readOnly": True}
    assert "initContainers" not in pod

    bundled = spec(
        model={"source": "bundled://smollm2-135m", "family": "smollm2-135m"},
        variants=[_variant(_draft({"source": "bundled://smollm2-135m", "family": "smollm2-135m"}))],
        resources={"gpus": 0, "memory": "4Gi"},
    )
    pod = _deployment(bundled)["spec"]["template"]["spec"]
    assert _speculative_config(pod)["model"] == "smollm2-135m"
    assert all(v["name"] != "draft" for v in pod["volumes"])


# ---- the fit check -------------------------------------------------------------------------------


def _status(s, plan, **kwargs) -> dict:
    status = first_status(plan, **kwargs)
    return {c["type"]: c for c in status_patch(status)["conditions"]}


def test_a_variant_that_fits_only_without_its_draft_gets_no_pods_and_the_status_names_the_draft():
    # Llama 3 8B in bf16 with one 8k sequence needs 18.0 GiB; its 1B draft adds 2.3 GiB of weights
    # and 0.25 GiB of KV.
    s = spec(
        model=TARGET,
        variants=[_variant(None, "plain"), _variant(_draft(DRAFT_HF), "draft")],
        resources={"gpuMemory": "19Gi"},
    )
    plain, drafted = plan_service(s).variants
    assert plain.fit.fits and not drafted.fit.fits
    draft_arch = KNOWN_ARCHITECTURES["llama-3.2-1b"]
    assert drafted.fit.draft_weight_bytes == weight_bytes(draft_arch, "none")
    assert drafted.fit.draft_kv_bytes == kv_bytes_for_context(draft_arch, 8192)
    assert drafted.fit.required_bytes == (
        plain.fit.required_bytes + drafted.fit.draft_weight_bytes + drafted.fit.draft_kv_bytes
    )

    names = {
        o["metadata"]["name"]
        for o in render(plan_service(s), namespace=NS, name=NAME, uid=UID, options=RenderOptions())
    }
    assert variant_object_name(NAME, "plain") in names and variant_object_name(NAME, "draft") not in names
    fits = _status(s, plan_service(s))["ModelFits"]
    assert fits["status"] == "False" and fits["reason"] == "InsufficientMemory"
    assert f"variant draft (none) with draft model {DRAFT_HF['source']} needs" in fits["message"]
    assert "draft weights 2.30 GiB" in fits["message"] and "a smaller draft model" in fits["message"]
    assert "variant plain" not in fits["message"]


def test_under_tensor_parallelism_each_gpu_counts_its_slice_of_the_draft():
    # The runtime shards the draft over the target's ranks: Llama 3.2 1B's 32 heads and 8 KV heads
    # split over 2 GPUs, each holding half of its weights and KV.
    s = spec(model=TARGET, variants=[_variant(_draft(DRAFT_HF))], resources={"gpus": 2, "gpuMemory": "80Gi"})
    fit = plan_variant(s, s.variants[0]).fit
    half = KNOWN_ARCHITECTURES["llama-3.2-1b"].per_rank(2)
    assert fit.fits and fit.tensor_parallel_size == 2
    assert fit.draft_weight_bytes == weight_bytes(half, "none")
    assert fit.draft_kv_bytes == kv_bytes_for_context(half, 8192)
    assert fit.draft_kv_bytes * 2 == kv_bytes_for_context(KNOWN_ARCHITECTURES["llama-3.2-1b"], 8192)


def test_every_pod_of_a_multi_node_replica_mounts_the_draft_and_speculates():
    # Each rank loads its slice of the draft: the worker pods need it as the leader does.
    s = spec(
        model={"source": "pvc://models/llama-3-70b", "family": "llama-3-70b"},
        variants=[_variant(_draft(DRAFT_HF))],
        resources={"gpus": 4, "gpuMemory": "80Gi"},
        parallelism={"nodes": 2},
    )
    objects = render(plan_service(s), namespace=NS, name=NAME, uid=UID, options=RenderOptions())
    lws = next(o for o in objects if o["metadata"]["name"] == group_set_name(NAME, "bf16"))
    for template in ("leaderTemplate", "workerTemplate"):
        pod = lws["spec"]["leaderWorkerTemplate"][template]["spec"]
        assert _speculative_config(pod)["model"] == f"{DRAFT_MOUNT}/model"
        assert DRAFT_MOUNT in [m["mountPath"] for m in pod["containers"][0]["volumeMounts"]]


DEEPSEEK_V3 = {"source": "pvc://models/deepseek-v3", "family": "deepseek-v3", "maxModelLen": 32768}
MTP = {"method": "mtp", "numSpeculativeTokens": 1}


def test_mtp_is_rendered_without_a_model_and_counts_the_layer_split_over_the_gpus():
    """DeepSeek-V3 in fp8 on 8 GPUs drafting with its MTP layer: the flag is the runtime's, with no
    draft mounted; each GPU counts its slice of the layer (a mixture-of-experts layer of 256
    experts) and of its own LM head, eh_proj whole, and the layer's KV."""
    s = spec(
        model=DEEPSEEK_V3,
        variants=[{"name": "fp8", "quantization": "fp8", "speculative": MTP}],
        resources={"gpus": 8, "gpuMemory": "141Gi"},
    )
    pod = _deployment(s, "fp8")["spec"]["template"]["spec"]
    assert _speculative_config(pod) == {"method": "mtp", "num_speculative_tokens": 1}
    assert parse_speculative_config(json.dumps(_speculative_config(pod))).method == "mtp"
    assert all(v["name"] != "draft" for v in pod["volumes"])
    fit = plan_variant(s, s.variants[0]).fit
    layer = mtp_draft(KNOWN_ARCHITECTURES["deepseek-v3"], "fp8")
    sliced = layer.architecture.per_rank(8)
    assert fit.fits and fit.draft_weight_bytes == weight_bytes(sliced, "fp8") + layer.whole_parameters * 2
    assert fit.draft_kv_bytes == kv_bytes_for_context(sliced, 32768) == 32768 * 576 * 2
    # An eighth of 11.3B expert parameters in fp8 (1.41 GB), of the LM head in bf16 (0.23 GB), and
    # eh_proj whole (0.21 GB): 1.77 GiB a GPU.
    assert 1.7 * GIB < fit.draft_weight_bytes < 1.85 * GIB


def test_a_variant_that_fits_only_without_its_mtp_layer_says_so():
    s = spec(
        model=DEEPSEEK_V3,
        variants=[
            {"name": "fp8", "quantization": "fp8"},
            {"name": "mtp", "quantization": "fp8", "speculative": MTP},
        ],
        resources={"gpus": 8, "gpuMemory": "85Gi"},
    )
    plain, drafted = plan_service(s).variants
    assert plain.fit.fits and not drafted.fit.fits
    fits = _status(s, plan_service(s))["ModelFits"]
    assert "variant mtp (fp8) with its MTP layer needs" in fits["message"]


def test_mtp_for_a_model_without_an_mtp_layer_gets_no_pods_and_the_status_says_why():
    s = spec(model=TARGET, variants=[_variant(MTP)], resources={"gpuMemory": "80Gi"})
    plan = plan_service(s)
    assert not plan.servable
    assert plan.variants[0].speculation_error.startswith(
        "speculative.method mtp drafts with the model's multi-token-prediction layer, and the model has none"
    )
    ready = _status(s, plan)["Ready"]
    assert ready["reason"] == "InvalidSpeculation" and "use eagle3, draft_model or ngram" in ready["message"]


def test_a_draft_that_does_not_split_over_the_ranks_gets_no_pods_and_the_status_says_why():
    # SmolLM2-1.7B's 32 heads split over 2 GPUs; its 135M draft's 9 heads do not.
    target = {"source": "pvc://models/smollm2-1.7b", "family": "smollm2-1.7b"}
    draft = {"source": "pvc://drafts/smollm2-135m", "family": "smollm2-135m"}
    s = spec(model=target, variants=[_variant(_draft(draft))], resources={"gpus": 2, "gpuMemory": "80Gi"})
    plan = plan_service(s)
    assert not plan.servable and plan.variants[0].fit is None
    assert plan.variants[0].split_error == (
        "speculative.model (split over the same ranks as the model): parallelism.tensor 2 "
        "(resources.gpus x parallelism.nodes) does not split the model evenly over its ranks (attention "
        "heads, key/value heads, MLP); use one of 1, 3"
    )
    assert _status(s, plan)["Ready"]["reason"] == "InvalidParallelism"


def test_a_gguf_draft_is_sized_in_its_blocks():
    target = {"source": "pvc://models/smollm2-1.7b", "family": "smollm2-1.7b"}
    blocks = {"source": "bundled://smollm2-135m", "family": "smollm2-135m"}
    floats = {"source": "pvc://drafts/smollm2-135m", "family": "smollm2-135m"}
    sized = []
    for draft in (blocks, floats):
        s = spec(model=target, variants=[_variant(_draft(draft))], resources={"gpuMemory": "80Gi"})
        sized.append(plan_variant(s, s.variants[0]).fit.draft_weight_bytes)
    assert 0 < sized[0] < sized[1] // 2


def test_a_draft_the_spec_does_not_size_is_sized_from_what_its_job_read():
    unsized = {"source": "pvc://drafts/llama-1b"}
    s = spec(model=TARGET, variants=[_variant(_draft(unsized))], resources={"gpuMemory": "80Gi"})
    draft = draft_spec(s, s.variants[0])
    assert job_ref(draft) is not None and job_ref(draft).prefix == "pagoda-size"

    # While its sizing Job reads it the variant is unsized and gets no pods yet.
    sizing = CacheStatus("drafts", "Sizing", "reading", holds_replicas=True)
    plan = plan_with_cache(s, None, {"bf16": sizing})
    assert plan.held and plan.variants[0].fit is None
    conditions = _status(s, plan, draft_caches={"bf16": sizing})
    assert (
        conditions["ModelFits"]["status"] == "Unknown"
        and "speculative.model" in conditions["ModelFits"]["message"]
    )
    assert conditions["Ready"]["reason"] == "ModelCacheSizing"
    assert "variant bf16's speculative.model cache" in conditions["Ready"]["message"]

    read = CacheStatus("drafts", "Ready", "sized", checkpoint=Checkpoint(KNOWN_ARCHITECTURES["llama-3.2-1b"]))
    plan = plan_with_cache(s, None, {"bf16": read})
    assert not plan.held and plan.servable
    assert plan.variants[0].fit.draft_weight_bytes == weight_bytes(
        KNOWN_ARCHITECTURES["llama-3.2-1b"], "none"
    )


def test_a_draft_download_is_followed_like_the_models(monkeypatch):
    # status.modelCache shows the model's cache only; a draft's download shows in Ready's reason.
    bodies = {
        ("ml", "draft-downloading"): {
            "status": {"conditions": [{"type": "Ready", "reason": "ModelCacheDownloading"}]}
        },
        ("ml", "model-downloading"): {"status": {"modelCache": {"phase": "Downloading"}}},
        ("ml", "serving"): {"status": {"conditions": [{"type": "Ready", "reason": "Serving"}]}},
    }

    class Cluster:
        def get_inference_service(self, namespace, name):
            return bodies[(namespace, name)]

    refreshed = []
    monkeypatch.setattr(resync.status_refresh, "refresh_status", lambda k, ns, name: refreshed.append(name))
    for namespace, name in bodies:
        resync.remember("ADDED", namespace, name)
    try:
        resync.refresh_downloading(Cluster())
    finally:
        for namespace, name in bodies:
            resync.remember("DELETED", namespace, name)
    assert refreshed == ["draft-downloading", "model-downloading"]


def test_a_draft_cache_job_event_refreshes_the_services_using_that_draft():
    with_draft = {**MINIMAL, "variants": [_variant(_draft(DRAFT_HF))]}
    items = [
        {"metadata": {"name": "with-draft", "namespace": NS}, "spec": with_draft},
        {"metadata": {"name": "without", "namespace": NS}, "spec": MINIMAL},
    ]

    class Cluster:
        def request(self, method, path):
            return {"items": items}

    s = InferenceServiceSpec.model_validate(with_draft)
    assert cache_users(Cluster(), NS, cache_ref(draft_spec(s, s.variants[0])).key) == ["with-draft"]
