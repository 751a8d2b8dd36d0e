"""Tensor parallelism on the CPU (gloo): a model split over 2, 3 or 4 ranks computes what one
process computes. The logits of a sharded forward pass match one process's; greedy ids match on
every architecture variant, quantized (int8, GPTQ, GGUF), on Mamba-2 and gated DeltaNet hybrids
and on the bundled model, with prefix caching, chunked prefill and preemption all at work, the groups with
async scheduling (each step's input ids sent from rank 0's device) and one process without.

Starting ranks costs seconds each (every one imports torch), so each group size is spawned once
per module and runs all of its jobs (tensor_parallel_jobs.run_tasks)."""

from __future__ import annotations

import multiprocessing

import pytest
import torch
from pagoda_runtime import LLM, SamplingParams
from pagoda_runtime.contract.config import EngineConfig
from pagoda_runtime.contract.sizing import kv_heads_per_rank
from pagoda_runtime.engine.llm_engine import LLMEngine
from pagoda_runtime.executor.quantization import dequantize, quantize_int4, quantize_int8
from pagoda_runtime.parallel.tensor_parallel import SINGLE_PROCESS, TensorParallel

from tests.runtime.engine.tensor_parallel_jobs import (
    GREEDY,
    PROMPTS,
    TINY_ENGINE,
    TINY_KV_BLOCKS,
    greedy_runs,
    run_tasks,
    sharded_logits,
)
from tests.runtime.quantization.quantized_folders import build_quantized_folder
from tests.runtime.tensor_parallel_ranks import run_on_ranks
from tests.runtime.tiny_models import HYBRID_VARIANTS, VARIANTS, build_tiny_gguf, build_tiny_model

# int4 and fp8 too: their packed columns (nibbles, float32 row scales) are cut for o_proj and down_proj.
LOGIT_QUANTIZATIONS = ("none", "int8", "int4", "fp8")
# SmolLM2-135M has 9 attention heads and 3 KV heads: 3 ranks is the size that splits it. Its Q4_1
# blocks are dequantized at load, as on any CPU (the tiny GGUF job keeps Q4_1 packed). Two prompts,
# each prefilled whole: its 30 layers make every step cost 60 all-reduces.
BUNDLED_JOB = ("bundled", "smollm2-135m", dict(block_size=4))
BUNDLED_PROMPTS = PROMPTS[:2]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp-models")
    tiny = {"kv_blocks": TINY_KV_BLOCKS, **TINY_ENGINE}
    folders = {variant: build_tiny_model(root / variant, variant) for variant in sorted(VARIANTS)}
    # gqa: 8 query heads of width 8, so o_proj's 64 inputs split over 2 ranks into whole groups of 32.
    gptq = build_quantized_folder(folders["gqa"], root / "gptq", "gptq", group_size=32)
    gguf = build_tiny_gguf(folders["gqa"], root / "gqa.Q4_1.gguf", "Q4_1")
    tiny_jobs = [(variant, str(folder), tiny) for variant, folder in folders.items()]
    tiny_jobs.append(("llama3-int8", str(folders["llama3"]), {**tiny, "quantization": "int8"}))
    packed_jobs = [
        ("gptq", str(gptq), tiny),
        ("gguf-q4_1", str(gguf), {**tiny, "quantization": "gguf"}),
    ]
    # Hybrids of Mamba-2 or gated DeltaNet layers and attention: two groups of Mamba heads (two
    # DeltaNet key heads), so two ranks; their recurrent states come out of the budget beside the
    # blocks (max_num_seqs states).
    hybrid = {**tiny, "max_num_seqs": 4}
    hybrid_jobs = [
        (variant, str(build_tiny_model(root / variant, variant)), hybrid)
        for variant in sorted(HYBRID_VARIANTS)
        if variant != "lfm2"  # its short convolutions stay on one GPU
    ]
    return {
        "qwen2": str(folders["qwen2"]),
        "tiny": tiny_jobs,
        "packed": packed_jobs,
        "hybrid": hybrid_jobs,
    }


@pytest.fixture(scope="module")
def one_process(models):
    return {
        "logits": {q: sharded_logits(SINGLE_PROCESS, models["qwen2"], q) for q in LOGIT_QUANTIZATIONS},
        "tiny": greedy_runs(SINGLE_PROCESS, models["tiny"]),
        "packed": greedy_runs(SINGLE_PROCESS, models["packed"]),
        "hybrid": greedy_runs(SINGLE_PROCESS, models["hybrid"]),
        "bundled": greedy_runs(SINGLE_PROCESS, [BUNDLED_JOB], BUNDLED_PROMPTS),
    }


@pytest.fixture(scope="module")
def sharded(models):
    """size -> that group's results, each group spawned once, on first use."""
    tasks = {
        # qwen2: biases on q, k and v; 2 KV heads, so 4 ranks hold a copy of one each.
        **{f"logits-{q}": ("sharded_logits", (models["qwen2"], q)) for q in LOGIT_QUANTIZATIONS},
        "tiny": ("greedy_runs", (models["tiny"],)),
    }
    by_size = {
        # GPTQ groups and GGUF blocks of 32 split o_proj's 64 inputs over 2 ranks, not over 4.
        2: {
            **tasks,
            "packed": ("greedy_runs", (models["packed"],)),
            "hybrid": ("greedy_runs", (models["hybrid"],)),
        },
        3: {"bundled": ("greedy_runs", ([BUNDLED_JOB], BUNDLED_PROMPTS))},
        4: tasks,
    }
    results = {}

    def get(size: int) -> dict:
        if size not in results:
            results[size] = run_on_ranks(size, run_tasks, by_size[size])
        return results[size]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("size", [2, 4])
def test_sharded_logits_match_one_process(one_process, sharded, size):
    for quantization in LOGIT_QUANTIZATIONS:
        whole, split = one_process["logits"][quantization], sharded(size)[f"logits-{quantization}"]
        assert split.shape == whole.shape
        torch.testing.assert_close(split, whole, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("size", [2, 4])
def test_tiny_models_greedy_ids_do_not_depend_on_the_tensor_parallel_size(one_process, sharded, size):
    runs = sharded(size)["tiny"]
    assert set(runs) == set(one_process["tiny"])
    for name, run in runs.items():
        whole = one_process["tiny"][name]
        assert run["ids"] == whole["ids"], name
        if not name.endswith("_window"):
            # A model whose layers slide holds only its window per sequence and hands back the blocks
            # behind it: the tiny cache never runs short nor keeps a prefix, so the runs are
            # required to preempt and hit the prefix cache for the other models only.
            assert run["preemptions"] > 0 and run["prefix_hits"] > 0, name
        # Each rank caches its KV heads only (a copy of one when there are fewer heads than ranks:
        # latent attention's one latent on every rank),
        # and holds the weights sizing.py predicts for one GPU of the group.
        per_rank = kv_heads_per_rank(run["kv_heads"], size)
        assert run["kv_bytes_per_block"] == whole["kv_bytes_per_block"] * per_rank // run["kv_heads"], name
        assert run["weight_bytes"] == run["predicted_weight_bytes"] < whole["weight_bytes"], name


@pytest.mark.slow
def test_packed_checkpoints_split_over_two_ranks_at_group_boundaries(one_process, sharded):
    for name, run in sharded(2)["packed"].items():
        assert run["ids"] == one_process["packed"][name]["ids"], name
        assert run["preemptions"] > 0, name


@pytest.mark.slow
def test_hybrids_split_their_recurrent_heads_and_states_over_two_ranks(one_process, sharded):
    for name, run in sharded(2)["hybrid"].items():
        whole = one_process["hybrid"][name]
        assert run["ids"] == whole["ids"], name
        assert run["preemptions"] > 0, name
        assert run["weight_bytes"] == run["predicted_weight_bytes"] < whole["weight_bytes"], name


@pytest.mark.slow
def test_bundled_model_on_three_ranks(one_process, sharded):
    assert sharded(3)["bundled"]["bundled"]["ids"] == one_process["bundled"]["bundled"]["ids"]


def test_a_size_that_does_not_split_the_heads_is_refused_before_any_collective():
    # A stand-in group: the refusal must come before anything talks to the other rank.
    tp = TensorParallel(rank=0, size=2, group=object())
    config = EngineConfig(model="smollm2-135m", device="cpu", tensor_parallel_size=2)
    with pytest.raises(ValueError, match=r"9 attention heads .* divides 9: 1, 3, 9"):
        LLMEngine(config, tp=tp)


def test_a_size_that_cuts_a_checkpoints_groups_is_refused_before_any_collective(tmp_path):
    float_folder = build_tiny_model(tmp_path / "gqa", "gqa")
    gptq = build_quantized_folder(float_folder, tmp_path / "gptq", "gptq", group_size=32)
    tp = TensorParallel(rank=0, size=4, group=object())
    config = EngineConfig(model=str(gptq), device="cpu", tensor_parallel_size=4)
    # o_proj's 64 inputs are two groups of 32: 4 ranks would each hold half a group.
    with pytest.raises(ValueError, match=r"groups of 32 inputs.* size of 1, 2,"):
        LLMEngine(config, tp=tp)


def test_a_row_parallel_shard_never_cuts_a_quantization_group():
    weight = torch.randn(8, 128)
    grouped = quantize_int4(weight, 32)
    x = torch.randn(3, 128)
    # The two halves' partial products sum to the whole product, as the all-reduce does.
    halves = [grouped.columns(slice(0, 64)), grouped.columns(slice(64, 128))]
    whole = x @ dequantize(grouped).t()
    parts = x[:, :64] @ dequantize(halves[0]).t() + x[:, 64:] @ dequantize(halves[1]).t()
    torch.testing.assert_close(parts, whole)
    with pytest.raises(ValueError, match="cut its groups of 32"):
        grouped.columns(slice(0, 48))
    per_row = quantize_int8(weight)  # one scale per row: any slice keeps it
    assert per_row.columns(slice(0, 48)).group_size == 48


@pytest.mark.slow
def test_the_offline_llm_splits_over_ranks_as_serve_does(models):
    folder = next(f for name, f, _ in models["tiny"] if name == "gqa")
    # Prompt logprobs too: their rows are in the step every rank computes the logits of.
    scored = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True, prompt_logprobs=2)
    one = LLM(folder, dtype="float32", device="cpu", **TINY_ENGINE)
    whole, whole_scored = one.generate(PROMPTS, GREEDY), one.generate(PROMPTS[0], scored)[0]
    llm = LLM(folder, dtype="float32", device="cpu", tensor_parallel_size=2, **TINY_ENGINE)
    try:
        assert llm.engine.runner.tp.size == 2
        split = llm.generate(PROMPTS, GREEDY)
        assert [o.outputs[0].token_ids for o in split] == [o.outputs[0].token_ids for o in whole]
        split_scored = llm.generate(PROMPTS[0], scored)[0]
        assert split_scored.prompt_logprobs[0] is None
        assert split_scored.prompt_token_ranks == whole_scored.prompt_token_ranks
        for mine, theirs in zip(
            split_scored.prompt_logprobs[1:], whole_scored.prompt_logprobs[1:], strict=True
        ):
            assert mine.keys() == theirs.keys()
            assert all(mine[t] == pytest.approx(theirs[t], abs=1e-4) for t in mine)
    finally:
        llm.shutdown()
    # The spawned rank has exited (finish joined it after the stop).
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("pagoda-rank")]
