"""What every family's model shares: the embedding, the decoder layers, the final norm, the LM head
(or the tied embedding), and filling them from a checkpoint's Hugging Face-named tensors.

A family subclasses CausalLM and builds its layers (`make_layer`); where it differs from the Llama
layout elsewhere (an embedding scale, fused checkpoint tensors, a second rotary table) it overrides
the one method that says so. What the config alone decides is done here for every family: final
logits divided by logits_scaling and soft-capped where final_logit_softcapping is set, each head's q
and k rows reordered for a partial or interleaved rotary embedding
(kernels/rope_cache.rotary_row_order), layers listed in no_rope_layers given a table that rotates
nothing, and sliding-window layers their own table where local_rope_theta sets one. The embedding
and the LM head are vocabulary-parallel (vocab_parallel.py); the rotary table is whole on every
rank.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch import nn

from pagoda_runtime.contract.config import ModelConfig
from pagoda_runtime.executor.attention_metadata import AttentionMetadata
from pagoda_runtime.executor.kernels import AttentionOps, build_cos_sin_cache
from pagoda_runtime.executor.kernels.rope_cache import rotary_row_order
from pagoda_runtime.executor.models.layers import RMSNorm
from pagoda_runtime.executor.quantization import PackedWeight, QuantizedLinear
from pagoda_runtime.executor.vocab_parallel import VocabParallel
from pagoda_runtime.parallel.tensor_parallel import SINGLE_PROCESS, TensorParallel

Weight = torch.Tensor | PackedWeight


class CausalLM(nn.Module):
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
            self.make_layer(i, ops, quantization, device, dtype) for i in range(arch.num_hidden_layers)
        )
        self.norm = self.make_norm(arch.hidden_size, device, dtype)
        self.lm_head = None
        if not arch.tie_word_embeddings:
            self.lm_head = VocabParallel(arch.vocab_size, arch.hidden_size, tp, device, dtype)
        self.requires_grad_(False)
        self.register_rotary_tables(max_position, device, dtype)

    def register_rotary_tables(self, max_position: int, device: torch.device, dtype: torch.dtype) -> None:
        """The cos/sin tables rotary_table hands the layers, and the q/k row order loading follows."""
        config = self.config
        self.register_buffer(
            "cos_sin_cache", build_cos_sin_cache(config, max_position, device, dtype), persistent=False
        )
        # The table of a layer without rotary embeddings: cos 1 and sin 0 rotate nothing, so such a
        # layer runs the same kernels as the others.
        unrotated = None
        if config.no_rope_layers:
            unrotated = torch.zeros_like(self.cos_sin_cache)
            unrotated[:, : unrotated.shape[1] // 2] = 1.0
        self.register_buffer("unrotated_table", unrotated, persistent=False)
        # The sliding-window layers' own table where their RoPE differs (Gemma 3, OLMo 3).
        local = None
        if config.local_rope_theta is not None:
            local = build_cos_sin_cache(config, max_position, device, dtype, local=True)
        self.register_buffer("local_cos_sin_cache", local, persistent=False)
        self._rotary_rows = rotary_row_order(config)

    # ---- what a family builds ------------------------------------------------------------------

    def make_layer(
        self, layer: int, ops: AttentionOps, quantization: str, device: torch.device, dtype: torch.dtype
    ) -> nn.Module:
        """Decoder layer `layer`: forward(positions, x, residual, kv_cache, meta, cos_sin_cache) ->
        (x, residual)."""
        raise NotImplementedError

    def make_norm(self, size: int, device: torch.device, dtype: torch.dtype) -> nn.Module:
        return RMSNorm(size, self.config.rms_norm_eps, device, dtype)

    def rotary_table(self, layer: int) -> torch.Tensor:
        """The cos/sin table layer `layer` rotates with."""
        if layer in self.config.no_rope_layers:
            return self.unrotated_table
        if self.local_cos_sin_cache is not None and self.config.architecture.layer_window(layer):
            return self.local_cos_sin_cache
        return self.cos_sin_cache

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def checkpoint_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor the checkpoint must hold, by Hugging Face name, with its shape."""
        raise NotImplementedError

    def checkpoint_parts(self, name: str, tensor: Weight) -> Iterator[tuple[str, Weight]]:
        """The tensors `load_weights` places for one checkpoint tensor, under the names of the
        unfused Llama layout (a family whose checkpoint fuses them splits them here)."""
        yield name, tensor

    # ---- running -------------------------------------------------------------------------------

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        x = self.embed(input_ids)
        residual = None
        for i, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches, strict=True)):
            x, residual = layer(positions, x, residual, kv_cache, meta, self.rotary_table(i))
        x, _ = self.norm(x, residual)
        return x

    def compute_logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Float32 logits [tokens, vocab] on every rank (a collective under tensor parallelism),
        written into `out` when given (a CUDA graph's output buffer)."""
        logits = (self.embed_tokens if self.lm_head is None else self.lm_head).logits(hidden, out)
        if self.config.logits_scaling != 1.0:
            logits.div_(self.config.logits_scaling)
        cap = self.config.final_logit_softcapping
        return logits if cap is None else logits.div_(cap).tanh_().mul_(cap)

    def _packable(self) -> list[QuantizedLinear]:
        """The quantized projections a matmul kernel takes; experts stay in the grouped kernel's
        layout (a module with `grouped_experts`)."""
        grouped = {
            id(m)
            for owner in self.modules()
            if getattr(owner, "grouped_experts", False)
            for m in owner.modules()
        }
        return [m for m in self.modules() if isinstance(m, QuantizedLinear) and id(m) not in grouped]

    def pack_for_cpu(self, vocab_dtype: torch.dtype) -> None:
        """Hand the quantized projections to torch's CPU kernels and hold the embedding and the LM
        head in vocab_dtype (quantization_selection.cpu_packed_kernels says when)."""
        for module in self._packable():
            module.pack_for_cpu()
        tied = self.lm_head is None
        self.embed_tokens.hold_in(vocab_dtype, lookups=True, logits=tied)
        if not tied:
            self.lm_head.hold_in(vocab_dtype, lookups=False, logits=True)

    def pack_for_gpu(self) -> None:
        """Re-lay the quantized projections for the CUDA kernels (QuantizedLinear.pack_for_gpu)."""
        for module in self._packable():
            module.pack_for_gpu()

    # ---- loading -------------------------------------------------------------------------------

    def _fused_parts(
        self, mlp_channels: int | None = None, fused_mlp: bool = True
    ) -> dict[str, tuple[str, int, slice]]:
        """Hugging Face projection -> (fused layer, its row offset there, the checkpoint rows this
        rank takes). A rank's key/value rows are those of the KV heads its query heads read; its
        gate/up rows those of an MLP mlp_channels wide on each rank (the dense MLP's by default),
        up's its own layer's in an unfused (ungated) MLP."""
        arch, tp = self.config.architecture, self.tp
        attn = next(layer.self_attn for layer in self.layers if hasattr(layer, "self_attn"))
        q, kv, d = attn.q_size, attn.kv_size, arch.head_dim
        first_kv_head = tp.rank * arch.num_key_value_heads // tp.size
        kv_rows = slice(first_kv_head * d, first_kv_head * d + kv)
        parts = {
            "q_proj": ("qkv_proj", 0, slice(tp.rank * q, (tp.rank + 1) * q)),
            "k_proj": ("qkv_proj", q, kv_rows),
            "v_proj": ("qkv_proj", q + kv, kv_rows),
            # The output gate's rows, where a family's checkpoint_parts takes them out of q_proj's.
            "q_gate": ("qkv_proj", q + 2 * kv, slice(tp.rank * q, (tp.rank + 1) * q)),
        }
        channels = mlp_channels or arch.intermediate_size // tp.size
        rows = slice(tp.rank * channels, (tp.rank + 1) * channels)
        parts["gate_proj"] = ("gate_up_proj", 0, rows)
        parts["up_proj"] = ("gate_up_proj", channels, rows) if fused_mlp else ("up_proj", 0, rows)
        return parts

    def load_weights(self, weights: Iterable[tuple[str, Weight]]) -> None:
        """Fill the model from Hugging Face-named tensors; every tensor the config implies must come.
        Each tensor arrives whole and this rank keeps its part of it."""
        fused = self._fused_parts()
        params = dict(self.named_parameters())
        loaded = set()
        for hf_name, stored in weights:
            if hf_name == "lm_head.weight" and self.lm_head is None:
                continue  # a tied checkpoint may still carry the copy
            loaded.add(hf_name)
            for part_name, tensor in self.checkpoint_parts(hf_name, stored):
                # o_proj's bias is the attention's own, added once after the sum over ranks.
                part_name = part_name.replace("self_attn.o_proj.bias", "self_attn.o_bias")
                self._load_tensor(hf_name, part_name.removeprefix("model."), tensor, fused, params)
        missing = sorted(set(self.checkpoint_shapes()) - loaded)
        if missing:
            raise ValueError(
                f"the checkpoint lacks {missing[0]!r} and {len(missing) - 1} other tensors the model needs"
            )

    def _load_tensor(self, hf_name: str, name: str, tensor: Weight, fused: dict, params: dict) -> None:
        block, experts, expert_tensor = name.partition(".experts.")
        if experts:
            expert, _, rest = expert_tensor.partition(".")
            self.get_submodule(block).load_expert(int(expert), rest, tensor)
            return
        module_path, _, leaf = name.rpartition(".")
        owner, _, proj = module_path.rpartition(".")
        # q and k norms weigh each dimension of a head, so their weights follow its rows' order.
        if self._rotary_rows is not None and proj in ("q_proj", "k_proj", "q_norm", "k_norm"):
            tensor = self._rotary_order(tensor)
        if proj in ("gate_proj", "up_proj") and owner.startswith("layers."):
            # An MLP as wide as its own channels say (a shared expert is narrower than the dense MLP).
            mlp = self.get_submodule(owner)
            fused = self._fused_parts(getattr(mlp, "channels", None), not getattr(mlp, "unfused", False))
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
                f"the checkpoint holds {hf_name!r}, which a {self.config.model_type} model has no place for"
            )

    def _rotary_order(self, tensor: Weight) -> Weight:
        """q or k rows (or biases), head by head, in the order the partial rotary table rotates."""
        head_dim = self.config.architecture.head_dim
        heads = (
            tensor.shape[0] // head_dim
            if isinstance(tensor, torch.Tensor)
            else tensor.out_features // head_dim
        )
        order = (torch.arange(heads)[:, None] * head_dim + self._rotary_rows[None, :]).flatten()
        return tensor.rows(order) if isinstance(tensor, PackedWeight) else tensor[order]

    def _projection(self, path: str) -> nn.Module | None:
        try:
            module = self.get_submodule(path)
        except AttributeError:
            return None
        return module if hasattr(module, "load") else None
