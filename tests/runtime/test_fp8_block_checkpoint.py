"""Block-quantized FP8 checkpoints (Qwen3 and Qwen3-Next -FP8 releases, DeepSeek V3): each projection
stored as float8_e4m3fn with one scale per block, dequantized at load to exactly stored * scale, held as fp8
again under --quantization auto and as those floats under none."""

import json

import pytest
import torch
from pagoda_runtime import LLM, SamplingParams
from pagoda_runtime.contract.quantization_selection import select_quantization
from pagoda_runtime.loading.model_cache.architecture import checkpoint_facts
from pagoda_runtime.loading.model_source import ModelLoadError, load_model_source
from safetensors.torch import load_file, save_file

from tests.runtime.tiny_models import build_tiny_model

BLOCK = (32, 16)  # rows, inputs: several blocks per projection of the tiny models, ragged at the edge


def quantized(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] -> (float8_e4m3fn [N, K], float32 scales per block), as the FP8 releases store
    them: each block's largest magnitude at fp8's largest."""
    rows, inputs = weight.shape
    grid = (-(-rows // BLOCK[0]), -(-inputs // BLOCK[1]))
    scales = torch.empty(grid)
    stored = torch.empty(rows, inputs, dtype=torch.float8_e4m3fn)
    for i in range(grid[0]):
        for j in range(grid[1]):
            r, c = slice(i * BLOCK[0], (i + 1) * BLOCK[0]), slice(j * BLOCK[1], (j + 1) * BLOCK[1])
            scales[i, j] = weight[r, c].abs().max().clamp(min=1e-12) / 448.0
            stored[r, c] = (weight[r, c] / scales[i, j]).to(torch.float8_e4m3fn)
    return stored, scales


@pytest.fixture(scope="module", params=["qwen3", "qwen3_moe", "qwen3_next"])
def checkpoints(request, tmp_path_factory):
    """(FP8 folder, float folder holding exactly its dequantized values)."""
    root = tmp_path_factory.mktemp(request.param)
    fp8 = build_tiny_model(root / "fp8", request.param)
    floats = build_tiny_model(root / "float", request.param)
    tensors = load_file(fp8 / "model.safetensors")
    stored, dequantized = dict(tensors), dict(tensors)
    for name, weight in tensors.items():
        if name.startswith("model.layers.") and weight.dim() == 2 and not name.endswith("gate.weight"):
            stored[name], scales = quantized(weight)
            stored[name.removesuffix("weight") + "weight_scale_inv"] = scales
            full = scales.repeat_interleave(BLOCK[0], 0)[: weight.shape[0]]
            dequantized[name] = (
                stored[name].float() * full.repeat_interleave(BLOCK[1], 1)[:, : weight.shape[1]]
            )
    save_file(stored, fp8 / "model.safetensors", metadata={"format": "pt"})
    save_file(dequantized, floats / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((fp8 / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "weight_block_size": list(BLOCK),
    }
    (fp8 / "config.json").write_text(json.dumps(config))
    return fp8, floats


def test_fp8_weights_load_as_their_dequantized_values(checkpoints):
    fp8, floats = checkpoints
    loaded = load_model_source(fp8, keep_quantized=True)
    assert loaded.quantization == "fp8"
    expected = dict(load_model_source(floats).weights)
    weights = dict(loaded.weights)
    assert weights.keys() == expected.keys()
    for name, tensor in weights.items():
        assert torch.equal(tensor, expected[name]), name


def test_auto_holds_them_as_fp8_and_none_as_the_dequantized_floats(checkpoints):
    fp8, floats = checkpoints
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    prompts = ["Hello, world! How are", "def add(a, b):"]
    auto = LLM(str(fp8), dtype="float32", device="cpu")
    assert auto.engine.memory.quantization == "fp8"
    as_floats = LLM(str(fp8), dtype="float32", device="cpu", quantization="none")
    reference = LLM(str(floats), dtype="float32", device="cpu")
    tokens = [
        [o.outputs[0].token_ids for o in llm.generate(prompts, greedy)] for llm in (as_floats, reference)
    ]
    assert tokens[0] == tokens[1]
    assert auto.engine.memory.weight_bytes < reference.engine.memory.weight_bytes * 0.75


def test_the_operator_sizes_an_fp8_checkpoint_as_fp8():
    assert select_quantization("auto", "fp8", "cuda", "org/model-FP8") == "fp8"
    assert select_quantization("int4", "fp8", "cuda", "org/model-FP8") == "int4"
    with pytest.raises(ValueError, match="holds FP8 weights, not AWQ ones"):
        select_quantization("awq", "fp8", "cuda", "org/model-FP8")


def test_an_fp8_config_without_blocks_is_refused_by_name(checkpoints, tmp_path):
    fp8, _ = checkpoints
    folder = tmp_path / "per_tensor"
    folder.mkdir()
    for file in fp8.iterdir():
        (folder / file.name).write_bytes(file.read_bytes())
    config = json.loads((folder / "config.json").read_text())
    del config["quantization_config"]["weight_block_size"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="weight_block_size None"):
        load_model_source(folder)


def test_the_download_job_reports_the_checkpoint_as_stored_fp8(checkpoints):
    fp8, floats = checkpoints
    assert checkpoint_facts(fp8)["storedQuantization"] == "fp8"
    assert checkpoint_facts(floats)["storedQuantization"] is None
