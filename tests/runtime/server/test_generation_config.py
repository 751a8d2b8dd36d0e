"""vLLM's --generation-config auto: the sampling a model's generation_config.json recommends
(Qwen3's temperature 0.6, top_p 0.95, top_k 20) is what a request gets for the knobs it leaves
out, on both endpoints and the Responses API, and in the offline LLM; --generation-config vllm
keeps the API's own defaults."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from pagoda_runtime import LLM
from pagoda_runtime.loading.model_source import sampling_defaults

from tests.runtime.tiny_models import build_tiny_model

from .conftest import MODEL, fake_app, wait_ready

QWEN3 = {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def served(**settings):
    app, engine = fake_app(**settings)
    engine.sampling_defaults = dict(QWEN3)
    return app, engine


def test_what_a_request_leaves_out_comes_from_the_models_generation_config():
    app, engine = served()
    with TestClient(app) as client:
        wait_ready(client)
        client.post("/v1/chat/completions", json=CHAT)
        chosen = engine.seen_params[-1]
        assert (chosen.temperature, chosen.top_p, chosen.top_k) == (0.6, 0.95, 20)
        greedy = {"model": MODEL, "prompt": "hi", "max_tokens": 2, "temperature": 0}
        client.post("/v1/completions", json=greedy)
        chosen = engine.seen_params[-1]
        assert (chosen.temperature, chosen.top_p, chosen.top_k) == (0.0, 0.95, 20)
        ask = {"model": MODEL, "input": "hi", "max_output_tokens": 2}
        response = client.post("/v1/responses", json=ask).json()
        assert engine.seen_params[-1].temperature == 0.6 and response["temperature"] == 0.6


def test_generation_config_vllm_keeps_the_apis_defaults():
    app, engine = served(generation_config="vllm")
    with TestClient(app) as client:
        wait_ready(client)
        client.post("/v1/chat/completions", json=CHAT)
        chosen = engine.seen_params[-1]
        assert (chosen.temperature, chosen.top_p, chosen.top_k) == (1.0, 1.0, 0)


def test_the_recommended_numbers_are_read_and_nothing_else():
    raw = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05, "do_sample": True}
    assert sampling_defaults(raw | {"min_p": "0", "max_new_tokens": 99, "eos_token_id": 2}) == {
        "temperature": 0.7,
        "top_p": 0.8,
        "top_k": 20,
        "repetition_penalty": 1.05,
    }


@pytest.mark.parametrize("recommended", [{"temperature": 0.0}, {}])
def test_the_offline_llm_samples_as_the_model_recommends(tmp_path, recommended):
    folder = build_tiny_model(tmp_path / "llama", "llama3")
    generation = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps(generation | recommended))
    llm = LLM(str(folder), dtype="float32", device="cpu")
    assert llm.get_default_sampling_params().temperature == recommended.get("temperature", 1.0)
    prompt = [5, 6, 7, 8, 9]
    outputs = {tuple(llm.generate(prompt)[0].outputs[0].token_ids) for _ in range(3)}
    assert (len(outputs) == 1) == ("temperature" in recommended)
