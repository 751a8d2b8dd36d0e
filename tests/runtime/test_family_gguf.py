"""GGUF files of the families llama.cpp writes (qwen3, qwen3moe, gemma2, gemma3, phi3), converted from
tiny Hugging Face folders the way llama.cpp's converter does: the metadata gives the folder's
config, the tensors its weights under their Hugging Face names, and Q8_0 blocks served packed keep
the model's predictions."""

import dataclasses

import pytest
import torch
from pagoda_runtime.executor.quantization.quality import compare
from pagoda_runtime.loading.model_source import load_model_source

from tests.runtime.tiny_models import build_tiny_gguf, build_tiny_model

# Mean KL of the Llama family's tiny models (gqa, qwen2) in Q8_0 files against their float folders,
# every 2-D tensor quantized as here (2026-11-26, this module's measurement): the largest, gqa's.
# A family passes within 4 times it (Gemma 3's is 0.0074, its q/k norms amplifying the rounding).
LLAMA_FAMILY_Q8_0_KL = 0.0027
# Pattern-fixed metadata llama.cpp's loader assumes (query_pre_attn_scalar = head_dim) where the
# file cannot say otherwise.
GGUF_FAMILIES = {
    "qwen3": None,
    "qwen3_moe": None,  # its dense layer 1 has no router in the file either
    "gemma2": {"query_pre_attn_scalar": 16},
    "gemma3": None,
    "phi3": None,
}


@pytest.fixture(scope="module", params=sorted(GGUF_FAMILIES))
def folder(request, tmp_path_factory):
    variant = request.param
    return build_tiny_model(
        tmp_path_factory.mktemp(variant), variant, overrides=GGUF_FAMILIES[variant], tokenizer="chatml"
    )


def test_gguf_gives_the_folders_config_and_weights(folder, tmp_path):
    expected = load_model_source(folder)
    loaded = load_model_source(build_tiny_gguf(folder, tmp_path / "model.gguf"))
    assert loaded.config.architecture == expected.config.architecture
    # GGUF stores floats in 32 bits and end-of-sequence tokens as the tokenizer's.
    got, want = _fields(loaded.config), _fields(expected.config)
    numbers = [k for k, v in want.items() if isinstance(v, float)]
    assert {k: got[k] for k in numbers} == pytest.approx({k: want[k] for k in numbers}, rel=1e-6)
    assert {k: v for k, v in got.items() if k not in numbers} == {
        k: v for k, v in want.items() if k not in numbers
    }
    weights = dict(expected.weights)
    got = dict(loaded.weights)
    assert got.keys() == weights.keys()
    for name, tensor in weights.items():
        # Gemma's norms come back from llama.cpp's "weight + 1" through float32.
        torch.testing.assert_close(got[name], tensor, rtol=0, atol=1e-6, msg=name)


def _fields(config) -> dict:
    """Every computation field of a ModelConfig, tuples and the rope scaling spread out."""
    flat = {}
    for name, value in dataclasses.asdict(config).items():
        if name in ("architecture", "eos_token_ids", "bos_token_id"):
            continue
        for key, item in (value or {}).items() if isinstance(value, dict) else [("", value)]:
            items = item if isinstance(item, tuple) else (item,)
            flat |= {
                f"{name}.{key}.{i}": float(x) if isinstance(x, float) else x for i, x in enumerate(items)
            }
    return flat


def test_q8_0_blocks_are_served_packed_and_keep_the_predictions(folder, tmp_path):
    from tests.runtime.engine.test_families_logits import TEXT, prefill_logits

    path = build_tiny_gguf(folder, tmp_path / "model.Q8_0.gguf", "Q8_0")
    packed = load_model_source(path, keep_quantized=True)
    assert packed.quantization == "gguf" and packed.gguf_block == "Q8_0"
    tokens = torch.tensor(packed.tokenizer.encode(TEXT))
    served = prefill_logits(path, tokens, torch.float32, "gguf")
    # Packed, the blocks compute what the file's dequantized weights compute...
    dequantized = prefill_logits(path, tokens, torch.float32)
    torch.testing.assert_close(served, dequantized, rtol=1e-4, atol=1e-4 * float(dequantized.abs().max()))
    # ... which stays as close to the float model as the Llama family's Q8_0 files do.
    report = compare(prefill_logits(folder, tokens, torch.float32), served, tokens)
    assert report.mean_kl <= 4 * LLAMA_FAMILY_Q8_0_KL, report
