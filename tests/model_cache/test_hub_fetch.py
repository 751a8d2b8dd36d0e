"""hf:// downloads through huggingface_hub against a loopback mirror with the hub's paths."""

from __future__ import annotations

import json

import httpx
import huggingface_hub.constants
import pytest
from pagoda_runtime.cli import main
from pagoda_runtime.contract import cache_layout as layout
from pagoda_runtime.contract.bundled import resolve_model
from pagoda_runtime.contract.sources import parse_remote
from pagoda_runtime.loading.model_cache.fetch import fetch
from pagoda_runtime.loading.model_cache.hub import hub_model, is_hub_id
from pagoda_runtime.loading.model_cache.verify import VerificationError
from pagoda_runtime.loading.model_source import load_model_source

from tests.model_cache.hub_mirror import HubMirror
from tests.runtime.server.conftest import ServerProcess
from tests.runtime.tiny_models import build_tiny_gguf, build_tiny_model

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


@pytest.fixture(scope="module")
def gguf_repo(tiny_folder, tmp_path_factory):
    """A repository as GGUF publishers lay them out: one file per quantization, a README, no config."""
    folder = tmp_path_factory.mktemp("gguf-repo")
    for ggml_type in ("Q8_0", "F16"):
        build_tiny_gguf(tiny_folder, folder / f"tiny-llama.{ggml_type}.gguf", ggml_type)
    (folder / "README.md").write_text("# tiny-llama GGUF\n")
    return folder


@pytest.fixture
def gguf_mirror(mirror, gguf_repo):
    mirror.add("acme/tiny-llama-GGUF", gguf_repo, COMMIT)
    return mirror


def _downloaded(mirror) -> set[str]:
    return {p.rsplit("/", 1)[-1] for m, p, _ in mirror.requests if m == "GET" and "/resolve/" in p}


def test_a_repository_of_several_ggufs_is_refused_before_any_download(gguf_mirror, tmp_path):
    with pytest.raises(
        ValueError, match=r"holds 2 GGUF files .*hf://acme/tiny-llama-GGUF/tiny-llama\.F16\.gguf"
    ):
        fetch(parse_remote("hf://acme/tiny-llama-GGUF", COMMIT), tmp_path, emit=lambda _: None)
    assert _downloaded(gguf_mirror) == set()


def test_allow_patterns_download_one_quantization_only(gguf_mirror, tmp_path):
    source = parse_remote("hf://acme/tiny-llama-GGUF", COMMIT, allow_patterns=("*Q8_0.gguf",))
    manifest = fetch(source, tmp_path, emit=lambda _: None)
    assert _downloaded(gguf_mirror) == {"tiny-llama.Q8_0.gguf"}
    assert manifest["storedQuantization"] == "gguf" and list(manifest["files"]) == ["tiny-llama.Q8_0.gguf"]
    model = layout.model_dir(tmp_path)
    assert resolve_model(str(model)) == model / "tiny-llama.Q8_0.gguf"


def test_one_file_named_in_the_source(gguf_mirror, tmp_path):
    manifest = fetch(
        parse_remote("hf://acme/tiny-llama-GGUF/tiny-llama.F16.gguf", COMMIT), tmp_path, emit=print
    )
    assert _downloaded(gguf_mirror) == {"tiny-llama.F16.gguf"}
    assert manifest["modelPath"] == "tiny-llama.F16.gguf"


def test_ignore_patterns_leave_files_out(mirror, tmp_path):
    source = parse_remote("hf://acme/tiny-llama", COMMIT, ignore_patterns=("*.md", "generation_config.json"))
    manifest = fetch(source, tmp_path, emit=lambda _: None)
    assert "generation_config.json" not in manifest["files"] and "config.json" in manifest["files"]


def test_patterns_that_match_nothing_say_what_the_repository_holds(gguf_mirror, tmp_path):
    source = parse_remote("hf://acme/tiny-llama-GGUF", COMMIT, allow_patterns=("*Q4_K_M.gguf",))
    with pytest.raises(FileNotFoundError, match=r"matches .*tiny-llama\.Q8_0\.gguf"):
        fetch(source, tmp_path, emit=lambda _: None)


def test_cli_passes_the_patterns(gguf_mirror, tmp_path):
    args = ["fetch", "hf://acme/tiny-llama-GGUF", "--revision", COMMIT, "--cache-dir", str(tmp_path / "c")]
    args += ["--allow-pattern", "*.F16.gguf", "--termination-log", str(tmp_path / "log")]
    assert main(args) == 0
    assert json.loads((tmp_path / "log").read_text())["modelPath"] == "tiny-llama.F16.gguf"


def test_hub_model_lands_in_the_hugging_face_cache_and_is_reused(mirror, tmp_path, monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert (
        is_hub_id("acme/tiny-llama@main") and not is_hub_id(str(tmp_path)) and not is_hub_id("smollm2-135m")
    )
    path = hub_model(f"acme/tiny-llama@{COMMIT}")
    assert path == tmp_path / "hub" / "models--acme--tiny-llama" / "snapshots" / COMMIT
    assert (path / "config.json").is_file()
    mirror.requests.clear()
    # Offline (the runtime image's default), the snapshot already there is what it serves.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    assert hub_model("acme/tiny-llama", COMMIT) == path
    assert _downloaded(mirror) == set()
    with pytest.raises(ValueError, match="--revision says"):
        hub_model(f"acme/tiny-llama@{COMMIT}", "1" * 40)


@pytest.mark.slow
def test_serve_takes_a_hub_id_as_vllm_does(mirror, tmp_path):
    server = ServerProcess(
        "--model",
        f"acme/tiny-llama@{COMMIT}",
        "--max-model-len",
        "128",
        log_dir=tmp_path,
        env={
            "HF_HOME": str(tmp_path / "hf"),
            "HF_HUB_OFFLINE": "0",
            "HF_ENDPOINT": mirror.url,
            "HF_TOKEN": TOKEN,
        },
    )
    try:
        server.wait_ready(120)
        models = httpx.get(server.url + "/v1/models", timeout=10).json()["data"]
        assert [m["id"] for m in models] == ["acme/tiny-llama"]
        completion = httpx.post(
            server.url + "/v1/completions",
            json={"model": "acme/tiny-llama", "prompt": "hello", "max_tokens": 4},
            timeout=60,
        )
        assert completion.status_code == 200, completion.text
        assert (tmp_path / "hf" / "hub" / "models--acme--tiny-llama" / "snapshots" / COMMIT).is_dir()
    finally:
        server.stop()


def test_serve_says_why_a_hub_id_cannot_be_had(mirror, tmp_path):
    log = tmp_path / "termination-log"
    code = main(["serve", "--model", "acme/no-such-model", "--termination-log", str(log), "--device", "cpu"])
    assert code == 1
    assert "downloading acme/no-such-model from the Hugging Face hub failed" in log.read_text()
