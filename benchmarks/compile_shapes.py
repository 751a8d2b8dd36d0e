"""The Llama-3-8B shapes hopper_compile.py's cases use, and a decode batch of them; shared by the
cases of this tree (compile_cases.py) and of commit 00b838f (compile_cases_before.py), so it
imports nothing that commit lacks."""

from __future__ import annotations

import math

import torch

from pagoda_runtime.executor.attention_metadata import AttentionMetadata

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 128, 16
SMS = 132  # H100 SXM / H200
# (name, out_features, in_features) of one Llama-3-8B decoder layer with fused qkv and gate_up.
LLAMA3_8B_LAYERS = [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)]


def decode_batch(
    batch: int,
    context: int,
    dtype=torch.bfloat16,
    kv_dtype=None,
    query_len: int = 1,
    head_dim: int = HEAD_DIM,
):
    """q, a small cache and metadata shaped like `batch` sequences of `context` tokens: the
    compiled code depends on the shapes' constants and dtypes only, not on the cache's size."""
    cache = torch.zeros(2, 4, BLOCK_SIZE, KV_HEADS, head_dim, dtype=kv_dtype or dtype)
    width = math.ceil(context / BLOCK_SIZE)
    meta = AttentionMetadata(
        slot_mapping=torch.zeros(batch * query_len, dtype=torch.int64),
        query_start_loc=torch.arange(batch + 1, dtype=torch.int32) * query_len,
        seq_lens=torch.full((batch,), context, dtype=torch.int32),
        block_tables=torch.zeros(batch, width, dtype=torch.int32),
        max_query_len=query_len,
        max_seq_len=context,
    )
    return torch.randn(batch * query_len, HEADS, head_dim, dtype=dtype), cache, meta
