"""The Llama family (Llama 1/2/3, Mistral, Qwen2, SmolLM) as plain PyTorch modules, gpt-fast style.

q, k and v share one fused projection, as do gate and up; `load_weights` fills the fused weights
from Hugging Face's separate tensors. Attention goes through the device's kernels: rotate q and k,
write this step's keys and values into the layer's paged cache, attend over the cache.

Split over tensor-parallel ranks (Megatron-style), each rank holds its query heads and their
key/value heads, its part of the MLP channels and of the vocabulary: qkv_proj and gate_up_proj are
column-parallel (each fused part cut by rank, so a rank's q, k and v heads stay together), o_proj
and down_proj row-parallel with a sum over the ranks after them, the embedding and the LM head
vocabulary-parallel (vocab_parallel.py). Norms and the rotary table are whole on every rank.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from pagoda_runtime.contract.config import ModelConfig
from pagoda_runtime.contract.sizing import kv_heads_per_rank
from pagoda_runtime.contract.weight_layout import expected_weight_shapes
from pagoda_runtime.executor.attention_metadata import AttentionMetadata
from pagoda_runtime.executor.kernels import AttentionOps, build_cos_sin_cache, rms_norm, silu_and_mul
from pagoda_runtime.executor.quantization import PackedWeight, make_linear
from pagoda_runtime.executor.vocab_parallel import VocabParallel
from pagoda_runtime.parallel.tensor_parallel import SINGLE_PROCESS, TensorParallel


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size, device=device, dtype=dtype), requires_grad=False)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return rms_norm(x, self.weight, self.eps, residual)


class Attention(nn.Module):
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
        self.ops = ops
        self.tp = tp
        self.num_heads = tp.shard(arch.num_attention_heads, "attention heads")
        self.num_kv_heads = kv_heads_per_rank(arch.num_key_value_heads, tp.size)
        self.head_dim = arch.head_dim
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.scale = self.head_dim**-0.5
        # An fp8 KV cache's scales for this layer, float32 [2, Hkv] (executor/kv_scales.py); not a
        # buffer: the checkpoint does not hold them.
        self.kv_scales: torch.Tensor | None = None
        self.qkv_proj = make_linear(
            arch.hidden_size,
            self.q_size + 2 * self.kv_size,
            arch.attention_bias,
            quantization,
            device,
            dtype,
        )
        self.o_proj = make_linear(
            self.q_size,
            arch.hidden_size,
            False,  # a row-parallel bias would be added once per rank; no model of this family has one
            quantization,
            device,
            dtype,
            input_part=tp.part(arch.q_size, "attention heads") if tp.size > 1 else None,
        )

    def forward(
        self,
        positions: torch.Tensor,
        x: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        cos_sin_cache: torch.Tensor,
    ) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(-1, self.num_heads, self.head_dim)
        k = k.reshape(-1, self.num_kv_heads, self.head_dim)
        v = v.reshape(-1, self.num_kv_heads, self.head_dim)
        q = self.ops.rotary_write_kv(
            positions, q, k, v, cos_sin_cache, kv_cache, meta.slot_mapping, meta.derived, self.kv_scales
        )
        out = self.ops.attention(q, kv_cache, meta, self.scale, self.kv_scales)
        return self.tp.all_reduce(self.o_proj(out.reshape(-1, self.q_size)))


class MLP(nn.Module):
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
        channels = tp.shard(arch.intermediate_size, "MLP channels")
        self.gate_up_proj = make_linear(arch.hidden_size, 2 * channels, False, quantization, device, dtype)
        self.down_proj = make_linear(
            channels,
            arch.hidden_size,
            False,
            quantization,
            device,
            dtype,
            input_part=tp.part(arch.intermediate_size, "MLP channels") if tp.size > 1 else None,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(self.down_proj(silu_and_mul(self.gate_up_proj(x))))


class DecoderLayer(nn.Module):
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
        hidden = config.architecture.hidden_size
        self.input_layernorm = RMSNorm(hidden, config.rms_norm_eps, device, dtype)
        self.self_attn = Attention(config, ops, quantization, device, dtype, tp)
        self.post_attention_layernorm = RMSNorm(hidden, config.rms_norm_eps, device, dtype)
        self.mlp = MLP(config, quantization, device, dtype, tp)

    def forward(self, positions, x, residual, kv_cache, meta, cos_sin_cache):
        x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(positions, x, kv_cache, meta, cos_sin_cache)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class LlamaForCausalLM(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        ops: AttentionOps,
        max_position: int,
        quantization: str = "none",
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        tp: TensorParallel = SINGLE_PROCESS,
    ) -> None:
        super().__init__()
        self.config = config
        self.tp = tp
        arch = config.architecture
        device = torch.device(device)
        # Every weight comes from the checkpoint: none is initialized here (make_linear and
        # VocabParallel allocate them empty), since a random init of a few billion parameters
        # would cost a CPU tens of seconds of start-up for nothing.
        self.embed_tokens = VocabParallel(arch.vocab_size, arch.hidden_size, tp, device, dtype)
        self.layers = nn.ModuleList(
            DecoderLayer(config, ops, quantization, device, dtype, tp) for _ in range(arch.num_hidden_layers)
        )
        self.norm = RMSNorm(arch.hidden_size, config.rms_norm_eps, device, dtype)
        self.lm_head = None
        if not arch.tie_word_embeddings:
            self.lm_head = VocabParallel(arch.vocab_size, arch.hidden_size, tp, device, dtype)
        self.requires_grad_(False)
        self.register_buffer(
            "cos_sin_cache", build_cos_sin_cache(config, max_position, device, dtype), persistent=False
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x, residual = layer(positions, x, residual, kv_cache, meta, self.cos_sin_cache)
        x, _ = self.norm(x, residual)
        return x

    def hold_vocabulary_in(self, dtype: torch.dtype) -> None:
        """On the CPU: the embedding and the LM head in 16 bits (VocabParallel.hold_in)."""
        tied = self.lm_head is None
        self.embed_tokens.hold_in(dtype, lookups=True, logits=tied)
        if not tied:
            self.lm_head.hold_in(dtype, lookups=False, logits=True)

    def compute_logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Float32 logits [tokens, vocab] on every rank (a collective under tensor parallelism),
        written into `out` when given (a CUDA graph's output buffer)."""
        return (self.embed_tokens if self.lm_head is None else self.lm_head).logits(hidden, out)

    def _fused_parts(self) -> dict[str, tuple[str, int, slice]]:
        """Hugging Face projection -> (fused layer, its row offset there, the checkpoint rows this
        rank takes). A rank's key/value rows are those of the KV heads its query heads read."""
        arch, tp, attn = self.config.architecture, self.tp, self.layers[0].self_attn
        q, kv, d = attn.q_size, attn.kv_size, arch.head_dim
        first_kv_head = tp.rank * arch.num_key_value_heads // tp.size
        kv_rows = slice(first_kv_head * d, first_kv_head * d + kv)
        channels = self.layers[0].mlp.down_proj.in_features
        return {
            "q_proj": ("qkv_proj", 0, slice(tp.rank * q, (tp.rank + 1) * q)),
            "k_proj": ("qkv_proj", q, kv_rows),
            "v_proj": ("qkv_proj", q + kv, kv_rows),
            "gate_proj": ("gate_up_proj", 0, slice(tp.rank * channels, (tp.rank + 1) * channels)),
            "up_proj": ("gate_up_proj", channels, slice(tp.rank * channels, (tp.rank + 1) * channels)),
        }

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor | PackedWeight]]) -> None:
        """Fill the model from Hugging Face-named tensors; every tensor the config implies must come.
        Each tensor arrives whole and this rank keeps its part of it."""
        fused = self._fused_parts()
        params = dict(self.named_parameters())
        loaded = set()
        for hf_name, tensor in weights:
            name = hf_name.removeprefix("model.")
            if name == "lm_head.weight" and self.lm_head is None:
                continue  # a tied checkpoint may still carry the copy
            module_path, _, leaf = name.rpartition(".")
            owner, _, proj = module_path.rpartition(".")
            target, offset, rows = fused.get(proj, (proj, 0, slice(None)))
            projection = self._projection(f"{owner}.{target}") if owner.startswith("layers.") else None
            if projection is not None:
                part = tensor.rows(rows) if isinstance(tensor, PackedWeight) else tensor[rows]
                (projection.load if leaf == "weight" else projection.load_bias)(part, offset)
            elif module_path in ("embed_tokens", "lm_head"):
                self.get_submodule(module_path).load(tensor)
            elif name in params:
                if params[name].shape != tensor.shape:
                    raise ValueError(
                        f"weight {hf_name!r} has shape {list(tensor.shape)}, "
                        f"but the model's config implies {list(params[name].shape)}"
                    )
                params[name].copy_(tensor)
            else:
                raise ValueError(
                    f"the checkpoint holds {hf_name!r}, which a {self.config.model_type} model has no "
                    "place for"
                )
            loaded.add(name if name == "lm_head.weight" else "model." + name)
        missing = sorted(set(expected_weight_shapes(self.config.architecture)) - loaded)
        if missing:
            raise ValueError(
                f"the checkpoint lacks {missing[0]!r} and {len(missing) - 1} other tensors the model needs"
            )

    def _projection(self, path: str) -> nn.Module | None:
        try:
            module = self.get_submodule(path)
        except AttributeError:
            return None
        return module if hasattr(module, "load") else None
