"""LoRA adapters and the model cache: the device bytes the operator's fit check counts for the
adapter slots equal what the runtime allocates, and `pagoda-runtime fetch --adapter` copies an
adapter from the hub at a pinned commit, or copies a folder, into a cache folder once, checked,
reporting its rank to the operator."""

from __future__ import annotations

import json

import pytest
from pagoda_runtime.cli import main
from pagoda_runtime.contract import cache_layout as layout
from pagoda_runtime.contract.config import EngineConfig
from pagoda_runtime.contract.sizing import lora_slot_bytes
from pagoda_runtime.engine.build import build_engine
from pagoda_runtime.loading.model_cache.adapter import copy_adapter

from tests.model_cache.hub_mirror import HubMirror
from tests.runtime.tiny_lora import build_tiny_adapter
from tests.runtime.tiny_models import build_tiny_model


@pytest.mark.parametrize("variant", ["llama3", "qwen3_moe"])
def test_slot_bytes_are_what_the_runtime_allocates(variant, tmp_path):
    base = build_tiny_model(tmp_path / variant, variant)
    config = EngineConfig(
        model=str(base),
        device="cpu",
        dtype="float32",
        kv_cache_memory=2**22,
        enable_lora=True,
        max_loras=3,
        max_lora_rank=8,
    )
    parts = build_engine(config)
    slots = parts.runner.lora_slots
    allocated = sum(t.numel() * t.element_size() for p in slots.projections for t in (p.lora_a, p.lora_b))
    arch = parts.runner.model.config.architecture
    assert lora_slot_bytes(arch, 3, 8, "float32") == allocated


def test_fetch_adapter_copies_a_folder_once_and_reports_its_rank(tmp_path):
    base = build_tiny_model(tmp_path / "base", "llama3")
    adapter = build_tiny_adapter(tmp_path / "sql", base, rank=8, seed=0)
    log = tmp_path / "termination"
    cache = tmp_path / "cache"
    assert (
        main(["fetch", str(adapter), "--adapter", "--cache-dir", str(cache), "--termination-log", str(log)])
        == 0
    )
    assert json.loads(log.read_text())["adapter"] == {"rank": 8}
    copied = layout.model_dir(cache)
    assert (copied / "adapter_model.safetensors").read_bytes() == (
        adapter / "adapter_model.safetensors"
    ).read_bytes()
    (adapter / "adapter_model.safetensors").unlink()
    assert copy_adapter(adapter, cache)["adapter"] == {"rank": 8}  # complete already: not copied again


def test_fetch_adapter_refuses_a_folder_that_is_no_lora_adapter(tmp_path):
    base = build_tiny_model(tmp_path / "base", "llama3")
    dora = build_tiny_adapter(tmp_path / "dora", base, rank=8, seed=0, config_overrides={"use_dora": True})
    log = tmp_path / "termination"
    assert (
        main(
            [
                "fetch",
                str(dora),
                "--adapter",
                "--cache-dir",
                str(tmp_path / "c1"),
                "--termination-log",
                str(log),
            ]
        )
        == 1
    )
    assert "use_dora=True" in log.read_text() and layout.read_manifest(tmp_path / "c1") is None
    assert (
        main(
            [
                "fetch",
                str(base),
                "--adapter",
                "--cache-dir",
                str(tmp_path / "c2"),
                "--termination-log",
                str(log),
            ]
        )
        == 1
    )
    assert "holds no adapter_config.json" in log.read_text()


def test_fetch_adapter_downloads_a_pinned_hub_revision(tmp_path, monkeypatch):
    base = build_tiny_model(tmp_path / "base", "llama3")
    adapter = build_tiny_adapter(tmp_path / "sql", base, rank=16, seed=0)
    commit = "0123456789abcdef0123456789abcdef01234567"
    log = tmp_path / "termination"
    with HubMirror() as hub:
        hub.add("acme/sql-lora", adapter, commit)
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        argv = [
            "fetch",
            "hf://acme/sql-lora",
            "--revision",
            commit,
            "--adapter",
            "--cache-dir",
            str(tmp_path / "c"),
        ]
        assert main([*argv, "--termination-log", str(log)]) == 0
        resolves = [p for _, p, _ in hub.requests if "/resolve/" in p]
    facts = json.loads(log.read_text())
    assert (facts["revision"], facts["adapter"]) == (commit, {"rank": 16})
    assert resolves and all(f"/resolve/{commit}/" in p for p in resolves)
    assert (layout.model_dir(tmp_path / "c") / "adapter_config.json").is_file()
