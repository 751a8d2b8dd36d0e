"""compressed-tensors checkpoints (what llm-compressor writes: FP8, W8A8, W4A16) and Meta's fbgemm FP8,
written here by the compressed-tensors library itself: their weights load as the library's own
decompression gives them (transformers with dequantize=True), held in their stored width under
--quantization auto; what Pagoda does not read is refused by name before any weight is read."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from compressed_tensors.compressors import ModelCompressor
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
from compressed_tensors.quantization import (
    QuantizationArgs,
    QuantizationConfig,
    apply_quantization_config,
    dequantize,
    preset_name_to_scheme,
    quantize,
)
from pagoda_runtime import LLM, SamplingParams
from pagoda_runtime.contract.quantization_selection import select_quantization
from pagoda_runtime.engine.scoring import score
from pagoda_runtime.executor.quantization.memory import linear_weight_bytes
from pagoda_runtime.executor.quantization.packed import PackedWeight
from pagoda_runtime.loading.model_cache.architecture import checkpoint_facts
from pagoda_runtime.loading.model_source import ModelLoadError, load_model_source
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, CompressedTensorsConfig

from tests.runtime.tiny_models import build_tiny_model

# preset -> (the library's format, Pagoda's stored name, the largest quantized value)
PRESETS = {
    "W4A16": ("pack-quantized", "gptq", 7.0),
    "FP8_DYNAMIC": ("float-quantized", "fp8", 448.0),
    "FP8": ("float-quantized", "fp8", 448.0),  # one scale per tensor, static activation scales
    "W8A8": ("int-quantized", "int8", 127.0),
}
PROMPTS = ["Hello, world! How are", "def add(a, b):"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def compressed_folder(float_folder, out, preset: str, group_size: int = 32, ignore=("lm_head",)):
    """The float model quantized by the library (each scale: the range it covers over the largest
    value) and saved compressed, with its tokenizer; `ignore`: the layers left float."""
    fmt, _, largest = PRESETS[preset]
    model = AutoModelForCausalLM.from_pretrained(float_folder, dtype=torch.float32)
    scheme = preset_name_to_scheme(preset, ["Linear"])
    if scheme.weights.strategy == "group":
        scheme.weights.group_size = group_size
    apply_quantization_config(
        model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=list(ignore))
    )
    for module in model.modules():
        if hasattr(module, "weight_scale"):
            weight, args = module.weight.detach().float(), module.quantization_scheme.weights
            if args.strategy == "group":
                scale = weight.reshape(weight.shape[0], -1, args.group_size).abs().amax(-1)
            elif args.strategy == "channel":
                scale = weight.abs().amax(-1, keepdim=True)
            else:
                scale = weight.abs().amax()
            module.weight_scale.data = (scale / largest).reshape(module.weight_scale.shape)
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format=fmt)
    compressor.compress_model(model)
    model.save_pretrained(out)
    compressor.update_config(out)
    for file in float_folder.iterdir():
        if file.name.startswith(("tokenizer", "special_tokens", "generation")):
            shutil.copy(file, out / file.name)
    return out


@pytest.fixture(scope="module")
def float_folder(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("float") / "llama3", "llama3")


@pytest.fixture(scope="module", params=list(PRESETS))
def checkpoint(request, float_folder, tmp_path_factory):
    return request.param, compressed_folder(
        float_folder, tmp_path_factory.mktemp(request.param), request.param
    )


def test_weights_load_as_the_librarys_own_decompression(checkpoint):
    preset, folder = checkpoint
    assert load_model_source(folder, keep_quantized=True).quantization == PRESETS[preset][1]
    reference = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, quantization_config=CompressedTensorsConfig(dequantize=True)
    ).state_dict()
    weights = dict(load_model_source(folder).weights)
    assert weights.keys() <= reference.keys() and "model.layers.0.mlp.down_proj.weight" in weights
    for name, weight in weights.items():
        expected = reference[name].float()
        # INT4 scales are held in float16 (the packed int4 layout's), the 8-bit ones exactly.
        tolerance = 1e-3 if preset == "W4A16" else 0.0
        assert float((weight - expected).abs().max()) <= tolerance * float(expected.abs().max()), name


def test_auto_serves_the_stored_width_and_generates_what_the_decompressed_weights_generate(
    checkpoint, tmp_path
):
    preset, folder = checkpoint
    stored = PRESETS[preset][1]
    # The decompressed weights saved as a float checkpoint: the same model, read as floats.
    plain = tmp_path / "plain"
    shutil.copytree(folder, plain)
    config = json.loads((plain / "config.json").read_text())
    del config["quantization_config"]
    (plain / "config.json").write_text(json.dumps(config))
    save_file(dict(load_model_source(folder).weights), plain / "model.safetensors", metadata={"format": "pt"})
    reference = LLM(str(plain), dtype="float32", device="cpu", block_size=4)
    auto = LLM(str(folder), dtype="float32", device="cpu", block_size=4)
    assert auto.engine.quantization == stored
    # 4 or 8 bits a weight and a scale per group or row, against float32.
    assert linear_weight_bytes(auto.engine.runner.model) * 3 < linear_weight_bytes(
        reference.engine.runner.model
    )
    # Packed INT4 on the CPU is the dequantized matrix times the activations: the same logits. The
    # 8-bit weights are held as Pagoda quantizes (one scale per row); --quantization none keeps the
    # decompressed floats.
    same = (
        auto
        if stored == "gptq"
        else LLM(str(folder), dtype="float32", device="cpu", block_size=4, quantization="none")
    )
    ids = auto.get_tokenizer().encode(" ".join(PROMPTS))
    assert torch.allclose(score(same.engine, ids), score(reference.engine, ids), rtol=0, atol=1e-5)
    tokens = [[o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)] for llm in (same, reference)]
    assert tokens[0] == tokens[1]
    assert checkpoint_facts(folder)["storedQuantization"] == stored


@pytest.mark.parametrize("router", ["float", "int4"])
def test_a_mixture_of_experts_keeps_its_experts_packed(tmp_path, router):
    """Qwen3-MoE as llm-compressor saves it: each expert's projections packed by the library's own
    quantize and pack_to_int32 (transformers 5 holds experts fused, outside the library's Linear
    targets, so the test packs them as earlier releases saved them), the router left float or,
    quantized too, dequantized at load: only projections run packed."""
    floats = build_tiny_model(tmp_path / "moe", "qwen3_moe")
    folder = compressed_folder(floats, tmp_path / "w4a16", "W4A16", ignore=("lm_head", "re:.*mlp.gate$"))
    tensors = load_file(folder / "model.safetensors")
    args = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=32)
    expected = {}
    for name in [
        n for n in tensors if ".experts." in n or (router == "int4" and n.endswith("mlp.gate.weight"))
    ]:
        weight = tensors.pop(name)
        scale = weight.reshape(weight.shape[0], -1, 32).abs().amax(-1) / 7.0
        zero = torch.zeros_like(scale, dtype=torch.int8)
        q = quantize(weight, scale, zero, args, dtype=torch.int8)
        prefix = name.removesuffix("weight")
        tensors[prefix + "weight_packed"] = pack_to_int32(q, 4)
        tensors[prefix + "weight_scale"] = scale
        tensors[prefix + "weight_shape"] = torch.tensor(weight.shape)
        expected[name] = dequantize(q, scale, zero, args)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    packed = dict(load_model_source(folder, keep_quantized=True).weights)
    assert isinstance(packed["model.layers.0.mlp.experts.3.down_proj.weight"], PackedWeight)
    assert isinstance(packed["model.layers.0.mlp.gate.weight"], torch.Tensor)
    loaded = dict(load_model_source(folder).weights)
    for name, weight in expected.items():
        assert torch.allclose(loaded[name], weight, rtol=0, atol=1e-3 * float(weight.abs().max())), name
    llm = LLM(str(folder), dtype="float32", device="cpu", block_size=4)
    assert llm.engine.quantization == "gptq"
    assert len(llm.generate(PROMPTS, GREEDY)[0].outputs[0].token_ids) == GREEDY.max_tokens


def test_the_operator_sizes_an_int8_checkpoint_as_int8():
    assert select_quantization("auto", "int8", "cuda", "org/model-quantized.w8a8") == "int8"
    assert select_quantization("fp8", "int8", "cuda", "org/model-quantized.w8a8") == "fp8"
    with pytest.raises(ValueError, match="holds INT8 weights, not GPTQ ones"):
        select_quantization("gptq", "int8", "cuda", "org/model-quantized.w8a8")


def test_meta_fbgemm_fp8_rows_load_dequantized(float_folder, tmp_path):
    """Llama 3.1 405B FP8's layout: float8_e4m3fn weights, one float32 scale per output row."""
    folder = tmp_path / "fbgemm"
    shutil.copytree(float_folder, folder)
    tensors = load_file(folder / "model.safetensors")
    stored, expected = dict(tensors), {}
    for name, weight in tensors.items():
        if name.endswith("_proj.weight"):
            scale = weight.abs().amax(-1, keepdim=True) / 448.0
            stored[name] = (weight / scale).to(torch.float8_e4m3fn)
            stored[name.removesuffix("weight") + "weight_scale"] = scale
            expected[name] = stored[name].float() * scale
    save_file(stored, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "fbgemm_fp8",
        "activation_scale_ub": 1200.0,
        "modules_to_not_convert": ["lm_head"],
    }
    (folder / "config.json").write_text(json.dumps(config))
    loaded = dict(load_model_source(folder).weights)
    for name, weight in expected.items():
        assert torch.equal(loaded[name], weight), name
    assert load_model_source(folder, keep_quantized=True).quantization == "fp8"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"format": "nvfp4-pack-quantized"},
            "format 'nvfp4-pack-quantized' with 4-bit int weights is not one",
        ),
        ({"weights": {"symmetric": False}}, "quantized asymmetrically"),
        ({"weights": {"actorder": "group"}}, "in activation order"),
        ({"weights": {"group_size": 48}}, "groups are 48 inputs"),
        ({"weights": {"strategy": "tensor"}}, "scaled by 'tensor'"),
        ({"second_group": {"num_bits": 8}}, "do not quantize every layer's weights the same way"),
    ],
)
def test_schemes_pagoda_does_not_read_are_refused_by_name(float_folder, tmp_path, change, message):
    folder = compressed_folder(float_folder, tmp_path / "w4a16", "W4A16")
    config = json.loads((folder / "config.json").read_text())
    qc = config["quantization_config"]
    weights = qc["config_groups"]["group_0"]["weights"]
    qc["format"] = change.get("format", qc["format"])
    weights.update(change.get("weights", {}))
    if "second_group" in change:
        qc["config_groups"]["group_1"] = {
            "targets": ["re:.*down_proj"],
            "weights": {**weights, **change["second_group"]},
        }
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=message):
        load_model_source(folder)


def test_llama4_fbgemm_fp8_experts_load_dequantized(tmp_path):
    """Llama-4-Maverick-FP8's layout: each projection's rows scaled as above, and each layer's fused
    experts stored as float8_e4m3fn with a scale per expert and output, [E, 1, 2I] for gate_up_proj
    and [E, H, 1] for down_proj."""
    folder = build_tiny_model(tmp_path / "llama4", "llama4")
    tensors = load_file(folder / "model.safetensors")
    stored, expected = dict(tensors), {}
    for name, weight in tensors.items():
        if name.endswith("_proj.weight") and ".layers." in name:
            scale = weight.abs().amax(-1, keepdim=True) / 448.0
            stored[name] = (weight / scale).to(torch.float8_e4m3fn)
            stored[name.removesuffix("weight") + "weight_scale"] = scale
            expected[name] = stored[name].float() * scale
        elif name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            scale = weight.abs().amax(1, keepdim=True) / 448.0  # [E, 1, outputs]
            stored[name] = (weight / scale).to(torch.float8_e4m3fn)
            down = name.endswith("down_proj")
            stored[name + "_scale"] = scale.transpose(1, 2).contiguous() if down else scale
            expected[name] = stored[name].float() * scale
    save_file(stored, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fbgemm_fp8", "modules_to_not_convert": ["lm_head"]}
    (folder / "config.json").write_text(json.dumps(config))
    loaded = dict(load_model_source(folder).weights)
    assert any(name.endswith("experts.down_proj") for name in expected)
    for name, weight in expected.items():
        assert torch.equal(loaded[name], weight), name
    llm = LLM(str(folder), dtype="float32", device="cpu", block_size=4)
    assert llm.engine.quantization == "fp8"
    assert len(llm.generate(PROMPTS, GREEDY)[0].outputs[0].token_ids) == GREEDY.max_tokens
