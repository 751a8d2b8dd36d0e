"""Phi-3 and Phi-4-mini: the Llama layout whose checkpoints store q, k and v as one qkv_proj and gate
and up as one gate_up_proj, with LongRoPE (short factors up to the original context, long factors
past it: kernels/rope_cache.py) and, for Phi-4-mini, RoPE on the first 3/4 of each head
(partial_rotary_factor, which CausalLM.load_weights handles for any family)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from pagoda_runtime.contract.config import ModelConfig, RopeScaling
from pagoda_runtime.contract.sizing import ModelArchitecture
from pagoda_runtime.contract.weight_layout import layer_prefix, norm_shapes, vocabulary_shapes
from pagoda_runtime.executor.kernels import AttentionOps
from pagoda_runtime.executor.models.decoder import CausalLM, Weight
from pagoda_runtime.executor.models.hf_config import (
    ConfigError,
    architecture_fields,
    check_activation,
    layer_types,
    rope_parameters,
    rope_scaling,
)
from pagoda_runtime.executor.models.layers import Attention, DecoderLayer, GatedMLP
from pagoda_runtime.executor.quantization import PackedWeight


def _rows(tensor: Weight, rows: slice) -> Weight:
    return tensor.rows(rows) if isinstance(tensor, PackedWeight) else tensor[rows]


class Phi3ForCausalLM(CausalLM):
    def make_layer(
        self, layer: int, ops: AttentionOps, quantization: str, device: torch.device, dtype: torch.dtype
    ) -> nn.Module:
        config, tp = self.config, self.tp
        attention = Attention(config, layer, ops, quantization, device, dtype, tp)
        mlp = GatedMLP(config, quantization, device, dtype, tp)
        return DecoderLayer(config, attention, mlp, device, dtype)

    def checkpoint_shapes(self) -> dict[str, tuple[int, ...]]:
        return weight_shapes(self.config)

    def checkpoint_parts(self, name: str, tensor: Weight) -> Iterator[tuple[str, Weight]]:
        """The fused qkv_proj and gate_up_proj cut into the unfused parts, so that each rank takes
        its heads and channels of each as in every other family."""
        arch = self.config.architecture
        owner, _, leaf = name.rpartition(".")
        if owner.endswith(".qkv_proj"):
            base = owner.removesuffix("qkv_proj")
            q, kv = arch.q_size, arch.kv_size
            yield f"{base}q_proj.{leaf}", _rows(tensor, slice(0, q))
            yield f"{base}k_proj.{leaf}", _rows(tensor, slice(q, q + kv))
            yield f"{base}v_proj.{leaf}", _rows(tensor, slice(q + kv, q + 2 * kv))
        elif owner.endswith(".gate_up_proj"):
            base = owner.removesuffix("gate_up_proj")
            width = arch.intermediate_size
            yield f"{base}gate_proj.{leaf}", _rows(tensor, slice(0, width))
            yield f"{base}up_proj.{leaf}", _rows(tensor, slice(width, 2 * width))
        else:
            yield name, tensor


def weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    arch = config.architecture
    hidden, width = arch.hidden_size, arch.intermediate_size
    shapes = vocabulary_shapes(arch)
    for i in range(arch.num_hidden_layers):
        layer = layer_prefix(i)
        shapes |= norm_shapes(layer, ("input_layernorm", "post_attention_layernorm"), hidden)
        shapes[layer + "self_attn.qkv_proj.weight"] = (arch.q_size + 2 * arch.kv_size, hidden)
        shapes[layer + "self_attn.o_proj.weight"] = (hidden, arch.q_size)
        shapes[layer + "mlp.gate_up_proj.weight"] = (2 * width, hidden)
        shapes[layer + "mlp.down_proj.weight"] = (hidden, width)
    return shapes


def _longrope(params: dict[str, Any], raw: dict[str, Any], family: str) -> RopeScaling:
    original = params.get("original_max_position_embeddings") or raw.get("original_max_position_embeddings")
    if original is None or "short_factor" not in params or "long_factor" not in params:
        raise ConfigError(
            f"asks for LongRoPE without original_max_position_embeddings, short_factor and long_factor, "
            f"which a {family} model needs"
        )
    return RopeScaling(
        "longrope",
        factor=params.get("factor") or raw.get("max_position_embeddings", original) / original,
        original_max_position_embeddings=original,
        short_factor=tuple(params["short_factor"]),
        long_factor=tuple(params["long_factor"]),
        attention_factor=params.get("attention_factor"),
    )


def config_from_hf(raw: dict[str, Any], architecture: str) -> ModelConfig:
    family = "Phi-3"
    check_activation(raw, "hidden_act", "silu", family)
    fields = architecture_fields(raw, family)
    rope = rope_parameters(raw)
    kind = rope.get("rope_type", rope.get("type", "default"))
    scaling = _longrope(rope, raw, family) if kind in ("longrope", "su") else rope_scaling(rope, family)
    # Phi-3's sliding_window, where set, applies to every layer.
    windows = layer_types(raw, fields["num_hidden_layers"], family, per_layer=False)
    return ModelConfig(
        model_type="phi3",
        architecture=ModelArchitecture(**fields, **windows),
        rms_norm_eps=raw.get("rms_norm_eps", 1e-5),
        rope_theta=rope.get("rope_theta", 10000.0),
        rope_scaling=scaling,
        bos_token_id=raw.get("bos_token_id"),
        partial_rotary_factor=rope.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0)),
    )


def config_from_gguf(
    arch: str, meta: dict[str, Any], tensors: set[str], read: Callable[[str], torch.Tensor]
) -> ModelConfig:
    """phi3 GGUF files, as llama.cpp's converter writes them: LongRoPE's factors as the tensors
    rope_factors_short and rope_factors_long, the rotated dimensions as rope.dimension_count."""
    heads = meta[f"{arch}.attention.head_count"]
    hidden = meta[f"{arch}.embedding_length"]
    head_dim = hidden // heads
    window = meta.get(f"{arch}.attention.sliding_window")
    layers = meta[f"{arch}.block_count"]
    context = meta[f"{arch}.context_length"]
    scaling = None
    if "rope_factors_long.weight" in tensors:
        original = meta[f"{arch}.rope.scaling.original_context_length"]
        scaling = RopeScaling(
            "longrope",
            factor=context / original,
            original_max_position_embeddings=original,
            short_factor=tuple(read("rope_factors_short.weight").tolist()),
            long_factor=tuple(read("rope_factors_long.weight").tolist()),
            attention_factor=meta.get(f"{arch}.rope.scaling.attn_factor"),
        )
    return ModelConfig(
        model_type="phi3",
        architecture=ModelArchitecture(
            num_hidden_layers=layers,
            hidden_size=hidden,
            intermediate_size=meta[f"{arch}.feed_forward_length"],
            num_attention_heads=heads,
            num_key_value_heads=meta.get(f"{arch}.attention.head_count_kv", heads),
            head_dim=head_dim,
            vocab_size=meta.get(f"{arch}.vocab_size", len(meta["tokenizer.ggml.tokens"])),
            max_position_embeddings=context,
            tie_word_embeddings="output.weight" not in tensors,
            sliding_window=window or None,
        ),
        rms_norm_eps=meta[f"{arch}.attention.layer_norm_rms_epsilon"],
        rope_theta=meta.get(f"{arch}.rope.freq_base", 10000.0),
        rope_scaling=scaling,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        partial_rotary_factor=meta.get(f"{arch}.rope.dimension_count", head_dim) / head_dim,
    )


GGUF_NAMES = {
    "attn_qkv.weight": "self_attn.qkv_proj.weight",
    "ffn_up.weight": "mlp.gate_up_proj.weight",
}
