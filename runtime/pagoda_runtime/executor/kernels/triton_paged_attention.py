"""Paged attention for a flat batch of decode steps and prefill chunks over cached prefixes.

One program per (sequence, kv head, query tile[, KV split]). Its rows are the query heads that
share the kv head times the tile's tokens, so grouped-query attention reads each key and value
once for the whole group. Keys are walked in tiles of BLOCK_N positions, each position's cache row
found through the block table, with an online softmax in float32 (exp2 of log2-scaled scores).
Keys and values are widened to q's dtype as they load (an fp8 cache in registers, triton_helpers);
an fp8 cache may carry a scale per kv head for keys and for values, which fold into the score
scale and the output.

The key loop is a `tl.range` with `num_stages`, so the compiler software-pipelines it: the block
table entries and the key and value tiles of the next steps are in flight (cp.async into shared
memory) while the current one is multiplied. Triton's interpreter cannot take a loaded bound in a
range(), so there the same step runs in a `while` loop.

Split-K (flash-decoding): a decode batch, or one of short queries (speculative decoding's verify
steps), with too few (sequence, kv head) pairs to fill the GPU launches up to NUM_SPLITS programs
per pair, a number that depends only on the batch size, so a captured CUDA graph stays valid as
contexts grow. How many of them work is decided per sequence,
inside the kernel, from its context: one split per MIN_SPLIT_TOKENS keys (no split at all below
that), the others return at once. A sequence with one split writes its output directly; with
several, each writes a partial output and its log-sum-exp, and the last one to finish (an atomic
arrival counter per sequence, kv head and tile, which it resets) merges them: no second kernel.

Sliding window (HAS_WINDOW): a query at position p sees the keys p - window + 1 .. p. A tile's
key walk (and so its splits) starts at its first query's window, so the blocks wholly before it
are never read (their table entries may name no block: the block manager released them), and keys
before a query's own window are masked. Chunked (CHUNKED, Llama 4): the window is an attention
chunk instead, a query at p seeing the keys p - p % window .. p, and a tile's walk starts at its
first query's chunk. Soft-cap (HAS_SOFTCAP): scores become
softcap * tanh(scores / softcap) before the mask (Gemma 2).

Attention sinks (HAS_SINKS, GPT-OSS): a logit per query head joins each row's softmax as a key
whose value is zero. It is folded in once per row, after the key walk or in the merge of the
splits, so that each split's partial stays a plain softmax over its own keys and the key loop is
the same with sinks as without.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from pagoda_runtime.executor.attention_metadata import AttentionMetadata
from pagoda_runtime.executor.triton_helpers import dot, fp8_asm, fp8_widened
from pagoda_runtime.executor.triton_mode import INTERPRETED, dot_precision

LOG2E = 1.4426950408889634
MAX_SPLITS = 32
# A split takes at least this many keys: below it, one program walks the whole context.
MIN_SPLIT_TOKENS = 256
# Compiled tl.dot multiplies along at least 16 elements: smaller head dims are padded (masked) to it.
MIN_DOT_K = 16
DECODE_STAGES, PREFILL_STAGES = 3, 2
# A batch whose every sequence's queries (times the query heads per kv head) fit one tile of this
# many rows runs as decode does: small tiles, KV splits.
SHORT_QUERY_ROWS = 64
# Heads wider than this (absorbed latent attention: DeepSeek's 512 + 64, padded to 1024) take tiles
# of at most WIDE_ROWS query rows and WIDE_KEYS keys, whose query, accumulator and two pipelined
# key and value tiles fit 227 KB of shared memory and, over 8 warps, the registers without spilling;
# more query heads than WIDE_ROWS per KV head run WIDE_ROWS at a time, each launch walking the keys
# again.
WIDE_HEAD_DIM, WIDE_ROWS, WIDE_KEYS = 256, 16, 16


@triton.jit
def _widened(x, DTYPE: tl.constexpr, FP8_ASM: tl.constexpr, INTERPRETED: tl.constexpr):
    """Cache values in q's dtype: an fp8 cache through triton_helpers' widening into bf16 or fp16."""
    if x.dtype == tl.float8e4nv and tl.float32 != DTYPE:
        return fp8_widened(x, DTYPE, FP8_ASM, INTERPRETED)
    return x.to(DTYPE)


@triton.jit
def _sink_log2(sinks_ptr, head, row_valid):
    """The rows' sink logits in the scores' base-2 units: not scaled, not capped, not masked."""
    return tl.load(sinks_ptr + head, mask=row_valid, other=0.0).to(tl.float32) * 1.4426950408889634


@triton.jit
def _attend_keys(
    q,
    m_i,
    l_i,
    acc,
    start,
    kv_hi,
    query_pos,
    seq,
    kv_head,
    dims,
    dim_valid,
    block_tables_ptr,
    stride_bt,
    k_cache_ptr,
    v_cache_ptr,
    qk_scale,
    window,
    softcap,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    CHUNKED: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    FP8_ASM: tl.constexpr,
    INTERPRETED: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    VALUES_ARE_KEYS: tl.constexpr,
):
    """The online softmax's state after the keys [start, start + BLOCK_N) below kv_hi; with
    VALUES_ARE_KEYS (a one-plane cache) the key tile is the value tile, read once."""
    keys = start + tl.arange(0, BLOCK_N)
    key_valid = keys < kv_hi
    page = tl.load(block_tables_ptr + seq * stride_bt + keys // BLOCK_SIZE, mask=key_valid, other=0)
    slot = page.to(tl.int64) * BLOCK_SIZE + keys % BLOCK_SIZE
    kv_offsets = slot[:, None] * (NUM_KV_HEADS * HEAD_DIM) + kv_head * HEAD_DIM + dims[None, :]
    kv_mask = key_valid[:, None] & dim_valid[None, :]
    k = _widened(tl.load(k_cache_ptr + kv_offsets, mask=kv_mask, other=0.0), q.dtype, FP8_ASM, INTERPRETED)
    scores = dot(q, tl.trans(k), None, INTERPRETED, DOT_PRECISION) * qk_scale
    if HAS_SOFTCAP:
        # qk_scale carries log2(e): cap the natural-log scores (tanh through sigmoid), then return
        # to base 2.
        tanh = 2.0 * tl.sigmoid(2.0 * 0.6931471805599453 * scores / softcap) - 1.0
        scores = tanh * softcap * 1.4426950408889634
    allowed = key_valid[None, :] & (keys[None, :] <= query_pos[:, None])
    if HAS_WINDOW and CHUNKED:
        allowed &= keys[None, :] >= (query_pos - query_pos % window)[:, None]
    elif HAS_WINDOW:
        allowed &= keys[None, :] > query_pos[:, None] - window
    scores = tl.where(allowed, scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, axis=1))
    # A row with no allowed key yet keeps m = -inf; subtract 0 instead so exp2 gives 0, not NaN.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(scores - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if VALUES_ARE_KEYS:
        v = k
    else:
        v = tl.load(v_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)
        v = _widened(v, q.dtype, FP8_ASM, INTERPRETED)
    acc = dot(p, v, acc * alpha[:, None], INTERPRETED, DOT_PRECISION)
    return m_new, l_i, acc


# The block table's row stride is its width, which follows the batch's longest sequence; left to
# Triton it would be specialized (== 1, divisible by 16) and each new class would compile again.
@triton.jit(do_not_specialize=["stride_bt"])
def _paged_attention_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    kv_scales_ptr,
    sinks_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    query_start_ptr,
    out_ptr,
    partial_out_ptr,
    partial_lse_ptr,
    arrivals_ptr,
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
    SPLITS_PAD: tl.constexpr,
    MIN_SPLIT_TOKENS: tl.constexpr,
    KV_SCALED: tl.constexpr,
    FP8_ASM: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    INTERPRETED: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    CHUNKED: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    VALUES_ARE_KEYS: tl.constexpr,
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
    kv_end = tl.minimum(context_len, prefix_len + (tile + 1) * BLOCK_M)  # causal: no key past the tile
    kv_begin = 0
    first_query = prefix_len + tile * BLOCK_M
    if HAS_WINDOW and CHUNKED:
        kv_begin = first_query - first_query % window
    elif HAS_WINDOW:
        kv_begin = tl.maximum(first_query - window + 1, 0)
    # This sequence's splits: one per MIN_SPLIT_TOKENS keys, at most NUM_SPLITS, whole key tiles
    # each; num_splits is recomputed from the rounded size so that none is left empty.
    span = kv_end - kv_begin
    wanted = tl.minimum(NUM_SPLITS, tl.cdiv(span, MIN_SPLIT_TOKENS))
    per_split = tl.cdiv(tl.cdiv(span, wanted), BLOCK_N) * BLOCK_N
    num_splits = tl.cdiv(span, per_split)
    if split >= num_splits:
        return
    kv_lo = kv_begin + split * per_split
    kv_hi = tl.minimum(kv_end, kv_lo + per_split)

    rows = tl.arange(0, BLOCK_Q)
    token = tile * BLOCK_M + rows // GROUP_PAD
    head = kv_head * GROUP + rows % GROUP_PAD
    row_valid = (token < query_len) & (rows % GROUP_PAD < GROUP)
    dims = tl.arange(0, BLOCK_D)
    dim_valid = dims < HEAD_DIM
    q_offsets = (query_start + token).to(tl.int64)[:, None] * stride_qt + head[:, None] * stride_qh
    q = tl.load(q_ptr + q_offsets + dims[None, :], mask=row_valid[:, None] & dim_valid[None, :], other=0.0)
    query_pos = prefix_len + token
    if KV_SCALED:
        # Keys were stored divided by their head's scale: it multiplies every score.
        qk_scale = qk_scale * tl.load(kv_scales_ptr + kv_head)

    m_i = tl.full([BLOCK_Q], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_Q], dtype=tl.float32)
    acc = tl.zeros([BLOCK_Q, BLOCK_D], dtype=tl.float32)
    if INTERPRETED:
        start = kv_lo
        while start < kv_hi:
            m_i, l_i, acc = _attend_keys(
                q, m_i, l_i, acc, start, kv_hi, query_pos, seq, kv_head, dims, dim_valid,
                block_tables_ptr, stride_bt, k_cache_ptr, v_cache_ptr, qk_scale, window, softcap,
                NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, BLOCK_N, HAS_WINDOW, CHUNKED, HAS_SOFTCAP, FP8_ASM,
                INTERPRETED, DOT_PRECISION, VALUES_ARE_KEYS,
            )  # fmt: skip
            start += BLOCK_N
    else:
        for start in tl.range(kv_lo, kv_hi, BLOCK_N, num_stages=NUM_STAGES):
            m_i, l_i, acc = _attend_keys(
                q, m_i, l_i, acc, start, kv_hi, query_pos, seq, kv_head, dims, dim_valid,
                block_tables_ptr, stride_bt, k_cache_ptr, v_cache_ptr, qk_scale, window, softcap,
                NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, BLOCK_N, HAS_WINDOW, CHUNKED, HAS_SOFTCAP, FP8_ASM,
                INTERPRETED, DOT_PRECISION, VALUES_ARE_KEYS,
            )  # fmt: skip
    if KV_SCALED:
        acc = acc * tl.load(kv_scales_ptr + NUM_KV_HEADS + kv_head)
    # Only where this program's output is the row's: a split's partial leaves the sink to the merge.
    if HAS_SINKS and (NUM_SPLITS == 1 or num_splits == 1):
        sink = _sink_log2(sinks_ptr, head, row_valid)
        m_sink = tl.maximum(m_i, sink)
        alpha = tl.exp2(m_i - m_sink)
        acc = acc * alpha[:, None]
        l_i = l_i * alpha + tl.exp2(sink - m_sink)

    has_keys = l_i > 0
    out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    out_rows = (query_start + token).to(tl.int64) * NUM_HEADS + head
    store_mask = row_valid[:, None] & dim_valid[None, :]
    if NUM_SPLITS == 1 or num_splits == 1:
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
        # Every thread's stores are issued before the arrival; the atomic releases them to the
        # program that arrives last, which acquires them, and they are read around the L1 cache.
        tl.debug_barrier()
        num_tiles = tl.num_programs(2) // NUM_SPLITS
        arrival = arrivals_ptr + (seq * NUM_KV_HEADS + kv_head) * num_tiles + tile
        if tl.atomic_add(arrival, 1, sem="acq_rel") == num_splits - 1:
            tl.atomic_xchg(arrival, 0)  # ready for the next launch
            _merge_splits(
                partial_out_ptr, partial_lse_ptr, out_ptr, sinks_ptr, out_rows, head, row_valid, dims,
                dim_valid, num_splits, HEAD_DIM, NUM_SPLITS, SPLITS_PAD, HAS_SINKS,
            )  # fmt: skip


@triton.jit
def _merge_splits(
    partial_out_ptr,
    partial_lse_ptr,
    out_ptr,
    sinks_ptr,
    out_rows,
    head,
    row_valid,
    dims,
    dim_valid,
    num_splits,
    HEAD_DIM: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    """The splits' partial outputs weighted by their share of the softmax: exp2(lse_s - max lse).
    A sink is one more term of the log-sum-exp, with a zero output."""
    splits = tl.arange(0, SPLITS_PAD)
    lse_mask = row_valid[:, None] & (splits[None, :] < num_splits)
    lse = tl.load(
        partial_lse_ptr + out_rows[:, None] * NUM_SPLITS + splits[None, :],
        mask=lse_mask,
        other=float("-inf"),
        cache_modifier=".cg",
    )
    m = tl.max(lse, axis=1)
    if HAS_SINKS:
        sink = _sink_log2(sinks_ptr, head, row_valid)
        m = tl.maximum(m, sink)
    m = tl.where(m == float("-inf"), 0.0, m)
    total = tl.sum(tl.exp2(lse - m[:, None]), axis=1)
    if HAS_SINKS:
        total += tl.exp2(sink - m)
    out = tl.zeros([out_rows.shape[0], dims.shape[0]], dtype=tl.float32)
    for s in range(0, NUM_SPLITS):
        if s < num_splits:
            rows = out_rows * NUM_SPLITS + s
            lse_s = tl.load(partial_lse_ptr + rows, mask=row_valid, other=float("-inf"), cache_modifier=".cg")
            part = tl.load(
                partial_out_ptr + rows[:, None] * HEAD_DIM + dims[None, :],
                mask=row_valid[:, None] & dim_valid[None, :] & (lse_s > float("-inf"))[:, None],
                other=0.0,
                cache_modifier=".cg",
            )
            out += part * tl.exp2(lse_s - m)[:, None]
    out = out / tl.where(total > 0, total, 1.0)[:, None]
    tl.store(
        out_ptr + out_rows[:, None] * HEAD_DIM + dims[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_valid[:, None] & dim_valid[None, :],
    )


@functools.cache
def _multiprocessor_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def max_splits(num_seqs: int, num_kv_heads: int, device: torch.device) -> int:
    """Enough KV splits for about two programs per multiprocessor in a decode batch (how many of
    them work is the kernel's choice per sequence, from its context)."""
    if device.type != "cuda":
        return 1
    programs = num_seqs * num_kv_heads
    return max(1, min(MAX_SPLITS, triton.cdiv(2 * _multiprocessor_count(device.index or 0), programs)))


# Per device, every arrival-counter buffer ever made: a captured CUDA graph keeps the address it
# was captured with, so a buffer outgrown by a larger batch must stay allocated.
_ARRIVALS: dict[torch.device, list[torch.Tensor]] = {}


def _arrival_counters(device: torch.device, count: int) -> torch.Tensor:
    """Zeroed int32 counters, at least `count`; the kernel leaves them zeroed after each launch."""
    buffers = _ARRIVALS.setdefault(device, [])
    if not buffers or buffers[-1].numel() < count:
        buffers.append(torch.zeros(max(count, 1024), dtype=torch.int32, device=device))
    return buffers[-1]


def paged_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    kv_scales: torch.Tensor | None = None,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    num_splits: int | None = None,
    min_split_tokens: int = MIN_SPLIT_TOKENS,
    chunked: bool = False,
) -> torch.Tensor:
    """Causal attention of q [T, H, D] over kv_cache [2, blocks, block_size, Hkv, D] -> [T, H, D]
    (keys kv_cache[0], values kv_cache[-1]: a one-plane cache's keys are its values too, each tile
    read once for both).

    kv_scales: float32 [2, Hkv], what the cache's keys and values were divided by when stored (an
    fp8 cache's scales), or None. num_splits: the most KV splits per (sequence, kv head, query
    tile); by default enough for a decode-only batch to fill the GPU, one otherwise. Each sequence
    uses one split per min_split_tokens keys of its context, up to that.
    window: each query sees only the `window` keys up to its own (a sliding-window layer);
    chunked: the window is an attention chunk, a query at p seeing the keys from p - p % window
    (Llama 4's chunked layers); softcap: scores soft-capped by tanh (Gemma 2); sinks: [H] in any
    float dtype, a logit per query head (natural log, unscaled) that joins every row's softmax as a
    key whose value is zero (GPT-OSS).
    """
    num_tokens, num_heads, head_dim = q.shape
    block_size, num_kv_heads = kv_cache.shape[2], kv_cache.shape[3]
    assert q.stride(-1) == 1 and kv_cache.is_contiguous() and meta.block_tables.stride(-1) == 1
    assert sinks is None or (sinks.shape == (num_heads,) and sinks.stride(0) == 1)
    group = num_heads // num_kv_heads
    wide = head_dim > WIDE_HEAD_DIM
    if wide and group > WIDE_ROWS:
        assert num_kv_heads == 1 and sinks is None, "wide heads run in groups over one KV head only"
        heads = range(0, num_heads, WIDE_ROWS)
        args = (
            kv_cache,
            meta,
            scale,
            kv_scales,
            window,
            softcap,
            None,
            num_splits,
            min_split_tokens,
            chunked,
        )
        return torch.cat([paged_attention(q[:, h : h + WIDE_ROWS], *args) for h in heads], dim=1)
    group_pad = triton.next_power_of_2(group)
    num_seqs = meta.num_seqs
    if meta.max_query_len * group_pad <= SHORT_QUERY_ROWS:
        # Decode, and the verify steps of speculative decoding (1 + K queries a sequence): one tile
        # holds a sequence's queries, so without splits a small batch would walk its contexts with a
        # handful of programs.
        block_q = max(16, triton.next_power_of_2(meta.max_query_len * group_pad))
        if num_splits is None:
            num_splits = max_splits(num_seqs, num_kv_heads, q.device)
        stages = DECODE_STAGES
    else:
        block_q = max(WIDE_ROWS if wide else 64, group_pad)
        num_splits = num_splits or 1
        stages = PREFILL_STAGES
    num_tiles = triton.cdiv(meta.max_query_len, block_q // group_pad)
    out = torch.empty(num_tokens, num_heads, head_dim, dtype=q.dtype, device=q.device)
    if num_splits > 1:
        partial_out = torch.empty(
            num_tokens, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device
        )
        partial_lse = torch.empty(num_tokens, num_heads, num_splits, dtype=torch.float32, device=q.device)
        arrivals = _arrival_counters(q.device, num_seqs * num_kv_heads * num_tiles)
    else:
        partial_out = partial_lse = arrivals = out
    _paged_attention_kernel[(num_seqs, num_kv_heads, num_tiles * num_splits)](
        q,
        kv_cache[0],
        kv_cache[-1],
        kv_scales if kv_scales is not None else out,
        sinks if sinks is not None else out,
        meta.block_tables,
        meta.seq_lens,
        meta.query_start_loc,
        out,
        partial_out,
        partial_lse,
        arrivals,
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
        BLOCK_N=64 if head_dim <= 128 else WIDE_KEYS if wide else 32,
        NUM_SPLITS=num_splits,
        SPLITS_PAD=triton.next_power_of_2(num_splits),
        MIN_SPLIT_TOKENS=min_split_tokens,
        KV_SCALED=kv_scales is not None,
        FP8_ASM=fp8_asm(q.dtype),
        NUM_STAGES=stages,
        INTERPRETED=INTERPRETED,
        DOT_PRECISION=dot_precision(q.dtype),
        HAS_WINDOW=window is not None,
        CHUNKED=chunked,
        HAS_SOFTCAP=softcap is not None,
        HAS_SINKS=sinks is not None,
        VALUES_ARE_KEYS=kv_cache.shape[0] == 1,
        num_warps=8 if wide else 4,
    )
    return out
