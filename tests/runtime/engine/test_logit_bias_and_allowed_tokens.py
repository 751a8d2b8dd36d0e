"""OpenAI's logit_bias (values added to chosen tokens' logits before sampling) and vLLM's
allowed_token_ids (every other token masked). Greedy decoding with either equals transformers'
greedy loop with the same change to its logits, alone, beside plain requests, and while
speculating (the verify step changes every drafted position's logits)."""

import pytest
import torch
from pagoda_runtime import LLM, SamplingParams
from transformers import AutoModelForCausalLM

from tests.runtime.tiny_models import build_tiny_model

PROMPT = [(13 * i) % 250 + 7 for i in range(12)]
REPEATING = [5, 6, 7, 8] * 5
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("bias") / "llama", "llama3")


@pytest.fixture(scope="module")
def hf(folder):
    return AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    ).eval()


def hf_greedy(hf, prompt, bias, steps, allowed=None):
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            logits = hf(torch.tensor([ids])).logits[0, -1].float()
            for token, value in bias.items():
                logits[token] += value
            if allowed is not None:
                kept = torch.full_like(logits, float("-inf"))
                kept[allowed] = logits[allowed]
                logits = kept
            ids.append(int(logits.argmax()))
    return ids[len(prompt) :]


def make(folder, **kwargs):
    return LLM(str(folder), dtype="float32", device="cpu", block_size=4, max_num_batched_tokens=64, **kwargs)


def bias_that_changes(hf, prompt, steps=8):
    """A bias of the second and third likeliest first tokens: large enough to change the greedy
    path, which the test checks, so that it cannot pass with the bias ignored."""
    with torch.no_grad():
        first = hf(torch.tensor([prompt])).logits[0, -1].float()
    second, third = first.topk(3).indices.tolist()[1:]
    bias = {second: 0.8 * float(first.max() - first[second]) + 0.5, third: -100.0}
    assert hf_greedy(hf, prompt, bias, steps) != hf_greedy(hf, prompt, {}, steps)
    return bias


def test_greedy_with_a_bias_is_transformers_greedy_with_it(folder, hf):
    bias = bias_that_changes(hf, PROMPT)
    llm = make(folder)
    biased = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logit_bias=bias)
    plain = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    with_bias, without = llm.generate([PROMPT, PROMPT], [biased, plain])
    assert with_bias.outputs[0].token_ids == hf_greedy(hf, PROMPT, bias, 8)
    assert without.outputs[0].token_ids == hf_greedy(hf, PROMPT, {}, 8)


def test_a_forced_token_is_always_chosen_and_a_banned_one_never(folder):
    llm = make(folder)
    forced = llm.generate(
        PROMPT, SamplingParams(temperature=1.0, seed=3, max_tokens=10, logit_bias={42: 100.0})
    )
    assert forced[0].outputs[0].token_ids == [42] * 10
    free = SamplingParams(temperature=1.5, seed=5, max_tokens=30, ignore_eos=True)
    seen = set(llm.generate(PROMPT, free)[0].outputs[0].token_ids)
    banned = dict.fromkeys(seen, -100.0)
    again = llm.generate(
        PROMPT, SamplingParams(temperature=1.5, seed=5, max_tokens=30, ignore_eos=True, logit_bias=banned)
    )
    assert not seen & set(again[0].outputs[0].token_ids)


def test_speculation_with_a_bias_keeps_the_biased_greedy_output(folder, hf):
    bias = bias_that_changes(hf, REPEATING)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logit_bias=bias)
    speculative = make(folder, speculative_config=NGRAM)
    [out] = speculative.generate(REPEATING, params)
    assert out.outputs[0].token_ids == hf_greedy(hf, REPEATING, bias, 12)
    assert speculative.engine.stats().spec_decode.num_drafts > 0


def test_a_bias_outside_the_vocabulary_or_the_range_is_refused(folder):
    llm = make(folder)
    with pytest.raises(ValueError, match=r"logit_bias holds token id 100000"):
        llm.generate(PROMPT, SamplingParams(max_tokens=2, logit_bias={100000: 1.0}))
    with pytest.raises(ValueError, match=r"logit_bias values must be in \[-100, 100\]"):
        SamplingParams(logit_bias={5: 101.0})


def test_only_allowed_tokens_are_sampled_and_greedy_is_the_restricted_argmax(folder, hf):
    llm = make(folder)
    greedy = hf_greedy(hf, PROMPT, {}, 6)
    allowed = sorted({(t * 7) % 250 + 3 for t in range(40)} - set(greedy))
    restricted = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, allowed_token_ids=allowed)
    [out] = llm.generate(PROMPT, restricted)
    assert out.outputs[0].token_ids == hf_greedy(hf, PROMPT, {}, 6, allowed)
    few = [11, 22, 33]
    sampled = SamplingParams(
        temperature=1.5, seed=1, max_tokens=20, ignore_eos=True, allowed_token_ids=few, n=3
    )
    assert all(set(o.token_ids) <= set(few) for o in llm.generate(PROMPT, sampled)[0].outputs)
    speculative = make(folder, speculative_config=NGRAM)
    [drafted] = speculative.generate(
        REPEATING,
        SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, allowed_token_ids=[5, 6, 7, 9]),
    )
    assert drafted.outputs[0].token_ids == hf_greedy(hf, REPEATING, {}, 10, [5, 6, 7, 9])
    assert speculative.engine.stats().spec_decode.num_drafts > 0


def test_an_allow_list_that_is_empty_or_outside_the_vocabulary_is_refused(folder):
    with pytest.raises(ValueError, match="allowed_token_ids must not be empty"):
        SamplingParams(allowed_token_ids=[])
    with pytest.raises(ValueError, match="allowed_token_ids holds token id 99999"):
        make(folder).generate(PROMPT, SamplingParams(max_tokens=2, allowed_token_ids=[5, 99999]))
