"""The small endpoints and flags vLLM users script against, over the fake engine."""

from __future__ import annotations

from fastapi.testclient import TestClient

from .conftest import MODEL, fake_app, wait_ready


def test_health_and_version(fake):
    client, _ = fake
    health = client.get("/health")
    assert health.status_code == 200 and health.content == b""
    assert client.get("/version").json()["version"]


def test_tokenize_a_prompt_and_messages_then_detokenize(fake):
    client, engine = fake
    r = client.post("/tokenize", json={"model": MODEL, "prompt": "hey", "return_token_strs": True}).json()
    assert r == {"count": 3, "max_model_len": 512, "tokens": [104, 101, 121], "token_strs": ["h", "e", "y"]}
    chat = client.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    assert chat["tokens"] == engine.tokenizer.encode("<user>hi\n<assistant>")
    assert client.post("/detokenize", json={"tokens": [104, 105]}).json() == {"prompt": "hi"}
    both = client.post("/tokenize", json={"prompt": "x", "messages": [{"role": "user", "content": "x"}]})
    assert both.status_code == 400
    bad = client.post("/detokenize", json={"tokens": [5000]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    other = client.post("/tokenize", json={"model": "other", "prompt": "x"})
    assert other.status_code == 404


def test_cors_preflight_is_answered_without_the_api_key():
    app, _ = fake_app(api_key="secret", allowed_origins=("https://ui.example",))
    with TestClient(app) as client:
        wait_ready(client)
        preflight = client.options(
            "/v1/chat/completions",
            headers={"Origin": "https://ui.example", "Access-Control-Request-Method": "POST"},
        )
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == "https://ui.example"
        refused = client.options(
            "/v1/chat/completions",
            headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
        )
        assert "access-control-allow-origin" not in refused.headers


def test_no_cors_headers_unless_origins_are_allowed(fake):
    client, _ = fake
    r = client.get("/v1/models", headers={"Origin": "https://ui.example"})
    assert "access-control-allow-origin" not in r.headers


def test_several_served_model_names():
    app, _ = fake_app(served_model_names=(MODEL, "alias"))
    with TestClient(app) as client:
        wait_ready(client)
        assert [m["id"] for m in client.get("/v1/models").json()["data"]] == [MODEL, "alias"]
        r = client.post("/v1/completions", json={"model": "alias", "prompt": "x", "max_tokens": 1})
        assert r.status_code == 200 and r.json()["model"] == "alias"
        assert client.post("/v1/completions", json={"model": "nope", "prompt": "x"}).status_code == 404


def test_chat_template_flag_replaces_the_models_own():
    app, engine = fake_app(chat_template="TEMPLATE")
    with TestClient(app) as client:
        wait_ready(client)
        client.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
        )
        assert engine.seen_prompts[-1] == engine.tokenizer.encode("TEMPLATE")


def test_metrics_compat_vllm_exports_vllm_names():
    app, _ = fake_app(metrics_compat="vllm")
    with TestClient(app) as client:
        wait_ready(client)
        client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
        text = client.get("/metrics").text
    for line in (
        'vllm:num_requests_waiting{model_name="fake-model"}',
        'vllm:kv_cache_usage_perc{model_name="fake-model"}',
        'vllm:generation_tokens_total{model_name="fake-model"} 2.0',
        'vllm:request_success_total{finished_reason="length",model_name="fake-model"} 1.0',
        'vllm:time_to_first_token_seconds_count{model_name="fake-model"} 1.0',
        'vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="fake-model"} 1.0',
    ):
        assert line in text, line
    assert 'pagoda_generation_tokens_total{model_name="fake-model"} 2.0' in text
