"""The small endpoints and flags vLLM users script against, over the fake engine."""

from __future__ import annotations

from fastapi.testclient import TestClient

from .conftest import MODEL, fake_app, wait_ready
from .fake_engine import SCRIPT
from .test_api_fake_engine import sse_payloads


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


def test_chat_template_options_render_alike_on_chat_and_tokenize(fake):
    """vLLM's chat_template_kwargs, add_generation_prompt and continue_final_message: the template
    gets the variables, the prefilled reply is left open, and both endpoints render the same ids."""
    client, engine = fake
    body = {
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hel"}],
        "add_generation_prompt": False,
        "continue_final_message": True,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    tokens = client.post("/tokenize", json=body).json()["tokens"]
    assert engine.tokenizer.decode(tokens) == "<enable_thinking=False>\n<user>hi\n<assistant>Hel"
    answered = client.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 2} | body)
    assert answered.status_code == 200, answered.text
    assert engine.seen_prompts[-1] == tokens


def test_chat_echo_gives_the_prefilled_reply_whole_and_documents_reach_the_template(fake):
    """vLLM's chat echo: a continued final message comes back with its prefilled part, whole and
    streamed; a conversation ending with the user's message echoes nothing."""
    client, engine = fake
    prefilled = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hel"}],
        "add_generation_prompt": False,
        "continue_final_message": True,
        "echo": True,
        "max_tokens": 4,
    }
    whole = client.post("/v1/chat/completions", json=prefilled).json()
    assert whole["choices"][0]["message"]["content"] == "Hel" + SCRIPT[:4]
    with client.stream("POST", "/v1/chat/completions", json=prefilled | {"stream": True}) as streamed:
        text = "".join(c["delta"].get("content") or "" for p in sse_payloads(streamed) for c in p["choices"])
    assert text == "Hel" + SCRIPT[:4]
    asked = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "echo": True, "max_tokens": 4}
    assert (
        client.post("/v1/chat/completions", json=asked).json()["choices"][0]["message"]["content"]
        == SCRIPT[:4]
    )
    documents = [{"title": "Colors", "text": "Red, yellow and blue."}]
    tokens = client.post("/tokenize", json={"messages": asked["messages"], "documents": documents}).json()[
        "tokens"
    ]
    assert f"<documents={documents}>" in engine.tokenizer.decode(tokens)


def test_chat_template_misuse_is_a_400_naming_the_field(fake):
    client, _ = fake
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    for extra, field in [
        ({"continue_final_message": True}, "continue_final_message"),
        ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
        ({"chat_template": "{{ messages }}"}, "chat_template"),
    ]:
        for path in ("/v1/chat/completions", "/tokenize"):
            refused = client.post(path, json=chat | extra)
            assert refused.status_code == 400, (path, extra, refused.text)
            assert refused.json()["error"]["param"] == field, refused.text


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
        # The series vLLM production-stack's dashboards read beside those.
        'vllm:gpu_prefix_cache_queries_total{model_name="fake-model"}',
        'vllm:gpu_prefix_cache_hits_total{model_name="fake-model"}',
        'vllm:request_time_per_output_token_seconds_count{model_name="fake-model"} 1.0',
        'vllm:request_prefill_time_seconds_count{model_name="fake-model"} 1.0',
        'vllm:request_decode_time_seconds_count{model_name="fake-model"} 1.0',
        # One prompt token, two generated, two allowed: vLLM's 1-2-5 buckets up to max_model_len.
        'vllm:request_prompt_tokens_bucket{le="1.0",model_name="fake-model"} 1.0',
        'vllm:request_generation_tokens_bucket{le="1.0",model_name="fake-model"} 0.0',
        'vllm:request_generation_tokens_bucket{le="2.0",model_name="fake-model"} 1.0',
        'vllm:request_max_num_generation_tokens_sum{model_name="fake-model"} 2.0',
        'vllm:request_max_num_generation_tokens_bucket{le="500.0",model_name="fake-model"} 1.0',
    ):
        assert line in text, line
    assert 'vllm:request_prompt_tokens_bucket{le="1000.0"' not in text  # past max_model_len 512
    assert 'pagoda_generation_tokens_total{model_name="fake-model"} 2.0' in text


def test_the_prompt_length_is_the_rest_of_the_context_when_max_tokens_is_unset():
    app, _ = fake_app()
    with TestClient(app) as client:
        wait_ready(client)
        client.post("/v1/completions", json={"prompt": "xy", "max_tokens": None})
        text = client.get("/metrics").text
    assert 'pagoda_request_max_num_generation_tokens_sum{model_name="fake-model"} 510.0' in text


def test_a_sibling_variants_model_name_redirects_to_its_gateway_path():
    app, engine = fake_app(served_model_names=("smol", "smol:bf16"))
    routes = {"X-Pagoda-Variant-Routes": "smol:bf16=/smol/bf16, smol:int4=/smol/int4"}
    with TestClient(app, follow_redirects=False) as client:
        wait_ready(client)
        body = {"model": "smol:int4", "prompt": "x", "max_tokens": 1}
        moved = client.post("/v1/completions?x=1", json=body, headers=routes)
        assert moved.status_code == 307
        assert moved.headers["location"] == "/smol/int4/v1/completions?x=1"
        assert moved.json()["error"]["code"] == "model_elsewhere"
        # Its own name is served here, and without the gateway's header nothing redirects.
        own = client.post("/v1/completions", json={**body, "model": "smol:bf16"}, headers=routes)
        assert own.status_code == 200
        assert client.post("/v1/completions", json=body).status_code == 404
        unknown = client.post("/v1/completions", json={**body, "model": "smol:fp8"}, headers=routes)
        assert unknown.status_code == 404
        assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["smol", "smol:bf16"]
