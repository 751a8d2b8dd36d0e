"""`pagoda-runtime serve --tensor-parallel-size 2` on the CPU (gloo): one process per rank on one
machine, or one per LeaderWorkerSet pod, answering as one process does, failing and draining as a
group. A tiny model keeps the processes' start and steps short; the engine tests compare sharded
outputs on every architecture variant."""

from __future__ import annotations

import os
import re
import signal
import threading

import httpx
import pytest
from loopback_client import free_port, stream_completion

from tests.runtime.tiny_models import build_tiny_model

from .conftest import ServerProcess

pytestmark = pytest.mark.slow

CHAT = {
    "model": "tiny",
    "messages": [{"role": "user", "content": "Name three colours."}],
    "max_tokens": 16,
    "temperature": 0,
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[str, ...]:
    """The flags that serve a tiny GQA model (4 query heads, 2 key/value heads: splits over 2)."""
    folder = build_tiny_model(tmp_path_factory.mktemp("tiny"), "gqa")
    return ("--model", str(folder), "--served-model-name", "tiny", "--max-model-len", "512")


@pytest.fixture(scope="module")
def one_process_answer(tiny, tmp_path_factory) -> str:
    """The greedy reply of the same model served by one process, without tensor parallelism."""
    single = ServerProcess(*tiny, log_dir=tmp_path_factory.mktemp("single"))
    try:
        single.wait_ready()
        return _chat(single)
    finally:
        single.stop()


def _chat(server: ServerProcess) -> str:
    response = httpx.post(server.url + "/v1/chat/completions", json=CHAT, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


def _rank_pid(server: ServerProcess, rank: int) -> int:
    found = re.search(rf"rank {rank} of \d+ \(pid (\d+),", server.log())
    assert found, server.log()[-3000:]
    return int(found.group(1))


def _group_flags(tiny: tuple[str, ...], timeout: float, size: int = 2) -> tuple[str, ...]:
    return (
        *tiny,
        "--tensor-parallel-size",
        str(size),
        "--distributed-port",
        str(free_port()),
        "--distributed-timeout",
        str(timeout),
    )


def test_two_ranks_answer_as_one_process_and_a_killed_rank_ends_the_server(
    tiny, one_process_answer, tmp_path
):
    termination_log = tmp_path / "termination-log"
    group = ServerProcess(
        *_group_flags(tiny, 60), "--termination-log", str(termination_log), log_dir=tmp_path
    )
    try:
        group.wait_ready()
        assert _chat(group) == one_process_answer
        banner = [line for line in group.log().splitlines() if "pagoda-runtime settings:" in line]
        assert len(banner) == 1 and "tensor_parallel_size=2 layout=1x2" in banner[0], banner

        rank_1 = _rank_pid(group, 1)
        os.kill(rank_1, signal.SIGKILL)
        assert group.process.wait(30) == 1
        line = f"rank 1 (pid {rank_1}) was killed by signal SIGKILL"
        assert line in group.log() and line in termination_log.read_text(), group.log()[-2000:]
    finally:
        group.stop()


def test_leaderworkerset_pods_on_loopback_form_one_group_serve_and_drain(tiny, one_process_answer, tmp_path):
    # Two pods of two ranks each: every pod starts its second rank itself.
    flags = _group_flags(tiny, 60, size=4)
    lws = {"LWS_LEADER_ADDRESS": "127.0.0.1", "LWS_GROUP_SIZE": "2"}
    leader = ServerProcess(
        *flags, "--drain-timeout", "60", log_dir=tmp_path, env={**lws, "LWS_WORKER_INDEX": "0"}
    )
    worker = ServerProcess(*flags, log_dir=tmp_path, env={**lws, "LWS_WORKER_INDEX": "1"})
    try:
        leader.wait_ready()
        assert "rank 1 of 4" in leader.log() and "[rank=1]" in leader.log()
        assert "rank 2 of 4" in worker.log() and "rank 3 of 4" in worker.log()
        assert "no HTTP is served here" in worker.log()
        with pytest.raises(httpx.ConnectError):
            httpx.get(worker.url + "/health", timeout=5)
        assert _chat(leader) == one_process_answer

        record, started = {}, threading.Event()
        stream = threading.Thread(target=stream_completion, args=(leader.url, 24, record, started))
        stream.start()
        assert started.wait(60)
        # Kubernetes signals both pods of the group; the worker keeps computing for the drain.
        worker.process.send_signal(signal.SIGTERM)
        leader.process.send_signal(signal.SIGTERM)
        stream.join(120)
        assert record["status"] == 200 and record["finish_reasons"] == ["length"], record
        assert leader.process.wait(60) == 0, leader.log()[-2000:]
        assert worker.process.wait(60) == 0, worker.log()[-2000:]
        assert "rank 2: rank 0 ended the group" in worker.log()
        assert "rank 3: rank 0 ended the group" in worker.log()
    finally:
        worker.stop()
        leader.stop()


def test_a_group_that_never_forms_ends_within_the_timeout(tiny, tmp_path):
    termination_log = tmp_path / "termination-log"
    lws = {"LWS_LEADER_ADDRESS": "127.0.0.1", "LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "0"}
    leader = ServerProcess(
        *_group_flags(tiny, 5), "--termination-log", str(termination_log), log_dir=tmp_path, env=lws
    )
    try:
        assert leader.process.wait(90) == 1
        assert "did not form at 127.0.0.1" in termination_log.read_text()
    finally:
        leader.stop()
