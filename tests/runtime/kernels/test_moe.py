"""The mixture-of-experts layer's router, weight layouts and CPU reference: the
reference is transformers' Qwen3-MoE and Mixtral block, quantized experts are their dequantized
selves, and tensor-parallel shards sum to the whole layer."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from pagoda_runtime.executor.kernels.moe import fused_moe
from pagoda_runtime.executor.kernels.moe_reference import reference_fused_moe
from pagoda_runtime.executor.kernels.moe_routing import route
from pagoda_runtime.executor.kernels.moe_weights import quantize_experts, shard_experts
from transformers import MixtralConfig, Qwen3MoeConfig
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

from .paged_batch import relative_error


def _randomized(block: torch.nn.Module, seed: int) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in block.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.2)
    return block.requires_grad_(False).eval()


def _experts(num_experts: int, hidden: int, intermediate: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    w_gate_up = torch.randn(num_experts, 2 * intermediate, hidden, generator=generator) * 0.1
    w_down = torch.randn(num_experts, hidden, intermediate, generator=generator) * 0.1
    return w_gate_up, w_down


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_reference_is_transformers_qwen3_moe_block(norm_topk_prob: bool) -> None:
    config = Qwen3MoeConfig(
        hidden_size=40,
        moe_intermediate_size=24,
        num_experts=7,
        num_experts_per_tok=3,
        norm_topk_prob=norm_topk_prob,
    )
    config._experts_implementation = "eager"
    block = _randomized(Qwen3MoeSparseMoeBlock(config), seed=int(norm_topk_prob))
    hidden = torch.randn(2, 9, 40)
    with torch.no_grad():
        expected = block(hidden).reshape(18, 40)
    flat = hidden.reshape(18, 40)
    out = fused_moe(
        flat,
        F.linear(flat, block.gate.weight),
        block.experts.gate_up_proj.data,
        block.experts.down_proj.data,
        top_k=3,
        renormalize=norm_topk_prob,
    )
    assert relative_error(out, expected) < 1e-6


def test_reference_is_transformers_mixtral_block() -> None:
    config = MixtralConfig(hidden_size=32, intermediate_size=48, num_local_experts=8, num_experts_per_tok=2)
    config._experts_implementation = "eager"
    block = _randomized(MixtralSparseMoeBlock(config), seed=3)
    hidden = torch.randn(1, 13, 32)
    with torch.no_grad():
        expected = block(hidden).reshape(13, 32)
    flat = hidden.reshape(13, 32)
    logits = F.linear(flat, block.gate.weight)
    out = fused_moe(flat, logits, block.experts.gate_up_proj.data, block.experts.down_proj.data, 2, True)
    assert relative_error(out, expected) < 1e-6


def test_route_picks_the_top_experts_and_renormalizes() -> None:
    logits = torch.tensor([[0.0, 2.0, 1.0, -1.0], [3.0, 0.0, 0.0, 2.5]])
    weights, ids = route(logits, 2, renormalize=False)
    probs = torch.softmax(logits, dim=-1)
    assert ids.tolist() == [[1, 2], [0, 3]]
    assert torch.allclose(weights, probs.gather(1, ids))
    normalized, same_ids = route(logits.bfloat16(), 2, renormalize=True)
    assert torch.equal(same_ids, ids) and normalized.dtype == torch.float32
    assert torch.allclose(normalized.sum(dim=1), torch.ones(2))
    with pytest.raises(ValueError, match="top_k 5"):
        route(logits, 5, renormalize=True)


@pytest.mark.parametrize("kind,tolerance", [("int8", 2e-2), ("fp8", 8e-2), ("int4", 0.25)])
def test_quantized_experts_are_their_dequantized_weights(kind: str, tolerance: float) -> None:
    w_gate_up, w_down = _experts(4, 64, 96, seed=1)
    packed_gate_up, packed_down = quantize_experts(w_gate_up, kind), quantize_experts(w_down, kind, 32)
    assert packed_gate_up.shape == tuple(w_gate_up.shape) and packed_down.shape == tuple(w_down.shape)
    hidden, logits = torch.randn(11, 64), torch.randn(11, 4)
    out = fused_moe(hidden, logits, packed_gate_up, packed_down, 2, False)
    dequantized = fused_moe(hidden, logits, packed_gate_up.dequantize(), packed_down.dequantize(), 2, False)
    assert relative_error(out, dequantized) < 1e-6
    # Expert e's packed rows are the quantized rows of expert e alone.
    assert (
        relative_error(
            packed_down.expert(2).qweight.float(),
            quantize_experts(w_down[2:3], kind, 32).weight.qweight.float(),
        )
        == 0
    )
    assert relative_error(out, fused_moe(hidden, logits, w_gate_up, w_down, 2, False)) < tolerance


@pytest.mark.parametrize("kind", [None, "int8", "int4"])
def test_tensor_parallel_shards_sum_to_the_whole_layer(kind: str | None) -> None:
    w_gate_up, w_down = _experts(5, 64, 128, seed=2)
    if kind is not None:
        w_gate_up, w_down = quantize_experts(w_gate_up, kind), quantize_experts(w_down, kind, 32)
    hidden, logits = torch.randn(6, 64), torch.randn(6, 5)
    whole = fused_moe(hidden, logits, w_gate_up, w_down, 2, True)
    world = 4
    partials = []
    for rank in range(world):
        part = slice(rank * 32, (rank + 1) * 32)
        gate_up_shard, down_shard = shard_experts(w_gate_up, w_down, part)
        assert gate_up_shard.shape == (5, 64, 64) and down_shard.shape == (5, 64, 32)
        partials.append(fused_moe(hidden, logits, gate_up_shard, down_shard, 2, True))
    assert relative_error(sum(partials), whole) < 1e-5


def test_an_int4_shard_must_not_cut_groups() -> None:
    w_gate_up, w_down = _experts(2, 32, 128)
    with pytest.raises(ValueError, match="cut its groups"):
        shard_experts(quantize_experts(w_gate_up, "int4"), quantize_experts(w_down, "int4", 64), slice(0, 32))


def test_router_and_experts_must_agree_on_the_expert_count() -> None:
    w_gate_up, w_down = _experts(4, 32, 16)
    with pytest.raises(ValueError, match="router scores 5 experts"):
        fused_moe(torch.randn(3, 32), torch.randn(3, 5), w_gate_up, w_down, 2, True)


def test_reference_in_bf16_follows_the_float32_layer() -> None:
    w_gate_up, w_down = _experts(6, 64, 32, seed=4)
    hidden, logits = torch.randn(10, 64), torch.randn(10, 6)
    out = reference_fused_moe(hidden.bfloat16(), logits, w_gate_up.bfloat16(), w_down.bfloat16(), 2, True)
    assert out.dtype == torch.bfloat16
    assert relative_error(out, reference_fused_moe(hidden, logits, w_gate_up, w_down, 2, True)) < 2e-2
