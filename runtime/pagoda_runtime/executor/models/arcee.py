"""Arcee's AFM (ArceeForCausalLM: AFM-4.5B): the Llama layout with an ungated MLP,
down(relu(up(x))²) (layers.UngatedMLP; ModelArchitecture.gated_mlp false)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch import nn

from pagoda_runtime.contract.config import ModelConfig
from pagoda_runtime.executor.kernels import AttentionOps
from pagoda_runtime.executor.models.hf_config import check_activation
from pagoda_runtime.executor.models.layers import Attention, DecoderLayer, RMSNorm, UngatedMLP, relu_squared
from pagoda_runtime.executor.models.llama import LlamaForCausalLM
from pagoda_runtime.executor.models.llama import config_from_hf as llama_config_from_hf

FAMILY = "Arcee"


class ArceeForCausalLM(LlamaForCausalLM):
    norm_class: type[nn.Module] = RMSNorm  # the layers' norms (Nemotron's are its own)

    def make_layer(
        self, layer: int, ops: AttentionOps, quantization: str, device: torch.device, dtype: torch.dtype
    ) -> nn.Module:
        config, tp = self.config, self.tp
        attention = Attention(config, layer, ops, quantization, device, dtype, tp)
        mlp = UngatedMLP(config, quantization, device, dtype, tp, relu_squared)
        return DecoderLayer(config, attention, mlp, device, dtype, norm=self.norm_class)


def config_from_hf(raw: dict[str, Any], architecture: str) -> ModelConfig:
    check_activation(raw, "hidden_act", "relu2", FAMILY)
    llama = llama_config_from_hf({**raw, "hidden_act": "silu"}, "LlamaForCausalLM")
    return replace(llama, model_type="arcee")
