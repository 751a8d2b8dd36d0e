"""make_linear layers: fused loading by row blocks, the forward pass, refusals and their memory."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pagoda_runtime.contract.sizing import WEIGHT_FORMATS
from pagoda_runtime.executor.quantization.gguf_blocks import Q4_1, Q8_0, gguf_to_packed
from pagoda_runtime.executor.quantization.linear import make_linear
from pagoda_runtime.executor.quantization.memory import linear_weight_bytes
from pagoda_runtime.executor.quantization.online import ONLINE_QUANTIZERS
from pagoda_runtime.executor.quantization.packed import dequantize


@pytest.mark.parametrize("method", ["int8", "int4", "fp8"])
def test_fused_layer_loaded_part_by_part_computes_the_fused_matmul(method: str) -> None:
    q, k, v = torch.randn(128, 256), torch.randn(32, 256), torch.randn(32, 256)
    bias = torch.randn(192)
    layer = make_linear(256, 192, True, method, dtype=torch.float32)
    for offset, part in ((0, q), (128, q.new_empty(0, 256)), (128, k), (160, v)):
        if part.shape[0]:
            layer.load(part, row_offset=offset)
    layer.load_bias(bias)
    x = torch.randn(2, 5, 256)
    expected = x @ dequantize(ONLINE_QUANTIZERS[method](torch.cat([q, k, v]))).t() + bias
    assert torch.allclose(layer(x), expected, atol=1e-4, rtol=1e-4)
    fused = x @ torch.cat([q, k, v]).t() + bias
    assert float((layer(x) - fused).norm() / fused.norm()) < 0.15


def test_unquantized_layer_loads_rows_like_the_quantized_ones() -> None:
    gate, up = torch.randn(64, 32), torch.randn(64, 32)
    layer = make_linear(32, 128, False, "none", dtype=torch.float32)
    layer.load(gate, 0)
    layer.load(up, 64)
    x = torch.randn(3, 32)
    assert torch.allclose(layer(x), x @ torch.cat([gate, up]).t(), atol=1e-5)


def test_parts_stored_in_different_formats_are_refused() -> None:
    layer = make_linear(64, 4, False, "gguf", dtype=torch.float32)
    rng = np.random.default_rng(0)
    q4 = np.concatenate([np.full((4, 2), 0x20, np.uint8), np.zeros((4, 18), np.uint8)], axis=1)
    q8 = rng.integers(0, 255, (4, 34)).astype(np.uint8)
    layer.load(gguf_to_packed(q4.reshape(-1), Q4_1, (2, 64)), 0)
    with pytest.raises(ValueError, match="stored differently"):
        layer.load(gguf_to_packed(q8.reshape(-1), Q8_0, (2, 64)), 2)


def test_a_weight_of_the_wrong_width_is_refused() -> None:
    layer = make_linear(64, 8, False, "int8")
    with pytest.raises(ValueError, match="does not fit"):
        layer.load(torch.randn(8, 32))


def test_unknown_method_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="use one of none, int8, int4, fp8, awq, gptq, gguf"):
        make_linear(8, 8, False, "int3")


@pytest.mark.parametrize("method", ["int8", "int4", "fp8"])
def test_stored_bytes_agree_with_the_sizing_used_by_the_operator(method: str) -> None:
    model = torch.nn.ModuleList(
        [make_linear(4096, 1024, False, method), make_linear(1024, 512, False, method)]
    )
    for layer in model:
        layer.load(torch.randn(layer.out_features, layer.in_features))
    expected = sum(
        WEIGHT_FORMATS[method].linear_bytes(layer.out_features, layer.in_features) for layer in model
    )
    assert linear_weight_bytes(model) == expected
