"""IBM's Granite 3 (GraniteForCausalLM): the Llama layout with four scalars from its config.json.

Embeddings are multiplied by embedding_multiplier, attention scores scaled by attention_multiplier
(ModelConfig.attention_scale), each attention and MLP output multiplied by residual_multiplier before
it joins the residual stream, and the logits divided by logits_scaling. The multipliers act on the
outputs rather than being folded into o_proj and down_proj at load, so that checkpoints quantized
ahead (AWQ, GPTQ, GGUF) and LoRA adapters on those projections come out right unchanged.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from pagoda_runtime.contract.config import ModelConfig
from pagoda_runtime.executor.models.layers import DecoderLayer
from pagoda_runtime.executor.models.llama import LlamaForCausalLM
from pagoda_runtime.executor.models.llama import config_from_hf as llama_config_from_hf


class GraniteDecoderLayer(DecoderLayer):
    def __init__(self, config: ModelConfig, attention, mlp, device, dtype) -> None:
        super().__init__(config, attention, mlp, device, dtype)
        self.residual_multiplier = config.residual_multiplier

    def forward(self, positions, x, residual, kv_cache, meta, cos_sin_cache):
        scale = self.residual_multiplier
        x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(positions, x, kv_cache, meta, cos_sin_cache) * scale
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x) * scale, residual


class GraniteForCausalLM(LlamaForCausalLM):
    layer_class = GraniteDecoderLayer

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids) * self.config.embedding_multiplier


def scalars(raw: dict[str, Any]) -> dict[str, float]:
    """The four multipliers, ModelConfig's fields, with transformers' defaults (every Granite
    config.json sets them)."""
    return {
        name: float(raw.get(name, 1.0))
        for name in ("attention_multiplier", "embedding_multiplier", "residual_multiplier", "logits_scaling")
    }


def config_from_hf(raw: dict[str, Any], architecture: str) -> ModelConfig:
    llama = llama_config_from_hf(raw, "LlamaForCausalLM")
    return replace(llama, model_type="granite", **scalars(raw))
