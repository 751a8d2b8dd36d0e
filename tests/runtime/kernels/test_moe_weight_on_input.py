"""Llama 4's experts: one expert per token, chosen by the top logit and weighted by its sigmoid, the
weight scaling the token's input to the expert rather than its output. The reference is
transformers' Llama4TextMoe (its shared expert subtracted); the Triton layer (Triton's interpreter
on a CPU-only machine) follows the reference."""

from __future__ import annotations

import pytest
import torch
from pagoda_runtime.executor.kernels import triton_moe
from pagoda_runtime.executor.kernels.moe_options import ExpertOptions
from pagoda_runtime.executor.kernels.moe_reference import reference_fused_moe
from pagoda_runtime.executor.kernels.moe_routing import SigmoidRouting
from transformers import Llama4TextConfig
from transformers.models.llama4.modeling_llama4 import Llama4TextMoe

from .paged_batch import relative_error
from .test_moe_sigmoid_routing import DEVICE, SMALL, _layer

LLAMA4 = ExpertOptions(sigmoid_routing=SigmoidRouting(), weight_on_input=True)


def _transformers_layer(experts: int, hidden: int, width: int) -> Llama4TextMoe:
    config = Llama4TextConfig(hidden_size=hidden, intermediate_size=width, num_local_experts=experts)
    layer = Llama4TextMoe(config)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    return layer.requires_grad_(False).eval()


def _fused(layer: Llama4TextMoe) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's experts as the kernels take them: [E, 2I, H] (gate rows, then up) and [E, H, I]."""
    return layer.experts.gate_up_proj.transpose(1, 2).contiguous(), layer.experts.down_proj.transpose(
        1, 2
    ).contiguous()


def test_reference_is_transformers_llama4_moe() -> None:
    layer = _transformers_layer(8, 32, 24)
    x = torch.randn(19, 32, generator=torch.Generator().manual_seed(4))
    expected = layer(x)[0] - layer.shared_expert(x)
    w_gate_up, w_down = _fused(layer)
    logits = layer.router(x)[1]
    out = reference_fused_moe(x, logits, w_gate_up, w_down, 1, False, LLAMA4)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    # Scaling the expert's output instead (every other family's rule) is another layer.
    on_output = reference_fused_moe(
        x, logits, w_gate_up, w_down, 1, False, ExpertOptions(sigmoid_routing=SigmoidRouting())
    )
    assert relative_error(on_output, expected) > 0.05


def test_triton_layer_matches_the_reference() -> None:
    x, logits, _, w_gate_up, w_down = _layer(13, 64, 40, 16, seed=5)
    out = triton_moe.fused_moe(x, logits, w_gate_up, w_down, 1, False, SMALL, LLAMA4)
    ref = reference_fused_moe(x, logits, w_gate_up, w_down, 1, False, LLAMA4)
    assert relative_error(out, ref) < 1e-5


@pytest.mark.parametrize("fused", [triton_moe.fused_moe, reference_fused_moe])
def test_weight_on_input_takes_one_expert_per_token(fused) -> None:
    x, logits, _, w_gate_up, w_down = _layer(3, 64, 40, 16, seed=6)
    with pytest.raises(ValueError, match="only with top_k 1, not 2"):
        fused(x.to(DEVICE), logits, w_gate_up, w_down, 2, False, options=LLAMA4)
