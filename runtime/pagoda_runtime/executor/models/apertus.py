"""The Swiss AI Initiative's Apertus (ApertusForCausalLM: Apertus-8B, Apertus-70B): the Llama layout
with per-head q/k norms (as Qwen3's), its two norms named attention_layernorm and
feedforward_layernorm, and an ungated MLP whose activation is xIELU, with two learned parameters
per layer (layers.UngatedMLP)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from pagoda_runtime.contract.config import ModelConfig
from pagoda_runtime.contract.weight_layout import Shapes, decoder_shapes, layer_prefix, norm_shapes
from pagoda_runtime.executor.kernels import AttentionOps
from pagoda_runtime.executor.models.decoder import Weight
from pagoda_runtime.executor.models.hf_config import check_activation
from pagoda_runtime.executor.models.layers import Attention, DecoderLayer, RMSNorm, UngatedMLP
from pagoda_runtime.executor.models.llama import LlamaForCausalLM
from pagoda_runtime.executor.models.llama import config_from_hf as llama_config_from_hf

FAMILY = "Apertus"
# The checkpoint's norm names -> the Llama layer's.
_NORMS = {"attention_layernorm": "input_layernorm", "feedforward_layernorm": "post_attention_layernorm"}


class XIELU(nn.Module):
    """x > 0: a_p x² + beta x; else (expm1(min(x, eps)) - x) a_n + beta x, where a_p =
    softplus(alpha_p) and a_n = beta + softplus(alpha_n); in float32, rounded once."""

    def __init__(self, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.alpha_p = nn.Parameter(torch.zeros(1, device=device, dtype=dtype), requires_grad=False)
        self.alpha_n = nn.Parameter(torch.zeros(1, device=device, dtype=dtype), requires_grad=False)
        self.beta = nn.Parameter(torch.zeros((), device=device, dtype=dtype), requires_grad=False)
        self.eps = nn.Parameter(torch.zeros((), device=device, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, beta = x.float(), self.beta.float()
        positive = nn.functional.softplus(self.alpha_p.float())
        negative = beta + nn.functional.softplus(self.alpha_n.float())
        below = (torch.expm1(torch.minimum(h, self.eps.float())) - h) * negative
        return torch.where(h > 0, positive * h * h, below).add_(beta * h).to(x.dtype)


class ApertusForCausalLM(LlamaForCausalLM):
    def make_layer(
        self, layer: int, ops: AttentionOps, quantization: str, device: torch.device, dtype: torch.dtype
    ) -> nn.Module:
        config, tp = self.config, self.tp
        attention = Attention(config, layer, ops, quantization, device, dtype, tp, qk_norm=RMSNorm)
        mlp = UngatedMLP(config, quantization, device, dtype, tp, XIELU(device, dtype))
        return DecoderLayer(config, attention, mlp, device, dtype)

    def checkpoint_shapes(self) -> Shapes:
        return weight_shapes(self.config)

    def checkpoint_parts(self, name: str, tensor: Weight) -> Iterator[tuple[str, Weight]]:
        for old, new in _NORMS.items():
            name = name.replace(f".{old}.", f".{new}.")
        yield name, tensor


def weight_shapes(config: ModelConfig) -> Shapes:
    arch = config.architecture
    shapes = decoder_shapes(arch, tuple(_NORMS))
    for i in range(arch.num_hidden_layers):
        layer = layer_prefix(i)
        shapes |= norm_shapes(layer + "self_attn.", ("q_norm", "k_norm"), arch.head_dim)
        shapes |= {f"{layer}mlp.act_fn.{p}": (1,) for p in ("alpha_p", "alpha_n")}
        shapes |= {f"{layer}mlp.act_fn.{p}": () for p in ("beta", "eps")}
    return shapes


def config_from_hf(raw: dict[str, Any], architecture: str) -> ModelConfig:
    check_activation(raw, "hidden_act", "xielu", FAMILY)
    llama = llama_config_from_hf({**raw, "hidden_act": "silu"}, "LlamaForCausalLM")
    return replace(llama, model_type="apertus")
