"""A cached model's shape, read from its own files, so the operator can size any Llama-family
checkpoint (not only the named families): config.json of a folder, the metadata of a GGUF file; of
an EAGLE head's folder, the head's shape (contract/eagle_sizing.py)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from pagoda_runtime.contract.eagle_sizing import HEAD_ARCHITECTURES, HEAD_WEIGHT_FILES, EagleHeadShape
from pagoda_runtime.loading.model_source import load_model_source


def checkpoint_facts(path: Path) -> dict:
    """{"architecture": ModelArchitecture's fields (read back by ModelArchitecture.from_facts),
    "storedQuantization": awq|gptq|gguf|fp8|int8|None}; of an EAGLE head, {"eagleHead": EagleHeadShape's
    fields} instead (a head is not a model the runtime could open on its own).

    Opening the model checks everything short of reading the weights (every tensor's presence and
    shape, truncated files), so a checkpoint the runtime could not load fails the download instead
    of every replica.
    """
    head = eagle_head_shape(path)
    if head is not None:
        return {"eagleHead": head.to_facts()}
    loaded = load_model_source(path, keep_quantized=True)
    return {"architecture": asdict(loaded.config.architecture), "storedQuantization": loaded.quantization}


def eagle_head_shape(path: Path) -> EagleHeadShape | None:
    """The EAGLE head in folder `path`, None where it holds none: an EAGLE-3 head by its config's
    architecture, an EAGLE-1 head (a one-layer LlamaForCausalLM) by its fc projection."""
    config_file = path / "config.json"
    weight_file = next((path / name for name in HEAD_WEIGHT_FILES if (path / name).is_file()), None)
    if not path.is_dir() or not config_file.is_file() or weight_file is None:
        return None
    config = json.loads(config_file.read_text())
    named = (config.get("architectures") or [None])[0]
    method = next((m for m, arch in HEAD_ARCHITECTURES.items() if arch == named), None)
    if method is None or config.get("num_hidden_layers") != 1:
        return None
    names = {name.removeprefix("model.") for name in _tensor_names(weight_file)}
    if "fc.weight" not in names:
        return None
    return EagleHeadShape.from_config(method, config, names)


def _tensor_names(file: Path) -> list[str]:
    if file.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(file, framework="np") as f:
            return list(f.keys())
    import torch

    return list(torch.load(file, map_location="cpu", weights_only=True, mmap=True))


def facts_line(path: Path) -> str:
    """What a sizing Job leaves in its termination message for the operator (< 4 KiB): the same
    keys the download Job's summary carries."""
    return json.dumps(checkpoint_facts(path), separators=(",", ":"))
