"""Tiny EAGLE heads in the published layout, for a tiny target of tests/runtime/tiny_models.py.

`Eagle3Head` is the EAGLE-3 head in plain torch (differentiable: a test trains it on the target's
own hidden states); `write_eagle3_head` saves one as the EAGLE authors do (config.json naming
LlamaForCausalLMEagle3, model.safetensors with fc, midlayer.*, norm, lm_head, d2t and t2d, no
embedding: the target's is used). `write_eagle1_head` saves a random EAGLE-1 head
(LlamaForCausalLM with one layer, fc with its bias, layers.0.* without an input norm, an
embed_tokens the target's replaces) as pytorch_model.bin, as the EAGLE-1 releases are.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, EPS, THETA = 64, 128, 4, 2, 1e-6, 10000.0
HEAD_DIM = HIDDEN // HEADS


def head_config(target: Path, architecture: str, **extra) -> dict:
    vocab = json.loads((target / "config.json").read_text())["vocab_size"]
    return {
        "architectures": [architecture],
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": EPS,
        "rope_theta": THETA,
        "max_position_embeddings": 512,
        "vocab_size": vocab,
        "tie_word_embeddings": False,
        **extra,
    }


def _rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)


def _rotate(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Llama's RoPE over [..., tokens, heads, head_dim]."""
    inv_freq = 1.0 / THETA ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM)
    angles = positions[:, None].float() * inv_freq[None, :]
    cos, sin = torch.cat([angles.cos()] * 2, -1)[:, None, :], torch.cat([angles.sin()] * 2, -1)[:, None, :]
    half = HEAD_DIM // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Eagle3Head(nn.Module):
    """EAGLE-3's head: fc over three target hidden states, one layer over [norm(embedding),
    norm(hidden)], its own final norm and LM head over the draft vocabulary."""

    def __init__(self, draft_vocab: int, target_layers: int = 3, seed: int = 0) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)

        def linear(rows, cols):
            return nn.Parameter(torch.randn(rows, cols, generator=generator) * cols**-0.5)

        def norm():
            return nn.Parameter(1.0 + 0.1 * torch.randn(HIDDEN, generator=generator))

        # ParameterDict keys take no dots: "::" stands for them.
        named = {
            "fc.weight": linear(HIDDEN, target_layers * HIDDEN),
            "midlayer.self_attn.q_proj.weight": linear(HEADS * HEAD_DIM, 2 * HIDDEN),
            "midlayer.self_attn.k_proj.weight": linear(KV_HEADS * HEAD_DIM, 2 * HIDDEN),
            "midlayer.self_attn.v_proj.weight": linear(KV_HEADS * HEAD_DIM, 2 * HIDDEN),
            "midlayer.self_attn.o_proj.weight": linear(HIDDEN, HEADS * HEAD_DIM),
            "midlayer.mlp.gate_proj.weight": linear(INTERMEDIATE, HIDDEN),
            "midlayer.mlp.up_proj.weight": linear(INTERMEDIATE, HIDDEN),
            "midlayer.mlp.down_proj.weight": linear(HIDDEN, INTERMEDIATE),
            "midlayer.input_layernorm.weight": norm(),
            "midlayer.hidden_norm.weight": norm(),
            "midlayer.post_attention_layernorm.weight": norm(),
            "norm.weight": norm(),
            "lm_head.weight": linear(draft_vocab, HIDDEN),
        }
        self.weights = nn.ParameterDict({k.replace(".", "::"): v for k, v in named.items()})

    def forward(self, embeds: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits [batch, tokens, draft_vocab]: position p takes the embedding
        [batch, tokens, hidden] of token p + 1 and the target's hidden states at p."""
        w = {k.removeprefix("midlayer::").removesuffix("::weight"): v for k, v in self.weights.items()}
        w = {k.replace("::", "."): v for k, v in w.items()}
        hidden = features @ w["fc"].T
        x = torch.cat([_rms(embeds, w["input_layernorm"]), _rms(hidden, w["hidden_norm"])], -1)
        return _rms(_layer(x, hidden, w), w["norm"]) @ w["lm_head"].T

    def published(self) -> dict[str, torch.Tensor]:
        return {k.replace("::", "."): v.detach().clone().contiguous() for k, v in self.weights.items()}


def write_eagle3_head(
    folder: Path, target: Path, draft_ids: list[int], head: Eagle3Head | None = None, **extra
) -> Path:
    """`draft_ids`: the target ids of the draft vocabulary, in draft-id order."""
    folder.mkdir(parents=True, exist_ok=True)
    config = head_config(target, "LlamaForCausalLMEagle3", draft_vocab_size=len(draft_ids), **extra)
    (folder / "config.json").write_text(json.dumps(config))
    tensors = (head or Eagle3Head(len(draft_ids))).published()
    ids = torch.tensor(draft_ids, dtype=torch.int64)
    tensors["d2t"] = ids - torch.arange(len(draft_ids))
    tensors["t2d"] = torch.zeros(config["vocab_size"], dtype=torch.bool).index_fill_(0, ids, True)
    save_file(tensors, folder / "model.safetensors")
    return folder


def _layer(x: torch.Tensor, residual: torch.Tensor, w: dict[str, torch.Tensor]) -> torch.Tensor:
    """The head's one decoder layer over x [batch, tokens, width], its residual stream starting
    from `residual` (EAGLE-3: the projected hidden state; EAGLE-1: x itself)."""
    batch, tokens = x.shape[:2]
    positions = torch.arange(tokens)
    q = _rotate((x @ w["self_attn.q_proj"].T).view(batch, tokens, HEADS, HEAD_DIM), positions)
    k = _rotate((x @ w["self_attn.k_proj"].T).view(batch, tokens, KV_HEADS, HEAD_DIM), positions)
    v = (x @ w["self_attn.v_proj"].T).view(batch, tokens, KV_HEADS, HEAD_DIM)
    k, v = (t.repeat_interleave(HEADS // KV_HEADS, dim=2) for t in (k, v))
    attended = nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
    )
    x = residual + attended.transpose(1, 2).reshape(batch, tokens, HIDDEN) @ w["self_attn.o_proj"].T
    y = _rms(x, w["post_attention_layernorm"])
    y = nn.functional.silu(y @ w["mlp.gate_proj"].T) * (y @ w["mlp.up_proj"].T)
    return x + y @ w["mlp.down_proj"].T


class Eagle1Head(nn.Module):
    """EAGLE-1's head: fc (with a bias) over [embedding, the target's last hidden state], one layer
    without an input norm; the target's LM head (`lm_head`, frozen) makes its output logits."""

    def __init__(self, lm_head: torch.Tensor, seed: int = 0) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)

        def linear(rows, cols):
            return nn.Parameter(torch.randn(rows, cols, generator=generator) * cols**-0.5)

        named = {
            "fc.weight": linear(HIDDEN, 2 * HIDDEN),
            "fc.bias": nn.Parameter(0.1 * torch.randn(HIDDEN, generator=generator)),
            "layers.0.self_attn.q_proj.weight": linear(HEADS * HEAD_DIM, HIDDEN),
            "layers.0.self_attn.k_proj.weight": linear(KV_HEADS * HEAD_DIM, HIDDEN),
            "layers.0.self_attn.v_proj.weight": linear(KV_HEADS * HEAD_DIM, HIDDEN),
            "layers.0.self_attn.o_proj.weight": linear(HIDDEN, HEADS * HEAD_DIM),
            "layers.0.mlp.gate_proj.weight": linear(INTERMEDIATE, HIDDEN),
            "layers.0.mlp.up_proj.weight": linear(INTERMEDIATE, HIDDEN),
            "layers.0.mlp.down_proj.weight": linear(HIDDEN, INTERMEDIATE),
            "layers.0.post_attention_layernorm.weight": nn.Parameter(
                1.0 + 0.1 * torch.randn(HIDDEN, generator=generator)
            ),
        }
        self.weights = nn.ParameterDict({k.replace(".", "::"): v for k, v in named.items()})
        self.register_buffer("lm_head", lm_head.detach().clone())

    def forward(self, embeds: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """Logits [batch, tokens, vocab], positions as Eagle3Head's; `features` the target's final
        norm's output."""
        w = {k.removeprefix("layers::0::").removesuffix("::weight"): v for k, v in self.weights.items()}
        w = {k.replace("::", "."): v for k, v in w.items()}
        x = torch.cat([embeds, features], -1) @ w["fc"].T + w["fc.bias"]
        return _layer(x, x, w) @ self.lm_head.T

    def published(self) -> dict[str, torch.Tensor]:
        return {k.replace("::", "."): v.detach().clone().contiguous() for k, v in self.weights.items()}


def write_eagle1_head(folder: Path, target: Path, head: Eagle1Head | None = None) -> Path:
    """A random head (all ones for the LM head it never saves) unless `head` is given."""
    folder.mkdir(parents=True, exist_ok=True)
    config = head_config(target, "LlamaForCausalLM")
    (folder / "config.json").write_text(json.dumps(config))
    tensors = (head or Eagle1Head(torch.ones(1, HIDDEN))).published()
    # EAGLE-1 releases carry a copy of the target's embedding; noise here, which the loader must
    # leave for the target's own (a trained head's drafts would be rejected otherwise).
    tensors["embed_tokens.weight"] = torch.randn(config["vocab_size"], HIDDEN)
    torch.save(tensors, folder / "pytorch_model.bin")
    return folder
