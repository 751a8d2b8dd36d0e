"""Online quantization: a float weight [N, K] from a bf16/fp16/fp32 checkpoint -> a PackedWeight.

Every statistic is taken per output row (or per group inside a row), so quantizing q, k and v
separately and stacking the rows gives exactly what quantizing the fused qkv matrix would.
"""

from __future__ import annotations

import torch

from pagoda_runtime.contract.sizing import fitted_group_size
from pagoda_runtime.executor.quantization.packed import PackedWeight, pack_int4

INT4_GROUP_SIZE = 128
FP8_MAX = torch.finfo(torch.float8_e4m3fn).max


def int4_group_size(in_features: int, preferred: int = INT4_GROUP_SIZE) -> int:
    """The preferred group size, or the largest power of two below it that divides in_features.

    Small models have widths like 576 that 128 does not divide; groups of 64 there keep the same
    kernel and cost 2 extra bits per 64 weights instead of refusing the model.
    """
    size = fitted_group_size(in_features, preferred)
    if size >= 32:
        return size
    raise ValueError(
        f"int4 needs the input width to be a multiple of 32, but this layer has {in_features} inputs; "
        "use --quantization int8 or fp8 for this model"
    )


def quantize_int8(weight: torch.Tensor) -> PackedWeight:
    """Symmetric, one scale per output channel: w ~ q * scale, q in -127..127."""
    w = weight.float()
    scales = (w.abs().amax(dim=1, keepdim=True) / 127).clamp_min(1e-8).half()
    q = torch.round(w / scales.float()).clamp_(-127, 127).to(torch.int8)
    return PackedWeight("int8", q, scales, group_size=w.shape[1])


def quantize_int4(weight: torch.Tensor, group_size: int | None = None) -> PackedWeight:
    """Asymmetric groups along the input: w ~ q * scale + offset, q in 0..15, offset = group min."""
    n, k = weight.shape
    group_size = group_size or int4_group_size(k)
    w = weight.float().reshape(n, k // group_size, group_size)
    low, high = w.amin(dim=2), w.amax(dim=2)
    scales = ((high - low) / 15).clamp_min(1e-8).half()
    offsets = low.half()
    q = torch.round((w - offsets.float()[..., None]) / scales.float()[..., None]).clamp_(0, 15)
    return PackedWeight("int4", pack_int4(q.reshape(n, k)), scales, group_size, offsets)


def quantize_fp8(weight: torch.Tensor) -> PackedWeight:
    """e4m3 with one float32 scale per output channel, mapping each row's max magnitude to 448."""
    w = weight.float()
    scales = (w.abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp_min(1e-12)
    q = (w / scales).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return PackedWeight("fp8", q, scales, group_size=w.shape[1])


ONLINE_QUANTIZERS = {"int8": quantize_int8, "int4": quantize_int4, "fp8": quantize_fp8}
