"""The in-memory layouts of quantized linear weights, one row per output channel.

Every layout keeps whole output rows together (row n holds every input of output channel n), so the
rows of fused layers (qkv, gate_up), shards and GGUF's permuted q/k rows move as plain row slices.

- int8: `qweight` int8 [N, K], w = q * scale; `scales` float16 [N, K // group_size].
- int4: `qweight` uint8 [N, K // 2], input 2j in the low nibble and 2j + 1 in the high one;
  w = q * scale + offset with q in 0..15; `scales` and `offsets` float16 [N, K // group_size].
  Symmetric (GGUF Q4_0), zero-point (AWQ, GPTQ) and min/max (GGUF Q4_1, Q4_K, online) int4 all fit
  this one affine form, so a single kernel serves them.
- fp8: `qweight` float8_e4m3fn [N, K], w = q * scale; `scales` float32 [N, 1] (torch._scaled_mm
  wants float32 row scales).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

KINDS = ("int8", "int4", "fp8")


@dataclass
class PackedWeight:
    kind: str  # one of KINDS
    qweight: torch.Tensor
    scales: torch.Tensor
    group_size: int
    offsets: torch.Tensor | None = None  # int4 only

    @property
    def out_features(self) -> int:
        return self.qweight.shape[0]

    @property
    def in_features(self) -> int:
        return self.qweight.shape[1] * (2 if self.kind == "int4" else 1)

    @property
    def nbytes(self) -> int:
        tensors = [self.qweight, self.scales] + ([self.offsets] if self.offsets is not None else [])
        return sum(t.numel() * t.element_size() for t in tensors)

    def tensors(self) -> dict[str, torch.Tensor]:
        named = {"qweight": self.qweight, "scales": self.scales}
        if self.offsets is not None:
            named["offsets"] = self.offsets
        return named

    def rows(self, index: torch.Tensor | slice) -> PackedWeight:
        """The same weight restricted to (or reordered by) output rows."""
        return PackedWeight(
            self.kind,
            self.qweight[index],
            self.scales[index],
            self.group_size,
            None if self.offsets is None else self.offsets[index],
        )

    def columns(self, part: slice) -> PackedWeight:
        """The same weight restricted to inputs [part.start, part.stop): a row-parallel shard. A
        per-row scale goes with every slice of its row; groups must not be cut."""
        start, stop = part.start, part.stop
        per_row = self.scales.shape[1] == 1
        if not per_row and (start % self.group_size or stop % self.group_size):
            raise ValueError(
                f"inputs {start}..{stop} of this {self.kind} weight cut its groups of {self.group_size}; "
                "choose a tensor-parallel size that splits the layer at group boundaries"
            )
        pack = 2 if self.kind == "int4" else 1
        groups = slice(None) if per_row else slice(start // self.group_size, stop // self.group_size)
        return PackedWeight(
            self.kind,
            self.qweight[:, start // pack : stop // pack],
            self.scales[:, groups],
            stop - start if per_row else self.group_size,
            None if self.offsets is None else self.offsets[:, groups],
        )

    def to(self, device: torch.device | str) -> PackedWeight:
        offsets = None if self.offsets is None else self.offsets.to(device)
        return PackedWeight(
            self.kind, self.qweight.to(device), self.scales.to(device), self.group_size, offsets
        )


def unpack_int4(qweight: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K // 2] -> uint8 [N, K] of values 0..15 in input order."""
    return torch.stack([qweight & 0x0F, qweight >> 4], dim=-1).reshape(qweight.shape[0], -1)


def pack_int4(values: torch.Tensor) -> torch.Tensor:
    """Integer [N, K] of values 0..15 -> uint8 [N, K // 2] (input 2j low nibble, 2j + 1 high)."""
    pairs = values.to(torch.uint8).reshape(values.shape[0], -1, 2)
    return pairs[..., 0] | (pairs[..., 1] << 4)


def dequantize(weight: PackedWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The float [N, K] matrix the packed weight stands for, computed in float32."""
    n, k = weight.out_features, weight.in_features
    q = unpack_int4(weight.qweight).float() if weight.kind == "int4" else weight.qweight.float()
    groups = q.reshape(n, weight.scales.shape[1], -1) * weight.scales.float()[..., None]
    if weight.offsets is not None:
        groups = groups + weight.offsets.float()[..., None]
    return groups.reshape(n, k).to(dtype)
