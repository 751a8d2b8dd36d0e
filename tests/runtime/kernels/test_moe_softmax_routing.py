"""The softmax rule's two variants: DeepSeek V2's group_limited_greedy (DeepSeek-V2, V2.5, Coder-V2),
the softmax's top-k among the best expert groups, each group scored by its best expert; and ERNIE
4.5's, the experts ranked by softmax plus a correction bias and weighted by the softmax alone,
renormalized. The references are transformers' DeepseekV2TopkRouter and Ernie4_5_MoeTopKRouter;
the Triton routing (Triton's interpreter on a CPU-only machine) and the fused layer follow them."""

from __future__ import annotations

import pytest
import torch
from pagoda_runtime.executor.kernels import triton_moe
from pagoda_runtime.executor.kernels.moe_options import ExpertOptions
from pagoda_runtime.executor.kernels.moe_reference import reference_fused_moe
from pagoda_runtime.executor.kernels.moe_routing import SoftmaxGroups, route
from transformers import DeepseekV2Config, Ernie4_5_MoeConfig
from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter
from transformers.models.ernie4_5_moe.modeling_ernie4_5_moe import Ernie4_5_MoeTopKRouter

from .paged_batch import relative_error
from .test_moe_sigmoid_routing import SMALL, _by_expert, _layer, _triton_route


def _router(experts: int, groups: int, topk_groups: int, top_k: int) -> DeepseekV2TopkRouter:
    config = DeepseekV2Config(
        hidden_size=32,
        n_routed_experts=experts,
        n_group=groups,
        topk_group=topk_groups,
        num_experts_per_tok=top_k,
        topk_method="group_limited_greedy",
        routed_scaling_factor=1.0,
    )
    router = DeepseekV2TopkRouter(config)
    with torch.no_grad():
        router.weight.copy_(torch.randn(router.weight.shape, generator=torch.Generator().manual_seed(groups)))
    return router.requires_grad_(False).eval()


@pytest.mark.parametrize("experts,groups,topk_groups,top_k", [(16, 4, 2, 4), (16, 8, 3, 6), (12, 4, 1, 3)])
def test_route_is_transformers_deepseek_v2_router(experts, groups, topk_groups, top_k) -> None:
    router = _router(experts, groups, topk_groups, top_k)
    hidden = torch.randn(31, 32, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        logits, expected_weights, expected_ids = router(hidden)
    weights, ids = route(logits, top_k, False, softmax_groups=SoftmaxGroups(groups, topk_groups))
    expected_weights, expected_ids = _by_expert(expected_weights, expected_ids)
    weights, ids = _by_expert(weights, ids)
    assert torch.equal(ids, expected_ids)
    torch.testing.assert_close(weights, expected_weights, rtol=0.0, atol=0.0)
    # The groups change the choice: plain softmax top-k picks other experts for some tokens.
    plain = _by_expert(*route(logits, top_k, False))[1]
    assert not torch.equal(plain, ids)


def test_only_the_best_groups_experts_are_chosen_even_past_better_experts_elsewhere() -> None:
    # Group 0 {0, 1} is led by expert 1 (3.0); group 1 {2, 3} holds the two next best (2.5, 2.4),
    # group 2 {4, 5} the best single expert (3.5). With two groups kept and top 3: groups 2 and 0
    # win on their best expert, so expert 2 and 3 are passed over for expert 0 (0.0).
    logits = torch.tensor([[0.0, 3.0, 2.5, 2.4, 3.5, -1.0]])
    rule = SoftmaxGroups(3, 2)
    for router in (route, _triton_route):
        ids = router(logits, 3, False, softmax_groups=rule)[1]
        assert sorted(ids[0].tolist()) == [0, 1, 4]


@pytest.mark.parametrize(
    "tokens,experts,groups,topk_groups,top_k",
    # Groups of 3 and 5 experts padded to 4 and 8 lanes, DeepSeek-V2's 160 experts in 8 groups.
    [(9, 16, 4, 2, 4), (7, 12, 4, 3, 5), (6, 25, 5, 2, 3), (3, 160, 8, 3, 6)],
)
def test_triton_routing_matches_the_reference(tokens, experts, groups, topk_groups, top_k) -> None:
    logits = torch.randn(tokens, experts, generator=torch.Generator().manual_seed(tokens))
    rule = SoftmaxGroups(groups, topk_groups)
    weights, ids = route(logits, top_k, False, softmax_groups=rule)
    routed, routed_ids = _triton_route(logits, top_k, False, softmax_groups=rule)
    assert torch.equal(routed_ids, ids)
    assert torch.allclose(routed, weights, rtol=1e-6, atol=1e-7)


def test_triton_layer_matches_the_reference() -> None:
    x, logits, _, w_gate_up, w_down = _layer(11, 64, 40, 16, seed=5)
    options = ExpertOptions(softmax_groups=SoftmaxGroups(4, 2))
    out = triton_moe.fused_moe(x, logits, w_gate_up, w_down, 4, False, SMALL, options)
    ref = reference_fused_moe(x, logits, w_gate_up, w_down, 4, False, options)
    assert relative_error(out, ref) < 1e-5
    plain = reference_fused_moe(x, logits, w_gate_up, w_down, 4, False)
    assert relative_error(plain, ref) > 1e-2


def test_groups_with_the_sigmoid_rule_are_refused() -> None:
    from pagoda_runtime.executor.kernels.moe_routing import SigmoidRouting

    with pytest.raises(ValueError, match="softmax groups apply to the softmax rule"):
        route(torch.zeros(1, 8), 2, False, SigmoidRouting(2, 1), softmax_groups=SoftmaxGroups(2, 1))
    with pytest.raises(ValueError, match="exceeds the 4 experts of the 1 chosen groups"):
        route(torch.zeros(1, 8), 5, False, softmax_groups=SoftmaxGroups(2, 1))


def _ernie_router(experts: int, top_k: int, seed: int) -> Ernie4_5_MoeTopKRouter:
    config = Ernie4_5_MoeConfig(hidden_size=32, moe_num_experts=experts, moe_k=top_k)
    router = Ernie4_5_MoeTopKRouter(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        router.weight.copy_(torch.randn(router.weight.shape, generator=generator))
        # As large as the softmax scores' spread, so the bias changes which experts win.
        router.moe_statics.e_score_correction_bias.copy_(torch.randn(1, experts, generator=generator) * 0.2)
    return router.requires_grad_(False).eval()


@pytest.mark.parametrize("experts,top_k", [(16, 4), (64, 6), (12, 3)])
def test_route_is_transformers_ernie_router(experts, top_k) -> None:
    router = _ernie_router(experts, top_k, seed=experts)
    bias = router.moe_statics.e_score_correction_bias[0]
    hidden = torch.randn(29, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        logits, expected_weights, expected_ids = router(hidden)
    weights, ids = route(logits, top_k, True, None, bias)
    expected_weights, expected_ids = _by_expert(expected_weights, expected_ids)
    weights, ids = _by_expert(weights, ids)
    assert torch.equal(ids, expected_ids)
    torch.testing.assert_close(weights, expected_weights, rtol=1e-6, atol=0.0)
    # The bias changes the choice: the softmax alone picks other experts for some tokens.
    assert not torch.equal(_by_expert(*route(logits, top_k, True))[1], ids)
    routed, routed_ids = _triton_route(logits, top_k, True, None, bias)
    assert torch.equal(_by_expert(routed, routed_ids)[1], ids)
    torch.testing.assert_close(_by_expert(routed, routed_ids)[0], weights, rtol=1e-6, atol=1e-7)


def test_ernie_triton_layer_matches_the_reference() -> None:
    x, logits, bias, w_gate_up, w_down = _layer(11, 64, 40, 16, seed=9)
    options = ExpertOptions(correction_bias=bias)
    out = triton_moe.fused_moe(x, logits, w_gate_up, w_down, 4, True, SMALL, options)
    ref = reference_fused_moe(x, logits, w_gate_up, w_down, 4, True, options)
    assert relative_error(out, ref) < 1e-5
