"""Packed weights on CUDA: each layer's weight in the layout of the kernel that reads it, built once
after loading (and after tensor-parallel slicing), and the matmul each batch size takes
(dispatch.py's table: the tensor-core kernel for decode-sized batches, cuBLAS on the widened
weight or fp8 torch._scaled_mm for prefill, or torch's tinygemm int4 kernel where it measured
faster)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pagoda_runtime.executor.quantization import dispatch
from pagoda_runtime.executor.quantization.packed import PackedWeight, unpack_int4
from pagoda_runtime.executor.quantization.scaled_mm import fp8_scaled_mm, scaled_mm_supported
from pagoda_runtime.executor.quantization.triton_mma import (
    MmaWeight,
    dequantize_mma,
    mma_matmul,
    to_mma_layout,
)

TINYGEMM_GROUP_SIZES = (32, 64, 128, 256)


class MmaPackedWeight(nn.Module):
    """A weight in triton_mma.py's layout, its tensors registered as buffers (state_dict, .to)."""

    def __init__(self, weight: MmaWeight) -> None:
        super().__init__()
        self.kind, self.in_features = weight.kind, weight.in_features
        self.group_size, self.chunk = weight.group_size, weight.chunk
        self.register_buffer("qweight", weight.qweight)
        self.register_buffer("scales", weight.scales)
        self.register_buffer("offsets", weight.offsets)

    @property
    def weight(self) -> MmaWeight:
        return MmaWeight(
            self.kind, self.qweight, self.scales, self.offsets, self.in_features, self.group_size, self.chunk
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        plan = dispatch.route(self.kind, x.shape[0], weight.out_features, self.in_features)
        if plan.path == "mma":
            return mma_matmul(x, weight, plan.config)
        if plan.path == "scaled_mm" and self.kind == "fp8":
            packed = PackedWeight("fp8", self.qweight, self.scales.reshape(-1, 1), self.group_size)
            if scaled_mm_supported(x, packed):
                return fp8_scaled_mm(x, packed)
        return F.linear(x, dequantize_mma(weight, x.dtype))


class TinygemmInt4Weight(nn.Module):
    """int4 in the layout of torch._weight_int4pack_mm (gpt-fast's tinygemm kernel): output rows
    interleaved by its packing, w = (q - 8) * scale + zero with the scale and zero in bf16, which
    rounds the fp16 ones (so it is close to the dequantized reference, not equal to it)."""

    def __init__(self, weight: PackedWeight) -> None:
        super().__init__()
        self.group_size = weight.group_size
        q = unpack_int4(weight.qweight)
        # torch's packing takes two inputs per byte, the even one in the high nibble.
        pairs = (q[:, 0::2] << 4) | q[:, 1::2]
        # Inner K tiles of 16 inputs per packed block: as many as divide the row (gpt-fast's rule).
        inner_k_tiles = next(t for t in (8, 4, 2) if weight.in_features % (16 * t) == 0)
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack(pairs, inner_k_tiles))
        scales = weight.scales.float()
        zeros = weight.offsets.float() + 8 * scales
        self.register_buffer(
            "scales_zeros", torch.stack([scales.t(), zeros.t()], dim=-1).to(torch.bfloat16).contiguous()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch._weight_int4pack_mm(x.to(torch.bfloat16), self.packed, self.group_size, self.scales_zeros)
        return y.to(x.dtype)


def tinygemm_supported(weight: PackedWeight) -> bool:
    return (
        weight.kind == "int4"
        and weight.group_size in TINYGEMM_GROUP_SIZES
        and weight.in_features % 32 == 0
        and weight.out_features % 8 == 0
    )


def gpu_packed_weight(weight: PackedWeight) -> nn.Module:
    """The weight in the layout its kernel reads on this GPU."""
    if (
        tinygemm_supported(weight)
        and dispatch.int4_layout(weight.out_features, weight.in_features) == "tinygemm"
    ):
        return TinygemmInt4Weight(weight)
    return MmaPackedWeight(to_mma_layout(weight))
