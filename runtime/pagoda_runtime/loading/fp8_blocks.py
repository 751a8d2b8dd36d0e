"""Block-quantized FP8 checkpoints (quantization_config.quant_method "fp8" with weight_block_size:
Qwen3's -FP8 releases, DeepSeek V3 and R1, GLM-4.5-FP8): each projection's weight stored as
float8_e4m3fn [N, K] with `weight_scale_inv` float32 [ceil(N / bn), ceil(K / bk)], one scale per
block of bn output rows by bk inputs, w = stored * scale.

They are dequantized at load into the model's float dtype, and --quantization auto holds them as
fp8 again (executor/quantization/online.py: one scale per output row, which the fp8 matmuls take),
so the model keeps the checkpoint's size; --quantization none keeps the dequantized floats.
"""

from __future__ import annotations

from typing import Any

import torch

SCALE_SUFFIX = "weight_scale_inv"


class Fp8CheckpointError(ValueError):
    """A quantization_config of method fp8 that is not the block form read here."""


def block_size(raw: dict[str, Any]) -> tuple[int, int] | None:
    """The (rows, inputs) block of a block-FP8 checkpoint's config.json; None for any other."""
    qc = raw.get("quantization_config") or {}
    if str(qc.get("quant_method", "")).lower() != "fp8":
        return None
    block = qc.get("weight_block_size")
    if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
        raise Fp8CheckpointError(
            f"its fp8 quantization_config has weight_block_size {block!r}; Pagoda reads block-quantized FP8 "
            "checkpoints (weight_block_size [rows, inputs], as Qwen3's and DeepSeek's FP8 releases); serve "
            "the float checkpoint with --quantization fp8 instead"
        )
    return block[0], block[1]


def scale_name(weight_name: str) -> str:
    """The scale tensor's name for projection weight `weight_name` (X.weight -> X.weight_scale_inv)."""
    return weight_name.removesuffix("weight") + SCALE_SUFFIX


def scale_shape(shape: tuple[int, ...], block: tuple[int, int]) -> tuple[int, int]:
    rows, inputs = shape
    return -(-rows // block[0]), -(-inputs // block[1])


def dequantize(
    weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int], dtype: torch.dtype
) -> torch.Tensor:
    """weight float8_e4m3fn [N, K] times its block scales [ceil(N / bn), ceil(K / bk)] -> [N, K] in dtype."""
    rows, inputs = weight.shape
    full = scale.float().repeat_interleave(block[0], 0)[:rows].repeat_interleave(block[1], 1)[:, :inputs]
    return (weight.float() * full).to(dtype)
