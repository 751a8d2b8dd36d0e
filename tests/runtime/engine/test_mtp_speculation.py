"""Speculative decoding with a checkpoint's own multi-token-prediction layer (`"method": "mtp"`): a
tiny DeepSeek V3 (and GLM-4.5) target stores an MTP layer after its decoder layers as DeepSeek-V3
does; the layer drafts from the target's hidden states in a paged KV cache of its own, the target's
greedy outputs are unchanged, a layer trained on the target's continuations has its drafts accepted
as often as transformers' copy of it predicts, and a checkpoint without one is refused."""

import pytest
from pagoda_runtime import LLM, SamplingParams
from pagoda_runtime.contract.speculative import SpeculativeConfigError

from tests.runtime.tiny_models import build_tiny_model
from tests.runtime.tiny_mtp import target_states, train_mtp, write_mtp_layer

TRAINED_PARAMS = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def make(target, k=None, **kwargs):
    settings = dict(dtype="float32", device="cpu", block_size=4, max_num_batched_tokens=64) | kwargs
    speculative = None
    if k is not None:
        speculative = {"method": "mtp", "num_speculative_tokens": k, "disable_by_batch_size": 64}
    return LLM(str(target), speculative_config=speculative, **settings)


def outputs(llm, prompts, params):
    return [[(o.token_ids, o.finish_reason) for o in r.outputs] for r in llm.generate(prompts, params)]


def training_prompts():
    """Eight random prompts of six token ids, what the trained layers learn to continue."""
    import torch

    return torch.randint(3, 400, (8, 6), generator=torch.Generator().manual_seed(0)).tolist()


@pytest.fixture(scope="module", params=["deepseek_v3", "glm4_moe"])
def trained(request, tmp_path_factory):
    """A tiny target of the family, its greedy continuations of the training prompts, and two
    copies of it: one whose MTP layer was trained on them, one whose layer is untrained."""
    root = tmp_path_factory.mktemp(request.param)
    plain = build_tiny_model(root / "plain", request.param)
    prompts = training_prompts()
    greedy = outputs(make(plain), prompts, TRAINED_PARAMS)
    sequences = [p + out[0][0] for p, out in zip(prompts, greedy, strict=True)]
    folders, layers = {}, {}
    for steps in (150, 0):
        folder = build_tiny_model(root / f"mtp{steps}", request.param)
        layers[steps] = train_mtp(folder, sequences, steps)
        folders[steps] = write_mtp_layer(folder, layers[steps])
    return plain, prompts, greedy, sequences, folders, layers


def expected_acceptance(layer, folder, sequences, prompt_len):
    """Drafts and accepted drafts of one-token speculation along the greedy `sequences`, as
    transformers' copy of the layer predicts them: with n tokens held, the target has computed
    positions up to n - 2, and the layer drafts token n from token n - 1 and the target's state at
    n - 2; an accepted draft adds two tokens (it and the verify step's own), a rejected one, one.
    The last token is never drafted (the verify step makes it)."""
    import torch

    states, embeds = target_states(folder, sequences)
    with torch.no_grad():
        drafts = layer(embeds[:, 1:], states[:, :-1]).argmax(-1)  # [b, p]: token p + 2
    total = accepted = 0
    for seq, row in zip(sequences, drafts, strict=True):
        n = prompt_len + 1
        while n < len(seq) - 1:
            total += 1
            if row[n - 2] == seq[n]:
                accepted += 1
                n += 2
            else:
                n += 1
    return total, accepted


def test_greedy_outputs_are_the_targets_and_drafts_are_accepted_as_the_layer_predicts(trained):
    """One-token drafts of the trained layer: the outputs are the target's own, and the engine
    accepts exactly the drafts transformers' copy of the layer predicts along them (every draft,
    position and acceptance alike): the engine's layer computes what the reference computes, from
    the same hidden states, embeddings, positions and rotations. The untrained layer's drafts are
    all but never accepted; the trained one's often."""
    _, prompts, greedy, sequences, folders, layers = trained
    rates = []
    for steps in (150, 0):
        llm = make(folders[steps], k=1)
        assert outputs(llm, prompts, TRAINED_PARAMS) == greedy
        counts = llm.engine.stats().spec_decode
        drafts, accepted = expected_acceptance(layers[steps], folders[steps], sequences, len(prompts[0]))
        assert (counts.num_draft_tokens, counts.num_accepted_tokens) == (drafts, accepted)
        rates.append(accepted / drafts)
    assert rates[0] > 0.35 and rates[1] < 0.1, rates


def test_longer_drafts_reuse_the_layer_and_keep_the_outputs(trained):
    """K = 3: the one layer drafts every position from its own hidden state after the first, as
    vLLM runs it; the outputs are still the target's, the layer's blocks freed with each sequence,
    and the memory report holds the layer's weights as sizing predicts them."""
    _, prompts, greedy, _, folders, _ = trained
    llm = make(folders[150], k=3)
    assert outputs(llm, prompts, TRAINED_PARAMS) == greedy
    counts = llm.engine.stats().spec_decode
    assert counts.num_accepted_tokens > 0 and counts.num_draft_tokens > counts.num_drafts
    proposer = llm.engine.scheduler.proposer
    head = proposer.block_manager
    assert head.num_free_blocks == head.num_blocks and not proposer._shadows
    draft = llm.engine.memory.draft
    assert draft.weight_bytes == draft.predicted_weight_bytes
    assert "MTP layer" in draft.model


def test_sampled_requests_draw_from_the_layer_and_seeded_ones_repeat(trained):
    _, prompts, _, _, folders, _ = trained
    llm = make(folders[150], k=2)
    params = SamplingParams(temperature=0.8, seed=3, max_tokens=16, ignore_eos=True)
    first = outputs(llm, prompts[:3], params)
    assert outputs(llm, prompts[:3], params) == first
    assert llm.engine.stats().spec_decode.num_draft_tokens > 0


def test_a_checkpoint_without_an_mtp_layer_is_refused_at_start_up(trained):
    """A config without MTP layers, and one that claims a layer its tensors leave out (as quantized
    copies of DeepSeek-V3 often do): each refused in one sentence naming what is missing."""
    plain, folders = trained[0], trained[4]
    with pytest.raises(SpeculativeConfigError, match="has none \\(num_nextn_predict_layers is 0\\)"):
        make(folders[150], k=1, hf_overrides={"num_nextn_predict_layers": 0})
    with pytest.raises(SpeculativeConfigError, match="does not hold whole .*has no tensor 'model.layers.2"):
        make(plain, k=1, hf_overrides={"num_nextn_predict_layers": 1})


@pytest.mark.slow
def test_the_layer_split_over_two_ranks_drafts_as_on_one(trained):
    """Two ranks (gloo on the CPU): each holds its slice of the layer, as of the target's layers,
    and runs its steps as rank 0 sends them; the drafts accepted are those of one rank, the outputs
    the target's, and each rank's weights are sizing's prediction of its slice."""
    _, prompts, greedy, _, folders, _ = trained
    counts, held = [], []
    for size in (1, 2):
        llm = make(folders[150], k=1, tensor_parallel_size=size)
        try:
            assert outputs(llm, prompts, TRAINED_PARAMS) == greedy
            stats = llm.engine.stats().spec_decode
            counts.append((stats.num_draft_tokens, stats.num_accepted_tokens))
            draft = llm.engine.memory.draft
            assert draft.weight_bytes == draft.predicted_weight_bytes
            held.append(draft.weight_bytes)
        finally:
            llm.shutdown()
    assert counts[0] == counts[1]
    assert held[1] < held[0]


def test_the_layer_is_held_in_the_models_quantization_as_sizing_predicts(trained):
    """--quantization int8: the layer's projections and experts are quantized as the model's, its
    weight bytes are sizing.mtp_draft's prediction, and its drafts are still accepted."""
    _, prompts, _, _, folders, _ = trained
    llm = make(folders[150], k=1, quantization="int8")
    llm.generate(prompts, TRAINED_PARAMS)
    draft = llm.engine.memory.draft
    assert draft.quantization == "int8" and draft.weight_bytes == draft.predicted_weight_bytes
    float_layer = make(folders[150], k=1).engine.memory.draft
    assert draft.weight_bytes < float_layer.weight_bytes
    counts = llm.engine.stats().spec_decode
    assert counts.num_accepted_tokens / counts.num_draft_tokens > 0.3


def test_bf16_on_the_cpu_holds_the_layer_in_the_packed_kernels_and_still_drafts_well(trained):
    """bf16 on the CPU packs the layer's projections for torch's kernels and holds its LM head in
    the vocabulary dtype (pack_for_cpu), as the target's: the trained layer's drafts are still
    mostly accepted (bf16 rounding moves a few of the target's own tokens, so not all)."""
    _, prompts, _, _, folders, _ = trained
    llm = make(folders[150], k=2, dtype="bfloat16")
    llm.generate(prompts, TRAINED_PARAMS)
    counts = llm.engine.stats().spec_decode
    assert counts.num_accepted_tokens / counts.num_draft_tokens > 0.3


@pytest.mark.gpu
def test_the_mtp_layer_keeps_greedy_tokens_on_the_gpu(trained):
    """The layer's runner on CUDA (Triton latent attention and fused experts over its paged cache),
    its draft and catch-up steps replayed from CUDA graphs, beside the target's graphs that keep its
    final hidden states: the target's greedy tokens, with the trained layer's drafts accepted, and
    --enforce-eager alike."""
    _, prompts, _, _, folders, _ = trained
    kwargs = dict(dtype="float32", device="cuda", block_size=16, max_num_seqs=8, kv_cache_memory=2**26)
    expected = outputs(LLM(str(folders[150]), **kwargs), prompts, TRAINED_PARAMS)
    config = {"method": "mtp", "num_speculative_tokens": 2}
    for eager in (False, True):
        llm = LLM(str(folders[150]), speculative_config=config, enforce_eager=eager, **kwargs)
        assert bool(llm.engine.scheduler.proposer.runner._graphs) is not eager
        assert outputs(llm, prompts, TRAINED_PARAMS) == expected
        counts = llm.engine.stats().spec_decode
        assert counts.num_accepted_tokens / counts.num_draft_tokens > 0.3
