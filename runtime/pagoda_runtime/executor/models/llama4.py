"""Meta's Llama 4 (Llama4ForConditionalGeneration, served for its text: Llama-4-Scout-17B-16E,
Llama-4-Maverick-17B-128E; Llama4ForCausalLM): Llama's pre-norm layer with what sets it apart:

- three layers in four rotate (interleaved pairs, as ERNIE's: kernels/rope_cache.rotary_row_order)
  and attend within chunks of attention_chunk_size tokens (a token sees the earlier tokens of its
  own chunk only: the chunked attention of the paged kernels); every fourth (no_rope_layers' zeros)
  attends to the whole context without rotary embeddings, its queries scaled by position
  (attention temperature tuning, config.AttentionTemperature);
- the rotating layers' q and k normed per head without weights (use_qk_norm; transformers norms
  after rotating, which a rotation leaves unchanged, so here before it as every family does);
- mixture-of-experts layers (moe_layers: all of Scout's, every other of Maverick's, the rest dense
  MLPs intermediate_size_mlp wide): one expert per token, chosen by the top logit and weighted by
  its sigmoid, the weight scaling the token's input to the expert rather than its output; a shared
  expert beside it. The checkpoint holds each layer's experts as two fused tensors, gate_up_proj
  [E, H, 2I] (gate then up along the last axis) and down_proj [E, I, H].

Images are not served (loading/text_of_multimodal.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from pagoda_runtime.contract.config import AttentionTemperature, ModelConfig
from pagoda_runtime.contract.sizing import ModelArchitecture
from pagoda_runtime.contract.weight_layout import (
    Shapes,
    attention_shapes,
    fused_expert_shapes,
    layer_prefix,
    mlp_shapes,
    norm_shapes,
    vocabulary_shapes,
)
from pagoda_runtime.executor.kernels import AttentionOps, rms_norm
from pagoda_runtime.executor.models.decoder import Weight
from pagoda_runtime.executor.models.hf_config import (
    ConfigError,
    architecture_fields,
    attention_biases,
    check_activation,
    field,
    rope_parameters,
    rope_scaling,
)
from pagoda_runtime.executor.models.layers import Attention, DecoderLayer
from pagoda_runtime.executor.models.moe import MoECausalLM, fused_expert_parts, layer_mlp

FAMILY = "Llama 4"
_LAYER_KINDS = ("chunked_attention", "full_attention")
# The checkpoint's names in a layer's feed_forward -> the model's (moe.SparseMoE's and GatedMLP's).
_RENAMED = (
    (".feed_forward.router.", ".mlp.gate."),
    (".feed_forward.shared_expert.", ".mlp.shared_experts."),
    (".feed_forward.", ".mlp."),
)


class UnitRMSNorm(nn.Module):
    """An RMSNorm without weights (Llama4TextL2Norm): nothing to load."""

    def __init__(self, size: int, eps: float, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        self.register_buffer("ones", torch.ones(size, device=device, dtype=dtype), persistent=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rms_norm(x, self.ones, self.eps)


class QueryTemperature:
    """(positions, q [T, heads, head_dim]) -> q scaled as AttentionTemperature says, rounded to q's
    dtype after the float32 product (as transformers computes it)."""

    def __init__(self, temperature: AttentionTemperature) -> None:
        self.floor_scale, self.attn_scale = temperature.floor_scale, temperature.attn_scale

    def __call__(self, positions: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        scales = (
            torch.log1p(torch.floor((positions.float() + 1.0) / self.floor_scale)) * self.attn_scale + 1.0
        )
        return (q * scales[:, None, None]).to(q.dtype)


class Llama4ForCausalLM(MoECausalLM):
    def make_layer(
        self, layer: int, ops: AttentionOps, quantization: str, device: torch.device, dtype: torch.dtype
    ) -> nn.Module:
        config, tp = self.config, self.tp
        rotates = layer not in config.no_rope_layers
        qk_norm = UnitRMSNorm if config.qk_l2_norm and rotates else None
        temperature = config.attn_temperature
        query_scale = QueryTemperature(temperature) if temperature is not None and not rotates else None
        attention = Attention(config, layer, ops, quantization, device, dtype, tp, qk_norm, query_scale)
        mlp = layer_mlp(config, layer, quantization, device, dtype, tp)
        return DecoderLayer(config, attention, mlp, device, dtype)

    def checkpoint_shapes(self) -> Shapes:
        return weight_shapes(self.config)

    def checkpoint_parts(self, name: str, tensor: Weight) -> Iterator[tuple[str, Weight]]:
        layer, experts, fused = name.partition(".feed_forward.experts.")
        if experts:
            yield from fused_expert_parts(f"{layer}.mlp.experts.", fused, tensor, FAMILY)
            return
        for old, new in _RENAMED:
            name = name.replace(old, new)
        yield name, tensor


def weight_shapes(config: ModelConfig) -> Shapes:
    arch = config.architecture
    hidden, experts = arch.hidden_size, arch.num_experts
    shapes = vocabulary_shapes(arch)
    for i in range(arch.num_hidden_layers):
        layer = layer_prefix(i)
        shapes |= norm_shapes(layer, ("input_layernorm", "post_attention_layernorm"), hidden)
        shapes |= attention_shapes(arch, layer)
        block = layer + "feed_forward."
        if not arch.is_sparse_layer(i):
            shapes |= mlp_shapes(block, hidden, arch.intermediate_size)
            continue
        shapes[block + "router.weight"] = (experts, hidden)
        shapes |= fused_expert_shapes(arch, block)
        shapes |= mlp_shapes(block + "shared_expert.", hidden, arch.shared_expert_intermediate_size)
    return shapes


def _flags(raw: dict[str, Any], key: str, layers: int, default: list) -> list:
    values = raw.get(key)
    values = default if values is None else list(values)
    if len(values) != layers:
        raise ConfigError(
            f"lists {key} for {len(values)} layers; a {FAMILY} model needs one for each of {layers}"
        )
    return values


def _layers(raw: dict[str, Any], layers: int) -> dict[str, Any]:
    """no_rope_layers (a flag per layer, 0 where it does not rotate), the chunked layers and the
    mixture-of-experts layers, with transformers' defaults where config.json leaves them out."""
    interval = raw.get("no_rope_layer_interval") or 4
    rotates = _flags(raw, "no_rope_layers", layers, [int((i + 1) % interval != 0) for i in range(layers)])
    kinds = _flags(raw, "layer_types", layers, [_LAYER_KINDS[not flag] for flag in rotates])
    unknown = sorted(set(kinds) - set(_LAYER_KINDS))
    if unknown:
        raise ConfigError(
            f"has layer_types {unknown!r}; a {FAMILY} model has {' and '.join(_LAYER_KINDS)} layers"
        )
    step = raw.get("interleave_moe_layer_step") or 1
    sparse = raw.get("moe_layers")
    sparse = set(range(step - 1, layers, step) if sparse is None else sparse)
    chunk = raw.get("attention_chunk_size")
    windows = {}
    if chunk and "chunked_attention" in kinds:
        windows = {"attention_chunk_size": chunk, "layer_types": tuple(kinds)}
    return dict(
        no_rope_layers=tuple(i for i, flag in enumerate(rotates) if not flag),
        windows=windows,
        mlp_only_layers=tuple(i for i in range(layers) if i not in sparse),
    )


def config_from_hf(raw: dict[str, Any], architecture: str) -> ModelConfig:
    check_activation(raw, "hidden_act", "silu", FAMILY)
    top_k = raw.get("num_experts_per_tok", 1)
    if top_k != 1:
        raise ConfigError(
            f"routes each token to {top_k} experts; Pagoda serves {FAMILY}'s routing, whose weight scales "
            "the input of one expert per token, as every published checkpoint routes"
        )
    fields = architecture_fields(raw, FAMILY)
    expert_width = fields["intermediate_size"]
    fields["intermediate_size"] = field(raw, "intermediate_size_mlp", FAMILY)
    layers = _layers(raw, fields["num_hidden_layers"])
    rope = rope_parameters(raw)
    temperature = None
    if raw.get("attn_temperature_tuning", True):
        temperature = AttentionTemperature(
            float(raw.get("floor_scale", 8192)), float(raw.get("attn_scale", 0.1))
        )
    return ModelConfig(
        model_type="llama4",
        architecture=ModelArchitecture(
            **fields,
            **layers["windows"],
            **attention_biases(raw),
            num_experts=field(raw, "num_local_experts", FAMILY),
            num_experts_per_tok=1,
            moe_intermediate_size=expert_width,
            shared_expert_intermediate_size=expert_width,
            mlp_only_layers=layers["mlp_only_layers"],
        ),
        rms_norm_eps=raw.get("rms_norm_eps", 1e-5),
        rope_theta=rope.get("rope_theta", 500000.0),
        rope_scaling=rope_scaling(rope, FAMILY),
        bos_token_id=raw.get("bos_token_id"),
        no_rope_layers=layers["no_rope_layers"],
        rope_interleaved=True,
        scoring_func="sigmoid",
        qk_l2_norm=bool(raw.get("use_qk_norm", True)),
        attn_temperature=temperature,
        router_weight_on_input=True,
    )
