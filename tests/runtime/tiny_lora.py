"""Tiny random PEFT LoRA adapters for the tiny models (tiny_models.py), and the reference they must
match: transformers' model with each adapter merged into its weights, W + scaling * B @ A.

`build_tiny_adapter` writes adapter_config.json and adapter_model.safetensors under PEFT's names
(base_model.model.model.layers.{i}.{self_attn|mlp}.{module}.lora_{A|B}.weight). B is random, not
zero as PEFT initializes it, so that every adapter changes the model's output.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM

ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")


def _shapes(config, module: str) -> tuple[int, int]:
    """(in, out) of a projection of a transformers config."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    q = config.num_attention_heads * head_dim
    kv = config.num_key_value_heads * head_dim
    hidden, inter = config.hidden_size, config.intermediate_size
    return {
        "q_proj": (hidden, q),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (q, hidden),
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }[module]


def build_tiny_adapter(
    folder: str | Path,
    base_folder: str | Path,
    rank: int,
    seed: int,
    targets: tuple[str, ...] = ALL_TARGETS,
    alpha: float | None = None,
    rslora: bool = False,
    config_overrides: dict | None = None,
    hidden_size: int | None = None,
    attention_layers: tuple[int, ...] | None = None,
    paths: dict[str, str] | None = None,
    intermediate_size: int | None = None,
) -> Path:
    """An adapter of `rank` on `targets` of every layer of the model at base_folder; hidden_size
    builds it for another hidden size (an adapter of another base model); attention_layers: the
    layers whose attention it adapts, where not every layer attends (a hybrid's); paths: a target's
    module path in a layer where the model names it otherwise than self_attn.<target> or
    mlp.<target> (LFM2's feed_forward.w1, Nemotron-H's mixer.q_proj); intermediate_size: the MLP's
    width where config.json's is not it (LFM2 derives it)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = AutoConfig.from_pretrained(base_folder)
    if hidden_size is not None:
        config.hidden_size = hidden_size
    if intermediate_size is not None:
        config.intermediate_size = intermediate_size
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config.num_hidden_layers):
        for module in targets:
            if module in _ATTENTION and attention_layers is not None and layer not in attention_layers:
                continue
            fan_in, fan_out = _shapes(config, module)
            path = (paths or {}).get(module) or f"{'self_attn' if module in _ATTENTION else 'mlp'}.{module}"
            prefix = f"base_model.model.model.layers.{layer}.{path}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, fan_in, generator=generator) * 0.3
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(fan_out, rank, generator=generator) * 0.3
    save_file(tensors, folder / "adapter_model.safetensors")
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(base_folder),
        "r": rank,
        "lora_alpha": alpha if alpha is not None else rank,
        "lora_dropout": 0.0,
        "target_modules": list(targets),
        "bias": "none",
        "use_rslora": rslora,
        "use_dora": False,
        "modules_to_save": None,
        **(config_overrides or {}),
    }
    (folder / "adapter_config.json").write_text(json.dumps(adapter_config))
    return folder


def merged_reference(base_folder: str | Path, adapter_folder: str | Path | None = None):
    """transformers' float32 model at base_folder with the adapter merged into its weights."""
    model = AutoModelForCausalLM.from_pretrained(
        base_folder, dtype=torch.float32, attn_implementation="eager"
    )
    if adapter_folder is not None:
        adapter = json.loads((Path(adapter_folder) / "adapter_config.json").read_text())
        rank, alpha = adapter["r"], adapter["lora_alpha"]
        scaling = alpha / math.sqrt(rank) if adapter.get("use_rslora") else alpha / rank
        from safetensors.torch import load_file

        tensors = load_file(Path(adapter_folder) / "adapter_model.safetensors")
        params = dict(model.named_parameters())
        with torch.no_grad():
            for key, a in tensors.items():
                if ".lora_A." not in key:
                    continue
                b = tensors[key.replace(".lora_A.", ".lora_B.")]
                name = key.removeprefix("base_model.model.").replace(".lora_A.weight", ".weight")
                params[name] += scaling * (b @ a)
    return model.eval()
