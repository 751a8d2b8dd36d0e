"""Qwen3.5 (its language model: Qwen3_5ForCausalLM, and the text of Qwen3_5ForConditionalGeneration
and Qwen3_5MoeForConditionalGeneration, loading/text_of_multimodal.py) and Qwen3-Next
(Qwen3NextForCausalLM): hybrids of gated DeltaNet layers (models/gated_deltanet.py) and, every
full_attention_interval-th layer, gated attention.

- Attention: per-head q/k norms, RoPE on a quarter of each head (partial_rotary_factor), and q_proj
  giving each head's query and then its gate, whose sigmoid scales the attention's output before
  o_proj (ModelArchitecture.attention_output_gate; the gate rows are taken out of q_proj at load).
- Norms: (1 + weight) RMSNorms, Gemma's, around both mixers, on q and k, and at the end.
- MLP: gated (Qwen3.5's dense models), or top-k experts with a shared expert scaled by a per-token
  sigmoid (Qwen3-Next, Qwen3.5-MoE), as Qwen2-MoE's.
- Checkpoints: Qwen3.5's in_proj_qkv, in_proj_z, in_proj_b and in_proj_a, held fused; Qwen3-Next's
  in_proj_qkvz and in_proj_ba interleave q, k, v and z (and b and a) per key head, which loading
  puts in Qwen3.5's order. The multi-token-prediction layer (mtp.*) is left unread.
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
    mlp_shapes,
    norm_shapes,
    vocabulary_shapes,
)
from pagoda_runtime.executor.kernels import AttentionOps
from pagoda_runtime.executor.models.decoder import CausalLM, Weight
from pagoda_runtime.executor.models.gated_deltanet import GatedDeltaNet
from pagoda_runtime.executor.models.gemma import GemmaRMSNorm
from pagoda_runtime.executor.models.hf_config import (
    ConfigError,
    architecture_fields,
    check_activation,
    field,
    rope_parameters,
    rope_scaling,
)
from pagoda_runtime.executor.models.layers import Attention, DecoderLayer, StateDecoderLayer
from pagoda_runtime.executor.models.moe import layer_mlp

FAMILY = "Qwen3.5 / Qwen3-Next"
MODEL_TYPES = {
    "Qwen3_5ForCausalLM": "qwen3_5",
    "Qwen3_5MoeForCausalLM": "qwen3_5_moe",
    "Qwen3NextForCausalLM": "qwen3_next",
}
_KINDS = ("linear_attention", "full_attention")


class Qwen3NextForCausalLM(CausalLM):
    def make_layer(
        self, layer: int, ops: AttentionOps, quantization: str, device: torch.device, dtype: torch.dtype
    ) -> nn.Module:
        config, tp = self.config, self.tp
        mlp = layer_mlp(config, layer, quantization, device, dtype, tp)
        if config.architecture.is_state_layer(layer):
            mixer = GatedDeltaNet(config, quantization, device, dtype, tp)
            return StateDecoderLayer(config, "linear_attn", mixer, mlp, device, dtype, norm=GemmaRMSNorm)
        attention = Attention(config, layer, ops, quantization, device, dtype, tp, qk_norm=GemmaRMSNorm)
        return DecoderLayer(config, attention, mlp, device, dtype, norm=GemmaRMSNorm)

    def make_norm(self, size: int, device: torch.device, dtype: torch.dtype) -> nn.Module:
        return GemmaRMSNorm(size, self.config.rms_norm_eps, device, dtype)

    def checkpoint_shapes(self) -> Shapes:
        return weight_shapes(self.config)

    def _fused_parts(self, mlp_channels: int | None = None, fused_mlp: bool = True) -> dict:
        # checkpoint_parts has already cut this rank's rows of the DeltaNet's projections.
        arch = self.config.architecture.per_rank(self.tp.size)
        parts = super()._fused_parts(mlp_channels, fused_mlp)
        offset = 0
        for name, rows in (
            ("in_proj_qkv", arch.linear_conv_dim),
            ("in_proj_z", arch.linear_value_dim),
            ("in_proj_b", arch.linear_num_value_heads),
            ("in_proj_a", arch.linear_num_value_heads),
        ):
            parts[name] = ("in_proj", offset, slice(None))
            offset += rows
        return parts

    def checkpoint_parts(self, name: str, tensor: Weight) -> Iterator[tuple[str, Weight]]:
        if name.startswith("mtp."):
            return
        name = name.replace(".mlp.shared_expert.", ".mlp.shared_experts.")
        layer, _, leaf = name.partition(".self_attn.")
        if leaf == "q_proj.weight":
            # Each head's query rows, then its gate's.
            arch = self.config.architecture
            query, gate = _whole(tensor, name).view(arch.num_attention_heads, 2, arch.head_dim, -1).unbind(1)
            yield f"{layer}.self_attn.q_proj.weight", query.reshape(arch.q_size, -1)
            yield f"{layer}.self_attn.q_gate.weight", gate.reshape(arch.q_size, -1)
            return
        layer, _, leaf = name.partition(".linear_attn.")
        if not leaf:
            yield name, tensor
            return
        parts = [(name, tensor)]
        if leaf in ("in_proj_qkvz.weight", "in_proj_ba.weight"):
            parts = self._next_projections(layer + ".linear_attn.", leaf, _whole(tensor, name))
        for part_name, part in parts:
            yield part_name, self._rank_rows(part_name, part)

    def _rank_rows(self, name: str, tensor: Weight) -> Weight:
        """This rank's rows of a DeltaNet tensor: of each of its consecutive parts (q, k and v; z;
        b; a; the time-step bias and A), those of the rank's key heads and their value heads."""
        arch = self.config.architecture
        k, v, heads = arch.linear_key_dim, arch.linear_value_dim, arch.linear_num_value_heads
        layout = {
            "in_proj_qkv.weight": (k, k, v),
            "conv1d.weight": (k, k, v),
            "in_proj_z.weight": (v,),
            "in_proj_b.weight": (heads,),
            "in_proj_a.weight": (heads,),
            "dt_bias": (heads,),
            "A_log": (heads,),
        }.get(name.rpartition(".linear_attn.")[2])
        if layout is None:
            return tensor
        return self.tp.rows_of_parts(_whole(tensor, name), layout, "gated DeltaNet heads")

    def _next_projections(self, prefix: str, leaf: str, tensor: torch.Tensor) -> Iterator[tuple[str, Weight]]:
        """Qwen3-Next's fused input projections, per key head [q, k, v, z] and [b, a], as Qwen3.5's."""
        arch = self.config.architecture
        groups, per_group = (
            arch.linear_num_key_heads,
            arch.linear_num_value_heads // arch.linear_num_key_heads,
        )
        grouped = tensor.view(groups, -1, tensor.shape[-1])
        if leaf == "in_proj_ba.weight":
            b, a = grouped.split([per_group, per_group], dim=1)
            yield prefix + "in_proj_b.weight", b.reshape(-1, tensor.shape[-1])
            yield prefix + "in_proj_a.weight", a.reshape(-1, tensor.shape[-1])
            return
        k_dim, v_width = arch.linear_key_head_dim, per_group * arch.linear_value_head_dim
        q, k, v, z = grouped.split([k_dim, k_dim, v_width, v_width], dim=1)
        qkv = torch.cat([part.reshape(-1, tensor.shape[-1]) for part in (q, k, v)])
        yield prefix + "in_proj_qkv.weight", qkv
        yield prefix + "in_proj_z.weight", z.reshape(-1, tensor.shape[-1])


def _whole(tensor: Weight, name: str) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"the checkpoint holds {name} quantized; a {FAMILY} model reads it as float")
    return tensor


def weight_shapes(config: ModelConfig) -> Shapes:
    arch = config.architecture
    hidden = arch.hidden_size
    next_layout = config.model_type == "qwen3_next"
    shapes = vocabulary_shapes(arch)
    for i in range(arch.num_hidden_layers):
        layer = layer_prefix(i)
        shapes |= norm_shapes(layer, ("input_layernorm", "post_attention_layernorm"), hidden)
        if arch.is_state_layer(i):
            shapes |= _linear_attention_shapes(arch, layer + "linear_attn.", next_layout)
        else:
            shapes |= attention_shapes(arch, layer)
            shapes[layer + "self_attn.q_proj.weight"] = (2 * arch.q_size, hidden)
            shapes |= norm_shapes(layer + "self_attn.", ("q_norm", "k_norm"), arch.head_dim)
        if not arch.is_sparse_layer(i):
            shapes |= mlp_shapes(layer + "mlp.", hidden, arch.intermediate_size)
            continue
        shapes[layer + "mlp.gate.weight"] = (arch.num_experts, hidden)
        for e in range(arch.num_experts):
            shapes |= mlp_shapes(f"{layer}mlp.experts.{e}.", hidden, arch.moe_intermediate_size)
        shapes |= mlp_shapes(layer + "mlp.shared_expert.", hidden, arch.shared_expert_intermediate_size)
        shapes[layer + "mlp.shared_expert_gate.weight"] = (1, hidden)
    return shapes


def _linear_attention_shapes(arch: ModelArchitecture, prefix: str, next_layout: bool) -> Shapes:
    hidden, heads = arch.hidden_size, arch.linear_num_value_heads
    shapes = {
        prefix + "conv1d.weight": (arch.linear_conv_dim, 1, arch.linear_conv_kernel),
        prefix + "dt_bias": (heads,),
        prefix + "A_log": (heads,),
        prefix + "norm.weight": (arch.linear_value_head_dim,),
        prefix + "out_proj.weight": (hidden, arch.linear_value_dim),
    }
    if next_layout:
        shapes[prefix + "in_proj_qkvz.weight"] = (arch.linear_conv_dim + arch.linear_value_dim, hidden)
        shapes[prefix + "in_proj_ba.weight"] = (2 * heads, hidden)
    else:
        shapes[prefix + "in_proj_qkv.weight"] = (arch.linear_conv_dim, hidden)
        shapes[prefix + "in_proj_z.weight"] = (arch.linear_value_dim, hidden)
        shapes[prefix + "in_proj_b.weight"] = (heads, hidden)
        shapes[prefix + "in_proj_a.weight"] = (heads, hidden)
    return shapes


def _layer_kinds(raw: dict[str, Any], layers: int) -> tuple[str, ...]:
    kinds = raw.get("layer_types")
    if kinds is None:
        interval = raw.get("full_attention_interval", 4)
        kinds = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]
    if len(kinds) != layers or set(kinds) - set(_KINDS):
        raise ConfigError(
            f"has layer_types {kinds!r}; a {FAMILY} model lists linear_attention or full_attention per layer"
        )
    if "full_attention" not in kinds:
        raise ConfigError(
            "has no attention layer; Pagoda serves Qwen3.5 and Qwen3-Next as hybrids of gated DeltaNet "
            "and attention layers"
        )
    return tuple(kinds)


def _experts(raw: dict[str, Any], layers: int) -> dict[str, Any]:
    """The mixture-of-experts fields of Qwen3-Next and Qwen3.5-MoE (none for Qwen3.5's dense models)."""
    if not raw.get("num_experts"):
        return {}
    step = raw.get("decoder_sparse_step", 1) or 1
    dense = set(raw.get("mlp_only_layers") or ()) | {i for i in range(layers) if (i + 1) % step}
    shared = field(raw, "shared_expert_intermediate_size", FAMILY)
    return dict(
        num_experts=raw["num_experts"],
        num_experts_per_tok=field(raw, "num_experts_per_tok", FAMILY),
        moe_intermediate_size=field(raw, "moe_intermediate_size", FAMILY),
        shared_expert_intermediate_size=shared,
        shared_expert_gate=True,
        mlp_only_layers=tuple(sorted(dense)),
    )


def config_from_hf(raw: dict[str, Any], architecture: str) -> ModelConfig:
    check_activation(raw, "hidden_act", "silu", FAMILY)
    if raw.get("attention_bias"):
        raise ConfigError("sets attention_bias; Pagoda serves Qwen3.5's and Qwen3-Next's unbiased attention")
    fields = architecture_fields(raw, FAMILY)
    layers = fields["num_hidden_layers"]
    if "intermediate_size" not in raw:  # a model whose every layer holds experts
        fields["intermediate_size"] = field(raw, "moe_intermediate_size", FAMILY)
    kinds = _layer_kinds(raw, layers)
    rope = rope_parameters(raw)
    arch = ModelArchitecture(
        **fields,
        layer_types=kinds,
        attention_output_gate=True,
        linear_num_key_heads=field(raw, "linear_num_key_heads", FAMILY),
        linear_num_value_heads=field(raw, "linear_num_value_heads", FAMILY),
        linear_key_head_dim=field(raw, "linear_key_head_dim", FAMILY),
        linear_value_head_dim=field(raw, "linear_value_head_dim", FAMILY),
        linear_conv_kernel=raw.get("linear_conv_kernel_dim", 4),
        **_experts(raw, layers),
    )
    return ModelConfig(
        model_type=MODEL_TYPES[architecture],
        architecture=arch,
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
        rope_theta=rope.get("rope_theta", 10000.0),
        # Qwen3.5's multimodal rotary sections all take a text token's position: the plain RoPE.
        rope_scaling=rope_scaling({k: v for k, v in rope.items() if not k.startswith("mrope")}, FAMILY),
        partial_rotary_factor=rope.get("partial_rotary_factor", raw.get("partial_rotary_factor", 0.25)),
        bos_token_id=raw.get("bos_token_id"),
        norm_topk_prob=raw.get("norm_topk_prob", True),
    )
