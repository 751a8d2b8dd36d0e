"""MXFP4 checkpoints (GPT-OSS as OpenAI released it, quantization_config.quant_method "mxfp4"): the
experts' weights are stored as 4-bit floats (e2m1) in blocks of 32 along the inputs, two to a byte
(the even input in the low nibble), each block with one power-of-two scale (e8m0, a biased
exponent). A tensor X of the float layout is stored as X_blocks [..., rows, K / 32, 16] and
X_scales [..., rows, K / 32], rows being the output channels.

They are dequantized at load into the model's float dtype, exactly (every e2m1 value times a power
of two is a bfloat16), and handed to the model in the float checkpoint's layout ([..., K, rows], as
transformers' GptOssExperts holds them); --quantization int8/int4/fp8 then quantizes them as any
float checkpoint's.
"""

from __future__ import annotations

from typing import Any

import torch

BLOCK = 32
# The e2m1 value of each nibble.
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
_SCALE_BIAS = 127


def is_mxfp4(raw: dict[str, Any]) -> bool:
    """Whether config.json says the checkpoint's experts are MXFP4."""
    qc = raw.get("quantization_config") or {}
    return str(qc.get("quant_method", "")).lower() == "mxfp4"


def stored_parts(name: str, shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
    """The stored tensors of float tensor `name` of `shape` [..., K, rows], with their shapes."""
    *lead, inputs, rows = shape
    groups = inputs // BLOCK
    return {
        f"{name}_blocks": (*lead, rows, groups, BLOCK // 2),
        f"{name}_scales": (*lead, rows, groups),
    }


def dequantize(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """blocks uint8 [E, rows, K / 32, 16] and scales uint8 [E, rows, K / 32] -> [E, K, rows] in
    dtype, one expert at a time (the lookup's index tensors of a whole layer would be gigabytes)."""
    experts, rows, groups, half = blocks.shape
    table = torch.tensor(_E2M1, dtype=torch.float32)
    out = torch.empty(experts, groups * 2 * half, rows, dtype=dtype)
    for e in range(experts):
        packed = blocks[e].to(torch.int64)
        values = torch.stack((table[packed & 0xF], table[packed >> 4]), dim=-1).flatten(-2)
        exponents = scales[e].to(torch.int32) - _SCALE_BIAS
        values = torch.ldexp(values, exponents[..., None].float())
        out[e] = values.reshape(rows, -1).T.to(dtype)
    return out
