"""Packed matmuls on the CPU: torch's weight-only int4 and int8 kernels instead of dequantizing.

The reference matmul dequantizes the whole weight at every step; decode on a CPU is bound by the
bytes of weight it streams, so keeping them packed is what makes it fast. torch ships two CPU
kernels for that, both fast only with bfloat16 activations (float32 ones measured 6-50x slower):

- `_weight_int4pack_mm_for_cpu`: 4-bit weights in its own blocked layout (output rows interleaved,
  so it is built once after every row is loaded), groups of 32 to 256 inputs, w = (q - 8) * scale
  + zero, the scale and zero in bfloat16. Every int4 PackedWeight (GGUF Q4_0/Q4_1/Q4_K, AWQ, GPTQ,
  online int4) maps onto it with zero = offset + 8 * scale.
- `_weight_int8pack_mm`: int8 with one scale per output channel (online int8; GGUF Q8_0's groups
  of 32 do not fit it).

x is cast to bfloat16 for the matmul only and the result back to x's dtype. The bfloat16 scales and
activations round differently from the float32 reference, so this is not the path that reproduces
transformers' greedy tokens bit for bit: that is --dtype float32 (see quantization_selection.py).
"""

from __future__ import annotations

import torch
from torch import nn

from pagoda_runtime.executor.quantization.packed import PackedWeight, unpack_int4

INT4_GROUP_SIZES = (32, 64, 128, 256)
INT4_ROW_MULTIPLE = 16  # the int4 layout packs output rows in blocks of this many


class CpuInt4Weight(nn.Module):
    def __init__(self, weight: PackedWeight) -> None:
        super().__init__()
        self.group_size = weight.group_size
        values = unpack_int4(weight.qweight).to(torch.int32)
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(values, 1))
        scales = weight.scales.float()
        zeros = weight.offsets.float() + 8 * scales
        # [K // group, N, 2]: the kernel's layout of (scale, zero) pairs.
        self.register_buffer(
            "scales_zeros", torch.stack([scales.t(), zeros.t()], dim=-1).to(torch.bfloat16).contiguous()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(
            x.to(torch.bfloat16), self.packed, self.group_size, self.scales_zeros
        )
        return y.to(x.dtype)


class CpuInt8Weight(nn.Module):
    def __init__(self, weight: PackedWeight) -> None:
        super().__init__()
        self.register_buffer("qweight", weight.qweight.contiguous())
        self.register_buffer("scales", weight.scales.reshape(-1).to(torch.bfloat16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16), self.qweight, self.scales).to(x.dtype)


def cpu_packed_weight(weight: PackedWeight) -> nn.Module | None:
    """The weight in the layout of torch's CPU kernel for its kind, or None where none takes it."""
    if (
        weight.kind == "int4"
        and weight.group_size in INT4_GROUP_SIZES
        and weight.out_features % INT4_ROW_MULTIPLE == 0
    ):
        return CpuInt4Weight(weight)
    if weight.kind == "int8" and weight.group_size == weight.in_features:
        return CpuInt8Weight(weight)
    return None
