"""NVIDIA's Nemotron-H (NemotronHForCausalLM: Nemotron-H 8B/47B/56B, NVIDIA-Nemotron-Nano-9B-v2 and
-12B-v2): a hybrid whose every layer is one norm and one mixer, x + mixer(norm(x)), the mixer one of

- a Mamba-2 layer (`M` in config.json's hybrid_override_pattern; models/mamba2.py), its gated norm
  per group of heads;
- attention without positional embeddings (`*`);
- an ungated MLP, down(relu(up(x))²) (`-`), a layer of its own: neither attention nor Mamba layers
  hold one.

The checkpoint (NVIDIA's, and transformers' copies) names the model `backbone.`, its embedding
`embeddings`, its final norm `norm_f` and every layer's mixer `mixer`; loading reads them under the
names the layers have here (self_attn, mamba, mlp). The mixture-of-experts layers of Nemotron 3
(`E`) are refused by name.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from pagoda_runtime.contract.config import ModelConfig
from pagoda_runtime.contract.sizing import ModelArchitecture
from pagoda_runtime.contract.weight_layout import Shapes, attention_shapes, layer_prefix, mamba_shapes
from pagoda_runtime.executor.kernels import AttentionOps
from pagoda_runtime.executor.models import mamba2
from pagoda_runtime.executor.models.decoder import CausalLM, Weight
from pagoda_runtime.executor.models.hf_config import ConfigError, architecture_fields, check_activation, field
from pagoda_runtime.executor.models.layers import Attention, RMSNorm, UngatedMLP, relu_squared
from pagoda_runtime.executor.models.mamba2 import Mamba2Mixer

FAMILY = "Nemotron-H"
# hybrid_override_pattern's letters and transformers 5's layer_types, as ModelArchitecture's kinds.
_KINDS = {
    "M": "mamba",
    "linear_attention": "mamba",
    "mamba": "mamba",
    "*": "full_attention",
    "full_attention": "full_attention",
    "attention": "full_attention",
    "-": "mlp",
    "mlp": "mlp",
}
_MIXERS = {"mamba": "mamba", "full_attention": "self_attn", "mlp": "mlp"}


class NemotronHLayer(nn.Module):
    """One norm and one mixer, stored under the name the mixer's kind has here (self_attn, mamba or
    mlp)."""

    def __init__(self, config: ModelConfig, kind: str, mixer: nn.Module, device, dtype) -> None:
        super().__init__()
        self.norm = RMSNorm(config.architecture.hidden_size, config.rms_norm_eps, device, dtype)
        self.kind = kind
        setattr(self, _MIXERS[kind], mixer)

    def forward(self, positions, x, residual, cache, meta, cos_sin_cache):
        x, residual = self.norm(x, residual)
        if self.kind == "mlp":
            return self.mlp(x), residual
        return getattr(self, _MIXERS[self.kind])(positions, x, cache, meta, cos_sin_cache), residual


class NemotronHForCausalLM(CausalLM):
    def make_layer(
        self, layer: int, ops: AttentionOps, quantization: str, device: torch.device, dtype: torch.dtype
    ) -> nn.Module:
        config, tp = self.config, self.tp
        kind = config.architecture.layer_types[layer]
        if kind == "mamba":
            groups = config.architecture.mamba_groups
            mixer = Mamba2Mixer(config, quantization, device, dtype, tp, norm_groups=groups)
        elif kind == "mlp":
            mixer = UngatedMLP(config, quantization, device, dtype, tp, relu_squared)
        else:
            mixer = Attention(config, layer, ops, quantization, device, dtype, tp)
        return NemotronHLayer(config, kind, mixer, device, dtype)

    def checkpoint_shapes(self) -> Shapes:
        return weight_shapes(self.config)

    def checkpoint_parts(self, name: str, tensor: Weight) -> Iterator[tuple[str, Weight]]:
        if name == "backbone.embeddings.weight":
            yield "model.embed_tokens.weight", tensor
        elif name == "backbone.norm_f.weight":
            yield "model.norm.weight", tensor
        elif name.startswith("backbone.layers."):
            layer = int(name.split(".")[2])
            mixer = _MIXERS[self.config.architecture.layer_types[layer]]
            if mixer == "mamba":
                tensor = mamba2.rank_rows(self.config, self.tp, name.partition(".mixer.")[2], tensor)
            yield "model." + name.removeprefix("backbone.").replace(".mixer.", f".{mixer}.", 1), tensor
        else:
            yield name, tensor


def weight_shapes(config: ModelConfig) -> Shapes:
    """The tensors under the checkpoint's names (backbone.embeddings, backbone.norm_f, each layer's
    mixer)."""
    arch = config.architecture
    hidden = arch.hidden_size
    shapes = {"backbone.embeddings.weight": (arch.vocab_size, hidden), "backbone.norm_f.weight": (hidden,)}
    if not arch.tie_word_embeddings:
        shapes["lm_head.weight"] = (arch.vocab_size, hidden)
    for i, kind in enumerate(arch.layer_types):
        layer = layer_prefix(i)
        shapes[f"backbone.layers.{i}.norm.weight"] = (hidden,)
        if kind == "mamba":
            parts = mamba_shapes(arch, layer)
        elif kind == "mlp":
            parts = {
                layer + "mlp.up_proj.weight": (arch.intermediate_size, hidden),
                layer + "mlp.down_proj.weight": (hidden, arch.intermediate_size),
            }
        else:
            parts = attention_shapes(arch, layer)
        shapes |= {
            "backbone." + name.removeprefix("model.").replace(f".{_MIXERS[kind]}.", ".mixer.", 1): shape
            for name, shape in parts.items()
        }
    return shapes


def _layer_kinds(raw: dict[str, Any]) -> tuple[str, ...]:
    listed = raw.get("layers_block_type") or raw.get("layer_types")
    if listed is None:
        listed = list(field(raw, "hybrid_override_pattern", FAMILY))
    unknown = sorted({kind for kind in listed if kind not in _KINDS})
    if unknown:
        raise ConfigError(
            f"has {', '.join(map(repr, unknown))} layers (Nemotron 3's mixture-of-experts layers are "
            "'E' or moe); Pagoda serves Nemotron-H models of Mamba-2, attention and MLP layers"
        )
    return tuple(_KINDS[kind] for kind in listed)


def _refuse_unlike_released(raw: dict[str, Any]) -> None:
    for key, released in (
        ("use_conv_bias", True),
        ("mamba_conv_bias", True),
        ("use_bias", False),
        ("mamba_proj_bias", False),
        ("mlp_bias", False),
        ("attention_bias", False),
    ):
        if key in raw and raw[key] != released:
            raise ConfigError(
                f"sets {key} {str(raw[key]).lower()}; Pagoda serves Nemotron-H's layers as released "
                f"({key} {str(released).lower()})"
            )


def config_from_hf(raw: dict[str, Any], architecture: str) -> ModelConfig:
    check_activation(raw, "mlp_hidden_act", "relu2", FAMILY)
    check_activation(raw, "mamba_hidden_act", "silu", FAMILY)
    _refuse_unlike_released(raw)
    kinds = _layer_kinds(raw)
    if "full_attention" not in kinds or "mamba" not in kinds:
        raise ConfigError(
            "needs both Mamba-2 and attention layers; Pagoda serves Nemotron-H's hybrid of the two"
        )
    # Its layer count is the pattern's (old configs also say num_hidden_layers).
    fields = architecture_fields({**raw, "num_hidden_layers": len(kinds)}, FAMILY)
    arch = ModelArchitecture(
        **fields,
        layer_types=kinds,
        mamba_num_heads=field(raw, "mamba_num_heads", FAMILY),
        mamba_head_dim=field(raw, "mamba_head_dim", FAMILY),
        mamba_state_size=raw.get("ssm_state_size", 128),
        mamba_groups=raw.get("n_groups", 8),
        mamba_conv_kernel=raw.get("conv_kernel", 4),
    )
    return ModelConfig(
        model_type="nemotron_h",
        architecture=arch,
        rms_norm_eps=raw.get("layer_norm_epsilon", 1e-5),
        bos_token_id=raw.get("bos_token_id"),
        # Attention without positional embeddings: every layer's table rotates nothing (its theta
        # unused).
        rope_theta=10000.0,
        no_rope_layers=tuple(range(len(kinds))),
    )
