"""The model's device kernels, chosen by device: Triton on CUDA, the PyTorch reference elsewhere.

`get_attention_ops(device)` gives the attention-side pair the model calls in every layer;
`rms_norm` and `silu_and_mul` dispatch on their input's device; `gelu_tanh_and_mul` (Gemma) is
PyTorch on every device.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

# First, so that the Triton kernel modules below are decorated compiled or interpreted as it decides.
from pagoda_runtime.executor import triton_mode  # noqa: F401
from pagoda_runtime.executor.kernels import reference
from pagoda_runtime.executor.kernels.reference import gelu_tanh_and_mul
from pagoda_runtime.executor.kernels.rope_cache import build_cos_sin_cache


@dataclass(frozen=True)
class AttentionOps:
    """rotary_write_kv(positions, q, k, v, cos_sin_cache, kv_cache, slot_mapping, derived, kv_scales)
    -> q: q rotated in place, the rotated k and v stored at their slots (negative slots skipped);
    attention(q, kv_cache, meta, scale, kv_scales=None, window=None, softcap=None, sinks=None,
    chunked=False)
    -> out [T, H, D], reading keys and values from the cache only. kv_cache: [2, blocks,
    block_size, Hkv, D], keys then values; or [1, ...], whose keys are read as the values too
    (latent attention), written with v None. kv_scales: the layer's fp8 cache
    scales [2, Hkv] (kv_scales.py), or None; window: a sliding-window layer's window (blocks wholly
    before it are never read), or with chunked an attention chunk (a query at p sees the keys from
    p - p % window); softcap: scores soft-capped by tanh before the mask; sinks: [H]
    in any float dtype, this rank's query heads in q's order, a logit per head (natural log, unscaled, neither
    capped nor masked) that joins every row's softmax as a key whose value is zero (GPT-OSS's
    attention sinks), or None.
    derived is the step's memo (AttentionMetadata.derived), for an implementation that builds
    tensors from the step once for all layers (the reference path; the Triton kernels need none).
    """

    rotary_write_kv: Callable
    attention: Callable


def get_attention_ops(device: torch.device | str) -> AttentionOps:
    if torch.device(device).type == "cuda":
        from pagoda_runtime.executor.kernels.triton_paged_attention import paged_attention
        from pagoda_runtime.executor.kernels.triton_rotary_kv_write import rotary_write_kv

        return AttentionOps(rotary_write_kv=rotary_write_kv, attention=paged_attention)
    return AttentionOps(rotary_write_kv=reference.rotary_write_kv, attention=reference.attention)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(x + residual) * weight, x + residual); without a residual, (RMSNorm(x) * weight, x)."""
    if x.is_cuda:
        from pagoda_runtime.executor.kernels.triton_rmsnorm import rms_norm as triton_rms_norm

        return triton_rms_norm(x, weight, eps, residual)
    return reference.rms_norm(x, weight, eps, residual)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up for gate_up [T, 2 * I] holding gate in the first half."""
    if gate_up.is_cuda:
        from pagoda_runtime.executor.kernels.triton_silu_mul import silu_and_mul as triton_silu_and_mul

        return triton_silu_and_mul(gate_up)
    return reference.silu_and_mul(gate_up)


__all__ = [
    "AttentionOps",
    "build_cos_sin_cache",
    "gelu_tanh_and_mul",
    "get_attention_ops",
    "rms_norm",
    "silu_and_mul",
]
