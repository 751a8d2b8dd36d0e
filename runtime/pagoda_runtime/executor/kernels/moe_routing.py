"""Which experts each token goes to, and with what weight, by the rule of the model's own router in
transformers, so that a checkpoint routes here as it was trained: softmax top-k (MixtralTopKRouter,
Qwen3MoeTopKRouter), limited to the best groups where asked (DeepseekV2TopkRouter's
group_limited_greedy) or chosen with a correction bias (Ernie4_5_MoeTopKRouter), or sigmoid scores
with grouped, bias-corrected choice (DeepseekV3TopkRouter, Glm4MoeTopkRouter). The CPU reference
routes through this; triton_moe_routing.py computes the same on the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SigmoidRouting:
    """DeepSeek V3's and GLM-4.5's rule: experts ranked by sigmoid(logit) + correction bias among the
    topk_groups of num_groups groups whose two best experts score highest, weighted by the plain
    sigmoid scores (renormalized where asked) times routed_scaling_factor."""

    num_groups: int = 1
    topk_groups: int = 1
    routed_scaling_factor: float = 1.0


@dataclass(frozen=True)
class SoftmaxGroups:
    """DeepSeek V2's group_limited_greedy: the softmax's top_k experts among the topk_groups of
    num_groups groups whose best expert scores highest, weighted by their softmax scores."""

    num_groups: int
    topk_groups: int


def check_routing(
    num_experts: int,
    top_k: int,
    sigmoid: SigmoidRouting | None,
    correction_bias: torch.Tensor | None,
    softmax_groups: SoftmaxGroups | None = None,
) -> None:
    """Raises ValueError where the rule cannot pick top_k experts of num_experts."""
    if not 0 < top_k <= num_experts:
        raise ValueError(f"top_k {top_k} must be between 1 and the number of experts ({num_experts})")
    if sigmoid is not None and softmax_groups is not None:
        raise ValueError("softmax groups apply to the softmax rule, not to sigmoid routing")
    if correction_bias is not None and tuple(correction_bias.shape) != (num_experts,):
        raise ValueError(
            f"the correction bias {tuple(correction_bias.shape)} does not fit {num_experts} experts"
        )
    grouping = sigmoid or softmax_groups
    if grouping is None:
        return
    if grouping.num_groups < 1 or num_experts % grouping.num_groups:
        raise ValueError(f"{num_experts} experts do not split into {grouping.num_groups} equal groups")
    if not 1 <= grouping.topk_groups <= grouping.num_groups:
        raise ValueError(
            f"topk_groups {grouping.topk_groups} must be between 1 and num_groups {grouping.num_groups}"
        )
    eligible = grouping.topk_groups * (num_experts // grouping.num_groups)
    if top_k > eligible:
        raise ValueError(
            f"top_k {top_k} exceeds the {eligible} experts of the {grouping.topk_groups} chosen groups"
        )


def _best_groups_only(choice: torch.Tensor, num_groups: int, topk_groups: int, best: int) -> torch.Tensor:
    """choice [T, E] with -inf outside each row's topk_groups groups whose `best` best choices sum
    highest (a group of fewer experts scores by all of them, where transformers' topk would fail)."""
    if topk_groups == num_groups:
        return choice
    group_size = choice.shape[1] // num_groups
    groups = choice.view(choice.shape[0], num_groups, group_size)
    group_scores = groups.topk(min(best, group_size), dim=-1)[0].sum(dim=-1)
    best_groups = group_scores.topk(topk_groups, dim=-1)[1]
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best_groups, True)
    return choice.masked_fill(~keep.repeat_interleave(group_size, dim=1), float("-inf"))


def route(
    router_logits: torch.Tensor,
    top_k: int,
    renormalize: bool,
    sigmoid: SigmoidRouting | None = None,
    correction_bias: torch.Tensor | None = None,
    softmax_groups: SoftmaxGroups | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E] -> (weights float32 [T, top_k], expert ids int64 [T, top_k]).

    sigmoid None: softmax, top_k (among softmax_groups' best groups where given; ranked by the
    softmax plus correction_bias where given, ERNIE 4.5's rule, but weighted by the softmax),
    renormalized to sum to one where asked (Mixtral always, Qwen3-MoE when config.norm_topk_prob).
    sigmoid: its rule, correction_bias float32 [E] (None: zeros)."""
    num_experts = router_logits.shape[-1]
    check_routing(num_experts, top_k, sigmoid, correction_bias, softmax_groups)
    if sigmoid is None:
        probs = torch.softmax(router_logits.float(), dim=-1)
        choice = probs if correction_bias is None else probs + correction_bias.float()
        if softmax_groups is not None:
            choice = _best_groups_only(choice, softmax_groups.num_groups, softmax_groups.topk_groups, 1)
        ids = torch.topk(choice, top_k, dim=-1)[1]
        weights = probs.gather(1, ids)
        if renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, ids
    scores = torch.sigmoid(router_logits.float())
    choice = scores if correction_bias is None else scores + correction_bias.float()
    choice = _best_groups_only(choice, sigmoid.num_groups, sigmoid.topk_groups, 2)
    ids = torch.topk(choice, top_k, dim=-1)[1]
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * sigmoid.routed_scaling_factor, ids
