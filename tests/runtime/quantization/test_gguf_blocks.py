"""GGUF blocks convert to packed weights that stand for the values llama.cpp defines for them: exactly
for Q4_0/Q4_1/Q5_0/Q8_0, within the fp16 rounding of their scales for Q4_K and Q6_K."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize as reference_dequantize
from pagoda_runtime.contract.sizing import GGUF_BLOCK_FORMATS
from pagoda_runtime.executor.quantization.gguf_block_layouts import BLOCK_LAYOUT, GGMLType, affine_blocks
from pagoda_runtime.executor.quantization.gguf_blocks import gguf_to_packed
from pagoda_runtime.executor.quantization.packed import dequantize
from pagoda_runtime.executor.quantization.reference import reference_matmul

from tests.runtime.k_quants import quantize_q4_k, quantize_q6_k, random_blocks

ROWS, COLS = 6, 512
EXACT = ["Q4_0", "Q4_1", "Q5_0", "Q8_0"]
ROUNDED = ["Q4_K", "Q6_K"]
PACKED = {"Q4_0": "int4", "Q4_1": "int4", "Q4_K": "int4", "Q5_0": "int8", "Q8_0": "int8", "Q6_K": "int8"}


def _random(type_name: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Raw bytes of a ROWS x COLS tensor of random blocks, and the gguf package's values for them."""
    elements, block_bytes = BLOCK_LAYOUT[GGMLType[type_name]]
    raw = random_blocks(type_name, ROWS * COLS // elements, block_bytes, seed)
    expected = reference_dequantize(raw.reshape(ROWS, -1), gguf.GGMLQuantizationType[type_name])
    return raw.reshape(-1), expected


def test_every_packed_type_is_tested_and_sized():
    assert set(PACKED) == set(GGUF_BLOCK_FORMATS)


@pytest.mark.parametrize("type_name", EXACT)
def test_legacy_blocks_pack_to_exactly_the_values_llama_cpp_defines(type_name: str) -> None:
    raw, expected = _random(type_name, seed=1)
    packed = gguf_to_packed(raw, GGMLType[type_name], (ROWS, COLS))
    assert (packed.kind, packed.group_size) == (PACKED[type_name], 32)
    np.testing.assert_array_equal(dequantize(packed).numpy(), expected)


@pytest.mark.parametrize("type_name", ROUNDED)
def test_k_quant_blocks_pack_within_the_fp16_rounding_of_their_scales(type_name: str) -> None:
    raw, expected = _random(type_name, seed=2)
    packed = gguf_to_packed(raw, GGMLType[type_name], (ROWS, COLS))
    fmt = GGUF_BLOCK_FORMATS[type_name]
    assert (packed.kind, packed.group_size) == (PACKED[type_name], fmt.group_size)
    assert packed.nbytes == fmt.linear_bytes(ROWS, COLS)
    # w = q * scale + offset with scale and offset rounded to fp16: each off by at most 2^-11 of itself.
    affine = affine_blocks(raw, GGMLType[type_name])
    bound = np.abs(affine.q.astype(np.float32)) * np.abs(affine.scale[..., None])
    if affine.offset is not None:
        bound += np.abs(affine.offset[..., None])
    error = np.abs(dequantize(packed).numpy() - expected)
    assert np.all(error <= bound.reshape(ROWS, COLS) * 2**-11 + 1e-9)
    assert error.max() > 0  # d * sc needs more than fp16's 11 significant bits for some blocks


@pytest.mark.parametrize("type_name,quantize", [("Q4_K", quantize_q4_k), ("Q6_K", quantize_q6_k)])
def test_fp16_scales_cost_about_a_percent_of_the_quantization_error(type_name, quantize) -> None:
    """The measurement behind holding K-quant scales in fp16: Gaussian weights with a few outlier
    columns, quantized; the packed weights' distance from the file's values beside the file's own
    distance from the weights."""
    rng = np.random.default_rng(3)
    weights = rng.normal(0, 0.02, (256, 1024)).astype(np.float32)
    weights[:, rng.choice(1024, 8)] *= 8
    raw = quantize(weights)
    stored = reference_dequantize(raw, gguf.GGMLQuantizationType[type_name])
    packed = dequantize(gguf_to_packed(raw.reshape(-1), GGMLType[type_name], weights.shape)).numpy()
    rounding = np.linalg.norm(packed - stored) / np.linalg.norm(stored)
    quantization = np.linalg.norm(stored - weights) / np.linalg.norm(weights)
    assert rounding < 0.02 * quantization


def test_quantized_matmul_of_the_bundled_model_weight_matches_dequantized_reader() -> None:
    from pagoda_runtime.contract.bundled import resolve_model
    from pagoda_runtime.loading.gguf_reader import GGUFFile

    gguf_file = GGUFFile(resolve_model("smollm2-135m"))
    info = gguf_file.tensors["blk.0.ffn_down.weight"]
    packed = gguf_to_packed(gguf_file.raw_bytes(info.name), info.ggml_type, info.shape)
    assert packed.kind == "int4"  # the bundled file stores this layer as Q4_1
    x = torch.randn(3, info.shape[1])
    expected = x @ gguf_file.dequantize(info.name).t()
    assert torch.allclose(reference_matmul(x, packed), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("type_name", ["Q5_K", "Q3_K", "Q5_1"])
def test_types_without_a_packed_layout_are_refused_by_name(type_name: str) -> None:
    with pytest.raises(ValueError, match=f"GGUF tensors of type {type_name} have no packed layout"):
        gguf_to_packed(np.zeros(176, dtype=np.uint8), GGMLType[type_name], (1, 256))


@pytest.mark.parametrize("field", [0, 2])  # d (so d * sc), dmin (so dmin * m)
def test_scales_beyond_fp16_are_refused_rather_than_turned_into_inf(field: int) -> None:
    raw = random_blocks("Q4_K", 1, 144, seed=4)
    raw[:, 4:16] = 0xFF  # every 6-bit scale and min at 63
    raw[:, field : field + 2] = np.array([60000.0], dtype=np.float16).view(np.uint8)
    with pytest.raises(ValueError, match="beyond fp16's range.*--quantization none"):
        gguf_to_packed(raw.reshape(-1), GGMLType.Q4_K, (1, 256))
