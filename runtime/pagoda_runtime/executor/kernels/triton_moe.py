"""The mixture-of-experts layer in two grouped Triton GEMM launches after the routing's two
(triton_moe_routing.py), vLLM's fused_moe design.

The (token, choice) pairs are sorted by expert and padded per expert to whole blocks of BLOCK_M
rows (triton_moe_routing.py), so each program's BLOCK_M rows share one expert: it gathers
their activation rows, streams that expert's weight tiles once for all of them and multiplies on
the tensor cores. One launch covers every expert:

1. gate_up: each program computes the gate tile and the up tile of the same BLOCK_N intermediate
   channels (rows n and I + n of the fused [2 * I, H] weight) and writes SiLU(gate) * up, so the
   [T * k, 2 * I] product never reaches memory;
2. down: the [T * k, I] intermediate through each pair's expert, times the pair's router weight;
   the top_k rows of a token are then summed (a [T, k, H] sum, in the activations' dtype as
   transformers adds them).

GPT-OSS's expert biases are added to the float32 accumulator after the dot products, so every
weight kind takes them alike, and its ClampedSwiGLU replaces SiLU(gate) * up in the epilogue of
launch 1; both are constexpr switches, so the SiLU layers' kernels are what they were.

Quantized experts (PackedExperts) are widened in registers: int8 and fp8 to the activation dtype
with the row scale applied to the float32 product (per tile for groups); int4 split into its even
and odd inputs with the affine form
    x . (q * s + o) = (x . q) * s + sum(x) * o
per group, so BLOCK_K never straddles a group. Padding rows of a block load nothing and store
nothing; blocks past the last expert's return at once, so the grid depends only on T, k and E and a
decode step can be replayed from a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from pagoda_runtime.executor.kernels.moe_activation import ClampedSwiGLU
from pagoda_runtime.executor.kernels.moe_options import PLAIN, ExpertOptions, check_weight_on_input
from pagoda_runtime.executor.kernels.moe_weights import ExpertWeights, PackedExperts
from pagoda_runtime.executor.kernels.triton_moe_routing import ExpertBlocks, route_and_align
from pagoda_runtime.executor.triton_mode import dot_precision

FLOAT, W8, INT4 = 0, 1, 2
SILU, CLAMPED_SWIGLU = 0, 1


@dataclass(frozen=True)
class MoeConfig:
    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3


@triton.jit
def _w8_or_float_tile(acc, a, w_ptr, s_ptr, rows, row_mask, k0, K, GROUP, SCALE_PER_TILE, DOT):
    """acc + a [M, BK] @ W[rows, k0:k0 + BK]^T; a grouped int8/fp8 weight's tile scale applied."""
    kk = k0 + tl.arange(0, a.shape[1])
    w = tl.load(
        w_ptr + rows[None, :] * K + kk[:, None], mask=row_mask[None, :] & (kk[:, None] < K), other=0.0
    )
    if w.dtype.is_int():
        w = w.to(tl.float32)  # int8 widens through float32 (exact), which Triton's interpreter also runs
    if SCALE_PER_TILE:
        scales = tl.load(s_ptr + rows * (K // GROUP) + k0 // GROUP, mask=row_mask, other=0.0)
        return acc + tl.dot(a, w.to(a.dtype), input_precision=DOT) * scales.to(tl.float32)[None, :]
    return tl.dot(a, w.to(a.dtype), acc, input_precision=DOT)


@triton.jit
def _int4_tile(acc, a_even, a_odd, w_ptr, s_ptr, o_ptr, rows, row_mask, k0, K, GROUP, DOT):
    """acc + a @ (q * s + o)[rows, k0:k0 + BK]^T for a tile inside one group of an int4 weight;
    a_even and a_odd are the tile's even and odd inputs, as the weight packs them in a byte."""
    kh = k0 // 2 + tl.arange(0, a_even.shape[1])
    wq = tl.load(w_ptr + rows[None, :] * (K // 2) + kh[:, None], mask=row_mask[None, :], other=0)
    lo = (wq & 0xF).to(tl.float32).to(a_even.dtype)
    hi = (wq >> 4).to(tl.float32).to(a_even.dtype)
    partial = tl.dot(a_even, lo, input_precision=DOT)
    partial = tl.dot(a_odd, hi, partial, input_precision=DOT)
    a_sum = tl.sum(a_even.to(tl.float32) + a_odd.to(tl.float32), axis=1)
    g_offsets = rows * (K // GROUP) + k0 // GROUP
    scales = tl.load(s_ptr + g_offsets, mask=row_mask, other=0.0).to(tl.float32)
    offsets = tl.load(o_ptr + g_offsets, mask=row_mask, other=0.0).to(tl.float32)
    return acc + partial * scales[None, :] + a_sum[:, None] * offsets[None, :]


# The pair count and the block count change with every batch; they are no reason to compile again.
@triton.jit(do_not_specialize=["num_pairs", "num_blocks_m"])
def _moe_gemm_kernel(
    a_ptr,
    w_ptr,
    s_ptr,
    o_ptr,
    b_ptr,
    c_ptr,
    routed_ptr,
    sorted_ids_ptr,
    block_experts_ptr,
    num_padded_ptr,
    num_pairs,
    num_blocks_m,
    stride_am,
    stride_cm,
    alpha,
    limit,
    N: tl.constexpr,
    K: tl.constexpr,
    PAIRS_PER_A_ROW: tl.constexpr,
    GATED: tl.constexpr,
    MUL_ROUTED: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,
    KIND: tl.constexpr,
    GROUP: tl.constexpr,
    PER_CHANNEL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    DOT: tl.constexpr,
):
    """C[pair, n] = A[pair // PAIRS_PER_A_ROW] @ W[expert(pair)][n]^T (+ B[expert(pair)][n] where
    HAS_BIAS) for the pairs of each block; GATED: W and B hold 2 * N rows and C = SiLU(gate) * up,
    or ACTIVATION 1's ClampedSwiGLU(alpha, limit); MUL_ROUTED: C times the pair's weight."""
    pid = tl.program_id(0)
    # Consecutive programs take GROUP_M blocks for one column block, so an expert's weight tile
    # is read from L2 by the other blocks of that expert.
    num_blocks_n = tl.cdiv(N, BLOCK_N)
    group_id = pid // (GROUP_M * num_blocks_n)
    first_m = group_id * GROUP_M
    group_rows = min(num_blocks_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * num_blocks_n)) % group_rows
    pid_n = (pid % (GROUP_M * num_blocks_n)) // group_rows
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return

    pairs = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    pair_mask = pairs < num_pairs
    a_rows = (pairs // PAIRS_PER_A_ROW).to(tl.int64)
    expert = tl.load(block_experts_ptr + pid_m).to(tl.int64)
    W_ROWS: tl.constexpr = 2 * N if GATED else N
    PACKED_K: tl.constexpr = K // 2 if KIND == 2 else K
    w_ptr += expert * W_ROWS * PACKED_K
    s_ptr += expert * W_ROWS * (K // GROUP)
    o_ptr += expert * W_ROWS * (K // GROUP)

    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # GATED: one tile of 2 * BLOCK_N weight rows, the gate rows of these channels then their up
    # rows, so gate and up come out of one wider tl.dot.
    TILE_N: tl.constexpr = 2 * BLOCK_N if GATED else BLOCK_N
    tile = tl.arange(0, TILE_N)
    channels = pid_n * BLOCK_N + tile % BLOCK_N
    rows = channels + (tile // BLOCK_N) * N
    row_mask = channels < N
    acc = tl.zeros([BLOCK_M, TILE_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if KIND == 2:
            ka = k0 + tl.arange(0, BLOCK_K // 2)[None, :, None] * 2 + tl.arange(0, 2)[None, None, :]
            a = tl.load(
                a_ptr + a_rows[:, None, None] * stride_am + ka, mask=pair_mask[:, None, None], other=0.0
            )
            a_even, a_odd = tl.split(a)
            acc = _int4_tile(acc, a_even, a_odd, w_ptr, s_ptr, o_ptr, rows, row_mask, k0, K, GROUP, DOT)
        else:
            kk = k0 + tl.arange(0, BLOCK_K)
            a_mask = pair_mask[:, None] & (kk[None, :] < K)
            a = tl.load(a_ptr + a_rows[:, None] * stride_am + kk[None, :], mask=a_mask, other=0.0)
            per_tile: tl.constexpr = KIND == 1 and not PER_CHANNEL
            acc = _w8_or_float_tile(acc, a, w_ptr, s_ptr, rows, row_mask, k0, K, GROUP, per_tile, DOT)
    if KIND == 1 and PER_CHANNEL:
        acc = acc * tl.load(s_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)[None, :]
    out_dtype = c_ptr.dtype.element_ty
    # The bias is added to the halves after the split: added to the [BLOCK_M, 2 * BLOCK_N] tile
    # before it, the int4 prefill tile spills registers on sm_90.
    b_ptr += expert * W_ROWS + rn
    if GATED:
        gate, up = tl.split(tl.permute(tl.reshape(acc, [BLOCK_M, 2, BLOCK_N]), [0, 2, 1]))
        if HAS_BIAS:
            gate += tl.load(b_ptr, mask=rn < N, other=0.0).to(tl.float32)[None, :]
            up += tl.load(b_ptr + N, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        # gate and up rounded to the model dtype, as transformers rounds its projections.
        gate = gate.to(out_dtype).to(tl.float32)
        up = up.to(out_dtype).to(tl.float32)
        if ACTIVATION == 1:
            # The rest in float32 and rounded once at the store: transformers rounds each of its
            # five operations, which no ordering here would reproduce bit for bit.
            gate = tl.minimum(gate, limit)
            up = tl.minimum(tl.maximum(up, -limit), limit)
            out = (up + 1.0) * (gate / (1.0 + tl.exp(-alpha * gate)))
        else:
            # SiLU(gate) rounded before the product, as transformers (and
            # kernels/triton_silu_mul.py) compute it. The float32 product of two 16-bit values is
            # exact, so its rounding at the store is the 16-bit product's.
            silu = (gate / (1.0 + tl.exp(-gate))).to(out_dtype).to(tl.float32)
            out = silu * up
    else:
        out = acc
        if HAS_BIAS:
            out += tl.load(b_ptr, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    if MUL_ROUTED:
        out = out * tl.load(routed_ptr + pairs, mask=pair_mask, other=0.0)[:, None]
    c = c_ptr + pairs.to(tl.int64)[:, None] * stride_cm + rn[None, :]
    tl.store(c, out.to(out_dtype), mask=pair_mask[:, None] & (rn < N)[None, :])


def default_moe_config(
    num_pairs: int, num_experts: int, dtype: torch.dtype, weights: ExpertWeights | None = None
) -> MoeConfig:
    """Starting tiles, not yet timed on a GPU (benchmarks/moe_kernels.py --sweep times them): decode
    batches give each expert a row or two, so small row blocks waste the least padding and narrow
    column blocks give the weight stream more programs; prefill batches fill tensor-core tiles.
    float32 (the tiny test models) multiplies without tensor cores, in small tiles that fit the
    registers. int4 experts stop at 64-row tiles: unpacking their nibbles takes registers that a
    128-row gate_up tile, with its gate and up accumulators, does not have (ptxas spills it at
    GPT-OSS's 2880 inputs)."""
    per_expert = num_pairs / num_experts
    if isinstance(weights, PackedExperts) and weights.weight.kind == "int4":
        per_expert = min(per_expert, 256)
    if dtype == torch.float32:
        return MoeConfig(block_m=16 if per_expert <= 16 else 32, block_n=32, block_k=32, num_stages=2)
    if per_expert <= 16:
        return MoeConfig(block_m=16, block_n=64, block_k=128, group_m=1, num_warps=4, num_stages=4)
    if per_expert <= 64:
        return MoeConfig(block_m=32, block_n=64, block_k=128, group_m=8, num_warps=4, num_stages=4)
    if per_expert <= 256:
        return MoeConfig(block_m=64, block_n=64, block_k=64, group_m=8, num_warps=4, num_stages=3)
    return MoeConfig(block_m=128, block_n=64, block_k=64, group_m=8, num_warps=8, num_stages=3)


def _weight_args(weights: ExpertWeights, in_features: int, block_k: int) -> tuple[list, dict, int]:
    """The kernel's weight pointers, their constexprs and the K tile they allow."""
    if not isinstance(weights, PackedExperts):
        if not weights.is_contiguous():
            raise ValueError("expert weights must be contiguous [E, N, K] tensors (as shard_experts gives)")
        args = [weights, weights, weights]
        return args, dict(KIND=FLOAT, GROUP=in_features, PER_CHANNEL=True), block_k
    packed = weights.weight
    group = packed.group_size
    per_channel = group >= in_features
    if packed.kind == "int4" or not per_channel:
        # A tile never straddles a group (groups divide K, so int4 tiles never pass its end).
        block_k = min(block_k, group)
    if packed.kind == "int4":
        if group < 32:
            raise ValueError(f"int4 experts need groups of at least 32 inputs, not {group}")
        # tl.dot needs 16 along K in each of the even and odd halves.
        block_k = max(block_k, 32)
        return (
            [packed.qweight, packed.scales, packed.offsets],
            dict(KIND=INT4, GROUP=group, PER_CHANNEL=per_channel),
            block_k,
        )
    return (
        [packed.qweight, packed.scales, packed.scales],
        dict(KIND=W8, GROUP=group, PER_CHANNEL=per_channel),
        block_k,
    )


def _expert_gemm(
    a: torch.Tensor,
    weights: ExpertWeights,
    out: torch.Tensor,
    blocks: ExpertBlocks,
    routed: torch.Tensor,
    pairs_per_a_row: int,
    gated: bool,
    mul_routed: bool,
    config: MoeConfig,
    bias: torch.Tensor | None = None,
    activation: ClampedSwiGLU | None = None,
) -> None:
    n = out.shape[1]
    k = a.shape[1]
    w_rows = 2 * n if gated else n
    if bias is not None and tuple(bias.shape) != (weights.shape[0], w_rows):
        experts = weights.shape[0]
        raise ValueError(
            f"an expert bias {tuple(bias.shape)} does not fit {experts} experts of {w_rows} rows"
        )
    weight_ptrs, weight_constexprs, block_k = _weight_args(weights, k, config.block_k)
    num_blocks_m = blocks.max_blocks
    grid = (num_blocks_m * triton.cdiv(n, config.block_n),)
    _moe_gemm_kernel[grid](
        a,
        *weight_ptrs,
        out if bias is None else bias.contiguous(),
        out,
        routed,
        blocks.sorted_ids,
        blocks.block_experts,
        blocks.num_padded,
        blocks.num_pairs,
        num_blocks_m,
        a.stride(0),
        out.stride(0),
        0.0 if activation is None else activation.alpha,
        0.0 if activation is None else activation.limit,
        N=n,
        K=k,
        PAIRS_PER_A_ROW=pairs_per_a_row,
        GATED=gated,
        MUL_ROUTED=mul_routed,
        HAS_BIAS=bias is not None,
        ACTIVATION=SILU if activation is None else CLAMPED_SWIGLU,
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        BLOCK_K=block_k,
        GROUP_M=config.group_m,
        DOT=dot_precision(a.dtype),
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        **weight_constexprs,
    )


def fused_moe(
    hidden: torch.Tensor,
    router_logits: torch.Tensor,
    w_gate_up: ExpertWeights,
    w_down: ExpertWeights,
    top_k: int,
    renormalize: bool,
    config: MoeConfig | None = None,
    options: ExpertOptions = PLAIN,
) -> torch.Tensor:
    """hidden [T, H], router_logits [T, E], w_gate_up [E, 2 * I, H], w_down [E, H, I] -> [T, H];
    the biases, activation and routing rule in `options` (moe_options.py). config stays the
    seventh argument, where the benchmarks and tests pass it by position."""
    num_tokens, hidden_size = hidden.shape
    num_experts, two_i, _ = w_gate_up.shape
    num_pairs = num_tokens * top_k
    if num_tokens == 0:
        return torch.empty_like(hidden)
    check_weight_on_input(top_k, options)
    config = config or default_moe_config(num_pairs, num_experts, hidden.dtype, w_gate_up)
    hidden = hidden.contiguous()
    routed, blocks = route_and_align(
        router_logits,
        top_k,
        renormalize,
        config.block_m,
        options.sigmoid_routing,
        options.correction_bias,
        options.softmax_groups,
    )
    if options.weight_on_input:
        # top_k 1: pair t is token t, whose one expert takes its input scaled.
        hidden = hidden * routed.view(num_tokens, 1).to(hidden.dtype)
    act = torch.empty(num_pairs, two_i // 2, dtype=hidden.dtype, device=hidden.device)
    _expert_gemm(
        hidden,
        w_gate_up,
        act,
        blocks,
        routed,
        top_k,
        gated=True,
        mul_routed=False,
        config=config,
        bias=options.gate_up_bias,
        activation=options.activation,
    )
    down = torch.empty(num_pairs, hidden_size, dtype=hidden.dtype, device=hidden.device)
    _expert_gemm(
        act,
        w_down,
        down,
        blocks,
        routed,
        1,
        gated=False,
        mul_routed=not options.weight_on_input,
        config=config,
        bias=options.down_bias,
    )
    return down.view(num_tokens, top_k, hidden_size).sum(dim=1)
