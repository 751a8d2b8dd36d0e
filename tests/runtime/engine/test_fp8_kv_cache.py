"""--kv-cache-dtype fp8: the cache holds e4m3 values divided by per-layer, per-kv-head scales
calibrated at load (executor/kv_scales.py), a block takes half the bytes of bf16 (a quarter of
float32), the same budget holds that many more blocks, and the bundled model's greedy choices stay
those of the float cache.

Measured on the bundled model (6 prompts, 16 greedy tokens each, 2026-11-23): 92 of the 96 tokens an
fp8-cache engine picks are the float-cache engine's own top choice for the same prefix, and the other
4 are within 0.63 nats of it (near ties). The bounds are 90% and 1 nat.
"""

import pytest
import torch
from pagoda_runtime import LLM, SamplingParams
from pagoda_runtime.engine.scoring import score
from pagoda_runtime.executor.model_runner import resolve_kv_cache_dtype

from tests.runtime.tiny_models import build_tiny_model

BUDGET = 2**22


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "gqa", "gqa")


@pytest.mark.parametrize("dtype,ratio", [("float32", 4), ("bfloat16", 2)])
def test_an_fp8_block_takes_a_fraction_of_the_bytes_and_the_budget_holds_more(folder, dtype, ratio):
    auto = LLM(str(folder), dtype=dtype, device="cpu", block_size=4, kv_cache_memory=BUDGET).engine
    fp8 = LLM(
        str(folder), dtype=dtype, device="cpu", block_size=4, kv_cache_memory=BUDGET, kv_cache_dtype="fp8"
    ).engine
    assert fp8.runner.kv_caches[0].dtype == torch.float8_e4m3fn
    cache_bytes = sum(c.numel() * c.element_size() for c in fp8.runner.kv_caches)
    assert cache_bytes == fp8.runner.num_blocks * fp8.memory.kv_bytes_per_block
    assert fp8.memory.kv_bytes_per_block * ratio == auto.memory.kv_bytes_per_block
    c = fp8.model_config.architecture
    one_byte_each = 2 * c.num_hidden_layers * 4 * c.num_key_value_heads * c.head_dim
    assert fp8.memory.kv_bytes_per_block == one_byte_each
    assert fp8.runner.num_blocks == ratio * auto.runner.num_blocks
    assert (fp8.memory.kv_cache_dtype, auto.memory.kv_cache_dtype) == ("fp8", dtype)


def test_an_fp8_cache_is_read_with_scales_calibrated_per_layer_and_head_at_load(folder):
    def scales(kv_cache_dtype, **kwargs):
        engine = LLM(
            str(folder), device="cpu", kv_cache_memory=BUDGET, kv_cache_dtype=kv_cache_dtype, **kwargs
        ).engine
        return [layer.self_attn.kv_scales for layer in engine.runner.model.layers]

    fp8, again = scales("fp8"), scales("fp8")
    for layer, repeat in zip(fp8, again, strict=True):
        assert layer.shape == (2, layer.shape[1]) and layer.dtype == torch.float32 and (layer > 0).all()
        assert torch.equal(layer, repeat)  # the weights alone decide them
    assert not torch.equal(fp8[0][0], fp8[0][1])  # keys and values each get their own
    assert all(layer is None for layer in scales("auto"))
    # A context shorter than the calibration prompt calibrates on what fits.
    assert all(layer is not None for layer in scales("fp8", max_model_len=16))


def test_an_unknown_kv_cache_dtype_is_refused_with_the_choices(folder):
    with pytest.raises(ValueError, match="unknown KV cache dtype 'int4'; use one of auto, fp8"):
        LLM(str(folder), device="cpu", kv_cache_dtype="int4")


def test_gpus_without_triton_e4m3_support_are_refused_by_name(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    with pytest.raises(ValueError, match="compute capability 8.9 or newer, but this one is 8.0"):
        resolve_kv_cache_dtype("fp8", torch.bfloat16, torch.device("cuda"))


@pytest.mark.slow
def test_bundled_model_greedy_choices_with_an_fp8_cache_are_the_float_caches():
    prompts = [
        "Hello, world! How are",
        "def add(a, b):",
        "The quick brown fox",
        "Once upon a time there",
        "The capital of France is",
        "1, 2, 3,",
    ]
    kwargs = dict(dtype="float32", device="cpu", kv_cache_memory=2**26)
    auto = LLM("smollm2-135m", **kwargs)
    fp8 = LLM("smollm2-135m", kv_cache_dtype="fp8", **kwargs)
    top_choice, gaps = 0, []
    greedy = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    for output in fp8.generate(prompts, greedy):
        chosen = output.outputs[0].token_ids
        logprobs = torch.log_softmax(score(auto.engine, output.prompt_token_ids + chosen), dim=-1)
        rows = logprobs[len(output.prompt_token_ids) - 1 : -1]
        gap = rows.max(dim=-1).values - rows.gather(1, torch.tensor(chosen)[:, None])[:, 0]
        top_choice += int((gap == 0).sum())
        gaps.append(float(gap.max()))
    # The choices that are not the float cache's top are near-ties (0.29 nat at most on the 2-core
    # CPU machines, 10 of 96), which rounding anywhere flips: few of them, and none far off.
    assert top_choice >= 0.85 * 16 * len(prompts)
    assert max(gaps) < 0.5
