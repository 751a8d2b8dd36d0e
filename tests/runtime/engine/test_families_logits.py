"""Every family's logits against transformers' on the same tokens: float32 equal, bfloat16 within
transformers' own bfloat16 error, and int8, fp8 and int4 weights within the bounds the Llama family
meets on the same kind of model.

Tiny random models are far more sensitive to weight rounding than trained ones (the bundled
SmolLM2's bounds are in tests/runtime/quantization/test_quality.py), so the bound here is the Llama
family's own on these tiny models, measured on TEXT with this module's prefill_logits
(2026-11-26): the largest mean KL over the gqa, llama3, qwen2 and smollm variants was int8 0.0018,
fp8 0.041, int4 0.35 (top-1 agreement 0.90, 0.72 and 0.38 at worst). A family passes within 4
times that KL (mixture-of-experts routing turns small shifts into other experts: Mixtral's int8
KL is 0.0063 at top-1 0.94), which a wrong scale, nibble order or expert placement exceeds by
orders of magnitude."""

import pytest
import torch
from pagoda_runtime.executor.attention_metadata import AttentionMetadata
from pagoda_runtime.executor.kernels import get_attention_ops
from pagoda_runtime.executor.models import build_model
from pagoda_runtime.executor.quantization.quality import compare
from pagoda_runtime.loading.model_source import load_model_source
from transformers import AutoModelForCausalLM

from tests.runtime.tiny_models import FAMILY_VARIANTS, build_tiny_model, whole_prompt_overrides

TEXT = " ".join(
    [
        "The quick brown fox jumps over the lazy dog. Hello, world! How are you today?",
        "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
        "She sells sea shells by the sea shore; the shells she sells are sea shells.",
    ]
)


def prefill_logits(folder, token_ids: torch.Tensor, dtype: torch.dtype, quantization: str = "none"):
    """Float32 logits after each token, from the family's model built directly on the CPU."""
    loaded = load_model_source(folder, dtype, keep_quantized=quantization == "gguf")
    config = loaded.config
    model = build_model(config, get_attention_ops("cpu"), 256, quantization, "cpu", dtype)
    model.load_weights(loaded.weights)
    n, block_size = token_ids.shape[0], 4
    blocks = -(-n // block_size)
    arch = config.architecture
    shape = arch.kv_cache_shape
    caches = [
        torch.zeros(shape.planes, blocks, block_size, shape.heads, shape.head_dim, dtype=dtype)
        for _ in range(arch.num_hidden_layers)
    ]
    meta = AttentionMetadata(
        slot_mapping=torch.arange(n),
        query_start_loc=torch.tensor([0, n], dtype=torch.int32),
        seq_lens=torch.tensor([n], dtype=torch.int32),
        block_tables=torch.arange(blocks, dtype=torch.int32)[None],
        max_query_len=n,
        max_seq_len=n,
    )
    with torch.inference_mode():
        return model.compute_logits(model(token_ids, torch.arange(n), caches, meta))


@pytest.fixture(scope="module", params=sorted(FAMILY_VARIANTS))
def family(request, tmp_path_factory):
    variant = request.param
    folder = build_tiny_model(
        tmp_path_factory.mktemp(variant), variant, overrides=whole_prompt_overrides(variant)
    )
    tokens = torch.tensor(load_model_source(folder).tokenizer.encode(TEXT))
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.inference_mode():
        reference = hf(tokens[None]).logits[0].float()
        hf_bf16 = hf.to(torch.bfloat16)(tokens[None]).logits[0].float()
    return folder, tokens, reference, hf_bf16


def test_float32_logits_equal_transformers(family):
    folder, tokens, reference, _ = family
    torch.testing.assert_close(prefill_logits(folder, tokens, torch.float32), reference, rtol=1e-4, atol=1e-4)


def test_bfloat16_logits_are_within_transformers_own_bfloat16_error(family):
    folder, tokens, reference, hf_bf16 = family
    ours = prefill_logits(folder, tokens, torch.bfloat16)
    theirs = (hf_bf16 - reference).abs()
    error = (ours - reference).abs()
    assert error.mean() <= 1.5 * theirs.mean(), (float(error.mean()), float(theirs.mean()))
    assert error.max() <= 2 * theirs.max(), (float(error.max()), float(theirs.max()))


LLAMA_FAMILY_KL = {"int8": 0.0018, "fp8": 0.041, "int4": 0.35}


@pytest.mark.parametrize("quantization", sorted(LLAMA_FAMILY_KL))
def test_quantized_weights_keep_the_llama_familys_quality(family, quantization):
    folder, tokens, reference, _ = family
    report = compare(reference, prefill_logits(folder, tokens, torch.float32, quantization), tokens)
    assert report.mean_kl <= 4 * LLAMA_FAMILY_KL[quantization], report


@pytest.mark.parametrize("variant", ["llama3", "qwen3", "olmo2", "gemma2", "cohere"])
def test_attention_bias_reaches_o_proj_as_in_transformers(tmp_path, variant):
    """transformers' Llama-layout attention biases o_proj too where attention_bias is set; a model
    that read q, k and v's biases alone would be off by o's."""
    folder = build_tiny_model(tmp_path / variant, variant, overrides={"attention_bias": True})
    loaded = load_model_source(folder)
    assert loaded.config.architecture.attention_output_bias
    tokens = torch.tensor(loaded.tokenizer.encode(TEXT))
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.inference_mode():
        reference = hf(tokens[None]).logits[0].float()
    torch.testing.assert_close(prefill_logits(folder, tokens, torch.float32), reference, rtol=1e-4, atol=1e-4)
