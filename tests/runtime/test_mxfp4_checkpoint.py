"""GPT-OSS checkpoints with MXFP4 experts, as OpenAI released them: dequantized at load exactly as
transformers dequantizes them, and served the same as the float checkpoint holding those values."""

import json

import pytest
import torch
from pagoda_runtime import LLM, SamplingParams
from pagoda_runtime.loading import mxfp4
from pagoda_runtime.loading.model_source import ModelLoadError, load_model_source
from safetensors.torch import load_file, save_file
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

from tests.runtime.tiny_models import build_tiny_model

EXPERT_TENSORS = ("gate_up_proj", "down_proj")


def random_mxfp4(shape, generator):
    """Blocks and scales of a float tensor of `shape` [E, K, rows], with scales around 2^-3 so the
    values are of a trained model's size."""
    experts, inputs, rows = shape
    parts = mxfp4.stored_parts("w", shape)
    blocks = torch.randint(0, 256, parts["w_blocks"], dtype=torch.uint8, generator=generator)
    scales = torch.randint(122, 127, parts["w_scales"], dtype=torch.uint8, generator=generator)
    return blocks, scales


def test_dequantize_equals_transformers():
    generator = torch.Generator().manual_seed(0)
    blocks, scales = random_mxfp4((3, 64, 48), generator)
    for dtype in (torch.float32, torch.bfloat16):
        ours = mxfp4.dequantize(blocks, scales, dtype)
        theirs = convert_moe_packed_tensors(blocks, scales, dtype=dtype)
        assert ours.shape == (3, 64, 48)
        assert torch.equal(ours, theirs)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """(float folder, MXFP4 folder) of the same tiny GPT-OSS: the float one holds the dequantized
    values of the MXFP4 one's experts."""
    root = tmp_path_factory.mktemp("gpt_oss")
    floats = build_tiny_model(root / "float", "gpt_oss")
    packed = build_tiny_model(root / "mxfp4", "gpt_oss")
    tensors = load_file(floats / "model.safetensors")
    stored = dict(tensors)
    generator = torch.Generator().manual_seed(1)
    for name in [n for n in tensors if n.endswith(EXPERT_TENSORS)]:
        blocks, scales = random_mxfp4(tensors[name].shape, generator)
        tensors[name] = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
        del stored[name]
        stored[f"{name}_blocks"], stored[f"{name}_scales"] = blocks, scales
    save_file(tensors, floats / "model.safetensors", metadata={"format": "pt"})
    save_file(stored, packed / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((packed / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn"],
    }
    (packed / "config.json").write_text(json.dumps(config))
    return floats, packed


def test_mxfp4_checkpoint_loads_the_float_checkpoints_values(checkpoints):
    floats, packed = checkpoints
    float_weights = dict(load_model_source(floats).weights)
    packed_weights = dict(load_model_source(packed).weights)
    assert float_weights.keys() == packed_weights.keys()
    for name, tensor in float_weights.items():
        assert torch.equal(packed_weights[name], tensor), name


def test_mxfp4_checkpoint_generates_as_the_float_one(checkpoints):
    floats, packed = checkpoints
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    prompts = ["Hello, world! How are", "def add(a, b):"]
    runs = [LLM(str(f), dtype="float32", device="cpu").generate(prompts, greedy) for f in (floats, packed)]
    assert [o.outputs[0].token_ids for o in runs[0]] == [o.outputs[0].token_ids for o in runs[1]]


def test_mxfp4_checkpoint_missing_scales_names_the_tensor(checkpoints, tmp_path):
    _, packed = checkpoints
    broken = tmp_path / "broken"
    broken.mkdir()
    for file in packed.iterdir():
        (broken / file.name).write_bytes(file.read_bytes())
    stored = load_file(broken / "model.safetensors")
    del stored["model.layers.0.mlp.experts.down_proj_scales"]
    save_file(stored, broken / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match="down_proj_scales"):
        load_model_source(broken)
