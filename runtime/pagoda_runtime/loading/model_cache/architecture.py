"""A cached model's shape, read from its own files, so the operator can size any Llama-family
checkpoint (not only the named families): config.json of a folder, the metadata of a GGUF file."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from pagoda_runtime.loading.model_source import load_model_source


def checkpoint_facts(path: Path) -> dict:
    """{"architecture": ModelArchitecture's fields (read back by ModelArchitecture.from_facts),
    "storedQuantization": awq|gptq|gguf|None}.

    Opening the model checks everything short of reading the weights (every tensor's presence and
    shape, truncated files), so a checkpoint the runtime could not load fails the download instead
    of every replica.
    """
    loaded = load_model_source(path, keep_quantized=True)
    return {"architecture": asdict(loaded.config.architecture), "storedQuantization": loaded.quantization}


def facts_line(path: Path) -> str:
    """What a sizing Job leaves in its termination message for the operator (< 4 KiB): the same
    keys the download Job's summary carries."""
    return json.dumps(checkpoint_facts(path), separators=(",", ":"))
