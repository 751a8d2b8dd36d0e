"""fp8 prefill on GPUs with fp8 tensor cores (compute capability 8.9 and up): torch._scaled_mm.

The activations are quantized to e4m3 per token on the fly (one float32 scale per row), the
weights are already e4m3 per output channel, and cuBLASLt applies both scales in its epilogue.
"""

from __future__ import annotations

import torch

from pagoda_runtime.executor.quantization.online import FP8_MAX
from pagoda_runtime.executor.quantization.packed import PackedWeight


def scaled_mm_supported(x: torch.Tensor, weight: PackedWeight) -> bool:
    # Row-wise scaling in cuBLASLt wants bf16 output and 16-aligned matrix sides.
    return (
        weight.kind == "fp8"
        and x.is_cuda
        and x.dtype == torch.bfloat16
        and torch.cuda.get_device_capability(x.device) >= (8, 9)
        and weight.in_features % 16 == 0
        and weight.out_features % 16 == 0
    )


def fp8_scaled_mm(x: torch.Tensor, weight: PackedWeight) -> torch.Tensor:
    x_scales = (x.abs().amax(dim=1, keepdim=True).float() / FP8_MAX).clamp_min(1e-12)
    x_fp8 = (x.float() / x_scales).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return torch._scaled_mm(
        x_fp8,
        weight.qweight.t(),
        scale_a=x_scales,
        scale_b=weight.scales.reshape(1, -1),
        out_dtype=x.dtype,
    )
