"""Fuzzing `pagoda-runtime serve` with the bundled model: thousands of generated and malformed
bodies over every field of both endpoints get no 5xx, and afterwards the engine is alive, has
failed no step, and answers a normal request. The cases that once killed the engine are kept as
named regressions, and a second run sends valid requests with output constraints and tools, whose
answers must obey them.

Each example is a batch of bodies sent at once, so that the engine batches them as it would a
client's traffic; liveness is checked after every batch, so that a failure shrinks to the batch
that broke it.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from loopback_client import metric
from pagoda_runtime.server.classify import ClassificationRequest
from pagoda_runtime.server.embeddings import EmbeddingRequest
from pagoda_runtime.server.protocol import ChatCompletionRequest, CompletionRequest
from pagoda_runtime.server.responses_protocol import ResponsesRequest
from pagoda_runtime.server.scores import RerankRequest, ScoreRequest

from .conftest import ServerProcess
from .request_strategies import (
    CHAT_FIELDS,
    CLASSIFY_FIELDS,
    COMPLETION_FIELDS,
    EMBEDDING_FIELDS,
    RERANK_FIELDS,
    RESPONSES_FIELDS,
    SCORE_FIELDS,
    VOCAB,
    check_response,
    check_structured,
    request_bodies,
    structured_bodies,
)

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"
BATCH = 16
FUZZ_REQUESTS = 2048
STRUCTURED_BATCH = 8
STRUCTURED_REQUESTS = 40
_FUZZ = settings(
    max_examples=FUZZ_REQUESTS // BATCH,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # The readiness canary every 30 s rather than every second: over minutes of fuzzing, canaries
    # every second cost the server more CPU than the fuzzed requests do.
    process = ServerProcess("--canary-interval", "30", log_dir=tmp_path_factory.mktemp("server"))
    try:
        process.wait_ready()
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=300, limits=httpx.Limits(max_connections=BATCH)) as client:
        yield client


def post_all(http: httpx.Client, requests: list[tuple[str, bytes]]) -> list[httpx.Response]:
    """Each request on a connection of its own: a client's pool shared by the sending threads once
    read from a socket another thread had closed (EBADF in the client, the server unharmed)."""

    def post(request):
        path, body = request
        with httpx.Client(base_url=http.base_url, timeout=http.timeout) as own:
            return own.post(path, content=body, headers={"content-type": "application/json"})

    with ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(post, requests))


def assert_alive(http: httpx.Client) -> None:
    live = http.get("/health/live")
    assert live.status_code == 200, live.text
    assert metric(str(http.base_url), "pagoda_num_failed_steps_total") == 0


def test_the_fuzzer_covers_every_request_field():
    assert set(CompletionRequest.model_fields) <= set(COMPLETION_FIELDS)
    assert set(ChatCompletionRequest.model_fields) <= set(CHAT_FIELDS)
    assert set(ResponsesRequest.model_fields) - {"model"} <= set(RESPONSES_FIELDS)
    assert set(EmbeddingRequest.model_fields) <= set(EMBEDDING_FIELDS)
    assert set(ScoreRequest.model_fields) <= set(SCORE_FIELDS)
    assert set(RerankRequest.model_fields) <= set(RERANK_FIELDS)
    assert set(ClassificationRequest.model_fields) <= set(CLASSIFY_FIELDS)


@pytest.mark.parametrize(
    "body",
    [
        {"model": MODEL, "prompt": "Hello", "max_tokens": 4, "top_k": 9223372036854775808},
        {"model": MODEL, "prompt": "Hello", "max_tokens": 4, "stop_token_ids": [VOCAB], "min_tokens": 1},
        {"model": MODEL, "prompt": "Hello", "max_tokens": 4, "top_k": 2**31, "temperature": 1.0},
        {"model": MODEL, "prompt": [VOCAB], "max_tokens": 1},
        # Found by the fuzzer: echo decoded the ids before anything checked them (an OverflowError).
        {"model": MODEL, "prompt": [-1, 5], "max_tokens": 1, "echo": True},
        {"model": MODEL, "prompt": [VOCAB, 5], "max_tokens": 1, "echo": True},
    ],
    ids=[
        "top_k-2^63",
        "stop-id-past-vocabulary-with-min_tokens",
        "top_k-2^31",
        "prompt-id-past-vocabulary",
        "negative-prompt-id-echoed",
        "prompt-id-past-vocabulary-echoed",
    ],
)
def test_requests_that_killed_the_engine_are_400s(http, body):
    r = http.post("/v1/completions", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] in body
    assert_alive(http)


def test_a_body_nested_960_deep_is_a_400(http):
    # Found against the served model: a 500 from the lone-surrogate scan's recursion.
    deep = "[" * 960 + "]" * 960
    raw = '{"model": "%s", "prompt": "x", "guided_json": %s}' % (MODEL, deep)  # noqa: UP031
    r = http.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "guided_json"
    assert_alive(http)


def test_no_request_body_gets_a_5xx_and_the_engine_serves_on(http):
    sent = []

    @_FUZZ
    @given(batch=st.lists(request_bodies(MODEL), min_size=BATCH, max_size=BATCH))
    def fuzz(batch):
        sent.extend(batch)
        for response in post_all(http, batch):
            check_response(response.status_code, response.headers.get("content-type", ""), response.content)
        assert_alive(http)

    fuzz()
    assert len(sent) >= 2000
    assert_normal_request_answered(http)


def test_constrained_answers_obey_their_constraint(http):
    @settings(_FUZZ, max_examples=STRUCTURED_REQUESTS // STRUCTURED_BATCH)
    @given(batch=st.lists(structured_bodies(MODEL), min_size=STRUCTURED_BATCH, max_size=STRUCTURED_BATCH))
    def fuzz(batch):
        responses = post_all(http, [(r.path, json.dumps(r.body).encode()) for r in batch])
        for request, response in zip(batch, responses, strict=True):
            content_type = response.headers.get("content-type", "")
            check_structured(request, response.status_code, content_type, response.content)
        assert_alive(http)

    fuzz()
    assert_normal_request_answered(http)


def assert_normal_request_answered(http: httpx.Client) -> None:
    body = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 3}
    r = http.post("/v1/completions", json=body)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
    assert http.get("/health/ready").status_code == 200
