"""GGUF Q4_0/Q4_1/Q8_0 blocks built by hand convert to packed weights that dequantize exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pagoda_runtime.executor.quantization.gguf_blocks import Q4_0, Q4_1, Q8_0, gguf_to_packed
from pagoda_runtime.executor.quantization.packed import dequantize
from pagoda_runtime.executor.quantization.reference import reference_matmul

ROWS, COLS = 6, 96


def _blocks(ggml_type: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Raw bytes of a ROWS x COLS tensor and the float values llama.cpp defines for them."""
    count = ROWS * COLS // 32
    d = rng.uniform(0.001, 0.05, count).astype(np.float16)
    if ggml_type == Q8_0:
        q = rng.integers(-127, 128, (count, 32)).astype(np.int8)
        raw = np.concatenate([d.reshape(-1, 1).view(np.uint8), q.view(np.uint8)], axis=1)
        values = d.astype(np.float32)[:, None] * q
    else:
        q = rng.integers(0, 16, (count, 32)).astype(np.uint8)
        # Byte j: element j in the low nibble, element j + 16 in the high one.
        nibbles = q[:, :16] | (q[:, 16:] << 4)
        if ggml_type == Q4_1:
            m = rng.uniform(-0.5, 0.0, count).astype(np.float16)
            header = np.concatenate(
                [d.reshape(-1, 1).view(np.uint8), m.reshape(-1, 1).view(np.uint8)], axis=1
            )
            values = d.astype(np.float32)[:, None] * q + m.astype(np.float32)[:, None]
        else:
            header = d.reshape(-1, 1).view(np.uint8)
            values = d.astype(np.float32)[:, None] * (q.astype(np.float32) - 8)
        raw = np.concatenate([header, nibbles], axis=1)
    return raw.reshape(-1), values.reshape(ROWS, COLS)


@pytest.mark.parametrize("ggml_type,kind", [(Q4_0, "int4"), (Q4_1, "int4"), (Q8_0, "int8")])
def test_blocks_convert_to_packed_weights_that_dequantize_exactly(ggml_type: int, kind: str) -> None:
    raw, values = _blocks(ggml_type, np.random.default_rng(ggml_type))
    packed = gguf_to_packed(raw, ggml_type, (ROWS, COLS))
    assert packed.kind == kind and packed.group_size == 32
    assert torch.allclose(dequantize(packed), torch.from_numpy(values), rtol=0, atol=1e-6)


@pytest.mark.parametrize("ggml_type", [Q4_0, Q4_1, Q8_0])
def test_conversion_agrees_with_the_gguf_package(ggml_type: int) -> None:
    gguf_quants = pytest.importorskip("gguf.quants")
    import gguf

    raw, _ = _blocks(ggml_type, np.random.default_rng(10 + ggml_type))
    theirs = gguf_quants.dequantize(raw.reshape(ROWS, -1), gguf.GGMLQuantizationType(ggml_type))
    ours = dequantize(gguf_to_packed(raw, ggml_type, (ROWS, COLS)))
    assert torch.allclose(ours, torch.from_numpy(np.asarray(theirs, dtype=np.float32)), rtol=0, atol=1e-6)


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


def test_other_block_types_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="ggml type 12 cannot be kept quantized"):
        gguf_to_packed(np.zeros(144, dtype=np.uint8), 12, (1, 256))
