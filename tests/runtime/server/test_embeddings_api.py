"""POST /v1/embeddings on a server whose engine runs --runner pooling, driven by the official OpenAI
client (which asks for base64 unless told otherwise) and raw HTTP: the vectors are LLM.embed's, in
the order of the inputs; what the endpoint does not serve is a 400 naming the field, and each
endpoint refuses the other runner's requests in one sentence."""

from __future__ import annotations

import base64
import struct

import openai
import pytest
from fastapi.testclient import TestClient
from pagoda_runtime import LLM
from pagoda_runtime.contract.config import EngineConfig
from pagoda_runtime.contract.pooling import PoolingParams
from pagoda_runtime.engine.async_engine import AsyncLLMEngine
from pagoda_runtime.engine.llm_engine import LLMEngine

from tests.runtime.engine.test_embeddings import sentence_transformers_folder

from .conftest import MODEL, fake_app, wait_ready

ENGINE = dict(dtype="float32", device="cpu", block_size=4, max_num_batched_tokens=16)
TEXTS = ["Hello, world!", "def add(a, b):", "The quick brown fox jumps over the lazy dog."]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return sentence_transformers_folder(tmp_path_factory.mktemp("embedding"), "LAST", True)


@pytest.fixture(scope="module")
def offline(folder):
    return LLM(str(folder), runner="pooling", **ENGINE)


def _client(folder, **engine):
    config = EngineConfig(model=str(folder), **ENGINE, **engine)
    app, _ = fake_app(AsyncLLMEngine(LLMEngine(config)), model=str(folder))
    return TestClient(app)


@pytest.fixture(scope="module")
def http(folder):
    with _client(folder, runner="pooling") as client:
        wait_ready(client, timeout=60)
        yield client


def test_the_openai_client_gets_llm_embeds_vectors_in_input_order(http, offline):
    api = openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=http)
    result = api.embeddings.create(model=MODEL, input=TEXTS)  # base64 on the wire, decoded by the client
    expected = [o.outputs.embedding for o in offline.embed(TEXTS)]
    assert [d.index for d in result.data] == [0, 1, 2]
    for data, vector in zip(result.data, expected, strict=True):
        assert data.embedding == pytest.approx(vector, abs=1e-6)
    tokens = sum(len(o.prompt_token_ids) for o in offline.embed(TEXTS))
    assert result.usage.prompt_tokens == result.usage.total_tokens == tokens


def test_floats_base64_and_token_ids_agree(http, offline):
    ids = offline.get_tokenizer().encode(TEXTS[1])
    floats = http.post("/v1/embeddings", json={"input": TEXTS[1], "encoding_format": "float"}).json()
    packed = http.post("/v1/embeddings", json={"input": [ids], "encoding_format": "base64"}).json()
    raw = base64.b64decode(packed["data"][0]["embedding"])
    decoded = list(struct.unpack(f"<{len(raw) // 4}f", raw))
    assert floats["object"] == "list" and floats["data"][0]["object"] == "embedding"
    assert decoded == pytest.approx(floats["data"][0]["embedding"], abs=1e-6)
    assert floats["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 0, "total_tokens": len(ids)}


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"input": TEXTS[0], "dimensions": 8}, "dimensions", "not trained to serve shorter embeddings"),
        ({"input": []}, "input", "input is an empty list"),
        ({"input": TEXTS[0], "truncate_prompt_tokens": 0}, "truncate_prompt_tokens", "keep no prompt token"),
        ({"input": TEXTS[0], "normalize": False}, "normalize", "Extra inputs"),
        ({"input": TEXTS[0], "encoding_format": "int8"}, "encoding_format", "float"),
        ({"input": "x " * 300}, "input", "embeds at most"),
        ({"input": ["x"] * 100_000}, "input", "more than the"),
        ({"input": [[1, -2]]}, "input", "token id -2 is outside 0 to"),
        ({"input": ""}, "input", "empty"),
    ],
)
def test_what_the_endpoint_does_not_serve_is_a_400_naming_the_field(http, body, param, message):
    response = http.post("/v1/embeddings", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and message in error["message"], error


def test_each_runner_refuses_the_others_requests_and_stays_ready(http, folder):
    completion = http.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 3})
    assert completion.status_code == 400 and "use /v1/embeddings" in completion.json()["error"]["message"]
    assert http.get("/health/ready").status_code == 200
    with _client(folder) as generating:
        wait_ready(generating, timeout=60)
        refused = generating.post("/v1/embeddings", json={"input": "Hello"})
        assert refused.status_code == 400
        assert "started with --runner pooling" in refused.json()["error"]["message"]


def test_the_openai_clients_dimensions_cut_a_matryoshka_models_vectors(folder):
    matryoshka = LLM(str(folder), runner="pooling", hf_overrides={"is_matryoshka": True}, **ENGINE)
    expected = matryoshka.embed(TEXTS, pooling_params=PoolingParams(dimensions=8))
    with _client(folder, runner="pooling", hf_overrides={"is_matryoshka": True}) as http:
        wait_ready(http, timeout=60)
        api = openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=http)
        result = api.embeddings.create(model=MODEL, input=TEXTS, dimensions=8)
        for data, out in zip(result.data, expected, strict=True):
            assert len(data.embedding) == 8
            assert data.embedding == pytest.approx(out.outputs.embedding, abs=1e-6)
        refused = http.post("/v1/embeddings", json={"input": TEXTS[0], "dimensions": 65})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "dimensions"


def test_truncate_prompt_tokens_keeps_the_last_tokens_as_vllm_does(http, offline):
    ids = offline.get_tokenizer().encode(TEXTS[2])
    cut = http.post("/v1/embeddings", json={"input": TEXTS[2], "truncate_prompt_tokens": 4}).json()
    expected = offline.embed([ids[-4:]])[0].outputs.embedding
    assert cut["data"][0]["embedding"] == pytest.approx(expected, abs=1e-6)
    assert cut["usage"]["prompt_tokens"] == 4
    first = http.post(
        "/v1/embeddings", json={"input": [ids], "truncate_prompt_tokens": 3, "truncation_side": "right"}
    ).json()
    assert first["data"][0]["embedding"] == pytest.approx(
        offline.embed([ids[:3]])[0].outputs.embedding, abs=1e-6
    )
    # -1: as much as a pooled prompt may hold, the whole of this short one.
    whole = http.post("/v1/embeddings", json={"input": TEXTS[2], "truncate_prompt_tokens": -1}).json()
    assert whole["usage"]["prompt_tokens"] == len(ids)
