"""Mixture-of-experts families: Qwen3-MoE (Qwen3-30B-A3B: Qwen3's attention, 128 experts of which
8 per token, each 768 channels wide; also Qwen3-VL-MoE's language model), Qwen2-MoE
(Qwen1.5-MoE-A2.7B: Qwen2's attention, 60 experts of which 4 per token, a shared expert gated per
token) and Mixtral (Mixtral-8x7B: Mistral's attention, 8 experts of which 2 per token).

The layer (SparseMoE) also serves GLM-4.5 (glm4_moe.py), GPT-OSS (gpt_oss.py), DeepSeek V2 / V3
(deepseek.py), ERNIE 4.5 (ernie.py) and Llama 4 (llama4.py). It routes each token to its top-k
experts (softmax over the router's logits, the chosen weights renormalized where the config says
so, ERNIE's ranked with a correction bias; or GLM-4.5's grouped sigmoid scores with a correction
bias), sums their SwiGLU
outputs weighted by the router and scaled by routed_scaling_factor (kernels/moe.py: the grouped
Triton kernel on CUDA, the reference on the CPU), plus the shared experts' MLP where the model has
one. Each projection's experts are one fused weight of the layer, [E * 2I, H] for gate and up and
[E * H, I] for down, built by make_linear like any projection, so int8, fp8 and int4 experts are
quantized as they load; the router stays in the model's float dtype. Tensor parallelism shards
every expert's intermediate channels (kernels/moe_weights.py), and the partial outputs are summed
over the ranks as after a row-parallel layer.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from pagoda_runtime.contract.config import ModelConfig
from pagoda_runtime.contract.sizing import ModelArchitecture
from pagoda_runtime.contract.weight_layout import (
    attention_shapes,
    fused_expert_shapes,
    layer_prefix,
    mlp_shapes,
    norm_shapes,
    vocabulary_shapes,
)
from pagoda_runtime.executor.kernels import AttentionOps
from pagoda_runtime.executor.kernels.moe import fused_moe
from pagoda_runtime.executor.kernels.moe_activation import ClampedSwiGLU
from pagoda_runtime.executor.kernels.moe_options import ExpertOptions
from pagoda_runtime.executor.kernels.moe_routing import SigmoidRouting, SoftmaxGroups
from pagoda_runtime.executor.kernels.moe_weights import ExpertWeights, PackedExperts
from pagoda_runtime.executor.models.decoder import CausalLM, Weight
from pagoda_runtime.executor.models.hf_config import (
    architecture_fields,
    attention_biases,
    check_activation,
    field,
    layer_types,
    rope_parameters,
    rope_scaling,
)
from pagoda_runtime.executor.models.layers import Attention, DecoderLayer, GatedMLP, RMSNorm
from pagoda_runtime.executor.quantization import (
    DenseLinear,
    PackedWeight,
    QuantizedLinear,
    dequantize,
    make_linear,
)
from pagoda_runtime.parallel.tensor_parallel import TensorParallel


class Router(nn.Module):
    """The gate: one logit per expert (plus a bias for GPT-OSS), never quantized (as in vLLM).

    score_bias: the correction bias per expert of the sigmoid routers (GLM-4.5, DeepSeek V3) and
    ERNIE 4.5's softmax router, held in float32 as transformers holds it; those routers' logits are
    computed in float32 too, as there, since their choice hangs on small differences of scores."""

    def __init__(
        self,
        num_experts: int,
        hidden: int,
        bias: bool,
        device: torch.device,
        dtype: torch.dtype,
        score_bias: bool = False,
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.empty(num_experts, device=device, dtype=dtype)) if bias else None
        self.e_score_correction_bias = None
        if score_bias:
            self.e_score_correction_bias = nn.Parameter(
                torch.zeros(num_experts, device=device, dtype=torch.float32), requires_grad=False
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.e_score_correction_bias is not None:
            return nn.functional.linear(x.float(), self.weight.float())
        return nn.functional.linear(x, self.weight, self.bias)


class SparseMoE(nn.Module):
    # Its packed experts stay in the grouped kernel's layout (CausalLM.pack_for_cpu leaves them):
    # torch's CPU kernels take one matrix, not E of them.
    grouped_experts = True

    def __init__(
        self,
        config: ModelConfig,
        quantization: str,
        device: torch.device,
        dtype: torch.dtype,
        tp: TensorParallel,
    ) -> None:
        super().__init__()
        arch = config.architecture
        self.tp = tp
        self.num_experts, self.top_k = arch.num_experts, arch.num_experts_per_tok
        self.renormalize = config.norm_topk_prob
        self.hidden = arch.hidden_size
        width = arch.moe_intermediate_size
        self.channels = tp.shard(width, "expert MLP channels")
        self.rows = tp.part(width, "expert MLP channels")
        self.device, self.dtype = device, dtype
        self.gate = Router(
            self.num_experts, self.hidden, arch.expert_bias, device, dtype, arch.router_score_bias
        )
        self.sigmoid_routing = None
        if config.scoring_func == "sigmoid":
            self.sigmoid_routing = SigmoidRouting(
                config.n_group, config.topk_group, config.routed_scaling_factor
            )
        self.softmax_groups = None
        if self.sigmoid_routing is None and config.topk_group < config.n_group:
            self.softmax_groups = SoftmaxGroups(config.n_group, config.topk_group)
        self.weight_on_input = config.router_weight_on_input
        # Softmax routing scales the routed experts' sum by routed_scaling_factor too (DeepSeek V2);
        # the sigmoid rule scales its weights itself.
        self.routed_scale = config.routed_scaling_factor if self.sigmoid_routing is None else 1.0
        # Experts every token goes through besides its routed ones (GLM-4.5, DeepSeek), a plain MLP.
        self.shared_experts = None
        if arch.shared_expert_intermediate_size:
            self.shared_experts = GatedMLP(
                config, quantization, device, dtype, tp, width=arch.shared_expert_intermediate_size
            )
        # Qwen2-MoE's: sigmoid(x . w) scales the shared experts' output, token by token; whole on
        # every rank, in the model's dtype, as the router.
        self.shared_expert_gate = None
        if arch.shared_expert_gate:
            self.shared_expert_gate = nn.Linear(self.hidden, 1, bias=False, device=device, dtype=dtype)
        self.activation = None if config.swiglu_limit is None else ClampedSwiGLU(limit=config.swiglu_limit)
        # GPT-OSS's expert biases: gate_up's as its fused rows (this rank's channels), down's whole on
        # every rank and added by rank 0 alone, since the ranks' partial outputs are summed.
        self.gate_up_bias = self.down_bias = None
        if arch.expert_bias:
            self.gate_up_bias = nn.Parameter(
                torch.empty(self.num_experts, 2 * self.channels, device=device, dtype=dtype),
                requires_grad=False,
            )
            self.down_bias = nn.Parameter(
                torch.empty(self.num_experts, self.hidden, device=device, dtype=dtype), requires_grad=False
            )
        self.experts_gate_up = make_linear(
            self.hidden, self.num_experts * 2 * self.channels, False, quantization, device, dtype
        )
        self.experts_down = make_linear(
            self.channels,
            self.num_experts * self.hidden,
            False,
            quantization,
            device,
            dtype,
            input_part=self.rows if tp.size > 1 else None,
        )

    def load_expert(self, expert: int, name: str, tensor: Weight) -> None:
        """Place checkpoint tensor `name` (gate_proj, up_proj or down_proj's weight, or with biased
        experts its bias) of expert `expert`; this rank keeps its channels."""
        if not 0 <= expert < self.num_experts:
            raise ValueError(f"the checkpoint holds expert {expert}, but the config has {self.num_experts}")
        width = 2 * self.channels
        projection, _, leaf = name.partition(".")
        offsets = {"gate_proj": 0, "up_proj": self.channels}
        if (
            projection not in (*offsets, "down_proj")
            or leaf not in ("weight", "bias")
            or (leaf == "bias" and self.gate_up_bias is None)
        ):
            raise ValueError(f"an expert has no tensor {name!r}; it has gate_proj, up_proj and down_proj")
        if projection == "down_proj":
            if leaf == "bias":
                self.down_bias[expert].copy_(tensor)
            else:
                self._place("experts_down", tensor, expert * self.hidden)
            return
        part = tensor.rows(self.rows) if isinstance(tensor, PackedWeight) else tensor[self.rows]
        if leaf == "bias":
            self.gate_up_bias[expert, offsets[projection] : offsets[projection] + self.channels].copy_(part)
        else:
            self._place("experts_gate_up", part, expert * width + offsets[projection])

    def _place(self, name: str, weight: Weight, row_offset: int) -> None:
        """Load rows of the experts' projection `name`. The grouped kernel reads one layout per
        projection, so where a GGUF file's experts arrive as floats (a block type without a packed
        layout: Q5_K_M's Q5_K, Q4_K_S's Q5_K down projections) the projection holds floats, packed
        rows included, dequantized. Float experts of an online quantization are quantized as ever."""
        projection = getattr(self, name)
        floats = isinstance(projection, QuantizedLinear) and projection.method == "none"
        if floats and not isinstance(weight, PackedWeight):
            projection = self._as_floats(projection)
            setattr(self, name, projection)
        if isinstance(projection, DenseLinear) and isinstance(weight, PackedWeight):
            weight = dequantize(weight, self.dtype)
        projection.load(weight, row_offset)

    def _as_floats(self, projection: QuantizedLinear) -> DenseLinear:
        dense = make_linear(
            projection.in_features,
            projection.out_features,
            False,
            "none",
            self.device,
            self.dtype,
            input_part=projection.input_part,
        )
        if projection.qweight is not None:
            held = dequantize(projection.weight, self.dtype)  # this rank's inputs already
            for start, stop in projection.loaded_rows:
                dense.weight.data[start:stop] = held[start:stop]
        return dense

    def idle_expert_bytes(self) -> int:
        """Bytes of the experts one token is not routed to: what a batch-1 step does not read."""
        stored = sum(
            t.numel() * t.element_size()
            for projection in (self.experts_gate_up, self.experts_down)
            for t in projection.state_dict().values()
        )
        return stored * (self.num_experts - self.top_k) // self.num_experts

    def _experts(self, projection: nn.Module, rows: int) -> ExpertWeights:
        if isinstance(projection, QuantizedLinear):
            return PackedExperts(projection.weight, self.num_experts)
        return projection.weight.view(self.num_experts, rows, projection.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = fused_moe(
            x,
            self.gate(x),
            self._experts(self.experts_gate_up, 2 * self.channels),
            self._experts(self.experts_down, self.hidden),
            self.top_k,
            self.renormalize,
            ExpertOptions(
                self.gate_up_bias,
                self.down_bias if self.tp.rank == 0 else None,
                self.activation,
                self.sigmoid_routing,
                self.gate.e_score_correction_bias,
                self.softmax_groups,
                self.weight_on_input,
            ),
        )
        if self.routed_scale != 1.0:
            out = out * self.routed_scale
        out = self.tp.all_reduce(out)
        if self.shared_experts is None:
            return out
        shared = self.shared_experts(x)
        if self.shared_expert_gate is not None:
            shared = torch.sigmoid(self.shared_expert_gate(x)) * shared
        return out + shared


def layer_mlp(
    config: ModelConfig,
    layer: int,
    quantization: str,
    device: torch.device,
    dtype: torch.dtype,
    tp: TensorParallel,
) -> nn.Module:
    """Layer `layer`'s MLP: its experts where the layer is sparse, the dense MLP elsewhere."""
    if config.architecture.is_sparse_layer(layer):
        return SparseMoE(config, quantization, device, dtype, tp)
    return GatedMLP(config, quantization, device, dtype, tp)


class MoECausalLM(CausalLM):
    qk_norm: type[nn.Module] | None = None

    def make_layer(
        self, layer: int, ops: AttentionOps, quantization: str, device: torch.device, dtype: torch.dtype
    ) -> nn.Module:
        config, tp = self.config, self.tp
        attention = Attention(config, layer, ops, quantization, device, dtype, tp, self.qk_norm)
        mlp = layer_mlp(config, layer, quantization, device, dtype, tp)
        return DecoderLayer(config, attention, mlp, device, dtype)

    def checkpoint_shapes(self) -> dict[str, tuple[int, ...]]:
        return weight_shapes(self.config)


def fused_expert_parts(
    prefix: str, fused: str, tensor: Weight, family: str
) -> Iterator[tuple[str, torch.Tensor]]:
    """Each expert's gate, up and down weights ([out, in], the Llama orientation) of a checkpoint's
    fused expert tensor (weight_layout.fused_expert_shapes)."""
    if fused not in ("gate_up_proj", "down_proj") or not isinstance(tensor, torch.Tensor):
        raise ValueError(
            f"the checkpoint holds experts.{fused} in a form a {family} model does not read; it reads "
            "float experts.gate_up_proj and experts.down_proj"
        )
    for expert, part in enumerate(tensor):
        name = f"{prefix}{expert}."
        if fused == "down_proj":
            yield name + "down_proj.weight", part.T.contiguous()
        else:
            gate, up = part.chunk(2, dim=-1)
            yield name + "gate_proj.weight", gate.T.contiguous()
            yield name + "up_proj.weight", up.T.contiguous()


class Qwen3MoeForCausalLM(MoECausalLM):
    """Qwen3-MoE; also the language model of Qwen3-VL-MoE (model_type qwen3_vl_moe), whose
    checkpoints hold each layer's experts as two fused tensors."""

    qk_norm = RMSNorm

    def checkpoint_parts(self, name: str, tensor: Weight) -> Iterator[tuple[str, Weight]]:
        layer, experts, fused = name.partition(".mlp.experts.")
        if experts and self.config.model_type == "qwen3_vl_moe":
            yield from fused_expert_parts(f"{layer}.mlp.experts.", fused, tensor, "Qwen3-VL-MoE")
        else:
            yield name, tensor


class Qwen2MoeForCausalLM(MoECausalLM):
    """Qwen1.5-MoE and Qwen2-MoE: Qwen2's attention (q, k and v biased), softmax routing, and a
    shared expert gated per token (mlp.shared_expert, mlp.shared_expert_gate)."""

    def checkpoint_parts(self, name: str, tensor: Weight) -> Iterator[tuple[str, Weight]]:
        yield name.replace(".mlp.shared_expert.", ".mlp.shared_experts."), tensor


# Mixtral's checkpoint names for what Qwen3-MoE (and the model) call mlp.gate, mlp.experts.N.gate_proj, ...
_MIXTRAL_NAMES = {
    "w1.weight": "gate_proj.weight",
    "w3.weight": "up_proj.weight",
    "w2.weight": "down_proj.weight",
}


class MixtralForCausalLM(MoECausalLM):
    def checkpoint_parts(self, name: str, tensor: Weight) -> Iterator[tuple[str, Weight]]:
        name = name.replace(".block_sparse_moe.", ".mlp.")
        head, dot, leaf = name.rpartition(".experts.")
        if dot:
            expert, _, rest = leaf.partition(".")
            name = f"{head}.experts.{expert}.{_MIXTRAL_NAMES.get(rest, rest)}"
        yield name, tensor


def weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    arch = config.architecture
    hidden, width = arch.hidden_size, arch.moe_intermediate_size
    mixtral = config.model_type == "mixtral"
    qwen2 = config.model_type == "qwen2_moe"
    block = "block_sparse_moe." if mixtral else "mlp."
    names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    shapes = vocabulary_shapes(arch)
    for i in range(arch.num_hidden_layers):
        layer = layer_prefix(i)
        shapes |= norm_shapes(layer, ("input_layernorm", "post_attention_layernorm"), hidden)
        shapes |= attention_shapes(arch, layer)
        if not (mixtral or qwen2):
            shapes |= norm_shapes(layer + "self_attn.", ("q_norm", "k_norm"), arch.head_dim)
        if not arch.is_sparse_layer(i):
            shapes |= mlp_shapes(layer + "mlp.", hidden, arch.intermediate_size)
            continue
        shapes[f"{layer}{block}gate.weight"] = (arch.num_experts, hidden)
        if qwen2:
            shapes |= mlp_shapes(f"{layer}mlp.shared_expert.", hidden, arch.shared_expert_intermediate_size)
            shapes[f"{layer}mlp.shared_expert_gate.weight"] = (1, hidden)
        if config.model_type == "qwen3_vl_moe":
            shapes |= fused_expert_shapes(arch, layer + block)
            continue
        for e in range(arch.num_experts):
            expert = f"{layer}{block}experts.{e}."
            gate, up, down = names
            shapes |= {
                f"{expert}{gate}.weight": (width, hidden),
                f"{expert}{up}.weight": (width, hidden),
                f"{expert}{down}.weight": (hidden, width),
            }
    return shapes


def moe_config(
    raw: dict[str, Any], model_type: str, family: str, biases: dict[str, bool] | None = None, **fields: Any
) -> ModelConfig:
    """biases: the attention's bias fields, where not attention_bias's (attention_biases)."""
    check_activation(raw, "hidden_act", "silu", family)
    arch = architecture_fields(raw, family)
    rope = rope_parameters(raw)
    # Qwen3-MoE's configs say num_experts, Mixtral's (and transformers 5's for both) num_local_experts.
    num_experts = raw.get("num_experts") or field(raw, "num_local_experts", family)
    return ModelConfig(
        model_type=model_type,
        architecture=ModelArchitecture(
            **arch,
            **fields,
            num_experts=num_experts,
            num_experts_per_tok=field(raw, "num_experts_per_tok", family),
            **(attention_biases(raw) if biases is None else biases),
            **layer_types(raw, arch["num_hidden_layers"], family, per_layer=model_type != "mixtral"),
        ),
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
        rope_theta=rope.get("rope_theta", 10000.0),
        rope_scaling=rope_scaling(rope, family),
        bos_token_id=raw.get("bos_token_id"),
        norm_topk_prob=model_type == "mixtral" or raw.get("norm_topk_prob", False),
    )


def qwen3_moe_config_from_hf(raw: dict[str, Any], architecture: str) -> ModelConfig:
    family = "Qwen3-MoE"
    layers = field(raw, "num_hidden_layers", family)
    step = raw.get("decoder_sparse_step", 1) or 1
    # A layer is sparse when it is not listed dense and falls on the sparse step (transformers' rule).
    dense = sorted(set(raw.get("mlp_only_layers") or ()) | {i for i in range(layers) if (i + 1) % step})
    # Qwen3-VL-MoE's language model (loading/text_of_multimodal.py), its experts stored fused.
    model_type = "qwen3_vl_moe" if raw.get("model_type") == "qwen3_vl_moe_text" else "qwen3_moe"
    return moe_config(
        raw,
        model_type,
        family,
        moe_intermediate_size=field(raw, "moe_intermediate_size", family),
        mlp_only_layers=tuple(dense),
    )


def qwen2_moe_config_from_hf(raw: dict[str, Any], architecture: str) -> ModelConfig:
    family = "Qwen2-MoE"
    layers = field(raw, "num_hidden_layers", family)
    step = raw.get("decoder_sparse_step", 1) or 1
    dense = sorted(set(raw.get("mlp_only_layers") or ()) | {i for i in range(layers) if (i + 1) % step})
    return moe_config(
        raw,
        "qwen2_moe",
        family,
        # Qwen2's attention: q, k and v biased (qkv_bias, on unless a config turns it off), o not.
        biases={"attention_bias": raw.get("qkv_bias", True), "attention_output_bias": False},
        moe_intermediate_size=field(raw, "moe_intermediate_size", family),
        shared_expert_intermediate_size=raw.get("shared_expert_intermediate_size") or 0,
        shared_expert_gate=bool(raw.get("shared_expert_intermediate_size")),
        mlp_only_layers=tuple(dense),
    )


def mixtral_config_from_hf(raw: dict[str, Any], architecture: str) -> ModelConfig:
    family = "Mixtral"
    # Every Mixtral layer is sparse and its experts are intermediate_size wide.
    return moe_config(raw, "mixtral", family, moe_intermediate_size=field(raw, "intermediate_size", family))


def qwen3_moe_config_from_gguf(arch: str, meta: dict[str, Any], tensors: set[str], read: Any) -> ModelConfig:
    """qwen3moe GGUF files, as llama.cpp's converter writes them (experts merged per layer); a layer
    without a router is a dense one."""
    heads = meta[f"{arch}.attention.head_count"]
    hidden = meta[f"{arch}.embedding_length"]
    layers = meta[f"{arch}.block_count"]
    return ModelConfig(
        model_type="qwen3_moe",
        architecture=ModelArchitecture(
            num_hidden_layers=layers,
            hidden_size=hidden,
            intermediate_size=meta.get(
                f"{arch}.feed_forward_length", meta[f"{arch}.expert_feed_forward_length"]
            ),
            num_attention_heads=heads,
            num_key_value_heads=meta.get(f"{arch}.attention.head_count_kv", heads),
            head_dim=meta.get(f"{arch}.attention.key_length", hidden // heads),
            vocab_size=meta.get(f"{arch}.vocab_size", len(meta["tokenizer.ggml.tokens"])),
            max_position_embeddings=meta[f"{arch}.context_length"],
            tie_word_embeddings="output.weight" not in tensors,
            num_experts=meta[f"{arch}.expert_count"],
            num_experts_per_tok=meta[f"{arch}.expert_used_count"],
            moe_intermediate_size=meta[f"{arch}.expert_feed_forward_length"],
            mlp_only_layers=tuple(i for i in range(layers) if f"blk.{i}.ffn_gate_inp.weight" not in tensors),
        ),
        rms_norm_eps=meta[f"{arch}.attention.layer_norm_rms_epsilon"],
        rope_theta=meta.get(f"{arch}.rope.freq_base", 10000.0),
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        # llama.cpp's qwen3moe graph renormalizes the chosen experts' weights unless told otherwise.
        norm_topk_prob=meta.get(f"{arch}.expert_weights_norm", True),
    )


# blk.N.<GGUF name> -> model.layers.N.<Hugging Face name>; {} is the expert of a merged tensor.
QWEN3_MOE_GGUF_NAMES = {
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate_inp.weight": "mlp.gate.weight",
    "ffn_gate_exps.weight": "mlp.experts.{}.gate_proj.weight",
    "ffn_up_exps.weight": "mlp.experts.{}.up_proj.weight",
    "ffn_down_exps.weight": "mlp.experts.{}.down_proj.weight",
}
