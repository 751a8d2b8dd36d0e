"""LoRA adapters from the model cache's sources: `--lora-modules name=hf://org/name[@revision]` and
`name=s3://bucket/prefix` (and /v1/load_lora_adapter's lora_path) download the adapter once into the
download dir, pinned and verified, then serve exactly as the same adapter's local folder does; a
source that is not an adapter, or not there, is one sentence (a 400 from the API)."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from pagoda_runtime import LLM, SamplingParams
from pagoda_runtime.cli import main
from pagoda_runtime.contract import cache_layout as layout
from pagoda_runtime.contract.config import EngineConfig
from pagoda_runtime.engine.async_engine import AsyncLLMEngine
from pagoda_runtime.engine.llm_engine import LLMEngine
from pagoda_runtime.engine.protocol import LoraAdapterError

from tests.model_cache.hub_mirror import HubMirror
from tests.model_cache.minio_server import ACCESS_KEY, SECRET_KEY, MinioServer
from tests.runtime.server.conftest import fake_app, wait_ready
from tests.runtime.tiny_lora import build_tiny_adapter
from tests.runtime.tiny_models import build_tiny_model

COMMIT = "89abcdef0123456789abcdef0123456789abcdef"
PROMPT = "Hello, world! How are"
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
ENGINE = dict(dtype="float32", device="cpu", block_size=4, kv_cache_memory=2**22, enable_lora=True)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-sources")
    base = build_tiny_model(root / "base", "llama3")
    adapter = build_tiny_adapter(root / "adapter", base, rank=8, seed=3)
    # What hub repositories of adapters carry besides: not downloaded.
    (adapter / "README.md").write_text("a tiny adapter\n")
    weights_only = root / "weights-only"
    weights_only.mkdir()
    weights = "adapter_model.safetensors"
    (weights_only / weights).write_bytes((adapter / weights).read_bytes())
    return base, adapter, weights_only


@pytest.fixture(scope="module")
def llm(folders, tmp_path_factory):
    base, adapter, _ = folders
    download_dir = tmp_path_factory.mktemp("downloads")
    engine = LLM(model=str(base), download_dir=str(download_dir), max_loras=2, max_cpu_loras=2, **ENGINE)
    engine.add_lora("local", str(adapter))
    return engine, download_dir


@pytest.fixture
def mirror(folders, monkeypatch):
    _, adapter, weights_only = folders
    with HubMirror() as hub:
        hub.add("acme/tiny-lora", adapter, COMMIT)
        hub.add("acme/weights-only", weights_only, COMMIT)
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        yield hub


def _tokens(llm, name):
    return llm.generate(PROMPT, GREEDY, lora_name=name)[0].outputs[0].token_ids


def test_hub_adapter_is_pinned_cached_once_and_serves_like_its_folder(llm, mirror):
    llm, download_dir = llm
    llm.add_lora("hub", "hf://acme/tiny-lora")  # a branch (main): pinned to its commit
    assert _tokens(llm, "hub") == _tokens(llm, "local") != _tokens(llm, None)
    [cache] = (download_dir / "lora").iterdir()
    manifest = layout.read_manifest(cache)
    assert manifest["revision"] == COMMIT and manifest["source"] == "hf://acme/tiny-lora"
    assert sorted(manifest["files"]) == ["adapter_config.json", "adapter_model.safetensors"]
    assert manifest["adapter"] == {"rank": 8}
    resolves = [p for m, p, _ in mirror.requests if "/resolve/" in p]
    assert resolves and all(f"/resolve/{COMMIT}/" in p for p in resolves)
    # Loaded again at the same commit: served from the cache, nothing asked of the hub.
    llm.remove_lora("hub")
    mirror.requests.clear()
    llm.add_lora("hub", f"hf://acme/tiny-lora@{COMMIT}")
    assert mirror.requests == []
    assert _tokens(llm, "hub") == _tokens(llm, "local")
    llm.remove_lora("hub")


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("hf://acme/nothing", r"^LoRA adapter 'x': the hub has no repository acme/nothing that this server"),
        ("hf://acme/tiny-lora@v9", r"^LoRA adapter 'x': hf://acme/tiny-lora@v9 names a revision its"),
        (
            "hf://acme/tiny-lora/tiny.gguf",
            r"^LoRA adapter 'x': hf://acme/tiny-lora/tiny.gguf is not a hub repository; give hf://org/name",
        ),
        (
            "hf://acme/weights-only",
            rf"^LoRA adapter 'x': hf://acme/weights-only at {COMMIT} holds no adapter_config.json; give",
        ),
    ],
)
def test_a_hub_source_that_is_no_adapter_is_one_sentence(llm, mirror, path, message):
    llm, _ = llm
    with pytest.raises(LoraAdapterError, match=message) as refused:
        llm.add_lora("x", path)
    assert "\n" not in str(refused.value)
    assert "x" not in llm.engine.lora_adapters()
    assert _tokens(llm, "local") != _tokens(llm, None)  # the others serve on


def test_s3_adapter_serves_like_its_folder(llm, folders, tmp_path, monkeypatch):
    llm, _ = llm
    _, adapter, _ = folders
    with MinioServer(tmp_path / "minio") as server:
        client = server.client()
        client.make_bucket("adapters")
        for file in ("adapter_config.json", "adapter_model.safetensors"):
            client.fput_object("adapters", f"tiny/{file}", str(adapter / file))
        monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        llm.add_lora("s3", "s3://adapters/tiny")
        empty = r"^LoRA adapter 'x': s3://adapters/empty holds no objects"
        with pytest.raises(LoraAdapterError, match=empty):
            llm.add_lora("x", "s3://adapters/empty")
    # Served from host memory and the cache, with the server gone.
    assert _tokens(llm, "s3") == _tokens(llm, "local")
    llm.remove_lora("s3")


def test_load_endpoint_takes_a_source_and_refuses_a_bad_one_with_400(folders, mirror, tmp_path):
    base, adapter, _ = folders
    config = EngineConfig(model=str(base), download_dir=str(tmp_path), **ENGINE)
    app, _ = fake_app(AsyncLLMEngine(LLMEngine(config)))
    with TestClient(app) as client:
        wait_ready(client, timeout=60)
        ok = client.post("/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": "hf://acme/tiny-lora"})
        assert ok.status_code == 200, ok.text
        bad = client.post("/v1/load_lora_adapter", json={"lora_name": "b", "lora_path": "hf://acme/nothing"})
        assert bad.status_code == 400
        assert json.loads(bad.text)["error"]["message"].startswith(
            "LoRA adapter 'b': the hub has no repository acme/nothing"
        )
        assert [m["id"] for m in client.get("/v1/models").json()["data"]][1:] == ["a"]


def test_the_download_job_fetches_an_adapter_for_the_operator(mirror, tmp_path):
    def fetch(source: str, cache: str) -> tuple[int, str]:
        log = tmp_path / f"{cache}.log"
        args = ["fetch", "--adapter", source, "--revision", COMMIT, "--cache-dir", str(tmp_path / cache)]
        return main([*args, "--termination-log", str(log)]), log.read_text()

    code, summary = fetch("hf://acme/tiny-lora", "ok")
    assert code == 0
    assert json.loads(summary)["adapter"] == {"rank": 8}
    assert sorted(p.name for p in layout.model_dir(tmp_path / "ok").iterdir()) == [
        ".pagoda-model.json",
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    code, message = fetch("hf://acme/weights-only", "bad")
    assert code == 1 and "holds no adapter_config.json" in message
