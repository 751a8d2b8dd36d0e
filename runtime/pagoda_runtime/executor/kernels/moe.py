"""The mixture-of-experts layer the model calls (Qwen3-MoE, Mixtral, GPT-OSS, GLM-4.5): route each
token to its top_k experts by its model's rule (moe_routing.py) and sum their SwiGLU outputs
weighted by the router, on the best path for the device: the grouped Triton kernels on CUDA
(triton_moe.py), the PyTorch reference elsewhere (moe_reference.py). Expert weights are stored as
moe_weights.py describes; a tensor-parallel rank passes its shard_experts part and all-reduces the
partial output, as after a row-parallel layer, so it passes the same channels of gate_up_bias, and
only one rank passes down_bias (moe_options.py).
"""

from __future__ import annotations

import torch

# First, so that the Triton kernel module is decorated compiled or interpreted as it decides.
from pagoda_runtime.executor import triton_mode  # noqa: F401
from pagoda_runtime.executor.kernels.moe_options import PLAIN, ExpertOptions
from pagoda_runtime.executor.kernels.moe_reference import reference_fused_moe
from pagoda_runtime.executor.kernels.moe_weights import ExpertWeights


def fused_moe(
    hidden: torch.Tensor,
    router_logits: torch.Tensor,
    w_gate_up: ExpertWeights,
    w_down: ExpertWeights,
    top_k: int,
    renormalize: bool,
    options: ExpertOptions = PLAIN,
) -> torch.Tensor:
    """hidden [T, H], router_logits [T, E], w_gate_up [E, 2 * I, H], w_down [E, H, I] -> [T, H].

    renormalize: the top_k weights rescaled to sum to one (Mixtral; Qwen3-MoE's norm_topk_prob);
    options: the layer's biases, activation and routing rule (moe_options.py).
    """
    num_experts = router_logits.shape[-1]
    if w_gate_up.shape[0] != num_experts or w_down.shape[0] != num_experts:
        raise ValueError(
            f"the router scores {num_experts} experts but the layer holds {w_gate_up.shape[0]} gate_up "
            f"and {w_down.shape[0]} down experts; the checkpoint does not match its config"
        )
    if hidden.is_cuda:
        from pagoda_runtime.executor.kernels.triton_moe import fused_moe as triton_fused_moe

        return triton_fused_moe(hidden, router_logits, w_gate_up, w_down, top_k, renormalize, options=options)
    return reference_fused_moe(hidden, router_logits, w_gate_up, w_down, top_k, renormalize, options)
