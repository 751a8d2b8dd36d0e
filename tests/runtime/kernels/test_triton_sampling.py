"""The sampling kernel draws the tokens its reference (sampler.truncated_race) draws from the same
noise: compiled on a GPU, in Triton's interpreter on a CPU-only machine."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from pagoda_runtime.executor.kernels.triton_sampling import gumbel_noise, sample
from pagoda_runtime.executor.sampler import truncated_race

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NO_LIMIT = (0, 1.0, 0.0)


@triton.jit
def _noise_kernel(seeds_ptr, out_ptr, V: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    seed = tl.load(seeds_ptr + i)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        tl.store(out_ptr + i * V + offs, gumbel_noise(seed, offs), mask=offs < V)


def kernel_noise(seeds: torch.Tensor, vocab: int) -> torch.Tensor:
    out = torch.empty(seeds.shape[0], vocab, device=DEVICE)
    _noise_kernel[(seeds.shape[0],)](seeds, out, V=vocab, BLOCK=512)
    return out


def check(logits: torch.Tensor, rows: list[int], temperature, limits: list[tuple[int, float, float]]):
    """Sample `rows` of `logits` with the kernel and with the reference on the kernel's noise."""
    n = len(rows)
    index = torch.tensor(rows, dtype=torch.int64, device=DEVICE)
    temperature = torch.tensor(temperature, dtype=torch.float32, device=DEVICE)
    top_k = torch.tensor([k for k, _, _ in limits], dtype=torch.int32, device=DEVICE)
    top_p = torch.tensor([p for _, p, _ in limits], dtype=torch.float32, device=DEVICE)
    min_p = torch.tensor([m for _, _, m in limits], dtype=torch.float32, device=DEVICE)
    seeds = torch.arange(n, dtype=torch.int64, device=DEVICE) * 0x9E3779B97F4A7C1 + 12345
    out = torch.full((logits.shape[0],), -1, dtype=torch.int64, device=DEVICE)
    sample(logits, index, temperature, top_k, top_p, min_p, seeds, out)
    expected = truncated_race(
        logits[index], temperature, top_k, top_p, min_p, kernel_noise(seeds, logits.shape[1])
    )
    assert out[index].tolist() == expected.tolist()
    untouched = sorted(set(range(logits.shape[0])) - set(rows))
    assert out[untouched].tolist() == [-1] * len(untouched)
    return out[index]


def test_every_truncation_and_their_combinations_match_the_reference() -> None:
    vocab = 3000  # not a multiple of the kernel's block
    limits = [
        NO_LIMIT,
        (1, 1.0, 0.0),
        (5, 1.0, 0.0),
        (50, 0.9, 0.0),
        (vocab - 1, 0.95, 0.0),
        (vocab, 1.0, 0.05),
        (0, 0.5, 0.0),
        (0, 0.01, 0.0),
        (0, 1.0, 0.3),
        (20, 0.7, 0.2),
        (7, 0.3, 0.0),
        (0, 0.9, 0.0),
    ]
    temperature = [1.0, 0.7, 1.3, 0.5, 1.0, 2.0, 1.0, 1.0, 0.9, 1.0, 1.0, 1e-3]
    logits = torch.randn(len(limits) + 2, vocab, generator=torch.Generator().manual_seed(0)).to(DEVICE) * 3
    rows = list(range(1, len(limits) + 1))  # the first and the last row are not sampled
    check(logits, rows, temperature, limits)


def test_masked_logits_are_never_drawn_and_top_k_keeps_ties() -> None:
    vocab = 700
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    logits[0, :690] = float("-inf")  # a grammar that allows ten tokens
    logits[1, 100:] = float("-inf")
    logits[2, :] = 0.0
    logits[2, [3, 40, 41, 300]] = 5.0  # four tokens tie for the top 2: all four stay
    logits[3, 5] = 50.0  # one token holds all the mass
    limits = [(0, 0.8, 0.0), (3, 1.0, 0.0), (2, 1.0, 0.0), (0, 0.9, 0.1)]
    tokens = check(logits, [0, 1, 2, 3], [1.0, 1.0, 0.1, 1.0], limits).tolist()
    assert tokens[0] >= 690 and tokens[1] < 100 and tokens[2] in (3, 40, 41, 300) and tokens[3] == 5


@pytest.mark.parametrize("top_p", [1.0, 0.6])
def test_the_draws_follow_the_distribution(top_p: float) -> None:
    """Many seeds on one row: the kernel's own noise draws each token with its probability."""
    vocab, draws = 40, 400
    row = torch.linspace(2.0, -2.0, vocab)
    logits = row.repeat(draws, 1).to(DEVICE)
    tokens = check(logits, list(range(draws)), [1.0] * draws, [(0, top_p, 0.0)] * draws).cpu()
    probs = torch.softmax(row, -1)
    kept = (probs.cumsum(0) - probs) < top_p
    expected = torch.where(kept, probs, 0.0) / probs[kept].sum()
    observed = torch.bincount(tokens, minlength=vocab) / draws
    assert set(tokens.tolist()) <= set(kept.nonzero()[:, 0].tolist())
    # Four binomial standard errors at the most probable token (p about 0.1 at 400 draws).
    assert (observed - expected).abs().max() < 0.06
