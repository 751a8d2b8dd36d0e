"""LoRA adapters through the HTTP API, on the real engine with a tiny random model: a request's model
names an adapter, /v1/models lists each with its parent, /v1/load_lora_adapter and
/v1/unload_lora_adapter change the set live (an adapter unloaded mid-stream finishes its stream),
vLLM's errors for bad input, and the LoRA metrics."""

from __future__ import annotations

import json
import threading

import pytest
from fastapi.testclient import TestClient
from pagoda_runtime import LLM, SamplingParams
from pagoda_runtime.contract.config import EngineConfig
from pagoda_runtime.engine.async_engine import AsyncLLMEngine
from pagoda_runtime.engine.llm_engine import LLMEngine

from tests.runtime.server.conftest import MODEL, fake_app, wait_ready
from tests.runtime.tiny_lora import build_tiny_adapter
from tests.runtime.tiny_models import build_tiny_model

PROMPT = "Hello, world! How are"
ENGINE = dict(dtype="float32", device="cpu", block_size=4, kv_cache_memory=2**22, max_lora_rank=16)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_api")
    base = build_tiny_model(root / "base", "llama3")
    adapters = {name: build_tiny_adapter(root / name, base, rank=8, seed=i) for i, name in enumerate("abc")}
    adapters["too-big"] = build_tiny_adapter(root / "too-big", base, rank=32, seed=9)
    adapters["other-model"] = build_tiny_adapter(root / "other-model", base, rank=4, seed=9, hidden_size=96)
    return base, adapters


@pytest.fixture(scope="module")
def expected(folders):
    """Each adapter's greedy text, from the offline engine."""
    base, adapters = folders
    llm = LLM(model=str(base), enable_lora=True, max_loras=3, **ENGINE)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    texts = {}
    for name in (None, "a", "b"):
        if name is not None:
            llm.add_lora(name, str(adapters[name]))
        texts[name] = llm.generate(PROMPT, params, lora_name=name)[0].outputs[0].text
    return texts


@pytest.fixture
def client(folders):
    base, adapters = folders
    config = EngineConfig(
        model=str(base), enable_lora=True, max_loras=2, lora_modules=(f"a={adapters['a']}",), **ENGINE
    )
    app, _ = fake_app(AsyncLLMEngine(LLMEngine(config)), metrics_compat="vllm", model=str(base))
    with TestClient(app) as client:
        wait_ready(client, timeout=60)
        yield client


def _complete(client, model, max_tokens=24):
    body = {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    return client.post("/v1/completions", json=body)


def test_models_list_adapters_with_their_parent(client, folders):
    _, adapters = folders
    data = client.get("/v1/models").json()["data"]
    assert [(m["id"], m["parent"]) for m in data] == [(MODEL, None), ("a", MODEL)]
    assert client.post(
        "/v1/load_lora_adapter", json={"lora_name": "b", "lora_path": str(adapters["b"])}
    ).text == ("Success: LoRA adapter 'b' added successfully.")
    assert [m["id"] for m in client.get("/v1/models").json()["data"]] == [MODEL, "a", "b"]


def test_models_give_the_path_each_model_and_adapter_was_loaded_from(client, folders):
    """vLLM's `root`: what a client (the operator) reads to know which copy an adapter serves."""
    base, adapters = folders
    client.post("/v1/load_lora_adapter", json={"lora_name": "b", "lora_path": str(adapters["b"])})
    roots = {m["id"]: m["root"] for m in client.get("/v1/models").json()["data"]}
    assert roots == {MODEL: str(base), "a": str(adapters["a"]), "b": str(adapters["b"])}


def test_a_request_naming_an_adapter_runs_with_it(client, folders, expected):
    _, adapters = folders
    client.post("/v1/load_lora_adapter", json={"lora_name": "b", "lora_path": str(adapters["b"])})
    for name in (MODEL, "a", "b"):
        response = _complete(client, name).json()
        assert response["model"] == name
        assert response["choices"][0]["text"] == expected[None if name == MODEL else name]
    chat = {"model": "a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert client.post("/v1/chat/completions", json=chat).json()["model"] == "a"


def test_load_and_unload_while_a_request_streams_loses_nothing(client, folders, expected):
    _, adapters = folders
    chunks: list[str] = []
    finish: list[str | None] = []
    started = threading.Event()

    def stream():
        body = {"model": "a", "prompt": PROMPT, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
        with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    choice = json.loads(line.removeprefix("data: "))["choices"][0]
                    chunks.append(choice["text"])
                    finish.append(choice["finish_reason"])
                    started.set()

    streamer = threading.Thread(target=stream)
    streamer.start()
    assert started.wait(30)
    loaded = client.post("/v1/load_lora_adapter", json={"lora_name": "b", "lora_path": str(adapters["b"])})
    assert loaded.status_code == 200
    assert _complete(client, "b").json()["choices"][0]["text"] == expected["b"]
    assert client.post("/v1/unload_lora_adapter", json={"lora_name": "a"}).status_code == 200
    gone = _complete(client, "a")
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "model_not_found"
    streamer.join(60)
    assert "".join(chunks) == expected["a"] and finish[-1] == "length"
    # Its last request done, the name is free again.
    again = client.post("/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": str(adapters["c"])})
    assert again.status_code == 200


@pytest.mark.parametrize(
    ("route", "body", "status", "message"),
    [
        ("load", {"lora_name": "a", "lora_path": "a"}, 400, "'a' has already been loaded"),
        ("load", {"lora_name": "x", "lora_path": "/nowhere"}, 400, "holds no adapter_config.json"),
        ("load", {"lora_name": "x", "lora_path": "too-big"}, 400, "above --max-lora-rank 16"),
        ("load", {"lora_name": "x", "lora_path": "other-model"}, 400, "trained for another base model"),
        ("load", {"lora_name": MODEL, "lora_path": "b"}, 400, "name of the base model"),
        ("load", {"lora_name": "x"}, 400, "lora_path"),
        ("unload", {"lora_name": "nope"}, 404, "'nope' is not loaded"),
    ],
)
def test_bad_adapter_requests_are_refused_and_the_server_serves_on(
    client, folders, expected, route, body, status, message
):
    _, adapters = folders
    if "lora_path" in body and body["lora_path"] in adapters:
        body = {**body, "lora_path": str(adapters[body["lora_path"]])}
    response = client.post(f"/v1/{route}_lora_adapter", json=body)
    assert response.status_code == status, response.text
    assert message in response.json()["error"]["message"]
    assert _complete(client, "a").json()["choices"][0]["text"] == expected["a"]


def test_an_unknown_model_is_a_404_naming_the_served_ones(client):
    response = _complete(client, "nope")
    assert response.status_code == 404 and "'a'" in response.json()["error"]["message"]


def test_lora_metrics(client):
    _complete(client, "a", max_tokens=2)
    text = client.get("/metrics").text
    assert f'pagoda_lora_requests_total{{lora_name="a",model_name="{MODEL}"}} 1.0' in text
    info = [line for line in text.splitlines() if line.startswith("vllm:lora_requests_info{")]
    assert len(info) == 1 and 'max_lora="2"' in info[0] and 'running_lora_adapters=""' in info[0]
