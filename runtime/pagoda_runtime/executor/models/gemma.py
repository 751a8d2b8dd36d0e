"""Gemma 2 and Gemma 3 (text): what sets them apart from the Llama layout.

- embeddings scaled by sqrt(hidden_size), the factor rounded to the model's dtype as transformers
  rounds it;
- RMSNorm times (1 + weight), computed in float32 and rounded once;
- norms before and after attention and before and after the MLP;
- the GeGLU MLP (tanh-approximated GELU);
- attention scores scaled by query_pre_attn_scalar ** -0.5;
- sliding-window layers alternating with global ones (Gemma 2: every other layer; Gemma 3: five in
  six), the windows passed per layer;
- Gemma 2: attention logits and final logits soft-capped (tanh);
- Gemma 3: RMSNorm on each head of q and k, and its own RoPE base (10000, unscaled) for the
  sliding-window layers, while global layers keep rope_theta and its scaling.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from pagoda_runtime.contract.config import ModelConfig, RopeScaling
from pagoda_runtime.contract.sizing import ModelArchitecture
from pagoda_runtime.contract.weight_layout import decoder_shapes, layer_prefix, norm_shapes
from pagoda_runtime.executor.kernels import AttentionOps, gelu_tanh_and_mul
from pagoda_runtime.executor.models.decoder import CausalLM, Weight
from pagoda_runtime.executor.models.hf_config import (
    ConfigError,
    architecture_fields,
    attention_biases,
    check_activation,
    layer_types,
    rope_parameters,
    rope_scaling,
)
from pagoda_runtime.executor.models.layers import Attention, GatedMLP, SandwichDecoderLayer


class GemmaRMSNorm(nn.Module):
    """normalized(x) * (1 + weight) in float32, rounded to x's dtype once (transformers' Gemma norm)."""

    def __init__(self, size: int, eps: float, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(size, device=device, dtype=dtype), requires_grad=False)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is not None:
            x = x + residual
        hidden = x.float()
        hidden = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + self.eps)
        return (hidden * (1.0 + self.weight.float())).to(x.dtype), x


# Gemma's norms around attention and the MLP, by their checkpoint names.
_LAYER_NORMS = (
    "input_layernorm",
    "post_attention_layernorm",
    "pre_feedforward_layernorm",
    "post_feedforward_layernorm",
)


class Gemma2ForCausalLM(CausalLM):
    qk_norm: type[nn.Module] | None = None

    def __init__(self, config: ModelConfig, ops: AttentionOps, max_position: int, *args, **kwargs) -> None:
        super().__init__(config, ops, max_position, *args, **kwargs)
        # sqrt(hidden) rounded to the model's dtype, as transformers rounds it; a Python number, so
        # that a CUDA graph captures no host-to-device copy.
        self.embed_scale = float(
            torch.tensor(config.architecture.hidden_size**0.5, dtype=self.embed_tokens.dtype)
        )

    def make_layer(
        self, layer: int, ops: AttentionOps, quantization: str, device: torch.device, dtype: torch.dtype
    ) -> nn.Module:
        config, tp = self.config, self.tp
        attention = Attention(config, layer, ops, quantization, device, dtype, tp, self.qk_norm)
        mlp = GatedMLP(config, quantization, device, dtype, tp, act_and_mul=gelu_tanh_and_mul)
        return SandwichDecoderLayer(config, attention, mlp, GemmaRMSNorm, _LAYER_NORMS, device, dtype)

    def make_norm(self, size: int, device: torch.device, dtype: torch.dtype) -> nn.Module:
        return GemmaRMSNorm(size, self.config.rms_norm_eps, device, dtype)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids) * self.embed_scale

    def checkpoint_shapes(self) -> dict[str, tuple[int, ...]]:
        return weight_shapes(self.config)


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    qk_norm = GemmaRMSNorm


def weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    arch = config.architecture
    shapes = decoder_shapes(arch)
    norms = ("pre_feedforward_layernorm", "post_feedforward_layernorm")
    for i in range(arch.num_hidden_layers):
        layer = layer_prefix(i)
        shapes |= norm_shapes(layer, norms, arch.hidden_size)
        if config.model_type == "gemma3_text":
            shapes |= norm_shapes(layer + "self_attn.", ("q_norm", "k_norm"), arch.head_dim)
    return shapes


# Sliding-window layers per global one, where config.json does not list layer_types.
_PATTERNS = {"gemma2": 2, "gemma3_text": 6}


def config_from_hf(raw: dict[str, Any], architecture: str) -> ModelConfig:
    model_type = "gemma2" if architecture == "Gemma2ForCausalLM" else "gemma3_text"
    family = "Gemma 2" if model_type == "gemma2" else "Gemma 3"
    if raw.get("use_bidirectional_attention"):
        raise ConfigError(f"sets use_bidirectional_attention, which Pagoda's {family} models do not have")
    check_activation(raw, "hidden_activation", "gelu_pytorch_tanh", family)
    fields = architecture_fields(raw, family)
    fields["tie_word_embeddings"] = raw.get("tie_word_embeddings", True)
    layers = fields["num_hidden_layers"]
    pattern = raw.get("sliding_window_pattern") or raw.get("_sliding_window_pattern") or _PATTERNS[model_type]
    types = raw.get("layer_types") or [
        "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)
    ]
    windows = layer_types({**raw, "layer_types": types}, layers, family, per_layer=False)
    rope = rope_parameters(raw)
    local_theta = None
    if "full_attention" in rope or model_type == "gemma3_text":
        # Gemma 3: rope_parameters per layer type (transformers 5), or rope_theta with its scaling
        # for global layers and rope_local_base_freq for local ones (earlier configs).
        local = rope.get("sliding_attention") or {"rope_theta": raw.get("rope_local_base_freq", 10000.0)}
        if local.get("rope_type", "default") != "default":
            raise ConfigError(
                f"scales the local layers' RoPE ({local['rope_type']}), which {family} does not"
            )
        local_theta = local["rope_theta"]
        rope = rope.get("full_attention") or {k: v for k, v in rope.items() if k != "sliding_attention"}
        rope.setdefault("rope_theta", 1_000_000.0)
    return ModelConfig(
        model_type=model_type,
        architecture=ModelArchitecture(**fields, **attention_biases(raw), **windows),
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
        rope_theta=rope.get("rope_theta", 10000.0),
        rope_scaling=rope_scaling(rope, family),
        bos_token_id=raw.get("bos_token_id"),
        local_rope_theta=local_theta,
        query_pre_attn_scalar=raw.get("query_pre_attn_scalar", 256),
        # transformers' Gemma 3 attention takes no soft-cap, whatever the config says.
        attn_logit_softcapping=raw.get("attn_logit_softcapping") if model_type == "gemma2" else None,
        final_logit_softcapping=raw.get("final_logit_softcapping"),
    )


def config_from_gguf(arch: str, meta: dict[str, Any], tensors: set[str], read: Any) -> ModelConfig:
    """gemma2 and gemma3 GGUF files, as llama.cpp's converter writes them. llama.cpp fixes what the
    file leaves out, and so does this: the window pattern (2 and 6, unless the file has
    attention.sliding_window_pattern, a period or a flag per layer), Gemma 3's local RoPE base
    (10000), and query_pre_attn_scalar (hidden_size / heads for the 27B models, whose 46 and 62
    layers tell them apart, head_dim otherwise)."""
    model_type = "gemma2" if arch == "gemma2" else "gemma3_text"
    heads = meta[f"{arch}.attention.head_count"]
    hidden = meta[f"{arch}.embedding_length"]
    layers = meta[f"{arch}.block_count"]
    head_dim = meta.get(f"{arch}.attention.key_length", hidden // heads)
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern", _PATTERNS[model_type])
    if isinstance(pattern, int):
        pattern = [bool((i + 1) % pattern) for i in range(layers)]
    types = tuple("sliding_attention" if sliding else "full_attention" for sliding in pattern)
    scaling = None
    if meta.get(f"{arch}.rope.scaling.type", "none") == "linear":
        scaling = RopeScaling("linear", factor=float(meta[f"{arch}.rope.scaling.factor"]))
    return ModelConfig(
        model_type=model_type,
        architecture=ModelArchitecture(
            num_hidden_layers=layers,
            hidden_size=hidden,
            intermediate_size=meta[f"{arch}.feed_forward_length"],
            num_attention_heads=heads,
            num_key_value_heads=meta.get(f"{arch}.attention.head_count_kv", heads),
            head_dim=head_dim,
            vocab_size=meta.get(f"{arch}.vocab_size", len(meta["tokenizer.ggml.tokens"])),
            max_position_embeddings=meta[f"{arch}.context_length"],
            tie_word_embeddings="output.weight" not in tensors,
            sliding_window=meta[f"{arch}.attention.sliding_window"],
            layer_types=types,
        ),
        rms_norm_eps=meta[f"{arch}.attention.layer_norm_rms_epsilon"],
        rope_theta=meta.get(f"{arch}.rope.freq_base", 10000.0),
        rope_scaling=scaling,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        local_rope_theta=10000.0 if model_type == "gemma3_text" else None,
        query_pre_attn_scalar=hidden // heads if layers in (46, 62) else head_dim,
        attn_logit_softcapping=meta.get(f"{arch}.attn_logit_softcapping") if arch == "gemma2" else None,
        final_logit_softcapping=meta.get(f"{arch}.final_logit_softcapping"),
    )


GGUF_NAMES = {
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
}


def gguf_tensor(hf_name: str, tensor: Weight) -> Weight:
    """llama.cpp's converter stores Gemma's norm weights plus one (its norm multiplies by the weight
    alone); the model holds Hugging Face's."""
    if hf_name.endswith("norm.weight") and isinstance(tensor, torch.Tensor):
        return tensor - 1
    return tensor
