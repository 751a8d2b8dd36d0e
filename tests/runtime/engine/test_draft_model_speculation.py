"""Speculative decoding with a draft model: a second model with the target's vocabulary drafts, in
its own paged KV cache, and the target's greedy outputs are unchanged whatever it drafts (the same
weights, or other weights of the same tokenizer); its cache is rolled back on rejection and freed
with each sequence; a draft with another vocabulary is refused at start-up."""

import pytest
from pagoda_runtime import LLM, SamplingParams
from pagoda_runtime.contract.speculative import SpeculativeConfigError

from tests.runtime.engine.proposer_work import count_tokens_run
from tests.runtime.tiny_models import build_target_and_near_draft, build_tiny_model

PROMPTS = [
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. The quick",
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return",
    "Hello, world! How are",
    "Once upon a time there",
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return build_target_and_near_draft(tmp_path_factory.mktemp("draft"))


def make(target, draft=None, k=3, **kwargs):
    settings = dict(dtype="float32", device="cpu", block_size=4, max_num_batched_tokens=32) | kwargs
    speculative = None
    if draft is not None:
        speculative = {"model": str(draft), "num_speculative_tokens": k, "disable_by_batch_size": 64}
    return LLM(str(target), speculative_config=speculative, **settings)


def outputs(llm, prompts, params):
    return [[(o.token_ids, o.finish_reason) for o in r.outputs] for r in llm.generate(prompts, params)]


def all_free(llm):
    proposer = llm.engine.scheduler.proposer
    target, draft = llm.engine.block_manager, proposer.block_manager
    return target.num_free_blocks == target.num_blocks and draft.num_free_blocks == draft.num_blocks


@pytest.fixture(scope="module")
def plain(folders):
    return make(folders[0])


@pytest.fixture(scope="module")
def small_draft(folders):
    return make(folders[0], folders[1])


def test_a_draft_of_the_same_weights_is_always_accepted_and_changes_nothing(folders, plain):
    speculative = make(folders[0], folders[0])
    assert outputs(speculative, PROMPTS, GREEDY) == outputs(plain, PROMPTS, GREEDY)
    counts = speculative.engine.stats().spec_decode
    assert counts.num_drafts > 0 and counts.num_accepted_tokens == counts.num_draft_tokens
    assert all_free(speculative)
    memory = speculative.engine.memory
    # Same architecture, same bytes per token: the KV budget is split in half, and the draft's
    # cache holds at least the target's tokens.
    assert memory.num_kv_blocks <= plain.engine.memory.num_kv_blocks // 2
    assert memory.draft.num_kv_blocks >= memory.num_kv_blocks
    assert memory.to_json()["draft"]["kv_cache_bytes"] == memory.draft.kv_cache_bytes
    assert "draft model" in memory.describe()


def test_a_different_draft_keeps_greedy_outputs_through_rejections_n_and_preemption(folders, plain):
    """The draft is often wrong: its rejected tokens' KV is rolled back in both caches. The
    small cache preempts sequences (freeing their drafts' blocks too) and n = 2 forks a prompt."""
    block_bytes = plain.engine.runner.kv_bytes_per_block
    tight = dict(kv_cache_memory=40 * block_bytes, max_num_batched_tokens=16)
    speculative = make(folders[0], folders[1], **tight)
    params = [SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, n=1 + i % 2) for i in range(4)]
    assert outputs(speculative, PROMPTS, params) == outputs(make(folders[0], **tight), PROMPTS, params)
    stats = speculative.engine.stats()
    assert stats.num_preemptions > 0
    assert 0 < stats.spec_decode.num_accepted_tokens < stats.spec_decode.num_draft_tokens
    assert all_free(speculative)


def test_sampled_requests_draw_drafts_from_the_draft_and_seeded_ones_repeat(small_draft, plain):
    speculative = small_draft
    params = SamplingParams(temperature=0.8, seed=3, max_tokens=16, ignore_eos=True)
    first = outputs(speculative, PROMPTS[:2], params)
    assert first == outputs(speculative, PROMPTS[:2], params)
    assert speculative.engine.stats().spec_decode.num_accepted_tokens > 0
    # top_k = 1 leaves the target one token per position: its greedy output, whatever q is.
    only_top = SamplingParams(temperature=1.0, top_k=1, max_tokens=16, ignore_eos=True)
    assert outputs(speculative, PROMPTS[1:3], only_top) == outputs(plain, PROMPTS[1:3], GREEDY)
    assert all_free(speculative)


def test_an_aborted_request_frees_its_draft_blocks(small_draft):
    speculative = small_draft
    engine = speculative.engine
    engine.add_request("a", PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))
    draft_blocks = engine.scheduler.proposer.block_manager
    while draft_blocks.num_free_blocks == draft_blocks.num_blocks:
        engine.step()
    engine.abort("a")
    assert all_free(speculative)


def test_a_prompt_whose_prefix_the_draft_has_cached_runs_only_the_rest_through_the_draft(folders, plain):
    """Like the target's, the draft's cache keeps the blocks it computed for the tokens the target
    accepted, keyed by those tokens: a later prompt sharing a long prefix (a system prompt) runs
    only what follows it through the draft before its first draft, where it ran the whole prompt
    again before. The outputs stay the target's, and every block is free or cached afterwards."""
    shared = [(7 * i) % 500 + 3 for i in range(48)]
    first, second = shared + [11, 12], shared + [13, 14, 15]
    ran_second, hits = {}, {}
    for caching in (True, False):
        speculative = make(folders[0], folders[1], enable_prefix_caching=caching)
        assert outputs(speculative, [first], GREEDY) == outputs(plain, [first], GREEDY)
        ran = count_tokens_run(speculative.engine.scheduler.proposer)
        assert outputs(speculative, [second], GREEDY) == outputs(plain, [second], GREEDY)
        ran_second[caching] = sum(ran)
        hits[caching] = speculative.engine.scheduler.proposer.block_manager.prefix_hits
        assert all_free(speculative)
    assert ran_second[False] - ran_second[True] >= 44, ran_second  # 11 of the 12 shared blocks
    assert hits == {True: 48, False: 0}


@pytest.mark.parametrize("family", ["gemma2", "qwen3_window"])
def test_a_sliding_window_draft_hits_its_prefix_cache_in_both_pools(tmp_path, family):
    """A draft with sliding-window layers keeps those layers' blocks in a pool of their own; a
    prefix longer than the window is found in both, and drafting for itself it stays exact."""
    model = build_tiny_model(tmp_path / family, family)
    shared = [(7 * i) % 500 + 3 for i in range(40)]
    speculative, plain = make(model, model), make(model)
    prompts = [shared + [11, 12], shared + [13, 14, 15], shared + [11, 12, 16]]
    for prompt in prompts:
        assert outputs(speculative, [prompt], GREEDY) == outputs(plain, [prompt], GREEDY)
    counts = speculative.engine.stats().spec_decode
    assert counts.num_accepted_tokens == counts.num_draft_tokens > 0
    assert speculative.engine.scheduler.proposer.block_manager.prefix_hits >= 2 * 36
    assert all_free(speculative)


def test_a_draft_with_another_vocabulary_is_refused_at_start_up(folders, tmp_path):
    other = build_tiny_model(tmp_path / "other", "smollm", tokenizer="metaspace")
    with pytest.raises(SpeculativeConfigError, match="speculative_config.model .* different vocabulary"):
        make(folders[0], other)


@pytest.mark.slow
def test_the_bundled_model_drafting_for_itself_keeps_its_greedy_output():
    prompt = "Quote this sentence twice: the cat sat on the mat. The cat sat on the mat. The cat"
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    draft = {"model": "smollm2-135m", "num_speculative_tokens": 3}
    speculative = LLM("smollm2-135m", device="cpu", speculative_config=draft)
    got = speculative.generate(prompt, params)[0].outputs[0].token_ids
    assert got == LLM("smollm2-135m", device="cpu").generate(prompt, params)[0].outputs[0].token_ids
    assert speculative.engine.stats().spec_decode.num_accepted_tokens > 0
