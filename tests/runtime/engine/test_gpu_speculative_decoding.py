"""On a CUDA GPU: n-gram speculative decoding gives the target's own greedy tokens, its verify steps
(several query positions over the paged cache, replaying their own CUDA graphs) mixed with
CUDA-graph decode steps, and seeded sampling under speculation repeats itself."""

from __future__ import annotations

import pytest
from pagoda_runtime import LLM, SamplingParams
from pagoda_runtime.engine.structured_outputs import StructuredOutputs

from tests.runtime.tiny_models import build_tiny_model

pytestmark = pytest.mark.gpu

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
PROMPTS = [
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. The",
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return",
    "Hello, world! How are",
    "Once upon a time",
]


# float32: a verify step runs its positions as a prefill chunk, whose bfloat16 rounding may
# differ from the decode kernel's and flip a near-tie.
def test_speculation_keeps_greedy_tokens_on_the_gpu(tmp_path):
    folder = build_tiny_model(tmp_path / "llama3", "llama3")
    kwargs = dict(dtype="float32", device="cuda", block_size=16, max_num_seqs=8, kv_cache_memory=2**26)
    greedy = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    plain = LLM(str(folder), **kwargs).generate(PROMPTS, greedy)
    speculative = LLM(str(folder), speculative_config=NGRAM, **kwargs)
    runner = speculative.engine.runner
    assert {(size, 5) for size in (1, 2, 4)} <= runner._graphs.keys(), "no verify graphs were captured"
    replay, replayed = runner._replay, []

    def recorded(step):
        replayed.append(step.meta.max_query_len)
        return replay(step)

    runner._replay = recorded
    got = speculative.generate(PROMPTS, greedy)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in plain]
    assert speculative.engine.stats().spec_decode.num_drafts > 0
    assert 5 in replayed, "no verify step replayed a graph"
    eager = LLM(str(folder), speculative_config=NGRAM, enforce_eager=True, **kwargs)
    assert [o.outputs[0].token_ids for o in eager.generate(PROMPTS, greedy)] == [
        o.outputs[0].token_ids for o in got
    ]
    seeded = SamplingParams(temperature=0.8, top_p=0.9, seed=3, max_tokens=32, ignore_eos=True)
    first = speculative.generate(PROMPTS, seeded)
    assert [o.outputs[0].token_ids for o in speculative.generate(PROMPTS, seeded)] == [
        o.outputs[0].token_ids for o in first
    ]


def test_a_draft_model_keeps_greedy_tokens_on_the_gpu(tmp_path):
    """The draft's own runner on CUDA: its decode steps and its short catch-up steps replay its
    CUDA graphs, a prompt's catch-up runs eagerly, and q stays on the device into the verifier."""
    folder = build_tiny_model(tmp_path / "llama3", "llama3")
    small = build_tiny_model(tmp_path / "small", "llama3", overrides={"num_hidden_layers": 1})
    kwargs = dict(dtype="float32", device="cuda", block_size=16, max_num_seqs=8, kv_cache_memory=2**26)
    greedy = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    plain = LLM(str(folder), **kwargs).generate(PROMPTS, greedy)
    speculative = LLM(
        str(folder), speculative_config={"model": str(small), "num_speculative_tokens": 3}, **kwargs
    )
    got = speculative.generate(PROMPTS, greedy)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in plain]
    counts = speculative.engine.stats().spec_decode
    assert counts.num_drafts > 0 and counts.num_accepted_tokens > 0
    # The draft's catch-up steps (1 to K + 1 tokens a sequence) have graphs of their own.
    assert (1, 4) in speculative.engine.scheduler.proposer.runner._graphs
    sampled = SamplingParams(temperature=0.8, seed=3, max_tokens=32, ignore_eos=True)
    first = [o.outputs[0].token_ids for o in speculative.generate(PROMPTS, sampled)]
    assert [o.outputs[0].token_ids for o in speculative.generate(PROMPTS, sampled)] == first


def test_constrained_samples_speculate_and_keep_their_greedy_tokens_on_the_gpu(tmp_path):
    """Grammar masks of verify rows and of a draft model's q go to the device in pinned,
    non-blocking copies; the constrained outputs are the plain engine's, beside free ones."""
    folder = build_tiny_model(tmp_path / "llama3", "llama3")
    kwargs = dict(dtype="float32", device="cuda", block_size=16, max_num_seqs=8, kv_cache_memory=2**26)
    choice = StructuredOutputs(choice=("The quick brown fox jumps", "The lazy dog"))
    specs = [choice, StructuredOutputs(regex=r"(ab)+c"), None, StructuredOutputs(json_object=True)]
    params = [SamplingParams(temperature=0.0, max_tokens=40, structured_outputs=spec) for spec in specs]
    plain = LLM(str(folder), **kwargs).generate(PROMPTS, params)
    for config in (NGRAM, {"model": str(folder), "num_speculative_tokens": 3}):
        speculative = LLM(str(folder), speculative_config=config, **kwargs)
        got = speculative.generate(PROMPTS, params)
        assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in plain]
        assert got[0].outputs[0].text in choice.choice
        assert speculative.engine.stats().spec_decode.num_accepted_tokens > 0
