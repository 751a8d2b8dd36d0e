"""make_linear layers: fused loading by row blocks, the forward pass, refusals and their memory."""

from __future__ import annotations

import pytest
import torch
from pagoda_runtime.contract.sizing import WEIGHT_FORMATS
from pagoda_runtime.executor.quantization.gguf_block_layouts import BLOCK_LAYOUT, GGMLType
from pagoda_runtime.executor.quantization.gguf_blocks import gguf_to_packed
from pagoda_runtime.executor.quantization.linear import make_linear
from pagoda_runtime.executor.quantization.memory import linear_weight_bytes
from pagoda_runtime.executor.quantization.online import ONLINE_QUANTIZERS
from pagoda_runtime.executor.quantization.packed import dequantize

from tests.runtime.k_quants import random_blocks


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


@pytest.mark.parametrize("order", [("q", "k", "v"), ("v", "q", "k")])
def test_parts_stored_in_different_formats_become_row_blocks_of_their_own(order) -> None:
    # As in a Q4_K_M file: q and k in Q4_K (int4 in groups of 32), v in Q6_K (int8 in groups of 16).
    rows = {"q": (0, "Q4_K", 32), "k": (32, "Q4_K", 16), "v": (48, "Q6_K", 16)}
    parts = {}
    for i, (name, (_, type_name, count)) in enumerate(rows.items()):
        _, block_bytes = BLOCK_LAYOUT[GGMLType[type_name]]
        raw = random_blocks(type_name, count, block_bytes, seed=i).reshape(-1)
        parts[name] = gguf_to_packed(raw, GGMLType[type_name], (count, 256))
    layer = make_linear(256, 64, True, "gguf", dtype=torch.float32)
    for name in order:
        layer.load(parts[name], rows[name][0])
    bias = torch.randn(64)
    layer.load_bias(bias)
    x = torch.randn(3, 256)
    expected = x @ torch.cat([dequantize(parts[name]) for name in "qkv"]).t() + bias
    assert torch.allclose(layer(x), expected, rtol=1e-5, atol=1e-5)
    kinds = [block.kind for block in layer.row_blocks]
    assert kinds == (["int4", "int8"] if order[-1] == "v" else ["int4", "int4", "int8"])
    assert linear_weight_bytes(layer) == sum(part.nbytes for part in parts.values())
    for module in list(layer.modules()):  # as the model runner does on the CPU
        if hasattr(module, "pack_for_cpu"):
            module.pack_for_cpu()
    assert layer.row_blocks[0].cpu_weight is not None  # int4 rows go to torch's CPU kernel
    assert torch.allclose(layer(x), expected, rtol=0.02, atol=0.02 * float(expected.abs().max()))


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
