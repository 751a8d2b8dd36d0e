"""Rotary embedding and the KV cache write in one kernel, one program per token.

The query's heads are rotated in place; the key's are rotated on the way into the cache, so a
rotated key is never written back to the projection's output and read again, and a layer
launches one kernel for both. Rotation is rotate_half style: each head's first half x1 and second
half x2 become (x1 cos - x2 sin, x2 cos + x1 sin), computed in float32 from the table row of the
token's position.

slot_mapping[t] = block * block_size + offset names the cache row of token t; the cache's
[blocks, block_size] dimensions are contiguous, so the slot indexes a flat row of Hkv * D values.
The cache holds k and v as the model computes them (see kernels/reference.py), times 1 / scale of
their kv head when the cache has scales, saturated to +-448 when it is fp8 e4m3.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagoda_runtime.executor.kernels.reference import FP8_KV_DTYPE


@triton.jit
def _round_to_e4m3(x):
    """x (float32) saturated to +-448 and rounded to the nearest e4m3 value, ties to even, in float32.

    The cast that follows then has nothing to round. Triton's interpreter rounds fp8 casts without
    carrying into the exponent (7.9 becomes 4.0), so the CPU tests need this; on the GPU it gives
    the hardware's own round-to-nearest-even.
    """
    a = tl.minimum(tl.abs(x), 448.0)
    # e4m3 keeps 3 mantissa bits, so a value of binade 2^e has step 2^(e-3), and below 2^-6 the
    # subnormal step 2^-9. Adding 2^23 * step moves a into a binade whose float32 ulp is that step.
    biased_exponent = tl.maximum((a.to(tl.int32, bitcast=True) >> 23) & 0xFF, 127 - 6)
    magic = ((biased_exponent + 20) << 23).to(tl.float32, bitcast=True)
    rounded = (a + magic) - magic
    # x's sign bit back on, so that a tiny negative value becomes -0 as in torch's cast.
    sign = x.to(tl.int32, bitcast=True) & -0x80000000
    return (rounded.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def _to_cache(x, FP8: tl.constexpr):
    if FP8:
        x = _round_to_e4m3(x)
    return x


@triton.jit
def _rotary_kv_write_kernel(
    positions_ptr,
    q_ptr,
    k_ptr,
    v_ptr,
    cos_sin_ptr,
    cache_ptr,
    slot_ptr,
    inverse_scales_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    value_offset,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_KV_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    FP8: tl.constexpr,
    SCALED: tl.constexpr,
    WRITE_V: tl.constexpr,
):
    token = tl.program_id(0)
    position = tl.load(positions_ptr + token).to(tl.int64)
    dims = tl.arange(0, BLOCK_HALF)[None, :]
    table = cos_sin_ptr + position * 2 * HALF + dims
    cos = tl.load(table, mask=dims < HALF).to(tl.float32)
    sin = tl.load(table + HALF, mask=dims < HALF).to(tl.float32)

    heads = tl.arange(0, BLOCK_H)[:, None]
    q_mask = (heads < NUM_HEADS) & (dims < HALF)
    q_first = q_ptr + token * stride_qt + heads * stride_qh + dims
    q1 = tl.load(q_first, mask=q_mask).to(tl.float32)
    q2 = tl.load(q_first + HALF, mask=q_mask).to(tl.float32)
    tl.store(q_first, (q1 * cos - q2 * sin).to(q_ptr.dtype.element_ty), mask=q_mask)
    tl.store(q_first + HALF, (q2 * cos + q1 * sin).to(q_ptr.dtype.element_ty), mask=q_mask)

    slot = tl.load(slot_ptr + token).to(tl.int64)
    kv_heads = tl.arange(0, BLOCK_KV_H)[:, None]
    # A negative slot is a padding token of a CUDA-graph batch: its query is rotated, nothing stored.
    kv_mask = (kv_heads < NUM_KV_HEADS) & (dims < HALF) & (slot >= 0)
    k_first = k_ptr + token * stride_kt + kv_heads * stride_kh + dims
    k1 = tl.load(k_first, mask=kv_mask).to(tl.float32)
    k2 = tl.load(k_first + HALF, mask=kv_mask).to(tl.float32)
    # Through the model's dtype first: the key the separate rotary kernel would have stored.
    rotated1 = (k1 * cos - k2 * sin).to(k_ptr.dtype.element_ty).to(tl.float32)
    rotated2 = (k2 * cos + k1 * sin).to(k_ptr.dtype.element_ty).to(tl.float32)
    if SCALED:
        k_inverse = tl.load(inverse_scales_ptr + kv_heads, mask=kv_heads < NUM_KV_HEADS)
        rotated1, rotated2 = rotated1 * k_inverse, rotated2 * k_inverse
    row = cache_ptr + slot * NUM_KV_HEADS * 2 * HALF + kv_heads * 2 * HALF + dims
    tl.store(row, _to_cache(rotated1, FP8).to(cache_ptr.dtype.element_ty), mask=kv_mask)
    tl.store(row + HALF, _to_cache(rotated2, FP8).to(cache_ptr.dtype.element_ty), mask=kv_mask)
    if WRITE_V:
        v_first = v_ptr + token * stride_vt + kv_heads * stride_vh + dims
        v1 = tl.load(v_first, mask=kv_mask).to(tl.float32)
        v2 = tl.load(v_first + HALF, mask=kv_mask).to(tl.float32)
        if SCALED:
            v_inverse = tl.load(inverse_scales_ptr + NUM_KV_HEADS + kv_heads, mask=kv_heads < NUM_KV_HEADS)
            v1, v2 = v1 * v_inverse, v2 * v_inverse
        tl.store(row + value_offset, _to_cache(v1, FP8).to(cache_ptr.dtype.element_ty), mask=kv_mask)
        tl.store(row + value_offset + HALF, _to_cache(v2, FP8).to(cache_ptr.dtype.element_ty), mask=kv_mask)


def rotary_write_kv(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor | None,
    cos_sin_cache: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    derived: dict | None = None,
    kv_scales: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rotate q [T, H, D] in place and store the rotated k and v [T, Hkv, D] (last dims
    contiguous) at their slots of kv_cache [2, blocks, block_size, Hkv, D], divided by kv_scales
    [2, Hkv] when given; returns q. k itself is left as it was. v None: a one-plane cache
    [1, ...] whose keys are read as the values too (latent attention), k alone stored."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    write_v = v is not None
    v = v if write_v else k
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1
    assert cos_sin_cache.is_contiguous() and kv_cache.is_contiguous()
    if num_tokens:
        # The reciprocal as the reference computes it: the kernel multiplies, bit for bit alike.
        inverse_scales = None if kv_scales is None else 1 / kv_scales
        _rotary_kv_write_kernel[(num_tokens,)](
            positions,
            q,
            k,
            v,
            cos_sin_cache,
            kv_cache,
            slot_mapping,
            inverse_scales if inverse_scales is not None else cos_sin_cache,
            q.stride(0),
            q.stride(1),
            k.stride(0),
            k.stride(1),
            v.stride(0),
            v.stride(1),
            kv_cache.stride(0),
            NUM_HEADS=num_heads,
            NUM_KV_HEADS=num_kv_heads,
            HALF=head_dim // 2,
            BLOCK_H=triton.next_power_of_2(num_heads),
            BLOCK_KV_H=triton.next_power_of_2(num_kv_heads),
            BLOCK_HALF=triton.next_power_of_2(head_dim // 2),
            FP8=kv_cache.dtype == FP8_KV_DTYPE,
            SCALED=kv_scales is not None,
            WRITE_V=write_v,
        )
    return q
