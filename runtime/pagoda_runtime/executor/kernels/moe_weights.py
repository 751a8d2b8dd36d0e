"""How a mixture-of-experts layer stores its experts: one fused weight per projection for all experts.

- gate_up: [E, 2 * I, H], each expert's gate rows (w1) first and its up rows (w3) after, as
  transformers' Qwen3MoeExperts and MixtralExperts hold `gate_up_proj`;
- down: [E, H, I] (w2).

Float experts are plain tensors. Quantized experts are `PackedExperts`: the experts' rows stacked
into one PackedWeight of E * N rows (quantization/packed.py), which is exactly the per-output-row
layout every packed kind already has, so the same quantizers, dequantizer and column slicing serve.

Tensor parallelism shards each expert's intermediate dimension: a rank holds the gate rows and the
up rows of its part of I and the same columns of down, and its partial outputs sum to the whole.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagoda_runtime.executor.quantization.online import ONLINE_QUANTIZERS, int4_group_size
from pagoda_runtime.executor.quantization.packed import PackedWeight, dequantize


@dataclass(frozen=True)
class PackedExperts:
    """E experts' [N, K] weights quantized row by row, stored as one PackedWeight of E * N rows."""

    weight: PackedWeight
    num_experts: int

    def __post_init__(self) -> None:
        if self.weight.out_features % self.num_experts:
            raise ValueError(
                f"{self.weight.out_features} packed rows do not split into {self.num_experts} experts"
            )

    @property
    def kind(self) -> str:
        return self.weight.kind

    @property
    def out_features(self) -> int:
        return self.weight.out_features // self.num_experts

    @property
    def in_features(self) -> int:
        return self.weight.in_features

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.num_experts, self.out_features, self.in_features)

    def expert(self, index: int) -> PackedWeight:
        n = self.out_features
        return self.weight.rows(slice(index * n, (index + 1) * n))

    def rows(self, index: torch.Tensor) -> PackedExperts:
        """Every expert restricted to the same rows `index` of its [N, K] weight."""
        index = index.to(self.weight.qweight.device)
        starts = torch.arange(self.num_experts, device=index.device) * self.out_features
        packed = self.weight.rows((starts[:, None] + index[None, :]).flatten())
        return PackedExperts(_contiguous(packed), self.num_experts)

    def columns(self, part: slice) -> PackedExperts:
        return PackedExperts(_contiguous(self.weight.columns(part)), self.num_experts)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequantize(self.weight, dtype).reshape(self.shape)

    def to(self, device: torch.device | str) -> PackedExperts:
        return PackedExperts(self.weight.to(device), self.num_experts)


ExpertWeights = torch.Tensor | PackedExperts


def _contiguous(weight: PackedWeight) -> PackedWeight:
    offsets = None if weight.offsets is None else weight.offsets.contiguous()
    return PackedWeight(
        weight.kind, weight.qweight.contiguous(), weight.scales.contiguous(), weight.group_size, offsets
    )


def quantize_experts(weights: torch.Tensor, kind: str, group_size: int | None = None) -> PackedExperts:
    """[E, N, K] float experts -> PackedExperts of `kind` (int8, fp8: one scale per output row; int4:
    groups along K, 128 wide unless K needs narrower), the same numbers as quantizing each expert."""
    if kind not in ONLINE_QUANTIZERS:
        raise ValueError(f"unknown expert quantization {kind!r}; use one of {', '.join(ONLINE_QUANTIZERS)}")
    e, n, k = weights.shape
    rows = weights.reshape(e * n, k)
    if kind == "int4":
        packed = ONLINE_QUANTIZERS["int4"](rows, group_size or int4_group_size(k))
    else:
        packed = ONLINE_QUANTIZERS[kind](rows)
    return PackedExperts(packed, e)


def shard_experts(
    gate_up: ExpertWeights, down: ExpertWeights, part: slice
) -> tuple[ExpertWeights, ExpertWeights]:
    """One tensor-parallel rank's experts: intermediate channels `part` (TensorParallel.part(I, ...))
    of every expert, i.e. those gate rows and up rows of gate_up and those columns of down. An int4
    down must be cut at its group boundaries (PackedWeight.columns says so when it is not)."""
    intermediate = gate_up.shape[1] // 2
    if down.shape[2] != intermediate:
        raise ValueError(
            f"gate_up has {intermediate} intermediate channels per expert but down has {down.shape[2]}"
        )
    channels = torch.arange(part.start, part.stop)
    rows = torch.cat([channels, channels + intermediate])
    if isinstance(gate_up, PackedExperts):
        gate_up_shard = gate_up.rows(rows)
    else:
        gate_up_shard = gate_up[:, rows.to(gate_up.device)].contiguous()
    down_shard = down.columns(part) if isinstance(down, PackedExperts) else down[:, :, part].contiguous()
    return gate_up_shard, down_shard
