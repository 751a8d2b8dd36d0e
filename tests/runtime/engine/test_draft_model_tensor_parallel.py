"""A draft model under tensor parallelism: sharded over the target's ranks (gloo on the CPU, the
offline LLM starting its ranks as `serve` does), it keeps the target's greedy outputs, its drafts are
verified, each rank holds its slice of the draft's weights and KV, and a preempted, finished or
aborted sequence gives its draft blocks back. Block ids are rank 0's alone (the other ranks hold
caches of as many blocks and write the slots rank 0's steps name), so rank 0's block managers say
what every rank's cache holds. A draft that does not split over the ranks is refused at start-up."""

import pytest
from pagoda_runtime import LLM, SamplingParams
from pagoda_runtime.contract.config import EngineConfig
from pagoda_runtime.contract.sizing import kv_bytes_per_block
from pagoda_runtime.contract.speculative import SpeculativeConfigError, parse_speculative_config
from pagoda_runtime.engine.llm_engine import LLMEngine
from pagoda_runtime.loading.model_source import load_model_source
from pagoda_runtime.parallel.tensor_parallel import TensorParallel

from tests.runtime.tiny_models import build_target_and_near_draft, build_tiny_model

PROMPTS = [
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. The quick",
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return",
    "Hello, world! How are",
    "Once upon a time there",
]
# n = 2 forks every other prompt; 24 tokens each outgrow the tight cache below, which preempts.
PARAMS = [SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, n=1 + i % 2) for i in range(4)]
BLOCK_SIZE = 4
TARGET_BLOCKS = 20  # each cache's blocks on each rank: the budget is split evenly between the two
SETTINGS = dict(dtype="float32", device="cpu", block_size=BLOCK_SIZE, max_num_batched_tokens=16)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return build_target_and_near_draft(tmp_path_factory.mktemp("draft-tp"))


def outputs(llm, prompts, params):
    return [[(o.token_ids, o.finish_reason) for o in r.outputs] for r in llm.generate(prompts, params)]


def all_free(engine) -> bool:
    target, draft = engine.block_manager, engine.scheduler.proposer.block_manager
    return target.num_free_blocks == target.num_blocks and draft.num_free_blocks == draft.num_blocks


@pytest.mark.slow
def test_a_draft_model_sharded_over_two_ranks_keeps_greedy_outputs_and_frees_its_blocks(folders):
    target, near = folders
    expected = outputs(LLM(str(target), **SETTINGS), PROMPTS, PARAMS)
    arch = load_model_source(str(target)).config.architecture
    rank_block = kv_bytes_per_block(arch.per_rank(2), BLOCK_SIZE, "float32")
    speculative = {"model": str(near), "num_speculative_tokens": 3, "disable_by_batch_size": 64}
    llm = LLM(
        str(target),
        tensor_parallel_size=2,
        speculative_config=speculative,
        kv_cache_memory=2 * TARGET_BLOCKS * rank_block,
        **SETTINGS,
    )
    try:
        engine = llm.engine
        assert engine.runner.tp.size == engine.draft_runner.tp.size == 2
        assert outputs(llm, PROMPTS, PARAMS) == expected
        stats = engine.stats()
        assert stats.num_preemptions > 0
        counts = stats.spec_decode
        assert counts.num_drafts > 0 and 0 < counts.num_accepted_tokens < counts.num_draft_tokens
        assert all_free(engine)

        # Each rank holds its slice of the draft: the weights sizing.py predicts for one GPU of
        # two, and one of the two KV heads.
        draft = engine.memory.draft
        assert draft.weight_bytes == draft.predicted_weight_bytes
        assert draft.kv_bytes_per_block == rank_block
        assert engine.memory.num_kv_blocks == TARGET_BLOCKS <= draft.num_kv_blocks

        engine.add_request("a", PROMPTS[2], SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))
        draft_blocks = engine.scheduler.proposer.block_manager
        while draft_blocks.num_free_blocks == draft_blocks.num_blocks:
            engine.step()
        engine.abort("a")
        assert all_free(engine)
        # The group still computes after the abort: the ranks agree on every step that followed.
        assert outputs(llm, PROMPTS[2:3], PARAMS[:1]) == expected[2:3]
    finally:
        llm.shutdown()


def test_a_draft_that_does_not_split_over_the_ranks_is_refused_before_any_collective(folders, tmp_path):
    target, _ = folders
    # Two query heads cannot go to four ranks; the target's eight can.
    narrow = build_tiny_model(
        tmp_path / "narrow", "smollm", overrides={"num_attention_heads": 2, "num_key_value_heads": 2}
    )
    speculative = parse_speculative_config({"model": str(narrow), "num_speculative_tokens": 2})
    config = EngineConfig(
        model=str(target), device="cpu", tensor_parallel_size=4, speculative_config=speculative
    )
    # A stand-in group: the refusal must come before anything talks to the other ranks.
    tp = TensorParallel(rank=0, size=4, group=object())
    with pytest.raises(
        SpeculativeConfigError,
        match=r"speculative_config.model .* split over the target's ranks, but the model's 2 attention "
        r"heads do not split evenly over 4 .*ngram",
    ):
        LLMEngine(config, tp=tp)
