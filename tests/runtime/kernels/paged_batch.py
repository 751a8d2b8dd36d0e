"""Random paged-attention batches for the kernel tests, with dense copies of every sequence.

A batch is a list of (context_len, query_len) pairs: query_len 1 is a decode step, more is a
prefill chunk over a cached prefix of context_len - query_len tokens. Blocks are handed out in a
shuffled order, so each sequence's pages are scattered through the cache, and every cache slot
no sequence owns holds NaN, so a kernel that reads outside a sequence's keys returns NaN. The
cache may have its own dtype (fp8) and per-tensor scales; the prefixes are stored as write_kv would.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from pagoda_runtime.executor.attention_metadata import AttentionMetadata
from pagoda_runtime.executor.kernels.reference import to_cache_dtype


@dataclass
class PagedBatch:
    q: torch.Tensor  # [T, H, D]
    k_new: torch.Tensor  # [T, Hkv, D]: this step's keys, not yet in the cache
    v_new: torch.Tensor
    kv_cache: torch.Tensor  # [2, blocks, block_size, Hkv, D], prefixes written, the rest NaN
    meta: AttentionMetadata
    keys: list[torch.Tensor]  # per sequence, [context_len, Hkv, D], prefix and new tokens
    values: list[torch.Tensor]


def make_paged_batch(
    seqs: list[tuple[int, int]],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    seed: int = 0,
    kv_cache_dtype: torch.dtype | None = None,
) -> PagedBatch:
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-context_len // block_size) for context_len, _ in seqs]
    num_blocks = sum(blocks_per_seq) + 2
    order = torch.randperm(num_blocks, generator=gen).tolist()
    width = max(blocks_per_seq) + 1  # one padding column past the longest sequence
    block_tables = torch.zeros(len(seqs), width, dtype=torch.int32)
    cache_dtype = kv_cache_dtype or dtype
    kv_cache = torch.full((2, num_blocks, block_size, num_kv_heads, head_dim), float("nan")).to(cache_dtype)
    flat_k, flat_v = kv_cache[0].flatten(0, 1), kv_cache[1].flatten(0, 1)
    keys, values, queries, slot_mapping, new_k, new_v = [], [], [], [], [], []
    for i, (context_len, query_len) in enumerate(seqs):
        pages = [order.pop() for _ in range(blocks_per_seq[i])]
        block_tables[i, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
        positions = torch.arange(context_len)
        slots = torch.tensor(pages)[positions // block_size] * block_size + positions % block_size
        k = torch.randn(context_len, num_kv_heads, head_dim, generator=gen)
        v = torch.randn(context_len, num_kv_heads, head_dim, generator=gen)
        prefix = context_len - query_len
        flat_k[slots[:prefix]] = to_cache_dtype(k[:prefix].to(dtype), cache_dtype)
        flat_v[slots[:prefix]] = to_cache_dtype(v[:prefix].to(dtype), cache_dtype)
        keys.append(k.to(dtype).to(device))
        values.append(v.to(dtype).to(device))
        queries.append(torch.randn(query_len, num_heads, head_dim, generator=gen))
        slot_mapping.append(slots[prefix:])
        new_k.append(k[prefix:])
        new_v.append(v[prefix:])
    query_lens = torch.tensor([q for _, q in seqs])
    meta = AttentionMetadata(
        slot_mapping=torch.cat(slot_mapping).to(device),
        query_start_loc=torch.cat([torch.zeros(1), query_lens.cumsum(0)]).to(torch.int32).to(device),
        seq_lens=torch.tensor([c for c, _ in seqs], dtype=torch.int32, device=device),
        block_tables=block_tables.to(device),
        max_query_len=int(query_lens.max()),
        max_seq_len=max(c for c, _ in seqs),
    )
    return PagedBatch(
        q=torch.cat(queries).to(dtype).to(device),
        k_new=torch.cat(new_k).to(dtype).to(device),
        v_new=torch.cat(new_v).to(dtype).to(device),
        kv_cache=kv_cache.to(device),
        meta=meta,
        keys=keys,
        values=values,
    )


def dense_attention(
    batch: PagedBatch,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    chunk: int | None = None,
) -> torch.Tensor:
    """Causal attention computed in float64 from the dense per-sequence keys and values; window: each
    query sees its `window` latest keys; chunk: each query sees the keys of its own chunk of `chunk`
    positions (0 .. chunk - 1, chunk .. 2 * chunk - 1, ...); softcap: scores soft-capped by tanh;
    sinks: a logit per head that joins each row's softmax as one more column, dropped after it
    (GPT-OSS)."""
    starts = batch.meta.query_start_loc.tolist()
    outs = []
    for i, (k, v) in enumerate(zip(batch.keys, batch.values, strict=True)):
        q = batch.q[starts[i] : starts[i + 1]].double().transpose(0, 1)  # [H, M, D]
        group = q.shape[0] // k.shape[1]
        k = k.double().repeat_interleave(group, dim=1).transpose(0, 1)  # [H, L, D]
        v = v.double().repeat_interleave(group, dim=1).transpose(0, 1)
        query_len, context_len = q.shape[1], k.shape[1]
        query_pos = torch.arange(context_len - query_len, context_len, device=q.device)
        key_pos = torch.arange(context_len, device=q.device)[None, :]
        allowed = key_pos <= query_pos[:, None]
        if window is not None:
            allowed &= key_pos > query_pos[:, None] - window
        if chunk is not None:
            allowed &= key_pos // chunk == (query_pos // chunk)[:, None]
        scores = q @ k.transpose(1, 2) * scale
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        scores = scores.masked_fill(~allowed, float("-inf"))
        if sinks is not None:
            column = sinks.double().reshape(-1, 1, 1).expand(-1, query_len, 1)
            scores = torch.cat([scores, column], dim=-1)
        probs = torch.softmax(scores, dim=-1)
        outs.append(((probs if sinks is None else probs[..., :-1]) @ v).transpose(0, 1))
    return torch.cat(outs)


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert torch.isfinite(out).all(), "the output holds NaN or inf"
    return float((out.double() - ref.double()).norm() / ref.double().norm())


def release_outside_window(batch: PagedBatch, window: int, chunked: bool = False) -> None:
    """What the block manager does for a window layer: every block wholly before the window of a
    sequence's first query of the step is handed back (NaN here, so reading it shows) and its table
    entry names no block (-1). chunked: every block wholly before that query's attention chunk of
    `window` positions, more than the block manager hands back, so a read before the chunk shows."""
    block_size = batch.kv_cache.shape[2]
    starts = batch.meta.query_start_loc.tolist()
    for i, context_len in enumerate(batch.meta.seq_lens.tolist()):
        first_query = context_len - (starts[i + 1] - starts[i])
        first_key = first_query - first_query % window if chunked else max(0, first_query - window + 1)
        for j in range(first_key // block_size):
            batch.kv_cache[:, int(batch.meta.block_tables[i, j])] = float("nan")
            batch.meta.block_tables[i, j] = -1
