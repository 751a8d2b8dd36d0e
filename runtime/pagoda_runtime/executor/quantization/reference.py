"""The PyTorch reference for every quantized matmul: dequantize the packed weight, then matmul.

This is what runs on the CPU, and what the Triton kernels are tested against.
"""

from __future__ import annotations

import torch

from pagoda_runtime.executor.quantization.packed import PackedWeight, dequantize


def reference_matmul(x: torch.Tensor, weight: PackedWeight) -> torch.Tensor:
    """x [M, K] @ dequantized(weight)^T -> [M, N] in x's dtype."""
    return x @ dequantize(weight, x.dtype).t()
