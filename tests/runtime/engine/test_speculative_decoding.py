"""Speculative decoding in the engine: n-gram drafts verified inside continuous batching change
no greedy output (batches mixing drafts, plain decodes and prefill chunks; n > 1, stop strings,
penalties, prefix caching, preemption), roll the rejected tokens' blocks back, and are counted."""

import pytest
from pagoda_runtime import LLM, SamplingParams

from tests.runtime.tiny_models import build_tiny_model

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
# Copy-heavy prompts (a repeated sentence, code to edit) beside plain ones.
PROMPTS = [
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. The quick",
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return",
    "Hello, world! How are",
    "She sells sea shells by the sea shore; the shells she sells are sea shells. She sells",
    "Once upon a time there",
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "smollm", "smollm")


def make(folder, speculative, **kwargs):
    settings = dict(dtype="float32", device="cpu", block_size=4, max_num_batched_tokens=32) | kwargs
    return LLM(str(folder), speculative_config=NGRAM if speculative else None, **settings)


@pytest.fixture(scope="module")
def pair(folder):
    return make(folder, False), make(folder, True)


def outputs(llm, prompts, params):
    results = llm.generate(prompts, params)
    return [[(o.token_ids, o.text, o.finish_reason) for o in r.outputs] for r in results]


def all_free(llm):
    bm = llm.engine.block_manager
    return bm.num_free_blocks == bm.num_blocks


def test_greedy_outputs_are_the_targets_own_in_a_mixed_batch(pair):
    """Five prompts in a 32-token budget: prefill chunks share steps with decoding sequences, some
    of which carry drafts; a long greedy run loops, which the lookup drafts and the target accepts."""
    plain, speculative = pair
    params = [
        SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=20),
        SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, repetition_penalty=1.3),
        SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, min_tokens=25),
    ]
    before = speculative.engine.stats().spec_decode
    assert outputs(speculative, PROMPTS, params) == outputs(plain, PROMPTS, params)
    after = speculative.engine.stats().spec_decode
    assert after.num_drafts > before.num_drafts
    assert after.num_accepted_tokens > before.num_accepted_tokens
    assert after.num_accepted_tokens < after.num_draft_tokens  # rejections were rolled back too
    assert sum(after.accepted_per_position) == after.num_accepted_tokens
    assert all_free(speculative)


def test_max_tokens_stop_strings_and_stop_ids_end_at_the_same_token(pair):
    plain, speculative = pair
    reference = plain.generate(PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))
    text = reference[0].outputs[0].text
    ids = reference[0].outputs[0].token_ids
    params = [
        SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, stop=[text[20:24]]),
        SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, stop_token_ids=[ids[17]]),
        SamplingParams(temperature=0.0, max_tokens=13, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, stop=[text[20:24]], logprobs=2),
    ]
    got = speculative.generate([PROMPTS[0]] * 4, params)
    assert [[(o.token_ids, o.text, o.finish_reason, o.stop_reason) for o in r.outputs] for r in got] == [
        [(o.token_ids, o.text, o.finish_reason, o.stop_reason) for o in r.outputs]
        for r in plain.generate([PROMPTS[0]] * 4, params)
    ]
    assert got[0].outputs[0].finish_reason == "stop" and len(got[0].outputs[0].token_ids) < 40
    assert len(got[2].outputs[0].token_ids) == 13
    assert all_free(speculative)


def test_logprobs_of_emitted_tokens_match_the_targets(pair):
    plain, speculative = pair
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, logprobs=3)
    expected = plain.generate(PROMPTS[1], params)[0].outputs[0].logprobs
    got = speculative.generate(PROMPTS[1], params)[0].outputs[0].logprobs
    assert len(got) == len(expected) == 40
    for mine, theirs in zip(got, expected, strict=True):
        assert mine.keys() == theirs.keys()
        assert all(mine[t] == pytest.approx(theirs[t], abs=1e-4) for t in mine)


def test_n_samples_prefix_caching_and_preemption_keep_greedy_outputs(folder, pair):
    """A cache too small for the batch: sequences, some holding drafted blocks, are preempted and
    recomputed; prompts share a cached prefix; n = 2 forks the prompt."""
    block_bytes = pair[0].engine.runner.kv_bytes_per_block
    plain = make(folder, False, kv_cache_memory=40 * block_bytes, max_num_batched_tokens=16)
    speculative = make(folder, True, kv_cache_memory=40 * block_bytes, max_num_batched_tokens=16)
    shared = "Once upon a time there was a fox. "
    prompts = [shared + p for p in PROMPTS]
    params = [SamplingParams(temperature=0.0, max_tokens=36, ignore_eos=True, n=1 + i % 2) for i in range(5)]
    assert outputs(speculative, prompts, params) == outputs(plain, prompts, params)
    stats = speculative.engine.stats()
    assert stats.num_preemptions > 0 and stats.prefix_cache_hits > 0
    assert stats.spec_decode.num_accepted_tokens > 0
    assert all_free(speculative)


def test_sampled_requests_follow_their_truncation_and_seeded_ones_repeat(pair):
    plain, speculative = pair
    params = SamplingParams(temperature=0.9, top_k=20, top_p=0.9, seed=5, max_tokens=30, ignore_eos=True)
    first = speculative.generate(PROMPTS[0], params)[0].outputs[0].token_ids
    again = speculative.generate(PROMPTS[0], params)[0].outputs[0].token_ids
    assert first == again and len(first) == 30
    # top_k = 1 leaves the verifier one token per position: the greedy output, drafts or not.
    only_top = SamplingParams(temperature=1.0, top_k=1, max_tokens=30, ignore_eos=True)
    greedy = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    assert outputs(speculative, PROMPTS[:2], only_top) == outputs(plain, PROMPTS[:2], greedy)
    assert all_free(speculative)


@pytest.mark.parametrize("variant", ["mistral_window", "qwen3_window"])
def test_sliding_window_models_keep_greedy_outputs(tmp_path, variant):
    """Windows of 8 tokens over blocks of 4: drafted blocks are rolled back in the window pool too,
    and only read tokens' blocks enter the prefix cache."""
    folder = build_tiny_model(tmp_path / variant, variant)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[0]]
    speculative = make(folder, True)
    assert outputs(speculative, prompts, params) == outputs(make(folder, False), prompts, params)
    assert speculative.engine.stats().spec_decode.num_drafts > 0
    assert all_free(speculative)


def test_with_async_scheduling_steps_overlap_above_the_cut_off_and_speculate_below(folder, pair):
    """Five sequences over a cut-off of two: overlapped steps without drafts while more than two
    run, then the step in flight is read and the last ones speculate; the tokens are the target's."""
    config = NGRAM | {"disable_by_batch_size": 2}
    settings = dict(dtype="float32", device="cpu", block_size=4, max_num_batched_tokens=32)
    llm = LLM(str(folder), speculative_config=config, async_scheduling=True, **settings)
    engine = llm.engine
    params = [SamplingParams(temperature=0.0, max_tokens=12 + 8 * i, ignore_eos=True) for i in range(5)]
    for i, (prompt, p) in enumerate(zip(PROMPTS, params, strict=True)):
        engine.add_request(str(i), prompt, p)
    overlapped = []
    while engine.has_unfinished():
        engine.step()
        if engine.last_step_timing is not None:
            overlapped.append(engine.last_step_timing.overlapped)
    assert True in overlapped and False in overlapped
    assert engine.stats().spec_decode.num_drafts > 0
    assert outputs(llm, PROMPTS, params) == outputs(pair[0], PROMPTS, params)
    assert all_free(llm)
