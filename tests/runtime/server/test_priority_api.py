"""The request field priority over HTTP: passed to the engine, refused where the policy ignores it,
the --max-queue bound shedding a queued low-priority request for an urgent one, and the waiting
depth per priority in /metrics."""

import threading
import time

import pytest
from fastapi.testclient import TestClient

from .conftest import MODEL, fake_app, wait_ready
from .fake_engine import FakeEngine

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
COMPLETION = {"prompt": "hi", "max_tokens": 2}


@pytest.mark.parametrize(("path", "body"), [("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)])
def test_priority_reaches_the_engine_under_the_priority_policy(path, body):
    app, engine = fake_app(FakeEngine(scheduling_policy="priority"))
    with TestClient(app) as client:
        wait_ready(client)
        assert client.post(path, json={**body, "priority": -3}).status_code == 200
        assert client.post(path, json=body).status_code == 200
    assert engine.seen_priorities == [-3, 0]


@pytest.mark.parametrize(("path", "body"), [("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)])
def test_priority_under_first_come_first_served_is_a_400_naming_it(fake, path, body):
    client, engine = fake
    refused = client.post(path, json={**body, "priority": 1})
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["param"] == "priority" and "--scheduling-policy priority" in error["message"]
    # The default, sent explicitly, asks for nothing the policy ignores.
    assert client.post(path, json={**body, "priority": 0}).status_code == 200
    streamed = client.post(path, json={**body, "priority": 2, "stream": True})
    assert streamed.status_code == 400 and streamed.json()["error"]["param"] == "priority"


@pytest.mark.parametrize("value", [1.5, "1", True, None, 2**63])
def test_a_priority_that_is_not_an_integer_is_a_400(value):
    app, engine = fake_app(FakeEngine(scheduling_policy="priority"))
    with TestClient(app) as client:
        wait_ready(client)
        refused = client.post("/v1/completions", json={**COMPLETION, "priority": value})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "priority"
    assert engine.seen_priorities == []


def _until(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _metric_lines(client, name):
    return [line for line in client.get("/metrics").text.splitlines() if line.startswith(name + "{")]


def test_a_full_queue_sheds_its_lowest_priority_request_for_a_more_urgent_one():
    # One place in the batch and one in the queue.
    engine = FakeEngine(scheduling_policy="priority", max_running=1, step_s=0.02)
    app, _ = fake_app(engine, max_num_seqs=1, max_queue=1)
    answers = {}

    def post(name, priority, max_tokens):
        body = {"prompt": name, "max_tokens": max_tokens, "priority": priority}
        answers[name] = client.post("/v1/completions", json=body)

    with TestClient(app) as client:
        wait_ready(client)
        # Long enough (5 s) to hold its place through the checks below on a loaded machine.
        running = threading.Thread(target=post, args=("batch-running", 5, 250))
        running.start()
        _until(lambda: len(engine.running) == 1)
        queued = threading.Thread(target=post, args=("batch-queued", 5, 2))
        queued.start()
        _until(lambda: len(engine.requests) == 2)
        by_priority = _metric_lines(client, "pagoda_num_requests_waiting_by_priority")
        assert (
            f'pagoda_num_requests_waiting_by_priority{{model_name="{MODEL}",priority="5"}} 1.0' in by_priority
        )
        assert (
            f'pagoda_num_requests_waiting_by_priority{{model_name="{MODEL}",priority="0"}} 0.0' in by_priority
        )

        # Full: a request that does not outrank the queued one is refused at the door.
        refused = client.post("/v1/completions", json={**COMPLETION, "priority": 5})
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "queue_full"
        # An urgent one takes the queued request's place; that one is answered 429 with Retry-After.
        urgent = threading.Thread(target=post, args=("interactive", 0, 2))
        urgent.start()
        for thread in (running, queued, urgent):
            thread.join(timeout=30)
        text = client.get("/metrics").text

    shed = answers["batch-queued"]
    assert shed.status_code == 429 and shed.json()["error"]["code"] == "shed"
    assert int(shed.headers["retry-after"]) >= 1
    assert answers["interactive"].status_code == 200 and answers["batch-running"].status_code == 200
    assert f'pagoda_requests_rejected_total{{model_name="{MODEL}",reason="shed"}} 1.0' in text
    assert f'pagoda_requests_rejected_total{{model_name="{MODEL}",reason="queue_full"}} 1.0' in text


def test_the_waiting_gauge_per_priority_keeps_the_number_of_series_bounded():
    from pagoda_runtime.engine.stats import EngineStats
    from pagoda_runtime.server.metrics import MAX_PRIORITY_SERIES, ServerMetrics

    counts = tuple((p, 1) for p in range(1, 20))
    stats = EngineStats(0, 0, 0.0, 0, 0, 0, waiting_by_priority=counts)
    registry = ServerMetrics("m", lambda: stats).registry
    samples = {
        s.labels["priority"]: s.value
        for family in registry.collect()
        if family.name == "pagoda_num_requests_waiting_by_priority"
        for s in family.samples
    }
    # The default priority and the most urgent ones by name, the rest together.
    assert len(samples) == MAX_PRIORITY_SERIES + 1
    assert samples["0"] == 0 and samples["1"] == 1 and samples["other"] == 19 - (MAX_PRIORITY_SERIES - 1)
