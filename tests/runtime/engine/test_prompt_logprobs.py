"""Prompt logprobs (vLLM's prompt_logprobs, what the completions API's echo reports): each prompt
token's logprob under the model given the tokens before it, and its top alternatives, equal to
transformers' log-softmax over the same prompt, whether the prompt is prefilled in one step or in
chunks, was cached before, or shares its steps with requests that ask for none."""

import pytest
import torch
from pagoda_runtime import LLM, SamplingParams
from transformers import AutoModelForCausalLM

from tests.runtime.tiny_models import build_tiny_model

PROMPT = [(11 * i) % 300 + 5 for i in range(21)]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("prompt-logprobs") / "llama", "llama3")


@pytest.fixture(scope="module")
def reference(model):
    """transformers' log-softmax after each prompt token, [len(PROMPT), vocab]."""
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([PROMPT])).logits[0].float(), dim=-1)


def make(model, **kwargs):
    settings = dict(dtype="float32", device="cpu", block_size=4, max_num_batched_tokens=64) | kwargs
    return LLM(str(model), **settings)


def check_against(reference, out, top_k, tolerance=1e-4):
    """out: a RequestOutput; its prompt logprobs and its prompt tokens' ranks against transformers'."""
    prompt_logprobs, ranks = out.prompt_logprobs, out.prompt_token_ranks
    assert prompt_logprobs[0] is None and len(prompt_logprobs) == len(PROMPT)
    assert ranks[0] is None and len(ranks) == len(PROMPT)
    for p, entry in enumerate(prompt_logprobs[1:], start=1):
        token = PROMPT[p]
        value = float(reference[p - 1, token])
        assert entry[token] == pytest.approx(value, abs=tolerance)
        # 1 + the tokens likelier than the prompt's, up to those within the tolerance of it
        likelier = (
            int((reference[p - 1] > value + tolerance).sum()),
            int((reference[p - 1] > value - tolerance).sum()),
        )
        assert likelier[0] + 1 <= ranks[p] <= likelier[1] + 1, (p, ranks[p], likelier)
        top = reference[p - 1].topk(top_k)
        for value, token_id in zip(top.values.tolist(), top.indices.tolist(), strict=True):
            assert entry[token_id] == pytest.approx(value, abs=tolerance)
        assert len(entry) in (top_k, top_k + 1)  # the prompt token, if not among the top k


@pytest.mark.parametrize("budget", [64, 8])
def test_prompt_logprobs_equal_transformers_whole_or_chunked(model, reference, budget):
    llm = make(model, max_num_batched_tokens=budget)
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, prompt_logprobs=2)
    [out] = llm.generate(PROMPT, params)
    check_against(reference, out, 2)


def test_a_cached_prompt_is_computed_again_and_other_requests_are_unchanged(model, reference):
    """The prefix cache holds the prompt from a first request; a request asking for its logprobs
    computes it whole all the same, beside one that asks for none and keeps its cache hit and its
    tokens; n = 2 reports the prompt once."""
    llm = make(model, enable_prefix_caching=True)
    plain = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    alone = llm.generate(PROMPT, plain)[0].outputs[0].token_ids
    asking = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, prompt_logprobs=0, n=2)
    with_logprobs, without = llm.generate([PROMPT, PROMPT], [asking, plain])
    check_against(reference, with_logprobs, 0)
    assert [o.token_ids for o in with_logprobs.outputs] == [alone, alone]
    assert without.prompt_logprobs is None and without.outputs[0].token_ids == alone
    assert without.num_cached_tokens > 0 and with_logprobs.num_cached_tokens == 0


def test_prompt_rows_share_steps_with_speculating_sequences(model, reference):
    """A prompt whose logprobs are asked for is prefilled in the steps where another sequence
    verifies drafts (the model drafting for itself): the verify rows and the prompt rows come out
    of the same logits, each where it belongs, and the greedy tokens are the ones without
    speculation."""
    drafting = {"model": str(model), "num_speculative_tokens": 3, "disable_by_batch_size": 8}
    speculative = make(model, speculative_config=drafting, max_num_batched_tokens=16)
    repeating = [5, 6, 7, 8] * 6
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    scored = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, prompt_logprobs=1)
    engine = speculative.engine
    engine.add_request("copying", repeating, greedy)
    while not engine.scheduler.running or not engine.scheduler.running[0].num_output_tokens:
        engine.step()
    engine.add_request("scored", PROMPT, scored)
    finished = {}
    while engine.has_unfinished():
        finished.update({o.request_id: o for o in engine.step() if o.finished})
    check_against(reference, finished["scored"], 1)
    plain = make(model)
    assert (
        finished["copying"].outputs[0].token_ids == plain.generate(repeating, greedy)[0].outputs[0].token_ids
    )
    assert finished["scored"].outputs[0].token_ids == plain.generate(PROMPT, greedy)[0].outputs[0].token_ids
    assert engine.stats().spec_decode.num_drafts > 0


def test_prompt_logprobs_out_of_range_are_refused():
    with pytest.raises(ValueError, match=r"prompt_logprobs must be in \[0, 20\], got 21"):
        SamplingParams(prompt_logprobs=21)


@pytest.mark.gpu
def test_prompt_logprobs_on_the_gpu_under_async_scheduling(model, reference):
    """On CUDA the engine overlaps steps (async scheduling) and replays graphs for decodes: the
    prompt's step runs eagerly, its logprobs reach the host without waiting for the step after it,
    and they are transformers' in float32 (the attention kernel's dots in TF32: a looser bound)."""
    llm = make(model, device="cuda", max_num_batched_tokens=8)
    assert llm.engine.async_scheduling
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, prompt_logprobs=2)
    outs = llm.generate([PROMPT, PROMPT[:9]], [params, SamplingParams(temperature=0.0, max_tokens=8)])
    check_against(reference, outs[0], 2, tolerance=5e-3)


def test_a_long_prompt_is_scored_a_bounded_chunk_a_step(model):
    """Each prompt position is a float32 row of the vocabulary: a long prompt is computed at most
    PROMPT_LOGPROBS_CHUNK tokens a step whatever the budget, and every position is still reported."""
    from pagoda_runtime.engine.scheduler import PROMPT_LOGPROBS_CHUNK

    llm = make(model, max_num_batched_tokens=1024)
    engine = llm.engine
    prompt = [(7 * i) % 300 + 5 for i in range(PROMPT_LOGPROBS_CHUNK + 100)]
    engine.add_request("long", prompt, SamplingParams(max_tokens=1, prompt_logprobs=0))
    engine.step()
    assert engine.scheduler.running[0].num_computed_tokens == PROMPT_LOGPROBS_CHUNK
    finished = []
    while engine.has_unfinished():
        finished += [o for o in engine.step() if o.finished]
    [out] = finished
    assert out.prompt_logprobs[0] is None and all(e is not None for e in out.prompt_logprobs[1:])
