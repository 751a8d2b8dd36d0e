"""Online quantization of float weights: error bounds, exact fusion and the group-size rule."""

from __future__ import annotations

import pytest
import torch
from pagoda_runtime.executor.quantization.online import (
    int4_group_size,
    quantize_fp8,
    quantize_int4,
    quantize_int8,
)
from pagoda_runtime.executor.quantization.packed import dequantize


def _relative_error(weight: torch.Tensor, approx: torch.Tensor) -> float:
    return float((approx - weight).norm() / weight.norm())


@pytest.mark.parametrize(
    "quantize,bound",
    # Bounds from the step size: int8 ~ 1/127 of the row max, fp8 ~ 2^-4 relative, int4 ~ 1/15 of
    # a group's range, for Gaussian weights.
    [(quantize_int8, 0.01), (quantize_fp8, 0.04), (lambda w: quantize_int4(w, 128), 0.12)],
)
def test_dequantized_weight_is_close_to_the_original(quantize, bound: float) -> None:
    weight = torch.randn(96, 512, dtype=torch.bfloat16)
    assert _relative_error(weight.float(), dequantize(quantize(weight))) < bound


@pytest.mark.parametrize("quantize", [quantize_int8, quantize_fp8, lambda w: quantize_int4(w, 64)])
def test_quantizing_parts_then_fusing_equals_quantizing_the_fused_matrix(quantize) -> None:
    q, k, v = torch.randn(64, 256), torch.randn(16, 256) * 3, torch.randn(16, 256) * 0.1
    fused = quantize(torch.cat([q, k, v]))
    parts = [quantize(t) for t in (q, k, v)]
    for name, tensor in fused.tensors().items():
        assert torch.equal(tensor, torch.cat([p.tensors()[name] for p in parts]))


def test_int4_keeps_each_group_range_exact_at_its_ends() -> None:
    weight = torch.randn(8, 256)
    packed = quantize_int4(weight, 128)
    approx = dequantize(packed).reshape(8, 2, 128)
    groups = weight.reshape(8, 2, 128)
    # The group minimum is stored as the offset, so the smallest weight comes back to fp16 precision.
    assert torch.allclose(approx.amin(dim=2), groups.amin(dim=2), atol=1e-3, rtol=1e-3)


def test_zero_rows_quantize_to_zeros_without_nan() -> None:
    weight = torch.zeros(4, 128)
    for quantize in (quantize_int8, quantize_fp8, quantize_int4):
        assert torch.equal(dequantize(quantize(weight)), weight)


def test_int4_group_size_falls_back_to_a_divisor_of_the_width() -> None:
    assert int4_group_size(4096) == 128
    assert int4_group_size(576) == 64  # SmolLM2-135M's hidden size
    assert int4_group_size(1440) == 32
    with pytest.raises(ValueError, match="multiple of 32"):
        int4_group_size(100)


def test_int4_packs_two_weights_per_byte() -> None:
    packed = quantize_int4(torch.randn(32, 1024), 128)
    assert packed.qweight.dtype == torch.uint8 and packed.qweight.shape == (32, 512)
    assert packed.nbytes == 32 * 512 + 2 * 32 * 8 * 2
