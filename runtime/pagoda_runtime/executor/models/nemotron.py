"""NVIDIA's Nemotron (NemotronForCausalLM: Nemotron-4 Minitron-4B/8B, Nemotron-Mini-4B): the Llama
layout with what sets it apart:

- LayerNorms with a bias whose stored weight is one less than the scale applied (LayerNorm1P), before
  attention, before the MLP and at the end;
- an ungated MLP, down(relu(up(x))²) (layers.UngatedMLP);
- RoPE on the first half of each head (partial_rotary_factor).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch import nn

from pagoda_runtime.contract.config import ModelConfig
from pagoda_runtime.contract.weight_layout import Shapes, decoder_shapes, layer_prefix
from pagoda_runtime.executor.models.arcee import ArceeForCausalLM
from pagoda_runtime.executor.models.hf_config import check_activation, rope_parameters
from pagoda_runtime.executor.models.llama import config_from_hf as llama_config_from_hf

FAMILY = "Nemotron"
_NORMS = ("input_layernorm", "post_attention_layernorm")


class LayerNorm1P(nn.Module):
    """LayerNorm scaled by weight + 1, plus a bias, computed in float32 and rounded once; with
    `residual`, of x + residual, which it also returns (the residual sum fused, as RMSNorm does)."""

    def __init__(self, size: int, eps: float, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(size, device=device, dtype=dtype), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(size, device=device, dtype=dtype), requires_grad=False)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is not None:
            x = x + residual
        scale, bias = self.weight.float() + 1.0, self.bias.float()
        normed = nn.functional.layer_norm(x.float(), scale.shape, scale, bias, self.eps)
        return normed.to(x.dtype), x


class NemotronForCausalLM(ArceeForCausalLM):
    """Arcee's layer (the Llama layout, an ungated relu² MLP) with LayerNorm1P norms."""

    norm_class = LayerNorm1P

    def make_norm(self, size: int, device: torch.device, dtype: torch.dtype) -> nn.Module:
        return LayerNorm1P(size, self.config.rms_norm_eps, device, dtype)

    def checkpoint_shapes(self) -> Shapes:
        return weight_shapes(self.config)


def weight_shapes(config: ModelConfig) -> Shapes:
    arch = config.architecture
    shapes = decoder_shapes(arch, _NORMS)
    shapes["model.norm.bias"] = (arch.hidden_size,)
    for i in range(arch.num_hidden_layers):
        shapes |= {f"{layer_prefix(i)}{norm}.bias": (arch.hidden_size,) for norm in _NORMS}
    return shapes


def config_from_hf(raw: dict[str, Any], architecture: str) -> ModelConfig:
    check_activation(raw, "hidden_act", "relu2", FAMILY)
    eps = raw.get("norm_eps", 1e-5)
    llama = llama_config_from_hf({**raw, "hidden_act": "silu", "rms_norm_eps": eps}, "LlamaForCausalLM")
    rope = rope_parameters(raw)
    return replace(
        llama,
        model_type="nemotron",
        partial_rotary_factor=rope.get("partial_rotary_factor", raw.get("partial_rotary_factor", 0.5)),
    )
