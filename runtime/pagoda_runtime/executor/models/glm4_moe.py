"""Zhipu's GLM-4.5 and GLM-4.6 (Glm4MoeForCausalLM: GLM-4.5, GLM-4.5-Air, GLM-4.6): mixtures of
experts with what sets them apart from Qwen3-MoE:

- routing by sigmoid scores: a correction bias per expert added to the scores that choose, the
  choice limited to the best topk_group of n_group expert groups, the chosen experts' plain scores
  renormalized and scaled by routed_scaling_factor (kernels/moe_routing.SigmoidRouting);
- shared experts, an MLP every token goes through beside its routed experts;
- the first first_k_dense_replace layers dense;
- RoPE on the first half of each head (partial_rotary_factor 0.5, in halves, not interleaved), a
  bias on q, k and v, and per-head q/k norms where use_qk_norm says (GLM-4.6).

The checkpoints' multi-token-prediction layer (num_nextn_predict_layers, numbered after the last
decoder layer) is read only to draft tokens (speculative decoding's mtp method, models/mtp_head.py).

rednote's dots.llm1 (Dots1ForCausalLM) is the same model with other defaults: no attention bias,
per-head q/k norms always, every dimension rotated, the chosen weights not renormalized, and the
Qwen rule for sliding windows.
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
    mlp_shapes,
    norm_shapes,
    sparse_mlp_shapes,
    vocabulary_shapes,
)
from pagoda_runtime.executor.kernels import AttentionOps
from pagoda_runtime.executor.kernels.moe_routing import SigmoidRouting, check_routing
from pagoda_runtime.executor.models.decoder import CausalLM
from pagoda_runtime.executor.models.hf_config import (
    ConfigError,
    architecture_fields,
    check_activation,
    field,
    layer_types,
    nextn_predict_layers,
    rope_parameters,
    rope_scaling,
)
from pagoda_runtime.executor.models.layers import Attention, DecoderLayer, RMSNorm
from pagoda_runtime.executor.models.moe import layer_mlp

FAMILY = "GLM-4.5"
# Per architecture: its model type, and transformers' defaults for what config.json leaves out.
_DEFAULTS = {
    "Glm4MoeForCausalLM": dict(
        model_type="glm4_moe",
        attention_bias=True,
        partial_rotary_factor=0.5,
        norm_topk_prob=True,
        rms_norm_eps=1e-5,
    ),
    "Dots1ForCausalLM": dict(
        model_type="dots1",
        attention_bias=False,
        partial_rotary_factor=1.0,
        norm_topk_prob=False,
        rms_norm_eps=1e-6,
    ),
}


class Glm4MoeForCausalLM(CausalLM):
    def make_layer(
        self, layer: int, ops: AttentionOps, quantization: str, device: torch.device, dtype: torch.dtype
    ) -> nn.Module:
        config, tp = self.config, self.tp
        qk_norm = RMSNorm if config.architecture.qk_norm else None
        attention = Attention(config, layer, ops, quantization, device, dtype, tp, qk_norm)
        mlp = layer_mlp(config, layer, quantization, device, dtype, tp)
        return DecoderLayer(config, attention, mlp, device, dtype)

    def checkpoint_shapes(self) -> Shapes:
        return weight_shapes(self.config)


def weight_shapes(config: ModelConfig) -> Shapes:
    arch = config.architecture
    hidden = arch.hidden_size
    shapes = vocabulary_shapes(arch)
    for i in range(arch.num_hidden_layers):
        layer = layer_prefix(i)
        shapes |= norm_shapes(layer, ("input_layernorm", "post_attention_layernorm"), hidden)
        shapes |= attention_shapes(arch, layer)
        if arch.qk_norm:
            shapes |= norm_shapes(layer + "self_attn.", ("q_norm", "k_norm"), arch.head_dim)
        if arch.is_sparse_layer(i):
            shapes |= sparse_mlp_shapes(arch, layer)
        else:
            shapes |= mlp_shapes(layer + "mlp.", hidden, arch.intermediate_size)
    return shapes


def config_from_hf(raw: dict[str, Any], architecture: str) -> ModelConfig:
    check_activation(raw, "hidden_act", "silu", FAMILY)
    if raw.get("scoring_func", "sigmoid") != "sigmoid":
        raise ConfigError(f"asks for scoring_func {raw['scoring_func']!r}; {FAMILY} models route by sigmoid")
    fields = architecture_fields(raw, FAMILY)
    layers = fields["num_hidden_layers"]
    width = field(raw, "moe_intermediate_size", FAMILY)
    rope = rope_parameters(raw)
    num_experts = raw.get("n_routed_experts") or field(raw, "num_local_experts", FAMILY)
    groups, top_k = raw.get("n_group", 1), field(raw, "num_experts_per_tok", FAMILY)
    try:
        check_routing(num_experts, top_k, SigmoidRouting(groups, raw.get("topk_group", 1)), None)
    except ValueError as exc:
        raise ConfigError(f"routes in a way that cannot work: {exc}") from exc
    defaults = _DEFAULTS[architecture]
    dots = defaults["model_type"] == "dots1"
    return ModelConfig(
        model_type=defaults["model_type"],
        architecture=ModelArchitecture(
            **fields,
            **(layer_types(raw, layers, FAMILY, per_layer=True) if dots else {}),
            attention_bias=raw.get("attention_bias", defaults["attention_bias"]),
            qk_norm=dots or bool(raw.get("use_qk_norm", False)),
            num_experts=num_experts,
            num_experts_per_tok=top_k,
            moe_intermediate_size=width,
            shared_expert_intermediate_size=width * raw.get("n_shared_experts", 1),
            mlp_only_layers=tuple(range(min(raw.get("first_k_dense_replace", 1), layers))),
            router_score_bias=True,
            **nextn_predict_layers(raw),
        ),
        rms_norm_eps=raw.get("rms_norm_eps", defaults["rms_norm_eps"]),
        rope_theta=rope.get("rope_theta", 10000.0),
        rope_scaling=rope_scaling(rope, FAMILY),
        bos_token_id=raw.get("bos_token_id"),
        partial_rotary_factor=rope.get(
            "partial_rotary_factor", raw.get("partial_rotary_factor", defaults["partial_rotary_factor"])
        ),
        norm_topk_prob=raw.get("norm_topk_prob", defaults["norm_topk_prob"]),
        scoring_func="sigmoid",
        n_group=groups,
        topk_group=raw.get("topk_group", 1),
        routed_scaling_factor=raw.get("routed_scaling_factor", 1.0),
    )
