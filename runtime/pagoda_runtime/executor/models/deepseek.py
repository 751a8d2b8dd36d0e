"""DeepSeek V2 and V3 (DeepseekV2ForCausalLM: DeepSeek-V2, V2.5, V2-Lite, Coder-V2;
DeepseekV3ForCausalLM: DeepSeek-V3, DeepSeek-R1, Moonlight, Kimi K2): mixtures of experts with what
sets them apart from GLM-4.5:

- multi-head latent attention (MLA): the keys and values of a token come from one compressed
  latent (kv_a_proj_with_mqa, kv_lora_rank wide, normed), which kv_b_proj expands per head into the
  keys' unrotated part and the values; the keys' rotated part (qk_rope_head_dim) is one vector
  shared by all heads, and the queries go through a low-rank projection of their own where
  q_lora_rank is set (q_a_proj, its norm, q_b_proj). The rotary pairs are interleaved (always in
  V2, where rope_interleave says in V3), and a YaRN config's mscale_all_dim scales the softmax
  by its mscale squared;
- V3 routes by grouped sigmoid scores with a correction bias (GLM-4.5's rule), V2 by the top-k of
  the softmax without renormalization (among the best expert groups, each scored by its best
  expert, where topk_method is group_limited_greedy: DeepSeek-V2 and V2.5); both scale the routed
  experts' sum by routed_scaling_factor, and both have shared experts and their first
  first_k_dense_replace layers dense.

The attention is served absorbed, as DeepSeek's paper describes it and vLLM and SGLang serve it:
the cache holds each token's normed latent and rotated key alone (kv_lora_rank + qk_rope_head_dim,
576 numbers a token and layer for V3, where caching every head's key and value would take 128
heads of 2 x 192: 85 times more), one plane read both as the key and as the value of a single
key/value head that every query head attends to. kv_b_proj's key half is multiplied into each
head's unrotated query (the query's dot product with the latent then equals its dot product with
the expanded key), and its value half into each head's output (the softmax's weighted sum of
latents, expanded afterwards, equals the sum of expanded values). kv_b_proj is held as the two
float matrices it is split into, whatever the quantization (as vLLM holds it): a quantized
checkpoint's is dequantized at load, and sizing counts it in 16 bits.

A query and the key are laid out for the shared rotary table (kernels/rope_cache.py, whose first
qk_rope_head_dim / 2 pairs (i, i + width / 2) rotate and whose other dimensions keep cos 1 and
sin 0): the rotated pairs' first halves, half the latent, the pairs' second halves, the other
half; the rotated rows of q_b_proj and kv_a_proj_with_mqa are put in that pair order as they load
(interleaved pairs taken apart). The attention's output is in the same layout, and its latent
halves are the weighted sum of latents.

Checkpoints store experts one by one (mlp.experts.N.gate_proj, ...); the multi-token-prediction
layer of V3 checkpoints (numbered num_hidden_layers) is read only to draft tokens (speculative
decoding's mtp method, models/mtp_head.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from pagoda_runtime.contract.config import ModelConfig, latent_softmax_scale
from pagoda_runtime.contract.sizing import ModelArchitecture
from pagoda_runtime.contract.weight_layout import (
    Shapes,
    layer_prefix,
    mlp_shapes,
    norm_shapes,
    sparse_mlp_shapes,
    vocabulary_shapes,
)
from pagoda_runtime.executor.attention_metadata import AttentionMetadata
from pagoda_runtime.executor.kernels import AttentionOps
from pagoda_runtime.executor.kernels.moe_routing import SigmoidRouting, SoftmaxGroups, check_routing
from pagoda_runtime.executor.models.decoder import CausalLM, Weight
from pagoda_runtime.executor.models.hf_config import (
    ConfigError,
    architecture_fields,
    check_activation,
    field,
    nextn_predict_layers,
    rope_parameters,
    rope_scaling,
)
from pagoda_runtime.executor.models.layers import DecoderLayer, RMSNorm
from pagoda_runtime.executor.models.moe import layer_mlp
from pagoda_runtime.executor.quantization import PackedWeight, dequantize, make_linear
from pagoda_runtime.parallel.tensor_parallel import TensorParallel

FAMILY = "DeepSeek V2 / V3"
MODEL_TYPES = {"DeepseekV2ForCausalLM": "deepseek_v2", "DeepseekV3ForCausalLM": "deepseek_v3"}
# The low-rank norms keep RMSNorm's default epsilon whatever rms_norm_eps says, as DeepSeek's code
# and transformers build them.
_LOW_RANK_NORM_EPS = 1e-6


def _rows(tensor: Weight, index: torch.Tensor) -> Weight:
    return tensor.rows(index) if isinstance(tensor, PackedWeight) else tensor[index]


class LatentAttention(nn.Module):
    """Multi-head latent attention, absorbed, over a paged cache of latents (the module docstring
    says how). Split over tensor-parallel ranks by heads: q_b_proj (V2-Lite's q_proj, held under
    this name), the absorbed kv_b_proj and o_proj; q_a_proj, kv_a_proj_with_mqa and their norms
    whole on every rank, where each caches the same latents."""

    def __init__(
        self,
        config: ModelConfig,
        ops: AttentionOps,
        quantization: str,
        device: torch.device,
        dtype: torch.dtype,
        tp: TensorParallel,
    ) -> None:
        super().__init__()
        arch = config.architecture
        self.ops, self.tp = ops, tp
        self.num_heads = tp.shard(arch.num_attention_heads, "attention heads")
        self.head_dim = arch.head_dim
        self.rope_dim, self.nope_dim, self.v_dim = (
            arch.qk_rope_head_dim,
            arch.qk_nope_head_dim,
            arch.v_head_dim,
        )
        self.kv_lora_rank = arch.kv_lora_rank
        # The loader's rows of q, k and v (CausalLM._fused_parts), which no checkpoint name here takes.
        self.q_size = self.kv_size = self.num_heads * self.head_dim
        self.scale = config.attention_scale
        # An fp8 KV cache's scales for this layer (executor/kv_scales.py), as layers.Attention holds them.
        self.kv_scales: torch.Tensor | None = None
        hidden = arch.hidden_size

        def linear(inputs: int, outputs: int, input_part: slice | None = None) -> nn.Module:
            return make_linear(inputs, outputs, False, quantization, device, dtype, input_part=input_part)

        def absorbed(rows: int) -> nn.Parameter:
            empty = torch.empty(self.num_heads, rows, self.kv_lora_rank, device=device, dtype=dtype)
            return nn.Parameter(empty, requires_grad=False)

        self.q_a_proj = self.q_a_layernorm = None
        if arch.q_lora_rank:
            self.q_a_proj = linear(hidden, arch.q_lora_rank)
            self.q_a_layernorm = RMSNorm(arch.q_lora_rank, _LOW_RANK_NORM_EPS, device, dtype)
        self.q_b_proj = linear(arch.q_lora_rank or hidden, self.num_heads * self.head_dim)
        self.kv_a_proj_with_mqa = linear(hidden, self.kv_lora_rank + self.rope_dim)
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, _LOW_RANK_NORM_EPS, device, dtype)
        # kv_b_proj's halves per head: the unrotated keys' [H, nope, latent], the values' [H, v, latent].
        self.key_expansion = absorbed(self.nope_dim)
        self.value_expansion = absorbed(self.v_dim)
        self.o_proj = linear(
            self.num_heads * self.v_dim,
            hidden,
            tp.part(arch.attention_output_size, "attention heads") if tp.size > 1 else None,
        )

    def _table_layout(self, rotated: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
        """[..., rope] and [..., latent] -> [..., rope + latent] in the rotary table's layout."""
        half_rope, half_latent = self.rope_dim // 2, self.kv_lora_rank // 2
        first = (rotated[..., :half_rope], latent[..., :half_latent])
        return torch.cat((*first, rotated[..., half_rope:], latent[..., half_latent:]), dim=-1)

    def forward(
        self,
        positions: torch.Tensor,
        x: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        cos_sin_cache: torch.Tensor,
    ) -> torch.Tensor:
        queries = x if self.q_a_proj is None else self.q_a_layernorm(self.q_a_proj(x))[0]
        q = self.q_b_proj(queries).view(-1, self.num_heads, self.head_dim)
        unrotated, q_rotated = q.split([self.nope_dim, self.rope_dim], dim=-1)
        latent, rotated = self.kv_a_proj_with_mqa(x).split([self.kv_lora_rank, self.rope_dim], dim=-1)
        latent = self.kv_a_layernorm(latent.contiguous())[0]
        q_latent = torch.einsum("thn,hnl->thl", unrotated, self.key_expansion)
        q = self._table_layout(q_rotated, q_latent)
        k = self._table_layout(rotated, latent)[:, None, :]
        q = self.ops.rotary_write_kv(
            positions, q, k, None, cos_sin_cache, kv_cache, meta.slot_mapping, meta.derived, self.kv_scales
        )
        out = self.ops.attention(q, kv_cache, meta, self.scale, self.kv_scales)
        # The latent halves of the output: the softmax's sum of latents, expanded into values here.
        half_rope, width = self.rope_dim // 2, self.rope_dim + self.kv_lora_rank
        summed = torch.cat((out[..., half_rope : width // 2], out[..., width // 2 + half_rope :]), dim=-1)
        values = torch.einsum("thl,hvl->thv", summed, self.value_expansion)
        return self.tp.all_reduce(self.o_proj(values.reshape(-1, self.num_heads * self.v_dim)))


class DeepseekForCausalLM(CausalLM):
    def make_layer(
        self, layer: int, ops: AttentionOps, quantization: str, device: torch.device, dtype: torch.dtype
    ) -> nn.Module:
        config, tp = self.config, self.tp
        attention = LatentAttention(config, ops, quantization, device, dtype, tp)
        mlp = layer_mlp(config, layer, quantization, device, dtype, tp)
        return DecoderLayer(config, attention, mlp, device, dtype)

    def checkpoint_shapes(self) -> Shapes:
        return weight_shapes(self.config)

    def checkpoint_parts(self, name: str, tensor: Weight) -> Iterator[tuple[str, Weight]]:
        layer, _, projection = name.rpartition(".self_attn.")
        if projection in ("q_proj.weight", "q_b_proj.weight"):
            yield f"{layer}.self_attn.q_b_proj.weight", _rows(tensor, self._query_rows())
        elif projection == "kv_b_proj.weight":
            arch = self.config.architecture
            nope, per_head = arch.qk_nope_head_dim, arch.qk_nope_head_dim + arch.v_head_dim
            rows = _rows(tensor, self._rank_rows(per_head, torch.arange(per_head)))
            if isinstance(rows, PackedWeight):
                rows = dequantize(rows)
            keys, values = rows.view(-1, per_head, arch.kv_lora_rank).split([nope, arch.v_head_dim], dim=1)
            yield f"{layer}.self_attn.key_expansion", keys
            yield f"{layer}.self_attn.value_expansion", values
        elif projection == "kv_a_proj_with_mqa.weight":
            arch = self.config.architecture
            latent = torch.arange(arch.kv_lora_rank)
            yield name, _rows(tensor, torch.cat((latent, arch.kv_lora_rank + self._rotary_pairs())))
        else:
            yield name, tensor

    def _rotary_pairs(self) -> torch.Tensor:
        """The rotated dimensions of a head as the checkpoint holds them, in the order the table
        rotates them: every pair's first, then every pair's second."""
        rope = self.config.architecture.qk_rope_head_dim
        if self.config.rope_interleaved:
            return torch.cat((torch.arange(0, rope, 2), torch.arange(1, rope, 2)))
        return torch.arange(rope)

    def _query_rows(self) -> torch.Tensor:
        """This rank's rows of q_b_proj (or q_proj), each head's unrotated rows, then its rotated
        ones in the table's pair order."""
        nope = self.config.architecture.qk_nope_head_dim
        head = torch.cat((torch.arange(nope), nope + self._rotary_pairs()))
        return self._rank_rows(self.config.architecture.head_dim, head)

    def _rank_rows(self, per_head: int, head: torch.Tensor) -> torch.Tensor:
        """The rows of this rank's heads, each head's `head` rows of its per_head in order."""
        heads = self.layers[0].self_attn.num_heads
        first = self.tp.rank * heads
        return ((first + torch.arange(heads))[:, None] * per_head + head[None, :]).flatten()


def weight_shapes(config: ModelConfig) -> Shapes:
    arch = config.architecture
    hidden, heads = arch.hidden_size, arch.num_attention_heads
    shapes = vocabulary_shapes(arch)
    for i in range(arch.num_hidden_layers):
        layer = layer_prefix(i)
        attention = layer + "self_attn."
        shapes |= norm_shapes(layer, ("input_layernorm", "post_attention_layernorm"), hidden)
        if arch.q_lora_rank:
            shapes[attention + "q_a_proj.weight"] = (arch.q_lora_rank, hidden)
            shapes[attention + "q_a_layernorm.weight"] = (arch.q_lora_rank,)
            shapes[attention + "q_b_proj.weight"] = (arch.q_size, arch.q_lora_rank)
        else:
            shapes[attention + "q_proj.weight"] = (arch.q_size, hidden)
        shapes[attention + "kv_a_proj_with_mqa.weight"] = (arch.kv_lora_rank + arch.qk_rope_head_dim, hidden)
        shapes[attention + "kv_a_layernorm.weight"] = (arch.kv_lora_rank,)
        kv_b = heads * (arch.qk_nope_head_dim + arch.v_head_dim)
        shapes[attention + "kv_b_proj.weight"] = (kv_b, arch.kv_lora_rank)
        shapes[attention + "o_proj.weight"] = (hidden, arch.attention_output_size)
        if arch.is_sparse_layer(i):
            shapes |= sparse_mlp_shapes(arch, layer)
        else:
            shapes |= mlp_shapes(layer + "mlp.", hidden, arch.intermediate_size)
    return shapes


def _routing(raw: dict[str, Any], v3: bool, num_experts: int, top_k: int) -> dict[str, Any]:
    """The ModelConfig fields of the router: V3's grouped sigmoid scores, V2's softmax."""
    scoring = raw.get("scoring_func") or ("sigmoid" if v3 else "softmax")
    if scoring != ("sigmoid" if v3 else "softmax"):
        raise ConfigError(
            f"asks for scoring_func {scoring!r}; DeepSeek {'V3' if v3 else 'V2'} models route by "
            f"{'sigmoid' if v3 else 'softmax'} scores, so restore that value"
        )
    groups, topk_group = raw.get("n_group") or 1, raw.get("topk_group") or 1
    if v3:
        try:
            check_routing(num_experts, top_k, SigmoidRouting(groups, topk_group), None)
        except ValueError as exc:
            raise ConfigError(f"routes in a way that cannot work: {exc}") from exc
        return dict(
            scoring_func="sigmoid",
            n_group=groups,
            topk_group=topk_group,
            norm_topk_prob=raw.get("norm_topk_prob", True),
        )
    method = raw.get("topk_method") or "greedy"
    if method not in ("greedy", "group_limited_greedy"):
        raise ConfigError(
            f"asks for topk_method {method!r}, which DeepSeek V2 models do not route by; Pagoda serves "
            "greedy (DeepSeek-V2-Lite) and group_limited_greedy (DeepSeek-V2, V2.5, Coder-V2)"
        )
    if raw.get("norm_topk_prob"):
        raise ConfigError(
            "sets norm_topk_prob for a DeepSeek V2 model, whose routing (as transformers') never "
            "renormalizes the chosen experts' weights; set it to false"
        )
    if method == "greedy":
        return dict(norm_topk_prob=False)
    try:
        check_routing(num_experts, top_k, None, None, SoftmaxGroups(groups, topk_group))
    except ValueError as exc:
        raise ConfigError(f"routes in a way that cannot work: {exc}") from exc
    return dict(norm_topk_prob=False, n_group=groups, topk_group=topk_group)


def config_from_hf(raw: dict[str, Any], architecture: str) -> ModelConfig:
    v3 = MODEL_TYPES[architecture] == "deepseek_v3"
    check_activation(raw, "hidden_act", "silu", FAMILY)
    if raw.get("attention_bias", False):
        raise ConfigError(f"sets attention_bias; {FAMILY} models have no bias on their attention projections")
    if raw.get("moe_layer_freq", 1) != 1:
        raise ConfigError(
            f"sets moe_layer_freq {raw['moe_layer_freq']}; Pagoda's {FAMILY} models have a mixture of "
            "experts in every layer past first_k_dense_replace (moe_layer_freq 1)"
        )
    fields = architecture_fields(raw, FAMILY)
    heads, layers = fields["num_attention_heads"], fields["num_hidden_layers"]
    nope = field(raw, "qk_nope_head_dim", FAMILY)
    rope_dim = field(raw, "qk_rope_head_dim", FAMILY)
    v_dim = field(raw, "v_head_dim", FAMILY)
    head_dim = nope + rope_dim
    kv_lora_rank = field(raw, "kv_lora_rank", FAMILY)
    if rope_dim % 2 or kv_lora_rank % 2:
        raise ConfigError(
            f"has qk_rope_head_dim {rope_dim} and kv_lora_rank {kv_lora_rank}; Pagoda serves latent "
            "attention whose rotated key and latent are both of even width"
        )
    width = field(raw, "moe_intermediate_size", FAMILY)
    num_experts = field(raw, "n_routed_experts", FAMILY)
    top_k = field(raw, "num_experts_per_tok", FAMILY)
    rope = rope_parameters(raw)
    scaling = rope_scaling(rope, FAMILY)
    return ModelConfig(
        model_type=MODEL_TYPES[architecture],
        architecture=ModelArchitecture(
            # Every head's query and key, before absorption, are qk_nope + qk_rope wide; the cache
            # holds one latent a token (ModelArchitecture.kv_cache_shape).
            **{**fields, "num_key_value_heads": heads, "head_dim": head_dim},
            q_lora_rank=raw.get("q_lora_rank") or 0,
            kv_lora_rank=kv_lora_rank,
            qk_nope_head_dim=nope,
            qk_rope_head_dim=rope_dim,
            v_head_dim=v_dim,
            num_experts=num_experts,
            num_experts_per_tok=top_k,
            moe_intermediate_size=width,
            shared_expert_intermediate_size=width * (raw.get("n_shared_experts") or 0),
            mlp_only_layers=tuple(range(min(raw.get("first_k_dense_replace", 3 if v3 else 0), layers))),
            router_score_bias=v3,
            **nextn_predict_layers(raw),
        ),
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
        rope_theta=rope.get("rope_theta", 10000.0),
        rope_scaling=scaling,
        bos_token_id=raw.get("bos_token_id"),
        partial_rotary_factor=rope_dim / head_dim,
        rope_interleaved=not v3 or raw.get("rope_interleave", True),
        attention_multiplier=latent_softmax_scale(head_dim, scaling),
        routed_scaling_factor=raw.get("routed_scaling_factor", 1.0),
        **_routing(raw, v3, num_experts, top_k),
    )
