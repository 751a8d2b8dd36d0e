"""The HTTP layer over a fake engine: OpenAI shapes, errors, auth, admission, health, metrics."""

from __future__ import annotations

import json
import logging
import threading

from fastapi.testclient import TestClient
from pagoda_runtime.engine.protocol import ServingEngine
from pagoda_runtime.engine.stats import SpecDecodeCounts
from pagoda_runtime.logs import JsonFormatter, RequestIdFilter, request_id_var

from .conftest import MODEL, fake_app, wait_ready
from .fake_engine import SCRIPT, FakeEngine


def sse_payloads(response) -> list:
    lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines), lines
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[len("data: ") :]) for line in lines[:-1]]


def test_completion_is_openai_shaped_with_exact_usage(fake):
    client, _ = fake
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "hello", "max_tokens": 7})
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "text_completion" and body["model"] == MODEL and body["id"].startswith("cmpl-")
    assert body["choices"] == [{"index": 0, "text": SCRIPT[:7], "logprobs": None, "finish_reason": "length"}]
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}


def test_n_choices_and_stop(fake):
    client, _ = fake
    r = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 30, "n": 2, "stop": ["brown"]})
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1]
    assert choices[0] == {"index": 0, "text": "the quick ", "logprobs": None, "finish_reason": "stop"}
    assert choices[1]["text"] == "he quick " and choices[1]["finish_reason"] == "stop"
    assert r.json()["usage"]["completion_tokens"] == len("the quick brown") + len("he quick brown")


def test_completion_stream_matches_whole_and_reports_usage(fake):
    client, _ = fake
    request = {
        "prompt": "abc",
        "max_tokens": 9,
        "n": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with client.stream("POST", "/v1/completions", json=request) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        chunks = sse_payloads(r)
    texts = ["", ""]
    for chunk in chunks[:-1]:
        assert chunk["object"] == "text_completion" and chunk["usage"] is None
        for choice in chunk["choices"]:
            texts[choice["index"]] += choice["text"]
    assert texts == [SCRIPT[:9], SCRIPT[1:10]]
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 18, "total_tokens": 21}
    finals = [c for chunk in chunks for c in chunk["choices"] if c["finish_reason"]]
    assert sorted((c["index"], c["finish_reason"]) for c in finals) == [(0, "length"), (1, "length")]


def test_stream_without_include_usage_has_no_usage_field(fake):
    client, _ = fake
    with client.stream(
        "POST", "/v1/completions", json={"prompt": "abc", "max_tokens": 3, "stream": True}
    ) as r:
        chunks = sse_payloads(r)
    assert chunks and all("usage" not in chunk for chunk in chunks)


def test_chat_whole_and_stream(fake):
    client, engine = fake
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
    ]
    r = client.post(
        "/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_completion_tokens": 5}
    )
    body = r.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["choices"][0]["message"] == {"role": "assistant", "content": SCRIPT[:5], "refusal": None}
    prompt = engine.tokenizer.encode("<system>be brief\n<user>hi\n<assistant>")
    assert prompt in engine.seen_prompts
    assert body["usage"] == {
        "prompt_tokens": len(prompt),
        "completion_tokens": 5,
        "total_tokens": len(prompt) + 5,
    }

    with client.stream(
        "POST", "/v1/chat/completions", json={"messages": messages, "max_tokens": 5, "stream": True}
    ) as s:
        chunks = sse_payloads(s)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[1:])
    assert content == SCRIPT[:5]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_completion_logprobs_format(fake):
    client, _ = fake
    r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 3, "logprobs": 2})
    logprobs = r.json()["choices"][0]["logprobs"]
    assert logprobs["tokens"] == ["t", "h", "e"]
    assert logprobs["token_logprobs"] == [-0.25, -0.25, -0.25]
    assert logprobs["top_logprobs"][0] == {"t": -0.25, "u": -1.5}
    assert logprobs["text_offset"] == [0, 1, 2]


def test_chat_logprobs_format(fake):
    client, _ = fake
    request = {
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 2,
        "logprobs": True,
        "top_logprobs": 3,
    }
    content = client.post("/v1/chat/completions", json=request).json()["choices"][0]["logprobs"]["content"]
    assert content[0]["token"] == "t" and content[0]["logprob"] == -0.25 and content[0]["bytes"] == [116]
    assert [t["token"] for t in content[0]["top_logprobs"]] == ["t", "u", "v"]
    bad = client.post("/v1/chat/completions", json={**request, "logprobs": False})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "top_logprobs"


def test_errors_name_the_field_and_have_openai_shape(fake):
    client, _ = fake
    cases = [
        ({"prompt": "x", "temperature": 5}, "temperature"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 3}, "prompt"),
        ({"prompt": "x", "n": 2, "best_of": 3}, "best_of"),
        ({"prompt": "x", "stop": [""]}, "stop"),
        ({"prompt": "x", "n": "many"}, "n"),
        ({"prompt": ["a"] * 65, "n": 2}, "prompt"),
        ({"prompt": ["a", "b" * 600]}, "prompt"),
        ({"prompt": [999999]}, "prompt"),
    ]
    for request, param in cases:
        r = client.post("/v1/completions", json=request)
        assert r.status_code == 400, (request, r.text)
        error = r.json()["error"]
        assert error["param"] == param and error["type"] == "invalid_request_error" and error["message"], (
            request
        )
    malformed = client.post(
        "/v1/completions", content=b'{"prompt": ', headers={"content-type": "application/json"}
    )
    assert malformed.status_code == 400 and "JSON" in malformed.json()["error"]["message"]
    chat = client.post("/v1/chat/completions", json={"messages": [{"role": "wizard", "content": "x"}]})
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "messages.0.role"


def test_context_overflow_is_400_with_counts(fake):
    client, _ = fake
    r = client.post("/v1/completions", json={"prompt": "abcd", "max_tokens": 600})
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert "512" in message and "604" in message and "4 in the prompt" in message and "600" in message


def test_the_fake_engine_keeps_the_serving_contract():
    assert isinstance(FakeEngine(), ServingEngine)


def test_a_chat_completion_limit_past_the_context_names_the_field_the_request_used(fake):
    client, _ = fake
    short = {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 600}
    r = client.post("/v1/chat/completions", json=short)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert r.json()["error"]["param"] == "max_completion_tokens"


def test_an_engine_failure_is_not_reported_as_a_context_overflow():
    class Broken(FakeEngine):
        async def generate(self, prompt, params, request_id, internal=False, lora_name=None):
            if not internal:
                raise ValueError("a bug inside the engine")
            async for out in super().generate(prompt, params, request_id, internal):
                yield out

    app, _ = fake_app(Broken())
    with TestClient(app, raise_server_exceptions=False) as client:
        wait_ready(client)
        r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})
        assert r.status_code == 500 and r.json()["error"]["code"] is None


def test_unknown_model_is_404(fake):
    client, _ = fake
    r = client.post("/v1/completions", json={"model": "gpt-9", "prompt": "x"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_oversized_body_is_413():
    app, _ = fake_app(max_body_bytes=1000)
    with TestClient(app) as client:
        wait_ready(client)
        r = client.post("/v1/completions", json={"prompt": "x" * 2000})
        assert r.status_code == 413 and r.json()["error"]["message"]
        assert client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1}).status_code == 200


def test_models_lists_the_served_name(fake):
    client, _ = fake
    body = client.get("/v1/models").json()
    assert body["object"] == "list" and [m["id"] for m in body["data"]] == [MODEL]


def test_info_reports_the_variant_and_its_memory(fake):
    client, engine = fake
    assert client.get("/v1/info").json() == {
        "served_model_name": MODEL,
        "model": "fake-model",
        "quantization": "int4",
        "dtype": "bfloat16",
        "kv_cache_dtype": "fp8",
        "weight_bytes": 1000,
        "predicted_weight_bytes": 1024,
        "kv_bytes_per_block": 256,
        "block_size": 16,
        "num_kv_blocks": 10,
        "kv_cache_bytes": 2560,
    }


def test_speculative_decoding_tallies_reach_info_and_metrics_under_vllms_names(fake):
    client, engine = fake
    assert "vllm:spec_decode" not in client.get("/metrics").text  # off: not exported
    engine.spec_decode = SpecDecodeCounts(4, 12, 9, (4, 3, 2))
    assert client.get("/v1/info").json()["speculative_decoding"] == {
        "num_drafts": 4,
        "num_draft_tokens": 12,
        "num_accepted_tokens": 9,
        "accepted_per_position": [4, 3, 2],
        "acceptance_rate": 0.75,
    }
    metrics = client.get("/metrics").text
    assert f'vllm:spec_decode_num_drafts_total{{model_name="{MODEL}"}} 4.0' in metrics
    assert f'vllm:spec_decode_num_draft_tokens_total{{model_name="{MODEL}"}} 12.0' in metrics
    assert f'vllm:spec_decode_num_accepted_tokens_total{{model_name="{MODEL}"}} 9.0' in metrics
    per_position = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
    assert f'{per_position}{{model_name="{MODEL}",position="2"}} 2.0' in metrics


def test_api_key_guards_v1_only():
    app, _ = fake_app(api_key="sekrit")
    with TestClient(app) as client:
        wait_ready(client)
        denied = client.get("/v1/models")
        assert denied.status_code == 401 and denied.json()["error"]["code"] == "invalid_api_key"
        assert client.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert client.get("/v1/models", headers={"Authorization": "Bearer sekrit"}).status_code == 200
        assert client.get("/health/ready").status_code == 200
        assert client.get("/metrics").status_code == 200


def test_request_id_is_returned_or_generated(fake):
    client, _ = fake
    assert client.get("/v1/models", headers={"X-Request-Id": "abc-123"}).headers["x-request-id"] == "abc-123"
    generated = client.get("/v1/models").headers["x-request-id"]
    assert len(generated) == 32


def test_queue_full_is_429_with_retry_after():
    app, _ = fake_app(max_num_seqs=1, max_queue=1)
    with TestClient(app) as client:
        wait_ready(client)
        drain = app.state.pagoda.drain
        # Two accepted requests (one running, one waiting) fill the bound, whatever the engine has seen.
        with drain.track(), drain.track():
            r = client.post("/v1/completions", json={"prompt": "x"})
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["type"] == "rate_limit_error"
        assert "1 waiting" in r.json()["error"]["message"]
        assert client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1}).status_code == 200


def test_not_ready_until_loaded_then_ready():
    loaded = threading.Event()
    engine = FakeEngine()

    async def slow_load():
        import asyncio

        while not loaded.is_set():
            await asyncio.sleep(0.01)
        await engine.start()
        return engine

    from pagoda_runtime.contract.serve_settings import ServerSettings
    from pagoda_runtime.server.app import build_app

    app = build_app(ServerSettings(served_model_names=(MODEL,), canary_interval=0.05), slow_load)
    with TestClient(app) as client:
        ready = client.get("/health/ready")
        assert ready.status_code == 503 and ready.json()["checks"]["model_loaded"]["ok"] is False
        assert client.get("/health/live").status_code == 200
        loading = client.get("/health")
        assert loading.status_code == 503 and loading.json()["detail"] == "the model is loading"
        refused = client.post("/v1/completions", json={"prompt": "x"})
        assert refused.status_code == 503 and "retry-after" in refused.headers
        info = client.get("/v1/info")
        assert info.status_code == 503 and info.json()["error"]["code"] == "not_ready"
        loaded.set()
        wait_ready(client)
        assert client.get("/v1/info").status_code == 200
        assert client.get("/health").status_code == 200


def test_load_failure_reports_one_line():
    heard = []

    async def broken():
        raise FileNotFoundError("model 'nope' not found:\n give a folder")

    from pagoda_runtime.contract.serve_settings import ServerSettings
    from pagoda_runtime.server.app import build_app

    app = build_app(ServerSettings(served_model_names=(MODEL,)), broken, on_fatal=heard.append)
    with TestClient(app) as client:
        for _ in range(100):
            if heard:
                break
            client.get("/health/live")
        assert heard == ["start-up failed: model 'nope' not found: give a folder"]
        assert client.get("/health/ready").json()["checks"]["model_loaded"]["detail"] == heard[0]


def test_draining_fails_readiness_and_refuses_with_503(fake):
    client, _ = fake
    client.app.state.pagoda.drain.begin()
    ready = client.get("/health/ready")
    assert ready.status_code == 503 and ready.json()["checks"]["not_draining"]["ok"] is False
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 503 and "retry-after" in r.headers and r.json()["error"]["code"] == "draining"


def test_stuck_engine_loop_fails_liveness(fake):
    client, engine = fake
    engine._ticker.cancel()
    engine.last_heartbeat -= 3600
    live = client.get("/health/live")
    assert live.status_code == 503 and "not ticked" in live.json()["detail"]


def test_metrics_have_the_contract_names(fake):
    client, _ = fake
    client.post("/v1/completions", json={"prompt": "hey", "max_tokens": 4})
    text = client.get("/metrics").text
    label = f'model_name="{MODEL}"'
    for name in (
        "pagoda_num_requests_waiting",
        "pagoda_num_requests_running",
        "pagoda_kv_cache_usage_ratio",
        "pagoda_prefix_cache_queries_total",
        "pagoda_prefix_cache_hits_total",
        "pagoda_time_to_first_token_seconds_bucket",
        "pagoda_inter_token_latency_seconds_bucket",
        "pagoda_e2e_request_latency_seconds_bucket",
        "pagoda_request_queue_time_seconds_bucket",
    ):
        assert any(line.startswith(name + "{") and label in line for line in text.splitlines()), name
    assert f"pagoda_prompt_tokens_total{{{label}}} 3.0" in text
    assert f"pagoda_generation_tokens_total{{{label}}} 4.0" in text
    assert f'pagoda_requests_total{{finish_reason="length",{label}}} 1.0' in text
    assert "process_resident_memory_bytes" in text


def test_json_log_lines_carry_the_request_id():
    token = request_id_var.set("req-42")
    try:
        record = logging.LogRecord(
            "pagoda.access", logging.INFO, __file__, 1, "GET %s", ("/v1/models",), None
        )
        record.status = 200
        RequestIdFilter().filter(record)
    finally:
        request_id_var.reset(token)
    line = json.loads(JsonFormatter().format(record))
    assert line["msg"] == "GET /v1/models" and line["level"] == "info" and line["logger"] == "pagoda.access"
    assert line["request_id"] == "req-42" and line["status"] == 200
