"""Our GGUF parser and dequantizer against the reference `gguf` package, on synthetic and real files."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize as reference_dequantize
from gguf.quants import quantize
from pagoda_runtime.contract.bundled import bundled_model_path
from pagoda_runtime.loading.gguf_reader import BLOCK_LAYOUT, GGMLType, GGUFError, GGUFFile, dequantize

from tests.runtime.k_quants import random_blocks

METADATA = {
    "test.u8": (255, gguf.GGUFValueType.UINT8),
    "test.i8": (-128, gguf.GGUFValueType.INT8),
    "test.u16": (65535, gguf.GGUFValueType.UINT16),
    "test.i16": (-32768, gguf.GGUFValueType.INT16),
    "test.u32": (4_000_000_000, gguf.GGUFValueType.UINT32),
    "test.i32": (-2_000_000_000, gguf.GGUFValueType.INT32),
    "test.u64": (2**63 + 5, gguf.GGUFValueType.UINT64),
    "test.i64": (-(2**62), gguf.GGUFValueType.INT64),
    "test.f32": (0.5, gguf.GGUFValueType.FLOAT32),
    "test.f64": (1e-300, gguf.GGUFValueType.FLOAT64),
    "test.bool": (True, gguf.GGUFValueType.BOOL),
    "test.str": ("héllo 😀", gguf.GGUFValueType.STRING),
    "test.ints": ([1, -2, 3], gguf.GGUFValueType.ARRAY),
    "test.strs": (["a", "", "ü b"], gguf.GGUFValueType.ARRAY),
    "test.floats": ([0.25, -1.5], gguf.GGUFValueType.ARRAY),
}
TYPES = [
    GGMLType.F32,
    GGMLType.F16,
    GGMLType.BF16,
    GGMLType.Q8_0,
    GGMLType.Q4_0,
    GGMLType.Q4_1,
    GGMLType.Q5_0,
    GGMLType.Q5_1,
]
# The gguf package reads these but cannot write them: their tensors are random blocks.
K_TYPES = [GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K]


def _source(shape, seed):
    return np.random.default_rng(seed).normal(0.0, 2.0, size=shape).astype(np.float32)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """A v3 file with every metadata value type, a 64-byte alignment and one tensor per ggml type."""
    path = tmp_path_factory.mktemp("gguf") / "synthetic.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_custom_alignment(64)
    for key, (value, value_type) in METADATA.items():
        writer.add_key_value(key, value, value_type)
    stored = {}
    for i, ggml_type in enumerate(TYPES):
        data = _source((3, 96) if i % 2 else (5, 64), seed=i)
        qtype = gguf.GGMLQuantizationType(int(ggml_type))
        stored[ggml_type.name] = quantize(data, qtype)
        writer.add_tensor(f"t.{ggml_type.name}", stored[ggml_type.name], raw_dtype=qtype)
    for i, ggml_type in enumerate(K_TYPES):
        _, block_bytes = BLOCK_LAYOUT[ggml_type]
        stored[ggml_type.name] = random_blocks(ggml_type.name, 3 * (i + 1), block_bytes, seed=i).reshape(
            i + 1, -1
        )
        qtype = gguf.GGMLQuantizationType(int(ggml_type))
        writer.add_tensor(f"t.{ggml_type.name}", stored[ggml_type.name], raw_dtype=qtype)
    writer.add_tensor("t.vector", _source((7,), seed=99))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path, stored


def test_metadata_of_every_value_type_reads_back(synthetic):
    path, _ = synthetic
    metadata = GGUFFile(path).metadata
    for key, (value, _) in METADATA.items():
        assert metadata[key] == pytest.approx(value) if isinstance(value, float) else metadata[key] == value
    assert metadata["general.alignment"] == 64


def test_every_type_dequantizes_like_the_gguf_package(synthetic):
    path, stored = synthetic
    file = GGUFFile(path)
    for ggml_type in TYPES + K_TYPES:
        name = f"t.{ggml_type.name}"
        expected = reference_dequantize(stored[ggml_type.name], gguf.GGMLQuantizationType(int(ggml_type)))
        np.testing.assert_array_equal(file.dequantize(name).numpy(), expected)
        assert tuple(file.tensors[name].shape) == expected.shape
    np.testing.assert_array_equal(file.dequantize("t.vector").numpy(), _source((7,), seed=99))


def test_raw_bytes_are_the_stored_blocks(synthetic):
    path, stored = synthetic
    file = GGUFFile(path)
    for ggml_type in TYPES + K_TYPES:
        assert file.raw_bytes(f"t.{ggml_type.name}").tobytes() == stored[ggml_type.name].tobytes()
        assert file.tensors[f"t.{ggml_type.name}"].offset % 64 == 0


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("ggml_type", [t for t in BLOCK_LAYOUT if t != GGMLType.F32])
def test_random_blocks_dequantize_like_the_gguf_package(ggml_type):
    block_elements, block_bytes = BLOCK_LAYOUT[ggml_type]
    raw = np.random.default_rng(int(ggml_type)).integers(0, 256, size=(64, block_bytes), dtype=np.uint8)
    # Every bit pattern of the payload, including scales that are inf or NaN.
    expected = reference_dequantize(raw, gguf.GGMLQuantizationType(int(ggml_type))).reshape(-1)
    np.testing.assert_array_equal(dequantize(raw.reshape(-1), ggml_type).numpy(), expected)
    assert expected.size == 64 * block_elements


def test_version_2_files_read_like_version_3(synthetic, tmp_path):
    path, stored = synthetic
    data = bytearray(path.read_bytes())
    data[4:8] = (2).to_bytes(4, "little")
    v2 = tmp_path / "v2.gguf"
    v2.write_bytes(bytes(data))
    file = GGUFFile(v2)
    assert file.version == 2
    assert file.raw_bytes("t.Q4_1").tobytes() == stored["Q4_1"].tobytes()


def _cut_points(path):
    """Byte counts that end the file in the header, the metadata, the tensor infos and the tensor data."""
    reference = gguf.GGUFReader(path)
    last = reference.tensors[-1]
    return [
        6,
        30,
        200,
        int(reference.tensors[0].data_offset) - 10,
        int(last.data_offset) + int(last.n_bytes) - 1,
    ]


@pytest.mark.parametrize("point", range(5))
def test_truncated_file_says_which_file_and_what_was_expected(synthetic, tmp_path, point):
    path, _ = synthetic
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[: _cut_points(path)[point]])
    with pytest.raises(GGUFError) as error:
        GGUFFile(cut)
    message = str(error.value)
    assert str(cut) in message and "truncated" in message
    assert "expected" in message or "needs bytes" in message
    assert "\n" not in message


def test_not_a_gguf_file_and_unsupported_versions_are_named(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(GGUFError, match="is not a GGUF file"):
        GGUFFile(bad)
    bad.write_bytes(b"GGUF" + (1).to_bytes(4, "little") + bytes(100))
    with pytest.raises(GGUFError, match="version 1; Pagoda reads versions 2 and 3"):
        GGUFFile(bad)


def test_bundled_model_dequantizes_exactly_like_the_gguf_package():
    path = bundled_model_path()
    ours = GGUFFile(path)
    reference = gguf.GGUFReader(path)
    assert len(ours.tensors) == len(reference.tensors) == 272
    seen_types = set()
    for tensor in reference.tensors:
        seen_types.add(tensor.tensor_type.name)
        expected = reference_dequantize(tensor.data, tensor.tensor_type)
        np.testing.assert_array_equal(ours.dequantize(tensor.name).numpy(), expected, err_msg=tensor.name)
    assert seen_types == {"F32", "Q8_0", "Q4_1"}
    for key, field in reference.fields.items():
        if not key.startswith("GGUF."):
            assert ours.metadata[key] == pytest.approx(field.contents()), key


@pytest.mark.parametrize("ggml_type", [GGMLType.IQ2_XXS, GGMLType.TQ1_0, GGMLType.IQ4_NL])
def test_a_block_type_pagoda_cannot_read_names_itself_and_what_to_convert_to(tmp_path, ggml_type):
    path = tmp_path / "model.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    qtype = gguf.GGMLQuantizationType(int(ggml_type))
    elements, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    writer.add_tensor(
        "blk.0.attn_q.weight", np.zeros((2, 256 // elements * block_bytes), np.uint8), raw_dtype=qtype
    )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(GGUFError) as error:
        GGUFFile(path)
    message = str(error.value)
    assert f"'blk.0.attn_q.weight' has ggml type {ggml_type.name}, which Pagoda cannot read" in message
    assert "llama-quantize to Q4_K_M, Q5_K_M, Q6_K or Q8_0" in message
    assert "\n" not in message
