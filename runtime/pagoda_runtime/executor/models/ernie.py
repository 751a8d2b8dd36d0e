"""Baidu's ERNIE 4.5 (Ernie4_5ForCausalLM: ERNIE-4.5-0.3B; Ernie4_5_MoeForCausalLM: ERNIE-4.5-21B-A3B,
ERNIE-4.5-300B-A47B): Llama's layer with what sets it apart:

- RoPE on interleaved pairs (dimensions 2i and 2i + 1 rotate together), the q and k rows reordered
  as they load (kernels/rope_cache.rotary_row_order);
- the MoE layers' router ranks the experts by softmax score plus a correction bias per expert
  (moe_use_aux_free), weighs them by the plain softmax renormalized (kernels/moe_routing.route);
  shared experts beside the routed ones; the layers from moe_layer_start_index to
  moe_layer_end_index, every moe_layer_interval-th, sparse, the others dense.

The correction bias is stored as mlp.moe_statics.e_score_correction_bias [1, E]; the router's
moe_norm_min (1e-12) floors the renormalizing sum, which the top experts' softmax never nears.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pagoda_runtime.contract.config import ModelConfig
from pagoda_runtime.contract.sizing import ModelArchitecture
from pagoda_runtime.contract.weight_layout import (
    SCORE_BIAS,
    Shapes,
    attention_shapes,
    layer_prefix,
    mlp_shapes,
    norm_shapes,
    sparse_mlp_shapes,
    vocabulary_shapes,
)
from pagoda_runtime.executor.models.decoder import Weight
from pagoda_runtime.executor.models.hf_config import (
    ConfigError,
    architecture_fields,
    check_activation,
    field,
    rope_parameters,
    rope_scaling,
)
from pagoda_runtime.executor.models.moe import MoECausalLM

FAMILY = "ERNIE 4.5"
MODEL_TYPES = {"Ernie4_5ForCausalLM": "ernie4_5", "Ernie4_5_MoeForCausalLM": "ernie4_5_moe"}
_STATICS = "mlp.moe_statics.e_score_correction_bias"


class ErnieForCausalLM(MoECausalLM):
    def checkpoint_shapes(self) -> Shapes:
        return weight_shapes(self.config)

    def checkpoint_parts(self, name: str, tensor: Weight) -> Iterator[tuple[str, Weight]]:
        layer, statics, _ = name.partition(_STATICS)
        if statics:
            yield layer + SCORE_BIAS, tensor.reshape(-1)
        else:
            yield name, tensor


def weight_shapes(config: ModelConfig) -> Shapes:
    arch = config.architecture
    hidden = arch.hidden_size
    shapes = vocabulary_shapes(arch)
    for i in range(arch.num_hidden_layers):
        layer = layer_prefix(i)
        shapes |= norm_shapes(layer, ("input_layernorm", "post_attention_layernorm"), hidden)
        shapes |= attention_shapes(arch, layer)
        if arch.is_sparse_layer(i):
            shapes |= sparse_mlp_shapes(arch, layer, (_STATICS, (1, arch.num_experts)))
        else:
            shapes |= mlp_shapes(layer + "mlp.", hidden, arch.intermediate_size)
    return shapes


def _experts(raw: dict[str, Any], layers: int) -> dict[str, Any]:
    """The ModelArchitecture fields of the mixture of experts (ERNIE's config names, or
    transformers' num_experts and num_experts_per_tok for them)."""
    num_experts = raw.get("moe_num_experts") or raw.get("num_experts")
    top_k = raw.get("moe_k") or raw.get("num_experts_per_tok")
    if not num_experts or not top_k:
        raise ConfigError(f"lacks moe_num_experts or moe_k, which an {FAMILY} MoE model needs")
    if not raw.get("moe_use_aux_free", True):
        raise ConfigError(
            f"sets moe_use_aux_free false; Pagoda serves {FAMILY}'s routing with its correction bias, "
            "as every published checkpoint routes"
        )
    start = raw.get("moe_layer_start_index", 0)
    end = raw.get("moe_layer_end_index", layers - 1)
    end = layers - 1 if end in (None, -1) else end
    interval = raw.get("moe_layer_interval", 1) or 1
    sparse = {i for i in range(layers) if (i + 1) % interval == 0 and start <= i <= end}
    width = field(raw, "moe_intermediate_size", FAMILY)
    return dict(
        num_experts=num_experts,
        num_experts_per_tok=top_k,
        moe_intermediate_size=width,
        shared_expert_intermediate_size=width * (raw.get("moe_num_shared_experts") or 0),
        mlp_only_layers=tuple(i for i in range(layers) if i not in sparse),
        router_score_bias=True,
    )


def config_from_hf(raw: dict[str, Any], architecture: str) -> ModelConfig:
    check_activation(raw, "hidden_act", "silu", FAMILY)
    if raw.get("use_bias", False):
        raise ConfigError(
            f"sets use_bias; Pagoda serves {FAMILY} models without biases on their projections, as "
            "they are published"
        )
    fields = architecture_fields(raw, FAMILY)
    moe = MODEL_TYPES[architecture] == "ernie4_5_moe"
    rope = rope_parameters(raw)
    return ModelConfig(
        model_type=MODEL_TYPES[architecture],
        architecture=ModelArchitecture(
            **fields, **(_experts(raw, fields["num_hidden_layers"]) if moe else {})
        ),
        rms_norm_eps=raw.get("rms_norm_eps", 1e-5),
        rope_theta=rope.get("rope_theta", 10000.0),
        rope_scaling=rope_scaling(rope, FAMILY),
        bos_token_id=raw.get("bos_token_id"),
        rope_interleaved=True,
        norm_topk_prob=moe,
    )
