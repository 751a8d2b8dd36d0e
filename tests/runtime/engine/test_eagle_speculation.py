"""Speculative decoding with EAGLE heads: a head written in the published layout drafts from the
tiny target's own hidden states, in a paged KV cache of its own; the target's greedy outputs are
unchanged whatever it drafts, the head's blocks are rolled back and freed with each sequence, and
a head that does not fit the target is refused at start-up."""

import json

import pytest
from pagoda_runtime import LLM, SamplingParams
from pagoda_runtime.contract.speculative import SpeculativeConfigError

from tests.runtime.engine.proposer_work import count_tokens_run
from tests.runtime.tiny_eagle import write_eagle1_head, write_eagle3_head
from tests.runtime.tiny_models import build_tiny_model

PROMPTS = [
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. The quick",
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return",
    "Hello, world! How are",
    "Once upon a time there",
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("eagle")
    # Four layers: EAGLE-3 reads the hidden states entering layers 2, 4 // 2 and 4 - 3.
    target = build_tiny_model(root / "target", "llama3", overrides={"num_hidden_layers": 4})
    vocab = json.loads((target / "config.json").read_text())["vocab_size"]
    eagle3 = write_eagle3_head(root / "eagle3", target, list(range(0, vocab, 2)))
    eagle1 = write_eagle1_head(root / "eagle1", target)
    return target, eagle3, eagle1


def make(target, head=None, method="eagle3", k=3, **kwargs):
    settings = dict(dtype="float32", device="cpu", block_size=4, max_num_batched_tokens=32) | kwargs
    speculative = None
    if head is not None:
        speculative = {"method": method, "model": str(head), "num_speculative_tokens": k}
        speculative["disable_by_batch_size"] = 64
    return LLM(str(target), speculative_config=speculative, **settings)


def outputs(llm, prompts, params):
    return [[(o.token_ids, o.finish_reason) for o in r.outputs] for r in llm.generate(prompts, params)]


def all_free(llm):
    proposer = llm.engine.scheduler.proposer
    target, head = llm.engine.block_manager, proposer.block_manager
    return (
        target.num_free_blocks == target.num_blocks
        and head.num_free_blocks == head.num_blocks
        and not proposer._shadows
        and not proposer._features
    )


@pytest.fixture(scope="module")
def plain(folders):
    return make(folders[0])


@pytest.mark.parametrize("method", ["eagle3", "eagle"])
def test_greedy_outputs_are_the_targets_own_and_the_heads_blocks_are_freed(folders, plain, method):
    head = folders[1] if method == "eagle3" else folders[2]
    speculative = make(folders[0], head, method)
    assert outputs(speculative, PROMPTS, GREEDY) == outputs(plain, PROMPTS, GREEDY)
    counts = speculative.engine.stats().spec_decode
    assert counts.num_drafts > 0 and counts.num_draft_tokens > 0
    assert all_free(speculative)
    memory = speculative.engine.memory
    # One layer of four: the head's cache holds the target's tokens in a quarter of its bytes.
    assert memory.draft.num_kv_blocks >= memory.num_kv_blocks


def test_preemption_n_and_abort_free_the_heads_blocks(folders):
    plain_tight = make(folders[0])
    block_bytes = plain_tight.engine.runner.kv_bytes_per_block
    tight = dict(kv_cache_memory=40 * block_bytes, max_num_batched_tokens=16)
    speculative = make(folders[0], folders[1], **tight)
    params = [SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, n=1 + i % 2) for i in range(4)]
    assert outputs(speculative, PROMPTS, params) == outputs(make(folders[0], **tight), PROMPTS, params)
    assert speculative.engine.stats().num_preemptions > 0
    assert all_free(speculative)
    engine = speculative.engine
    engine.add_request("a", PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))
    head_blocks = engine.scheduler.proposer.block_manager
    while head_blocks.num_free_blocks == head_blocks.num_blocks:
        engine.step()
    engine.abort("a")
    assert all_free(speculative)


def rewrite_config(head, tmp_path, **changes):
    folder = tmp_path / "bad"
    folder.mkdir()
    config = json.loads((head / "config.json").read_text()) | changes
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes((head / "model.safetensors").read_bytes())
    return folder


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"hidden_size": 128}, "has hidden_size 128, but the target's hidden size is 64"),
        ({"target_hidden_size": 32}, "has target_hidden_size 32"),
        ({"architectures": ["MedusaModel"]}, "is a 'MedusaModel' head; the eagle3 method loads"),
        ({"vocab_size": 1000}, "has vocab_size 1000"),
        ({"num_hidden_layers": 2}, "has num_hidden_layers 2"),
        ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 9]}}, "reads the target's layers"),
        ({"eagle_aux_hidden_state_layer_ids": [0, 1]}, r"reads the target's layers \[0, 1\]"),
    ],
)
def test_a_head_that_does_not_fit_the_target_is_refused_at_start_up(folders, tmp_path, changes, named):
    with pytest.raises(SpeculativeConfigError, match="speculative_config.model .*" + named.replace("(", ".")):
        make(folders[0], rewrite_config(folders[1], tmp_path, **changes))


def test_a_missing_head_or_a_two_layer_target_is_refused(folders, tmp_path):
    with pytest.raises(SpeculativeConfigError, match="is not an EAGLE head folder"):
        make(folders[0], tmp_path / "nowhere")
    shallow = build_tiny_model(tmp_path / "shallow", "llama3")
    with pytest.raises(SpeculativeConfigError, match="reads the target's layers .* but the target has 2"):
        make(shallow, folders[1])


def target_data(target, continuations, prompts):
    """Along the tiny target's greedy continuations of `prompts` (token id lists): its hidden states
    entering layers 2, 2 and 1 (EAGLE-3's of four layers), its final norm's output (EAGLE-1's),
    its argmax, the token embeddings and its LM head."""
    import torch
    from transformers import AutoModelForCausalLM

    ids = torch.tensor([p + out[0][0] for p, out in zip(prompts, continuations, strict=True)])
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
    states = out.hidden_states
    embeds = model.get_input_embeddings()(ids).detach()
    features = {"eagle3": torch.cat([states[2], states[2], states[1]], -1), "eagle": states[-1]}
    return features, out.logits.argmax(-1), embeds, model.get_output_embeddings().weight.detach()


def write_head(method, target, folder, trained_on, steps=100):
    """A head of `method` for the tiny target in the published layout, trained by `steps` Adam
    steps on the target's own hidden states along its greedy continuations of `trained_on`
    (prompts as token id lists, and their outputs) as EAGLE trains one, without its multi-step
    part. An EAGLE-3 head's draft vocabulary: the 96 tokens the target says most there (the
    published heads keep 32k of 128k)."""
    import torch

    from tests.runtime.tiny_eagle import Eagle1Head, Eagle3Head

    vocab = json.loads((target / "config.json").read_text())["vocab_size"]
    prompts, greedy = trained_on
    features, argmax, embeds, lm_head = target_data(target, greedy, prompts)
    if method == "eagle3":
        draft_ids = (
            torch.bincount(argmax.flatten(), minlength=vocab).argsort(descending=True)[:96].sort().values
        )
        to_draft = torch.full((vocab,), -100).index_put_((draft_ids,), torch.arange(96))
        head = Eagle3Head(96, seed=1)
    else:
        to_draft = torch.arange(vocab)
        head = Eagle1Head(lm_head, seed=1)
    labels = to_draft[argmax[:, 1:]]  # position p: the target's token after token p + 1
    optimizer = torch.optim.Adam(head.parameters(), lr=1e-2)
    for _ in range(steps):
        logits = head(embeds[:, 1:], features[method][:, :-1])
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if method == "eagle3":
        return write_eagle3_head(folder, target, draft_ids.tolist(), head)
    return write_eagle1_head(folder, target, head)


def training_prompts():
    """Eight random prompts of six token ids, what the trained heads learn to continue."""
    import torch

    return torch.randint(3, 400, (8, 6), generator=torch.Generator().manual_seed(0)).tolist()


TRAINED_PARAMS = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


@pytest.mark.parametrize("method", ["eagle3", "eagle"])
def test_a_trained_head_drafts_what_the_target_says_and_an_untrained_one_does_not(
    folders, plain, tmp_path, method
):
    """A head trained on the target's own hidden states (`write_head`) has its drafts for the
    trained continuations accepted about half the time; the same head untrained, almost never. A
    tiny random target's next tokens are too erratic to generalize from a few seconds of training,
    so the check is on the trained prompts: it holds only where the engine's head computes what the
    training did (the same hidden states of the same layers, positions, rotations and vocabulary
    mapping). The outputs, greedy, are the target's either way."""
    target = folders[0]
    prompts = training_prompts()
    greedy = outputs(plain, prompts, TRAINED_PARAMS)
    rates = []
    for steps in (100, 0):
        folder = write_head(method, target, tmp_path / f"trained{steps}", (prompts, greedy), steps)
        llm = make(target, folder, method, k=2)
        assert outputs(llm, prompts, TRAINED_PARAMS) == greedy
        counts = llm.engine.stats().spec_decode
        rates.append(counts.num_accepted_tokens / counts.num_draft_tokens)
    assert rates[0] > 0.35 and rates[1] < 0.05, rates


def test_an_eagle3_heads_q_over_its_draft_vocabulary_keeps_the_target_distribution():
    """EAGLE-3's q is zero outside its draft vocabulary (here 3 of 5 tokens, mapped through d2t):
    the target tokens it cannot draft come only from the residual, and the first and joint
    two-token distributions are still the target's (the rejection sampler's chi-square harness);
    without the residual step the same test fails."""
    import torch
    from pagoda_runtime.engine.draft_model_proposer import _distribution
    from pagoda_runtime.executor.rejection_sampler import rejection_sample

    from tests.runtime.engine.test_rejection_sampler import (
        CRITICAL_FIRST,
        CRITICAL_JOINT,
        VOCAB,
        TinyTarget,
        chi_square,
        generate_two_from_a_draft,
        without_residual_q,
    )

    generator = torch.Generator().manual_seed(3)
    target = TinyTarget(generator)
    draft_to_target = torch.tensor([0, 2, 3])
    params = SamplingParams(temperature=1.0)

    def q(draft_logits):
        logits = torch.full((draft_logits.shape[0], VOCAB), float("-inf"))
        logits[:, draft_to_target] = draft_logits
        return torch.cat([_distribution(row[None], params) for row in logits])

    class Head:
        first = q(torch.randn(1, 3, generator=generator))[0]
        next = q(torch.randn(VOCAB, 3, generator=generator))

    assert Head.first[1] == 0 and Head.first[4] == 0
    first, second, _ = generate_two_from_a_draft(rejection_sample, target, Head, generator)
    assert chi_square(first, target.first) < CRITICAL_FIRST
    assert chi_square(first * VOCAB + second, target.joint()) < CRITICAL_JOINT
    first, second, _ = generate_two_from_a_draft(without_residual_q, target, Head, generator)
    assert chi_square(first * VOCAB + second, target.joint()) > CRITICAL_JOINT


def test_sampled_requests_draw_drafts_from_the_head_and_seeded_ones_repeat(folders, plain):
    speculative = make(folders[0], folders[1])
    params = SamplingParams(temperature=0.8, seed=3, max_tokens=16, ignore_eos=True)
    first = outputs(speculative, PROMPTS[:2], params)
    assert first == outputs(speculative, PROMPTS[:2], params)
    # top_k = 1 leaves the target one token per position: its greedy output, whatever q is.
    only_top = SamplingParams(temperature=1.0, top_k=1, max_tokens=16, ignore_eos=True)
    assert outputs(speculative, PROMPTS[1:3], only_top) == outputs(plain, PROMPTS[1:3], GREEDY)
    assert all_free(speculative)


def test_a_long_prompts_hidden_states_are_run_through_the_head_a_step_budget_at_a_time(folders):
    """The target's hidden states wait for the head only up to about two step budgets: a prompt
    many budgets long is caught up while it is prefilled, not held whole until its first draft."""
    speculative = make(folders[0], folders[1], max_num_batched_tokens=8)
    engine = speculative.engine
    proposer = engine.scheduler.proposer
    engine.add_request("long", PROMPTS[0] * 3, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    held = []
    while engine.has_unfinished():
        engine.step()
        held += [states.shape[0] for _, states in proposer._features.values()]
    assert len(engine.tokenizer.encode(PROMPTS[0] * 3)) > 8 * 8
    assert max(held) <= 2 * 8
    assert all_free(speculative)


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["eagle3", "eagle"])
def test_eagle_heads_keep_greedy_tokens_on_the_gpu(folders, method):
    """The head's runner on CUDA (Triton attention and norms over its paged cache), the target's
    CUDA graphs keeping the hidden states it reads, the head's own graphs captured for its draft
    steps (decode, up to disable_by_batch_size 4) and catch-up steps (1 + K tokens a sequence), q
    staying on the device into the verifier; --enforce-eager gives the same tokens without them."""
    head = folders[1] if method == "eagle3" else folders[2]
    kwargs = dict(dtype="float32", device="cuda", block_size=16, max_num_seqs=8, kv_cache_memory=2**26)
    greedy = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    plain = LLM(str(folders[0]), **kwargs)
    config = {"method": method, "model": str(head), "num_speculative_tokens": 3}
    speculative = LLM(str(folders[0]), speculative_config=config, **kwargs)
    graphs = speculative.engine.runner._graphs
    assert graphs and all(graph.hidden is not None for graph in graphs.values())
    head_runner = speculative.engine.scheduler.proposer.runner
    assert set(head_runner._graphs) == {(size, width) for size in (1, 2, 4) for width in (1, 4)}
    replay, replayed = head_runner._replay, []

    def recorded(step):
        replayed.append(step.meta.max_query_len)
        return replay(step)

    head_runner._replay = recorded
    expected = outputs(plain, PROMPTS, greedy)
    assert outputs(speculative, PROMPTS, greedy) == expected
    assert speculative.engine.stats().spec_decode.num_drafts > 0
    # A random head's drafts are seldom accepted, so its catch-ups mostly take one token a sequence
    # (decode graphs); tests/runtime/engine/test_eagle_head_graphs.py's trained heads take more.
    assert 1 in replayed, "the head's draft steps replayed no graph"
    eager = LLM(str(folders[0]), speculative_config=config, enforce_eager=True, **kwargs)
    assert not eager.engine.scheduler.proposer.runner._graphs
    assert outputs(eager, PROMPTS, greedy) == expected
    sampled = SamplingParams(temperature=0.8, seed=3, max_tokens=16, ignore_eos=True)
    assert outputs(speculative, PROMPTS, sampled) == outputs(speculative, PROMPTS, sampled)
    assert all_free(speculative)


def test_a_prefix_both_caches_hold_runs_only_the_rest_through_the_head(folders):
    """A prompt whose prefix the target's cache holds is not run again, so the target computes no
    hidden state there; the head's own cache holds its blocks for those tokens (its KV at a position
    is a function of the tokens up to the next one), so the head runs only the rest, as the target,
    where it ran the whole prompt before (on zeros). Outputs stay the target's."""
    shared = [(7 * i) % 500 + 3 for i in range(48)]
    first, second = shared + [11, 12], shared + [13, 14, 15]
    plain = make(folders[0])
    ran_second, hits = {}, {}
    for caching in (True, False):
        speculative = make(folders[0], folders[1], enable_prefix_caching=True)
        speculative.engine.scheduler.proposer.block_manager.enable_prefix_caching = caching
        assert outputs(speculative, [first], GREEDY) == outputs(plain, [first], GREEDY)
        ran = count_tokens_run(speculative.engine.scheduler.proposer)
        assert outputs(speculative, [second], GREEDY) == outputs(plain, [second], GREEDY)
        ran_second[caching] = sum(ran)
        hits[caching] = speculative.engine.scheduler.proposer.block_manager.prefix_hits
        assert speculative.engine.block_manager.prefix_hits == 48
        assert all_free(speculative)
    assert ran_second[False] - ran_second[True] >= 40, ran_second
    assert hits[True] >= 44 and hits[False] == 0


def test_prompts_that_differ_only_in_their_first_token_share_no_head_blocks(folders):
    """A head's position p holds token p + 1, so two prompts differing in token 0 alone put the same
    tokens in its cache; the target's hidden states, and so the head's KV, differ: its blocks are
    keyed by the first token too."""
    speculative = make(folders[0], folders[1], enable_prefix_caching=True)
    shared = [(7 * i) % 500 + 3 for i in range(48)]
    speculative.generate([[5] + shared], GREEDY)
    speculative.generate([[6] + shared], GREEDY)
    assert speculative.engine.scheduler.proposer.block_manager.prefix_hits == 0
    speculative.generate([[5] + shared + [9]], GREEDY)
    assert speculative.engine.scheduler.proposer.block_manager.prefix_hits >= 44
