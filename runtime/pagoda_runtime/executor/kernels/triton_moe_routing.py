"""Routing on the GPU for the grouped MoE kernel, in two Triton launches (and a zeroed counter):
what moe_routing.route computes, plus vLLM's moe_align_block_size.

1. route: per token, in float32, the top_k experts by repeated argmax, by either rule of
   moe_routing.route: of the softmax, optionally renormalized (Mixtral; Qwen3-MoE's
   norm_topk_prob), among the best groups (DeepSeek V2's group_limited_greedy) or ranked with a
   correction bias (ERNIE 4.5), or of the
   bias-corrected sigmoid scores among the best groups, weighted by the plain scores (DeepSeek V3,
   GLM-4.5), the group vote in registers too, so that it adds no launch;
   each chosen (token, choice) pair takes its rank among its expert's pairs from an atomic counter
   per expert.
2. align: the pairs sorted by expert, each expert's run padded to a multiple of the GEMM's
   BLOCK_M, so every block of BLOCK_M rows belongs to one expert: a pair's row is its expert's
   padded start (a cumulative sum of the padded counts, which every program recomputes from the
   E counters) plus its rank; padding rows get a sentinel; each block's expert is recorded.

The order of an expert's pairs is the order of the atomics, not the tokens', which changes no
result: each pair's row is computed alone from its own activations. Every shape depends on T,
top_k and E only and nothing waits for the host, so a decode step replays from a CUDA graph; a
torch version of the same (softmax, topk, argsort, cumsum, searchsorted, scatters) takes about
fifteen launches where these take three.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from pagoda_runtime.executor.kernels.moe_routing import SigmoidRouting, SoftmaxGroups, check_routing


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
    pair when there are fewer pairs than experts; whole blocks."""
    return min(num_pairs + num_experts * (block_m - 1), num_pairs * block_m) // block_m * block_m


@triton.jit
def _best_groups_only(
    choice,
    GROUP_SIZE: tl.constexpr,
    GROUP_BLOCK: tl.constexpr,
    TOPK_GROUPS: tl.constexpr,
    BEST_TWO: tl.constexpr,
):
    """choice [BLOCK_T, BLOCK_E], its lanes in groups of GROUP_BLOCK, with -inf outside each row's
    TOPK_GROUPS groups whose two best choices sum highest (BEST_TWO; else whose best scores
    highest). Padding lanes and groups hold -inf, so they never count among a group's best and
    never win."""
    BLOCK_T: tl.constexpr = choice.shape[0]
    BLOCK_E: tl.constexpr = choice.shape[1]
    BLOCK_G: tl.constexpr = BLOCK_E // GROUP_BLOCK
    grouped = tl.reshape(choice, [BLOCK_T, BLOCK_G, GROUP_BLOCK])
    group_scores, first = tl.max(grouped, axis=2, return_indices=True)
    if BEST_TWO and GROUP_SIZE > 1:
        lanes = tl.arange(0, GROUP_BLOCK)
        group_scores += tl.max(
            tl.where(lanes[None, None, :] == first[:, :, None], -float("inf"), grouped), axis=2
        )
    groups = tl.arange(0, BLOCK_G)
    keep = tl.zeros([BLOCK_T, BLOCK_G], dtype=tl.int1)
    for _ in tl.static_range(TOPK_GROUPS):
        best = tl.argmax(group_scores, axis=1)
        picked = groups[None, :] == best[:, None]
        keep = keep | picked
        group_scores = tl.where(picked, -float("inf"), group_scores)
    keep = tl.reshape(tl.broadcast_to(keep[:, :, None], [BLOCK_T, BLOCK_G, GROUP_BLOCK]), [BLOCK_T, BLOCK_E])
    return tl.where(keep, choice, -float("inf"))


@triton.jit(do_not_specialize=["num_tokens"])
def _route_kernel(
    logits_ptr,
    bias_ptr,
    weights_ptr,
    ids_ptr,
    ranks_ptr,
    counts_ptr,
    num_tokens,
    stride_lm,
    scale,
    E: tl.constexpr,
    BLOCK_E: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    GROUP_BLOCK: tl.constexpr,
    TOP_K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    SIGMOID: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    NUM_GROUPS: tl.constexpr,
    TOPK_GROUPS: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    row_mask = rows < num_tokens
    # Each group of GROUP_SIZE experts padded to GROUP_BLOCK lanes, a power of two, so that a
    # group's best two are a reduction along one axis of a reshape (softmax: one group of all E).
    lanes = tl.arange(0, BLOCK_E)
    experts = lanes // GROUP_BLOCK * GROUP_SIZE + lanes % GROUP_BLOCK
    real = (lanes % GROUP_BLOCK < GROUP_SIZE) & (experts < E)
    mask = row_mask[:, None] & real[None, :]
    logits = tl.load(
        logits_ptr + rows[:, None] * stride_lm + experts[None, :], mask=mask, other=-float("inf")
    )
    logits = logits.to(tl.float32)
    if SIGMOID:
        scores = tl.sigmoid(logits)
        bias = tl.load(bias_ptr + experts, mask=real, other=0.0)
        choice = tl.where(real[None, :], scores + bias[None, :], -float("inf"))
        if TOPK_GROUPS < NUM_GROUPS:
            choice = _best_groups_only(choice, GROUP_SIZE, GROUP_BLOCK, TOPK_GROUPS, True)
    else:
        # Rows past the batch hold only -inf: shifting by a 0 max keeps them free of NaN.
        shift = tl.where(row_mask, tl.max(logits, axis=1), 0.0)
        probs = tl.exp(logits - shift[:, None])
        scores = probs / tl.maximum(tl.sum(probs, axis=1), 1e-30)[:, None]
        choice = scores
        if HAS_BIAS:
            # ERNIE 4.5: the bias ranks the experts, the softmax weighs them.
            bias = tl.load(bias_ptr + experts, mask=real, other=0.0)
            choice = tl.where(real[None, :], scores + bias[None, :], -float("inf"))
        if TOPK_GROUPS < NUM_GROUPS:
            # DeepSeek V2's group_limited_greedy: padding lanes out of every group's best.
            choice = tl.where(real[None, :], choice, -float("inf"))
            choice = _best_groups_only(choice, GROUP_SIZE, GROUP_BLOCK, TOPK_GROUPS, False)
    choices = tl.arange(0, BLOCK_K)
    chosen = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.int32)
    chosen_weights = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        weight, best = tl.max(choice, axis=1, return_indices=True)
        taken = lanes[None, :] == best[:, None]
        if HAS_BIAS:
            # The expert is ranked by its biased score but weighted by its plain one.
            weight = tl.sum(tl.where(taken, scores, 0.0), axis=1)
        expert = best // GROUP_BLOCK * GROUP_SIZE + best % GROUP_BLOCK
        chosen = tl.where(choices[None, :] == j, expert[:, None], chosen)
        chosen_weights = tl.where(choices[None, :] == j, weight[:, None], chosen_weights)
        choice = tl.where(taken, -float("inf"), choice)
    if SIGMOID:
        if RENORMALIZE:
            chosen_weights = chosen_weights / (tl.sum(chosen_weights, axis=1) + 1e-20)[:, None]
        chosen_weights = chosen_weights * scale
    elif RENORMALIZE:
        chosen_weights = chosen_weights / tl.maximum(tl.sum(chosen_weights, axis=1), 1e-30)[:, None]
    pairs = rows[:, None] * TOP_K + choices[None, :]
    pair_mask = row_mask[:, None] & (choices < TOP_K)[None, :]
    tl.store(weights_ptr + pairs, chosen_weights, mask=pair_mask)
    tl.store(ids_ptr + pairs, chosen, mask=pair_mask)
    ranks = tl.atomic_add(counts_ptr + chosen, 1, mask=pair_mask)
    tl.store(ranks_ptr + pairs, ranks, mask=pair_mask)


@triton.jit(do_not_specialize=["num_pairs", "max_padded"])
def _align_kernel(
    ids_ptr,
    ranks_ptr,
    counts_ptr,
    sorted_ids_ptr,
    block_experts_ptr,
    num_padded_ptr,
    num_pairs,
    max_padded,
    E: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Each program places BLOCK pairs and fills BLOCK rows (BLOCK a multiple of BLOCK_M)."""
    experts = tl.arange(0, BLOCK_E)
    counts = tl.load(counts_ptr + experts, mask=experts < E, other=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, axis=0)
    starts = ends - padded
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)

    pair_mask = offsets < num_pairs
    expert = tl.load(ids_ptr + offsets, mask=pair_mask, other=0)
    rank = tl.load(ranks_ptr + offsets, mask=pair_mask, other=0)
    tl.store(sorted_ids_ptr + tl.gather(starts, expert, axis=0) + rank, offsets, mask=pair_mask)

    # The rows of this program: which expert's padded run holds each, and whether it is padding.
    row_mask = offsets < max_padded
    row_expert = tl.sum((ends[None, :] <= offsets[:, None]).to(tl.int32), axis=1)
    past_last = row_expert >= E
    lookup = tl.minimum(row_expert, E - 1)
    is_padding = past_last | (
        offsets - tl.gather(starts, lookup, axis=0) >= tl.gather(counts, lookup, axis=0)
    )
    tl.store(sorted_ids_ptr + offsets, num_pairs, mask=row_mask & is_padding)
    first_rows = row_mask & (offsets % BLOCK_M == 0)
    tl.store(block_experts_ptr + offsets // BLOCK_M, tl.minimum(row_expert, E), mask=first_rows)
    if tl.program_id(0) == 0:
        tl.store(num_padded_ptr, tl.sum(padded, axis=0))


def route_and_align(
    router_logits: torch.Tensor,
    top_k: int,
    renormalize: bool,
    block_m: int,
    sigmoid: SigmoidRouting | None = None,
    correction_bias: torch.Tensor | None = None,
    softmax_groups: SoftmaxGroups | None = None,
) -> tuple[torch.Tensor, ExpertBlocks]:
    """router_logits [T, E] -> (the pairs' router weights, float32 [T * top_k]; ExpertBlocks);
    sigmoid, correction_bias and softmax_groups as moe_routing.route takes them."""
    num_tokens, num_experts = router_logits.shape
    check_routing(num_experts, top_k, sigmoid, correction_bias, softmax_groups)
    device = router_logits.device
    router_logits = router_logits.contiguous()
    num_pairs = num_tokens * top_k
    weights = torch.empty(num_pairs, dtype=torch.float32, device=device)
    ids = torch.empty(num_pairs, dtype=torch.int32, device=device)
    ranks = torch.empty(num_pairs, dtype=torch.int32, device=device)
    counts = torch.zeros(num_experts, dtype=torch.int32, device=device)
    if correction_bias is not None:
        bias = correction_bias.to(torch.float32).contiguous()
    elif sigmoid is not None:
        bias = torch.zeros(num_experts, dtype=torch.float32, device=device)
    else:
        bias = router_logits  # never read: a softmax rule without a bias
    # The softmax rule is unscaled, and one group unless grouped.
    rule = sigmoid or SigmoidRouting()
    grouping = softmax_groups or rule
    group_size = num_experts // grouping.num_groups
    group_block = triton.next_power_of_2(group_size)
    lanes = triton.next_power_of_2(grouping.num_groups) * group_block
    # Enough tokens per program to fill its threads, few enough that [BLOCK_T, E] stays in registers.
    block_t = max(1, min(64, 4096 // lanes, triton.next_power_of_2(num_tokens)))
    _route_kernel[(triton.cdiv(num_tokens, block_t),)](
        router_logits,
        bias,
        weights,
        ids,
        ranks,
        counts,
        num_tokens,
        router_logits.stride(0),
        float(rule.routed_scaling_factor),
        E=num_experts,
        BLOCK_E=lanes,
        GROUP_SIZE=group_size,
        GROUP_BLOCK=group_block,
        TOP_K=top_k,
        BLOCK_K=triton.next_power_of_2(top_k),
        RENORMALIZE=renormalize,
        SIGMOID=sigmoid is not None,
        HAS_BIAS=sigmoid is not None or correction_bias is not None,
        NUM_GROUPS=grouping.num_groups,
        TOPK_GROUPS=grouping.topk_groups,
        BLOCK_T=block_t,
    )
    max_padded = max_padded_rows(num_pairs, num_experts, block_m)
    sorted_ids = torch.empty(max_padded, dtype=torch.int32, device=device)
    block_experts = torch.empty(max_padded // block_m, dtype=torch.int32, device=device)
    num_padded = torch.empty(1, dtype=torch.int32, device=device)
    block_e = triton.next_power_of_2(num_experts)
    # Rows per program: a whole number of blocks, and [BLOCK, E] comparisons that fit the registers.
    block = max(block_m, min(8192 // block_e, 128) // block_m * block_m)
    _align_kernel[(triton.cdiv(max_padded, block),)](
        ids,
        ranks,
        counts,
        sorted_ids,
        block_experts,
        num_padded,
        num_pairs,
        max_padded,
        E=num_experts,
        BLOCK_E=block_e,
        BLOCK_M=block_m,
        BLOCK=block,
    )
    return weights, ExpertBlocks(sorted_ids, block_experts, num_padded, block_m, num_pairs)
