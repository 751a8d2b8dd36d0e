"""vLLM's bad_words: the token sequences that spell each word, as it begins the text and as it
follows a space, are never completed. Greedy decoding with bad words equals transformers' greedy
loop banning the same sequences, alone and while speculating (each drafted position's ban counts
the draft tokens before it); sampled outputs never hold a banned sequence."""

import pytest
import torch
from pagoda_runtime import LLM, SamplingParams
from pagoda_runtime.engine.bad_words import BadWords
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.runtime.tiny_models import build_tiny_model

PROMPT = [(13 * i) % 250 + 7 for i in range(12)]
REPEATING = [5, 6, 7, 8] * 5
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("bad_words") / "llama", "llama3")


@pytest.fixture(scope="module")
def hf(folder):
    return AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    ).eval()


@pytest.fixture(scope="module")
def tokenizer(folder):
    return AutoTokenizer.from_pretrained(folder)


def spellings(tokenizer, word):
    """The sequences a word is banned as: alone, and after a space where that is another spelling."""
    alone = tokenizer.encode(word.lstrip(), add_special_tokens=False)
    spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
    return [alone] + ([spaced] if spaced != alone and spaced[1:] != alone else [])


def hf_greedy(hf, prompt, steps, banned=()):
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            logits = hf(torch.tensor([ids])).logits[0, -1].float()
            output = ids[len(prompt) :]
            for s in banned:
                if len(s) == 1 or output[len(output) - len(s) + 1 :] == s[:-1]:
                    logits[s[-1]] = float("-inf")
            ids.append(int(logits.argmax()))
    return ids[len(prompt) :]


def make(folder, **kwargs):
    return LLM(str(folder), dtype="float32", device="cpu", block_size=4, max_num_batched_tokens=64, **kwargs)


def word_in(tokenizer, output):
    """A word one of whose spellings, two or more tokens long, the output holds."""
    for i in range(len(output)):
        for length in (2, 3):
            word = tokenizer.decode(output[i : i + length])
            long = [s for s in spellings(tokenizer, word) if len(s) >= 2]
            if word.strip() and contains(output, long):
                return word
    raise AssertionError(f"no word of several tokens in {output}; generate more tokens")


def contains(output, sequences):
    return any(output[i : i + len(s)] == s for s in sequences for i in range(len(output)))


def greedy(max_tokens, **kwargs):
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kwargs)


def test_the_spellings_are_the_word_and_the_word_after_a_space():
    codes = {"red": [1], " red": [2], "blue sky": [3, 4], " blue sky": [5, 4], "primary": [6, 7]}
    codes |= {" primary": [8], "ok": [9], " ok": [9], "yes": [10], " yes": [11, 10]}
    bad = BadWords.of(["red", "  blue sky", "primary", "ok", "yes"], lambda text: codes[text])
    assert bad.sequences == ((1,), (2,), (3, 4), (5, 4), (6, 7), (8,), (9,), (10,))
    assert bad.banned([]) == {1, 2, 8, 9, 10}
    assert bad.banned([0, 3]) == {1, 2, 8, 9, 10, 4}
    assert bad.banned([6]) == {1, 2, 8, 9, 10, 7}


@pytest.mark.parametrize("overlapped", [False, True])
def test_greedy_with_bad_words_is_transformers_greedy_banning_them(folder, hf, tokenizer, overlapped):
    """overlapped: steps launched before the last one's tokens are read, as on a GPU; a ban that
    needs the tokens before it waits for them."""
    plain = hf_greedy(hf, PROMPT, 24)
    several = word_in(tokenizer, plain)
    one = tokenizer.decode(plain[0:1])
    banned = spellings(tokenizer, several) + spellings(tokenizer, one)
    expected = hf_greedy(hf, PROMPT, 24, banned)
    assert expected != plain and not contains(expected, banned)
    llm = make(folder, async_scheduling=overlapped)
    with_words, without = llm.generate([PROMPT, PROMPT], [greedy(24, bad_words=[several, one]), greedy(24)])
    assert with_words.outputs[0].token_ids == expected
    assert without.outputs[0].token_ids == plain


def test_speculation_with_bad_words_keeps_the_banned_greedy_output(folder, hf, tokenizer):
    plain = hf_greedy(hf, REPEATING, 24)
    word = word_in(tokenizer, plain)
    expected = hf_greedy(hf, REPEATING, 24, spellings(tokenizer, word))
    assert expected != plain
    speculative = make(folder, speculative_config=NGRAM)
    [out] = speculative.generate(REPEATING, greedy(24, bad_words=[word]))
    assert out.outputs[0].token_ids == expected
    assert speculative.engine.stats().spec_decode.num_drafts > 0


def test_sampled_outputs_never_hold_a_banned_sequence(folder, tokenizer):
    llm = make(folder)
    free = SamplingParams(temperature=1.5, seed=7, max_tokens=30, ignore_eos=True, n=4)
    outputs = [o.token_ids for o in llm.generate(PROMPT, free)[0].outputs]
    words = [tokenizer.decode(o[3:5]) for o in outputs] + [tokenizer.decode(o[10:11]) for o in outputs]
    words = [w for w in words if w.strip()]
    banned = [s for w in words for s in spellings(tokenizer, w)]
    assert any(contains(o, banned) for o in outputs)
    again = llm.generate(PROMPT, SamplingParams(**{**free.__dict__, "bad_words": words}))
    assert not any(contains(o.token_ids, banned) for o in again[0].outputs)


def test_bad_words_that_spell_nothing_or_too_much_are_refused(folder):
    llm = make(folder)
    for words, message in [
        (["  "], "has no tokens"),
        (["w"] * 129, "more than the 128 allowed"),
        (["abcdefghij" * 60, "klmnopqrst" * 60], "more than the 1024 allowed"),
    ]:
        with pytest.raises(ValueError, match=message):
            llm.generate(PROMPT, greedy(2, bad_words=words))
    assert llm.generate(PROMPT, greedy(2))[0].outputs[0].token_ids
