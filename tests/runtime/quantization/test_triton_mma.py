"""The tensor-core kernel for decode-sized batches (quantization/triton_mma.py) computes what the
dequantized weight computes, in Triton's interpreter here (compiled on a GPU): every weight kind,
awkward shapes (N not a multiple of the tile, K not a multiple of the tile or the planes' span,
groups smaller than the tile), 1, 3, 16 and 17 rows, bf16 / fp16 / float32 activations. Its inline
PTX, which the interpreter cannot run, is emulated instruction by instruction on every input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pagoda_runtime.executor.quantization import dispatch
from pagoda_runtime.executor.quantization.online import quantize_fp8, quantize_int4, quantize_int8
from pagoda_runtime.executor.quantization.packed import PackedWeight, dequantize
from pagoda_runtime.executor.quantization.triton_mma import (
    MmaConfig,
    block_m_for,
    dense_mma_weight,
    dequantize_mma,
    int4_plane_asm,
    mma_matmul,
    to_mma_layout,
)
from pagoda_runtime.executor.triton_helpers import FP8_TO_BF16_ASM, FP8_TO_FP16_ASM

from . import ptx_emulator


def _int8_groups(weight: torch.Tensor, group: int) -> PackedWeight:
    """int8 in groups with fp16 scales, as GGUF Q8_0 (32) and Q6_K (16) are held."""
    n, k = weight.shape
    groups = weight.reshape(n, k // group, group)
    scales = (groups.abs().amax(dim=2) / 127).half()
    q = torch.round(groups / scales.float()[..., None]).clamp(-127, 127).to(torch.int8).reshape(n, k)
    return PackedWeight("int8", q, scales, group)


# name -> (quantizer, in_features): K = 200 is no multiple of a 128-input tile; int4's 224 inputs in
# groups of 32 are no multiple of its four planes' 128 and are padded; 96 leaves a step half empty.
WEIGHTS = {
    "int8 per channel": (quantize_int8, 200),
    "int8 groups of 32": (lambda w: _int8_groups(w, 32), 96),
    "int8 groups of 16": (lambda w: _int8_groups(w, 16), 96),
    "fp8 per channel": (quantize_fp8, 200),
    "int4 groups of 32, padded": (lambda w: quantize_int4(w, 32), 224),
    "int4 groups of 64": (lambda w: quantize_int4(w, 64), 256),
}
ROWS = [1, 3, 16, 17]


def _bf16_ulp(x: torch.Tensor) -> torch.Tensor:
    exponent = torch.floor(torch.log2(x.abs().clamp_min(1e-30)))
    return torch.exp2(exponent - 7)


def _assert_rounded_reference(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    """out is the float32 product x @ w^T rounded once to out's dtype, up to float32 rounding."""
    ref = x.double() @ w.double().t()
    slack = 2e-6 * (x.double().abs() @ w.double().abs().t())
    if out.dtype == torch.float32:
        assert ((out.double() - ref).abs() <= slack).all()
        return
    ulp = (
        _bf16_ulp(ref) if out.dtype == torch.bfloat16 else torch.exp2(torch.floor(torch.log2(ref.abs())) - 10)
    )
    assert ((out.double() - ref).abs() <= ulp / 2 + slack).all()
    assert (out == ref.to(out.dtype)).float().mean() > 0.95


@pytest.mark.parametrize("name", list(WEIGHTS))
@pytest.mark.parametrize("rows", ROWS)
def test_each_kind_matches_the_dequantized_reference(name: str, rows: int) -> None:
    quantize, k = WEIGHTS[name]
    torch.manual_seed(rows)
    packed = quantize(torch.randn(40, k))  # 40 outputs: a partial last tile
    x = torch.randn(rows, k, dtype=torch.bfloat16)
    out = mma_matmul(x, to_mma_layout(packed), MmaConfig(block_n=16, block_m=block_m_for(rows)))
    assert out.dtype == torch.bfloat16 and out.shape == (rows, 40)
    _assert_rounded_reference(out, x.float(), dequantize(packed))


@pytest.mark.parametrize("name", ["int8 per channel", "fp8 per channel", "int4 groups of 64"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_half_and_single_precision_activations(name: str, dtype: torch.dtype) -> None:
    quantize, k = WEIGHTS[name]
    torch.manual_seed(7)
    packed = quantize(torch.randn(24, k))
    x = torch.randn(3, k).to(dtype)
    out = mma_matmul(x, to_mma_layout(packed), MmaConfig(block_n=16, block_m=8))
    assert out.dtype == dtype
    _assert_rounded_reference(out, x.float(), dequantize(packed))


def _awq(n: int, k: int, group: int) -> PackedWeight:
    from pagoda_runtime.executor.quantization.hf_checkpoints import awq_to_packed

    words = lambda *shape: torch.randint(-(2**31), 2**31 - 1, shape, dtype=torch.int32)  # noqa: E731
    return awq_to_packed(
        words(k, n // 8), words(k // group, n // 8), torch.rand(k // group, n).half() / 50, group
    )


def _gguf_q4_0(n: int, k: int) -> PackedWeight:
    from pagoda_runtime.executor.quantization.gguf_block_layouts import GGMLType
    from pagoda_runtime.executor.quantization.gguf_blocks import gguf_to_packed

    blocks = np.random.default_rng(0).integers(0, 256, (n, k // 32, 18), dtype=np.uint8)
    blocks[..., :2] = np.full((n, k // 32, 1), 0.01, np.float16).view(np.uint8)  # each block's scale
    return gguf_to_packed(blocks.reshape(-1), GGMLType.Q4_0, (n, k))


@pytest.mark.parametrize("checkpoint", ["awq", "gguf q4_0"])
def test_int4_checkpoint_formats_run_through_the_same_kernel(checkpoint: str) -> None:
    packed = _awq(48, 256, 64) if checkpoint == "awq" else _gguf_q4_0(48, 256)
    x = torch.randn(3, 256, dtype=torch.bfloat16)
    out = mma_matmul(x, to_mma_layout(packed), MmaConfig(block_n=16, block_m=8))
    _assert_rounded_reference(out, x.float(), dequantize(packed))


def test_wider_tiles_more_warps_and_rows_beyond_one_program() -> None:
    torch.manual_seed(3)
    packed = quantize_int4(torch.randn(72, 256), 64)
    x = torch.randn(37, 256, dtype=torch.bfloat16)  # two programs of 32 rows, the second partial
    out = mma_matmul(x, to_mma_layout(packed), MmaConfig(block_n=32, block_m=32, num_warps=2, num_stages=2))
    _assert_rounded_reference(out, x.float(), dequantize(packed))


def test_unquantized_weights_run_through_the_same_kernel() -> None:
    torch.manual_seed(5)
    weight = torch.randn(40, 200, dtype=torch.bfloat16)
    x = torch.randn(1, 200, dtype=torch.bfloat16)
    _assert_rounded_reference(mma_matmul(x, dense_mma_weight(weight)), x.float(), weight.float())


@pytest.mark.parametrize("name", list(WEIGHTS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_dequantizing_the_relaid_weight_is_bit_exact(name: str, dtype: torch.dtype) -> None:
    quantize, k = WEIGHTS[name]
    packed = quantize(torch.randn(40, k))
    assert torch.equal(dequantize_mma(to_mma_layout(packed), dtype), dequantize(packed, dtype))


def test_int4_relayout_keeps_the_bytes_and_follows_a_tensor_parallel_slice() -> None:
    torch.manual_seed(11)
    packed = quantize_int4(torch.randn(64, 512), 128)
    relaid = to_mma_layout(packed)
    assert relaid.qweight.numel() * relaid.qweight.element_size() == packed.qweight.numel()
    # A row-parallel shard keeps half the inputs (whole groups), a column-parallel one half the rows.
    shard = packed.columns(slice(256, 512)).rows(slice(0, 32))
    x = torch.randn(2, 256, dtype=torch.bfloat16)
    out = mma_matmul(x, to_mma_layout(shard), MmaConfig(block_n=16, block_m=8))
    _assert_rounded_reference(out, x.float(), dequantize(shard))


def _words(values: np.ndarray) -> np.ndarray:
    """Pairs of 16-bit inputs as the 32-bit registers inline assembly with pack=2 receives."""
    return values[0::2].astype(np.uint32) | (values[1::2].astype(np.uint32) << 16)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_int4_plane_assembly_gives_each_nibble_minus_8_for_every_word(dtype: torch.dtype) -> None:
    words = np.arange(2**16, dtype=np.uint32)
    regs = ptx_emulator.run(int4_plane_asm(dtype), {"$4": _words(words)})
    for plane in range(4):
        out = regs[f"${plane}"]
        halves = np.stack([out & 0xFFFF, out >> 16], axis=1).reshape(-1).astype(np.uint16)
        got = torch.from_numpy(halves.view(np.int16)).view(dtype).float()
        expected = torch.from_numpy(((words >> (4 * plane)) & 0xF).astype(np.float32)) - 8
        assert torch.equal(got, expected)


@pytest.mark.parametrize("dtype,asm", [(torch.bfloat16, FP8_TO_BF16_ASM), (torch.float16, FP8_TO_FP16_ASM)])
def test_fp8_assembly_widens_every_e4m3_value_exactly(dtype: torch.dtype, asm: str) -> None:
    codes = np.arange(256, dtype=np.uint8)
    codes = codes[(codes & 0x7F) != 0x7F]  # e4m3's NaNs; a quantized weight is never NaN
    codes = np.concatenate([codes, np.zeros((-len(codes)) % 4, np.uint8)])
    packed = codes.reshape(-1, 4).view(np.uint32)[:, 0]
    regs = ptx_emulator.run(asm, {"$2": packed})
    halves = np.stack([regs["$0"] & 0xFFFF, regs["$0"] >> 16, regs["$1"] & 0xFFFF, regs["$1"] >> 16], axis=1)
    got = torch.from_numpy(halves.reshape(-1).astype(np.uint16).view(np.int16)).view(dtype)
    expected = torch.from_numpy(codes).view(torch.float8_e4m3fn).to(dtype)
    assert torch.equal(got.view(torch.int16), expected.view(torch.int16))


def test_every_kind_has_a_route_for_every_batch() -> None:
    for kind in ("dense", "int8", "fp8", "int4"):
        for rows in (1, 2, 4, 8, 16, 17, 32, 64, 65, 4096):
            plan = dispatch.route(kind, rows, 6144, 4096)
            assert plan.path in dispatch.PATHS
            if plan.path == "mma":
                assert plan.config.block_m >= min(rows, 8) or rows > 64
    assert dispatch.route("int8", 1, 4096, 4096).path == "mma"
    assert dispatch.int4_layout(4096, 4096) in ("mma", "tinygemm")


def test_a_table_naming_an_unknown_path_is_refused(tmp_path) -> None:
    table = tmp_path / "table.json"
    table.write_text('{"routes": {"int8": [{"path": "magic"}]}}')
    with pytest.raises(ValueError, match="unknown path 'magic'"):
        dispatch.load_table(table)


def test_a_layer_packed_for_the_gpu_kernels_keeps_its_bytes_and_its_product() -> None:
    from pagoda_runtime.executor.quantization.linear import make_linear
    from pagoda_runtime.executor.quantization.memory import linear_weight_bytes

    torch.manual_seed(2)
    layer = make_linear(256, 48, False, "int4", dtype=torch.bfloat16)
    layer.load(torch.randn(48, 256))
    packed, stored = layer.weight, linear_weight_bytes(torch.nn.ModuleList([layer]))
    layer.pack_for_gpu()  # the interpreter runs the GPU kernels on the CPU
    assert layer.qweight is None and linear_weight_bytes(torch.nn.ModuleList([layer])) == stored
    x = torch.randn(3, 256, dtype=torch.bfloat16)
    _assert_rounded_reference(layer(x), x.float(), dequantize(packed))


gpu = pytest.mark.gpu


@gpu
@pytest.mark.parametrize("method", ["int8", "int4", "fp8", "gguf-q8_0"])
@pytest.mark.parametrize("rows", [1, 4, 16, 17, 64, 256])
def test_packed_layer_on_cuda_matches_the_reference_on_every_route(method: str, rows: int) -> None:
    from pagoda_runtime.executor.quantization.linear import make_linear

    layer = make_linear(4096, 6144, False, "int8" if method == "gguf-q8_0" else method, device="cuda")
    dense = torch.randn(6144, 4096, device="cuda", dtype=torch.bfloat16) * 0.02
    layer.load(_int8_groups(dense.float(), 32) if method == "gguf-q8_0" else dense)
    packed = layer.weight
    layer.pack_for_gpu()
    x = torch.randn(rows, 4096, device="cuda", dtype=torch.bfloat16)
    ref = x.float() @ dequantize(packed).t()
    out = layer(x)
    plan = dispatch.route(packed.kind, rows, 6144, 4096)
    if plan.path == "mma":
        _assert_rounded_reference(out, x.float(), dequantize(packed))
    else:  # cuBLAS on bf16 weights, or fp8 activations through torch._scaled_mm
        bound = 5e-2 if plan.path == "scaled_mm" else 1e-2
        assert float((out.float() - ref).norm() / ref.norm()) < bound


@gpu
@pytest.mark.parametrize("rows", [1, 3, 16])
def test_dense_batch_one_kernel_on_cuda_matches_cublas(rows: int) -> None:
    weight = torch.randn(6144, 4096, device="cuda", dtype=torch.bfloat16) * 0.02
    x = torch.randn(rows, 4096, device="cuda", dtype=torch.bfloat16)
    _assert_rounded_reference(mma_matmul(x, dense_mma_weight(weight)), x.float(), weight.float())


@gpu
def test_tinygemm_int4_layout_on_cuda_matches_the_reference() -> None:
    from pagoda_runtime.executor.quantization.gpu_packed import TinygemmInt4Weight

    packed = quantize_int4(torch.randn(4096, 4096, device="cuda") * 0.02, 128)
    x = torch.randn(4, 4096, device="cuda", dtype=torch.bfloat16)
    ref = x.float() @ dequantize(packed).t()
    out = TinygemmInt4Weight(packed)(x)
    # Its scales and zero points are bf16 (ours fp16): close, not equal.
    assert float((out.float() - ref).norm() / ref.norm()) < 1e-2
