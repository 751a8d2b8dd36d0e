"""The PyTorch reference of the mixture-of-experts layer: what runs on the CPU, and what the Triton
kernel is tested against. It is transformers' expert loop (Qwen3MoeExperts, MixtralExperts): for
each expert some token chose, its gate_up matmul, SiLU(gate) * up, its down matmul, times the
router's weight, added into the tokens' rows; quantized experts are dequantized first. GPT-OSS's
experts (GptOssExperts) add biases to both matmuls and use ClampedSwiGLU; its down bias comes
before the router's weight, as transformers adds it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pagoda_runtime.executor.kernels.moe_activation import clamped_swiglu
from pagoda_runtime.executor.kernels.moe_options import PLAIN, ExpertOptions, check_weight_on_input
from pagoda_runtime.executor.kernels.moe_routing import route
from pagoda_runtime.executor.kernels.moe_weights import ExpertWeights, PackedExperts
from pagoda_runtime.executor.quantization.packed import dequantize


def _expert(weights: ExpertWeights, index: int, dtype: torch.dtype) -> torch.Tensor:
    if isinstance(weights, PackedExperts):
        return dequantize(weights.expert(index), dtype)
    return weights[index].to(dtype)


def _bias(bias: torch.Tensor | None, index: int, dtype: torch.dtype) -> torch.Tensor | None:
    return None if bias is None else bias[index].to(dtype)


def reference_experts(
    hidden: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w_gate_up: ExpertWeights,
    w_down: ExpertWeights,
    options: ExpertOptions = PLAIN,
) -> torch.Tensor:
    """hidden [T, H] through the experts topk_ids [T, k], weighted by topk_weights [T, k] -> [T, H],
    with the biases and activation of `options` (moe_options.py)."""
    out = torch.zeros_like(hidden)
    dtype = hidden.dtype
    if options.weight_on_input:
        hidden = hidden * topk_weights.to(dtype)
        topk_weights = torch.ones_like(topk_weights)
    for expert in torch.unique(topk_ids).tolist():
        token_idx, choice = torch.where(topk_ids == expert)
        gate_up = F.linear(
            hidden[token_idx], _expert(w_gate_up, expert, dtype), _bias(options.gate_up_bias, expert, dtype)
        )
        gate, up = gate_up.chunk(2, dim=-1)
        activation = options.activation
        act = F.silu(gate) * up if activation is None else clamped_swiglu(gate, up, activation)
        y = F.linear(act, _expert(w_down, expert, dtype), _bias(options.down_bias, expert, dtype))
        out.index_add_(0, token_idx, (y * topk_weights[token_idx, choice, None]).to(out.dtype))
    return out


def reference_fused_moe(
    hidden: torch.Tensor,
    router_logits: torch.Tensor,
    w_gate_up: ExpertWeights,
    w_down: ExpertWeights,
    top_k: int,
    renormalize: bool,
    options: ExpertOptions = PLAIN,
) -> torch.Tensor:
    check_weight_on_input(top_k, options)
    weights, ids = route(
        router_logits,
        top_k,
        renormalize,
        options.sigmoid_routing,
        options.correction_bias,
        options.softmax_groups,
    )
    return reference_experts(hidden, weights, ids, w_gate_up, w_down, options)
