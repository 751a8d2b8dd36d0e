"""Pre-quantized checkpoints served as they were saved: AWQ and GPTQ folders and GGUF Q4_0/Q4_1/Q8_0
projections load as packed int4/int8 weights and generate what their dequantized weights generate.

The float32 reference holds exactly the values the packed weights stand for, and on the CPU a packed
matmul is that dequantized matrix times the activations, so greedy tokens and logits must agree
exactly (up to float32 summation order in the logits).
"""

from __future__ import annotations

import json

import pytest
import torch
from pagoda_runtime.contract.config import EngineConfig
from pagoda_runtime.contract.quantization_selection import select_quantization
from pagoda_runtime.engine.llm_engine import LLMEngine
from pagoda_runtime.engine.sampling_params import SamplingParams
from pagoda_runtime.engine.scoring import score
from pagoda_runtime.executor.quantization.linear import QuantizedLinear
from pagoda_runtime.executor.quantization.memory import linear_weight_bytes
from pagoda_runtime.loading.gguf_reader import GGUFFile
from pagoda_runtime.loading.model_source import ModelLoadError, load_model_source
from safetensors.torch import load_file, save_file

from tests.runtime.tiny_models import build_tiny_gguf, build_tiny_model

from .quantized_folders import build_quantized_folder

PROMPTS = ["Hello, world! How are", "def add(a, b):", "The quick brown fox jumps"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


def _engine(model, quantization: str = "auto", loaded=None) -> LLMEngine:
    config = EngineConfig(
        model=str(model),
        dtype="float32",
        device="cpu",
        quantization=quantization,
        block_size=4,
        kv_cache_memory=8 * 2**20,
    )
    return LLMEngine(config, loaded)


def _greedy(engine: LLMEngine) -> list[list[int]]:
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), prompt, GREEDY)
    finished = {}
    while engine.has_unfinished():
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = output.outputs[0].token_ids
    return [finished[str(i)] for i in range(len(PROMPTS))]


def _projections(engine: LLMEngine) -> list[torch.nn.Module]:
    return [
        module
        for name, module in engine.runner.model.named_modules()
        if name.endswith(("qkv_proj", "o_proj", "gate_up_proj", "down_proj"))
    ]


@pytest.fixture(scope="module")
def float_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("float")
    # qwen2 puts a float bias beside the packed q/k/v weights.
    return {variant: build_tiny_model(root / variant, variant) for variant in ("gqa", "qwen2", "smollm")}


@pytest.mark.parametrize("method,variant", [("awq", "gqa"), ("gptq", "qwen2")])
def test_awq_and_gptq_folders_generate_what_their_dequantized_weights_generate(
    float_folders, tmp_path, method, variant
):
    folder = build_quantized_folder(float_folders[variant], tmp_path / method, method)
    engine = _engine(folder)
    assert engine.quantization == method and engine.memory.quantization == method
    for layer in _projections(engine):
        assert isinstance(layer, QuantizedLinear) and (layer.kind, layer.group_size) == ("int4", 32)
    original = dict(load_model_source(float_folders[variant]).weights)
    for name, weight in load_model_source(folder).weights:  # dequantized to float32
        error = (weight - original[name]).norm() / original[name].norm()
        assert error < (0.1 if name.endswith("_proj.weight") else 1e-7), name  # int4 steps of range / 15
    reference = _engine(folder, loaded=load_model_source(folder))
    assert reference.quantization == "none"
    # 4 bits and an fp16 scale and offset per 32 weights, against float32.
    assert linear_weight_bytes(engine.runner.model) * 6 < linear_weight_bytes(reference.runner.model)

    ids = engine.tokenizer.encode(" ".join(PROMPTS))
    assert torch.allclose(score(engine, ids), score(reference, ids), rtol=0, atol=1e-5)
    assert _greedy(engine) == _greedy(reference)


@pytest.mark.parametrize(
    "method,variant",
    [
        ("gptq", "qwen3_moe"),
        ("awq", "mixtral"),  # experts named w1, w3 and w2
        ("awq", "glm4_moe"),  # shared experts beside the routed ones
        ("gptq", "deepseek_v3"),  # kv_a_proj_with_mqa left in float, as modules_to_not_convert keeps it
        ("awq", "minimax_m2"),
    ],
)
def test_moe_experts_of_awq_and_gptq_checkpoints_stay_packed_and_a_float_projection_stays_float(
    tmp_path, method, variant
):
    folder = build_quantized_folder(build_tiny_model(tmp_path / variant, variant), tmp_path / method, method)
    engine = _engine(folder)
    assert engine.quantization == method
    modules = dict(engine.runner.model.named_modules())
    experts = [m for name, m in modules.items() if name.endswith(("experts_gate_up", "experts_down"))]
    assert experts and all((m.kind, m.group_size) == ("int4", 32) for m in experts)
    # A projection the checkpoint stores in float is served in float, never quantized again.
    floats = {
        name.split(".")[-1] for name, m in modules.items() if isinstance(m, QuantizedLinear) and m.row_blocks
    }
    assert floats == ({"kv_a_proj_with_mqa"} if variant == "deepseek_v3" else set())
    reference = _engine(folder, loaded=load_model_source(folder))
    ids = engine.tokenizer.encode(" ".join(PROMPTS))
    assert torch.allclose(score(engine, ids), score(reference, ids), rtol=0, atol=1e-5)
    assert _greedy(engine) == _greedy(reference)


@pytest.mark.parametrize("ggml_type,kind", [("Q4_0", "int4"), ("Q4_1", "int4"), ("Q8_0", "int8")])
def test_gguf_blocks_stay_packed_and_generate_what_the_dequantized_file_generates(
    float_folders, tmp_path, monkeypatch, ggml_type, kind
):
    # smollm is a llama: the file's q/k rows are permuted and must come back un-permuted.
    path = build_tiny_gguf(float_folders["smollm"], tmp_path / f"{ggml_type}.gguf", ggml_type)
    original = dict(load_model_source(float_folders["smollm"]).weights)
    for name, weight in load_model_source(path).weights:
        error = (weight - original[name]).norm() / original[name].norm()
        assert error < 0.1, name  # Q4_0 steps are a sixteenth of a block's range
    reference = _engine(path, "none")
    dequantized = []
    read = GGUFFile.dequantize
    monkeypatch.setattr(
        GGUFFile, "dequantize", lambda self, name: dequantized.append(name) or read(self, name)
    )
    engine = _engine(path, "gguf")
    monkeypatch.undo()
    assert dequantized and not [
        name for name in dequantized if name.startswith("blk.") and "norm" not in name
    ]
    for layer in _projections(engine):
        assert isinstance(layer, QuantizedLinear) and (layer.kind, layer.group_size) == (kind, 32)
    assert linear_weight_bytes(engine.runner.model) * 3 < linear_weight_bytes(reference.runner.model)
    assert engine.memory.weight_bytes == engine.memory.predicted_weight_bytes  # sized by its block type

    ids = engine.tokenizer.encode(" ".join(PROMPTS))
    assert torch.allclose(score(engine, ids), score(reference, ids), rtol=0, atol=1e-5)
    assert _greedy(engine) == _greedy(reference)


def test_auto_keeps_gguf_blocks_packed_unless_the_cpu_is_asked_for_an_exact_float_dtype():
    assert select_quantization("auto", "gguf", "cuda", "m.Q4_0.gguf") == "gguf"
    assert select_quantization("auto", "gguf", "cpu", "m.Q4_0.gguf") == "gguf"
    assert select_quantization("auto", "gguf", "cpu", "m.Q4_0.gguf", dtype="float32") == "none"
    assert select_quantization("auto", "gguf", "cuda", "m.Q4_0.gguf", dtype="float32") == "gguf"
    assert select_quantization("gguf", "gguf", "cpu", "m.Q4_0.gguf") == "gguf"
    assert select_quantization("int8", "gguf", "cuda", "m.Q4_0.gguf") == "int8"


def test_auto_packs_a_gguf_file_only_where_its_main_block_type_has_a_packed_layout():
    for packed in ("Q4_K_M", "Q4_K_S", "Q6_K", "Q8_0", "Q5_0", "Q4_1"):
        assert select_quantization("auto", "gguf", "cuda", f"m-{packed}.gguf") == "gguf", packed
    for dequantized in ("Q5_K_M", "Q5_K_S", "Q3_K_M", "Q2_K", "Q5_1", "F16"):
        assert select_quantization("auto", "gguf", "cuda", f"m-{dequantized}.gguf") == "none", dequantized
    # The operator reads the type from the name (unnamed: sized as dequantized); the runtime from the
    # tensors, which win.
    assert select_quantization("auto", "gguf", "cuda", "m.gguf") == "none"
    assert select_quantization("auto", "gguf", "cuda", "m.gguf", gguf_block="Q4_K") == "gguf"
    assert select_quantization("gguf", "gguf", "cuda", "m-Q5_K_M.gguf") == "gguf"
    assert select_quantization("auto", "awq", "cpu", "m") == "awq"
    assert select_quantization("auto", None, "cuda", "m") == "none"


@pytest.mark.parametrize(
    "requested,stored,message",
    [
        ("int8", "awq", "holds AWQ 4-bit weights, which Pagoda serves only as they are"),
        ("awq", "gptq", "use --quantization gptq or auto"),
        ("gptq", "gguf", "holds GGUF blocks, not GPTQ weights"),
        ("gguf", None, "holds float weights, so there are no GGUF blocks to load"),
        ("int3", None, "unknown quantization 'int3'"),
    ],
)
def test_a_quantization_the_checkpoint_cannot_give_is_refused(requested, stored, message):
    with pytest.raises(ValueError, match=message):
        select_quantization(requested, stored, "cpu", "m")


def _edit_config(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"].update(changes)
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"desc_act": True}, "act-order"),
        ({"bits": 8}, "8-bit"),
        ({"group_size": 48}, "groups of 48"),
        ({"quant_method": "bitsandbytes"}, "'bitsandbytes'"),
    ],
)
def test_unsupported_gptq_layouts_are_refused_by_name_before_loading(
    float_folders, tmp_path, changes, message
):
    folder = build_quantized_folder(float_folders["gqa"], tmp_path / "gptq", "gptq")
    _edit_config(folder, **changes)
    with pytest.raises(ModelLoadError, match=message):
        load_model_source(folder, keep_quantized=True)


def test_act_order_hidden_in_g_idx_is_refused(float_folders, tmp_path):
    folder = build_quantized_folder(float_folders["gqa"], tmp_path / "gptq", "gptq")
    tensors = load_file(folder / "model.safetensors")
    name = "model.layers.0.mlp.down_proj.g_idx"
    tensors[name] = tensors[name].flip(0).contiguous()
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(ValueError, match="act-order"):
        _engine(folder)


def test_packed_tensors_without_a_quantization_config_are_refused(float_folders, tmp_path):
    folder = build_quantized_folder(float_folders["gqa"], tmp_path / "awq", "awq")
    config = json.loads((folder / "config.json").read_text())
    del config["quantization_config"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="no quantization_config"):
        load_model_source(folder)


def test_a_projection_whose_parts_sit_in_different_shards_loads_whole(float_folders, tmp_path):
    single = build_quantized_folder(float_folders["gqa"], tmp_path / "single", "gptq")
    sharded = build_quantized_folder(float_folders["gqa"], tmp_path / "sharded", "gptq")
    tensors = load_file(sharded / "model.safetensors")
    (sharded / "model.safetensors").unlink()
    shards = {"scales.safetensors": {}, "rest.safetensors": {}}
    for name, tensor in tensors.items():
        shards["scales.safetensors" if name.endswith(".scales") else "rest.safetensors"][name] = tensor
    weight_map = {}
    for file, part in shards.items():
        save_file(part, sharded / file)
        weight_map.update(dict.fromkeys(part, file))
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    expected = dict(load_model_source(single, keep_quantized=True).weights)
    loaded = load_model_source(sharded, keep_quantized=True)
    assert loaded.quantization == "gptq"
    for name, weight in loaded.weights:
        if name.endswith("_proj.weight"):
            assert all(torch.equal(t, expected[name].tensors()[k]) for k, t in weight.tensors().items())
        else:
            assert torch.equal(weight, expected[name])
