"""Triton helpers the kernels share: dots and bf16 rounding that Triton's interpreter computes as
the GPU does, and e4m3 (fp8) values widened to bf16 or fp16 in registers, exactly (the fp8 weight
matmul in quantization/triton_mma.py and paged attention over an fp8 KV cache).

The interpreter multiplies 16-bit float dot operands as their raw bits and truncates float32 to
bf16: `dot` widens the operands to float32 there (exact: their products are float32 numbers) and
`rounded` rounds to nearest even on the bits. On the GPU both are Triton's own operations.

Triton's own e4m3 -> bf16 conversion goes through f16 and then a conversion instruction per value
on a slow unit (F2F); `fp8_widened` is four integer and bf16 instructions per pair of values. Its
PTX is passed to the kernels as a constexpr (`fp8_asm`): a kernel cannot read a Python global.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# PTX for four e4m3 bytes in $2 -> two bf16x2 registers. A permute builds each 16-bit lane from a
# byte and its sign replicated above it, SSSSSSSS s eeee mmm; shifted left by four, the lane holds
# the sign at bit 15 and exponent and mantissa at bf16's bits 10-4, and the mask clears the rest.
# bf16's exponent bias is 127 against e4m3's 7: the product with 2**120 rebiases, exactly
# (e4m3's subnormals land on bf16's, which the multiplication keeps).
FP8_TO_BF16_ASM = """{
.reg .b32 t, two120;
mov.b32 two120, 0x7B807B80;
prmt.b32 t, $2, 0, 0x9180;
shl.b32 t, t, 4;
and.b32 t, t, 0x87F087F0;
mul.rn.bf16x2 $0, t, two120;
prmt.b32 t, $2, 0, 0xB3A2;
shl.b32 t, t, 4;
and.b32 t, t, 0x87F087F0;
mul.rn.bf16x2 $1, t, two120;
}"""
FP8_TO_FP16_ASM = """{
.reg .b16 lo, hi;
mov.b32 {lo, hi}, $2;
cvt.rn.f16x2.e4m3x2 $0, lo;
cvt.rn.f16x2.e4m3x2 $1, hi;
}"""


@triton.jit
def dot(a, b, acc, INTERPRETED: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """acc + a @ b with a widened to b's dtype."""
    if INTERPRETED:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a.to(b.dtype), b, acc, input_precision=DOT_PRECISION)


@triton.jit
def rounded(x, DTYPE: tl.constexpr, INTERPRETED: tl.constexpr):
    """float32 x in DTYPE, rounded to nearest even as the GPU converts (finite x)."""
    if INTERPRETED and tl.bfloat16 == DTYPE:
        bits = x.to(tl.int32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return bits.to(tl.int16).to(tl.bfloat16, bitcast=True)
    return x.to(DTYPE)


def fp8_asm(dtype: torch.dtype) -> str:
    """The widening PTX for activations (or queries) of `dtype`."""
    return FP8_TO_FP16_ASM if dtype == torch.float16 else FP8_TO_BF16_ASM


@triton.jit
def fp8_widened(w, DTYPE: tl.constexpr, ASM: tl.constexpr, INTERPRETED: tl.constexpr):
    """An e4m3 tensor -> the same values in DTYPE (bf16 or fp16), exactly."""
    if INTERPRETED:
        return w.to(tl.float32).to(DTYPE)
    return tl.inline_asm_elementwise(
        asm=ASM.value,
        constraints="=r,=r,r",
        args=[w],
        dtype=DTYPE.value,
        is_pure=True,
        pack=4,
    )
