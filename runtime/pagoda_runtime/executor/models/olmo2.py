"""AllenAI's OLMo 2 and OLMo 3 (Olmo2ForCausalLM, Olmo3ForCausalLM): what sets them apart from the
Llama layout.

- norms after attention and after the MLP, on their outputs before the residual sum, and none
  before them (the stream itself goes into attention and the MLP);
- q and k normed over all heads at once (one RMS per token over num_heads * head_dim), before
  rotation; split over tensor-parallel ranks, the sums of squares are added over the ranks, a KV
  head held by several ranks counted once;
- OLMo 3: sliding-window layers (three in four) beside full ones, the full ones' RoPE scaled
  (YaRN) in its long-context checkpoints and the sliding ones' not.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from pagoda_runtime.contract.config import ModelConfig
from pagoda_runtime.contract.sizing import ModelArchitecture
from pagoda_runtime.contract.weight_layout import Shapes, decoder_shapes, layer_prefix
from pagoda_runtime.executor.kernels import AttentionOps
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
from pagoda_runtime.executor.models.layers import Attention, GatedMLP, RMSNorm
from pagoda_runtime.parallel.tensor_parallel import TensorParallel

MODEL_TYPES = {"Olmo2ForCausalLM": "olmo2", "Olmo3ForCausalLM": "olmo3"}
_NORMS = ("post_attention_layernorm", "post_feedforward_layernorm")
# transformers' rope_theta where config.json has none.
_DEFAULT_THETA = {"olmo2": 10000.0, "olmo3": 500000.0}


class WideNorm(nn.Module):
    """RMSNorm over all of a token's heads (the rank's `size` values of `total`), in float32 with
    the weight applied before rounding, as transformers' OLMo norm. `copies`: how many ranks hold
    each of these heads (KV heads fewer than the ranks), so that the sum over ranks counts each
    once."""

    def __init__(
        self, size: int, total: int, copies: int, eps: float, tp: TensorParallel, device, dtype
    ) -> None:
        super().__init__()
        self.eps, self.total, self.copies, self.tp = eps, total, copies, tp
        self.weight = nn.Parameter(torch.ones(size, device=device, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = x.float()
        squares = hidden.pow(2).sum(-1, keepdim=True)
        if self.tp.size > 1:
            squares = self.tp.all_reduce(squares) / self.copies
        hidden = hidden * torch.rsqrt(squares / self.total + self.eps)
        return (self.weight.float() * hidden).to(x.dtype)


class OlmoAttention(Attention):
    def __init__(self, config: ModelConfig, layer: int, ops, quantization, device, dtype, tp) -> None:
        super().__init__(config, layer, ops, quantization, device, dtype, tp)
        arch, eps = config.architecture, config.rms_norm_eps
        copies = max(1, tp.size // arch.num_key_value_heads)
        self.q_norm = WideNorm(self.q_size, arch.q_size, 1, eps, tp, device, dtype)
        self.k_norm = WideNorm(self.kv_size, arch.kv_size, copies, eps, tp, device, dtype)

    def norm_qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q = self.q_norm(q.reshape(-1, self.q_size)).view(-1, self.num_heads, self.head_dim)
        k = self.k_norm(k.reshape(-1, self.kv_size)).view(-1, self.num_kv_heads, self.head_dim)
        return q, k


class OlmoDecoderLayer(nn.Module):
    """stream + post_norm(attn(stream)), then stream + post_ffw_norm(mlp(stream)). Returns the MLP's
    normed output and the stream apart, as the Llama layer does, for the next layer (or the final
    norm) to add."""

    def __init__(self, config: ModelConfig, attention: OlmoAttention, mlp: GatedMLP, device, dtype) -> None:
        super().__init__()
        hidden, eps = config.architecture.hidden_size, config.rms_norm_eps
        self.self_attn = attention
        self.post_attention_layernorm = RMSNorm(hidden, eps, device, dtype)
        self.mlp = mlp
        self.post_feedforward_layernorm = RMSNorm(hidden, eps, device, dtype)

    def forward(self, positions, x, residual, kv_cache, meta, cos_sin_cache):
        stream = x if residual is None else x + residual
        attended = self.self_attn(positions, stream, kv_cache, meta, cos_sin_cache)
        stream = stream + self.post_attention_layernorm(attended)[0]
        return self.post_feedforward_layernorm(self.mlp(stream))[0], stream


class Olmo2ForCausalLM(CausalLM):
    def make_layer(
        self, layer: int, ops: AttentionOps, quantization: str, device: torch.device, dtype: torch.dtype
    ) -> nn.Module:
        config, tp = self.config, self.tp
        attention = OlmoAttention(config, layer, ops, quantization, device, dtype, tp)
        mlp = GatedMLP(config, quantization, device, dtype, tp)
        return OlmoDecoderLayer(config, attention, mlp, device, dtype)

    def checkpoint_shapes(self) -> Shapes:
        return weight_shapes(self.config)

    def checkpoint_parts(self, name: str, tensor: Weight):
        yield name, wide_norm_part(self, name, tensor)


def wide_norm_part(model: CausalLM, name: str, tensor: Weight) -> Weight:
    """Of a wide q or k norm's weight, the part of the rank's own q and k heads (any other tensor
    whole)."""
    if model.tp.size > 1 and name.endswith(("self_attn.q_norm.weight", "self_attn.k_norm.weight")):
        proj = "q_proj" if ".q_norm." in name else "k_proj"
        return tensor[model._fused_parts()[proj][2]]
    return tensor


def weight_shapes(config: ModelConfig) -> Shapes:
    arch = config.architecture
    shapes = decoder_shapes(arch, _NORMS)
    for i in range(arch.num_hidden_layers):
        shapes[layer_prefix(i) + "self_attn.q_norm.weight"] = (arch.q_size,)
        shapes[layer_prefix(i) + "self_attn.k_norm.weight"] = (arch.kv_size,)
    return shapes


def config_from_hf(raw: dict[str, Any], architecture: str) -> ModelConfig:
    model_type = MODEL_TYPES[architecture]
    family = "OLMo 2" if model_type == "olmo2" else "OLMo 3"
    check_activation(raw, "hidden_act", "silu", family)
    fields = architecture_fields(raw, family)
    windows = {}
    if model_type == "olmo3":
        windows = layer_types(raw, fields["num_hidden_layers"], family, per_layer=False)
    rope = rope_parameters(raw)
    local_theta = None
    default_theta = _DEFAULT_THETA[model_type]
    if "full_attention" in rope:
        # transformers 5 writes OLMo 3's rope_parameters per layer type: its long-context checkpoints
        # scale the full layers' RoPE (YaRN) and leave the sliding-window layers' plain.
        full, sliding = rope["full_attention"], rope.get("sliding_attention") or rope["full_attention"]
        if sliding != full:
            if sliding.get("rope_type", "default") != "default":
                raise ConfigError(
                    f"scales the sliding-window layers' RoPE ({sliding['rope_type']}), which Pagoda's "
                    f"{family} models do not"
                )
            local_theta = sliding.get("rope_theta", full.get("rope_theta", default_theta))
        rope = dict(full)
    elif model_type == "olmo3" and rope.get("rope_type", rope.get("type", "default")) != "default":
        # The released OLMo 3 configs: rope_theta and a rope_scaling that, as in transformers and
        # vLLM, scales the full layers only.
        local_theta = rope.get("rope_theta", default_theta)
    return ModelConfig(
        model_type=model_type,
        architecture=ModelArchitecture(**fields, **attention_biases(raw), **windows),
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
        rope_theta=rope.get("rope_theta", default_theta),
        rope_scaling=rope_scaling(rope, family),
        bos_token_id=raw.get("bos_token_id"),
        local_rope_theta=local_theta,
    )
