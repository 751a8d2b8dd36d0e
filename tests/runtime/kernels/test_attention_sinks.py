"""Attention sinks (GPT-OSS): the reference computes what transformers' eager GPT-OSS attention
computes, and the Triton kernel (compiled on a GPU, in Triton's interpreter on a CPU) what the
reference computes, through every path of the kernel: one split, merged splits, windows, fp8."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from pagoda_runtime.executor.kernels import reference
from pagoda_runtime.executor.kernels.triton_paged_attention import paged_attention
from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

from .paged_batch import PagedBatch, dense_attention, make_paged_batch, relative_error, release_outside_window

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Decode steps, a prompt's first chunk, chunks over cached prefixes, a one-token sequence.
MIXED = [(37, 1), (20, 20), (50, 13), (1, 1), (16, 1), (70, 2)]
# With a split per 32 keys: 3 keys take one split and no merge, 64 two, 150 and 129 as many as allowed.
DECODE = [(150, 1), (3, 1), (64, 1), (129, 1)]


def _written(batch: PagedBatch) -> PagedBatch:
    reference.write_kv(batch.k_new, batch.v_new, batch.kv_cache, batch.meta.slot_mapping)
    return batch


def _sinks(num_heads: int, seed: int = 0) -> torch.Tensor:
    """A sink per head from -1 to 6, shuffled: a row's scores here sum to about e^3 to e^4.5, so the
    sink takes from a few percent of the softmax to most of it, a different share in every head."""
    order = torch.randperm(num_heads, generator=torch.Generator().manual_seed(seed))
    return torch.linspace(-1.0, 6.0, num_heads)[order].to(DEVICE)


def test_the_dense_computation_is_transformers_gpt_oss_attention() -> None:
    batch = make_paged_batch(MIXED, 8, 2, 64, 16, seed=1)
    sinks = _sinks(8).cpu()
    module = SimpleNamespace(sinks=sinks.double(), num_key_value_groups=4, training=False)
    starts = batch.meta.query_start_loc.tolist()
    expected = []
    for i, (k, v) in enumerate(zip(batch.keys, batch.values, strict=True)):
        q = batch.q[starts[i] : starts[i + 1]].double()
        query_len, context_len = q.shape[0], k.shape[0]
        causal = torch.ones(query_len, context_len, dtype=torch.bool).tril(context_len - query_len)
        mask = torch.zeros(query_len, context_len, dtype=torch.float64).masked_fill(~causal, float("-inf"))
        out, _ = eager_attention_forward(
            module,
            q.transpose(0, 1)[None],
            k.double().transpose(0, 1)[None],
            v.double().transpose(0, 1)[None],
            mask[None, None],
            0.125,
        )
        expected.append(out[0])
    assert relative_error(dense_attention(batch, 0.125, sinks=sinks), torch.cat(expected)) < 1e-12


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (9, 3), (8, 2)])
@pytest.mark.parametrize("window,softcap", [(None, None), (21, None), (None, 2.0), (21, 2.0)])
def test_reference_attention_with_sinks_equals_dense(heads: int, kv_heads: int, window, softcap) -> None:
    batch = _written(make_paged_batch(MIXED, heads, kv_heads, 64, 8, seed=heads))
    if window is not None:
        release_outside_window(batch, window)
    sinks = _sinks(heads, seed=heads).cpu()
    out = reference.attention(
        batch.q, batch.kv_cache, batch.meta, 0.125, window=window, softcap=softcap, sinks=sinks
    )
    expected = dense_attention(batch, 0.125, window, softcap, sinks=sinks)
    assert relative_error(out, expected) < 1e-6
    # The sinks take a share large enough that ignoring them would fail by far.
    assert relative_error(dense_attention(batch, 0.125, window, softcap), expected) > 0.1


def test_a_sink_shares_the_softmax_with_the_keys_and_adds_no_value() -> None:
    # A one-token sequence: its only key has weight e^s / (e^s + e^sink), the sink's value is zero.
    batch = _written(make_paged_batch([(1, 1), (40, 1), (30, 6)], 4, 2, 64, 8, seed=5))
    sinks = torch.tensor([0.0, 1.5, -2.0, 3.0])
    out = reference.attention(batch.q, batch.kv_cache, batch.meta, 0.125, sinks=sinks)
    score = (batch.q[0] * batch.keys[0][0].repeat_interleave(2, dim=0)).sum(-1) * 0.125
    expected = torch.sigmoid(score - sinks)[:, None] * batch.values[0][0].repeat_interleave(2, dim=0)
    torch.testing.assert_close(out[0], expected, rtol=1e-6, atol=1e-6)
    plain = reference.attention(batch.q, batch.kv_cache, batch.meta, 0.125)
    # A sink far above every score takes nearly the whole softmax; one at -inf takes none of it.
    drowned = reference.attention(batch.q, batch.kv_cache, batch.meta, 0.125, sinks=torch.full((4,), 30.0))
    assert float(drowned.norm()) < 1e-6 * float(plain.norm())
    absent = reference.attention(
        batch.q, batch.kv_cache, batch.meta, 0.125, sinks=torch.full((4,), -math.inf)
    )
    torch.testing.assert_close(absent, plain, rtol=1e-6, atol=1e-6)
    assert torch.equal(plain, reference.attention(batch.q, batch.kv_cache, batch.meta, 0.125, sinks=None))
    assert relative_error(plain, dense_attention(batch, 0.125)) < 1e-6


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (9, 3), (8, 2)])
def test_paged_attention_with_sinks_on_mixed_batches(heads: int, kv_heads: int) -> None:
    batch = _written(make_paged_batch(MIXED, heads, kv_heads, 64, 16, device=DEVICE, seed=heads))
    sinks = _sinks(heads, seed=heads)
    out = paged_attention(batch.q, batch.kv_cache, batch.meta, 0.125, sinks=sinks)
    expected = reference.attention(batch.q, batch.kv_cache, batch.meta, 0.125, sinks=sinks)
    assert relative_error(out, expected) < 1e-5
    assert relative_error(out, dense_attention(batch, 0.125, sinks=sinks)) < 1e-5


@pytest.mark.parametrize(
    "seqs,num_splits,min_split_tokens",
    [(DECODE, 1, 32), (DECODE, 4, 32), ([(90, 30), (12, 1), (40, 3)], 3, 16)],
    ids=["decode", "decode-split", "prefill-split"],
)
def test_paged_attention_folds_the_sink_in_once_with_and_without_splits(
    seqs, num_splits: int, min_split_tokens: int
) -> None:
    batch = _written(make_paged_batch(seqs, 12, 4, 64, 16, device=DEVICE, seed=num_splits))
    sinks = _sinks(12, seed=num_splits)
    expected = reference.attention(batch.q, batch.kv_cache, batch.meta, 0.125, sinks=sinks)
    out = paged_attention(
        batch.q,
        batch.kv_cache,
        batch.meta,
        0.125,
        sinks=sinks,
        num_splits=num_splits,
        min_split_tokens=min_split_tokens,
    )
    assert relative_error(out, expected) < 1e-5
    # A sink at -inf adds exp2(-inf) = 0 to the softmax's sum and rescales by exp2(0) = 1: exactly
    # the output without sinks.
    absent = paged_attention(
        batch.q,
        batch.kv_cache,
        batch.meta,
        0.125,
        sinks=torch.full((12,), -math.inf, device=DEVICE),
        num_splits=num_splits,
        min_split_tokens=min_split_tokens,
    )
    plain = paged_attention(
        batch.q, batch.kv_cache, batch.meta, 0.125, num_splits=num_splits, min_split_tokens=min_split_tokens
    )
    assert torch.equal(absent, plain)


@pytest.mark.parametrize("num_splits", [None, 3])
def test_paged_attention_with_sinks_in_a_sliding_window_with_soft_capped_scores(num_splits) -> None:
    # The sink is neither capped nor masked: the window's keys share the softmax with it.
    seqs = [(70, 1), (45, 13), (9, 1), (90, 30), (20, 20)]
    batch = _written(make_paged_batch(seqs, 8, 2, 64, 8, device=DEVICE, seed=11))
    release_outside_window(batch, 21)
    sinks = _sinks(8, seed=11)
    out = paged_attention(
        batch.q, batch.kv_cache, batch.meta, 0.125, window=21, softcap=2.0, sinks=sinks, num_splits=num_splits
    )
    expected = reference.attention(
        batch.q, batch.kv_cache, batch.meta, 0.125, window=21, softcap=2.0, sinks=sinks
    )
    assert relative_error(out, expected) < 1e-5
    assert relative_error(out, dense_attention(batch, 0.125, window=21, softcap=2.0, sinks=sinks)) < 1e-5


@pytest.mark.parametrize("num_splits", [None, 3])
def test_paged_attention_with_sinks_over_a_scaled_fp8_cache(num_splits) -> None:
    # The value scales multiply the keys' weighted sum, never the sink's share: values scaled far
    # from 1 would show a sink scaled with them.
    batch = make_paged_batch(
        MIXED, 8, 2, 64, 16, device=DEVICE, seed=3, kv_cache_dtype=reference.FP8_KV_DTYPE
    )
    scales = torch.tensor([[0.02, 0.5], [0.01, 0.03]], device=DEVICE)
    reference.write_kv(batch.k_new, batch.v_new, batch.kv_cache, batch.meta.slot_mapping, kv_scales=scales)
    sinks = _sinks(8, seed=3)
    out = paged_attention(
        batch.q,
        batch.kv_cache,
        batch.meta,
        0.125,
        kv_scales=scales,
        sinks=sinks,
        num_splits=num_splits,
        min_split_tokens=16,
    )
    expected = reference.attention(batch.q, batch.kv_cache, batch.meta, 0.125, kv_scales=scales, sinks=sinks)
    assert relative_error(out, expected) < 1e-5


@pytest.mark.parametrize("num_splits", [1, 4])
def test_paged_attention_with_sinks_in_bfloat16(num_splits: int, bf16_as_on_gpu) -> None:
    # GPT-OSS's dtype: the queries, keys and values in bfloat16, the sinks and the softmax float32.
    batch = _written(make_paged_batch(DECODE, 8, 2, 64, 16, dtype=torch.bfloat16, device=DEVICE, seed=5))
    sinks = _sinks(8, seed=5)
    out = paged_attention(
        batch.q, batch.kv_cache, batch.meta, 0.125, sinks=sinks, num_splits=num_splits, min_split_tokens=32
    )
    assert out.dtype == torch.bfloat16
    assert (
        relative_error(out, reference.attention(batch.q, batch.kv_cache, batch.meta, 0.125, sinks=sinks))
        < 1e-2
    )
    assert relative_error(out, dense_attention(batch, 0.125, sinks=sinks)) < 1e-2
