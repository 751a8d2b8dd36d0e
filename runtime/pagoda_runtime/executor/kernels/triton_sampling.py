"""Temperature, top-k, top-p and min-p sampling of many rows in one kernel, one program per row.

The exponential race picks the token with the largest p_i / E_i, E_i ~ Exp(1): token i wins with
probability p_i, and restricted to a set of tokens it samples the distribution renormalized over
that set. The kernel runs it in log space, log p_i + G_i with Gumbel noise G_i = -log E_i, and
never sorts:

- top-k keeps every token whose logit is at least the k-th largest (ties included, as vLLM does),
  found by a radix select over the logits' bits: four passes, each a 256-bin histogram of one byte.
- min-p keeps the tokens whose probability is at least min_p times the largest.
- top-p keeps the tokens above which the top-k tokens hold less than top_p of their mass. It is
  applied by rejection: the race's winner among the candidates above a lower bound is checked, in
  the next pass, against the mass above it; if that mass reaches top_p, the winner and every token
  below it lie outside, so the bound rises to the winner and the race runs again above it. The
  largest token is always inside, so this ends, after one pass more on average at top_p 0.9.

A plain temperature row takes two passes over its logits, one with top-p about three, one with
top-k six, where sorting the vocabulary and the masks around it made about ten.

Noise is Philox (tl.rand) keyed by the row's 64-bit seed, at the token's index: the host derives a
seeded sample's row seed from its seed, its index and its position (sampler.py), so its tokens do
not depend on the batch. `gumbel_noise` is the one definition of it (the tests read it back).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_SIGN = tl.constexpr(-2147483648)  # int32 with only the sign bit set
_BLOCK = 2048


@triton.jit
def gumbel_noise(seed, offsets):
    """-log(E) for E ~ Exp(1), one per offset; -inf for the rare u = 0 (never chosen)."""
    u = tl.rand(seed, offsets)
    return -tl.log(-tl.log(u))


@triton.jit
def _key(x):
    """int32 keys that order as the float32 values do (negative floats: low 31 bits flipped)."""
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


@triton.jit
def _top_k_key(base, V: tl.constexpr, temperature, top_k, BLOCK: tl.constexpr):
    """The key of the top_k-th largest scaled logit, found a byte at a time from the top."""
    offs0 = tl.arange(0, BLOCK)
    bins = tl.arange(0, 256)
    remaining = top_k
    prefix = tl.zeros([], dtype=tl.int32)  # the unsigned key's bytes found so far
    for d in tl.static_range(4):
        shift = 24 - 8 * d
        hist = tl.zeros([256], dtype=tl.int32)
        for start in range(0, V, BLOCK):
            offs = start + offs0
            x = tl.load(base + offs, mask=offs < V, other=float("-inf")) / temperature
            ukey = _key(x) ^ _SIGN
            match = offs < V
            if d > 0:
                match = match & ((ukey >> (shift + 8)) == (prefix >> (shift + 8)))
            hist += tl.histogram((ukey >> shift) & 0xFF, 256, mask=match)
        at_least = tl.cumsum(hist, 0, reverse=True)  # tokens whose byte is >= each bin
        byte = tl.sum((at_least >= remaining).to(tl.int32), 0) - 1
        remaining -= tl.sum(tl.where(bins > byte, hist, 0), 0)
        prefix = prefix | (byte << shift)
    return prefix ^ _SIGN


@triton.jit
def _race_above(base, V: tl.constexpr, temperature, m, seed, threshold, lower, min_p, BLOCK: tl.constexpr):
    """Over the tokens with keys above `lower` (and at least `threshold`): their mass (relative to
    the largest token's), and the race's winner among those min-p keeps and its score."""
    offs0 = tl.arange(0, BLOCK)
    mass = 0.0
    best = float("-inf")
    best_index = 0
    for start in range(0, V, BLOCK):
        offs = start + offs0
        x = tl.load(base + offs, mask=offs < V, other=float("-inf")) / temperature
        key = _key(x)
        inside = (offs < V) & (key > lower) & (key >= threshold)
        e = tl.exp(x - m)
        mass += tl.sum(tl.where(inside, e, 0.0), 0)
        score = tl.where(inside & (e >= min_p), (x - m) + gumbel_noise(seed, offs), float("-inf"))
        block_best, block_index = tl.max(score, 0, return_indices=True)
        better = block_best > best
        best_index = tl.where(better, start + block_index, best_index)
        best = tl.maximum(best, block_best)
    return mass, best_index, best


@triton.jit
def _sample_kernel(
    logits_ptr,
    stride,
    rows_ptr,
    temperature_ptr,
    top_k_ptr,
    top_p_ptr,
    min_p_ptr,
    seeds_ptr,
    out_ptr,
    V: tl.constexpr,
    BLOCK: tl.constexpr,
):
    i = tl.program_id(0)
    row = tl.load(rows_ptr + i)
    base = logits_ptr + row * stride
    temperature = tl.load(temperature_ptr + i)
    top_k = tl.load(top_k_ptr + i)
    top_p = tl.load(top_p_ptr + i)
    min_p = tl.load(min_p_ptr + i)
    seed = tl.load(seeds_ptr + i)
    offs0 = tl.arange(0, BLOCK)

    m = float("-inf")
    for start in range(0, V, BLOCK):
        offs = start + offs0
        x = tl.load(base + offs, mask=offs < V, other=float("-inf")) / temperature
        m = tl.maximum(m, tl.max(x, 0))

    threshold = tl.full([], _SIGN, dtype=tl.int32)  # every key is at least this
    if (top_k > 0) & (top_k < V):
        threshold = _top_k_key(base, V, temperature, top_k, BLOCK)

    # The top-k tokens' mass, and the race over every candidate.
    kept_mass, winner, _ = _race_above(base, V, temperature, m, seed, threshold, _SIGN, min_p, BLOCK)
    if top_p < 1.0:
        searching = True
        while searching:
            lower = _key(tl.load(base + winner) / temperature)
            above, next_winner, score = _race_above(
                base, V, temperature, m, seed, threshold, lower, min_p, BLOCK
            )
            # A winner whose noise is -inf (u = 0, about 1e-9 per token) cannot be improved on.
            searching = (above >= top_p * kept_mass) & (score > float("-inf"))
            winner = tl.where(searching, next_winner, winner)
    tl.store(out_ptr + row, winner.to(tl.int64))


def sample(
    logits: torch.Tensor,
    rows: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    seeds: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """out[rows[i]] = the token sampled from logits[rows[i]] with the i-th parameters (temperature,
    top_k (0: none), top_p, min_p float32; seeds int64), for each i; the other rows of out stay."""
    assert logits.dtype == torch.float32 and logits.stride(-1) == 1
    vocab = logits.shape[1]
    if rows.shape[0]:
        _sample_kernel[(rows.shape[0],)](
            logits,
            logits.stride(0),
            rows,
            temperature,
            top_k,
            top_p,
            min_p,
            seeds,
            out,
            V=vocab,
            BLOCK=min(_BLOCK, triton.next_power_of_2(vocab)),
            num_warps=8,
        )
