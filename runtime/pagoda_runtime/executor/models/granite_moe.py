"""IBM's Granite mixture-of-experts and Granite 4 models: GraniteMoeForCausalLM (granite-3.x-moe:
1b-a400m, 3b-a800m), GraniteMoeSharedForCausalLM (a shared MLP beside the experts) and
GraniteMoeHybridForCausalLM (Granite 4.0) where every layer attends (granite-4.0-micro; the
Mamba-2 layers of the -h models are refused by name).

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
    norm_shapes,
    vocabulary_shapes,
)
from pagoda_runtime.executor.kernels import AttentionOps
from pagoda_runtime.executor.models import granite
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
from pagoda_runtime.executor.models.layers import Attention
from pagoda_runtime.executor.models.moe import MoECausalLM, layer_mlp

FAMILY = "Granite MoE / Granite 4"
# What Granite 4's configs call a layer that attends (transformers 5 writes the second).
_ATTENTION = ("attention", "full_attention")
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
        attention = Attention(config, layer, ops, quantization, device, dtype, tp)
        mlp = layer_mlp(config, layer, quantization, device, dtype, tp)
        return GraniteDecoderLayer(config, attention, mlp, device, dtype)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids) * self.config.embedding_multiplier

    def checkpoint_shapes(self) -> Shapes:
        return weight_shapes(self.config)

    def checkpoint_parts(self, name: str, tensor: Weight) -> Iterator[tuple[str, Weight]]:
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
        raise ValueError(
            f"the checkpoint holds {name} in a form a {FAMILY} model does not read: float experts"
        )
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
        shapes |= attention_shapes(arch, layer)
        if experts:
            block = layer + "block_sparse_moe."
            shapes[block + "router.layer.weight"] = (experts, hidden)
            shapes[block + "input_linear.weight"] = (experts, 2 * width, hidden)
            shapes[block + "output_linear.weight"] = (experts, hidden, width)
        if shared:
            shapes[layer + "shared_mlp.input_linear.weight"] = (2 * shared, hidden)
            shapes[layer + "shared_mlp.output_linear.weight"] = (hidden, shared)
    return shapes


def config_from_hf(raw: dict[str, Any], architecture: str) -> ModelConfig:
    model_type = MODEL_TYPES[architecture]
    check_activation(raw, "hidden_act", "silu", FAMILY)
    others = sorted(set(raw.get("layer_types") or ()) - set(_ATTENTION))
    if others:
        raise ConfigError(
            f"has {', '.join(others)} layers (the Mamba-2 layers of Granite 4's -h models); Pagoda serves "
            "Granite 4 models whose every layer attends, such as granite-4.0-micro"
        )
    fields = architecture_fields(raw, FAMILY)
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
