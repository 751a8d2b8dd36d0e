"""LG AI Research's EXAONE 4.0 (Exaone4ForCausalLM: EXAONE-4.0-32B, EXAONE-4.0-1.2B): OLMo 2's layer
(norms on the attention's and the MLP's outputs, none before them, models/olmo2.py) with what sets
it apart:

- q and k normed per head (Qwen3's norm), before rotation;
- where a sliding window is set (the 32B model), three layers in four slide over it and every
  fourth attends to the whole context without rotary embeddings (NoPE: transformers' "global NoPE
  for hybrid attention"); config.json lists the layers in layer_types or gives sliding_window_pattern
  (a period, or a string such as "LLLG" of local and global layers). Without one (the 1.2B model)
  every layer is global and rotates.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from pagoda_runtime.contract.config import ModelConfig
from pagoda_runtime.contract.sizing import ModelArchitecture
from pagoda_runtime.contract.weight_layout import Shapes, decoder_shapes, layer_prefix, norm_shapes
from pagoda_runtime.executor.kernels import AttentionOps
from pagoda_runtime.executor.models.decoder import CausalLM
from pagoda_runtime.executor.models.hf_config import (
    LAYER_TYPES,
    ConfigError,
    architecture_fields,
    check_activation,
    layer_types,
    rope_parameters,
    rope_scaling,
)
from pagoda_runtime.executor.models.layers import Attention, GatedMLP, RMSNorm
from pagoda_runtime.executor.models.olmo2 import OlmoDecoderLayer

FAMILY = "EXAONE 4.0"
_NORMS = ("post_attention_layernorm", "post_feedforward_layernorm")


class Exaone4ForCausalLM(CausalLM):
    def make_layer(
        self, layer: int, ops: AttentionOps, quantization: str, device: torch.device, dtype: torch.dtype
    ) -> nn.Module:
        config, tp = self.config, self.tp
        attention = Attention(config, layer, ops, quantization, device, dtype, tp, qk_norm=RMSNorm)
        mlp = GatedMLP(config, quantization, device, dtype, tp)
        return OlmoDecoderLayer(config, attention, mlp, device, dtype)

    def checkpoint_shapes(self) -> Shapes:
        return weight_shapes(self.config)


def weight_shapes(config: ModelConfig) -> Shapes:
    arch = config.architecture
    shapes = decoder_shapes(arch, _NORMS)
    for i in range(arch.num_hidden_layers):
        shapes |= norm_shapes(layer_prefix(i) + "self_attn.", ("q_norm", "k_norm"), arch.head_dim)
    return shapes


def _layer_types(raw: dict[str, Any], num_layers: int) -> list[str] | None:
    """layer_types as config.json lists them, or as sliding_window_pattern implies."""
    if raw.get("layer_types") is not None or not raw.get("sliding_window"):
        return raw.get("layer_types")
    pattern = raw.get("sliding_window_pattern", 4)
    if isinstance(pattern, str) and pattern and set(pattern) <= {"L", "G"}:
        return [LAYER_TYPES[pattern[i % len(pattern)] == "L"] for i in range(num_layers)]
    if isinstance(pattern, int) and not isinstance(pattern, bool) and pattern > 0:
        return [LAYER_TYPES[(i + 1) % pattern != 0] for i in range(num_layers)]
    raise ConfigError(
        f"has sliding_window_pattern {pattern!r}; give a period (4) or a string of L (local) and G "
        "(global) layers, or list layer_types"
    )


def config_from_hf(raw: dict[str, Any], architecture: str) -> ModelConfig:
    check_activation(raw, "hidden_act", "silu", FAMILY)
    fields = architecture_fields(raw, FAMILY)
    layers = fields["num_hidden_layers"]
    types = _layer_types(raw, layers)
    windows = layer_types({**raw, "layer_types": types}, layers, FAMILY, per_layer=False)
    # The hybrid models' global layers attend without rotary embeddings.
    no_rope = ()
    if windows.get("layer_types"):
        no_rope = tuple(i for i, kind in enumerate(windows["layer_types"]) if kind == "full_attention")
    rope = rope_parameters(raw)
    return ModelConfig(
        model_type="exaone4",
        architecture=ModelArchitecture(**fields, qk_norm=True, **windows),
        rms_norm_eps=raw.get("rms_norm_eps", 1e-5),
        rope_theta=rope.get("rope_theta", 10000.0),
        rope_scaling=rope_scaling(rope, FAMILY),
        bos_token_id=raw.get("bos_token_id"),
        no_rope_layers=no_rope,
    )
