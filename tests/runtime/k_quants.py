"""Float weights -> GGUF Q4_K, Q5_K and Q6_K blocks, for building test files.

The `gguf` package dequantizes every K-quant but quantizes none of them, so tests that need a
K-quant file of known weights quantize here: min/max scales rather than llama.cpp's search for the
best ones, but the same bytes on disk, so anything that reads llama.cpp's files reads these (the
tests check them against gguf's dequantizer). `random_blocks` gives blocks of arbitrary bits for
the layouts this cannot write (every bit pattern is a valid block once the fp16 scales are finite).
"""

from __future__ import annotations

import numpy as np

QK_K = 256


def _f16_bytes(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).reshape(-1, 1).view(np.uint8)


def _ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(denominator == 0, 0.0, numerator / denominator)


def _quantize_q45_k(rows: np.ndarray, levels: int) -> np.ndarray:
    """Q4_K (levels 15) or Q5_K (31): per super-block an fp16 d and dmin, per group of 32 a 6-bit
    scale and min, w = d * sc * q - dmin * m."""
    n, k = rows.shape
    x = rows.astype(np.float32).reshape(-1, 8, 32)
    low = np.minimum(x.min(axis=2), 0.0)
    scale = (x.max(axis=2) - low) / levels
    d = (scale.max(axis=1) / 63).astype(np.float16)
    dmin = (-low.min(axis=1) / 63).astype(np.float16)
    sc = np.clip(np.rint(_ratio(scale, d.astype(np.float32)[:, None])), 0, 63).astype(np.uint8)
    m = np.clip(np.rint(_ratio(-low, dmin.astype(np.float32)[:, None])), 0, 63).astype(np.uint8)
    step = d.astype(np.float32)[:, None] * sc
    shift = dmin.astype(np.float32)[:, None] * m
    q = np.clip(np.rint(_ratio(x + shift[..., None], step[..., None])), 0, levels).astype(np.uint8)
    packed = np.concatenate(
        [
            (sc[:, :4] & 0x3F) | ((sc[:, 4:] >> 4) << 6),
            (m[:, :4] & 0x3F) | ((m[:, 4:] >> 4) << 6),
            (sc[:, 4:] & 0x0F) | ((m[:, 4:] & 0x0F) << 4),
        ],
        axis=1,
    )
    # Byte l of pair p: group 2p's weight l in the low nibble, group 2p + 1's in the high one.
    pairs = (q & 0x0F).reshape(-1, 4, 2, 32)
    qs = (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(-1, 128)
    fields = [_f16_bytes(d), _f16_bytes(dmin), packed]
    if levels == 31:
        # Bit j of byte l: the fifth bit of group j's weight l.
        fields.append(np.bitwise_or.reduce((q >> 4) << np.arange(8, dtype=np.uint8)[:, None], axis=1))
    blocks = np.concatenate([*fields, qs], axis=1)
    return blocks.reshape(n, -1)


def quantize_q4_k(rows: np.ndarray) -> np.ndarray:
    """[N, K] float, K a multiple of 256 -> uint8 [N, K // 256 * 144]."""
    return _quantize_q45_k(rows, 15)


def quantize_q5_k(rows: np.ndarray) -> np.ndarray:
    """[N, K] float, K a multiple of 256 -> uint8 [N, K // 256 * 176]."""
    return _quantize_q45_k(rows, 31)


def quantize_q6_k(rows: np.ndarray) -> np.ndarray:
    """[N, K] float, K a multiple of 256 -> uint8 [N, K // 256 * 210]."""
    n, k = rows.shape
    x = rows.astype(np.float32).reshape(-1, 16, 16)
    scale = np.abs(x).max(axis=2) / 31
    d = (scale.max(axis=1) / 127).astype(np.float16)
    sc = np.clip(np.rint(_ratio(scale, d.astype(np.float32)[:, None])), -128, 127).astype(np.int8)
    step = d.astype(np.float32)[:, None] * sc
    q = np.clip(np.rint(_ratio(x, step[..., None])), -32, 31).astype(np.int16) + 32
    u = q.astype(np.uint8).reshape(-1, 2, 128)
    low = u & 0x0F
    ql = (low[:, :, :64] | (low[:, :, 64:] << 4)).reshape(-1, 128)
    high = (u >> 4).reshape(-1, 2, 4, 32)
    qh = (high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)).reshape(-1, 64)
    blocks = np.concatenate([ql, qh, sc.view(np.uint8), _f16_bytes(d)], axis=1)
    return blocks.reshape(n, -1)


K_QUANTIZERS = {"Q4_K": quantize_q4_k, "Q5_K": quantize_q5_k, "Q6_K": quantize_q6_k}

# Where each block type keeps its fp16 scales (d, and dmin where it has one): byte offsets.
_F16_FIELDS = {
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q8_0": (0,),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
}


def random_blocks(type_name: str, count: int, block_bytes: int, seed: int) -> np.ndarray:
    """uint8 [count, block_bytes] of random bits with finite fp16 scales of a weight's magnitude."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(count, block_bytes), dtype=np.uint8)
    for offset in _F16_FIELDS[type_name]:
        scales = rng.uniform(1e-4, 2e-3, count) * rng.choice([-1, 1], count)
        blocks[:, offset : offset + 2] = _f16_bytes(scales)
    return blocks
