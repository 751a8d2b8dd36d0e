"""DeepSeek V3's and GLM-4.5's routing: sigmoid scores plus a correction bias pick the experts among
the best groups, the plain scores weight them. The reference is transformers' Glm4MoeTopkRouter
(DeepseekV3TopkRouter computes the same) and Glm4MoeExperts; the Triton routing (Triton's
interpreter on a CPU-only machine) follows the reference."""

from __future__ import annotations

import math

import pytest
import torch
from pagoda_runtime.executor.kernels import triton_moe
from pagoda_runtime.executor.kernels.moe import fused_moe
from pagoda_runtime.executor.kernels.moe_options import ExpertOptions
from pagoda_runtime.executor.kernels.moe_reference import reference_fused_moe
from pagoda_runtime.executor.kernels.moe_routing import SigmoidRouting, route
from pagoda_runtime.executor.kernels.triton_moe_routing import route_and_align
from transformers import Glm4MoeConfig
from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeExperts, Glm4MoeTopkRouter

from .paged_batch import relative_error

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SMALL = triton_moe.MoeConfig(block_m=16, block_n=32, block_k=64, group_m=1)


def _config(experts: int, groups: int, topk_groups: int, top_k: int, norm_topk_prob: bool) -> Glm4MoeConfig:
    config = Glm4MoeConfig(
        hidden_size=32,
        moe_intermediate_size=24,
        n_routed_experts=experts,
        n_group=groups,
        topk_group=topk_groups,
        num_experts_per_tok=top_k,
        routed_scaling_factor=2.5,
        norm_topk_prob=norm_topk_prob,
    )
    config._experts_implementation = "eager"
    return config


def _router(config: Glm4MoeConfig, seed: int) -> Glm4MoeTopkRouter:
    router = Glm4MoeTopkRouter(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        router.weight.copy_(torch.randn(router.weight.shape, generator=generator) * 0.3)
        # As large as the scores' spread, so the bias changes which experts win.
        router.e_score_correction_bias.copy_(torch.randn(config.n_routed_experts, generator=generator) * 0.3)
    return router.requires_grad_(False).eval()


def _routing(config: Glm4MoeConfig) -> SigmoidRouting:
    return SigmoidRouting(config.n_group, config.topk_group, config.routed_scaling_factor)


def _by_expert(weights: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's choices in expert order: the rules agree on sets, not on the order of choices."""
    ids, order = ids.sort(dim=1)
    return weights.gather(1, order), ids


def _triton_route(logits, top_k, renormalize, sigmoid=None, correction_bias=None, softmax_groups=None):
    """route_and_align's weights and experts as route returns them, the experts read back from the
    blocks each pair was sorted into."""
    num_tokens = logits.shape[0]
    logits = logits.to(DEVICE)
    correction_bias = None if correction_bias is None else correction_bias.to(DEVICE)
    routed, blocks = route_and_align(logits, top_k, renormalize, 16, sigmoid, correction_bias, softmax_groups)
    num_pairs = num_tokens * top_k
    ids = torch.full((num_pairs,), -1, dtype=torch.int64)
    used = int(blocks.num_padded)
    rows = blocks.sorted_ids[:used].long().cpu()
    block_experts = blocks.block_experts.long().cpu().repeat_interleave(16)[:used]
    ids[rows[rows < num_pairs]] = block_experts[rows < num_pairs]
    return routed.cpu().view(num_tokens, top_k), ids.view(num_tokens, top_k)


ROUTERS = {"reference": route, "triton": _triton_route}


@pytest.mark.parametrize("norm_topk_prob", [True, False])
@pytest.mark.parametrize("groups,topk_groups", [(4, 2), (1, 1)])
def test_route_is_transformers_glm4_moe_router(groups: int, topk_groups: int, norm_topk_prob: bool) -> None:
    config = _config(16, groups, topk_groups, 4, norm_topk_prob)
    router = _router(config, seed=groups)
    hidden = torch.randn(23, 32, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        logits, expected_weights, expected_ids = router(hidden)
    weights, ids = route(logits, 4, norm_topk_prob, _routing(config), router.e_score_correction_bias)
    assert weights.dtype == torch.float32
    expected_weights, expected_ids = _by_expert(expected_weights, expected_ids)
    weights, ids = _by_expert(weights, ids)
    assert torch.equal(ids, expected_ids)
    # Equal but for the order of the renormalizing sum.
    torch.testing.assert_close(weights, expected_weights, rtol=1e-6, atol=0.0)


@pytest.mark.parametrize("router", list(ROUTERS))
@pytest.mark.parametrize("renormalize", [False, True])
def test_the_plain_scores_weight_the_experts_the_biased_ones_chose(router: str, renormalize: bool) -> None:
    # Expert 0's bias lifts it from last to first; expert 3 leads without one.
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    bias = torch.tensor([3.0, 0.0, 0.0, 0.0])
    weights, ids = ROUTERS[router](logits.to(DEVICE), 2, renormalize, SigmoidRouting(), bias.to(DEVICE))
    weights, ids = _by_expert(weights.cpu(), ids.cpu())
    assert ids.tolist() == [[0, 3]]
    expected = torch.tensor([[0.5, 1 / (1 + math.exp(-3.0))]])
    if renormalize:
        expected = expected / expected.sum()
    torch.testing.assert_close(weights, expected, rtol=1e-6, atol=0.0)


@pytest.mark.parametrize("router", list(ROUTERS))
def test_only_the_best_groups_experts_are_chosen(router: str) -> None:
    # Four groups of two. The best expert (0) sits in group 0, whose other expert is the worst:
    # groups 1 and 2, with two good experts each, win the vote, and their best two are chosen.
    logits = torch.tensor([[4.0, -4.0, 2.0, 1.9, 1.5, 1.4, -1.0, -1.0]])
    rule = SigmoidRouting(num_groups=4, topk_groups=2, routed_scaling_factor=2.0)
    weights, ids = ROUTERS[router](logits.to(DEVICE), 2, False, rule, None)
    weights, ids = _by_expert(weights.cpu(), ids.cpu())
    assert ids.tolist() == [[2, 3]]
    torch.testing.assert_close(weights, 2.0 * torch.sigmoid(logits[:, 2:4]), rtol=1e-6, atol=0.0)
    # One group of all eight: expert 0 wins, as it would if the groups were ignored.
    assert 0 in ROUTERS[router](logits.to(DEVICE), 2, False, SigmoidRouting(), None)[1].tolist()[0]


@pytest.mark.parametrize(
    "rule,top_k,message",
    [
        (SigmoidRouting(num_groups=3), 2, "equal groups"),
        (SigmoidRouting(num_groups=4, topk_groups=5), 2, "topk_groups 5"),
        (SigmoidRouting(num_groups=4, topk_groups=0), 2, "topk_groups 0"),
        (SigmoidRouting(num_groups=4, topk_groups=2), 9, "top_k 9 exceeds the 8 experts"),
    ],
)
def test_a_rule_that_cannot_pick_top_k_experts_is_rejected(
    rule: SigmoidRouting, top_k: int, message: str
) -> None:
    logits = torch.randn(2, 16)
    with pytest.raises(ValueError, match=message):
        route(logits, top_k, True, rule)
    with pytest.raises(ValueError, match=message):
        route_and_align(logits, top_k, True, 16, rule)


def test_a_correction_bias_of_another_size_is_refused() -> None:
    with pytest.raises(ValueError, match="does not fit 16 experts"):
        route(torch.randn(2, 16), 2, True, SigmoidRouting(), torch.zeros(8))


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_reference_is_transformers_glm4_moe_router_and_experts(norm_topk_prob: bool) -> None:
    config = _config(16, 4, 2, 4, norm_topk_prob)
    router = _router(config, seed=3)
    experts = Glm4MoeExperts(config)
    generator = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for parameter in experts.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.2)
    # transformers' experts are [E, 2 * I, H], gate rows first, and [E, H, I]: this layout already.
    assert experts.gate_up_proj.shape == (16, 48, 32) and experts.down_proj.shape == (16, 32, 24)
    hidden = torch.randn(9, 32, generator=generator)
    with torch.no_grad():
        logits, topk_weights, topk_ids = router(hidden)
        expected = experts(hidden, topk_ids, topk_weights)
    out = fused_moe(
        hidden,
        logits,
        experts.gate_up_proj.data,
        experts.down_proj.data,
        4,
        norm_topk_prob,
        ExpertOptions(sigmoid_routing=_routing(config), correction_bias=router.e_score_correction_bias),
    )
    assert relative_error(out, expected) < 1e-6


def _layer(tokens: int, hidden: int, intermediate: int, experts: int, seed: int):
    generator = torch.Generator(DEVICE).manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=generator, device=DEVICE)
    logits = torch.randn(tokens, experts, generator=generator, device=DEVICE)
    bias = torch.randn(experts, generator=generator, device=DEVICE) * 0.3
    w_gate_up = torch.randn(experts, 2 * intermediate, hidden, generator=generator, device=DEVICE) * 0.1
    w_down = torch.randn(experts, hidden, intermediate, generator=generator, device=DEVICE) * 0.1
    return x, logits, bias, w_gate_up, w_down


GROUPINGS = {"one group": (1, 1), "4 groups, best 2": (4, 2)}


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("grouping", list(GROUPINGS))
def test_triton_layer_matches_the_reference(grouping: str, renormalize: bool) -> None:
    rule = SigmoidRouting(*GROUPINGS[grouping], routed_scaling_factor=2.5)
    x, logits, bias, w_gate_up, w_down = _layer(11, 64, 40, 16, seed=len(grouping))
    options = ExpertOptions(sigmoid_routing=rule, correction_bias=bias)
    out = triton_moe.fused_moe(x, logits, w_gate_up, w_down, 4, renormalize, SMALL, options)
    ref = reference_fused_moe(x, logits, w_gate_up, w_down, 4, renormalize, options)
    assert relative_error(out, ref) < 1e-5


@pytest.mark.parametrize(
    "tokens,experts,groups,topk_groups,top_k,renormalize",
    [
        (9, 16, 4, 2, 4, True),
        (40, 16, 1, 1, 4, False),
        # Groups of 3 and 5 experts padded to 4 and 8 lanes, groups of one expert, DeepSeek V3's shape.
        (7, 12, 4, 3, 5, True),
        (6, 25, 5, 2, 3, True),
        (5, 6, 6, 3, 2, False),
        (3, 256, 8, 4, 8, True),
    ],
)
def test_triton_routing_matches_the_reference(
    tokens, experts, groups, topk_groups, top_k, renormalize
) -> None:
    generator = torch.Generator().manual_seed(tokens)
    logits = torch.randn(tokens, experts, generator=generator)
    bias = torch.randn(experts, generator=generator) * 0.3
    rule = SigmoidRouting(groups, topk_groups, routed_scaling_factor=1.5)
    weights, ids = route(logits, top_k, renormalize, rule, bias)
    routed, routed_ids = _triton_route(logits.to(DEVICE), top_k, renormalize, rule, bias.to(DEVICE))
    # Both take the experts in the order of their biased scores.
    assert torch.equal(routed_ids, ids)
    assert torch.allclose(routed, weights, rtol=1e-6, atol=1e-7)
