"""A variant's EAGLE head (speculative.method eagle3 or eagle): admitted with its source, downloaded
and mounted as a draft model is, named in --speculative-config by its mounted folder, sized from its
config.json by the contract's rule (the bytes the runtime holds) and counted by the fit check on the
one GPU that holds it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from kubernetes_schema import validate
from operator_specs import MINIMAL, NAME, NS, UID, first_status, spec
from pagoda_operator.inference_service import error_text
from pagoda_operator.model_cache import (
    JobPlacement,
    cache_manifests,
    cache_ref,
    cache_status,
    draft_spec,
    replica_model_path,
)
from pagoda_operator.models import InferenceServiceSpec, SpeculativeSpec
from pagoda_operator.names import variant_object_name
from pagoda_operator.plan import Checkpoint, plan_service, plan_variant
from pagoda_operator.render import DRAFT_MOUNT, POD_SECURITY, RenderOptions, pod_tolerations, render
from pagoda_operator.status import status_patch
from pagoda_runtime.contract.eagle_sizing import EagleHeadShape
from pagoda_runtime.contract.model_catalogue import KNOWN_ARCHITECTURES
from pagoda_runtime.contract.sizing import GIB, weight_bytes
from pagoda_runtime.contract.speculative import parse_speculative_config
from pagoda_runtime.loading.model_cache.architecture import checkpoint_facts
from pagoda_runtime.loading.model_cache.fetch import termination_summary
from pydantic import ValidationError

from tests.runtime.tiny_eagle import write_eagle1_head, write_eagle3_head
from tests.runtime.tiny_models import build_tiny_model

CRD_FILE = Path(__file__).resolve().parents[2] / "crds" / "inferenceservices.pagoda.dev.yaml"
COMMIT = "0e9e39f249a16976918f6564b8830bc894c89659"
HEAD_HF = {"source": "hf://yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "revision": COMMIT}
TARGET = {"source": "pvc://models/llama-3.1-8b", "family": "llama-3.1-8b", "maxModelLen": 8192}
# config.json of the published EAGLE-3 head for Llama 3.1 8B Instruct (the tensors beside it: fc,
# midlayer.*, norm, lm_head, d2t and t2d).
LLAMA31_EAGLE3 = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 1,
    "vocab_size": 128256,
    "draft_vocab_size": 32000,
    "max_position_embeddings": 2048,
}


def _variant(speculative: dict | None, name: str) -> dict:
    return {"name": name, **({"speculative": speculative} if speculative is not None else {})}


def _head(model: dict | None, method: str = "eagle3") -> dict:
    return {"method": method, "numSpeculativeTokens": 3, **({"model": model} if model else {})}


def _downloaded(termination_message: str) -> Checkpoint | None:
    """The checkpoint the operator reads back from a completed download Job whose pod left this."""
    job = {"metadata": {"name": "j"}, "status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    terminated = {"terminated": {"exitCode": 0, "message": termination_message}}
    pod = {"status": {"phase": "Succeeded", "containerStatuses": [{"name": "download", "state": terminated}]}}
    return cache_status(cache_ref(spec(model=HEAD_HF)), None, job, [pod], "").checkpoint


def _read(shape: EagleHeadShape) -> Checkpoint:
    return _downloaded(json.dumps({"revision": COMMIT, "eagleHead": shape.to_facts()}))


def _pod_spec(s, variant: str) -> dict:
    objects = render(plan_service(s), namespace=NS, name=NAME, uid=UID, options=RenderOptions())
    for obj in objects:
        validate(obj)
    deployment = next(
        o
        for o in objects
        if o["kind"] == "Deployment" and o["metadata"]["name"] == variant_object_name(NAME, variant)
    )
    return deployment["spec"]["template"]["spec"]


def test_an_eagle_head_is_admitted_with_its_source_and_refused_without_one():
    for method in ("eagle3", "eagle"):
        parsed = InferenceServiceSpec.model_validate(
            {**MINIMAL, "variants": [_variant(_head(HEAD_HF, method), "e")]}
        )
        assert parsed.variants[0].speculative.eagle_head
    with pytest.raises(ValidationError) as refused:
        InferenceServiceSpec.model_validate({**MINIMAL, "variants": [_variant(_head(None), "e")]})
    message = "speculative.method eagle and eagle3 need speculative.model: the EAGLE head's source"
    assert "spec.variants.0.speculative" in error_text(refused.value) and message in error_text(refused.value)
    # The apiserver applies the same rule (tests/cluster runs it), and its enum admits both methods.
    schema = yaml.safe_load(CRD_FILE.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    variant = schema["properties"]["spec"]["properties"]["variants"]["items"]["properties"]
    node = variant["speculative"]
    assert {"eagle", "eagle3"} <= set(node["properties"]["method"]["enum"])
    rule = next(r for r in SpeculativeSpec.RULES if r.message == message)
    assert {"rule": rule.cel, "message": message} in node["x-kubernetes-validations"]
    assert rule.cel == "!(self.method in ['eagle', 'eagle3']) || has(self.model)"


def test_an_eagle_head_is_downloaded_mounted_and_named_by_its_folder():
    s = spec(model=TARGET, variants=[_variant(_head(HEAD_HF), "eagle")])
    head = draft_spec(s, s.variants[0])
    shared = {
        m["kind"]: m for m in cache_manifests(head, NS, JobPlacement(POD_SECURITY, pod_tolerations(head)))
    }
    command = shared["Job"]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:3] == ["pagoda-runtime", "fetch", HEAD_HF["source"]] and COMMIT in command

    pod = _pod_spec(s, "eagle")
    args = pod["containers"][0]["args"]
    config = json.loads(args[args.index("--speculative-config") + 1])
    assert config == {
        "method": "eagle3",
        "num_speculative_tokens": 3,
        "model": replica_model_path(DRAFT_MOUNT),
    }
    parsed = parse_speculative_config(json.dumps(config))
    assert (parsed.method, parsed.model) == ("eagle3", replica_model_path(DRAFT_MOUNT))
    volume = next(v for v in pod["volumes"] if v["name"] == "draft")
    assert volume["persistentVolumeClaim"] == {"claimName": cache_ref(head).name, "readOnly": True}
    assert {"name": "draft", "mountPath": DRAFT_MOUNT, "readOnly": True} in pod["containers"][0][
        "volumeMounts"
    ]
    (wait,) = pod["initContainers"]
    assert wait["name"] == "wait-for-draft"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("heads")
    target = build_tiny_model(root / "target", "llama3", overrides={"num_hidden_layers": 4})
    vocab = json.loads((target / "config.json").read_text())["vocab_size"]
    heads = {
        "eagle3": write_eagle3_head(root / "eagle3", target, list(range(0, vocab, 2))),
        "eagle": write_eagle1_head(root / "eagle1", target),
    }
    return target, heads


@pytest.mark.parametrize("method", ["eagle3", "eagle"])
def test_the_operator_sizes_a_head_as_the_runtime_holds_it(tiny, method):
    from pagoda_runtime import LLM

    target, heads = tiny
    # What the download Job reports of the folder, read back by the operator.
    manifest = {"revision": COMMIT, "bytes": 1, "modelPath": ".", **checkpoint_facts(heads[method])}
    shape = _downloaded(termination_summary(manifest)).eagle_head
    assert shape.method == method and shape.architecture.num_hidden_layers == 1

    llm = LLM(
        str(target),
        speculative_config={"method": method, "model": str(heads[method]), "num_speculative_tokens": 3},
        dtype="float32",
        device="cpu",
        block_size=4,
        max_num_batched_tokens=32,
    )
    held = llm.engine.memory.draft
    assert held.weight_bytes == shape.weight_bytes("float32") == held.predicted_weight_bytes
    # The fit check counts the same bytes in the pods' bfloat16.
    assert shape.weight_bytes() * 2 == shape.weight_bytes("float32")


def _fits_condition(s, plan) -> dict:
    status = first_status(plan)
    return next(c for c in status_patch(status)["conditions"] if c["type"] == "ModelFits")


def test_a_variant_that_fits_only_without_its_head_gets_no_pods_and_the_status_names_the_head():
    # Llama 3.1 8B in bf16 with one 8k sequence needs 18.0 GiB; its EAGLE-3 head adds 0.79 GiB of
    # weights (fc, one layer, a 32k-row LM head) and 32 MiB of KV (one layer of 8192 tokens).
    shape = EagleHeadShape.from_config("eagle3", LLAMA31_EAGLE3, ["fc.weight", "d2t", "t2d"])
    s = spec(
        model=TARGET,
        variants=[_variant(None, "plain"), _variant(_head(HEAD_HF), "eagle")],
        resources={"gpuMemory": "18.5Gi"},
    )
    unread = plan_service(s)
    assert unread.variants[0].fit.fits and unread.variants[1].fit is None

    plan = plan_service(s, draft_checkpoints={"eagle": _read(shape)})
    plain, eagle = plan.variants
    assert plain.fit.fits and not eagle.fit.fits
    assert eagle.fit.draft_weight_bytes == shape.weight_bytes()
    assert 0.78 * GIB < eagle.fit.draft_weight_bytes < 0.80 * GIB
    assert eagle.fit.draft_kv_bytes == 8192 * 2 * 8 * 128 * 2
    assert (
        eagle.fit.required_bytes
        == plain.fit.required_bytes + eagle.fit.draft_weight_bytes + eagle.fit.draft_kv_bytes
    )

    names = {
        o["metadata"]["name"] for o in render(plan, namespace=NS, name=NAME, uid=UID, options=RenderOptions())
    }
    assert variant_object_name(NAME, "plain") in names and variant_object_name(NAME, "eagle") not in names
    fits = _fits_condition(s, plan)
    assert fits["status"] == "False" and fits["reason"] == "InsufficientMemory"
    assert f"variant eagle (none) with EAGLE head {HEAD_HF['source']} needs" in fits["message"]
    assert "EAGLE head weights 0.79 GiB" in fits["message"] and "a smaller EAGLE head" in fits["message"]
    assert "variant plain" not in fits["message"]


def test_under_tensor_parallelism_the_head_is_counted_whole_on_each_gpu():
    # Every rank holds the whole head (its weights and one layer's KV); the target's are split in two.
    shape = EagleHeadShape.from_config("eagle3", LLAMA31_EAGLE3)
    s = spec(
        model=TARGET, variants=[_variant(_head(HEAD_HF), "eagle")], resources={"gpus": 2, "gpuMemory": "80Gi"}
    )
    plan = plan_variant(s, s.variants[0], draft_checkpoint=_read(shape))
    assert plan.split_error is None and plan.fit.fits and plan.fit.tensor_parallel_size == 2
    assert plan.fit.weight_bytes == weight_bytes(KNOWN_ARCHITECTURES["llama-3.1-8b"].per_rank(2), "none")
    assert plan.fit.draft_weight_bytes == shape.weight_bytes()
    assert plan.fit.draft_kv_bytes == shape.kv_bytes_for_context(8192)


def test_a_checkpoint_of_the_other_head_format_is_not_sized_as_the_method():
    eagle1 = EagleHeadShape.from_config("eagle", {**LLAMA31_EAGLE3, "architectures": ["LlamaForCausalLM"]})
    s = spec(
        model=TARGET, variants=[_variant(_head(HEAD_HF, "eagle3"), "eagle")], resources={"gpuMemory": "80Gi"}
    )
    assert plan_variant(s, s.variants[0], draft_checkpoint=_read(eagle1)).fit is None


def test_a_head_the_spec_gives_an_architecture_is_sized_before_it_is_read():
    # A pvc:// head with its shape in the spec: its own LM head counted over the whole vocabulary
    # (the spec does not say the draft vocabulary), its KV one layer's whatever numLayers says.
    layer = {
        "numLayers": 3,
        "hiddenSize": 4096,
        "intermediateSize": 14336,
        "numAttentionHeads": 32,
        "numKeyValueHeads": 8,
        "headDim": 128,
        "vocabSize": 128256,
        "maxPositionEmbeddings": 2048,
    }
    head = {"source": "pvc://heads/eagle3-llama-3.1-8b", "architecture": layer}
    s = spec(model=TARGET, variants=[_variant(_head(head), "eagle")], resources={"gpuMemory": "80Gi"})
    fit = plan_variant(s, s.variants[0]).fit
    read = EagleHeadShape.from_config("eagle3", {**LLAMA31_EAGLE3, "draft_vocab_size": 128256})
    assert fit.fits and fit.draft_weight_bytes == read.weight_bytes()
    assert fit.draft_kv_bytes == read.kv_bytes_for_context(8192)


def test_a_head_folder_whose_config_lacks_its_shape_fails_its_download_saying_which_field(tmp_path, tiny):
    _, heads = tiny
    folder = tmp_path / "head"
    folder.mkdir()
    config = json.loads((heads["eagle3"] / "config.json").read_text())
    del config["intermediate_size"]
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes((heads["eagle3"] / "model.safetensors").read_bytes())
    with pytest.raises(ValueError, match="config.json lacks intermediate_size"):
        checkpoint_facts(folder)
