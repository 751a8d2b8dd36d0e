"""The Llama family (Llama 1/2/3, Mistral, Qwen2, SmolLM, SmolLM3, Seed-OSS): pre-norm layers,
grouped-query attention with rotary embeddings, the SwiGLU MLP; Qwen2 and Seed-OSS add a bias to q,
k and v (Seed-OSS's attention_out_bias to o too); SmolLM3 leaves the rotary embedding out of every
fourth layer (its config's no_rope_layers)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from pagoda_runtime.contract.config import ModelConfig, RopeScaling
from pagoda_runtime.contract.sizing import ModelArchitecture
from pagoda_runtime.contract.weight_layout import decoder_shapes
from pagoda_runtime.executor.kernels import AttentionOps
from pagoda_runtime.executor.models.decoder import CausalLM
from pagoda_runtime.executor.models.hf_config import (
    ConfigError,
    architecture_fields,
    check_activation,
    layer_types,
    rope_parameters,
    rope_scaling,
)
from pagoda_runtime.executor.models.layers import Attention, DecoderLayer, GatedMLP

MODEL_TYPES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "SmolLM3ForCausalLM": "smollm3",
    "SeedOssForCausalLM": "seed_oss",
}
# The model types that take Qwen2's sliding-window rule (use_sliding_window, max_window_layers).
_PER_LAYER_WINDOWS = ("qwen2", "smollm3")


class LlamaForCausalLM(CausalLM):
    layer_class: type[DecoderLayer] = DecoderLayer  # a family with the Llama layout's own (Granite)

    def make_layer(
        self, layer: int, ops: AttentionOps, quantization: str, device: torch.device, dtype: torch.dtype
    ) -> nn.Module:
        config, tp = self.config, self.tp
        attention = Attention(config, layer, ops, quantization, device, dtype, tp)
        return self.layer_class(
            config, attention, GatedMLP(config, quantization, device, dtype, tp), device, dtype
        )

    def checkpoint_shapes(self) -> dict[str, tuple[int, ...]]:
        return weight_shapes(self.config)


def weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    return decoder_shapes(config.architecture)


def config_from_hf(raw: dict[str, Any], architecture: str) -> ModelConfig:
    model_type = MODEL_TYPES[architecture]
    check_activation(raw, "hidden_act", "silu", "Llama")
    fields = architecture_fields(raw, "Llama")
    # Mistral's sliding_window applies to every layer; Qwen2's to the layers use_sliding_window and
    # max_window_layers name. Llama has none.
    windows = {}
    if model_type != "llama":
        per_layer = model_type in _PER_LAYER_WINDOWS
        windows = layer_types(raw, fields["num_hidden_layers"], "Llama", per_layer=per_layer)
    rope = rope_parameters(raw)
    bias = model_type == "qwen2" or raw.get("attention_bias", False)
    # transformers' Llama and SmolLM3 bias o_proj with attention_bias, Qwen2 does not, Seed-OSS by
    # its own attention_out_bias.
    output_bias = bias if model_type in ("llama", "smollm3") else raw.get("attention_out_bias", False)
    return ModelConfig(
        model_type=model_type,
        architecture=ModelArchitecture(
            **fields, attention_bias=bias, attention_output_bias=output_bias, **windows
        ),
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
        rope_theta=rope.get("rope_theta", 10000.0),
        rope_scaling=rope_scaling(rope, "Llama"),
        bos_token_id=raw.get("bos_token_id"),
        no_rope_layers=no_rope_layers(raw, fields["num_hidden_layers"]),
    )


def no_rope_layers(raw: dict[str, Any], num_layers: int) -> tuple[int, ...]:
    """The layers SmolLM3's no_rope_layers (1: rotate, 0: not, per layer) leave unrotated."""
    flags = raw.get("no_rope_layers")
    if flags is None:
        return ()
    if len(flags) != num_layers or any(f not in (0, 1) for f in flags):
        raise ConfigError(
            f"has no_rope_layers {flags!r}; it needs a 1 (rotate) or 0 (do not) for each of its "
            f"{num_layers} layers"
        )
    return tuple(i for i, rotate in enumerate(flags) if not rotate)


def config_from_gguf(arch: str, meta: dict[str, Any], tensors: set[str], read: Any) -> ModelConfig:
    """llama and qwen2 GGUF files, as llama.cpp's converter writes them."""
    if meta.get(f"{arch}.expert_count", 0) > 0:
        raise ConfigError(
            f"holds a mixture-of-experts {arch} model (Mixtral), which Pagoda reads only from Hugging "
            "Face folders; load the original folder instead"
        )
    if "rope_freqs.weight" in tensors:
        raise ConfigError(
            "carries per-frequency rope factors (Llama 3.1 scaling), which Pagoda reads only from "
            "Hugging Face folders; load the original folder instead"
        )
    scaling_type = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling_type not in ("none", "linear"):
        raise ConfigError(f"uses rope scaling {scaling_type!r}; Pagoda reads none or linear from GGUF")
    rope_scaling = None
    if scaling_type == "linear":
        rope_scaling = RopeScaling("linear", factor=float(meta[f"{arch}.rope.scaling.factor"]))
    hidden = meta[f"{arch}.embedding_length"]
    heads = meta[f"{arch}.attention.head_count"]
    return ModelConfig(
        model_type=arch,
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
            attention_bias="blk.0.attn_q.bias" in tensors,
        ),
        rms_norm_eps=meta[f"{arch}.attention.layer_norm_rms_epsilon"],
        rope_theta=meta.get(f"{arch}.rope.freq_base", 10000.0),
        rope_scaling=rope_scaling,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
    )
