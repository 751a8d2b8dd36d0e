"""hf:// downloads through huggingface_hub against a loopback mirror with the hub's paths."""

from __future__ import annotations

import json

import huggingface_hub.constants
import pytest
from pagoda_runtime.cli import main
from pagoda_runtime.contract import cache_layout as layout
from pagoda_runtime.contract.bundled import resolve_model
from pagoda_runtime.contract.sources import parse_remote
from pagoda_runtime.loading.model_cache.fetch import fetch
from pagoda_runtime.loading.model_cache.verify import VerificationError
from pagoda_runtime.loading.model_source import load_model_source

from tests.model_cache.hub_mirror import HubMirror
from tests.runtime.tiny_models import build_tiny_model

COMMIT = "0123456789abcdef0123456789abcdef01234567"
TOKEN = "hf_test_token"


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "llama", "llama3", sharded=True)


@pytest.fixture
def mirror(tiny_folder, monkeypatch):
    with HubMirror(token=TOKEN) as hub:
        hub.add("acme/tiny-llama", tiny_folder, COMMIT)
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        yield hub


def test_fetch_pins_verifies_and_sizes_from_config(mirror, tiny_folder, tmp_path):
    lines = []
    manifest = fetch(parse_remote("hf://acme/tiny-llama", COMMIT), tmp_path, emit=lines.append)
    model = layout.model_dir(tmp_path)
    assert sorted(p.name for p in model.iterdir()) == sorted(
        [*mirror.repos["acme/tiny-llama"].entries, ".pagoda-model.json"]
    )
    assert not layout.partial_dir(tmp_path).exists()
    expected = load_model_source(tiny_folder).config.architecture
    assert manifest["architecture"]["num_hidden_layers"] == expected.num_hidden_layers
    assert manifest["architecture"]["vocab_size"] == expected.vocab_size
    assert manifest["revision"] == COMMIT
    # Every file was asked for at the pinned commit, never at a branch.
    resolves = [p for m, p, _ in mirror.requests if "/resolve/" in p]
    assert resolves and all(f"/resolve/{COMMIT}/" in p for p in resolves)
    assert json.loads(lines[-1])["done"] == manifest["bytes"]
    # The runtime opens the cache folder directly.
    assert resolve_model(str(model)) == model


def test_complete_cache_is_not_downloaded_again(mirror, tmp_path):
    fetch(parse_remote("hf://acme/tiny-llama", COMMIT), tmp_path, emit=lambda _: None)
    mirror.requests.clear()
    fetch(parse_remote("hf://acme/tiny-llama", COMMIT), tmp_path, emit=lambda _: None)
    assert mirror.requests == []


def test_interrupted_download_resumes_with_a_range_request(mirror, tmp_path, monkeypatch):
    # huggingface_hub writes in chunks of this size; a small one lets a small file be cut mid-way.
    monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 8192)
    mirror.cut_after = 50_000
    fetch(parse_remote("hf://acme/tiny-llama", COMMIT), tmp_path, emit=lambda _: None)
    ranges = [r for m, _, r in mirror.requests if m == "GET" and r]
    assert ranges == [f"bytes={50_000 // 8192 * 8192}-"]  # the whole chunks that had arrived
    assert layout.read_manifest(tmp_path) is not None


def test_corrupt_file_is_never_served(mirror, tiny_folder, tmp_path):
    repo = mirror.repos["acme/tiny-llama"]
    shard = next(p for p in repo.entries if p.endswith(".safetensors"))
    repo.entries[shard]["lfs"]["oid"] = "0" * 64  # the server announces a hash the bytes do not have
    with pytest.raises(VerificationError, match="corrupt"):
        fetch(parse_remote("hf://acme/tiny-llama", COMMIT), tmp_path, emit=lambda _: None)
    assert not layout.model_dir(tmp_path).exists()


def test_cli_reports_a_bad_token_in_the_termination_log(mirror, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "wrong")
    log = tmp_path / "termination-log"
    code = main(
        [
            "fetch",
            "hf://acme/tiny-llama",
            "--revision",
            COMMIT,
            "--cache-dir",
            str(tmp_path / "c"),
            "--termination-log",
            str(log),
        ]
    )
    assert code == 1
    message = log.read_text()
    assert message.startswith("downloading hf://acme/tiny-llama failed") and "401" in message
    assert not layout.model_dir(tmp_path / "c").exists()


def test_cli_writes_the_architecture_for_the_operator(mirror, tmp_path):
    log = tmp_path / "termination-log"
    code = main(
        [
            "fetch",
            "hf://acme/tiny-llama",
            "--revision",
            COMMIT,
            "--cache-dir",
            str(tmp_path / "c"),
            "--termination-log",
            str(log),
        ]
    )
    assert code == 0
    summary = json.loads(log.read_text())
    assert summary["revision"] == COMMIT and summary["architecture"]["num_hidden_layers"] >= 1
    assert len(log.read_bytes()) < 4096


def test_branch_revision_is_refused():
    with pytest.raises(ValueError, match="40-character commit"):
        parse_remote("hf://acme/tiny-llama", "main")
