"""AWQ and GPTQ checkpoints (Hugging Face folders) -> PackedWeight int4, converted once at load.

Both store 4-bit values eight to an int32 and w = (q - zero) * scale per group of inputs:
- AWQ ("gemm" version): qweight [K, N/8] packs along the outputs in the order 0,2,4,6,1,3,5,7;
  qzeros [K/G, N/8] the same way; scales [K/G, N].
- GPTQ: qweight [K/8, N] packs along the inputs in natural order; qzeros [K/G, N/8] along the
  outputs and, in the original format, stores zero - 1; scales [K/G, N]; g_idx [K] maps inputs to
  groups, which must be input // G (act-order checkpoints permute it and are refused).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagoda_runtime.executor.quantization.packed import PackedWeight, pack_int4

# Nibble i of an AWQ int32 holds output column _AWQ_ORDER[i] of its eight.
_AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
_AWQ_COLUMN_TO_NIBBLE = tuple(_AWQ_ORDER.index(c) for c in range(8))


@dataclass(frozen=True)
class CheckpointQuantization:
    method: str  # "awq" or "gptq"
    group_size: int  # -1: one group per output channel
    zero_offset: int = 0  # added to stored zero points (1 for GPTQ's original format)


def parse_quantization_config(config: dict) -> CheckpointQuantization | None:
    """config.json's quantization_config -> what to convert, or None for a float checkpoint."""
    qc = config.get("quantization_config")
    if not qc:
        return None
    method = str(qc.get("quant_method", "")).lower()
    if method not in ("awq", "gptq"):
        raise ValueError(
            f"this checkpoint is quantized with {method or 'an unnamed method'!r}, which Pagoda cannot load; "
            "use a 4-bit AWQ or GPTQ checkpoint, or the float checkpoint with --quantization int8/int4/fp8"
        )
    bits = qc.get("bits", qc.get("w_bit"))
    if bits != 4:
        raise ValueError(
            f"this {method.upper()} checkpoint uses {bits}-bit weights; Pagoda loads 4-bit ones only"
        )
    group_size = int(qc.get("group_size", qc.get("q_group_size", 128)))
    if group_size != -1 and (group_size < 32 or group_size & (group_size - 1)):
        raise ValueError(
            f"this {method.upper()} checkpoint uses groups of {group_size} inputs; Pagoda loads groups of "
            "a power of two from 32 up, or -1 (one group per row)"
        )
    if method == "awq":
        version = str(qc.get("version", "gemm")).lower()
        if version != "gemm" or not qc.get("zero_point", True):
            raise ValueError(
                f"AWQ checkpoints in the {version!r} layout without the 'gemm' zero-point packing are not "
                "supported; export the model with AutoAWQ's default version='gemm'"
            )
        return CheckpointQuantization("awq", group_size)
    if qc.get("desc_act"):
        raise ValueError(
            "GPTQ checkpoints with act-order (desc_act=true) are not supported; "
            "use one quantized with desc_act=false"
        )
    zero_offset = 0 if str(qc.get("checkpoint_format", "gptq")).lower() == "gptq_v2" else 1
    return CheckpointQuantization("gptq", group_size, zero_offset)


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    """int32 [R, C] -> int32 [R, C, 8]: nibble i of each word at index i."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=packed.device)
    return (packed.to(torch.int32)[..., None] >> shifts) & 0xF


def _affine(
    q_nk: torch.Tensor, zeros_ng: torch.Tensor, scales_ng: torch.Tensor, group_size: int
) -> PackedWeight:
    scales = scales_ng.to(torch.float16).contiguous()
    offsets = (-zeros_ng.float() * scales.float()).to(torch.float16)
    return PackedWeight("int4", pack_int4(q_nk), scales, group_size, offsets.contiguous())


def awq_to_packed(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int
) -> PackedWeight:
    k = qweight.shape[0]
    group_size = k if group_size == -1 else group_size
    columns = torch.tensor(_AWQ_COLUMN_TO_NIBBLE, device=qweight.device)
    q = _nibbles(qweight)[..., columns].reshape(k, -1)
    zeros = _nibbles(qzeros)[..., columns].reshape(qzeros.shape[0], -1)
    return _affine(q.t(), zeros.t(), scales.t(), group_size)


def gptq_to_packed(
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    g_idx: torch.Tensor | None,
    spec: CheckpointQuantization,
) -> PackedWeight:
    k = qweight.shape[0] * 8
    group_size = k if spec.group_size == -1 else spec.group_size
    if g_idx is not None and not torch.equal(
        g_idx.to(torch.int64).cpu(), torch.arange(k, dtype=torch.int64) // group_size
    ):
        raise ValueError(
            "this GPTQ checkpoint's g_idx reorders the inputs (act-order); re-quantize it with desc_act=false"
        )
    q = _nibbles(qweight).permute(0, 2, 1).reshape(k, -1)
    zeros = _nibbles(qzeros).reshape(qzeros.shape[0], -1) + spec.zero_offset
    return _affine(q.t(), zeros.t(), scales.t(), group_size)


def int4_to_packed(packed: torch.Tensor, scales: torch.Tensor, group_size: int) -> PackedWeight:
    """compressed-tensors' symmetric INT4 (loading/compressed_tensors.py): int32 [N, K / 8] packing
    eight values along the inputs, each stored plus 8, and scales [N, K / group_size]."""
    rows = packed.shape[0]
    q = _nibbles(packed).reshape(rows, -1)
    zeros = torch.full_like(scales, 8, dtype=torch.float32)
    return _affine(q, zeros, scales, group_size)


def stored_shapes(
    spec: CheckpointQuantization, out_features: int, in_features: int
) -> dict[str, tuple[int, ...]]:
    """The tensors a checkpoint stores for one [out_features, in_features] projection, by suffix."""
    n, k = out_features, in_features
    groups = 1 if spec.group_size == -1 else k // spec.group_size
    if spec.method == "awq":
        return {"qweight": (k, n // 8), "qzeros": (groups, n // 8), "scales": (groups, n)}
    return {"qweight": (k // 8, n), "qzeros": (groups, n // 8), "scales": (groups, n), "g_idx": (k,)}


def to_packed(spec: CheckpointQuantization, tensors: dict[str, torch.Tensor]) -> PackedWeight:
    """One projection's stored tensors (named as stored_shapes names them) -> PackedWeight."""
    if spec.method == "awq":
        return awq_to_packed(tensors["qweight"], tensors["qzeros"], tensors["scales"], spec.group_size)
    g_idx = tensors.get("g_idx")
    return gptq_to_packed(tensors["qweight"], tensors["qzeros"], tensors["scales"], g_idx, spec)
