"""GGUF blocks -> PackedWeight, without going through the float weights.

Each block type's affine form (gguf_block_layouts.py) maps onto one of the runtime's layouts,
which sizing.GGUF_BLOCK_FORMATS names: int4 in groups of 32 with a scale and offset per group
(Q4_0: offset -8d; Q4_1: m; Q4_K: scale d * sc, offset -dmin * m per sub-block of 32), int8 in
groups of 32 (Q8_0; Q5_0 as q - 16 with scale d) and int8 in groups of 16 (Q6_K: q - 32, scale
d * sc). Scales and offsets are held in fp16: exact for the legacy types (their d and m are fp16),
rounded for the K-quants, whose d * sc needs up to 19 significant bits. That rounding moves a
weight by at most 2^-11 of its scale and offset (measured on Gaussian weights: 0.9% of the block
type's own quantization error, below what bf16 activations round away); fp32 would keep them
exact at 1 more bit per weight, 20% more bytes for a Q4_K layer to stream at every decode step.
The other types (Q5_1, Q2_K, Q3_K, Q5_K) have no packed layout and are dequantized at load.
"""

from __future__ import annotations

import numpy as np
import torch

from pagoda_runtime.contract.sizing import GGUF_BLOCK_FORMATS
from pagoda_runtime.executor.quantization.gguf_block_layouts import FLOAT_TYPES, block_chunks, type_name
from pagoda_runtime.executor.quantization.packed import PackedWeight, pack_int4


def is_packable(ggml_type: int) -> bool:
    return type_name(ggml_type) in GGUF_BLOCK_FORMATS


def gguf_main_type(projections: dict[str, tuple[int, int]]) -> str | None:
    """The block type most of a file's projection weights are stored in, from each projection's
    (ggml type, weights); None when every projection is stored as floats."""
    if all(ggml_type in FLOAT_TYPES for ggml_type, _ in projections.values()):
        return None
    weights: dict[str, int] = {}
    for ggml_type, count in projections.values():
        weights[type_name(ggml_type)] = weights.get(type_name(ggml_type), 0) + count
    return max(weights, key=weights.get)


def gguf_to_packed(raw: np.ndarray, ggml_type: int, shape: tuple[int, int]) -> PackedWeight:
    """The stored bytes of a [N, K] tensor of one of the packable block types -> PackedWeight."""
    name = type_name(ggml_type)
    if name not in GGUF_BLOCK_FORMATS:
        raise ValueError(
            f"GGUF tensors of type {name} have no packed layout (Pagoda packs "
            f"{', '.join(GGUF_BLOCK_FORMATS)}); dequantize the file with --quantization none"
        )
    fmt = GGUF_BLOCK_FORMATS[name]
    int4 = fmt.bits == 4
    n, k = shape
    q = np.empty(n * k, dtype=np.uint8 if int4 else np.int8)
    scales = np.empty(n * k // fmt.group_size, dtype=np.float16)
    offsets = np.empty_like(scales) if int4 else None
    for start, chunk in block_chunks(np.ascontiguousarray(raw, dtype=np.uint8), ggml_type):
        values, scale = chunk.q.reshape(-1), chunk.scale.reshape(-1)
        groups = slice(start // fmt.group_size, start // fmt.group_size + scale.size)
        with np.errstate(over="ignore"):
            scales[groups] = scale
            if int4 and chunk.offset is None:
                # A centred q (Q4_0's q - 8) moves back to 0..15, its zero into the offset.
                values = values + 8
                offsets[groups] = scale * -8
            elif int4:
                offsets[groups] = chunk.offset.reshape(-1)
        held = scales[groups] if offsets is None else np.concatenate([scales[groups], offsets[groups]])
        if not np.isfinite(held).all() and np.isfinite(scale).all():
            raise ValueError(
                f"this {name} tensor has scales beyond fp16's range, which Pagoda holds its "
                "packed scales in; serve the file with --quantization none"
            )
        q[start : start + values.size] = values.astype(q.dtype)
    scales_t = torch.from_numpy(scales.reshape(n, -1))
    if not int4:
        return PackedWeight("int8", torch.from_numpy(q.reshape(n, k)), scales_t, fmt.group_size)
    qweight = pack_int4(torch.from_numpy(q.reshape(n, k)))
    return PackedWeight("int4", qweight, scales_t, fmt.group_size, torch.from_numpy(offsets.reshape(n, -1)))
