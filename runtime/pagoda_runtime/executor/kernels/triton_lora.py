"""Batched LoRA in two Triton launches per projection, punica's SGMV shrink and expand.

The grid's last axis is the adapter slot and its middle one the projection's output part (q, k,
v), so one launch serves every adapter and every part; a program takes BLOCK_M of its slot's
tokens (LoraBatch.sorted_tokens), and slots with fewer tokens return at once. The grid depends on
the token count and the slot count only, so a decode step replays from a CUDA graph whatever the
adapters of its requests.

- shrink: y = scaling[s] * x @ A[s]^T, [T, H] -> [T, R] per part. R is small (8 to 64) and H long,
  so a decode batch gives few programs; SPLIT_K programs each take every SPLIT_K-th K tile and
  write their own partial sum ([SPLIT_K, parts, T, R] float32), which the expand adds up: no
  atomics, no zeroed buffer, and the same result every run.
- expand: base_out[t, part] += y @ B[s]^T, read-modify-write of the base output's tile; every
  token's row belongs to one program per column block, so the update needs no atomics. y is
  rounded to the activation dtype for the tensor cores, as PEFT rounds between lora_A and lora_B.

Both matmuls pad the rank to at least 16 (tl.dot's minimum) with masked loads.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from pagoda_runtime.executor.kernels.lora_slots import LoraBatch
from pagoda_runtime.executor.triton_mode import dot_precision

MAX_SLICES = 3


# T changes with every batch; it is no reason to compile again.
@triton.jit(do_not_specialize=["num_tokens"])
def _lora_shrink_kernel(
    x_ptr,
    a_ptr,
    scaling_ptr,
    y_ptr,
    sorted_tokens_ptr,
    slot_starts_ptr,
    slot_counts_ptr,
    num_tokens,
    stride_xm,
    H: tl.constexpr,
    R: tl.constexpr,
    NUM_SLICES: tl.constexpr,
    NUM_SLOTS: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT: tl.constexpr,
):
    pid_m = tl.program_id(0) // SPLIT_K
    pid_k = tl.program_id(0) % SPLIT_K
    part = tl.program_id(1)
    slot = tl.program_id(2)
    count = tl.load(slot_counts_ptr + slot)
    if pid_m * BLOCK_M >= count:
        return
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < count
    tokens = tl.load(sorted_tokens_ptr + tl.load(slot_starts_ptr + slot) + rows, mask=row_mask, other=0)
    tokens = tokens.to(tl.int64)
    rr = tl.arange(0, BLOCK_R)
    r_mask = rr < R
    a_ptr += (part * NUM_SLOTS + slot).to(tl.int64) * R * H
    acc = tl.zeros([BLOCK_M, BLOCK_R], dtype=tl.float32)
    for step in range(0, tl.cdiv(H, BLOCK_K * SPLIT_K)):
        kk = (step * SPLIT_K + pid_k) * BLOCK_K + tl.arange(0, BLOCK_K)
        k_mask = kk < H
        x = tl.load(
            x_ptr + tokens[:, None] * stride_xm + kk[None, :],
            mask=row_mask[:, None] & k_mask[None, :],
            other=0.0,
        )
        a = tl.load(a_ptr + rr[None, :] * H + kk[:, None], mask=r_mask[None, :] & k_mask[:, None], other=0.0)
        acc = tl.dot(x, a.to(x.dtype), acc, input_precision=DOT)
    acc = acc * tl.load(scaling_ptr + slot).to(tl.float32)
    y = y_ptr + ((pid_k * NUM_SLICES + part) * num_tokens + tokens[:, None]) * R + rr[None, :]
    tl.store(y, acc, mask=row_mask[:, None] & r_mask[None, :])


@triton.jit(do_not_specialize=["num_tokens"])
def _lora_expand_kernel(
    y_ptr,
    b_ptr,
    out_ptr,
    sorted_tokens_ptr,
    slot_starts_ptr,
    slot_counts_ptr,
    num_tokens,
    stride_om,
    N0: tl.constexpr,
    N1: tl.constexpr,
    N2: tl.constexpr,
    R: tl.constexpr,
    NUM_SLICES: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    DOT: tl.constexpr,
):
    NUM_BLOCKS_M = tl.cdiv(num_tokens, BLOCK_M)
    pid_m = tl.program_id(0) % NUM_BLOCKS_M
    pid_n = tl.program_id(0) // NUM_BLOCKS_M
    part = tl.program_id(1)
    slot = tl.program_id(2)
    width = tl.where(part == 0, N0, tl.where(part == 1, N1, N2))
    offset = tl.where(part == 0, 0, tl.where(part == 1, N0, N0 + N1))
    count = tl.load(slot_counts_ptr + slot)
    if (pid_m * BLOCK_M >= count) | (pid_n * BLOCK_N >= width):
        return
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < count
    tokens = tl.load(sorted_tokens_ptr + tl.load(slot_starts_ptr + slot) + rows, mask=row_mask, other=0)
    tokens = tokens.to(tl.int64)
    rr = tl.arange(0, BLOCK_R)
    r_mask = rr < R
    y = tl.zeros([BLOCK_M, BLOCK_R], dtype=tl.float32)
    for split in tl.static_range(SPLIT_K):
        y_offsets = ((split * NUM_SLICES + part) * num_tokens + tokens[:, None]) * R + rr[None, :]
        y += tl.load(y_ptr + y_offsets, mask=row_mask[:, None] & r_mask[None, :], other=0.0)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < width
    b_rows = slot.to(tl.int64) * (N0 + N1 + N2) + offset + cols
    b = tl.load(
        b_ptr + b_rows[None, :] * R + rr[:, None], mask=col_mask[None, :] & r_mask[:, None], other=0.0
    )
    out_dtype = out_ptr.dtype.element_ty
    delta = tl.dot(y.to(out_dtype), b.to(out_dtype), input_precision=DOT)
    out = out_ptr + tokens[:, None] * stride_om + (offset + cols)[None, :]
    mask = row_mask[:, None] & col_mask[None, :]
    base = tl.load(out, mask=mask, other=0.0).to(tl.float32)
    tl.store(out, (base + delta).to(out_dtype), mask=mask)


def _block_m(num_tokens: int) -> int:
    return 16 if num_tokens <= 256 else 64


def _block_r(rank: int) -> int:
    return max(16, triton.next_power_of_2(rank))


def default_split_k(num_tokens: int, num_slices: int, num_slots: int, in_features: int, block_k: int) -> int:
    """Enough programs for a decode batch to keep the memory system busy: about 256, counting the
    grid whole (a slot's spare row blocks return at once), and never more than the K tiles."""
    programs = triton.cdiv(num_tokens, _block_m(num_tokens)) * num_slices * num_slots
    split = triton.next_power_of_2(max(1, 256 // programs))
    return max(1, min(split, 16, triton.cdiv(in_features, block_k)))


def lora_shrink(
    x: torch.Tensor,
    lora_a: torch.Tensor,
    batch: LoraBatch,
    scaling: torch.Tensor,
    split_k: int | None = None,
    block_k: int = 128,
) -> torch.Tensor:
    """x [T, H], lora_a [parts, S, R, H] -> [split_k, parts, T, R] float32 partial sums of
    scaling[s] * x @ A[s]^T; the rows of the base model's tokens are left unwritten."""
    num_slices, num_slots, rank, in_features = lora_a.shape
    num_tokens = x.shape[0]
    if x.stride(1) != 1 or not lora_a.is_contiguous():
        raise ValueError("lora_shrink needs x with unit column stride and a contiguous lora_a")
    block_m = _block_m(num_tokens)
    block_k = min(block_k, max(16, triton.next_power_of_2(in_features)))
    split_k = split_k or default_split_k(num_tokens, num_slices, num_slots, in_features, block_k)
    y = torch.empty(split_k, num_slices, num_tokens, rank, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(num_tokens, block_m) * split_k, num_slices, num_slots)
    _lora_shrink_kernel[grid](
        x,
        lora_a,
        scaling,
        y,
        batch.sorted_tokens,
        batch.slot_starts,
        batch.slot_counts,
        num_tokens,
        x.stride(0),
        H=in_features,
        R=rank,
        NUM_SLICES=num_slices,
        NUM_SLOTS=num_slots,
        SPLIT_K=split_k,
        BLOCK_M=block_m,
        BLOCK_R=_block_r(rank),
        BLOCK_K=block_k,
        DOT=dot_precision(x.dtype),
        num_warps=4,
    )
    return y


def lora_expand(
    y: torch.Tensor,
    lora_b: torch.Tensor,
    batch: LoraBatch,
    base_out: torch.Tensor,
    output_slices: Sequence[int],
    block_n: int = 128,
) -> torch.Tensor:
    """base_out [T, sum(output_slices)] += (sum of y's partials) @ B[s]^T part by part, in place."""
    split_k, num_slices, num_tokens, rank = y.shape
    if not 1 <= num_slices <= MAX_SLICES or len(output_slices) != num_slices:
        raise ValueError(f"a projection takes 1 to {MAX_SLICES} LoRA output parts, not {len(output_slices)}")
    if base_out.stride(1) != 1 or not lora_b.is_contiguous():
        raise ValueError("lora_expand needs base_out with unit column stride and a contiguous lora_b")
    widths = list(output_slices) + [0] * (MAX_SLICES - num_slices)
    block_m = _block_m(num_tokens)
    grid = (triton.cdiv(num_tokens, block_m) * triton.cdiv(max(widths), block_n), num_slices, lora_b.shape[0])
    _lora_expand_kernel[grid](
        y,
        lora_b,
        base_out,
        batch.sorted_tokens,
        batch.slot_starts,
        batch.slot_counts,
        num_tokens,
        base_out.stride(0),
        N0=widths[0],
        N1=widths[1],
        N2=widths[2],
        R=rank,
        NUM_SLICES=num_slices,
        SPLIT_K=split_k,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_R=_block_r(rank),
        DOT=dot_precision(base_out.dtype),
        num_warps=4,
    )
    return base_out


def add_lora(
    base_out: torch.Tensor,
    x: torch.Tensor,
    batch: LoraBatch,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    scaling: torch.Tensor,
    output_slices: Sequence[int],
) -> torch.Tensor:
    if batch.num_tokens == 0:
        return base_out
    y = lora_shrink(x, lora_a, batch, scaling)
    return lora_expand(y, lora_b, batch, base_out, output_slices)
