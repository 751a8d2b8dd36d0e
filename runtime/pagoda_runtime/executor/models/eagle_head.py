"""EAGLE draft heads: one decoder layer that drafts from the target's own hidden states.

Two published formats are read, as the EAGLE authors (SafeAILab/EAGLE) and vLLM save and load them:

- EAGLE-3 (`"method": "eagle3"`, config.json `LlamaForCausalLMEagle3`): the target's hidden states
  entering three of its layers (2, L // 2 and L - 3 of L, or the config's
  eagle_aux_hidden_state_layer_ids, at its top or in eagle_config) are concatenated and projected
  by `fc` to one hidden state; the layer (`midlayer.*`) attends over [input_layernorm(embedding),
  hidden_norm(hidden)] (twice the hidden size wide), its residual stream starting from the hidden
  state; its own final `norm` and `lm_head` give logits over a reduced draft vocabulary, and `d2t`
  maps draft id i to target id i + d2t[i]. The stream before the final norm is the hidden state the
  next draft position takes in place of the target's.
- EAGLE-1 (`"method": "eagle"`, config.json `LlamaForCausalLM` with one layer): `fc` (with its bias
  where the checkpoint has one) projects [embedding, the target's last hidden state after its final
  norm]; the layer (`layers.0.*`, without an input norm) outputs the next hidden state, and the
  target's LM head turns it into logits.

At position p the head takes token p + 1 and the target's hidden state at p, and predicts token
p + 2. The target's embedding is used where the checkpoint has no `embed_tokens.weight` (the
published EAGLE-3 heads leave it out) and for EAGLE-1 (whose saved one is a frozen copy of it).
The head runs in a ModelRunner of its own (its paged KV cache, one layer, its CUDA graphs);
engine/eagle_proposer.py sets `inputs` (the hidden state of each token) before each forward and
reads `outputs` after it (a replayed graph's are copied in and out of static buffers).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import nn

from pagoda_runtime.contract.config import ModelConfig
from pagoda_runtime.contract.eagle_sizing import (
    HEAD_ARCHITECTURES,
    HEAD_WEIGHT_FILES,
    EagleHeadShape,
    draft_vocab_size,
)
from pagoda_runtime.contract.speculative import SpeculativeConfigError
from pagoda_runtime.executor.kernels import AttentionOps, build_cos_sin_cache
from pagoda_runtime.executor.models import llama
from pagoda_runtime.executor.models.hf_config import ConfigError
from pagoda_runtime.executor.models.layers import Attention, DecoderLayer, GatedMLP, RMSNorm
from pagoda_runtime.executor.quantization import make_linear
from pagoda_runtime.executor.vocab_parallel import VocabParallel
from pagoda_runtime.parallel.tensor_parallel import SINGLE_PROCESS, TensorParallel


@dataclass(frozen=True)
class HeadSpec:
    method: str  # eagle or eagle3
    config: ModelConfig  # the head's shape: one layer, the target's vocabulary
    # The target layers whose input feeds the head, in the order fc takes them; the target's number
    # of layers stands for its final norm's output (EAGLE-1).
    target_layers: tuple[int, ...]
    draft_vocab_size: int
    fc_bias: bool  # EAGLE-1 heads are saved with one or without


@dataclass(frozen=True)
class HeadCheckpoint:
    spec: HeadSpec
    weights: dict[str, torch.Tensor]  # as stored, under the published names

    @property
    def shape(self) -> EagleHeadShape:
        """The head as sizing counts it (contract/eagle_sizing.py), the operator's fit check too."""
        spec = self.spec
        return EagleHeadShape.from_tensors(
            spec.method, spec.config.architecture, spec.draft_vocab_size, self.weights
        )


def read_head(folder: str, method: str, target: ModelConfig) -> HeadCheckpoint:
    """The head in `folder` (config.json and model.safetensors or pytorch_model.bin), checked against
    the target: SpeculativeConfigError, naming the field, where it cannot draft for it."""
    path = Path(folder)
    config_file = path / "config.json"
    weight_file = next((path / name for name in HEAD_WEIGHT_FILES if (path / name).is_file()), None)
    if not config_file.is_file() or weight_file is None:
        raise SpeculativeConfigError(
            f"speculative_config.model {folder!r} is not an EAGLE head folder (config.json and "
            f"{' or '.join(HEAD_WEIGHT_FILES)}); download the head and give its folder"
        )
    raw = json.loads(config_file.read_text())
    expected = HEAD_ARCHITECTURES[method]
    named = (raw.get("architectures") or [None])[0]
    if named != expected:
        raise SpeculativeConfigError(
            f"speculative_config.model {folder!r} is a {named!r} head; the {method} method loads "
            f"{expected} heads (method eagle3: LlamaForCausalLMEagle3, eagle: LlamaForCausalLM)"
        )
    if raw.get("num_hidden_layers") != 1:
        raise SpeculativeConfigError(
            f"speculative_config.model {folder!r} has num_hidden_layers {raw.get('num_hidden_layers')}; "
            "an EAGLE head has one decoder layer"
        )
    try:
        config = llama.config_from_hf(raw, "LlamaForCausalLM")
    except ConfigError as exc:
        raise SpeculativeConfigError(f"speculative_config.model {folder!r}: config.json {exc}") from exc
    arch, target_arch = config.architecture, target.architecture
    for name, got in (
        ("hidden_size", arch.hidden_size),
        ("target_hidden_size", raw.get("target_hidden_size")),
    ):
        if got is not None and got != target_arch.hidden_size:
            raise SpeculativeConfigError(
                f"speculative_config.model {folder!r} has {name} {got}, but the target's hidden size is "
                f"{target_arch.hidden_size}; use a head trained for this target"
            )
    if arch.vocab_size != target_arch.vocab_size:
        raise SpeculativeConfigError(
            f"speculative_config.model {folder!r} has vocab_size {arch.vocab_size}, but the target's is "
            f"{target_arch.vocab_size}; use a head trained for this target"
        )
    layers = _target_layers(raw, method, target_arch.num_hidden_layers, folder)
    weights = _read_weights(weight_file)
    shape = EagleHeadShape.from_tensors(method, arch, draft_vocab_size(method, raw, arch.vocab_size), weights)
    spec = HeadSpec(method, replace(config, model_type=method), layers, shape.draft_vocab_size, shape.fc_bias)
    return HeadCheckpoint(spec, weights)


def _target_layers(raw: dict, method: str, num_layers: int, folder: str) -> tuple[int, ...]:
    if method == "eagle":
        return (num_layers,)
    field = "eagle_aux_hidden_state_layer_ids"
    ids = raw.get(field) or (raw.get("eagle_config") or {}).get(field)
    layers = tuple(ids) if ids else (2, num_layers // 2, num_layers - 3)
    if len(layers) != 3 or not all(isinstance(i, int) and 0 <= i < num_layers for i in layers):
        raise SpeculativeConfigError(
            f"speculative_config.model {folder!r} reads the target's layers {list(layers)}, but the target "
            f"has {num_layers}; an EAGLE-3 head needs three of them "
            "(eagle_aux_hidden_state_layer_ids)"
        )
    return layers


def _read_weights(file: Path) -> dict[str, torch.Tensor]:
    if file.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(file)
    return torch.load(file, map_location="cpu", weights_only=True)


class EagleHead(nn.Module):
    def __init__(
        self,
        spec: HeadSpec,
        target: nn.Module,
        config: ModelConfig,
        ops: AttentionOps,
        max_position: int,
        quantization: str = "none",
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        tp: TensorParallel = SINGLE_PROCESS,
    ) -> None:
        """`target`: the target CausalLM, whose embedding (where the head has none) and, for
        EAGLE-1, LM head the head uses; held as functions, so that its weights are not the head's.
        The other arguments are build_model's; the head's projections stay unquantized whatever
        `quantization` says (they are a few percent of the target's)."""
        super().__init__()
        self.config = config
        self.eagle3 = spec.method == "eagle3"
        self.target_layers = spec.target_layers
        arch = config.architecture
        hidden = arch.hidden_size
        device = torch.device(device)
        self._target_embed: Callable[[torch.Tensor], torch.Tensor] = target.embed
        self._target_logits: Callable[..., torch.Tensor] = target.compute_logits
        # Not a submodule: the target's weights are not the head's.
        object.__setattr__(self, "_target_embedding", target.embed_tokens)
        fc_in = hidden * len(spec.target_layers) if self.eagle3 else 2 * hidden
        self.fc = make_linear(fc_in, hidden, spec.fc_bias, "none", device, dtype)
        attention = Attention(config, 0, ops, "none", device, dtype, tp)
        if self.eagle3:
            # Queries, keys and values from [norm(embedding), norm(hidden)].
            attention.qkv_proj = make_linear(
                2 * hidden,
                attention.q_size + 2 * attention.kv_size,
                arch.attention_bias,
                "none",
                device,
                dtype,
            )
        layer = DecoderLayer(config, attention, GatedMLP(config, "none", device, dtype, tp), device, dtype)
        if self.eagle3:
            layer.hidden_norm = RMSNorm(hidden, config.rms_norm_eps, device, dtype)
        else:
            layer.input_layernorm = None  # EAGLE-1's layer takes fc's output as it is
        self.layers = nn.ModuleList([layer])
        self.norm = RMSNorm(hidden, config.rms_norm_eps, device, dtype) if self.eagle3 else None
        self.lm_head = (
            VocabParallel(spec.draft_vocab_size, hidden, tp, device, dtype) if self.eagle3 else None
        )
        # Draft id -> target id (d2t's offsets added); the identity for EAGLE-1.
        self.register_buffer(
            "draft_to_target", torch.arange(spec.draft_vocab_size, device=device), persistent=False
        )
        self.own_embedding: VocabParallel | None = None  # where the checkpoint has embed_tokens
        self._new_embedding = lambda: VocabParallel(arch.vocab_size, hidden, tp, device, dtype)
        self.requires_grad_(False)
        self.register_buffer(
            "cos_sin_cache", build_cos_sin_cache(config, max_position, device, dtype), persistent=False
        )
        self.inputs: torch.Tensor | None = None  # [tokens, hidden]: each token's hidden state in
        self.outputs: torch.Tensor | None = None  # [tokens, hidden]: the one the next position takes

    @property
    def embed_tokens(self) -> VocabParallel:
        return self._target_embedding if self.own_embedding is None else self.own_embedding

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """The target's hidden states [tokens, len(target_layers) * hidden] as the head takes them."""
        return self.fc(features) if self.eagle3 else features

    def forward(self, input_ids, positions, kv_caches, meta) -> torch.Tensor:
        """The hidden state the logits are computed from, for each token; `outputs` the one the
        next position takes."""
        hidden = self.inputs
        embedded = (
            self._target_embed(input_ids) if self.own_embedding is None else self.own_embedding(input_ids)
        )
        layer = self.layers[0]
        if self.eagle3:
            x = torch.cat([layer.input_layernorm(embedded)[0], layer.hidden_norm(hidden)[0]], dim=-1)
            residual = hidden
        else:
            x = residual = self.fc(torch.cat([embedded, hidden.to(embedded.dtype)], dim=-1))
        x = layer.self_attn(positions, x, kv_caches[0], meta, self.cos_sin_cache)
        x, residual = layer.post_attention_layernorm(x, residual)
        x = layer.mlp(x)
        if self.eagle3:
            normed, self.outputs = self.norm(x, residual)
            return normed
        self.outputs = x + residual
        return self.outputs

    def compute_logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Float32 logits over the target's vocabulary; -inf on the tokens outside the draft's. Into
        `out` when given (a CUDA graph's output buffer)."""
        if not self.eagle3:
            return self._target_logits(hidden, out)
        draft = self.lm_head.logits(hidden)
        if out is None:
            out = draft.new_empty(draft.shape[0], self.config.architecture.vocab_size)
        out.fill_(float("-inf"))
        out[:, self.draft_to_target] = draft
        return out

    def pack_for_cpu(self, vocab_dtype: torch.dtype) -> None:
        if self.lm_head is not None:
            self.lm_head.hold_in(vocab_dtype, lookups=False, logits=True)
        if self.own_embedding is not None:
            self.own_embedding.hold_in(vocab_dtype, lookups=True, logits=False)

    def pack_for_gpu(self) -> None:
        """The head's projections are unquantized: nothing to re-lay."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Fill the head from the published names (EAGLE-3's midlayer.* is layer 0); every tensor it
        needs must come, d2t included where the draft vocabulary is reduced."""
        arch = self.config.architecture
        attention = self.layers[0].self_attn
        q, kv, channels = attention.q_size, attention.kv_size, arch.intermediate_size
        fused = {
            "q_proj": ("qkv_proj", 0),
            "k_proj": ("qkv_proj", q),
            "v_proj": ("qkv_proj", q + kv),
            "gate_proj": ("gate_up_proj", 0),
            "up_proj": ("gate_up_proj", channels),
        }
        params = dict(self.named_parameters())
        unfused = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
        needed = set()
        for name in params:
            path, _, leaf = name.rpartition(".")
            owner, _, module = path.rpartition(".")
            parts = unfused.get(module)
            needed |= {f"{owner}.{part}.{leaf}" for part in parts} if parts else {name}
        if self.lm_head is not None and self.lm_head.vocab_size != arch.vocab_size:
            needed.add("d2t")
        loaded = set()
        for stored, tensor in weights:
            name = stored.removeprefix("model.").replace("midlayer.", "layers.0.")
            if name == "t2d":
                continue
            loaded.add(name)
            path, _, leaf = name.rpartition(".")
            owner, _, proj = path.rpartition(".")
            if name == "d2t":
                self.draft_to_target.add_(tensor.to(self.draft_to_target.device, torch.int64))
            elif name == "embed_tokens.weight" and not self.eagle3:
                continue  # EAGLE-1 trained on a frozen copy of the target's: share the target's
            elif name == "embed_tokens.weight":
                self.own_embedding = self._new_embedding()
                self.own_embedding.load(tensor)
            elif name == "lm_head.weight" and self.lm_head is not None:
                self.lm_head.load(tensor)
            elif proj in fused:
                target, offset = fused[proj]
                module = self.get_submodule(f"{owner}.{target}")
                (module.load if leaf == "weight" else module.load_bias)(tensor, offset)
            elif name in params and params[name].shape == tensor.shape:
                params[name].copy_(tensor)
            else:
                raise ValueError(
                    f"the EAGLE head's {stored!r} (shape {list(tensor.shape)}) has no place in a "
                    f"{'EAGLE-3' if self.eagle3 else 'EAGLE-1'} head of this config"
                )
        missing = sorted(needed - loaded)
        if missing:
            raise ValueError(
                f"the EAGLE head's checkpoint lacks {missing[0]!r} and {len(missing) - 1} others"
            )
