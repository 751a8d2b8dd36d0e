"""The serving process over the fake engine: drain, disconnects, admission over real sockets, in seconds."""

from __future__ import annotations

import signal
import threading
import time

import httpx
import pytest
from loopback_client import metric, stream_completion

from .conftest import ServerProcess


@pytest.fixture
def start(tmp_path):
    started = []

    def run(*flags: str) -> ServerProcess:
        server = ServerProcess(*flags, log_dir=tmp_path, fake=True)
        started.append(server)
        server.wait_ready(30)
        return server

    yield run
    for server in started:
        server.stop()


def streams_in_flight(url: str, count: int, max_tokens: int) -> tuple[list[dict], list[threading.Thread]]:
    records = [{} for _ in range(count)]
    started = [threading.Event() for _ in range(count)]
    threads = [
        threading.Thread(target=stream_completion, args=(url, max_tokens, records[i], started[i]))
        for i in range(count)
    ]
    for thread in threads:
        thread.start()
    for event in started:
        assert event.wait(30), records
    return records, threads


def test_sigterm_finishes_accepted_streams_and_refuses_new_ones(start):
    server = start()
    records, threads = streams_in_flight(server.url, 8, 60)
    server.process.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    assert httpx.get(server.url + "/health/ready").status_code == 503
    refused = httpx.post(server.url + "/v1/completions", json={"prompt": "x"})
    assert refused.status_code == 503 and refused.headers["retry-after"]
    for thread in threads:
        thread.join(30)
    assert server.process.wait(30) == 0
    for record in records:
        assert (
            record["done"]
            and record["finish_reasons"] == ["length"]
            and record["usage"]["completion_tokens"] == 60
        )
    assert "8 in-flight requests completed, 0 aborted" in server.log()
    assert "Once upon a time" not in server.log(), "a prompt was logged"


def test_drain_timeout_aborts_streams_with_a_final_chunk(start):
    server = start("--drain-timeout", "0.5")
    records, threads = streams_in_flight(server.url, 2, 400)
    server.process.send_signal(signal.SIGTERM)
    for thread in threads:
        thread.join(30)
    assert server.process.wait(30) == 0
    for record in records:
        assert record["done"] and record["finish_reasons"] == ["abort"]
    assert "2 aborted at the 0.5s drain timeout" in server.log()


def test_second_signal_aborts_at_once_and_the_log_says_so(start):
    server = start("--drain-timeout", "600")
    records, threads = streams_in_flight(server.url, 6, 400)
    server.process.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(10) == 1
    for thread in threads:
        thread.join(10)
    assert all(record["done"] and record["finish_reasons"] == ["abort"] for record in records), records
    log = server.log()
    assert (
        "0 in-flight requests completed, 0 aborted at the 600s drain timeout, 6 aborted by a second signal"
        in log
    )
    assert "Traceback" not in log and "CancelledError" not in log


def test_ten_times_overload_sheds_with_429_and_stays_ready(start):
    # The canary times out behind the full queue; tokens still flow, so the pod is busy, not broken.
    server = start(
        "--max-running", "2", "--max-queue", "4", "--canary-interval", "1", "--canary-timeout", "2"
    )
    statuses: list[int] = []

    def post() -> None:
        body = {"prompt": "x", "max_tokens": 150}
        statuses.append(httpx.post(server.url + "/v1/completions", json=body, timeout=60).status_code)

    clients = [threading.Thread(target=post) for _ in range(60)]
    for client in clients:
        client.start()
    ready = []
    while any(client.is_alive() for client in clients):
        ready.append(httpx.get(server.url + "/health/ready").status_code)
        time.sleep(0.05)
    assert sorted(set(statuses)) == [200, 429] and statuses.count(200) >= 6, statuses
    assert statuses.count(429) >= 40, statuses
    assert len(ready) > 10 and set(ready) == {200}, ready


@pytest.mark.parametrize(("stream", "prompts"), [(True, 1), (False, 1), (True, 3), (False, 3)])
def test_client_disconnect_aborts_the_request(start, stream, prompts):
    """Each of a batch's prompts is its own engine request: a client gone aborts all of them."""
    server = start()
    body = {"prompt": ["x"] * prompts if prompts > 1 else "x", "max_tokens": 400, "stream": stream}
    if stream:
        with httpx.stream("POST", server.url + "/v1/completions", json=body) as response:
            lines = response.iter_lines()
            next(lines)
            assert metric(server.url, "pagoda_num_requests_running") == prompts
    else:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(server.url + "/v1/completions", json=body, timeout=0.5)
    deadline = time.monotonic() + 5
    while metric(server.url, "pagoda_num_requests_running") != 0:
        assert time.monotonic() < deadline, "the abandoned request is still running"
        time.sleep(0.02)
    assert (
        metric(server.url, 'pagoda_requests_total{finish_reason="abort",model_name="fake-model"}') == prompts
    )
    # Counted from the deltas the server saw: a running request's outputs carry no whole text.
    assert metric(server.url, 'pagoda_generation_tokens_total{model_name="fake-model"}') > 0


def test_full_queue_answers_429(start):
    # Canaries only at start-up: a later one would wait in the one-slot queue the test fills itself.
    server = start("--max-running", "1", "--max-queue", "1", "--canary-interval", "3600")
    records, threads = streams_in_flight(server.url, 1, 400)
    waiting = threading.Thread(target=stream_completion, args=(server.url, 5, {}))
    waiting.start()
    deadline = time.monotonic() + 5
    while metric(server.url, "pagoda_num_requests_waiting") < 1:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    refused = httpx.post(server.url + "/v1/completions", json={"prompt": "x"})
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
    assert (
        metric(server.url, 'pagoda_requests_rejected_total{model_name="fake-model",reason="queue_full"}') == 1
    )


def test_client_leaving_while_queued_leaves_the_queue(start):
    server = start("--max-running", "1", "--canary-interval", "3600")
    streams_in_flight(server.url, 1, 400)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json={"prompt": "x", "stream": True}, timeout=0.5)
    deadline = time.monotonic() + 5
    while metric(server.url, "pagoda_num_requests_waiting") != 0:
        assert time.monotonic() < deadline, "the abandoned request is still queued"
        time.sleep(0.02)
