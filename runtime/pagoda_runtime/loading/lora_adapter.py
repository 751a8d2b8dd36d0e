"""A PEFT LoRA adapter folder (`adapter_config.json` + `adapter_model.safetensors`) read and checked
against the base model it is to run on.

What is read: the rank r, lora_alpha (scaling alpha / r, or alpha / sqrt(r) with use_rslora), and
each decoder layer's A [r, in] and B [out, r] of the projections in LORA_TARGETS, under Hugging
Face's unfused names (the model maps them onto its fused qkv_proj and gate_up_proj:
executor/models/lora_layers.py). What is refused, in one sentence each: a folder that is not a PEFT
LoRA, a rank above --max-lora-rank, a target or a PEFT option Pagoda does not apply (DoRA, trained
biases, modules_to_save, per-module ranks), and tensors whose shapes or layers do not fit the base
model (an adapter trained for another architecture or hidden size).
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from pagoda_runtime.contract.config import ModelConfig
from pagoda_runtime.engine.protocol import LoraAdapterError

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# The projections an adapter may train, under PEFT's (Hugging Face's) module names.
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_KEY = re.compile(
    r"^base_model\.model\.(?:model\.|backbone\.)?layers\.(\d+)(\..+\.)lora_([AB])(?:\.default)?\.weight$"
)
# A layer's module path in the Llama layout's names, as `_KEY` leaves it.
_MODULE = re.compile(r"^\.(?:self_attn|mlp)\.(\w+)\.$")


@dataclass(frozen=True)
class LoraAdapter:
    name: str
    path: str
    rank: int
    scaling: float
    # (layer, projection in LORA_TARGETS) -> (A [r, in], B [out, r]), in the checkpoint's dtype.
    weights: Mapping[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]

    @property
    def targets(self) -> frozenset[str]:
        return frozenset(module for _, module in self.weights)


_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")


def projection_shape(config: ModelConfig, module: str) -> tuple[int, int]:
    """(in, out) features of a whole (unsharded) projection of the base model."""
    arch = config.architecture
    kv = arch.num_key_value_heads * arch.head_dim
    return {
        "q_proj": (arch.hidden_size, arch.q_size),
        "k_proj": (arch.hidden_size, kv),
        "v_proj": (arch.hidden_size, kv),
        "o_proj": (arch.q_size, arch.hidden_size),
        "gate_proj": (arch.hidden_size, arch.intermediate_size),
        "up_proj": (arch.hidden_size, arch.intermediate_size),
        "down_proj": (arch.intermediate_size, arch.hidden_size),
    }[module]


def read_adapter_config(name: str, folder: Path) -> dict:
    """The folder's adapter_config.json, once both files of a PEFT adapter are there."""
    if not (folder / CONFIG_FILE).is_file():
        raise LoraAdapterError(
            f"LoRA adapter {name!r}: {str(folder)!r} holds no {CONFIG_FILE}; give a PEFT adapter folder"
        )
    if not (folder / WEIGHTS_FILE).is_file():
        raise LoraAdapterError(
            f"LoRA adapter {name!r}: {str(folder)!r} holds no {WEIGHTS_FILE}; save the adapter with "
            "safe_serialization=True (PEFT's default)"
        )
    try:
        raw = json.loads((folder / CONFIG_FILE).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LoraAdapterError(f"LoRA adapter {name!r}: {CONFIG_FILE} cannot be read: {exc}") from exc
    if not isinstance(raw, dict):
        raise LoraAdapterError(f"LoRA adapter {name!r}: {CONFIG_FILE} is not a JSON object")
    return raw


def adapter_rank(name: str, folder: Path) -> int:
    """The rank of the PEFT LoRA adapter in `folder`, refused as load_lora_adapter refuses it short
    of the base model's shapes (the model cache's download Job checks an adapter with this)."""
    rank, _ = _rank_and_scaling(name, read_adapter_config(name, folder), max_rank=sys.maxsize)
    return rank


def load_lora_adapter(name: str, path: str | Path, config: ModelConfig, max_rank: int) -> LoraAdapter:
    folder = Path(path)
    raw = read_adapter_config(name, folder)
    rank, scaling = _rank_and_scaling(name, raw, max_rank)
    try:
        tensors = load_file(folder / WEIGHTS_FILE)
    except (OSError, SafetensorError) as exc:
        raise LoraAdapterError(f"LoRA adapter {name!r}: {WEIGHTS_FILE} cannot be read: {exc}") from exc
    return LoraAdapter(name, str(folder), rank, scaling, _weights(name, tensors, rank, config))


def _rank_and_scaling(name: str, raw: dict, max_rank: int) -> tuple[int, float]:
    def refuse(why: str) -> LoraAdapterError:
        return LoraAdapterError(f"LoRA adapter {name!r}: {why}")

    if raw.get("peft_type", "LORA") != "LORA":
        raise refuse(f"is a {raw['peft_type']} adapter; Pagoda serves LoRA adapters only")
    if raw.get("task_type", "CAUSAL_LM") not in ("CAUSAL_LM", None):
        raise refuse(f"was trained for task {raw['task_type']}; Pagoda serves CAUSAL_LM adapters")
    for option, off in (("use_dora", False), ("bias", "none"), ("modules_to_save", None)):
        if raw.get(option, off) not in (off, None, [], {}):
            raise refuse(f"sets {option}={raw[option]!r}, which Pagoda does not apply; train without it")
    for option in ("rank_pattern", "alpha_pattern"):
        if raw.get(option):
            raise refuse(f"sets per-module ranks ({option}), which Pagoda does not apply")
    rank, alpha = raw.get("r"), raw.get("lora_alpha")
    if not isinstance(rank, int) or rank < 1 or not isinstance(alpha, int | float):
        raise refuse(f"{CONFIG_FILE} needs a positive integer r and a number lora_alpha")
    if rank > max_rank:
        raise refuse(f"has rank {rank}, above --max-lora-rank {max_rank}; start the server with a larger one")
    scaling = alpha / math.sqrt(rank) if raw.get("use_rslora") else alpha / rank
    return rank, float(scaling)


def _llama_layout(path: str, config: ModelConfig) -> str:
    """A layer's module path (".feed_forward.w1.") in the Llama layout's names, where the family names
    its modules otherwise (registry.Family.adapter_names: LFM2's, Nemotron-H's)."""
    from pagoda_runtime.executor.models.registry import family_of

    for theirs, ours in family_of(config).adapter_names.items():
        path = path.replace(theirs, ours)
    return path


def _weights(
    name: str, tensors: dict[str, torch.Tensor], rank: int, config: ModelConfig
) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
    layers = config.architecture.num_hidden_layers
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        match = _KEY.match(key)
        path = match and _llama_layout(match[2], config)
        module = path and _MODULE.match(path)
        if module is None:
            raise LoraAdapterError(
                f"LoRA adapter {name!r} holds {key!r}; Pagoda applies LoRA to the decoder layers' "
                f"{', '.join(LORA_TARGETS)} only"
            )
        layer, module, half = int(match[1]), module[1], match[3]
        if module not in LORA_TARGETS:
            raise LoraAdapterError(
                f"LoRA adapter {name!r} targets {module!r}, which a {config.model_type} model does not "
                f"have as a separate projection; Pagoda applies LoRA to {', '.join(LORA_TARGETS)}"
            )
        if layer >= layers:
            raise LoraAdapterError(
                f"LoRA adapter {name!r} has weights for layer {layer}, but the base model has {layers} "
                "layers; it was trained for another base model"
            )
        arch = config.architecture
        if module in _ATTENTION and not arch.is_attention_layer(layer):
            raise LoraAdapterError(
                f"LoRA adapter {name!r} targets layer {layer}'s {module}, but that layer of this hybrid "
                f"model is a {arch.layer_types[layer]} layer without attention; it was trained for "
                "another base model"
            )
        if module == "q_proj" and arch.attention_output_gate:
            raise LoraAdapterError(
                f"LoRA adapter {name!r} targets q_proj, which in {config.model_type}'s gated attention also "
                "gives the gate; Pagoda applies LoRA to its k_proj, v_proj, o_proj and MLP"
            )
        halves.setdefault((layer, module), {})[half] = tensor
    weights = {}
    for (layer, module), pair in sorted(halves.items()):
        if set(pair) != {"A", "B"}:
            missing = ({"A", "B"} - set(pair)).pop()
            raise LoraAdapterError(f"LoRA adapter {name!r} lacks layer {layer} {module}'s lora_{missing}")
        a, b = pair["A"], pair["B"]
        fan_in, fan_out = projection_shape(config, module)
        if tuple(a.shape) != (rank, fan_in) or tuple(b.shape) != (fan_out, rank):
            raise LoraAdapterError(
                f"LoRA adapter {name!r}: layer {layer} {module} has A {list(a.shape)} and B {list(b.shape)}, "
                f"but on this base model (hidden size {config.architecture.hidden_size}) and rank {rank} "
                f"they must be [{rank}, {fan_in}] and [{fan_out}, {rank}]; it was trained for another "
                "base model"
            )
        weights[(layer, module)] = (a, b)
    if not weights:
        raise LoraAdapterError(f"LoRA adapter {name!r} holds no LoRA weights")
    return weights
