"""Writes this step's keys and values into the paged cache, one program per token.

slot_mapping[t] = block * block_size + offset names the cache row of token t; the cache's
[blocks, block_size] dimensions are contiguous, so the slot indexes a flat row of Hkv * D values.
The cache holds k and v as they are (see kernels/reference.py), saturated to +-448 when it is fp8
e4m3.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .reference import FP8_KV_DTYPE


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
def _kv_write_kernel(
    k_ptr,
    v_ptr,
    cache_ptr,
    slot_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    value_offset,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    FP8: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    heads = tl.arange(0, BLOCK_H)[:, None]
    dims = tl.arange(0, BLOCK_D)[None, :]
    # A negative slot is a padding token of a CUDA-graph batch: nothing to store.
    mask = (heads < NUM_KV_HEADS) & (dims < HEAD_DIM) & (slot >= 0)
    row = slot * NUM_KV_HEADS * HEAD_DIM + heads * HEAD_DIM + dims
    k = tl.load(k_ptr + token * stride_kt + heads * stride_kh + dims, mask=mask).to(tl.float32)
    v = tl.load(v_ptr + token * stride_vt + heads * stride_vh + dims, mask=mask).to(tl.float32)
    if FP8:
        k = _round_to_e4m3(k)
        v = _round_to_e4m3(v)
    tl.store(cache_ptr + row, k.to(cache_ptr.dtype.element_ty), mask=mask)
    tl.store(cache_ptr + value_offset + row, v.to(cache_ptr.dtype.element_ty), mask=mask)


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    derived: dict | None = None,
) -> None:
    """Store k, v [T, Hkv, D] (last dim contiguous) at their slots of kv_cache [2, blocks, bs, Hkv, D]."""
    num_tokens, num_kv_heads, head_dim = k.shape
    assert k.stride(-1) == 1 and v.stride(-1) == 1 and kv_cache.is_contiguous()
    if num_tokens == 0:
        return
    _kv_write_kernel[(num_tokens,)](
        k,
        v,
        kv_cache,
        slot_mapping,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        kv_cache.stride(0),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_H=triton.next_power_of_2(num_kv_heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
        FP8=kv_cache.dtype == FP8_KV_DTYPE,
    )
