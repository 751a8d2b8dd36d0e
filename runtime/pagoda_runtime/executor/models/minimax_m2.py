"""MiniMax's MiniMax-M2 (MiniMaxM2ForCausalLM: MiniMax-M2, M2.1): a mixture of experts in every layer,
built from parts other families have:

- q and k normed over all heads at once, as OLMo 2's (olmo2.OlmoAttention, tensor parallel
  included), before RoPE on part of each head (rotary_dim 64 of 128);
- routing by sigmoid scores with a correction bias per expert, no groups, the chosen scores
  renormalized (kernels/moe_routing.SigmoidRouting);
- Mixtral's checkpoint names (block_sparse_moe, experts' w1/w3/w2), with the correction bias on
  the block rather than on its gate.

Its released checkpoints are block-quantized FP8 (loading/fp8_blocks.py). The multi-token-prediction
modules they hold (num_mtp_modules) are not read.
"""

from __future__ import annotations

from collections.abc import Iterator
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
from pagoda_runtime.executor.models.decoder import Weight
from pagoda_runtime.executor.models.hf_config import (
    architecture_fields,
    check_activation,
    field,
    rope_parameters,
    rope_scaling,
)
from pagoda_runtime.executor.models.layers import DecoderLayer
from pagoda_runtime.executor.models.moe import MixtralForCausalLM, SparseMoE
from pagoda_runtime.executor.models.olmo2 import OlmoAttention, wide_norm_part

FAMILY = "MiniMax-M2"
_BLOCK_BIAS, _GATE_BIAS = (
    ".block_sparse_moe.e_score_correction_bias",
    ".block_sparse_moe.gate.e_score_correction_bias",
)


class MiniMaxM2ForCausalLM(MixtralForCausalLM):
    """Mixtral's model for its checkpoint names (MixtralForCausalLM.checkpoint_parts)."""

    def make_layer(
        self, layer: int, ops: AttentionOps, quantization: str, device: torch.device, dtype: torch.dtype
    ) -> nn.Module:
        config, tp = self.config, self.tp
        attention = OlmoAttention(config, layer, ops, quantization, device, dtype, tp)
        return DecoderLayer(
            config, attention, SparseMoE(config, quantization, device, dtype, tp), device, dtype
        )

    def checkpoint_shapes(self) -> Shapes:
        return weight_shapes(self.config)

    def checkpoint_parts(self, name: str, tensor: Weight) -> Iterator[tuple[str, Weight]]:
        # The router holds the correction bias here (moe.Router), as GLM-4.5's checkpoints place it.
        yield from super().checkpoint_parts(
            name.replace(_BLOCK_BIAS, _GATE_BIAS), wide_norm_part(self, name, tensor)
        )


def weight_shapes(config: ModelConfig) -> Shapes:
    arch = config.architecture
    hidden, width = arch.hidden_size, arch.moe_intermediate_size
    shapes = vocabulary_shapes(arch)
    for i in range(arch.num_hidden_layers):
        layer = layer_prefix(i)
        shapes |= norm_shapes(layer, ("input_layernorm", "post_attention_layernorm"), hidden)
        shapes |= attention_shapes(arch, layer)
        shapes[layer + "self_attn.q_norm.weight"] = (arch.q_size,)
        shapes[layer + "self_attn.k_norm.weight"] = (arch.kv_size,)
        block = layer + "block_sparse_moe."
        shapes[block + "gate.weight"] = (arch.num_experts, hidden)
        shapes[block + "e_score_correction_bias"] = (arch.num_experts,)
        for e in range(arch.num_experts):
            expert = f"{block}experts.{e}."
            shapes |= {
                expert + "w1.weight": (width, hidden),
                expert + "w3.weight": (width, hidden),
                expert + "w2.weight": (hidden, width),
            }
    return shapes


def config_from_hf(raw: dict[str, Any], architecture: str) -> ModelConfig:
    check_activation(raw, "hidden_act", "silu", FAMILY)
    fields = architecture_fields(raw, FAMILY)
    rope = rope_parameters(raw)
    # Released configs give rotary_dim; transformers 5 writes partial_rotary_factor.
    partial = (
        rope.get("partial_rotary_factor") or raw.get("rotary_dim", fields["head_dim"]) / fields["head_dim"]
    )
    return ModelConfig(
        model_type="minimax_m2",
        architecture=ModelArchitecture(
            **fields,
            num_experts=field(raw, "num_local_experts", FAMILY),
            num_experts_per_tok=field(raw, "num_experts_per_tok", FAMILY),
            # Every layer is sparse and its experts are intermediate_size wide, as Mixtral's.
            moe_intermediate_size=fields["intermediate_size"],
            router_score_bias=True,
        ),
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
        rope_theta=rope.get("rope_theta", 5000000.0),
        rope_scaling=rope_scaling(rope, FAMILY),
        bos_token_id=raw.get("bos_token_id"),
        partial_rotary_factor=partial,
        norm_topk_prob=True,
        scoring_func="sigmoid",
    )
