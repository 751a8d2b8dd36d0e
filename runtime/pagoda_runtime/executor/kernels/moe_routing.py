"""Which experts each token goes to, and the token order the grouped expert kernel reads.

`route` is the router both paths share: softmax over the router logits in float32, the top-k
experts, and (Mixtral always, Qwen3-MoE when config.norm_topk_prob) the chosen weights renormalized
to sum to one, as transformers' MixtralTopKRouter and Qwen3MoeTopKRouter compute them.

`align_to_experts` is vLLM's moe_align_block_size in plain tensor operations: the T * top_k
(token, choice) pairs sorted by expert, each expert's run padded to a multiple of the kernel's
BLOCK_M, so every block of BLOCK_M rows belongs to one expert and one tl.dot tile serves it. Every
shape depends on T, top_k and E only, never on the routing, and nothing waits for the device, so a
decode step that routes through it can be captured in a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class ExpertBlocks:
    """The (token, choice) pairs in expert order, padded per expert to whole blocks of block_m.

    sorted_ids [max_padded] int32: flat pair index t * top_k + j, or num_pairs in padding rows;
    block_experts [max_padded // block_m] int32: the expert of each block (E past the last one);
    num_padded [1] int32: the rows in use (the blocks past it do no work).
    """

    sorted_ids: torch.Tensor
    block_experts: torch.Tensor
    num_padded: torch.Tensor
    block_m: int
    num_pairs: int

    @property
    def max_blocks(self) -> int:
        return self.sorted_ids.shape[0] // self.block_m


def max_padded_rows(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Rows enough for any routing: every expert's padding at worst, and no more than one block per
    pair when there are fewer pairs than experts."""
    return min(num_pairs + num_experts * (block_m - 1), num_pairs * block_m)


def align_to_experts(expert_ids: torch.Tensor, num_experts: int, block_m: int) -> ExpertBlocks:
    """expert_ids [T, top_k] -> ExpertBlocks; pairs of one expert keep their token order."""
    flat = expert_ids.flatten()
    num_pairs = flat.numel()
    device = flat.device
    max_padded = max_padded_rows(num_pairs, num_experts, block_m)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_ends = padded.cumsum(0)
    order = torch.argsort(flat, stable=True)
    sorted_experts = flat[order]
    # A pair's row: its expert's padded start plus its rank among that expert's pairs.
    firsts = counts.cumsum(0) - counts
    rank = torch.arange(num_pairs, device=device) - firsts[sorted_experts]
    rows = (padded_ends - padded)[sorted_experts] + rank
    sorted_ids = torch.full((max_padded,), num_pairs, dtype=torch.int32, device=device)
    sorted_ids.scatter_(0, rows, order.to(torch.int32))
    block_starts = torch.arange(0, max_padded, block_m, device=device)
    block_experts = torch.searchsorted(padded_ends, block_starts, right=True).to(torch.int32)
    return ExpertBlocks(
        sorted_ids=sorted_ids,
        block_experts=block_experts,
        num_padded=padded_ends[-1:].to(torch.int32),
        block_m=block_m,
        num_pairs=num_pairs,
    )
