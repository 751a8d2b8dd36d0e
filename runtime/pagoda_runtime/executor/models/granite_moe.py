"""IBM's Granite mixture-of-experts and Granite 4 models: GraniteMoeForCausalLM (granite-3.x-moe:
1b-a400m, 3b-a800m), GraniteMoeSharedForCausalLM (a shared MLP beside the experts) and
GraniteMoeHybridForCausalLM (Granite 4.0: granite-4.0-micro, whose every layer attends, and the
hybrid -h models, most of whose layers are Mamba-2 layers, models/mamba2.py, with the same norms,
residual multiplier and MLP around them).

Granite 3's layer (granite.py: the embedding, attention, residual and logit multipliers) with, as
its MLP, top-k experts whose chosen logits' softmax weighs them (the softmax over all experts
renormalized over the chosen, moe.SparseMoE) and the shared MLP beside them; a Granite 4 model
without experts (num_local_experts 0) has the shared MLP alone. The checkpoint fuses what Llama
splits: per layer block_sparse_moe.input_linear [E, 2I, H] (each expert's gate rows, then its up
rows), output_linear [E, H, I] and router.layer [E, H]; shared_mlp.input_linear [2S, H] (gate,
then up) and output_linear [H, S]. Granite 4 rotates only with position_embedding_type "rope".
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
    mamba_shapes,
    norm_shapes,
    vocabulary_shapes,
)
from pagoda_runtime.executor.kernels import AttentionOps
from pagoda_runtime.executor.models import granite, mamba2
from pagoda_runtime.executor.models.decoder import Weight
from pagoda_runtime.executor.models.granite import GraniteDecoderLayer
from pagoda_runtime.executor.models.hf_config import (
    ConfigError,
    architecture_fields,
    attention_biases,
    check_activation,
    field,
    rope_parameters,
    rope_scaling,
)
from pagoda_runtime.executor.models.layers import Attention, StateDecoderLayer
from pagoda_runtime.executor.models.mamba2 import Mamba2Mixer
from pagoda_runtime.executor.models.moe import MoECausalLM, layer_mlp

FAMILY = "Granite MoE / Granite 4"
# What Granite 4's configs call a layer that attends, and a Mamba layer (transformers 5 writes the
# second of each).
_ATTENTION = ("attention", "full_attention")
_MAMBA = ("mamba", "linear_attention")
MODEL_TYPES = {
    "GraniteMoeForCausalLM": "granitemoe",
    "GraniteMoeSharedForCausalLM": "granitemoeshared",
    "GraniteMoeHybridForCausalLM": "granitemoehybrid",
}


class GraniteMoeForCausalLM(MoECausalLM):
    def make_layer(
        self, layer: int, ops: AttentionOps, quantization: str, device: torch.device, dtype: torch.dtype
    ) -> nn.Module:
        config, tp = self.config, self.tp
        mlp = layer_mlp(config, layer, quantization, device, dtype, tp)
        if config.architecture.is_mamba_layer(layer):
            # Normalized per group of heads, as mamba_ssm's kernels (which trained these models) and
            # vLLM do; transformers' reference normalizes over all heads at once.
            groups = config.architecture.mamba_groups
            mixer = Mamba2Mixer(config, quantization, device, dtype, tp, norm_groups=groups)
            return StateDecoderLayer(
                config, "mamba", mixer, mlp, device, dtype, residual_multiplier=config.residual_multiplier
            )
        attention = Attention(config, layer, ops, quantization, device, dtype, tp)
        return GraniteDecoderLayer(config, attention, mlp, device, dtype)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids) * self.config.embedding_multiplier

    def checkpoint_shapes(self) -> Shapes:
        return weight_shapes(self.config)

    def checkpoint_parts(self, name: str, tensor: Weight) -> Iterator[tuple[str, Weight]]:
        layer, mamba, leaf = name.partition(".mamba.")
        if mamba:
            yield name, mamba2.rank_rows(self.config, self.tp, leaf, _whole(tensor, name))
            return
        layer, _, rest = name.partition(".block_sparse_moe.")
        if rest == "router.layer.weight":
            yield f"{layer}.mlp.gate.weight", tensor
        elif rest in ("input_linear.weight", "output_linear.weight"):
            for expert, part in enumerate(_whole(tensor, name)):
                prefix = f"{layer}.mlp.experts.{expert}."
                yield from _projections(prefix, rest, part)
        elif ".shared_mlp." in name:
            layer, _, rest = name.partition(".shared_mlp.")
            # Beside experts the shared MLP is SparseMoE's shared_experts; alone it is the layer's MLP.
            sparse = self.config.architecture.num_experts > 0
            yield from _projections(f"{layer}.mlp.{'shared_experts.' if sparse else ''}", rest, tensor)
        else:
            yield name, tensor


def _whole(tensor: Weight, name: str) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"the checkpoint holds {name} quantized; a {FAMILY} model reads it as float")
    return tensor


def _projections(prefix: str, fused: str, tensor: Weight) -> Iterator[tuple[str, Weight]]:
    """input_linear's gate and up rows, or output_linear as down_proj."""
    if fused == "output_linear.weight":
        yield prefix + "down_proj.weight", tensor
        return
    gate, up = _whole(tensor, prefix + fused).chunk(2, dim=0)
    yield prefix + "gate_proj.weight", gate
    yield prefix + "up_proj.weight", up


def weight_shapes(config: ModelConfig) -> Shapes:
    arch = config.architecture
    hidden, experts, width = arch.hidden_size, arch.num_experts, arch.moe_intermediate_size
    shared = arch.shared_expert_intermediate_size if experts else arch.intermediate_size
    shapes = vocabulary_shapes(arch)
    for i in range(arch.num_hidden_layers):
        layer = layer_prefix(i)
        shapes |= norm_shapes(layer, ("input_layernorm", "post_attention_layernorm"), hidden)
        shapes |= mamba_shapes(arch, layer) if arch.is_mamba_layer(i) else attention_shapes(arch, layer)
        if experts:
            block = layer + "block_sparse_moe."
            shapes[block + "router.layer.weight"] = (experts, hidden)
            shapes[block + "input_linear.weight"] = (experts, 2 * width, hidden)
            shapes[block + "output_linear.weight"] = (experts, hidden, width)
        if shared:
            shapes[layer + "shared_mlp.input_linear.weight"] = (2 * shared, hidden)
            shapes[layer + "shared_mlp.output_linear.weight"] = (hidden, shared)
    return shapes


def _mamba_fields(raw: dict[str, Any], layers: int) -> dict[str, Any]:
    """layer_types and the Mamba-2 shape, as ModelArchitecture's fields; none for a model whose every
    layer attends. A config without layer_types is all Mamba, as transformers reads it."""
    kinds = raw.get("layer_types") or raw.get("layers_block_type") or ["mamba"] * layers
    unknown = sorted(set(kinds) - set(_ATTENTION) - set(_MAMBA))
    if unknown or len(kinds) != layers:
        raise ConfigError(
            f"has layer_types {kinds!r}; a {FAMILY} model lists one of attention or mamba per layer"
        )
    if all(kind in _ATTENTION for kind in kinds):
        return {}
    if all(kind in _MAMBA for kind in kinds):
        raise ConfigError(
            "has no attention layer; Pagoda serves hybrid models whose Mamba-2 layers sit beside "
            "attention layers (granite-4.0-h-*)"
        )
    if not raw.get("mamba_conv_bias", True) or raw.get("mamba_proj_bias", False):
        raise ConfigError(
            "sets mamba_conv_bias false or mamba_proj_bias true; Pagoda serves Granite 4's Mamba-2 "
            "layers as released (a convolution bias, projections without bias)"
        )
    if tuple(map(_number, raw.get("time_step_limit") or (0.0, float("inf")))) != (0.0, float("inf")):
        raise ConfigError(
            f"limits the Mamba-2 time step to {raw['time_step_limit']}; Pagoda serves the unlimited "
            "time step Granite 4 is released with"
        )
    heads = raw.get("mamba_n_heads", 128)
    inner = raw.get("mamba_expand", 2) * field(raw, "hidden_size", FAMILY)
    head_dim = raw.get("mamba_d_head", "auto")
    head_dim = inner // heads if head_dim == "auto" else head_dim
    if head_dim * heads != inner:
        raise ConfigError(
            f"has {heads} Mamba heads of {head_dim}, which do not make its mamba_expand x hidden_size "
            f"({inner}) channels"
        )
    return {
        "layer_types": tuple("mamba" if kind in _MAMBA else "full_attention" for kind in kinds),
        "mamba_num_heads": heads,
        "mamba_head_dim": head_dim,
        "mamba_state_size": raw.get("mamba_d_state", 256),
        "mamba_groups": raw.get("mamba_n_groups", 1),
        "mamba_conv_kernel": raw.get("mamba_d_conv", 4),
    }


def _number(value: Any) -> Any:
    """A float of config.json, where transformers 5 writes infinity as {"__float__": "Infinity"}."""
    return float(value["__float__"]) if isinstance(value, dict) and "__float__" in value else value


def config_from_hf(raw: dict[str, Any], architecture: str) -> ModelConfig:
    model_type = MODEL_TYPES[architecture]
    check_activation(raw, "hidden_act", "silu", FAMILY)
    fields = architecture_fields(raw, FAMILY)
    if model_type == "granitemoehybrid":
        fields |= _mamba_fields(raw, fields["num_hidden_layers"])
    experts = raw.get("num_local_experts", 0) or 0
    shared = raw.get("shared_intermediate_size", 0) if model_type != "granitemoe" else 0
    moe = {}
    if experts:
        moe = dict(
            num_experts=experts,
            num_experts_per_tok=field(raw, "num_experts_per_tok", FAMILY),
            moe_intermediate_size=fields["intermediate_size"],
            shared_expert_intermediate_size=shared,
        )
    elif shared:
        fields["intermediate_size"] = shared
    else:
        raise ConfigError("has neither experts nor a shared MLP; a Granite 4 layer needs one of them")
    rope = rope_parameters(raw)
    rotates = model_type != "granitemoehybrid" or raw.get("position_embedding_type") == "rope"
    layers = fields["num_hidden_layers"]
    return ModelConfig(
        model_type=model_type,
        architecture=ModelArchitecture(**fields, **attention_biases(raw), **moe),
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
        rope_theta=rope.get("rope_theta", 10000.0),
        rope_scaling=rope_scaling(rope, FAMILY),
        bos_token_id=raw.get("bos_token_id"),
        # The softmax of the chosen logits: the full softmax renormalized over the chosen experts.
        norm_topk_prob=True,
        no_rope_layers=() if rotates else tuple(range(layers)),
        **granite.scalars(raw),
    )
