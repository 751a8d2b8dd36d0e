"""Every model family's greedy tokens equal Hugging Face transformers' in float32, on tiny random
models with the family's quirks switched on (tiny_models.FAMILY_VARIANTS: q/k norms, soft-caps,
windows shorter than the prompts, tied and untied embeddings, more experts than top-k, partial
rotary LongRoPE), whatever the batching does: prefix caching, chunked prefill, preemption, and one
prompt of more than 130 tokens. Phi-3's sequences stay within its original context, where
transformers and Pagoda both rotate with the short factors (kernels/rope_cache.py)."""

import pytest
import torch
from pagoda_runtime import LLM, SamplingParams
from transformers import AutoModelForCausalLM

from tests.runtime.engine.hf_reference import hf_greedy
from tests.runtime.engine.test_greedy_matches_hf import (
    assert_all_blocks_free,
    check_writes_go_to_private_blocks,
)
from tests.runtime.tiny_models import FAMILY_VARIANTS, build_tiny_model, whole_prompt_overrides

NEW_TOKENS = 12
GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
PROMPTS = [
    "Hello, world! How are",
    "def add(a, b):",
    "The quick brown fox jumps over the lazy dog. She",
    "The quick brown fox jumps over the lazy dog. He",  # shares whole blocks with the one before
    "1",
]
LONG_PROMPT = " ".join(["The quick brown fox jumps over the lazy dog."] * 14)


def reference(folder):
    return AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    ).eval()


def assert_matches_hf(outputs, model, new_tokens=NEW_TOKENS):
    for output in outputs:
        expected = hf_greedy(model, output.prompt_token_ids, new_tokens)
        assert output.outputs[0].token_ids == expected, f"prompt {output.prompt!r}"


@pytest.mark.parametrize("variant", sorted(FAMILY_VARIANTS))
def test_family_matches_transformers(tmp_path, variant):
    folder = build_tiny_model(tmp_path / variant, variant)
    hf = reference(folder)
    # Blocks of 4 tokens and steps of 7: prompts are chunked, windows of 8 leave blocks behind them.
    llm = LLM(str(folder), dtype="float32", device="cpu", block_size=4, max_num_batched_tokens=7)
    check_writes_go_to_private_blocks(llm)
    assert_matches_hf(llm.generate(PROMPTS, GREEDY), hf)
    # Again, the prompts now hit the prefix cache.
    assert_matches_hf(llm.generate(PROMPTS[::-1], GREEDY), hf)
    assert llm.engine.stats().prefix_cache_hits > 0
    assert_all_blocks_free(llm)


# variant -> KV blocks per layer: too few for the five prompts at once, enough for each alone (a
# window layer of 8 tokens holds at most 4 blocks of 4 besides a step's 2).
PREEMPTED = {"gemma3": 12, "mistral_window": 6, "qwen3_moe": 12}


@pytest.mark.parametrize("variant", sorted(PREEMPTED))
def test_family_matches_transformers_under_preemption(tmp_path, variant):
    folder = build_tiny_model(tmp_path / variant, variant)
    hf = reference(folder)
    probe = LLM(str(folder), dtype="float32", device="cpu", block_size=4, max_num_batched_tokens=7)
    cache = probe.engine.runner.kv_caches[0]
    layers = len(probe.engine.runner.kv_caches)
    layer_block = cache[0, 0].numel() * 2 * cache.element_size()
    llm = LLM(
        str(folder),
        dtype="float32",
        device="cpu",
        block_size=4,
        max_num_batched_tokens=7,
        max_model_len=48,
        kv_cache_memory=PREEMPTED[variant] * layer_block * layers,
    )
    check_writes_go_to_private_blocks(llm)
    assert_matches_hf(llm.generate(PROMPTS, GREEDY), hf)
    assert llm.engine.stats().num_preemptions > 0
    assert_all_blocks_free(llm)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["gemma2", "qwen3_moe", "phi3", "qwen3_window"])
def test_long_prompt_matches_transformers(tmp_path, variant):
    folder = build_tiny_model(tmp_path / variant, variant, overrides=whole_prompt_overrides(variant))
    hf = reference(folder)
    llm = LLM(str(folder), dtype="float32", device="cpu", block_size=4, max_num_batched_tokens=48)
    outputs = llm.generate(
        [LONG_PROMPT, PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    )
    assert len(outputs[0].prompt_token_ids) > 130
    assert_matches_hf(outputs, hf, new_tokens=6)
