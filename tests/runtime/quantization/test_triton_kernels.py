"""The Triton GEMV and GEMM compute what dequantize-then-matmul computes: compiled on a GPU, in
Triton's interpreter on a CPU-only machine (pagoda_runtime/executor/triton_mode.py decides)."""

from __future__ import annotations

import pytest
import torch
from pagoda_runtime.executor.quantization.online import quantize_fp8, quantize_int4, quantize_int8
from pagoda_runtime.executor.quantization.packed import PackedWeight
from pagoda_runtime.executor.quantization.reference import reference_matmul
from pagoda_runtime.executor.quantization.triton_gemm import GemmConfig, gemm
from pagoda_runtime.executor.quantization.triton_gemv import GemvConfig, gemv

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _int8_groups(weight: torch.Tensor, group: int = 32) -> PackedWeight:
    """int8 in groups with fp16 scales, as GGUF Q8_0 (32) and Q6_K (16) are held."""
    n, k = weight.shape
    groups = weight.reshape(n, k // group, group)
    scales = (groups.abs().amax(dim=2) / 127).half()
    q = torch.round(groups / scales.float()[..., None]).clamp(-127, 127).to(torch.int8).reshape(n, k)
    return PackedWeight("int8", q, scales, group)


WEIGHTS = {
    "int8 per channel": quantize_int8,
    "int8 groups of 32": _int8_groups,
    "int8 groups of 16": lambda w: _int8_groups(w, 16),
    "int4 groups of 128": lambda w: quantize_int4(w, 128),
    "int4 groups of 32": lambda w: quantize_int4(w, 32),
    "fp8 per channel": quantize_fp8,
}


def _relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert torch.isfinite(out).all()
    return float((out.double() - ref.double()).norm() / ref.double().norm())


@pytest.mark.parametrize("name", list(WEIGHTS))
@pytest.mark.parametrize(
    "rows,config",
    [(1, GemvConfig(block_n=16, block_k=64)), (2, None), (3, GemvConfig(block_n=8, block_k=256, split_k=2))],
)
def test_gemv_matches_reference(name: str, rows: int, config: GemvConfig | None) -> None:
    torch.manual_seed(hash((name, rows)) % 1000)
    weight = WEIGHTS[name](torch.randn(40, 512, device=DEVICE))  # 40 rows: a partial last block
    x = torch.randn(rows, 512, device=DEVICE)
    assert _relative_error(gemv(x, weight, config), reference_matmul(x, weight)) < 1e-5


@pytest.mark.parametrize("name", list(WEIGHTS))
def test_gemm_matches_reference(name: str) -> None:
    torch.manual_seed(hash(name) % 1000)
    weight = WEIGHTS[name](torch.randn(40, 256, device=DEVICE))
    x = torch.randn(20, 256, device=DEVICE)
    config = GemmConfig(block_m=16, block_n=32, block_k=64)
    assert _relative_error(gemm(x, weight, config), reference_matmul(x, weight)) < 1e-5


def test_gemm_in_half_precision_matches_reference() -> None:
    weight = quantize_int4(torch.randn(32, 256, device=DEVICE), 128)
    x = torch.randn(17, 256, device=DEVICE).half()
    out = gemm(x, weight, GemmConfig(block_m=16, block_n=32, block_k=64))
    assert out.dtype == torch.float16
    assert _relative_error(out, reference_matmul(x.float(), weight)) < 2e-3


def test_int8_gemv_handles_widths_that_are_not_a_tile_multiple() -> None:
    weight = quantize_int8(torch.randn(24, 200, device=DEVICE))
    x = torch.randn(2, 200, device=DEVICE)
    assert (
        _relative_error(gemv(x, weight, GemvConfig(block_n=16, block_k=64)), reference_matmul(x, weight))
        < 1e-5
    )


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["int8", "int4", "fp8"])
@pytest.mark.parametrize("rows", [1, 64])
def test_quantized_linear_on_cuda_matches_reference(method: str, rows: int) -> None:
    from pagoda_runtime.executor.quantization.linear import make_linear

    layer = make_linear(4096, 6144, False, method, device="cuda")
    layer.load(torch.randn(6144, 4096, device="cuda", dtype=torch.bfloat16) * 0.02)
    x = torch.randn(rows, 4096, device="cuda", dtype=torch.bfloat16)
    ref = reference_matmul(x.float(), layer.weight)
    # bf16 output; fp8 prefill on Hopper also quantizes the activations (torch._scaled_mm).
    assert _relative_error(layer(x), ref) < (5e-2 if method == "fp8" and rows > 4 else 1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [16, 37, 256])
def test_fp8_prefill_goes_through_scaled_mm_on_hopper(rows: int) -> None:
    from pagoda_runtime.executor.quantization.linear import quantized_matmul
    from pagoda_runtime.executor.quantization.scaled_mm import fp8_scaled_mm, scaled_mm_supported

    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 tensor cores need compute capability 8.9 or newer")
    weight = quantize_fp8(torch.randn(6144, 4096, device="cuda") * 0.02)
    x = torch.randn(rows, 4096, device="cuda", dtype=torch.bfloat16)
    assert scaled_mm_supported(x, weight)
    ref = reference_matmul(x.float(), weight)
    out = fp8_scaled_mm(x, weight)
    assert out.dtype == torch.bfloat16 and _relative_error(out, ref) < 5e-2
    assert torch.equal(quantized_matmul(x, weight), out)
