"""Qwen3 (dense): the Llama layout with an RMSNorm over each head of q and of k before rotation, and
an explicit head_dim (Qwen3-8B: 32 heads of 128 on a 4096-wide stream; Qwen3-32B: 64 heads of 128
on 5120)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from pagoda_runtime.contract.config import ModelConfig
from pagoda_runtime.contract.sizing import ModelArchitecture
from pagoda_runtime.contract.weight_layout import decoder_shapes, layer_prefix, norm_shapes
from pagoda_runtime.executor.kernels import AttentionOps
from pagoda_runtime.executor.models.decoder import CausalLM
from pagoda_runtime.executor.models.hf_config import (
    architecture_fields,
    attention_biases,
    check_activation,
    layer_types,
    rope_parameters,
    rope_scaling,
)
from pagoda_runtime.executor.models.layers import Attention, DecoderLayer, GatedMLP, RMSNorm


class Qwen3ForCausalLM(CausalLM):
    def make_layer(
        self, layer: int, ops: AttentionOps, quantization: str, device: torch.device, dtype: torch.dtype
    ) -> nn.Module:
        config, tp = self.config, self.tp
        attention = Attention(config, layer, ops, quantization, device, dtype, tp, qk_norm=RMSNorm)
        mlp = GatedMLP(config, quantization, device, dtype, tp)
        return DecoderLayer(config, attention, mlp, device, dtype)

    def checkpoint_shapes(self) -> dict[str, tuple[int, ...]]:
        return weight_shapes(self.config)


def weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    arch = config.architecture
    shapes = decoder_shapes(arch)
    for i in range(arch.num_hidden_layers):
        shapes |= norm_shapes(layer_prefix(i) + "self_attn.", ("q_norm", "k_norm"), arch.head_dim)
    return shapes


def config_from_hf(raw: dict[str, Any], architecture: str) -> ModelConfig:
    family = "Qwen3"
    check_activation(raw, "hidden_act", "silu", family)
    fields = architecture_fields(raw, family)
    rope = rope_parameters(raw)
    return ModelConfig(
        model_type="qwen3",
        architecture=ModelArchitecture(
            **fields,
            **attention_biases(raw),
            **layer_types(raw, fields["num_hidden_layers"], family, per_layer=True),
        ),
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
        rope_theta=rope.get("rope_theta", 10000.0),
        rope_scaling=rope_scaling(rope, family),
        bos_token_id=raw.get("bos_token_id"),
    )


def config_from_gguf(arch: str, meta: dict[str, Any], tensors: set[str], read: Any) -> ModelConfig:
    """qwen3 GGUF files, as llama.cpp's converter writes them (q and k rows in Hugging Face order)."""
    heads = meta[f"{arch}.attention.head_count"]
    hidden = meta[f"{arch}.embedding_length"]
    return ModelConfig(
        model_type="qwen3",
        architecture=ModelArchitecture(
            num_hidden_layers=meta[f"{arch}.block_count"],
            hidden_size=hidden,
            intermediate_size=meta[f"{arch}.feed_forward_length"],
            num_attention_heads=heads,
            num_key_value_heads=meta.get(f"{arch}.attention.head_count_kv", heads),
            head_dim=meta.get(f"{arch}.attention.key_length", hidden // heads),
            vocab_size=meta.get(f"{arch}.vocab_size", len(meta["tokenizer.ggml.tokens"])),
            max_position_embeddings=meta[f"{arch}.context_length"],
            tie_word_embeddings="output.weight" not in tensors,
        ),
        rms_norm_eps=meta[f"{arch}.attention.layer_norm_rms_epsilon"],
        rope_theta=meta.get(f"{arch}.rope.freq_base", 10000.0),
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
    )


GGUF_NAMES = {
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
}
