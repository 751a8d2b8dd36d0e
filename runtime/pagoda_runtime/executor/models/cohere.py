"""Cohere's Command R (CohereForCausalLM) and Command R7B / Command A (Cohere2ForCausalLM): what sets
them apart from the Llama layout.

- one LayerNorm per layer (mean-centred, a weight and no bias) before attention and the MLP, which
  run side by side on the same normed input, their outputs summed into the residual;
- rotary pairs of neighbouring dimensions (2i, 2i + 1): q and k rows are reordered at load so that
  the shared half-split kernels rotate them (ModelConfig.rope_interleaved);
- logits times logit_scale (ModelConfig.logits_scaling, its inverse);
- Command R7B / A: sliding-window layers (three in four) with RoPE and full layers without it.
Command R+'s per-head q/k norms (use_qk_norm) are not implemented.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from pagoda_runtime.contract.config import ModelConfig
from pagoda_runtime.contract.sizing import ModelArchitecture
from pagoda_runtime.contract.weight_layout import Shapes, decoder_shapes
from pagoda_runtime.executor.kernels import AttentionOps
from pagoda_runtime.executor.models.decoder import CausalLM
from pagoda_runtime.executor.models.hf_config import (
    ConfigError,
    architecture_fields,
    attention_biases,
    check_activation,
    layer_types,
    rope_parameters,
    rope_scaling,
)
from pagoda_runtime.executor.models.layers import Attention, GatedMLP

MODEL_TYPES = {"CohereForCausalLM": "cohere", "Cohere2ForCausalLM": "cohere2"}


class LayerNorm(nn.Module):
    """Cohere's LayerNorm: (x - mean) / std times a weight, no bias, in float32 rounded once; with
    `residual`, of x + residual, which it also returns (the residual sum fused, as RMSNorm does)."""

    def __init__(self, size: int, eps: float, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size, device=device, dtype=dtype), requires_grad=False)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is not None:
            x = x + residual
        hidden = x.float()
        centred = hidden - hidden.mean(-1, keepdim=True)
        normed = centred * torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * normed).to(x.dtype), x


class ParallelDecoderLayer(nn.Module):
    """x + attn(norm(x)) + mlp(norm(x)); returns the two outputs' sum and the residual apart, for
    the next layer's norm (or the final one) to add."""

    def __init__(self, config: ModelConfig, attention: Attention, mlp: GatedMLP, device, dtype) -> None:
        super().__init__()
        self.input_layernorm = LayerNorm(config.architecture.hidden_size, config.rms_norm_eps, device, dtype)
        self.self_attn = attention
        self.mlp = mlp

    def forward(self, positions, x, residual, kv_cache, meta, cos_sin_cache):
        x, residual = self.input_layernorm(x, residual)
        return self.self_attn(positions, x, kv_cache, meta, cos_sin_cache) + self.mlp(x), residual


class CohereForCausalLM(CausalLM):
    def make_layer(
        self, layer: int, ops: AttentionOps, quantization: str, device: torch.device, dtype: torch.dtype
    ) -> nn.Module:
        config, tp = self.config, self.tp
        attention = Attention(config, layer, ops, quantization, device, dtype, tp)
        mlp = GatedMLP(config, quantization, device, dtype, tp)
        return ParallelDecoderLayer(config, attention, mlp, device, dtype)

    def make_norm(self, size: int, device: torch.device, dtype: torch.dtype) -> nn.Module:
        return LayerNorm(size, self.config.rms_norm_eps, device, dtype)

    def checkpoint_shapes(self) -> Shapes:
        return weight_shapes(self.config)


def weight_shapes(config: ModelConfig) -> Shapes:
    return decoder_shapes(config.architecture, ("input_layernorm",))


def config_from_hf(raw: dict[str, Any], architecture: str) -> ModelConfig:
    model_type = MODEL_TYPES[architecture]
    family = "Command R" if model_type == "cohere" else "Command R7B / A"
    check_activation(raw, "hidden_act", "silu", family)
    if raw.get("use_qk_norm"):
        raise ConfigError(f"sets use_qk_norm (Command R+), which Pagoda's {family} models do not implement")
    fields = architecture_fields(raw, family)
    fields["tie_word_embeddings"] = raw.get("tie_word_embeddings", True)
    windows, unrotated = {}, ()
    if model_type == "cohere2":
        layers = fields["num_hidden_layers"]
        pattern = raw.get("sliding_window_pattern") or 4
        types = raw.get("layer_types") or [
            "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)
        ]
        windows = layer_types({**raw, "layer_types": types}, layers, family, per_layer=False)
        # transformers rotates the sliding-window layers only.
        unrotated = tuple(i for i, kind in enumerate(types) if kind == "full_attention")
    rope = rope_parameters(raw)
    return ModelConfig(
        model_type=model_type,
        architecture=ModelArchitecture(**fields, **attention_biases(raw), **windows),
        rms_norm_eps=raw.get("layer_norm_eps", 1e-5),
        rope_theta=rope.get("rope_theta", 10000.0),
        rope_scaling=rope_scaling(rope, family),
        bos_token_id=raw.get("bos_token_id"),
        no_rope_layers=unrotated,
        rope_interleaved=True,
        logits_scaling=1.0 / raw.get("logit_scale", 0.0625),
    )
