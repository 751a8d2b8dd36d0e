"""The server process's life: readiness while loading, graceful drain on SIGTERM, admission, bad starts."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
from loopback_client import free_port, metric, stream_completion

from .conftest import ServerProcess

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"


def test_not_ready_while_loading_then_sigterm_drains_eight_streams(tmp_path):
    termination_log = tmp_path / "termination-log"
    flags = ("--drain-timeout", "120", "--termination-log", str(termination_log))
    server = ServerProcess(*flags, log_dir=tmp_path)
    try:
        seen_loading = False
        phases = set()
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                ready = httpx.get(server.url + "/health/ready", timeout=5)
            except httpx.HTTPError:
                time.sleep(0.05)
                continue
            if ready.status_code == 200:
                break
            assert ready.json()["ready"] is False
            seen_loading = seen_loading or ready.json()["checks"]["model_loaded"]["ok"] is False
            phases.add(ready.json()["startup"]["phase"].split(" ")[0])
            assert httpx.get(server.url + "/health/live", timeout=5).status_code == 200
            time.sleep(0.05)
        assert seen_loading, "readiness never reported the model as loading"
        # The body says what start-up is doing: reading, loading weights, allocating, then loaded.
        assert phases and phases <= {"starting", "reading", "loading", "allocating", "loaded"}, phases
        assert httpx.get(server.url + "/health/ready", timeout=5).json()["startup"] == {"phase": "loaded"}
        log = server.log()
        layers = [line for line in log.splitlines() if "loaded layer" in line]
        assert len(layers) == 30 and "layer 30/30" in layers[-1] and "GB/s" in layers[-1], log[-2000:]
        banner = [line for line in log.splitlines() if "pagoda-runtime settings:" in line]
        assert len(banner) == 1 and "quantization=" in banner[0] and "kv_blocks=" in banner[0]

        # Long enough (seconds at batch 8 on two cores) that the drain is still going when the
        # test looks at readiness and admission: 12 tokens once finished before it looked.
        max_tokens = 256
        records = [{} for _ in range(8)]
        started = [threading.Event() for _ in range(8)]
        threads = [
            threading.Thread(target=stream_completion, args=(server.url, max_tokens, records[i], started[i]))
            for i in range(8)
        ]
        for thread in threads:
            thread.start()
        for event in started:
            assert event.wait(120)
        assert not any(r["done"] for r in records), "streams must still be in flight at SIGTERM"
        server.process.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        ready = httpx.get(server.url + "/health/ready", timeout=5)
        assert ready.status_code == 503 and ready.json()["checks"]["not_draining"]["ok"] is False
        refused = httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": "x"}, timeout=10)
        assert refused.status_code == 503 and int(refused.headers["retry-after"]) > 0
        for thread in threads:
            thread.join(120)
        assert server.process.wait(60) == 0
        for record in records:
            assert record["status"] == 200 and record["done"] and record["finish_reasons"] == ["length"]
            assert record["usage"]["completion_tokens"] == max_tokens
        summary = [line for line in server.log().splitlines() if "drained in" in line]
        assert len(summary) == 1 and "8 in-flight requests completed" in summary[0], server.log()[-2000:]
        # What Kubernetes shows as the terminated container's message.
        assert termination_log.read_text().strip() == summary[0][summary[0].index("drained in") :]
        assert "Once upon a time" not in server.log(), "a prompt was logged"
    finally:
        server.stop()


def test_queue_full_then_drain_timeout_aborts_the_stream(tmp_path):
    # A canary only at start-up: a later one would sit in the one-slot queue the test fills itself.
    flags = ("--max-num-seqs", "1", "--max-queue", "1", "--drain-timeout", "2", "--canary-interval", "3600")
    server = ServerProcess(*flags, log_dir=tmp_path)
    try:
        server.wait_ready()
        running, waiting = {}, {}
        running_started = threading.Event()
        first = threading.Thread(target=stream_completion, args=(server.url, 1000, running, running_started))
        first.start()
        assert running_started.wait(60)
        second = threading.Thread(target=stream_completion, args=(server.url, 1000, waiting))
        second.start()
        deadline = time.monotonic() + 30
        while metric(server.url, "pagoda_num_requests_waiting") < 1:
            assert time.monotonic() < deadline, "the second request never queued"
            time.sleep(0.05)
        refused = httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": "x"}, timeout=10)
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) > 0
        assert refused.json()["error"]["type"] == "rate_limit_error"

        server.process.send_signal(signal.SIGTERM)
        first.join(60)
        second.join(60)
        assert server.process.wait(60) == 0
        for record in (running, waiting):
            assert record["status"] == 200 and record["done"] and record["finish_reasons"] == ["abort"], (
                record
            )
        assert "2 aborted at the 2s drain timeout" in server.log()
    finally:
        server.stop()


def test_start_up_failure_writes_the_termination_log(tmp_path):
    termination_log = tmp_path / "termination-log"
    command = [sys.executable, "-m", "pagoda_runtime.cli", "serve", "--model", str(tmp_path / "missing.gguf")]
    command += ["--port", str(free_port()), "--host", "127.0.0.1", "--termination-log", str(termination_log)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    lines = termination_log.read_text().splitlines()
    assert len(lines) == 1 and "missing.gguf" in lines[0], lines
