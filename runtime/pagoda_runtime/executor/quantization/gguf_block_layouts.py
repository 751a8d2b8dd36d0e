"""How each GGUF block type stores its numbers, and each one's values as w = q * scale + offset.

Every block type Pagoda reads is affine per group of consecutive inputs: a small integer q per
weight, and per group a float32 scale and offset (none for the symmetric types). `affine_blocks`
decodes the stored blocks into exactly that, computing scale and offset with the float32
operations llama.cpp's own dequantizer (and the `gguf` package) uses, so q * scale + offset is
bit for bit their value; dequantization and packing (gguf_blocks.py) both start from it.

| type | bytes per block        | group | w                                            |
|------|------------------------|-------|----------------------------------------------|
| Q4_0 | d, 16 B nibbles        | 32    | d * (q - 8)                                  |
| Q4_1 | d, m, 16 B             | 32    | d * q + m                                    |
| Q5_0 | d, 4 B high bits, 16 B | 32    | d * (q - 16)                                 |
| Q5_1 | d, m, 4 B, 16 B        | 32    | d * q + m                                    |
| Q8_0 | d, 32 int8             | 32    | d * q                                        |
| Q2_K | 16 B scales/mins, 64 B, d, dmin | 16 | d * sc * q - dmin * m (4-bit sc, m)     |
| Q3_K | 32 B high bits, 64 B, 12 B scales, d | 16 | d * (sc - 32) * q, q in -4..3      |
| Q4_K | d, dmin, 12 B scales/mins, 128 B | 32 | d * sc * q - dmin * m (6-bit sc, m)    |
| Q5_K | d, dmin, 12 B, 32 B high bits, 128 B | 32 | as Q4_K with q in 0..31            |
| Q6_K | 128 B low, 64 B high, 16 int8 scales, d | 16 | d * sc * (q - 32)               |

(d, dmin, m: fp16; a K-quant block is 256 weights, the others 32.) Q8_K exists only inside
llama.cpp; the IQ*, TQ* and FP4 types are codebook or ternary formats that are not affine.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np


class GGMLType(IntEnum):
    """Every tensor type ggml defines (ggml.h), so that a file's type is named even where Pagoda
    cannot read it."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39


FLOAT_TYPES = (GGMLType.F32, GGMLType.F16, GGMLType.BF16)
QK_K = 256  # weights in a K-quant super-block

# The types Pagoda reads: (weights per block, bytes per block).
BLOCK_LAYOUT = {
    GGMLType.F32: (1, 4),
    GGMLType.F16: (1, 2),
    GGMLType.BF16: (1, 2),
    GGMLType.Q4_0: (32, 18),
    GGMLType.Q4_1: (32, 20),
    GGMLType.Q5_0: (32, 22),
    GGMLType.Q5_1: (32, 24),
    GGMLType.Q8_0: (32, 34),
    GGMLType.Q2_K: (QK_K, 84),
    GGMLType.Q3_K: (QK_K, 110),
    GGMLType.Q4_K: (QK_K, 144),
    GGMLType.Q5_K: (QK_K, 176),
    GGMLType.Q6_K: (QK_K, 210),
}
# What a file of a type Pagoda cannot read should be converted to: the K-quant mixes people
# download most, all of which Pagoda reads.
CONVERT_TO = "Q4_K_M, Q5_K_M, Q6_K or Q8_0"


def type_name(ggml_type: int) -> str:
    return GGMLType(ggml_type).name if ggml_type in GGMLType._value2member_map_ else f"#{ggml_type}"


def unsupported_type_message(ggml_type: int) -> str:
    readable = ", ".join(t.name for t in BLOCK_LAYOUT)
    return (
        f"ggml type {type_name(ggml_type)}, which Pagoda cannot read (it reads {readable}); "
        f"convert the original weights with llama.cpp's llama-quantize to {CONVERT_TO}, "
        "or download that variant of the model"
    )


@dataclass(frozen=True)
class AffineBlocks:
    """n blocks as q [n, groups, group] (int8, or uint8 where every q >= 0), scale and offset
    float32 [n, groups]; offset None where the type is symmetric (Q4_0's and Q5_0's q is
    already centred: q - 8, q - 16)."""

    q: np.ndarray
    scale: np.ndarray
    offset: np.ndarray | None

    @property
    def group_size(self) -> int:
        return self.q.shape[-1]

    def values(self) -> np.ndarray:
        w = self.q.astype(np.float32) * self.scale[..., None]
        if self.offset is not None:
            w += self.offset[..., None]
        return w.reshape(self.q.shape[0], -1)


def _f16(column: np.ndarray) -> np.ndarray:
    """Bytes [n, 2] -> float32 [n, 1] of the fp16 they hold."""
    return np.ascontiguousarray(column).view("<f2").astype(np.float32)


def _nibbles(packed: np.ndarray, span: int) -> np.ndarray:
    """Bytes [n, ..., span] -> [n, ..., 2, span]: the low nibbles, then the high ones."""
    return np.stack([packed & 0x0F, packed >> 4], axis=-2)


def _bits(packed: np.ndarray, shifts: list[int], mask: int) -> np.ndarray:
    """Bytes [n, ..., span] -> [n, ..., len(shifts), span]: each shift's field."""
    return np.stack([(packed >> s) & mask for s in shifts], axis=-2)


def _high_bits_32(qh: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1: 4 bytes -> [n, 32], bit i (little-endian) as the fifth bit of weight i."""
    return np.unpackbits(qh, axis=-1, bitorder="little") << 4


def _k_scale_min(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: 12 bytes -> eight 6-bit scales and eight 6-bit mins. Bytes 0-3 hold scales 0-3
    (and the top bits of scales 4-7), 4-7 mins 0-3 (and the top bits of mins 4-7), 8-11 the low
    nibbles of scales 4-7 and mins 4-7."""
    d, m, low = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = np.concatenate([d & 0x3F, (low & 0x0F) | ((d >> 2) & 0x30)], axis=1)
    mins = np.concatenate([m & 0x3F, (low >> 4) | ((m >> 2) & 0x30)], axis=1)
    return scales.astype(np.float32), mins.astype(np.float32)


def _legacy(blocks: np.ndarray, ggml_type: GGMLType) -> AffineBlocks:
    n = blocks.shape[0]
    d = _f16(blocks[:, 0:2])
    if ggml_type == GGMLType.Q8_0:
        return AffineBlocks(blocks[:, 2:].view(np.int8).reshape(n, 1, 32), d, None)
    with_min = ggml_type in (GGMLType.Q4_1, GGMLType.Q5_1)
    start = 4 if with_min else 2
    five_bit = ggml_type in (GGMLType.Q5_0, GGMLType.Q5_1)
    # Byte j holds weight j in its low nibble and weight j + 16 in its high one.
    q = _nibbles(blocks[:, start + 4 * five_bit :], 16).reshape(n, 32)
    if five_bit:
        q = q | _high_bits_32(blocks[:, start : start + 4])
    if with_min:
        return AffineBlocks(q.reshape(n, 1, 32), d, _f16(blocks[:, 2:4]))
    zero = 16 if five_bit else 8
    return AffineBlocks((q.astype(np.int8) - zero).reshape(n, 1, 32), d, None)


def _q2_k(blocks: np.ndarray) -> AffineBlocks:
    n = blocks.shape[0]
    packed, qs = blocks[:, 0:16], blocks[:, 16:80]
    d, dmin = _f16(blocks[:, 80:82]), _f16(blocks[:, 82:84])
    # Each half of 128 weights: 32 bytes, four 2-bit fields each; field f of bytes 0-15 is group
    # 2f, of bytes 16-31 group 2f + 1.
    q = _bits(qs.reshape(n, 2, 32), [0, 2, 4, 6], 3).reshape(n, 16, 16)
    scale = d * (packed & 0x0F).astype(np.float32)
    return AffineBlocks(q, scale, -(dmin * (packed >> 4).astype(np.float32)))


def _q3_k(blocks: np.ndarray) -> AffineBlocks:
    n = blocks.shape[0]
    hmask, qs, packed = blocks[:, 0:32], blocks[:, 32:96], blocks[:, 96:108]
    d = _f16(blocks[:, 108:110])
    # Sixteen 6-bit scales: low nibbles in bytes 0-7 (scales 0-7 low, 8-15 high nibble), top two
    # bits in bytes 8-11, two bits per scale.
    low = np.concatenate([packed[:, 0:8] & 0x0F, packed[:, 0:8] >> 4], axis=1)
    high = _bits(packed[:, 8:12], [0, 2, 4, 6], 3).reshape(n, 16)
    scales = (low | (high << 4)).astype(np.float32) - 32
    ql = _bits(qs.reshape(n, 2, 32), [0, 2, 4, 6], 3).reshape(n, 16, 16)
    # The high bit is set for q in 0..3 and clear for q - 4 in -4..-1.
    hbit = _bits(hmask, list(range(8)), 1).reshape(n, 16, 16)
    q = ql.astype(np.int8) - ((hbit ^ 1) << 2).astype(np.int8)
    return AffineBlocks(q, d * scales, None)


def _q45_k(blocks: np.ndarray, five_bit: bool) -> AffineBlocks:
    n = blocks.shape[0]
    d, dmin = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])
    scales, mins = _k_scale_min(blocks[:, 4:16])
    qs = blocks[:, 48:176] if five_bit else blocks[:, 16:144]
    # 32 bytes per pair of groups: group 2i in the low nibbles, group 2i + 1 in the high ones.
    q = _nibbles(qs.reshape(n, 4, 32), 32).reshape(n, 8, 32)
    if five_bit:
        q = q | (_bits(blocks[:, 16:48], list(range(8)), 1) << 4)
    return AffineBlocks(q, d * scales, -(dmin * mins))


def _q6_k(blocks: np.ndarray) -> AffineBlocks:
    n = blocks.shape[0]
    ql, qh = blocks[:, 0:128], blocks[:, 128:192]
    scales = blocks[:, 192:208].view(np.int8).astype(np.float32)
    d = _f16(blocks[:, 208:210])
    # Each half of 128 weights: 64 bytes of low nibbles (weights 0-63 low, 64-127 high) and 32
    # bytes holding two high bits for each of four runs of 32 weights.
    low = _nibbles(ql.reshape(n, 2, 64), 64).reshape(n, 2, 4, 32)
    high = _bits(qh.reshape(n, 2, 32), [0, 2, 4, 6], 3)
    q = (low | (high << 4)).astype(np.int8) - 32
    return AffineBlocks(q.reshape(n, 16, 16), d * scales, None)


_DECODERS = {
    GGMLType.Q4_0: lambda b: _legacy(b, GGMLType.Q4_0),
    GGMLType.Q4_1: lambda b: _legacy(b, GGMLType.Q4_1),
    GGMLType.Q5_0: lambda b: _legacy(b, GGMLType.Q5_0),
    GGMLType.Q5_1: lambda b: _legacy(b, GGMLType.Q5_1),
    GGMLType.Q8_0: lambda b: _legacy(b, GGMLType.Q8_0),
    GGMLType.Q2_K: _q2_k,
    GGMLType.Q3_K: _q3_k,
    GGMLType.Q4_K: lambda b: _q45_k(b, five_bit=False),
    GGMLType.Q5_K: lambda b: _q45_k(b, five_bit=True),
    GGMLType.Q6_K: _q6_k,
}
# Blocks decoded at a time: a few MiB of temporaries whatever the tensor's size.
_CHUNK_WEIGHTS = 1 << 20


def affine_blocks(raw: np.ndarray, ggml_type: int) -> AffineBlocks:
    """Stored bytes of whole blocks of a quantized type -> their AffineBlocks."""
    ggml_type = GGMLType(ggml_type)
    return _DECODERS[ggml_type](raw.reshape(-1, BLOCK_LAYOUT[ggml_type][1]))


def block_chunks(raw: np.ndarray, ggml_type: int):
    """(first weight, AffineBlocks) for successive runs of blocks, so that a large tensor is
    decoded in pieces of bounded size."""
    elements, block_bytes = BLOCK_LAYOUT[GGMLType(ggml_type)]
    blocks = raw.reshape(-1, block_bytes)
    step = max(1, _CHUNK_WEIGHTS // elements)
    for start in range(0, blocks.shape[0], step):
        yield start * elements, affine_blocks(blocks[start : start + step], ggml_type)


def dequantize_blocks(raw: np.ndarray, ggml_type: int) -> np.ndarray:
    """Stored bytes of one type -> a fresh flat float32 array, never a view of `raw`."""
    ggml_type = GGMLType(ggml_type)
    if ggml_type == GGMLType.F32:
        return raw.view("<f4").copy()
    if ggml_type == GGMLType.F16:
        return raw.view("<f2").astype(np.float32)
    if ggml_type == GGMLType.BF16:
        # bf16 is the top half of a float32.
        return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
    elements, block_bytes = BLOCK_LAYOUT[ggml_type]
    out = np.empty(raw.size // block_bytes * elements, dtype=np.float32)
    for start, chunk in block_chunks(raw, ggml_type):
        values = chunk.values().reshape(-1)
        out[start : start + values.size] = values
    return out
