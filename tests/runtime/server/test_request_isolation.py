"""A request the engine accepted but could not finish is a 500 naming an internal error, to that
client only: the server serves on, counts it, and stays live; only an engine whose loop died fails
liveness, at once."""

from __future__ import annotations

import json

from fastapi.testclient import TestClient
from pagoda_runtime.engine.protocol import RequestFailed

from .conftest import MODEL, fake_app, wait_ready
from .fake_engine import FakeEngine

DOOMED = "doomed"


class StepFailures(FakeEngine):
    """Fails a client request whose prompt says DOOMED after `after` outputs, as the real engine
    does when a step that ran it raises."""

    def __init__(self, after: int) -> None:
        super().__init__()
        self.after = after

    async def generate(self, prompt, params, request_id, internal=False):
        doomed = not internal and self.tokenizer.encode(DOOMED) == list(prompt)[: len(DOOMED)]
        sent = 0
        async for out in super().generate(prompt, params, request_id, internal):
            if doomed and sent == self.after:
                raise RequestFailed("a step that ran this request failed: IndexError")
            yield out
            sent += 1


def test_a_failed_request_is_a_500_and_the_next_one_is_served():
    app, _ = fake_app(StepFailures(after=0))
    with TestClient(app) as client:
        wait_ready(client)
        r = client.post("/v1/completions", json={"prompt": DOOMED, "max_tokens": 4})
        assert r.status_code == 500, r.text
        error = r.json()["error"]
        assert error["code"] == "internal_error" and "internal error" in error["message"]
        assert "IndexError" not in r.text  # no internals leak to the client
        assert client.post("/v1/completions", json={"prompt": "fine", "max_tokens": 4}).status_code == 200
        assert client.get("/health/live").status_code == 200
        assert client.get("/health/ready").status_code == 200
        metrics = client.get("/metrics").text
        assert f'pagoda_requests_total{{finish_reason="error",model_name="{MODEL}"}} 1.0' in metrics


def test_a_stream_that_fails_midway_ends_with_an_error_event():
    app, _ = fake_app(StepFailures(after=3))
    with TestClient(app) as client:
        wait_ready(client)
        body = {"prompt": DOOMED, "max_tokens": 10, "stream": True}
        with client.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            events = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        assert [json.loads(e)["choices"][0]["text"] for e in events[:3]] == list(FakeEngine().script[:3])
        assert json.loads(events[-2])["error"]["code"] == "internal_error"


def test_an_engine_whose_loop_died_fails_liveness_at_once():
    app, engine = fake_app()
    with TestClient(app) as client:
        wait_ready(client)
        engine.errored = RuntimeError("CUDA error: an illegal memory access was encountered")
        live = client.get("/health/live")
        assert live.status_code == 503 and "illegal memory access" in live.json()["detail"]
        assert client.get("/health").status_code == 503
        r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})
        assert r.status_code == 503 and r.json()["error"]["code"] == "not_ready"
