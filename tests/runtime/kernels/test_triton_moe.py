"""The grouped Triton MoE kernels compute what the PyTorch reference computes, on awkward shapes
(partial row, column and K tiles, more experts than pairs), float and quantized experts: compiled
on a GPU, in Triton's interpreter on a CPU-only machine."""

from __future__ import annotations

import pytest
import torch
from pagoda_runtime.executor.kernels import triton_moe
from pagoda_runtime.executor.kernels.moe_reference import reference_fused_moe
from pagoda_runtime.executor.kernels.moe_routing import route
from pagoda_runtime.executor.kernels.moe_weights import PackedExperts, quantize_experts, shard_experts
from pagoda_runtime.executor.kernels.triton_moe_routing import max_padded_rows, route_and_align
from pagoda_runtime.executor.quantization.packed import PackedWeight

from .paged_batch import relative_error

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SMALL = triton_moe.MoeConfig(block_m=16, block_n=32, block_k=64, group_m=1)


def _layer(tokens: int, hidden: int, intermediate: int, experts: int, seed: int):
    generator = torch.Generator(DEVICE).manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=generator, device=DEVICE)
    logits = torch.randn(tokens, experts, generator=generator, device=DEVICE)
    w_gate_up = torch.randn(experts, 2 * intermediate, hidden, generator=generator, device=DEVICE) * 0.1
    w_down = torch.randn(experts, hidden, intermediate, generator=generator, device=DEVICE) * 0.1
    return x, logits, w_gate_up, w_down


def _int8_groups(weights: torch.Tensor, group: int) -> PackedExperts:
    """int8 in groups of `group` along the input, as GGUF files are served: Q8_0 (32) and Q6_K (16)."""
    e, n, k = weights.shape
    groups = weights.reshape(e * n, k // group, group)
    scales = (groups.abs().amax(dim=2) / 127).half()
    q = torch.round(groups / scales.float()[..., None]).clamp(-127, 127).to(torch.int8).reshape(e * n, k)
    return PackedExperts(PackedWeight("int8", q, scales, group), e)


@pytest.mark.parametrize(
    "tokens,hidden,intermediate,experts,top_k,config",
    [
        # K (80) and N (40) end inside a tile; blocks of 3 rows in the L2 grouping, the last one short.
        (7, 80, 40, 5, 2, SMALL),
        (9, 80, 40, 5, 3, triton_moe.MoeConfig(block_m=16, block_n=16, block_k=32, group_m=3)),
        # One decode token over many experts: fewer pairs than experts.
        (1, 64, 48, 16, 8, SMALL),
        # The default tiles.
        (20, 48, 32, 4, 2, None),
    ],
)
def test_float32_experts_match_the_reference(tokens, hidden, intermediate, experts, top_k, config) -> None:
    x, logits, w_gate_up, w_down = _layer(tokens, hidden, intermediate, experts, seed=tokens)
    out = triton_moe.fused_moe(x, logits, w_gate_up, w_down, top_k, True, config)
    ref = reference_fused_moe(x, logits, w_gate_up, w_down, top_k, True)
    assert relative_error(out, ref) < 1e-5


@pytest.mark.parametrize(
    "tokens,top_k,experts,block_m,renormalize",
    [(9, 2, 5, 16, True), (1, 8, 128, 16, True), (40, 3, 4, 16, False), (70, 2, 8, 64, False)],
)
def test_routing_sorts_every_pair_into_blocks_of_its_expert(
    tokens, top_k, experts, block_m, renormalize
) -> None:
    logits = torch.randn(tokens, experts, generator=torch.Generator().manual_seed(tokens)).to(DEVICE)
    routed, blocks = route_and_align(logits, top_k, renormalize, block_m)
    weights, ids = route(logits, top_k, renormalize)
    assert torch.allclose(routed, weights.flatten(), rtol=1e-6, atol=1e-7)
    num_pairs = tokens * top_k
    # The shapes depend on T, top_k and E only: a CUDA graph can capture any routing.
    assert blocks.sorted_ids.shape == (max_padded_rows(num_pairs, experts, block_m),)
    used = int(blocks.num_padded)
    assert used % block_m == 0 and used <= blocks.sorted_ids.shape[0]
    rows = blocks.sorted_ids[:used].long()
    assert sorted(rows[rows < num_pairs].tolist()) == list(range(num_pairs))
    assert (blocks.sorted_ids[used:] == num_pairs).all()
    flat = ids.flatten()
    for block in range(used // block_m):
        members = rows[block * block_m : (block + 1) * block_m]
        members = members[members < num_pairs]
        assert len(members) > 0
        assert (flat[members] == int(blocks.block_experts[block])).all()
    assert (blocks.block_experts[used // block_m :] == experts).all()


def test_every_pair_and_channel_of_the_intermediate_is_written() -> None:
    x, logits, w_gate_up, _ = _layer(6, 64, 40, 4, seed=11)
    routed, blocks = route_and_align(logits, 2, False, SMALL.block_m)
    act = torch.full((12, 40), float("nan"), device=DEVICE)
    triton_moe._expert_gemm(x, w_gate_up, act, blocks, routed, 2, gated=True, mul_routed=False, config=SMALL)
    ids = route(logits, 2, False)[1].flatten()
    gate, up = torch.einsum("pk,pnk->pn", x.repeat_interleave(2, 0), w_gate_up[ids]).chunk(2, dim=1)
    assert relative_error(act, torch.nn.functional.silu(gate) * up) < 1e-5


def test_bfloat16_follows_the_float32_layer(bf16_as_on_gpu) -> None:
    x, logits, w_gate_up, w_down = _layer(13, 96, 64, 6, seed=5)
    bf16 = [t.bfloat16() for t in (x, w_gate_up, w_down)]
    out = triton_moe.fused_moe(bf16[0], logits, bf16[1], bf16[2], 2, False, SMALL)
    assert out.dtype == torch.bfloat16
    # bf16 rounds the gate_up and down products, SiLU(gate) and each expert's output.
    ref = reference_fused_moe(
        *[t.float() for t in bf16[:1]], logits, *[t.float() for t in bf16[1:]], 2, False
    )
    assert relative_error(out, ref) < 1e-2


QUANTIZED = {
    "int8 per channel": lambda w: quantize_experts(w, "int8"),
    "int8 groups of 32": lambda w: _int8_groups(w, 32),
    "int8 groups of 16": lambda w: _int8_groups(w, 16),
    "fp8 per channel": lambda w: quantize_experts(w, "fp8"),
    "int4 groups of 32": lambda w: quantize_experts(w, "int4", 32),
    "int4 groups of 64": lambda w: quantize_experts(w, "int4", 64),
}


@pytest.mark.parametrize("name", list(QUANTIZED))
def test_quantized_experts_match_the_dequantizing_reference(name: str) -> None:
    x, logits, w_gate_up, w_down = _layer(9, 128, 64, 5, seed=len(name))
    gate_up, down = QUANTIZED[name](w_gate_up), QUANTIZED[name](w_down)
    out = triton_moe.fused_moe(x, logits, gate_up, down, 2, True, SMALL)
    assert relative_error(out, reference_fused_moe(x, logits, gate_up, down, 2, True)) < 1e-5


def test_bfloat16_int4_experts(bf16_as_on_gpu) -> None:
    x, logits, w_gate_up, w_down = _layer(5, 64, 64, 4, seed=9)
    gate_up, down = quantize_experts(w_gate_up, "int4", 32), quantize_experts(w_down, "int4", 32)
    out = triton_moe.fused_moe(x.bfloat16(), logits, gate_up, down, 2, True, SMALL)
    ref = reference_fused_moe(x.bfloat16().float(), logits, gate_up, down, 2, True)
    assert relative_error(out, ref) < 1e-2


def test_tensor_parallel_ranks_sum_to_the_whole_layer() -> None:
    x, logits, w_gate_up, w_down = _layer(5, 64, 64, 4, seed=12)
    gate_up, down = quantize_experts(w_gate_up, "int8"), quantize_experts(w_down, "int8")
    whole = reference_fused_moe(x, logits, gate_up, down, 2, True)
    partials = [
        triton_moe.fused_moe(
            x, logits, *shard_experts(gate_up, down, slice(r * 32, (r + 1) * 32)), 2, True, SMALL
        )
        for r in range(2)
    ]
    assert relative_error(partials[0] + partials[1], whole) < 1e-5


def test_no_tokens_gives_an_empty_output() -> None:
    x, logits, w_gate_up, w_down = _layer(0, 32, 16, 4, seed=0)
    assert triton_moe.fused_moe(x, logits, w_gate_up, w_down, 2, True).shape == (0, 32)


# On a CUDA GPU: the real layer shapes, bf16, against the float32 reference.
MOE_SHAPES = {"qwen3-30b-a3b": (2048, 768, 128, 8), "mixtral-8x7b": (4096, 14336, 8, 2)}


@pytest.mark.gpu
@pytest.mark.parametrize("model", list(MOE_SHAPES))
@pytest.mark.parametrize("tokens", [1, 16, 256])
def test_layer_shapes_on_the_gpu(model: str, tokens: int) -> None:
    hidden, inter, experts, top_k = MOE_SHAPES[model]
    x, logits, w_gate_up, w_down = _layer(tokens, hidden, inter, experts, seed=tokens)
    w_gate_up, w_down = w_gate_up.bfloat16() * 0.2, w_down.bfloat16() * 0.2
    out = triton_moe.fused_moe(x.bfloat16(), logits, w_gate_up, w_down, top_k, True)
    ref = reference_fused_moe(x.bfloat16().float(), logits, w_gate_up, w_down, top_k, True)
    assert relative_error(out, ref) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(QUANTIZED))
@pytest.mark.parametrize("tokens", [1, 64, 512])
def test_quantized_experts_on_the_gpu(name: str, tokens: int) -> None:
    x, logits, w_gate_up, w_down = _layer(tokens, 2048, 768, 16, seed=tokens)
    gate_up, down = QUANTIZED[name](w_gate_up * 0.2), QUANTIZED[name](w_down * 0.2)
    out = triton_moe.fused_moe(x.bfloat16(), logits, gate_up, down, 4, False)
    ref = reference_fused_moe(x.bfloat16().float(), logits, gate_up, down, 4, False)
    assert relative_error(out, ref) < 1e-2


@pytest.mark.gpu
def test_a_captured_decode_layer_follows_new_routing() -> None:
    """The layer's shapes depend on the batch only, and nothing waits for the device: a CUDA graph
    captured on one routing computes the layer for any other."""
    x, logits, w_gate_up, w_down = _layer(8, 2048, 768, 128, seed=3)
    x, w_gate_up, w_down = x.bfloat16(), w_gate_up.bfloat16() * 0.2, w_down.bfloat16() * 0.2
    triton_moe.fused_moe(x, logits, w_gate_up, w_down, 8, True)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = triton_moe.fused_moe(x, logits, w_gate_up, w_down, 8, True)
    for seed in range(3):
        logits.copy_(torch.randn(logits.shape, generator=torch.Generator().manual_seed(seed)).cuda())
        x.copy_(torch.randn(x.shape, generator=torch.Generator().manual_seed(seed + 10)).cuda())
        graph.replay()
        ref = reference_fused_moe(x.float(), logits, w_gate_up, w_down, 8, True)
        assert relative_error(out, ref) < 1e-2
