"""The CPU's packed matmuls: torch's int4 and int8 kernels give what dequantizing the weight gives,
within bfloat16 rounding, and keep the weight's bytes; a weight no kernel takes stays as it was."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pagoda_runtime.executor.quantization.gguf_block_layouts import GGMLType
from pagoda_runtime.executor.quantization.gguf_blocks import gguf_to_packed
from pagoda_runtime.executor.quantization.linear import make_linear
from pagoda_runtime.executor.quantization.memory import linear_weight_bytes
from pagoda_runtime.executor.quantization.packed import PackedWeight, dequantize


def _gguf(ggml_type: int, rows: int, cols: int, block_bytes: int) -> PackedWeight:
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 255, (rows, cols // 32, block_bytes)).astype(np.uint8)
    # Small fp16 scales (and minimums) so the weights look like a model's, not like random bit patterns.
    raw[..., 0:2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    if ggml_type == GGMLType.Q4_1:
        raw[..., 2:4] = np.frombuffer(np.float16(-0.08).tobytes(), np.uint8)
    return gguf_to_packed(raw.reshape(-1), ggml_type, (rows, cols))


def _layer(weight: PackedWeight, method: str = "gguf"):
    layer = make_linear(weight.in_features, weight.out_features, False, method, dtype=torch.float32)
    layer.load(weight)
    return layer


def _packed_layer_matches_reference(layer, kernel_expected: bool) -> None:
    weight = layer.weight
    x = torch.randn(3, weight.in_features)
    expected = x @ dequantize(weight).t()
    stored = linear_weight_bytes(torch.nn.ModuleList([layer]))
    layer.pack_for_cpu()
    assert (layer.cpu_weight is not None) == kernel_expected
    y = layer(x)
    assert y.dtype == torch.float32
    assert float((y - expected).norm() / expected.norm()) < 1e-2
    assert linear_weight_bytes(torch.nn.ModuleList([layer])) == stored


def test_gguf_q4_1_goes_to_the_int4_kernel() -> None:
    _packed_layer_matches_reference(_layer(_gguf(GGMLType.Q4_1, 48, 128, 20)), kernel_expected=True)


@pytest.mark.parametrize("method", ["int4", "int8"])
def test_online_int4_and_int8_go_to_their_kernels(method: str) -> None:
    layer = make_linear(256, 64, False, method, dtype=torch.float32)
    layer.load(torch.randn(64, 256))
    _packed_layer_matches_reference(layer, kernel_expected=True)


def test_weights_no_kernel_takes_keep_the_reference_matmul() -> None:
    _packed_layer_matches_reference(
        _layer(_gguf(GGMLType.Q8_0, 32, 64, 34)), kernel_expected=False
    )  # groups of 32
    _packed_layer_matches_reference(
        _layer(_gguf(GGMLType.Q4_1, 40, 64, 20)), kernel_expected=False
    )  # 40 rows
