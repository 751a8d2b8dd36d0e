"""The layers the families are built from, gpt-fast style: norms, attention over the paged cache, the
gated MLP, and the pre-norm decoder layer of the Llama family.

q, k and v share one fused projection, as do gate and up; the model's `load_weights` fills the
fused weights from Hugging Face's separate tensors. Attention goes through the device's kernels:
rotate q and k, write this step's keys and values into the layer's paged cache, attend over the
cache.

Split over tensor-parallel ranks (Megatron-style), each rank holds its query heads and their
key/value heads and its part of the MLP channels: qkv_proj and gate_up_proj are column-parallel
(each fused part cut by rank, so a rank's q, k and v heads stay together), o_proj and down_proj
row-parallel with a sum over the ranks after them. Norms are whole on every rank.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from pagoda_runtime.contract.config import ModelConfig
from pagoda_runtime.contract.sizing import kv_heads_per_rank
from pagoda_runtime.executor.attention_metadata import AttentionMetadata
from pagoda_runtime.executor.kernels import AttentionOps, rms_norm, silu_and_mul
from pagoda_runtime.executor.quantization import make_linear
from pagoda_runtime.parallel.tensor_parallel import TensorParallel


class RMSNorm(nn.Module):
    """Llama's RMSNorm: weight * normalized(x), the product in x's dtype."""

    def __init__(self, size: int, eps: float, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size, device=device, dtype=dtype), requires_grad=False)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return rms_norm(x, self.weight, self.eps, residual)


class Attention(nn.Module):
    """Self-attention of one layer over its paged KV cache.

    qk_norm: the per-head norm q and k go through before rotation (Qwen3, Gemma 3), or None;
    query_scale: (positions, q) -> q scaled by position before rotation (Llama 4), or None. The
    layer's sliding window (passed per layer: Gemma's layers alternate), its softmax scale, its
    logit soft-cap, and GPT-OSS's sinks and output bias come from the config. The output bias is
    added after the sum over the ranks, so once.
    """

    def __init__(
        self,
        config: ModelConfig,
        layer: int,
        ops: AttentionOps,
        quantization: str,
        device: torch.device,
        dtype: torch.dtype,
        tp: TensorParallel,
        qk_norm: Callable[[int, float, torch.device, torch.dtype], nn.Module] | None = None,
        query_scale: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        super().__init__()
        arch = config.architecture
        self.query_scale = query_scale
        self.ops = ops
        self.tp = tp
        self.num_heads = tp.shard(arch.num_attention_heads, "attention heads")
        self.num_kv_heads = kv_heads_per_rank(arch.num_key_value_heads, tp.size)
        self.head_dim = arch.head_dim
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.scale = config.attention_scale
        # An fp8 KV cache's scales for this layer, float32 [2, Hkv] (executor/kv_scales.py); not a
        # buffer: the checkpoint does not hold them.
        self.kv_scales: torch.Tensor | None = None
        self.window = arch.layer_window(layer)
        self.chunked = arch.layer_chunked(layer)
        self.softcap = config.attn_logit_softcapping
        # Qwen3.5's and Qwen3-Next's gate on the output, one per query channel, after k and v.
        self.gate_size = self.q_size if arch.attention_output_gate else 0
        self.qkv_proj = make_linear(
            arch.hidden_size,
            self.q_size + 2 * self.kv_size + self.gate_size,
            arch.attention_bias,
            quantization,
            device,
            dtype,
        )
        self.o_proj = make_linear(
            self.q_size,
            arch.hidden_size,
            False,  # a row-parallel bias would be added once per rank; no supported model has one
            quantization,
            device,
            dtype,
            input_part=tp.part(arch.q_size, "attention heads") if tp.size > 1 else None,
        )
        # The adapters' slots of qkv_proj and o_proj (models/lora_layers.py), with --enable-lora.
        self.qkv_lora = self.o_lora = None
        # One logit per query head of this rank, in the softmax of each of its rows (GPT-OSS).
        self.sinks = None
        if arch.attention_sinks:
            self.sinks = nn.Parameter(
                torch.zeros(self.num_heads, device=device, dtype=dtype), requires_grad=False
            )
        self.o_bias = None
        if arch.attention_output_bias:
            self.o_bias = nn.Parameter(
                torch.zeros(arch.hidden_size, device=device, dtype=dtype), requires_grad=False
            )
        self.q_norm = self.k_norm = None
        if qk_norm is not None:
            self.q_norm = qk_norm(self.head_dim, config.rms_norm_eps, device, dtype)
            self.k_norm = qk_norm(self.head_dim, config.rms_norm_eps, device, dtype)

    def forward(
        self,
        positions: torch.Tensor,
        x: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        cos_sin_cache: torch.Tensor,
    ) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        if self.qkv_lora is not None:
            qkv = self.qkv_lora(qkv, x)
        q, k, v, gate = qkv.split([self.q_size, self.kv_size, self.kv_size, self.gate_size], dim=-1)
        q = q.reshape(-1, self.num_heads, self.head_dim)
        k = k.reshape(-1, self.num_kv_heads, self.head_dim)
        v = v.reshape(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.norm_qk(q, k)
        if self.query_scale is not None:
            q = self.query_scale(positions, q)
        meta = meta.for_window(self.window)
        q = self.ops.rotary_write_kv(
            positions, q, k, v, cos_sin_cache, kv_cache, meta.slot_mapping, meta.derived, self.kv_scales
        )
        out = self.ops.attention(
            q,
            kv_cache,
            meta,
            self.scale,
            self.kv_scales,
            window=self.window,
            softcap=self.softcap,
            sinks=self.sinks,
            chunked=self.chunked,
        )
        out = out.reshape(-1, self.q_size)
        if self.gate_size:
            out = out * torch.sigmoid(gate)
        projected = self.o_proj(out)
        if self.o_lora is not None:
            # A row-parallel rank adds its partial delta to its partial sum, before the all-reduce.
            projected = self.o_lora(projected, out)
        projected = self.tp.all_reduce(projected)
        return projected if self.o_bias is None else projected + self.o_bias

    def norm_qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q [T, heads, head_dim] and k normed before rotation: over each head's dimensions, heads
        as rows."""
        q = self.q_norm(q.reshape(-1, self.head_dim))[0].view(-1, self.num_heads, self.head_dim)
        k = self.k_norm(k.reshape(-1, self.head_dim))[0].view(-1, self.num_kv_heads, self.head_dim)
        return q, k


def down_projection(
    hidden: int,
    width: int,
    quantization: str,
    device: torch.device,
    dtype: torch.dtype,
    tp: TensorParallel,
    what: str = "MLP channels",
) -> nn.Module:
    """A row-parallel projection back to the hidden size, this rank's share of `width` inputs (of
    `what`) in: an MLP's down_proj, a recurrent layer's out_proj."""
    return make_linear(
        tp.shard(width, what),
        hidden,
        False,
        quantization,
        device,
        dtype,
        input_part=tp.part(width, what) if tp.size > 1 else None,
    )


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)); act_and_mul takes [T, 2 * I] with gate in the first half. `width`:
    its channels where they are not intermediate_size (a mixture-of-experts layer's shared experts)."""

    def __init__(
        self,
        config: ModelConfig,
        quantization: str,
        device: torch.device,
        dtype: torch.dtype,
        tp: TensorParallel,
        act_and_mul: Callable[[torch.Tensor], torch.Tensor] = silu_and_mul,
        width: int | None = None,
    ) -> None:
        super().__init__()
        arch = config.architecture
        width = width or arch.intermediate_size
        self.tp = tp
        self.act_and_mul = act_and_mul
        channels = self.channels = tp.shard(width, "MLP channels")
        self.gate_up_proj = make_linear(arch.hidden_size, 2 * channels, False, quantization, device, dtype)
        self.down_proj = down_projection(arch.hidden_size, width, quantization, device, dtype, tp)

        self.gate_up_lora = self.down_lora = None  # the adapters' slots, with --enable-lora

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if self.gate_up_lora is not None:
            gate_up = self.gate_up_lora(gate_up, x)
        hidden = self.act_and_mul(gate_up)
        down = self.down_proj(hidden)
        if self.down_lora is not None:
            down = self.down_lora(down, hidden)
        return self.tp.all_reduce(down)


class UngatedMLP(nn.Module):
    """down(act(up(x))) (ModelArchitecture.gated_mlp false: Arcee's and Nemotron's relu², act
    relu_squared; Apertus' xIELU, a module with its own parameters). Its up rows load unfused
    (CausalLM._fused_parts); it takes no LoRA adapter."""

    unfused = True

    def __init__(
        self,
        config: ModelConfig,
        quantization: str,
        device: torch.device,
        dtype: torch.dtype,
        tp: TensorParallel,
        act: Callable[[torch.Tensor], torch.Tensor],
    ) -> None:
        super().__init__()
        arch = config.architecture
        # act_fn: the checkpoint's name for a learned activation's parameters (Apertus' xIELU).
        self.tp, self.act_fn = tp, act
        channels = self.channels = tp.shard(arch.intermediate_size, "MLP channels")
        self.up_proj = make_linear(arch.hidden_size, channels, False, quantization, device, dtype)
        self.down_proj = down_projection(
            arch.hidden_size, arch.intermediate_size, quantization, device, dtype, tp
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(self.down_proj(self.act_fn(self.up_proj(x))))


def relu_squared(x: torch.Tensor) -> torch.Tensor:
    return torch.square(torch.relu(x))


class DecoderLayer(nn.Module):
    """Llama's pre-norm layer: x + attn(norm(x)), then x + mlp(norm(x)), the residual sums fused
    into the norms; `norm`: their class where not RMSNorm (Nemotron's)."""

    def __init__(
        self,
        config: ModelConfig,
        attention: Attention,
        mlp: nn.Module,
        device,
        dtype,
        norm: Callable[..., nn.Module] = RMSNorm,
    ) -> None:
        super().__init__()
        hidden = config.architecture.hidden_size
        self.input_layernorm = norm(hidden, config.rms_norm_eps, device, dtype)
        self.self_attn = attention
        self.post_attention_layernorm = norm(hidden, config.rms_norm_eps, device, dtype)
        self.mlp = mlp

    def forward(self, positions, x, residual, kv_cache, meta, cos_sin_cache):
        x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(positions, x, kv_cache, meta, cos_sin_cache)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class StateDecoderLayer(nn.Module):
    """Llama's pre-norm layer around a token mixer that keeps a recurrent state per sequence instead
    of attending (a Mamba-2, gated DeltaNet or short-convolution layer, called as attention is and
    held under its checkpoint name `mixer_name`): x + mixer(norm(x)), then x + mlp(norm(x)), each
    output scaled by residual_multiplier before it joins the residual stream (Granite's); `norm`:
    the norms' class."""

    def __init__(
        self,
        config: ModelConfig,
        mixer_name: str,
        mixer: nn.Module,
        mlp: nn.Module,
        device,
        dtype,
        norm: Callable[..., nn.Module] = RMSNorm,
        residual_multiplier: float = 1.0,
    ) -> None:
        super().__init__()
        hidden = config.architecture.hidden_size
        self.input_layernorm = norm(hidden, config.rms_norm_eps, device, dtype)
        self.mixer_name = mixer_name
        setattr(self, mixer_name, mixer)
        self.post_attention_layernorm = norm(hidden, config.rms_norm_eps, device, dtype)
        self.mlp = mlp
        self.residual_multiplier = residual_multiplier

    def forward(self, positions, x, residual, state, meta, cos_sin_cache):
        scale = self.residual_multiplier
        x, residual = self.input_layernorm(x, residual)
        x = getattr(self, self.mixer_name)(positions, x, state, meta, cos_sin_cache)
        x, residual = self.post_attention_layernorm(x * scale if scale != 1.0 else x, residual)
        x = self.mlp(x)
        return (x * scale if scale != 1.0 else x), residual


class SandwichDecoderLayer(nn.Module):
    """Norms before and after attention and before and after the MLP (Gemma 2 and 3, GLM-4):
    x + post_attn(attn(pre_attn(x))), then x + post_mlp(mlp(pre_mlp(x))), the residual sums fused
    into the pre-norms as in the Llama layer. `names`: the checkpoint's names of those four norms, in
    that order; `norm`: their class."""

    def __init__(
        self,
        config: ModelConfig,
        attention: Attention,
        mlp: nn.Module,
        norm: Callable[..., nn.Module],
        names: tuple[str, str, str, str],
        device,
        dtype,
    ) -> None:
        super().__init__()
        hidden, eps = config.architecture.hidden_size, config.rms_norm_eps
        self.norm_names = names
        for name in names:
            setattr(self, name, norm(hidden, eps, device, dtype))
        self.self_attn = attention
        self.mlp = mlp

    def forward(self, positions, x, residual, kv_cache, meta, cos_sin_cache):
        pre_attn, post_attn, pre_mlp, post_mlp = (getattr(self, name) for name in self.norm_names)
        x, residual = pre_attn(x, residual)
        x, _ = post_attn(self.self_attn(positions, x, kv_cache, meta, cos_sin_cache))
        x, residual = pre_mlp(x, residual)
        x, _ = post_mlp(self.mlp(x))
        return x, residual
