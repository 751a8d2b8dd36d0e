"""Structured output under speculative decoding: a constrained sample drafts (n-gram drafts cut
where the grammar refuses or ends, a draft model's q masked by the grammar), its verify rows are
masked by the grammar after the draft tokens before them, and its greedy output is the one without
speculation, always matching the grammar; the matchers are left as they were found."""

import json
import re

import jsonschema
import llguidance.torch
import pytest
import torch
from pagoda_runtime import LLM, SamplingParams
from pagoda_runtime.contract.speculative import SpeculativeConfig
from pagoda_runtime.engine.grammar_mask import GrammarMasker, allowed_draft
from pagoda_runtime.engine.ngram_proposer import NgramProposer
from pagoda_runtime.engine.sequence import Sequence, SequenceGroup
from pagoda_runtime.engine.structured_outputs import StructuredOutputs

from tests.runtime.tiny_models import build_target_and_near_draft

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "tags": {"type": "array", "items": {"enum": ["aa", "bb"]}, "maxItems": 6},
    },
    "required": ["name", "tags"],
    "additionalProperties": False,
}
PHRASES = ("the quick brown fox", "the lazy dog")
# A prompt the constrained outputs can copy from: what n-gram lookup drafts.
PROMPT = 'Echo: {"name": "fox", "tags": ["aa", "bb"]} the quick brown fox jumps over the lazy dog. the quick'
REGEX = r"(ab|ba)+c[0-9]{2,20}"


def matches_schema(text):
    jsonschema.validate(json.loads(text), SCHEMA)
    return True


CASES = [
    (StructuredOutputs(json=json.dumps(SCHEMA)), matches_schema),
    (StructuredOutputs(regex=REGEX), lambda t: re.fullmatch(REGEX, t)),
    (StructuredOutputs(choice=PHRASES), lambda t: t in PHRASES),
]
CHOICE = StructuredOutputs(choice=PHRASES)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return build_target_and_near_draft(tmp_path_factory.mktemp("structured"))


def make(target, speculative=None, **kwargs):
    settings = dict(dtype="float32", device="cpu", block_size=4, max_num_batched_tokens=32) | kwargs
    return LLM(str(target), speculative_config=speculative, **settings)


def draft_model(folder, k=3):
    return {"model": str(folder), "num_speculative_tokens": k, "disable_by_batch_size": 64}


@pytest.fixture(scope="module")
def plain(folders):
    return make(folders[0])


@pytest.fixture(scope="module")
def ngram(folders):
    return make(folders[0], NGRAM)


@pytest.fixture(scope="module")
def drafted(folders):
    return make(folders[0], draft_model(folders[1]))


def outputs(llm, prompts, params):
    results = llm.generate(prompts, params)
    return [[(o.token_ids, o.text, o.finish_reason, o.logprobs) for o in r.outputs] for r in results]


def allowed(matcher, vocab):
    """The token ids the matcher allows next, as a bool [vocab]."""
    bitmask = torch.zeros(1, (vocab + 31) // 32, dtype=torch.int32)
    llguidance.torch.fill_next_token_bitmask(matcher, bitmask, 0)
    return (((bitmask[0][:, None] >> torch.arange(32)) & 1).view(-1)[:vocab]).bool()


def constrained_seq(llm, prompt, spec, output="", **params):
    """A sequence of `prompt` whose grammar has consumed `output`'s tokens, as the engine's would."""
    tokenizer = llm.get_tokenizer()
    params = SamplingParams(structured_outputs=spec, **params)
    seq = Sequence(SequenceGroup("r", tokenizer.encode(prompt), params, 0.0), 0)
    [seq.grammar] = llm.engine.grammars.matchers(spec, 1)
    for token in tokenizer.encode(output, add_special_tokens=False):
        seq.token_ids.append(token)
        assert seq.grammar.consume_token(token)
    return seq


@pytest.mark.parametrize(("spec", "matches"), CASES, ids=["json", "regex", "choice"])
def test_greedy_constrained_outputs_are_the_same_with_either_proposer(plain, ngram, drafted, spec, matches):
    params = SamplingParams(temperature=0.0, max_tokens=60, structured_outputs=spec, logprobs=2)
    prompts = [PROMPT, "Hello, world! How are"]
    expected = outputs(plain, prompts, params)
    for speculative in (ngram, drafted):
        got = outputs(speculative, prompts, params)
        assert [[s[:3] for s in r] for r in got] == [[s[:3] for s in r] for r in expected]
        for mine, theirs in zip(got, expected, strict=True):
            for a, b in zip(mine[0][3], theirs[0][3], strict=True):
                assert a.keys() == b.keys()
                assert all(a[t] == pytest.approx(b[t], abs=1e-4) for t in a)
        assert all(r[0][2] == "stop" and matches(r[0][1]) for r in got)


def test_constrained_requests_draft_and_have_drafts_accepted(folders):
    """Only constrained requests run: every draft counted is a constrained sample's. A draft of the
    target's own weights, masked by the same grammar, is always accepted; a lookup of the prompt
    the output copies has some of its tokens accepted."""
    params = SamplingParams(temperature=0.0, max_tokens=40, structured_outputs=CHOICE)
    for config in (NGRAM, draft_model(folders[0])):
        speculative = make(folders[0], config)
        text = speculative.generate(PROMPT, params)[0].outputs[0].text
        assert text in PHRASES
        counts = speculative.engine.stats().spec_decode
        assert counts.num_drafts > 0 and counts.num_accepted_tokens > 0, config
        if "model" in config:
            assert counts.num_accepted_tokens == counts.num_draft_tokens
        bm = speculative.engine.block_manager
        assert bm.num_free_blocks == bm.num_blocks


def test_sampled_constrained_samples_match_their_grammar_with_n_stop_strings_and_seeds(ngram, drafted):
    spec, matches = CASES[0]
    params = SamplingParams(n=2, temperature=0.9, seed=4, max_tokens=60, structured_outputs=spec)
    for speculative in (ngram, drafted):
        first = outputs(speculative, [PROMPT], params)
        assert first == outputs(speculative, [PROMPT], params)  # seeded: repeats itself
        assert all(s[2] == "stop" and matches(s[1]) for s in first[0])
    # A stop string inside the grammar's text ends the sample there, as without speculation.
    stop = SamplingParams(temperature=0.0, max_tokens=40, stop=["brown"], structured_outputs=CASES[2][0])
    for speculative in (ngram, drafted):
        [[(tokens, text, reason, _)]] = outputs(speculative, [PROMPT], stop)
        assert reason == "stop" and text == "the quick "


def test_an_ngram_draft_is_cut_before_a_refused_token_and_after_the_grammars_end(plain):
    """The lookup drafts " brown fox jumps ..." after "the quick": a grammar that ends at "fox" keeps
    the draft up to it, one that wants "the quick red fox" none of it; the matcher is unchanged."""
    tokenizer = plain.get_tokenizer()
    proposer = NgramProposer(SpeculativeConfig("ngram", 8, 3, 1))
    prompt = "the quick brown fox jumps over the lazy dog. "
    free = Sequence(SequenceGroup("r", tokenizer.encode(prompt + "the quick"), SamplingParams(), 0.0), 0)
    [(uncut, _)] = proposer.propose([free], [8])
    assert tokenizer.decode(uncut).startswith(" brown fox j")
    ends = constrained_seq(plain, prompt, CHOICE, output="the quick")
    [(draft, _)] = proposer.propose([ends], [8])
    assert tokenizer.decode(draft) == " brown fox"
    assert allowed_draft(ends.grammar, draft) == len(draft)  # the matcher is left as it was
    red = StructuredOutputs(choice=("the quick red fox",))
    other = constrained_seq(plain, prompt, red, output="the quick")
    assert proposer.propose([other], [8]) == [([], None)]
    assert ends.grammar.try_consume_tokens(draft) == len(draft) and ends.grammar.is_stopped()


def test_a_draft_models_q_is_masked_by_the_grammar_at_each_drafted_position(folders):
    """Sampled drafts from a draft that ignores the grammar: each position's q puts all its mass
    on tokens the grammar allows after the draft before it, and the token drawn is one of them."""
    speculative = make(folders[0], draft_model(folders[1], k=4))
    proposer = speculative.engine.scheduler.proposer
    vocab = speculative.engine.model_config.architecture.vocab_size
    spec = StructuredOutputs(json=json.dumps(SCHEMA))
    seq = constrained_seq(speculative, PROMPT, spec, output='{"name": "', temperature=1.0, seed=None)
    before = allowed(seq.grammar, vocab)
    for _ in range(5):
        [(draft, q)] = proposer.propose([seq], [4])
        assert len(draft) == 4 and q.shape == (4, vocab)
        check = seq.grammar.deep_copy()
        for token, row in zip(draft, q, strict=True):
            mask = allowed(check, vocab)
            assert mask[token] and row[~mask].sum() == 0 and row.sum() == pytest.approx(1.0)
            assert check.consume_token(token)
        assert torch.equal(allowed(seq.grammar, vocab), before)  # rolled back
    proposer.free(seq)


def test_verify_rows_are_masked_after_each_draft_prefix_and_free_rows_pay_nothing(plain):
    vocab = plain.engine.model_config.architecture.vocab_size
    tokenizer = plain.get_tokenizer()
    seq = constrained_seq(plain, "x", CHOICE)
    start = allowed(seq.grammar, vocab)
    free = Sequence(SequenceGroup("f", [1, 2], SamplingParams(), 0.0), 0)
    draft = tokenizer.encode("the lazy", add_special_tokens=False)
    # The constrained sample's rows (its drafted positions and the bonus one), then a free row.
    rows = [seq] * (len(draft) + 1) + [free]
    prefixes = [draft[:j] for j in range(len(draft) + 1)] + [[]]
    logits = torch.zeros(len(rows), vocab)
    GrammarMasker(torch.device("cpu"))(logits, rows, prefixes)
    check = seq.grammar.deep_copy()
    for j in range(len(draft) + 1):
        assert torch.equal(logits[j] == 0, allowed(check, vocab))
        if j < len(draft):
            check.consume_token(draft[j])
    assert torch.equal(logits[-1], torch.zeros(vocab))
    # A draft token the grammar refuses: the row before it forbids it; nothing breaks after it.
    refused = tokenizer.encode("the quick", add_special_tokens=False)[:1] + [tokenizer.encode("x")[0]] * 2
    prefixes = [refused[:j] for j in range(len(refused) + 1)] + [[]]
    logits = torch.zeros(len(prefixes), vocab)
    GrammarMasker(torch.device("cpu"))(logits, [seq] * (len(refused) + 1) + [free], prefixes)
    assert logits[1, refused[1]] == float("-inf")
    assert torch.equal(allowed(seq.grammar, vocab), start) and not seq.grammar.is_error()


def test_with_async_scheduling_and_penalties_constrained_outputs_are_unchanged(folders, plain):
    """Five constrained sequences over a cut-off of two: overlapped steps without drafts while
    more than two run (their masks wait for the tokens read), speculation for the last ones;
    penalties count the draft tokens before each verify row beside the grammar's mask."""
    config = NGRAM | {"disable_by_batch_size": 2}
    llm = make(folders[0], config, async_scheduling=True)
    params = [
        SamplingParams(temperature=0.0, max_tokens=20 + 8 * i, structured_outputs=CASES[i % 3][0])
        for i in range(5)
    ]
    params[1] = SamplingParams(
        temperature=0.0, max_tokens=40, repetition_penalty=1.3, structured_outputs=CASES[1][0]
    )
    prompts = [PROMPT, "Hello, world! How are", PROMPT, "Once upon a time there", PROMPT]
    assert outputs(llm, prompts, params) == outputs(plain, prompts, params)
    assert llm.engine.stats().spec_decode.num_drafts > 0


def test_an_uncut_draft_past_the_grammar_or_into_refused_tokens_changes_nothing(ngram, plain, monkeypatch):
    """A proposer that ignores the grammar (the lookup drafts " jumps over" after "fox"): the verify
    rows reject its refused tokens, the sample ends at the token that completes the grammar, and
    nothing drafted after it is emitted."""
    monkeypatch.setattr(
        "pagoda_runtime.engine.ngram_proposer.allowed_draft", lambda matcher, draft: len(draft)
    )
    before = ngram.engine.stats().spec_decode
    for spec, _ in CASES:
        params = SamplingParams(temperature=0.0, max_tokens=60, structured_outputs=spec)
        assert outputs(ngram, [PROMPT], params) == outputs(plain, [PROMPT], params)
    after = ngram.engine.stats().spec_decode
    assert (
        after.num_draft_tokens - before.num_draft_tokens
        > after.num_accepted_tokens - before.num_accepted_tokens
    )
