"""AllenAI's OLMoE (OlmoeForCausalLM: OLMoE-1B-7B): Llama's pre-norm layer with OLMo 2's q and k
normed over all heads at once (olmo2.OlmoAttention, tensor parallel included) and a mixture of
experts in every layer (moe.SparseMoE: softmax top-k, the chosen weights renormalized only where
norm_topk_prob says), under Qwen3-MoE's checkpoint names."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from pagoda_runtime.contract.config import ModelConfig
from pagoda_runtime.contract.weight_layout import Shapes, layer_prefix
from pagoda_runtime.executor.kernels import AttentionOps
from pagoda_runtime.executor.models.decoder import Weight
from pagoda_runtime.executor.models.hf_config import ConfigError, field
from pagoda_runtime.executor.models.layers import DecoderLayer
from pagoda_runtime.executor.models.moe import MoECausalLM, layer_mlp, moe_config
from pagoda_runtime.executor.models.moe import weight_shapes as moe_weight_shapes
from pagoda_runtime.executor.models.olmo2 import OlmoAttention, wide_norm_part

FAMILY = "OLMoE"


class OlmoeForCausalLM(MoECausalLM):
    def make_layer(
        self, layer: int, ops: AttentionOps, quantization: str, device: torch.device, dtype: torch.dtype
    ) -> nn.Module:
        config, tp = self.config, self.tp
        attention = OlmoAttention(config, layer, ops, quantization, device, dtype, tp)
        mlp = layer_mlp(config, layer, quantization, device, dtype, tp)
        return DecoderLayer(config, attention, mlp, device, dtype)

    def checkpoint_shapes(self) -> Shapes:
        return weight_shapes(self.config)

    def checkpoint_parts(self, name: str, tensor: Weight) -> Iterator[tuple[str, Weight]]:
        yield name, wide_norm_part(self, name, tensor)


def weight_shapes(config: ModelConfig) -> Shapes:
    """Qwen3-MoE's tensors, the q and k norms as wide as q and k."""
    arch = config.architecture
    shapes = moe_weight_shapes(config)
    for i in range(arch.num_hidden_layers):
        shapes[layer_prefix(i) + "self_attn.q_norm.weight"] = (arch.q_size,)
        shapes[layer_prefix(i) + "self_attn.k_norm.weight"] = (arch.kv_size,)
    return shapes


def config_from_hf(raw: dict[str, Any], architecture: str) -> ModelConfig:
    if raw.get("clip_qkv") is not None:
        raise ConfigError(
            f"clips q, k and v at {raw['clip_qkv']}, which Pagoda's {FAMILY} model does not; serve a "
            "checkpoint without clip_qkv, as the released OLMoE models are"
        )
    return moe_config(
        raw,
        "olmoe",
        FAMILY,
        moe_intermediate_size=field(raw, "intermediate_size", FAMILY),
    )
