"""The benchmarks' roofline: the weight bytes a decode step reads, each step's shape as the engine
reports it, and the bound a run of steps cannot beat on the measured bandwidth and matmul peak."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from pagoda_runtime.bench import offline, roofline
from pagoda_runtime.bench.workload import offline_engine
from pagoda_runtime.contract import sizing
from pagoda_runtime.contract.config import EngineConfig
from pagoda_runtime.contract.model_catalogue import KNOWN_ARCHITECTURES, shape_config
from pagoda_runtime.contract.quantization_selection import cpu_vocab_dtype
from pagoda_runtime.engine.llm_engine import LLMEngine
from pagoda_runtime.engine.stats import StepShape
from pagoda_runtime.loading.model_source import LoadedModel
from pagoda_runtime.loading.random_model import bare_tokenizer, random_weights

# tiny-llama: 2 layers, hidden 64, MLP 128, 4 query heads and 2 KV heads of 16, vocabulary 512.
# Per layer: qkv 128x64 + o 64x64 + gate_up 256x64 + down 64x128 = 36,864 linear parameters.
LINEAR = 2 * 36_864
NORMS = (2 * 2 + 1) * 64
VOCAB = 512 * 64  # the embedding, and the LM head when untied


def _engine(tied: bool, quantization: str = "none", dtype: str = "float32") -> LLMEngine:
    tiny = shape_config("tiny-llama")
    arch = dataclasses.replace(tiny.architecture, tie_word_embeddings=tied)
    config = dataclasses.replace(tiny, architecture=arch)
    loaded = LoadedModel(
        config,
        random_weights(config, torch.device("cpu"), torch.float32),
        bare_tokenizer(arch.vocab_size),
    )
    engine_config = EngineConfig(
        model="tiny-llama",
        device="cpu",
        dtype=dtype,
        quantization=quantization,
        max_model_len=64,
        kv_cache_memory=2**20,
    )
    return LLMEngine(engine_config, loaded)


# (tied, quantization, --dtype) -> (bytes stored, bytes one decode step reads), by hand.
WEIGHT_BYTES = {
    # float32 everywhere: the untied LM head is read, the embedding is not.
    (False, "none", "float32"): ((LINEAR + NORMS + 2 * VOCAB) * 4, (LINEAR + NORMS + VOCAB) * 4),
    # Tied: the one vocabulary matrix is the LM head, read whole.
    (True, "none", "float32"): ((LINEAR + NORMS + VOCAB) * 4, (LINEAR + NORMS + VOCAB) * 4),
    # --dtype auto on the CPU holds the vocabulary in float16.
    (False, "none", "auto"): ((LINEAR + NORMS) * 4 + 2 * VOCAB * 2, (LINEAR + NORMS) * 4 + VOCAB * 2),
    # Tied, the LM head keeps a packed float16 copy of its own for fbgemm: two matrices, one read.
    (True, "none", "auto"): ((LINEAR + NORMS) * 4 + 2 * VOCAB * 2, (LINEAR + NORMS) * 4 + VOCAB * 2),
    # int8 packed for torch's CPU kernel: a byte a weight and a bf16 scale for each of the
    # 2 x (128 + 64 + 256 + 64) output rows, the packed layout replacing the loaded one.
    (False, "int8", "auto"): (
        LINEAR + 1024 * 2 + NORMS * 4 + 2 * VOCAB * 2,
        LINEAR + 1024 * 2 + NORMS * 4 + VOCAB * 2,
    ),
}


@pytest.mark.parametrize(("tied", "quantization", "dtype"), list(WEIGHT_BYTES))
def test_a_decode_step_reads_every_weight_but_an_untied_input_embedding(tied, quantization, dtype):
    stored, read = WEIGHT_BYTES[(tied, quantization, dtype)]
    runner = _engine(tied, quantization, dtype).runner
    assert (runner.weight_bytes, runner.decode_weight_bytes) == (stored, read)
    # The estimate from the architecture alone follows the same rule.
    arch = runner.config.architecture
    vocab_dtype = cpu_vocab_dtype("cpu", dtype)
    assert sizing.decode_weight_bytes(arch, quantization, "float32", vocab_dtype=vocab_dtype) == read


def test_the_llama3_8b_batch1_bound_leaves_out_the_input_embedding():
    # The arithmetic: bf16 Llama-3-8B at 3.0 TB/s is bounded near 200 tok/s, not the 187 that
    # counting the 1 GB input embedding gives.
    arch = KNOWN_ARCHITECTURES["llama-3-8b"]
    assert 3.0e12 / sizing.decode_weight_bytes(arch, "none") == pytest.approx(200, abs=1)
    assert 3.0e12 / sizing.weight_bytes(arch, "none") == pytest.approx(187, abs=1)
    # int8 halves the linears' bytes, not the bf16 LM head's (1.05 GB of the 8.03 GB read).
    assert 3.0e12 / sizing.decode_weight_bytes(arch, "int8") == pytest.approx(373, abs=1)
    tied = KNOWN_ARCHITECTURES["llama-3.2-1b"]
    assert sizing.decode_weight_bytes(tied, "none") == sizing.weight_bytes(tied, "none")


def test_a_batch_reports_tokens_sampled_rows_context_and_causal_pairs():
    # A whole prompt of 10; a middle chunk (positions 4-6 of 10); one decode token after 6.
    starts, new = np.array([0, 4, 6]), np.array([10, 3, 1])
    # Pairs: 1 + 2 + ... + 10; the chunk's three queries see 4 cached keys each plus 1, 2, 3 of its
    # own; the decode token sees all 7.
    assert StepShape.of(starts, new, num_sampled=2) == StepShape(
        num_tokens=14, num_sampled=2, context_tokens=10 + 7 + 7, attended_pairs=55 + 18 + 7
    )


def test_the_roofline_sums_each_steps_larger_bound():
    costs = roofline.ModelCosts(
        weight_bytes=1000,
        kv_bytes_per_token=10,
        linear_flops_per_token=100,
        lm_head_flops_per_row=50,
        attention_flops_per_pair=2,
    )
    hardware = roofline.Hardware(copy_bandwidth=1000.0, matmul_peak=1000.0)
    prefill = StepShape(num_tokens=20, num_sampled=1, context_tokens=20, attended_pairs=210)
    decode = StepShape(num_tokens=2, num_sampled=2, context_tokens=40, attended_pairs=40)
    # prefill: 1000 + 40 x 10 = 1400 bytes (1.4 s) vs 2000 + 50 + 420 = 2470 FLOPs (2.47 s).
    # decode: 1000 + 42 x 10 = 1420 bytes (1.42 s) vs 200 + 100 + 80 = 380 FLOPs (0.38 s).
    bound = roofline.roofline([prefill, decode], costs, hardware)
    assert bound == roofline.Roofline(
        seconds=pytest.approx(2.47 + 1.42),
        bytes=1400 + 1420,
        flops=2470 + 380,
        steps=2,
        memory_bound_steps=1,
    )
    assert bound.as_results(measured_s=7.78)["fraction_of_roofline"] == pytest.approx(0.5)
    assert roofline.batch1_tok_per_s(costs, hardware) == 1.0


def test_the_costs_of_a_built_model_come_from_its_shape_and_its_cache():
    runner = _engine(tied=False).runner
    costs = roofline.model_costs(runner)
    assert costs == roofline.ModelCosts(
        weight_bytes=runner.decode_weight_bytes,
        kv_bytes_per_token=2 * 2 * 2 * 16 * 4,  # keys and values, 2 layers, 2 KV heads of 16, float32
        linear_flops_per_token=2 * LINEAR,
        lm_head_flops_per_row=2 * VOCAB,
        attention_flops_per_pair=4 * 4 * 16 * 2,  # QK and PV, 4 query heads of 16, 2 layers
    )


def test_an_fp8_kv_cache_moves_a_byte_per_value():
    config = offline.OfflineConfig(offline_engine("tiny-llama", device="cpu", kv_cache_dtype="fp8"))
    costs = roofline.model_costs(offline.build_engine(config, 32).runner)
    assert costs.kv_bytes_per_token == 2 * 2 * 2 * 16


def test_the_hardware_is_measured_on_the_cpu_too():
    hardware = roofline.measure(torch.device("cpu"), torch.float32)
    assert hardware.copy_bandwidth > 1e8 and hardware.matmul_peak > 1e8


def _tokens(engine: LLMEngine, temperature: float) -> dict[str, list[int]]:
    workload = offline.fixed_workload(2, 6, 8, engine.model_config.architecture.vocab_size, seed=0)
    tokens: dict[str, list[int]] = {}
    offline.submit(engine, workload, temperature)
    while engine.has_unfinished():
        for output in engine.step():
            # The workload asks for deltas: only a finished request's output holds its whole sample.
            if output.finished:
                tokens[output.request_id] = output.outputs[0].token_ids
    return tokens


def test_the_throughput_workload_samples_at_its_temperature():
    engine = offline.build_engine(offline.OfflineConfig(offline_engine("tiny-llama", device="cpu")), 32)
    greedy = _tokens(engine, 0.0)
    assert _tokens(engine, 0.0) == greedy
    sampled = _tokens(engine, 0.6)
    assert [len(t) for t in sampled.values()] == [8, 8]  # ignore_eos: every token asked for
    assert sampled != greedy


def test_the_transformers_subset_must_lie_within_the_workload():
    config = offline.OfflineConfig(offline_engine("tiny-llama", device="cpu"), hf=True)
    with pytest.raises(ValueError, match="--hf-num-prompts 8 is not a part of the workload's 6 requests"):
        offline.throughput(config, 6, 8, 24, hf_prompts=8, hf_batch=2)
