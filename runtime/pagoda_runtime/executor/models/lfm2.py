"""Liquid AI's LFM2 (Lfm2ForCausalLM: LFM2-350M, 700M, 1.2B, 2.6B): most layers mix tokens with a
gated short convolution (models/short_conv.py), the others (config.json's full_attn_idxs) with
attention whose queries and keys are RMS-normalized per head; every layer then has Llama's gated
MLP, whose width config.json gives before LFM2's own rule (two thirds of block_ff_dim, times
block_ffn_dim_multiplier, rounded up to block_multiple_of). Its final norm is called
embedding_norm; its layers name their norms operator_norm and ffn_norm, the attention's output
projection out_proj and its norms q_layernorm and k_layernorm, the MLP feed_forward.w1, w3 and w2:
loading reads them under the Llama layout's names.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from pagoda_runtime.contract.config import ModelConfig
from pagoda_runtime.contract.sizing import ModelArchitecture
from pagoda_runtime.contract.weight_layout import Shapes, attention_shapes, layer_prefix, mlp_shapes
from pagoda_runtime.executor.kernels import AttentionOps
from pagoda_runtime.executor.models.decoder import CausalLM, Weight
from pagoda_runtime.executor.models.hf_config import ConfigError, architecture_fields, field, rope_parameters
from pagoda_runtime.executor.models.layers import (
    Attention,
    DecoderLayer,
    GatedMLP,
    RMSNorm,
    StateDecoderLayer,
)
from pagoda_runtime.executor.models.short_conv import ShortConv

FAMILY = "LFM2"
# LFM2's checkpoint names -> the Llama layout's.
MODULE_NAMES = {
    ".operator_norm.": ".input_layernorm.",
    ".ffn_norm.": ".post_attention_layernorm.",
    ".feed_forward.w1.": ".mlp.gate_proj.",
    ".feed_forward.w3.": ".mlp.up_proj.",
    ".feed_forward.w2.": ".mlp.down_proj.",
    ".self_attn.out_proj.": ".self_attn.o_proj.",
    ".self_attn.q_layernorm.": ".self_attn.q_norm.",
    ".self_attn.k_layernorm.": ".self_attn.k_norm.",
}


class Lfm2ForCausalLM(CausalLM):
    def make_layer(
        self, layer: int, ops: AttentionOps, quantization: str, device: torch.device, dtype: torch.dtype
    ) -> nn.Module:
        config, tp = self.config, self.tp
        mlp = GatedMLP(config, quantization, device, dtype, tp)
        if config.architecture.is_state_layer(layer):
            return StateDecoderLayer(
                config, "conv", ShortConv(config, quantization, device, dtype), mlp, device, dtype
            )
        attention = Attention(config, layer, ops, quantization, device, dtype, tp, qk_norm=RMSNorm)
        return DecoderLayer(config, attention, mlp, device, dtype)

    def checkpoint_shapes(self) -> Shapes:
        return weight_shapes(self.config)

    def checkpoint_parts(self, name: str, tensor: Weight) -> Iterator[tuple[str, Weight]]:
        if name == "model.embedding_norm.weight":
            yield "model.norm.weight", tensor
            return
        for theirs, ours in MODULE_NAMES.items():
            name = name.replace(theirs, ours)
        yield name, tensor


def weight_shapes(config: ModelConfig) -> Shapes:
    """The tensors under LFM2's own names."""
    arch = config.architecture
    hidden = arch.hidden_size
    shapes = {
        "model.embed_tokens.weight": (arch.vocab_size, hidden),
        "model.embedding_norm.weight": (hidden,),
    }
    if not arch.tie_word_embeddings:
        shapes["lm_head.weight"] = (arch.vocab_size, hidden)
    ours = {}
    for i in range(arch.num_hidden_layers):
        layer = layer_prefix(i)
        ours[layer + "input_layernorm.weight"] = (hidden,)
        ours[layer + "post_attention_layernorm.weight"] = (hidden,)
        ours |= mlp_shapes(layer + "mlp.", hidden, arch.intermediate_size)
        if arch.is_state_layer(i):
            ours[layer + "conv.in_proj.weight"] = (3 * hidden, hidden)
            ours[layer + "conv.conv.weight"] = (hidden, 1, arch.short_conv_kernel)
            ours[layer + "conv.out_proj.weight"] = (hidden, hidden)
        else:
            ours |= attention_shapes(arch, layer)
            ours[layer + "self_attn.q_norm.weight"] = (arch.head_dim,)
            ours[layer + "self_attn.k_norm.weight"] = (arch.head_dim,)
    for name, shape in ours.items():
        for theirs, our_name in MODULE_NAMES.items():
            name = name.replace(our_name, theirs)
        shapes[name] = shape
    return shapes


def _mlp_width(raw: dict[str, Any]) -> int:
    """The MLP's channels by LFM2's rule, from block_ff_dim (config.json's intermediate_size)."""
    width = field(raw, "intermediate_size", FAMILY)
    if not raw.get("block_auto_adjust_ff_dim", True):
        return width
    width = int(2 * width / 3)
    multiplier = raw.get("block_ffn_dim_multiplier", 1.0)
    if multiplier is not None:
        step = raw.get("block_multiple_of", 256)
        width = step * ((int(multiplier * width) + step - 1) // step)
    return width


def config_from_hf(raw: dict[str, Any], architecture: str) -> ModelConfig:
    if raw.get("conv_bias"):
        raise ConfigError("sets conv_bias; Pagoda serves LFM2's short convolutions as released, without bias")
    fields = architecture_fields(raw, FAMILY)
    layers = fields["num_hidden_layers"]
    kinds = raw.get("layer_types")
    if kinds is None:
        attending = set(raw.get("full_attn_idxs") or range(layers))
        kinds = ["full_attention" if i in attending else "conv" for i in range(layers)]
    if len(kinds) != layers or set(kinds) - {"full_attention", "conv"}:
        raise ConfigError(
            f"has layer_types {kinds!r}; an {FAMILY} model lists conv or full_attention per layer"
        )
    fields["intermediate_size"] = _mlp_width(raw)
    fields["tie_word_embeddings"] = raw.get("tie_word_embeddings", raw.get("tie_embedding", True))
    rope = rope_parameters(raw)
    conv = "conv" in kinds
    arch = ModelArchitecture(
        **fields, layer_types=tuple(kinds), short_conv_kernel=raw.get("conv_L_cache", 3) if conv else 0
    )
    return ModelConfig(
        model_type="lfm2",
        architecture=arch,
        rms_norm_eps=raw.get("norm_eps", 1e-5),
        rope_theta=rope.get("rope_theta", 1000000.0),
        bos_token_id=raw.get("bos_token_id"),
    )
