"""OpenAI's GPT-OSS (GptOssForCausalLM: gpt-oss-20b and gpt-oss-120b): a mixture of experts in every
layer, with what sets it apart from Qwen3-MoE and Mixtral:

- attention sinks: one learned logit per query head joins every softmax of that head as a key
  without a value, so a head may attend to (almost) nothing; and a bias on o_proj besides q, k, v;
- a bias on the router and on each expert's projections, and the experts' clamped SwiGLU
  (kernels/moe_activation.py);
- routing by the softmax of the top-k router logits, which is the top-k of the whole softmax
  renormalized;
- sliding-window (128) and full layers alternating, YaRN on all of them.

Its checkpoints store each layer's experts as four fused tensors, gate_up_proj [E, H, 2I] with gate
and up interleaved column by column, down_proj [E, I, H] and their biases; the model takes them apart
into the per-expert gate_proj, up_proj and down_proj rows the MoE layer holds. The released MXFP4
experts arrive already dequantized (loading/mxfp4.py).
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
from pagoda_runtime.executor.models.decoder import CausalLM, Weight
from pagoda_runtime.executor.models.hf_config import (
    ConfigError,
    architecture_fields,
    check_activation,
    field,
    layer_types,
    rope_parameters,
    rope_scaling,
)
from pagoda_runtime.executor.models.layers import Attention, DecoderLayer
from pagoda_runtime.executor.models.moe import SparseMoE

FAMILY = "GPT-OSS"
# transformers' GptOssConfig defaults where config.json leaves them out.
_DEFAULT_SWIGLU_LIMIT = 7.0
_DEFAULT_THETA = 150000.0


class GptOssForCausalLM(CausalLM):
    def make_layer(
        self, layer: int, ops: AttentionOps, quantization: str, device: torch.device, dtype: torch.dtype
    ) -> nn.Module:
        config, tp = self.config, self.tp
        attention = Attention(config, layer, ops, quantization, device, dtype, tp)
        mlp = SparseMoE(config, quantization, device, dtype, tp)
        return DecoderLayer(config, attention, mlp, device, dtype)

    def checkpoint_shapes(self) -> Shapes:
        return weight_shapes(self.config)

    def checkpoint_parts(self, name: str, tensor: Weight) -> Iterator[tuple[str, Weight]]:
        layer, _, rest = name.partition(".mlp.")
        if rest.startswith("experts."):
            yield from _expert_parts(f"{layer}.mlp.experts.", rest.removeprefix("experts."), tensor)
        elif rest.startswith("router."):
            yield f"{layer}.mlp.gate.{rest.removeprefix('router.')}", tensor
        elif name.endswith("self_attn.sinks"):
            # A rank keeps the sinks of its own query heads.
            heads = self.layers[0].self_attn.num_heads
            yield name, tensor[self.tp.rank * heads : (self.tp.rank + 1) * heads]
        else:
            yield name, tensor


def _expert_parts(prefix: str, fused: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """The per-expert tensors of one fused expert tensor of the checkpoint, in the Llama orientation
    ([out, in]) and with gate and up apart."""
    for expert, part in enumerate(tensor):
        name = f"{prefix}{expert}."
        if fused == "gate_up_proj":
            yield name + "gate_proj.weight", part[:, 0::2].T.contiguous()
            yield name + "up_proj.weight", part[:, 1::2].T.contiguous()
        elif fused == "gate_up_proj_bias":
            yield name + "gate_proj.bias", part[0::2]
            yield name + "up_proj.bias", part[1::2]
        elif fused == "down_proj":
            yield name + "down_proj.weight", part.T.contiguous()
        elif fused == "down_proj_bias":
            yield name + "down_proj.bias", part
        else:
            raise ValueError(
                f"the checkpoint holds experts.{fused!r}, which a GPT-OSS layer has no place for"
            )


def weight_shapes(config: ModelConfig) -> Shapes:
    arch = config.architecture
    hidden, width, experts = arch.hidden_size, arch.moe_intermediate_size, arch.num_experts
    shapes = vocabulary_shapes(arch)
    for i in range(arch.num_hidden_layers):
        layer = layer_prefix(i)
        shapes |= norm_shapes(layer, ("input_layernorm", "post_attention_layernorm"), hidden)
        shapes |= attention_shapes(arch, layer)
        shapes[layer + "self_attn.sinks"] = (arch.num_attention_heads,)
        shapes[layer + "mlp.router.weight"] = (experts, hidden)
        shapes[layer + "mlp.router.bias"] = (experts,)
        shapes[layer + "mlp.experts.gate_up_proj"] = (experts, hidden, 2 * width)
        shapes[layer + "mlp.experts.gate_up_proj_bias"] = (experts, 2 * width)
        shapes[layer + "mlp.experts.down_proj"] = (experts, width, hidden)
        shapes[layer + "mlp.experts.down_proj_bias"] = (experts, hidden)
    return shapes


def config_from_hf(raw: dict[str, Any], architecture: str) -> ModelConfig:
    check_activation(raw, "hidden_act", "silu", FAMILY)
    if not raw.get("attention_bias", True):
        raise ConfigError(f"sets attention_bias false; {FAMILY} models have biases on q, k, v and o")
    fields = architecture_fields(raw, FAMILY)
    rope = rope_parameters(raw)
    return ModelConfig(
        model_type="gpt_oss",
        architecture=ModelArchitecture(
            **fields,
            attention_bias=True,
            num_experts=field(raw, "num_local_experts", FAMILY),
            num_experts_per_tok=field(raw, "num_experts_per_tok", FAMILY),
            # Each expert is intermediate_size wide; there is no dense MLP.
            moe_intermediate_size=fields["intermediate_size"],
            **layer_types(raw, fields["num_hidden_layers"], FAMILY, per_layer=False),
        ),
        rms_norm_eps=raw.get("rms_norm_eps", 1e-5),
        rope_theta=rope.get("rope_theta", _DEFAULT_THETA),
        rope_scaling=rope_scaling(rope, FAMILY),
        bos_token_id=raw.get("bos_token_id"),
        norm_topk_prob=True,
        swiglu_limit=raw.get("swiglu_limit", _DEFAULT_SWIGLU_LIMIT),
    )
