"""Decode-shaped matmuls (a few rows of activations) over packed weights, dequantized in registers.

Batch-1 decode reads every weight once and does two flops with it, so these kernels are pure
memory streams: each program owns BLOCK_N output rows and walks the input dimension in tiles of
BLOCK_K, converting the packed values to float32 in registers. A decode batch of a few sequences
shares each tile: the program multiplies it with every activation row before loading the next, so
the weights stream from memory once per step whatever the batch. SPLIT_K > 1 gives narrow layers
(N = 4096 on a 132-SM GPU) enough programs to keep the memory system busy; partial sums then meet
in a float32 buffer through atomics.

Group scales apply per tile slice: a tile covers BLOCK_K // GROUP_TILE groups of GROUP_TILE inputs,
where GROUP_TILE = min(group size, BLOCK_K), so one scale multiplies a whole partial dot product.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from pagoda_runtime.executor.quantization.packed import PackedWeight


@dataclass(frozen=True)
class GemvConfig:
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4


# M, the number of activation rows, changes with the batch; it is no reason to compile again.
@triton.jit(do_not_specialize=["M"])
def _int4_gemv_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    o_ptr,
    y_ptr,
    M,
    N,
    stride_xm,
    stride_ym,
    K: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_TILE: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    TILE_GROUPS: tl.constexpr = BLOCK_K // GROUP_TILE
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rn < N
    half = tl.arange(0, BLOCK_K // 2)
    groups_per_row = K // GROUP
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for step in range(0, tl.cdiv(K, BLOCK_K * SPLIT_K)):
        k0 = (step * SPLIT_K + pid_k) * BLOCK_K
        kx = k0 + tl.arange(0, BLOCK_K)
        kh = k0 // 2 + half
        wq = tl.load(
            w_ptr + rn[:, None] * (K // 2) + kh[None, :],
            mask=n_mask[:, None] & (kh[None, :] < K // 2),
            other=0,
        ).to(tl.int32)
        # OR-ing a nibble into the mantissa of 2**23 and subtracting 2**23 converts it to float
        # with one integer op and one add instead of the slower integer-to-float instruction.
        lo = ((wq & 0xF) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
        hi = ((wq >> 4) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
        g = (k0 + tl.arange(0, TILE_GROUPS) * GROUP_TILE) // GROUP
        g_offsets = rn[:, None] * groups_per_row + g[None, :]
        g_mask = n_mask[:, None] & (g[None, :] < groups_per_row)
        scales = tl.load(s_ptr + g_offsets, mask=g_mask, other=0.0).to(tl.float32)
        offsets = tl.load(o_ptr + g_offsets, mask=g_mask, other=0.0).to(tl.float32)
        # The weight tile is read and widened once, then used by every row of the batch.
        for m in tl.static_range(BLOCK_M):
            x = tl.load(x_ptr + m * stride_xm + kx, mask=(kx < K) & (m < M), other=0.0).to(tl.float32)
            x_even, x_odd = tl.split(tl.reshape(x, [BLOCK_K // 2, 2]))
            partial = lo * x_even[None, :] + hi * x_odd[None, :]
            partial = tl.sum(tl.reshape(partial, [BLOCK_N, TILE_GROUPS, GROUP_TILE // 2]), axis=2)
            x_sums = tl.sum(tl.reshape(x_even + x_odd, [TILE_GROUPS, GROUP_TILE // 2]), axis=1)
            y = tl.sum(partial * scales + offsets * x_sums[None, :], axis=1)
            acc = tl.where(rows[:, None] == m, acc + y[None, :], acc)
    y_offsets = rows[:, None] * stride_ym + rn[None, :]
    y_mask = (rows[:, None] < M) & n_mask[None, :]
    if SPLIT_K == 1:
        tl.store(y_ptr + y_offsets, acc.to(y_ptr.dtype.element_ty), mask=y_mask)
    else:
        tl.atomic_add(y_ptr + y_offsets, acc, mask=y_mask)


@triton.jit(do_not_specialize=["M"])
def _w8_gemv_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    y_ptr,
    M,
    N,
    stride_xm,
    stride_ym,
    K: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_TILE: tl.constexpr,
    PER_CHANNEL: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """int8 or fp8 e4m3 weights (the load's element type decides the conversion)."""
    TILE_GROUPS: tl.constexpr = BLOCK_K // GROUP_TILE
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rn < N
    groups_per_row = K // GROUP
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for step in range(0, tl.cdiv(K, BLOCK_K * SPLIT_K)):
        k0 = (step * SPLIT_K + pid_k) * BLOCK_K
        kx = k0 + tl.arange(0, BLOCK_K)
        w = tl.load(
            w_ptr + rn[:, None] * K + kx[None, :], mask=n_mask[:, None] & (kx[None, :] < K), other=0.0
        ).to(tl.float32)
        if not PER_CHANNEL:
            g = (k0 + tl.arange(0, TILE_GROUPS) * GROUP_TILE) // GROUP
            scales = tl.load(
                s_ptr + rn[:, None] * groups_per_row + g[None, :],
                mask=n_mask[:, None] & (g[None, :] < groups_per_row),
                other=0.0,
            ).to(tl.float32)
        # The weight tile is read and widened once, then used by every row of the batch.
        for m in tl.static_range(BLOCK_M):
            x = tl.load(x_ptr + m * stride_xm + kx, mask=(kx < K) & (m < M), other=0.0).to(tl.float32)
            if PER_CHANNEL:
                y = tl.sum(w * x[None, :], axis=1)
            else:
                partial = tl.sum(tl.reshape(w * x[None, :], [BLOCK_N, TILE_GROUPS, GROUP_TILE]), axis=2)
                y = tl.sum(partial * scales, axis=1)
            acc = tl.where(rows[:, None] == m, acc + y[None, :], acc)
    if PER_CHANNEL:
        acc = acc * tl.load(s_ptr + rn, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    y_offsets = rows[:, None] * stride_ym + rn[None, :]
    y_mask = (rows[:, None] < M) & n_mask[None, :]
    if SPLIT_K == 1:
        tl.store(y_ptr + y_offsets, acc.to(y_ptr.dtype.element_ty), mask=y_mask)
    else:
        tl.atomic_add(y_ptr + y_offsets, acc, mask=y_mask)


def default_gemv_config(weight: PackedWeight, rows: int = 1) -> GemvConfig:
    """Starting tile shapes for the Llama-3-8B layers, not yet timed on a GPU (benchmarks/quant_kernels.py
    --sweep times them): split K for long rows (down_proj), wide K tiles for int4, narrow N blocks
    for narrow layers. Every row of a batch shares a program's weight tile, so the tile narrows in K
    as rows are added, to keep the widened weights of one tile within the program's registers.
    """
    n, k = weight.out_features, weight.in_features
    if weight.kind == "int4":
        if k >= 8192:
            config = GemvConfig(block_n=32, block_k=512, split_k=4, num_warps=8)
        else:
            config = GemvConfig(block_n=32 if n >= 16384 else (16 if n > 4096 else 8), block_k=1024)
    elif k >= 8192:
        config = GemvConfig(block_n=32 if weight.kind == "int8" else 16, block_k=256, split_k=4)
    elif n >= 16384:
        config = GemvConfig(block_n=16, block_k=256)
    elif weight.kind == "int8" and n <= 4096:
        config = GemvConfig(block_n=8, block_k=256, split_k=4)
    else:
        config = GemvConfig(block_n=16 if weight.kind == "int8" else 8, block_k=512)
    block_k = max(64, config.block_k // triton.next_power_of_2(rows))
    # Small models: no tile wider than the row itself.
    block_k = min(block_k, max(triton.next_power_of_2(k), 64))
    return GemvConfig(config.block_n, block_k, config.split_k, config.num_warps)


def gemv(x: torch.Tensor, weight: PackedWeight, config: GemvConfig | None = None) -> torch.Tensor:
    """x [M, K] (M small) @ dequantized(weight)^T -> [M, N] in x's dtype."""
    m, k = x.shape
    config = config or default_gemv_config(weight, m)
    n = weight.out_features
    x = x.contiguous()
    # One group per row (per-channel scales) needs no group slicing, whatever its width.
    group_tile = config.block_k if weight.group_size >= k else min(weight.group_size, config.block_k)
    if config.split_k == 1:
        y = torch.empty(m, n, device=x.device, dtype=x.dtype)
    else:
        y = torch.zeros(m, n, device=x.device, dtype=torch.float32)
    grid = (triton.cdiv(n, config.block_n), config.split_k)
    if weight.kind == "int4":
        _int4_gemv_kernel[grid](
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
            GROUP_TILE=group_tile,
            SPLIT_K=config.split_k,
            BLOCK_M=triton.next_power_of_2(m),
            BLOCK_N=config.block_n,
            BLOCK_K=config.block_k,
            num_warps=config.num_warps,
        )
    else:
        _w8_gemv_kernel[grid](
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
            GROUP_TILE=group_tile,
            PER_CHANNEL=weight.group_size >= k,
            SPLIT_K=config.split_k,
            BLOCK_M=triton.next_power_of_2(m),
            BLOCK_N=config.block_n,
            BLOCK_K=config.block_k,
            num_warps=config.num_warps,
        )
    return y.to(x.dtype)
