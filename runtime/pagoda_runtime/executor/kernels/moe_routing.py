"""Which experts each token goes to: softmax over the router logits in float32, the top-k experts,
and (Mixtral always, Qwen3-MoE when config.norm_topk_prob) the chosen weights renormalized to sum to
one, as transformers' MixtralTopKRouter and Qwen3MoeTopKRouter compute them. The CPU reference
routes through this; the Triton path computes the same in triton_moe_routing.py.
"""

from __future__ import annotations

import torch


def route(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E] -> (weights float32 [T, top_k], expert ids int64 [T, top_k])."""
    num_experts = router_logits.shape[-1]
    if not 0 < top_k <= num_experts:
        raise ValueError(f"top_k {top_k} must be between 1 and the number of experts ({num_experts})")
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids
