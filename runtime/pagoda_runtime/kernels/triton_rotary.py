"""Rotary embedding applied in place to q and k, one program per token, rotate_half style.

Each head's first half x1 and second half x2 become (x1 cos - x2 sin, x2 cos + x1 sin), computed
in float32; cos and sin come from the precomputed table row of the token's position.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate(
    x_ptr,
    stride_t,
    stride_h,
    token,
    cos,
    sin,
    NUM_HEADS: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    heads = tl.arange(0, BLOCK_H)[:, None]
    dims = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (heads < NUM_HEADS) & (dims < HALF)
    first = x_ptr + token * stride_t + heads * stride_h + dims
    x1 = tl.load(first, mask=mask).to(tl.float32)
    x2 = tl.load(first + HALF, mask=mask).to(tl.float32)
    tl.store(first, (x1 * cos - x2 * sin).to(x_ptr.dtype.element_ty), mask=mask)
    tl.store(first + HALF, (x2 * cos + x1 * sin).to(x_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(
    positions_ptr,
    q_ptr,
    k_ptr,
    cache_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_KV_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    token = tl.program_id(0)
    position = tl.load(positions_ptr + token).to(tl.int64)
    dims = tl.arange(0, BLOCK_HALF)[None, :]
    row = cache_ptr + position * 2 * HALF + dims
    cos = tl.load(row, mask=dims < HALF).to(tl.float32)
    sin = tl.load(row + HALF, mask=dims < HALF).to(tl.float32)
    _rotate(q_ptr, stride_qt, stride_qh, token, cos, sin, NUM_HEADS, HALF, BLOCK_H, BLOCK_HALF)
    _rotate(k_ptr, stride_kt, stride_kh, token, cos, sin, NUM_KV_HEADS, HALF, BLOCK_KV_H, BLOCK_HALF)


def rotary(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    derived: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [T, H, D] and k [T, Hkv, D] (last dim contiguous) in place; returns (q, k)."""
    num_tokens, num_heads, head_dim = q.shape
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and cos_sin_cache.is_contiguous()
    if num_tokens:
        _rotary_kernel[(num_tokens,)](
            positions,
            q,
            k,
            cos_sin_cache,
            q.stride(0),
            q.stride(1),
            k.stride(0),
            k.stride(1),
            NUM_HEADS=num_heads,
            NUM_KV_HEADS=k.shape[1],
            HALF=head_dim // 2,
            BLOCK_H=triton.next_power_of_2(num_heads),
            BLOCK_KV_H=triton.next_power_of_2(k.shape[1]),
            BLOCK_HALF=triton.next_power_of_2(head_dim // 2),
        )
    return q, k
