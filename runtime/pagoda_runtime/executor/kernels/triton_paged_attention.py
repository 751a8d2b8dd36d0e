"""Paged attention for a flat batch of decode steps and prefill chunks over cached prefixes.

One program per (sequence, kv head, query tile[, KV split]). Its rows are the query heads that
share the kv head times the tile's tokens, so grouped-query attention reads each key and value
once for the whole group. Keys are walked in tiles of BLOCK_N positions, each position's cache row
found through the block table, with an online softmax in float32 (exp2 of log2-scaled scores).
Keys and values are widened to q's dtype as they load (an fp8 cache included, which has no scale).

Split-K (flash-decoding): when a decode batch has too few (sequence, kv head) pairs to fill the
GPU, each program takes one of NUM_SPLITS contiguous key ranges and writes a partial output and
its log-sum-exp; a second kernel merges the splits. NUM_SPLITS depends only on the batch size,
never on context lengths, so a captured CUDA graph stays valid as sequences grow.

Sliding window (HAS_WINDOW): a query at position p sees the keys p - window + 1 .. p. A tile's
key walk starts at its first query's window, so the blocks wholly before it are never read (their
table entries may name no block: the block manager released them), and keys before a query's own
window are masked. Soft-cap (HAS_SOFTCAP): scores become softcap * tanh(scores / softcap) before
the mask (Gemma 2).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from pagoda_runtime.executor.attention_metadata import AttentionMetadata
from pagoda_runtime.executor.triton_mode import dot_precision

LOG2E = 1.4426950408889634
MAX_SPLITS = 32
# Compiled tl.dot multiplies along at least 16 elements: smaller head dims are padded (masked) to it.
MIN_DOT_K = 16


# The block table's row stride is its width, which follows the batch's longest sequence; left to
# Triton it would be specialized (== 1, divisible by 16) and each new class would compile again.
@triton.jit(do_not_specialize=["stride_bt"])
def _paged_attention_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    query_start_ptr,
    out_ptr,
    partial_out_ptr,
    partial_lse_ptr,
    qk_scale,
    window,
    softcap,
    stride_qt,
    stride_qh,
    stride_bt,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
):
    BLOCK_M: tl.constexpr = BLOCK_Q // GROUP_PAD  # query tokens per tile
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    tile = tl.program_id(2) // NUM_SPLITS
    split = tl.program_id(2) % NUM_SPLITS
    query_start = tl.load(query_start_ptr + seq)
    query_len = tl.load(query_start_ptr + seq + 1) - query_start
    if tile * BLOCK_M >= query_len:
        return
    context_len = tl.load(seq_lens_ptr + seq)
    prefix_len = context_len - query_len

    rows = tl.arange(0, BLOCK_Q)
    token = tile * BLOCK_M + rows // GROUP_PAD
    head = kv_head * GROUP + rows % GROUP_PAD
    row_valid = (token < query_len) & (rows % GROUP_PAD < GROUP)
    dims = tl.arange(0, BLOCK_D)
    dim_valid = dims < HEAD_DIM
    q_offsets = (query_start + token).to(tl.int64)[:, None] * stride_qt + head[:, None] * stride_qh
    q = tl.load(q_ptr + q_offsets + dims[None, :], mask=row_valid[:, None] & dim_valid[None, :], other=0.0)
    query_pos = prefix_len + token

    kv_end = tl.minimum(context_len, prefix_len + (tile + 1) * BLOCK_M)  # causal: no key past the tile
    kv_begin = 0
    if HAS_WINDOW:
        kv_begin = tl.maximum(prefix_len + tile * BLOCK_M - window + 1, 0)
    per_split = tl.cdiv(tl.cdiv(kv_end - kv_begin, NUM_SPLITS), BLOCK_N) * BLOCK_N
    kv_lo = kv_begin + split * per_split
    kv_hi = tl.minimum(kv_end, kv_lo + per_split)

    m_i = tl.full([BLOCK_Q], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_Q], dtype=tl.float32)
    acc = tl.zeros([BLOCK_Q, BLOCK_D], dtype=tl.float32)
    start = kv_lo
    # A while loop: Triton's interpreter cannot take a loaded scalar as a range() bound.
    while start < kv_hi:
        keys = start + tl.arange(0, BLOCK_N)
        key_valid = keys < kv_hi
        page = tl.load(block_tables_ptr + seq * stride_bt + keys // BLOCK_SIZE, mask=key_valid, other=0)
        slot = page.to(tl.int64) * BLOCK_SIZE + keys % BLOCK_SIZE
        kv_offsets = slot[:, None] * (NUM_KV_HEADS * HEAD_DIM) + kv_head * HEAD_DIM + dims[None, :]
        kv_mask = key_valid[:, None] & dim_valid[None, :]
        k = tl.load(k_cache_ptr + kv_offsets, mask=kv_mask, other=0.0).to(q.dtype)
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        if HAS_SOFTCAP:
            # qk_scale carries log2(e): cap the natural-log scores (tanh through sigmoid), then
            # return to base 2.
            tanh = 2.0 * tl.sigmoid(2.0 * 0.6931471805599453 * scores / softcap) - 1.0
            scores = tanh * softcap * 1.4426950408889634
        allowed = key_valid[None, :] & (keys[None, :] <= query_pos[:, None])
        if HAS_WINDOW:
            allowed &= keys[None, :] > query_pos[:, None] - window
        scores = tl.where(allowed, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        # A row with no allowed key yet keeps m = -inf; subtract 0 instead so exp2 gives 0, not NaN.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(scores - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_cache_ptr + kv_offsets, mask=kv_mask, other=0.0).to(q.dtype)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
        start += BLOCK_N

    has_keys = l_i > 0
    out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    out_rows = (query_start + token).to(tl.int64) * NUM_HEADS + head
    store_mask = row_valid[:, None] & dim_valid[None, :]
    if NUM_SPLITS == 1:
        tl.store(
            out_ptr + out_rows[:, None] * HEAD_DIM + dims[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=store_mask,
        )
    else:
        partial_rows = out_rows * NUM_SPLITS + split
        tl.store(partial_out_ptr + partial_rows[:, None] * HEAD_DIM + dims[None, :], out, mask=store_mask)
        lse = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
        tl.store(partial_lse_ptr + partial_rows, lse, mask=row_valid)


@triton.jit
def _merge_splits_kernel(
    partial_out_ptr,
    partial_lse_ptr,
    out_ptr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64) * tl.num_programs(1) + tl.program_id(1)  # token * H + head
    splits = tl.arange(0, BLOCK_S)
    dims = tl.arange(0, BLOCK_D)
    split_valid = splits < NUM_SPLITS
    # Splits with no keys (past a short context) carry lse = -inf and weigh nothing.
    lse = tl.load(partial_lse_ptr + row * NUM_SPLITS + splits, mask=split_valid, other=float("-inf"))
    weight = tl.exp2(lse - tl.max(lse, axis=0))
    partial = tl.load(
        partial_out_ptr + (row * NUM_SPLITS + splits)[:, None] * HEAD_DIM + dims[None, :],
        mask=(weight > 0)[:, None] & (dims < HEAD_DIM)[None, :],
        other=0.0,
    )
    out = tl.sum(partial * weight[:, None], axis=0) / tl.sum(weight, axis=0)
    tl.store(out_ptr + row * HEAD_DIM + dims, out.to(out_ptr.dtype.element_ty), mask=dims < HEAD_DIM)


@functools.cache
def _multiprocessor_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def default_num_splits(num_seqs: int, num_kv_heads: int, device: torch.device) -> int:
    """Enough KV splits for about two programs per multiprocessor in a decode batch."""
    if device.type != "cuda":
        return 1
    programs = num_seqs * num_kv_heads
    return max(1, min(MAX_SPLITS, triton.cdiv(2 * _multiprocessor_count(device.index or 0), programs)))


def paged_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    num_splits: int | None = None,
) -> torch.Tensor:
    """Causal attention of q [T, H, D] over kv_cache [2, blocks, block_size, Hkv, D] -> [T, H, D].

    window: each query sees only the `window` keys up to its own (a sliding-window layer);
    softcap: scores soft-capped by tanh (Gemma 2);
    num_splits: KV splits per (sequence, kv head); by default split-K for decode-only batches
    that would leave the GPU idle, one split otherwise.
    """
    num_tokens, num_heads, head_dim = q.shape
    block_size, num_kv_heads = kv_cache.shape[2], kv_cache.shape[3]
    assert q.stride(-1) == 1 and kv_cache.is_contiguous() and meta.block_tables.stride(-1) == 1
    group = num_heads // num_kv_heads
    group_pad = triton.next_power_of_2(group)
    num_seqs = meta.num_seqs
    if meta.is_decode_only:
        block_q = max(16, group_pad)
        if num_splits is None:
            num_splits = default_num_splits(num_seqs, num_kv_heads, q.device)
    else:
        block_q = max(64, group_pad)
        num_splits = num_splits or 1
    num_tiles = triton.cdiv(meta.max_query_len, block_q // group_pad)
    out = torch.empty(num_tokens, num_heads, head_dim, dtype=q.dtype, device=q.device)
    if num_splits > 1:
        partial_out = torch.empty(
            num_tokens, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device
        )
        partial_lse = torch.empty(num_tokens, num_heads, num_splits, dtype=torch.float32, device=q.device)
    else:
        partial_out = partial_lse = out
    _paged_attention_kernel[(num_seqs, num_kv_heads, num_tiles * num_splits)](
        q,
        kv_cache[0],
        kv_cache[1],
        meta.block_tables,
        meta.seq_lens,
        meta.query_start_loc,
        out,
        partial_out,
        partial_lse,
        scale * LOG2E,
        window or 0,
        softcap or 0.0,
        q.stride(0),
        q.stride(1),
        meta.block_tables.stride(0),
        NUM_HEADS=num_heads,
        NUM_KV_HEADS=num_kv_heads,
        GROUP=group,
        GROUP_PAD=group_pad,
        HEAD_DIM=head_dim,
        BLOCK_D=max(MIN_DOT_K, triton.next_power_of_2(head_dim)),
        BLOCK_SIZE=block_size,
        BLOCK_Q=block_q,
        BLOCK_N=64 if head_dim <= 128 else 32,
        NUM_SPLITS=num_splits,
        DOT_PRECISION=dot_precision(q.dtype),
        HAS_WINDOW=window is not None,
        HAS_SOFTCAP=softcap is not None,
        num_warps=4,
    )
    if num_splits > 1:
        _merge_splits_kernel[(num_tokens, num_heads)](
            partial_out,
            partial_lse,
            out,
            HEAD_DIM=head_dim,
            BLOCK_D=triton.next_power_of_2(head_dim),
            NUM_SPLITS=num_splits,
            BLOCK_S=triton.next_power_of_2(num_splits),
        )
    return out
