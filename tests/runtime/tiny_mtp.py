"""A multi-token-prediction layer for a tiny DeepSeek V3 or GLM-4.5 target of tests/runtime/tiny_models.py,
in the layout DeepSeek-V3's checkpoint stores one (model.layers.<L>.* after the L decoder layers:
enorm, hnorm, eh_proj, the decoder layer's own tensors, shared_head.norm and shared_head.head).

`ReferenceMtp` is the layer as DeepSeek's paper describes it, on transformers' own decoder layer of
the target's family (differentiable: a test trains it on the target's hidden states), independent
of the runtime's code; `write_mtp_layer` adds its tensors to the target's folder and sets
num_nextn_predict_layers.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM


class ReferenceMtp(nn.Module):
    """At position p: token p + 1's embedding (zero at position 0) and the target's final hidden
    state at p, each RMS-normed, projected by eh_proj; the family's decoder layer L (causal, RoPE at
    p); the layer's own norm and LM head give the logits of token p + 2."""

    def __init__(self, target: Path, seed: int = 0) -> None:
        super().__init__()
        config = AutoConfig.from_pretrained(target)
        self.index = config.num_hidden_layers
        config.num_hidden_layers += 1
        config._attn_implementation = "sdpa"  # causal without a mask
        torch.manual_seed(seed)
        longer = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        norm = type(longer.model.norm)
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.block = longer.model.layers[self.index]
        self.rotary = longer.model.rotary_emb
        self.enorm, self.hnorm, self.shared_norm = (norm(hidden, eps=eps) for _ in range(3))
        self.eh_proj = nn.Linear(2 * hidden, hidden, bias=False)
        self.head = nn.Linear(hidden, config.vocab_size, bias=False)
        with torch.no_grad():
            for name, parameter in self.named_parameters():
                if name.endswith("norm.weight"):
                    parameter.normal_(1.0, 0.2)
                elif name.endswith("gate.weight"):
                    parameter.normal_(0.0, 1.0)

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [batch, tokens, vocab]: position p takes the embedding [batch, tokens, hidden] of
        token p + 1 and the target's hidden state at p."""
        positions = torch.arange(embeds.shape[1])
        embeds = embeds.masked_fill((positions == 0)[None, :, None], 0.0)
        x = self.eh_proj(torch.cat([self.enorm(embeds), self.hnorm(hidden)], dim=-1))
        cos_sin = self.rotary(x, positions[None].expand(x.shape[0], -1))
        x = self.block(x, position_ids=positions[None], position_embeddings=cos_sin)
        return self.head(self.shared_norm(x))

    def published(self) -> dict[str, torch.Tensor]:
        prefix = f"model.layers.{self.index}."
        own = {
            "enorm.weight": self.enorm.weight,
            "hnorm.weight": self.hnorm.weight,
            "eh_proj.weight": self.eh_proj.weight,
            "shared_head.norm.weight": self.shared_norm.weight,
            "shared_head.head.weight": self.head.weight,
        }
        tensors = {f"{prefix}{name}": t for name, t in own.items()}
        for name, t in self.block.state_dict().items():
            tensors |= {f"{prefix}{stored}": part for stored, part in _as_stored(name, t)}
        return {name: t.detach().clone().contiguous() for name, t in tensors.items()}


def _as_stored(name: str, tensor: torch.Tensor):
    """transformers' fused experts ([E, 2I, H] gate and up, [E, H, I] down) as checkpoints store
    them, one expert's projections at a time."""
    if name == "mlp.experts.gate_up_proj":
        width = tensor.shape[1] // 2
        for e, fused in enumerate(tensor):
            yield f"mlp.experts.{e}.gate_proj.weight", fused[:width]
            yield f"mlp.experts.{e}.up_proj.weight", fused[width:]
    elif name == "mlp.experts.down_proj":
        for e, down in enumerate(tensor):
            yield f"mlp.experts.{e}.down_proj.weight", down
    else:
        yield name, tensor


def target_states(target: Path, sequences: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's final hidden states (after its norm) and token embeddings along `sequences`
    (token id lists of one length), as transformers computes them."""
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    ids = torch.tensor(sequences)
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
    return out.hidden_states[-1], model.get_input_embeddings()(ids).detach()


def train_mtp(target: Path, sequences: list[list[int]], steps: int, seed: int = 0) -> ReferenceMtp:
    """A layer trained by `steps` Adam steps to predict, at each position p of `sequences` (the
    target's own greedy continuations), token p + 2 from token p + 1 and the target's state at p."""
    states, embeds = target_states(target, sequences)
    labels = torch.tensor(sequences)[:, 2:]
    layer = ReferenceMtp(target, seed)
    optimizer = torch.optim.Adam(layer.parameters(), lr=1e-2)
    for _ in range(steps):
        logits = layer(embeds[:, 1:-1], states[:, :-2])
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return layer.eval()


def write_mtp_layer(target: Path, layer: ReferenceMtp) -> Path:
    """`target` with `layer` stored after its decoder layers, in a safetensors file of its own
    listed in the index (as DeepSeek-V3's shards hold it), and num_nextn_predict_layers 1."""
    tensors = layer.published()
    save_file(tensors, target / "model-mtp.safetensors")
    index_file = target / "model.safetensors.index.json"
    if index_file.is_file():
        index = json.loads(index_file.read_text())
    else:
        from safetensors import safe_open

        with safe_open(target / "model.safetensors", "pt") as f:
            index = {"metadata": {}, "weight_map": dict.fromkeys(f.keys(), "model.safetensors")}
    index["weight_map"] |= dict.fromkeys(tensors, "model-mtp.safetensors")
    index_file.write_text(json.dumps(index))
    config_file = target / "config.json"
    config = json.loads(config_file.read_text())
    config["num_nextn_predict_layers"] = 1
    config_file.write_text(json.dumps(config))
    return target
