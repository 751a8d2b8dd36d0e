"""GPT-OSS's experts: biased gate_up and down projections and the clamped SwiGLU. The reference is
transformers' GptOssMLP; the Triton kernel (Triton's interpreter on a CPU-only machine) follows
the reference for float and quantized experts, each of the two additions alone and both together."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from pagoda_runtime.executor.kernels import triton_moe
from pagoda_runtime.executor.kernels.moe import fused_moe
from pagoda_runtime.executor.kernels.moe_activation import ClampedSwiGLU
from pagoda_runtime.executor.kernels.moe_options import ExpertOptions
from pagoda_runtime.executor.kernels.moe_reference import reference_fused_moe
from pagoda_runtime.executor.kernels.moe_weights import quantize_experts
from transformers import GptOssConfig
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

from .paged_batch import relative_error

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SMALL = triton_moe.MoeConfig(block_m=16, block_n=32, block_k=64, group_m=1)
GPT_OSS = ClampedSwiGLU()


def _transformers_mlp(hidden: int, intermediate: int, experts: int, top_k: int) -> GptOssMLP:
    config = GptOssConfig(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_local_experts=experts,
        num_experts_per_tok=top_k,
        num_hidden_layers=1,
    )
    config._experts_implementation = "eager"
    mlp = GptOssMLP(config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in mlp.parameters():
            # Wide enough that gate and up often pass the clamp's limit of 7.
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.8)
    return mlp.requires_grad_(False).eval()


def _our_layout(mlp: GptOssMLP) -> tuple[torch.Tensor, ...]:
    """transformers' experts, [E, H, 2 * I] with gate and up interleaved in columns and [E, I, H],
    as kernels/moe_weights.py stores them: [E, 2 * I, H] with the gate rows first, and [E, H, I]."""
    experts = mlp.experts
    gate_up, bias = experts.gate_up_proj.data, experts.gate_up_proj_bias.data
    w_gate_up = torch.cat([gate_up[..., 0::2], gate_up[..., 1::2]], dim=-1).transpose(1, 2).contiguous()
    gate_up_bias = torch.cat([bias[:, 0::2], bias[:, 1::2]], dim=-1)
    w_down = experts.down_proj.data.transpose(1, 2).contiguous()
    return w_gate_up, gate_up_bias, w_down, experts.down_proj_bias.data


def test_reference_is_transformers_gpt_oss_mlp() -> None:
    mlp = _transformers_mlp(hidden=32, intermediate=24, experts=6, top_k=3)
    hidden = torch.randn(1, 11, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = mlp(hidden)[0].reshape(11, 32)
    flat = hidden.reshape(11, 32)
    w_gate_up, gate_up_bias, w_down, down_bias = _our_layout(mlp)
    # The data exercises the clamp: some gates above the limit, some ups outside [-limit, limit].
    gate, up = (torch.einsum("th,enh->ten", flat, w_gate_up) + gate_up_bias).chunk(2, dim=-1)
    assert (gate > mlp.experts.limit).any() and (up.abs() > mlp.experts.limit).any()
    # transformers' router: softmax over the top_k logits, our renormalized top_k of the softmax.
    logits = F.linear(flat, mlp.router.weight, mlp.router.bias)
    activation = ClampedSwiGLU(alpha=mlp.experts.alpha, limit=mlp.experts.limit)
    out = fused_moe(
        flat, logits, w_gate_up, w_down, 3, True, ExpertOptions(gate_up_bias, down_bias, activation)
    )
    assert relative_error(out, expected) < 1e-6


def _two_experts_one_token() -> tuple[torch.Tensor, ...]:
    """One token routed 1/4 : 3/4 to two experts whose every intermediate channel computes the same
    gate and up: expert 0's gate 5 + bias 3 and up -6 + bias -2, both past the limit; expert 1's
    gate 2 and up 3, inside it. Every down weight is 0.1, the down biases 2 and 1."""
    hidden, intermediate = 16, 16
    x = torch.zeros(1, hidden)
    x[0, 0] = 1.0
    logits = torch.tensor([[0.0, math.log(3.0)]])
    w_gate_up = torch.zeros(2, 2 * intermediate, hidden)
    w_gate_up[0, :intermediate, 0], w_gate_up[0, intermediate:, 0] = 5.0, -6.0
    w_gate_up[1, :intermediate, 0], w_gate_up[1, intermediate:, 0] = 2.0, 3.0
    gate_up_bias = torch.zeros(2, 2 * intermediate)
    gate_up_bias[0, :intermediate], gate_up_bias[0, intermediate:] = 3.0, -2.0
    w_down = torch.full((2, hidden, intermediate), 0.1)
    down_bias = torch.tensor([2.0, 1.0])[:, None].expand(2, hidden).contiguous()
    return x, logits, w_gate_up, gate_up_bias, w_down, down_bias


def _by_hand(clamp: bool, down_bias_weighted: bool) -> float:
    """Every output channel of _two_experts_one_token, from the formula."""
    limit = 7.0 if clamp else math.inf
    total = 0.0
    for weight, gate, up, bias in [(0.25, 8.0, -8.0, 2.0), (0.75, 2.0, 3.0, 1.0)]:
        gate, up = min(gate, limit), max(min(up, limit), -limit)
        h = (up + 1) * gate / (1 + math.exp(-1.702 * gate))
        y = 16 * 0.1 * h
        total += weight * (y + bias) if down_bias_weighted else weight * y + bias
    return total


@pytest.mark.parametrize("path", ["reference", "triton"])
def test_the_clamp_and_the_down_bias_before_the_routing_weight(path: str) -> None:
    x, logits, w_gate_up, gate_up_bias, w_down, down_bias = _two_experts_one_token()
    if path == "reference":
        options = ExpertOptions(gate_up_bias, down_bias, GPT_OSS)
        out = reference_fused_moe(x, logits, w_gate_up, w_down, 2, True, options)
    else:
        tensors = [t.to(DEVICE) for t in (x, logits, w_gate_up, w_down, gate_up_bias, down_bias)]
        options = ExpertOptions(tensors[4], tensors[5], GPT_OSS)
        out = triton_moe.fused_moe(*tensors[:4], 2, True, SMALL, options).cpu()
    expected = _by_hand(clamp=True, down_bias_weighted=True)
    assert torch.allclose(out, torch.full_like(out, expected), rtol=1e-5, atol=1e-6)
    # What a missing clamp, or the down bias added after the routing weight, would give instead.
    for wrong in (_by_hand(clamp=False, down_bias_weighted=True), _by_hand(True, down_bias_weighted=False)):
        assert abs(wrong - expected) > 0.5


def _gpt_oss_layer(tokens: int, hidden: int, intermediate: int, experts: int, seed: int):
    generator = torch.Generator(DEVICE).manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=generator, device=DEVICE)
    logits = torch.randn(tokens, experts, generator=generator, device=DEVICE)
    # Scaled so that gate and up pass the limit of 7 now and then, and the biases matter.
    w_gate_up = torch.randn(experts, 2 * intermediate, hidden, generator=generator, device=DEVICE) * 0.6
    w_down = torch.randn(experts, hidden, intermediate, generator=generator, device=DEVICE) * 0.1
    gate_up_bias = torch.randn(experts, 2 * intermediate, generator=generator, device=DEVICE) * 2
    down_bias = torch.randn(experts, hidden, generator=generator, device=DEVICE)
    return x, logits, w_gate_up, w_down, gate_up_bias, down_bias


EXPERT_KINDS = {
    "float32": lambda w: w,
    "int8 per channel": lambda w: quantize_experts(w, "int8"),
    "int4 groups of 32": lambda w: quantize_experts(w, "int4", 32),
}


@pytest.mark.parametrize(
    "kind,biases,clamped",
    [
        ("float32", True, True),
        ("float32", False, True),
        ("float32", True, False),
        ("int8 per channel", True, True),
        ("int4 groups of 32", True, True),
    ],
)
def test_triton_matches_the_reference(kind: str, biases: bool, clamped: bool) -> None:
    x, logits, w_gate_up, w_down, gate_up_bias, down_bias = _gpt_oss_layer(7, 64, 32, 4, seed=len(kind))
    gate_up, down = EXPERT_KINDS[kind](w_gate_up), EXPERT_KINDS[kind](w_down)
    options = ExpertOptions(
        gate_up_bias=gate_up_bias if biases else None,
        down_bias=down_bias if biases else None,
        activation=GPT_OSS if clamped else None,
    )
    out = triton_moe.fused_moe(x, logits, gate_up, down, 2, True, SMALL, options)
    ref = reference_fused_moe(x, logits, gate_up, down, 2, True, options)
    assert relative_error(out, ref) < 1e-5


def test_bfloat16_follows_the_float32_layer(bf16_as_on_gpu) -> None:
    layer = _gpt_oss_layer(9, 64, 32, 4, seed=3)
    x, w_gate_up, w_down, gate_up_bias, down_bias = (t.bfloat16() for t in layer[:1] + layer[2:])
    logits = layer[1]
    out = triton_moe.fused_moe(
        x,
        logits,
        w_gate_up,
        w_down,
        2,
        True,
        SMALL,
        ExpertOptions(gate_up_bias, down_bias, GPT_OSS),
    )
    assert out.dtype == torch.bfloat16
    # bf16 rounds the products, gate and up, the activation and each expert's output.
    ref = reference_fused_moe(
        x.float(),
        logits,
        w_gate_up.float(),
        w_down.float(),
        2,
        True,
        ExpertOptions(gate_up_bias.float(), down_bias.float(), GPT_OSS),
    )
    assert relative_error(out, ref) < 1e-2


def test_a_bias_must_fit_its_experts() -> None:
    x, logits, w_gate_up, w_down, gate_up_bias, _ = _gpt_oss_layer(3, 64, 32, 4, seed=0)
    with pytest.raises(ValueError, match="does not fit 4 experts of 64 rows"):
        triton_moe.fused_moe(
            x, logits, w_gate_up, w_down, 2, True, SMALL, ExpertOptions(gate_up_bias[:, :32])
        )
