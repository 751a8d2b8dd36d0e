"""`load_format="dummy"`: an engine on random weights of a named shape, as `serve --load-format dummy`
builds it, quantized at load like a float checkpoint and sized as the operator predicts."""

from __future__ import annotations

import pytest
from pagoda_runtime.engine.llm import LLM
from pagoda_runtime.engine.sampling_params import SamplingParams

KV = 4 * 2**20


@pytest.mark.parametrize("quantization", ["auto", "int8", "int4", "fp8"])
def test_random_weights_quantize_at_load_and_generate_from_token_ids(quantization):
    llm = LLM("tiny-llama", device="cpu", quantization=quantization, load_format="dummy", kv_cache_memory=KV)
    memory = llm.engine.memory
    assert memory.quantization == ("none" if quantization == "auto" else quantization)
    assert memory.weight_bytes == memory.predicted_weight_bytes
    out = llm.generate([5, 6, 7, 8], SamplingParams(temperature=0.0, max_tokens=6))[0].outputs[0]
    # No end-of-sequence token: a generation runs to max_tokens, and token i reads as "<i>".
    assert len(out.token_ids) == 6 and out.finish_reason == "length"
    assert out.text.split() == [f"<{t}>" for t in out.token_ids]


def test_the_same_seed_draws_the_same_model_and_another_seed_another():
    def greedy(seed: int) -> list[int]:
        llm = LLM("tiny-llama", device="cpu", load_format="dummy", kv_cache_memory=KV, seed=seed)
        return llm.generate([1, 2, 3], SamplingParams(temperature=0.0, max_tokens=8))[0].outputs[0].token_ids

    assert greedy(0) == greedy(0) != greedy(1)


def test_an_unknown_shape_names_the_choices():
    with pytest.raises(
        ValueError, match=r"unknown model shape 'llama-9'; choose one of llama-3-8b, .*tiny-llama"
    ):
        LLM("llama-9", device="cpu", load_format="dummy")


@pytest.mark.gpu
@pytest.mark.parametrize("quantization", ["none", "int8", "int4", "fp8"])
def test_random_weights_are_drawn_on_the_gpu_and_quantized_there(quantization):
    llm = LLM(
        "tiny-llama",
        device="cuda",
        quantization=quantization,
        load_format="dummy",
        kv_cache_memory=KV,
        max_num_seqs=4,
    )
    assert llm.engine.memory.weight_bytes == llm.engine.memory.predicted_weight_bytes
    out = llm.generate([[5, 6, 7, 8]] * 3, SamplingParams(temperature=0.0, max_tokens=6))
    # Greedy on the same prompt: three rows of one batch agree.
    assert len({tuple(o.outputs[0].token_ids) for o in out}) == 1 and len(out[0].outputs[0].token_ids) == 6
