"""Prefill-shaped matmuls (many activation rows) over packed weights, on the tensor cores.

Each K tile of the weight is widened to the activation dtype in registers and fed to tl.dot. The
tile never straddles a quantization group (BLOCK_K divides the group size), so a group's scale
multiplies the tile's float32 partial product once. Widening is exact: int8, 0..15 and e4m3
values are all representable in bf16 and fp16. For int4's affine form
    x . (q * s + o) = (x . q) * s + sum(x) * o
the offset costs one row sum of the activation tile.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from pagoda_runtime.executor.quantization.packed import PackedWeight
from pagoda_runtime.executor.triton_mode import dot_precision


@dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3


# M, the number of activation rows, changes with every batch; left to Triton it would be
# specialized (== 1, divisible by 16) and a new class of batch would compile the kernel again.
@triton.jit(do_not_specialize=["M"])
def _int4_gemm_kernel(
    a_ptr,
    w_ptr,
    s_ptr,
    o_ptr,
    c_ptr,
    M,
    N,
    stride_am,
    stride_cm,
    K: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    half = tl.arange(0, BLOCK_K // 2)
    pair = tl.arange(0, 2)
    m_mask = rm < M
    n_mask = rn < N
    groups_per_row = K // GROUP
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ka = k0 + half[None, :, None] * 2 + pair[None, None, :]
        a = tl.load(
            a_ptr + rm[:, None, None] * stride_am + ka, mask=m_mask[:, None, None] & (ka < K), other=0.0
        )
        a_even, a_odd = tl.split(a)
        kh = k0 // 2 + half
        wq = tl.load(
            w_ptr + rn[None, :] * (K // 2) + kh[:, None],
            mask=n_mask[None, :] & (kh[:, None] < K // 2),
            other=0,
        )
        lo = (wq & 0xF).to(a.dtype)
        hi = (wq >> 4).to(a.dtype)
        partial = tl.dot(a_even, lo, input_precision=DOT_PRECISION)
        partial = tl.dot(a_odd, hi, partial, input_precision=DOT_PRECISION)
        a_sums = tl.sum(a_even.to(tl.float32) + a_odd.to(tl.float32), axis=1)
        g_offsets = rn * groups_per_row + k0 // GROUP
        scales = tl.load(s_ptr + g_offsets, mask=n_mask, other=0.0).to(tl.float32)
        offsets = tl.load(o_ptr + g_offsets, mask=n_mask, other=0.0).to(tl.float32)
        acc += partial * scales[None, :] + a_sums[:, None] * offsets[None, :]
    c = c_ptr + rm[:, None] * stride_cm + rn[None, :]
    tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


@triton.jit(do_not_specialize=["M"])
def _w8_gemm_kernel(
    a_ptr,
    w_ptr,
    s_ptr,
    c_ptr,
    M,
    N,
    stride_am,
    stride_cm,
    K: tl.constexpr,
    GROUP: tl.constexpr,
    PER_CHANNEL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """int8 or fp8 e4m3 weights, per output channel or in groups along the input."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_mask = rm < M
    n_mask = rn < N
    groups_per_row = K // GROUP
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        a = tl.load(
            a_ptr + rm[:, None] * stride_am + kk[None, :], mask=m_mask[:, None] & (kk[None, :] < K), other=0.0
        )
        w = tl.load(
            w_ptr + rn[None, :] * K + kk[:, None], mask=n_mask[None, :] & (kk[:, None] < K), other=0.0
        )
        if PER_CHANNEL:
            acc = tl.dot(a, w.to(a.dtype), acc, input_precision=DOT_PRECISION)
        else:
            scales = tl.load(s_ptr + rn * groups_per_row + k0 // GROUP, mask=n_mask, other=0.0).to(tl.float32)
            acc += tl.dot(a, w.to(a.dtype), input_precision=DOT_PRECISION) * scales[None, :]
    if PER_CHANNEL:
        acc = acc * tl.load(s_ptr + rn, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    c = c_ptr + rm[:, None] * stride_cm + rn[None, :]
    tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def default_gemm_config(x: torch.Tensor, weight: PackedWeight) -> GemmConfig:
    block_m = 16 if x.shape[0] <= 16 else (64 if x.shape[0] <= 64 else 128)
    return GemmConfig(block_m=block_m, block_n=128, block_k=64, num_warps=4 if block_m <= 64 else 8)


def gemm(x: torch.Tensor, weight: PackedWeight, config: GemmConfig | None = None) -> torch.Tensor:
    """x [M, K] @ dequantized(weight)^T -> [M, N] in x's dtype, through tl.dot."""
    config = config or default_gemm_config(x, weight)
    m, k = x.shape
    n = weight.out_features
    x = x.contiguous()
    block_k = min(config.block_k, weight.group_size)
    if weight.kind == "int4":
        # tl.dot needs at least 16 along K, and int4 splits each tile into even and odd halves.
        block_k = max(block_k, 32)
    y = torch.empty(m, n, device=x.device, dtype=x.dtype)
    grid = (triton.cdiv(m, config.block_m), triton.cdiv(n, config.block_n))
    common = dict(
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        BLOCK_K=block_k,
        DOT_PRECISION=dot_precision(x.dtype),
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    if weight.kind == "int4":
        _int4_gemm_kernel[grid](
            x,
            weight.qweight,
            weight.scales,
            weight.offsets,
            y,
            m,
            n,
            x.stride(0),
            y.stride(0),
            K=k,
            GROUP=weight.group_size,
            **common,
        )
    else:
        _w8_gemm_kernel[grid](
            x,
            weight.qweight,
            weight.scales,
            y,
            m,
            n,
            x.stride(0),
            y.stride(0),
            K=k,
            GROUP=weight.group_size,
            PER_CHANNEL=weight.group_size >= k,
            **common,
        )
    return y
