"""Zhipu's GLM-4 (Glm4ForCausalLM: GLM-4-9B-0414, GLM-4-32B-0414, GLM-Z1): what sets it apart from
the Llama layout.

- norms before and after attention and before and after the MLP (layers.SandwichDecoderLayer,
  Llama's RMSNorm), under its own names;
- RoPE on the first half of each head (partial_rotary_factor 0.5) in interleaved pairs (2i, 2i + 1),
  reordered at load like Cohere's (kernels/rope_cache.rotary_row_order);
- a bias on q, k and v, and gate and up stored as one gate_up_proj, as Phi-3 stores them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from pagoda_runtime.contract.config import ModelConfig
from pagoda_runtime.contract.sizing import ModelArchitecture
from pagoda_runtime.contract.weight_layout import (
    Shapes,
    attention_shapes,
    layer_prefix,
    norm_shapes,
    vocabulary_shapes,
)
from pagoda_runtime.executor.kernels import AttentionOps
from pagoda_runtime.executor.models.hf_config import (
    architecture_fields,
    check_activation,
    rope_parameters,
    rope_scaling,
)
from pagoda_runtime.executor.models.layers import Attention, GatedMLP, RMSNorm, SandwichDecoderLayer
from pagoda_runtime.executor.models.phi3 import Phi3ForCausalLM

FAMILY = "GLM-4"
_LAYER_NORMS = (
    "input_layernorm",
    "post_self_attn_layernorm",
    "post_attention_layernorm",
    "post_mlp_layernorm",
)


class Glm4ForCausalLM(Phi3ForCausalLM):
    """Phi-3's model for its checkpoint's fused gate_up_proj (Phi3ForCausalLM.checkpoint_parts)."""

    def make_layer(
        self, layer: int, ops: AttentionOps, quantization: str, device: torch.device, dtype: torch.dtype
    ) -> nn.Module:
        config, tp = self.config, self.tp
        attention = Attention(config, layer, ops, quantization, device, dtype, tp)
        mlp = GatedMLP(config, quantization, device, dtype, tp)
        return SandwichDecoderLayer(config, attention, mlp, RMSNorm, _LAYER_NORMS, device, dtype)

    def checkpoint_shapes(self) -> Shapes:
        return weight_shapes(self.config)


def weight_shapes(config: ModelConfig) -> Shapes:
    arch = config.architecture
    hidden, width = arch.hidden_size, arch.intermediate_size
    shapes = vocabulary_shapes(arch)
    for i in range(arch.num_hidden_layers):
        layer = layer_prefix(i)
        shapes |= norm_shapes(layer, _LAYER_NORMS, hidden)
        shapes |= attention_shapes(arch, layer)
        shapes[layer + "mlp.gate_up_proj.weight"] = (2 * width, hidden)
        shapes[layer + "mlp.down_proj.weight"] = (hidden, width)
    return shapes


def config_from_hf(raw: dict[str, Any], architecture: str) -> ModelConfig:
    check_activation(raw, "hidden_act", "silu", FAMILY)
    fields = architecture_fields(raw, FAMILY)
    rope = rope_parameters(raw)
    return ModelConfig(
        model_type="glm4",
        architecture=ModelArchitecture(**fields, attention_bias=raw.get("attention_bias", True)),
        rms_norm_eps=raw.get("rms_norm_eps", 1e-5),
        rope_theta=rope.get("rope_theta", 10000.0),
        rope_scaling=rope_scaling(rope, FAMILY),
        bos_token_id=raw.get("bos_token_id"),
        partial_rotary_factor=rope.get("partial_rotary_factor", raw.get("partial_rotary_factor", 0.5)),
        rope_interleaved=True,
    )
