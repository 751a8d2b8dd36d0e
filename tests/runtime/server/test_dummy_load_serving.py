"""`pagoda-runtime serve --model SHAPE --load-format dummy`: random weights of a catalogue shape
served as a real process, the way the serving benchmarks run on a machine without a checkpoint."""

from __future__ import annotations

import subprocess
import sys

import httpx
import openai
import pytest
from loopback_client import free_port, stream_completion

from .conftest import ServerProcess

pytestmark = pytest.mark.slow

DUMMY = ("--model", "tiny-llama", "--load-format", "dummy", "--max-model-len", "256")


@pytest.fixture(scope="module")
def dummy(tmp_path_factory):
    server = ServerProcess(*DUMMY, log_dir=tmp_path_factory.mktemp("dummy"))
    try:
        server.wait_ready(60)
        yield server
    finally:
        server.stop()


def _greedy(url: str, prompt: list[int]) -> list[int]:
    """The greedy continuation's token ids, read back from the bare tokenizer's "<id>" words."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
    result = client.completions.create(model="tiny-llama", prompt=prompt, max_tokens=8, temperature=0)
    choice = result.choices[0]
    assert choice.finish_reason == "length" and result.usage.prompt_tokens == len(prompt)
    return [int(word.strip("<>")) for word in choice.text.split()]


def test_token_id_prompts_are_answered_like_a_checkpoints(dummy):
    tokens = _greedy(dummy.url, [7, 300, 12, 511])
    assert len(tokens) == 8 and all(0 <= t < 512 for t in tokens)
    # What bench serve sends: streamed, ignore_eos, exact usage.
    record = {}
    stream_completion(dummy.url, 5, record)
    assert record["status"] == 200 and record["done"] and record["finish_reasons"] == ["length"]
    assert record["usage"]["completion_tokens"] == 5
    banner = [line for line in dummy.log().splitlines() if "pagoda-runtime settings:" in line]
    assert len(banner) == 1 and "model=tiny-llama load_format=dummy" in banner[0], banner
    info = httpx.get(dummy.url + "/v1/info", timeout=10).json()
    assert info["model"] == "tiny-llama" and info["weight_bytes"] == info["predicted_weight_bytes"]


def test_text_reads_as_the_bare_vocabulary_and_chat_is_a_400_that_says_what_to_do(dummy):
    ids = httpx.post(dummy.url + "/tokenize", json={"prompt": "<5> <17> hello"}, timeout=10).json()["tokens"]
    assert ids == [5, 17, 0]
    chat = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}
    response = httpx.post(dummy.url + "/v1/chat/completions", json=chat, timeout=30)
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert "tiny-llama (random weights) has no chat template" in message and "--chat-template" in message


@pytest.mark.parametrize("model", ["llama-9", "FOLDER"])
def test_dummy_with_an_unknown_shape_or_a_checkpoint_path_is_refused_before_loading(model, tmp_path):
    model = str(tmp_path) if model == "FOLDER" else model
    termination_log = tmp_path / "termination-log"
    command = [
        sys.executable,
        "-m",
        "pagoda_runtime.cli",
        "serve",
        "--model",
        model,
        "--load-format",
        "dummy",
    ]
    command += ["--port", str(free_port()), "--termination-log", str(termination_log)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    expected = f"--load-format dummy: unknown model shape {model!r}; choose one of llama-3-8b, "
    assert result.stderr.startswith(f"pagoda-runtime serve: {expected}") and "tiny-llama" in result.stderr
    assert "Started server process" not in result.stderr + result.stdout
    assert termination_log.read_text().startswith(expected)


def test_a_shape_without_dummy_is_refused_with_the_flag_to_add(tmp_path):
    termination_log = tmp_path / "termination-log"
    command = [sys.executable, "-m", "pagoda_runtime.cli", "serve", "--model", "llama-3-8b"]
    command += ["--port", str(free_port()), "--termination-log", str(termination_log)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    expected = "'llama-3-8b' names a model shape, not a checkpoint: add --load-format dummy to serve"
    assert result.stderr.startswith(f"pagoda-runtime serve: {expected}")
    assert termination_log.read_text().startswith(expected)


def test_every_rank_draws_the_same_weights(dummy, tmp_path):
    prompt = [7, 300, 12, 511]
    flags = (
        "--tensor-parallel-size",
        "2",
        "--distributed-port",
        str(free_port()),
        "--distributed-timeout",
        "60",
    )
    group = ServerProcess(*DUMMY, *flags, log_dir=tmp_path)
    try:
        group.wait_ready(120)
        assert _greedy(group.url, prompt) == _greedy(dummy.url, prompt)
    finally:
        group.stop()
