"""The sampler on hand-made logits: penalties with vLLM's semantics, masks, truncation, and the
exponential race drawing each token with its truncated, renormalized probability."""

import pytest
import torch
from pagoda_runtime.engine.sampling_params import SamplingParams
from pagoda_runtime.engine.sequence import Sequence, SequenceGroup
from pagoda_runtime.executor.sampler import Sampler, row_seed, truncated_race

EOS = 9


def seq_with(params: SamplingParams, prompt: list[int], output: list[int] = ()) -> Sequence:
    group = SequenceGroup("r", prompt, params, 0.0)
    group.seqs = [Sequence(group, 0)]
    group.seqs[0].token_ids.extend(output)
    return group.seqs[0]


def logits_row(values: dict[int, float], vocab: int = 10) -> torch.Tensor:
    row = torch.full((vocab,), -5.0)
    for token, value in values.items():
        row[token] = value
    return row


def run(sampler: Sampler, logits: torch.Tensor, seqs: list[Sequence]):
    """What the model runner does: the host's arrays staged (as they are, on the CPU), then the call."""
    output_index = [seq.num_output_tokens for seq in seqs]
    staged = {k: torch.from_numpy(v) for k, v in sampler.host_arrays(seqs, output_index).items()}
    return sampler(logits, seqs, output_index, staged).to_host()


def sample(params: SamplingParams, row: torch.Tensor, prompt=(5,), output=()) -> int:
    sampler = Sampler(torch.device("cpu"), row.shape[0], [EOS])
    return run(sampler, row[None, :], [seq_with(params, list(prompt), list(output))]).token_ids[0]


def test_repetition_penalty_covers_prompt_and_output_and_pushes_negatives_down():
    row = logits_row({0: 2.0, 1: 1.9})
    greedy = dict(temperature=0.0)
    assert sample(SamplingParams(**greedy), row, prompt=[0]) == 0
    assert sample(SamplingParams(repetition_penalty=2.0, **greedy), row, prompt=[0]) == 1
    assert sample(SamplingParams(repetition_penalty=2.0, **greedy), row, prompt=[5], output=[0]) == 1
    negative = logits_row({0: -1.0, 1: -1.5})
    assert sample(SamplingParams(repetition_penalty=2.0, **greedy), negative, prompt=[0]) == 1


def test_presence_and_frequency_penalties_count_only_output_tokens():
    row = logits_row({0: 2.0, 1: 1.5})
    greedy = dict(temperature=0.0)
    assert sample(SamplingParams(presence_penalty=1.0, **greedy), row, prompt=[0, 0]) == 0
    assert sample(SamplingParams(presence_penalty=1.0, **greedy), row, output=[0]) == 1
    assert sample(SamplingParams(frequency_penalty=0.3, **greedy), row, output=[0]) == 0
    assert sample(SamplingParams(frequency_penalty=0.3, **greedy), row, output=[0, 0]) == 1


def test_min_tokens_masks_eos_and_stop_ids_until_reached():
    row = logits_row({EOS: 3.0, 4: 2.0, 1: 1.0})
    assert sample(SamplingParams(temperature=0.0, min_tokens=2), row, output=[1]) == 4
    assert sample(SamplingParams(temperature=0.0, min_tokens=2), row, output=[1, 1]) == EOS
    row = logits_row({4: 3.0, 1: 1.0})
    assert sample(SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=[4]), row) == 1


def test_truncation_to_one_token_is_greedy():
    row = torch.randn(50, generator=torch.Generator().manual_seed(0)) * 3
    best = int(row.argmax())
    for params in (
        SamplingParams(top_k=1, seed=1),
        SamplingParams(top_p=1e-6, seed=2),
        SamplingParams(min_p=1.0, seed=3),
        SamplingParams(temperature=1e-4, seed=4),
    ):
        assert all(sample(params, row) == best for _ in range(5))


def test_top_k_and_top_p_never_pick_outside_their_set():
    row = torch.tensor([4.0, 3.9, 3.8, 0.0, -1.0, 0.5, 0.1, 0.2])
    sampler = Sampler(torch.device("cpu"), 8, [EOS])
    seqs = [seq_with(SamplingParams(top_k=3, temperature=5.0), [5]) for _ in range(200)]
    assert set(run(sampler, row.repeat(200, 1), seqs).token_ids) == {0, 1, 2}
    probs = torch.softmax(row, -1)
    nucleus = float(probs[:2].sum()) - 1e-3  # tokens 0 and 1 reach it, token 2 is not needed
    seqs = [seq_with(SamplingParams(top_p=nucleus), [5]) for _ in range(200)]
    assert set(run(sampler, row.repeat(200, 1), seqs).token_ids) == {0, 1}


def test_logprobs_are_of_the_raw_distribution_with_the_chosen_token_included():
    row = logits_row({0: 2.0, 1: 1.5, 2: 1.0})
    sampler = Sampler(torch.device("cpu"), 10, [EOS])
    params = SamplingParams(temperature=0.0, logprobs=2, repetition_penalty=3.0)
    out = run(sampler, row[None, :], [seq_with(params, [0])])
    raw = torch.log_softmax(row, -1)
    assert out.token_ids == [1]  # the penalty moved the choice ...
    assert out.logprobs[0] == {1: float(raw[1]), 0: float(raw[0])}  # ... but not the reported logprobs


def truncated(probs: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """The distribution the race should draw from, by sorting: top-k, top-p over the top-k tokens
    renormalized, then min-p, renormalized."""
    order = probs.argsort(descending=True)
    kept = torch.zeros_like(probs, dtype=torch.bool)
    top = order[: top_k or len(probs)]
    mass = probs[top] / probs[top].sum()
    inside = (mass.cumsum(0) - mass) < top_p
    kept[top[inside]] = True
    kept &= probs >= min_p * probs.max()
    return torch.where(kept, probs, 0.0) / torch.where(kept, probs, 0.0).sum()


@pytest.mark.parametrize(
    "top_k,top_p,min_p",
    [(0, 1.0, 0.0), (4, 1.0, 0.0), (0, 0.8, 0.0), (5, 0.7, 0.0), (0, 1.0, 0.2), (6, 0.9, 0.1)],
)
def test_the_race_draws_each_token_with_its_truncated_probability(top_k, top_p, min_p):
    logits = torch.tensor([2.0, 1.6, 1.5, 1.0, 0.7, 0.3, 0.0, -0.5, -1.0, -2.0])
    draws = 20_000
    gumbel = -torch.empty(draws, 10).exponential_(generator=torch.Generator().manual_seed(0)).log()
    full = lambda value, dtype=torch.float32: torch.full((draws,), value, dtype=dtype)  # noqa: E731
    tokens = truncated_race(
        logits.repeat(draws, 1), full(1.3), full(top_k, torch.int32), full(top_p), full(min_p), gumbel
    )
    expected = truncated(torch.softmax(logits / 1.3, -1), top_k, top_p, min_p)
    observed = torch.bincount(tokens, minlength=10) / draws
    assert set(tokens.tolist()) == set(expected.nonzero()[:, 0].tolist())
    # Binomial standard error at 20,000 draws is at most 0.0036: four of them.
    assert (observed - expected).abs().max() < 0.015


def test_a_seeded_sample_draws_by_its_seed_index_and_position_alone():
    logits = torch.randn(1, 500, generator=torch.Generator().manual_seed(1))
    sampler = Sampler(torch.device("cpu"), 500, [EOS])
    params = SamplingParams(temperature=1.0, seed=11)
    at = lambda output: run(sampler, logits, [seq_with(params, [5], output)]).token_ids[0]  # noqa: E731
    first, again = at([1, 2, 3]), at([7, 7, 7])
    assert first == again  # the same position: the tokens before it do not matter
    assert len({at([1] * n) for n in range(12)}) > 1  # each position draws anew
    assert row_seed(11, 0, 3) != row_seed(11, 1, 3) != row_seed(12, 0, 3)


def test_ids_the_engine_would_refuse_cannot_break_a_step():
    # The engine refuses stop ids outside the vocabulary; should one reach the sampler it is ignored,
    # and a top_k beyond what an int64 holds is no limit.
    row = logits_row({4: 3.0, 1: 1.0})
    assert sample(SamplingParams(temperature=0.0, min_tokens=1, stop_token_ids=[10, 2**40]), row) == 4
    assert sample(SamplingParams(top_k=2**63, min_p=0.5, seed=0), row) == 4
