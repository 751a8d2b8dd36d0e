"""Matmuls of a few activation rows (decode, small chunks) on the tensor cores, with the weights
read in their stored width and widened in registers: the Marlin design, written in Triton.

Each program owns BLOCK_N output channels and BLOCK_M activation rows and walks the whole input
dimension (no split-K, so one kernel per matmul and no reduction pass). The product is computed
transposed, y^T = W x^T: the weight tile is the MMA's A operand (16 rows per instruction) and the
activations its B operand, whose narrow side may be 8, so a decode batch of 1 to 8 rows pads to 8
rather than to 16. Triton stages both tiles through shared memory with cp.async, `num_stages` deep,
and loads them in the MMA's operand layout; the widening then happens in those registers:

- int8: Triton's own exact byte-to-bf16 sequence (a byte permute, two masks and a bf16
  subtraction per pair of weights).
- fp8 e4m3, bf16 activations: the byte moved into a bf16's exponent and mantissa bits and
  multiplied by 2**120 (the two formats' exponent bias apart), which is exact, subnormals
  included: four integer and bf16 instructions per pair of weights, where Triton's own conversion
  goes through f16 and a slow f16 -> bf16 instruction per weight. fp16 activations: the hardware's
  e4m3x2 -> f16x2 conversion.
- int4: re-laid at load (`to_mma_layout`) so that each 16-bit word holds the same input position
  of four consecutive chunks of CHUNK inputs (nibble p of word j of chunk c is input
  c * 4 * CHUNK + p * CHUNK + j). A shift, a LOP3 and a subtraction per pair of words then turn a
  nibble plane into MMA operands: OR-ing q into the mantissa of 128.0 (bf16) or 1024.0 (fp16)
  gives MAGIC + q exactly, and subtracting MAGIC + 8 leaves q - 8, exactly, without an
  integer-to-float conversion. The group's scale and offset come in float32 once per group:
  x . (q * s + o) = s * x . (q - 8) + (o + 8 * s) * sum(x), with sum(x) from a second MMA against
  ones.

Scales and offsets are applied to float32 partial products once per group (or once per row for
per-channel scales), never rounded into the weights, so the result is the dequantized reference's
up to float32 rounding. bf16 weights (DenseLinear) run through the same kernel without widening:
one kernel where cuBLAS splits K into a second reduction kernel at batch 1.

In Triton's interpreter (no GPU) the int4 planes are computed arithmetically (inline assembly
cannot be interpreted) and dots and roundings go through triton_helpers.py. Both are exact, so the
interpreter computes the same numbers; test_triton_mma.py emulates the assembly instruction by
instruction.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from pagoda_runtime.executor.quantization.packed import PackedWeight, unpack_int4
from pagoda_runtime.executor.triton_helpers import dot, fp8_asm, fp8_widened, rounded
from pagoda_runtime.executor.triton_mode import INTERPRETED, dot_precision

KINDS = ("dense", "int8", "fp8", "int4")
_KIND_IDS = {kind: i for i, kind in enumerate(KINDS)}
PLANES = 4  # int4: nibble planes per 16-bit word
MAX_CHUNK = 128
MIN_CHUNK = 16  # the MMA's K step
# bf16 / fp16 bits of MAGIC (a float whose last mantissa bits hold q exactly) and of MAGIC + 8.
MAGIC_BITS = {torch.bfloat16: (0x4300, 0x4308), torch.float16: (0x6400, 0x6408)}


def int4_plane_asm(dtype: torch.dtype) -> str:
    """PTX for two int16 words in $4 -> four registers of two 16-bit floats (bf16 or fp16), nibble p
    of each word minus 8 in $p. Shifting the 32-bit pair moves both words' nibbles at once; the mask
    keeps one nibble per half and the OR writes MAGIC's exponent over it (LOP3 0xEA: (a & b) | c);
    the subtraction of MAGIC + 8 is exact."""
    magic, biased = (f"0x{bits:04X}{bits:04X}" for bits in MAGIC_BITS[dtype])
    sub = "sub.rn.bf16x2" if dtype == torch.bfloat16 else "sub.rn.f16x2"
    lines = ["{", ".reg .b32 t, m;", f"mov.b32 m, {biased};"]
    for plane in range(PLANES):
        source = "$4"
        if plane:
            lines.append(f"shr.u32 t, $4, {4 * plane};")
            source = "t"
        lines += [f"lop3.b32 t, {source}, 0x000F000F, {magic}, 0xEA;", f"{sub} ${plane}, t, m;"]
    return "\n".join(lines + ["}"])


@dataclass(frozen=True)
class MmaConfig:
    block_n: int = 16  # output channels per program (a multiple of 16: the MMA's A rows)
    block_m: int = 8  # activation rows per program (8, 16, 32 or 64)
    chunk: int = 128  # inputs per MMA operand tile (int4: fixed by the layout; groups cap it)
    tiles: int = 2  # operand tiles per loop step, dense / int8 / fp8 (int4: always its 4 planes)
    num_warps: int = 1
    num_stages: int = 4


@dataclass(frozen=True)
class MmaWeight:
    """A weight as the kernel reads it. dense / int8 / fp8: `qweight` [N, K] as stored; int4: int16
    [N, K_pad // 4], nibble planes of CHUNK inputs (see the module docstring). `scales` (and
    int4's `offsets`) are [groups, N], transposed so that a program's channels are contiguous."""

    kind: str
    qweight: torch.Tensor
    scales: torch.Tensor | None
    offsets: torch.Tensor | None
    in_features: int
    group_size: int
    chunk: int = 0  # int4 only

    @property
    def out_features(self) -> int:
        return self.qweight.shape[0]

    @property
    def per_channel(self) -> bool:
        return self.group_size >= self.in_features


def dense_mma_weight(weight: torch.Tensor) -> MmaWeight:
    """An unquantized [N, K] weight (in the activations' dtype), read in place."""
    return MmaWeight("dense", weight, None, None, weight.shape[1], weight.shape[1])


def int4_chunk(in_features: int, group_size: int) -> int:
    """The largest power of two up to min(group, 128) whose four planes tile the row exactly, so that
    the re-laid weight takes the bytes it took before; 0 if none of at least 16 does (the row is then
    padded with zeros to whole tiles of four planes of min(group, 128))."""
    chunk = MAX_CHUNK
    while chunk >= MIN_CHUNK:
        if group_size % chunk == 0 and in_features % (PLANES * chunk) == 0:
            return chunk
        chunk //= 2
    return 0


def to_mma_layout(weight: PackedWeight) -> MmaWeight:
    """The packed weight in the kernel's layout, built once after loading (and after any tensor-
    parallel slicing, which cuts PackedWeight rows and columns)."""
    n, k = weight.out_features, weight.in_features
    scales = weight.scales.t().contiguous()
    if weight.kind != "int4":
        return MmaWeight(weight.kind, weight.qweight.contiguous(), scales, None, k, weight.group_size)
    chunk = int4_chunk(k, weight.group_size) or min(MAX_CHUNK, weight.group_size)
    padded = triton.cdiv(k, PLANES * chunk) * PLANES * chunk
    q = torch.zeros(n, padded, dtype=torch.uint8, device=weight.qweight.device)
    q[:, :k] = unpack_int4(weight.qweight)
    planes = q.reshape(n, padded // (PLANES * chunk), PLANES, chunk)
    words = sum(planes[:, :, p].to(torch.int32) << (4 * p) for p in range(PLANES))
    words = torch.where(words >= 2**15, words - 2**16, words).to(torch.int16).reshape(n, -1)
    return MmaWeight("int4", words, scales, weight.offsets.t().contiguous(), k, weight.group_size, chunk)


@triton.jit
def _int4_planes(words, DTYPE: tl.constexpr, ASM: tl.constexpr, INTERPRETED: tl.constexpr):
    """int16 words [BLOCK_N, CHUNK] -> the four nibble planes, q - 8 in DTYPE (bf16 or fp16)."""
    if INTERPRETED:
        p0 = ((words & 0xF) - 8).to(tl.float32).to(DTYPE)
        p1 = (((words >> 4) & 0xF) - 8).to(tl.float32).to(DTYPE)
        p2 = (((words >> 8) & 0xF) - 8).to(tl.float32).to(DTYPE)
        p3 = (((words >> 12) & 0xF) - 8).to(tl.float32).to(DTYPE)
    else:
        p0, p1, p2, p3 = tl.inline_asm_elementwise(
            asm=ASM.value,
            constraints="=r,=r,=r,=r,r",
            args=[words],
            dtype=(DTYPE.value, DTYPE.value, DTYPE.value, DTYPE.value),
            is_pure=True,
            pack=2,
        )
    return p0, p1, p2, p3


# M changes with every batch; left to Triton it would be specialized (== 1) and compile again.
@triton.jit(do_not_specialize=["M"])
def _mma_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    o_ptr,
    y_ptr,
    M,
    N,
    stride_xm,
    stride_ym,
    K: tl.constexpr,
    W_STRIDE: tl.constexpr,  # elements per stored weight row
    GROUP: tl.constexpr,
    KIND: tl.constexpr,  # index into KINDS
    CHUNK: tl.constexpr,
    TILES: tl.constexpr,  # operand tiles per loop step
    DECODE_DTYPE: tl.constexpr,  # bf16 or fp16: what the weights widen to
    ASM: tl.constexpr,  # the widening's PTX: int4 planes or fp8 bytes
    BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    INTERPRETED: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    IS_INT4: tl.constexpr = KIND == 3
    SCALED: tl.constexpr = KIND != 0
    PER_CHANNEL: tl.constexpr = GROUP >= K
    STEP_K: tl.constexpr = CHUNK * TILES
    # Tiles after which a group's partial sums are scaled (a group is CHUNK-aligned).
    GROUP_TILES: tl.constexpr = TILES if PER_CHANNEL else min(TILES, GROUP // CHUNK)
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rc = tl.arange(0, CHUNK)
    n_mask = rn < N
    m_mask = rm < M
    w_rows = w_ptr + rn.to(tl.int64)[:, None] * W_STRIDE
    x_cols = x_ptr + rm.to(tl.int64)[None, :] * stride_xm
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    part = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    sums = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    ones = tl.full([BLOCK_N, CHUNK], 1.0, tl.float32).to(DECODE_DTYPE)
    for step in tl.range(0, tl.cdiv(K, STEP_K), num_stages=NUM_STAGES):
        k0 = step * STEP_K
        if IS_INT4:
            words = tl.load(w_rows + (step * CHUNK + rc)[None, :], mask=n_mask[:, None], other=0)
            planes = _int4_planes(words, DECODE_DTYPE, ASM, INTERPRETED)
        for t in tl.static_range(TILES):
            kk = k0 + t * CHUNK + rc
            xt = tl.load(x_cols + kk[:, None], mask=(kk[:, None] < K) & m_mask[None, :], other=0.0)
            if IS_INT4:
                w = planes[t]
                sums = dot(ones, xt, sums, INTERPRETED, DOT_PRECISION)
            else:
                w = tl.load(w_rows + kk[None, :], mask=n_mask[:, None] & (kk[None, :] < K), other=0.0)
                if KIND == 2:
                    w = fp8_widened(w, DECODE_DTYPE, ASM, INTERPRETED)
            part = dot(w, xt, part, INTERPRETED, DOT_PRECISION)
            if SCALED and not PER_CHANNEL and (t + 1) % GROUP_TILES == 0:
                g = (k0 + t * CHUNK) // GROUP
                # Past the last group (the last step's tail) the partial sums are zero.
                g_mask = n_mask & (g * GROUP < K)
                s = tl.load(s_ptr + g * N + rn, mask=g_mask, other=0.0).to(tl.float32)
                acc += part * s[:, None]
                part = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
                if IS_INT4:
                    o = tl.load(o_ptr + g * N + rn, mask=g_mask, other=0.0).to(tl.float32)
                    acc += sums * (o + 8.0 * s)[:, None]
                    sums = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    if not SCALED:
        acc = part
    elif PER_CHANNEL:
        s = tl.load(s_ptr + rn, mask=n_mask, other=0.0).to(tl.float32)
        acc = part * s[:, None]
        if IS_INT4:
            o = tl.load(o_ptr + rn, mask=n_mask, other=0.0).to(tl.float32)
            acc += sums * (o + 8.0 * s)[:, None]
    y = y_ptr + rm.to(tl.int64)[None, :] * stride_ym + rn[:, None]
    tl.store(y, rounded(acc, y_ptr.dtype.element_ty, INTERPRETED), mask=n_mask[:, None] & m_mask[None, :])


def _widening_asm(kind: str, dtype: torch.dtype) -> str:
    if kind == "int4":
        return int4_plane_asm(dtype)
    if kind == "fp8":
        return fp8_asm(dtype)
    return ""


def block_m_for(rows: int) -> int:
    return min(64, max(8, triton.next_power_of_2(rows)))


def mma_matmul(x: torch.Tensor, weight: MmaWeight, config: MmaConfig | None = None) -> torch.Tensor:
    """x [M, K] @ dequantized(weight)^T -> [M, N] in x's dtype, for up to a few dozen rows."""
    config = config or MmaConfig(block_m=block_m_for(x.shape[0]))
    m, k = x.shape
    n = weight.out_features
    if x.stride(-1) != 1:
        x = x.contiguous()
    decode_dtype = torch.float16 if x.dtype == torch.float16 else torch.bfloat16
    if weight.kind == "int4":
        chunk, tiles = weight.chunk, PLANES
    else:
        chunk = min(config.chunk, max(MIN_CHUNK, triton.next_power_of_2(k)))
        if not weight.per_channel:
            chunk = min(chunk, weight.group_size)
        # Small groups take more, narrower tiles per step: as many inputs per step as configured.
        tiles = max(1, config.chunk * config.tiles // chunk)
    y = torch.empty(m, n, device=x.device, dtype=x.dtype)
    grid = (triton.cdiv(n, config.block_n), triton.cdiv(m, config.block_m))
    _mma_kernel[grid](
        x,
        weight.qweight,
        weight.scales if weight.scales is not None else x,
        weight.offsets if weight.offsets is not None else x,
        y,
        m,
        n,
        x.stride(0),
        y.stride(0),
        K=k,
        W_STRIDE=weight.qweight.stride(0),
        GROUP=weight.group_size,
        KIND=_KIND_IDS[weight.kind],
        CHUNK=chunk,
        TILES=tiles,
        DECODE_DTYPE=tl.float16 if decode_dtype == torch.float16 else tl.bfloat16,
        ASM=_widening_asm(weight.kind, decode_dtype),
        BLOCK_N=config.block_n,
        BLOCK_M=config.block_m,
        NUM_STAGES=config.num_stages,
        INTERPRETED=INTERPRETED,
        DOT_PRECISION=dot_precision(x.dtype),
        num_warps=config.num_warps,
    )
    return y


@triton.jit
def _dequantize_kernel(
    w_ptr,
    s_ptr,
    o_ptr,
    out_ptr,
    N,
    K: tl.constexpr,
    W_STRIDE: tl.constexpr,
    GROUP: tl.constexpr,
    KIND: tl.constexpr,
    CHUNK: tl.constexpr,
    TILES: tl.constexpr,
    BLOCK_N: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    """One step of CHUNK * TILES inputs of BLOCK_N rows -> w = q * s (+ o) in float32, rounded once
    to out's dtype, as packed.dequantize computes it."""
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    step = tl.program_id(1)
    rc = tl.arange(0, CHUNK)
    n_mask = rn < N
    w_rows = w_ptr + rn.to(tl.int64)[:, None] * W_STRIDE
    out_rows = out_ptr + rn.to(tl.int64)[:, None] * K
    if KIND == 3:
        words = tl.load(w_rows + (step * CHUNK + rc)[None, :], mask=n_mask[:, None], other=0)
    for t in tl.static_range(TILES):
        kk = step * CHUNK * TILES + t * CHUNK + rc
        mask = n_mask[:, None] & (kk[None, :] < K)
        if KIND == 3:
            q = ((words >> (4 * t)) & 0xF).to(tl.float32)
        else:
            q = tl.load(w_rows + kk[None, :], mask=mask, other=0.0).to(tl.float32)
        g = kk // GROUP
        s = tl.load(s_ptr + g[None, :] * N + rn[:, None], mask=mask, other=0.0).to(tl.float32)
        w = q * s
        if KIND == 3:
            w += tl.load(o_ptr + g[None, :] * N + rn[:, None], mask=mask, other=0.0).to(tl.float32)
        tl.store(out_rows + kk[None, :], rounded(w, out_ptr.dtype.element_ty, INTERPRETED), mask=mask)


def dequantize_mma(weight: MmaWeight, dtype: torch.dtype) -> torch.Tensor:
    """The [N, K] float matrix a re-laid weight stands for, in `dtype`: what cuBLAS multiplies for
    prefill-sized batches."""
    n, k = weight.out_features, weight.in_features
    if weight.kind == "dense":
        return weight.qweight.to(dtype)
    if weight.kind == "int4":
        chunk, tiles = weight.chunk, PLANES
    else:
        chunk = min(MAX_CHUNK, max(MIN_CHUNK, triton.next_power_of_2(k)))
        tiles = 1
    out = torch.empty(n, k, device=weight.qweight.device, dtype=dtype)
    block_n = 16
    _dequantize_kernel[(triton.cdiv(n, block_n), triton.cdiv(k, chunk * tiles))](
        weight.qweight,
        weight.scales,
        weight.offsets if weight.offsets is not None else weight.scales,
        out,
        n,
        K=k,
        W_STRIDE=weight.qweight.stride(0),
        GROUP=weight.group_size,
        KIND=_KIND_IDS[weight.kind],
        CHUNK=chunk,
        TILES=tiles,
        BLOCK_N=block_n,
        INTERPRETED=INTERPRETED,
    )
    return out
