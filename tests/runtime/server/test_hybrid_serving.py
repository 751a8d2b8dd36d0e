"""A hybrid Mamba-2 model (a tiny Nemotron-H) served as a real process: ready once its canary
generates, and concurrent requests each get their own state: the same prompt sent alongside others
is answered exactly as it is alone."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from tests.runtime.tiny_models import build_tiny_model

from .conftest import ServerProcess

pytestmark = pytest.mark.slow

PROMPTS = ["Hello, world! How are", "def add(a, b):", "The quick brown fox jumps over the lazy dog. She"]


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    folder = build_tiny_model(tmp_path_factory.mktemp("nemotron_h") / "model", "nemotron_h")
    server = ServerProcess(
        "--model", str(folder), "--served-model-name", "hybrid", log_dir=tmp_path_factory.mktemp("log")
    )
    try:
        server.wait_ready(120)
        yield server
    finally:
        server.stop()


def _complete(url: str, prompt: str, n: int = 1) -> list[str]:
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
    result = client.completions.create(model="hybrid", prompt=prompt, max_tokens=12, temperature=0, n=n)
    assert all(choice.finish_reason == "length" for choice in result.choices)
    return [choice.text for choice in result.choices]


def test_concurrent_requests_are_answered_as_each_alone(hybrid):
    alone = [_complete(hybrid.url, prompt)[0] for prompt in PROMPTS]
    with ThreadPoolExecutor(len(PROMPTS) * 2) as pool:
        together = list(pool.map(lambda p: _complete(hybrid.url, p)[0], PROMPTS * 2))
    assert together == alone * 2
    # Each sample of a request computes its prompt itself, from its own state.
    assert _complete(hybrid.url, PROMPTS[0], n=3) == [alone[0]] * 3
    assert "prefix_caching=False" in hybrid.log()
