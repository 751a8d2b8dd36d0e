"""GGUF Q4_0, Q4_1 and Q8_0 blocks -> PackedWeight, without going through floats.

A block covers 32 consecutive inputs of one row: Q8_0 is an fp16 scale d and 32 int8 (w = d*q);
Q4_0 is d and 16 bytes of nibbles (w = d*(q - 8)); Q4_1 is d, an fp16 minimum m and 16 bytes
(w = d*q + m). In the 4-bit blocks byte j holds input j in its low nibble and input j + 16 in its
high nibble. So Q8_0 becomes int8 in groups of 32, and both 4-bit types become int4 in groups of
32 with offset -8d (Q4_0) or m (Q4_1); the fp16 scales and minimums are kept bit for bit.
"""

from __future__ import annotations

import numpy as np
import torch

from pagoda_runtime.executor.quantization.packed import PackedWeight, pack_int4

GGUF_BLOCK = 32
# ggml type ids (ggml.h) and the bytes of one block.
Q4_0, Q4_1, Q8_0 = 2, 3, 8
_BLOCK_BYTES = {Q4_0: 18, Q4_1: 20, Q8_0: 34}
BLOCK_NAMES = {Q4_0: "Q4_0", Q4_1: "Q4_1", Q8_0: "Q8_0"}  # as sizing.GGUF_BLOCK_FORMATS names them


def is_packable(ggml_type: int) -> bool:
    return ggml_type in _BLOCK_BYTES


def gguf_to_packed(raw: np.ndarray, ggml_type: int, shape: tuple[int, int]) -> PackedWeight:
    """The stored bytes of a [N, K] tensor of one of the block types -> PackedWeight."""
    if ggml_type not in _BLOCK_BYTES:
        raise ValueError(
            f"GGUF tensors of ggml type {ggml_type} cannot be kept quantized (Pagoda keeps "
            f"{', '.join(BLOCK_NAMES.values())}); convert the file with llama.cpp's quantize to Q4_1 or Q8_0"
        )
    n, k = shape
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(n, k // GGUF_BLOCK, _BLOCK_BYTES[ggml_type])
    scales = torch.from_numpy(blocks[..., 0:2].copy().view(np.float16)[..., 0])
    if ggml_type == Q8_0:
        q = torch.from_numpy(blocks[..., 2:].copy().view(np.int8)).reshape(n, k)
        return PackedWeight("int8", q, scales, GGUF_BLOCK)
    if ggml_type == Q4_1:
        offsets = torch.from_numpy(blocks[..., 2:4].copy().view(np.float16)[..., 0])
        nibble_bytes = blocks[..., 4:]
    else:
        offsets = scales * -8  # exact in fp16: a power-of-two multiple
        nibble_bytes = blocks[..., 2:]
    nibbles = torch.from_numpy(np.concatenate([nibble_bytes & 0x0F, nibble_bytes >> 4], axis=-1))
    return PackedWeight("int4", pack_int4(nibbles.reshape(n, k)), scales, GGUF_BLOCK, offsets)
