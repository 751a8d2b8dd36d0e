"""The PyTorch reference of the mixture-of-experts layer: what runs on the CPU, and what the Triton
kernel is tested against. It is transformers' expert loop (Qwen3MoeExperts, MixtralExperts): for
each expert some token chose, its gate_up matmul, SiLU(gate) * up, its down matmul, times the
router's weight, added into the tokens' rows; quantized experts are dequantized first.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pagoda_runtime.executor.kernels.moe_routing import route
from pagoda_runtime.executor.kernels.moe_weights import ExpertWeights, PackedExperts
from pagoda_runtime.executor.quantization.packed import dequantize


def _expert(weights: ExpertWeights, index: int, dtype: torch.dtype) -> torch.Tensor:
    if isinstance(weights, PackedExperts):
        return dequantize(weights.expert(index), dtype)
    return weights[index].to(dtype)


def reference_experts(
    hidden: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w_gate_up: ExpertWeights,
    w_down: ExpertWeights,
) -> torch.Tensor:
    """hidden [T, H] through the experts topk_ids [T, k], weighted by topk_weights [T, k] -> [T, H]."""
    out = torch.zeros_like(hidden)
    for expert in torch.unique(topk_ids).tolist():
        token_idx, choice = torch.where(topk_ids == expert)
        gate, up = F.linear(hidden[token_idx], _expert(w_gate_up, expert, hidden.dtype)).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, _expert(w_down, expert, hidden.dtype))
        out.index_add_(0, token_idx, (y * topk_weights[token_idx, choice, None]).to(out.dtype))
    return out


def reference_fused_moe(
    hidden: torch.Tensor,
    router_logits: torch.Tensor,
    w_gate_up: ExpertWeights,
    w_down: ExpertWeights,
    top_k: int,
    renormalize: bool,
) -> torch.Tensor:
    weights, ids = route(router_logits, top_k, renormalize)
    return reference_experts(hidden, weights, ids, w_gate_up, w_down)
