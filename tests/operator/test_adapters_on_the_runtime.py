"""The operator's adapter calls against the real runtime server (a tiny random model on the CPU,
served over loopback): what it reads from /v1/models and the runtime's refusals are what
adapter_loading.py expects."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager

import pytest
import uvicorn
from pagoda_operator.adapter_loading import PodMemory, PodUnreachable, served_adapters, sync_pod
from pagoda_runtime.contract.config import EngineConfig
from pagoda_runtime.engine.async_engine import AsyncLLMEngine
from pagoda_runtime.engine.llm_engine import LLMEngine

from tests.runtime.server.conftest import fake_app
from tests.runtime.tiny_lora import build_tiny_adapter
from tests.runtime.tiny_models import build_tiny_model

API_KEY = "s3cret"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """The tiny base model and its adapters: two that fit it, one trained for another model."""
    root = tmp_path_factory.mktemp("adapters")
    base = build_tiny_model(root / "base", "llama3")
    adapters = {
        "a": build_tiny_adapter(root / "a", base, rank=8, seed=0),
        "b": build_tiny_adapter(root / "b", base, rank=8, seed=1),
        "other-model": build_tiny_adapter(root / "other", base, rank=4, seed=2, hidden_size=96),
    }
    return base, {name: str(path) for name, path in adapters.items()}


@contextmanager
def serving(base, api_key: str | None = None):
    """The runtime's server over the base model on a loopback port, as a pod serves it; its URL."""
    config = EngineConfig(
        model=str(base), dtype="float32", device="cpu", block_size=4, kv_cache_memory=2**22, enable_lora=True
    )
    app, _ = fake_app(AsyncLLMEngine(LLMEngine(config)), api_key=api_key)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            served_adapters(url, api_key)
            break
        except PodUnreachable:
            assert time.monotonic() < deadline, "the runtime did not start"
            time.sleep(0.1)
    yield url
    server.should_exit = True
    thread.join(10)


@pytest.fixture(scope="module")
def runtime(folders):
    base, adapters = folders
    with serving(base) as url:
        yield url, adapters


def test_the_operator_brings_a_real_runtime_to_the_declared_adapters(runtime):
    url, folders = runtime
    memory = PodMemory()
    found = sync_pod("p1", url, {"a": folders["a"], "b": folders["b"], "x": folders["other-model"]}, memory)
    assert found.served == {"a", "b"} and served_adapters(url) == {"a": folders["a"], "b": folders["b"]}
    assert found.refused["x"].startswith("400: ") and "trained for another base model" in found.refused["x"]
    found = sync_pod("p1", url, {"b": folders["b"]}, memory)
    assert found.served == {"b"} and served_adapters(url) == {"b": folders["b"]} and not found.refused


def test_a_runtime_that_demands_an_api_key_loads_adapters_only_with_it(folders):
    """runtime.apiKeySecretRef: the pods demand the key on /v1 (vLLM's --api-key); the operator's
    calls carry it, and without it the pod is reported as refusing the operator, the adapter not failed."""
    base, adapters = folders
    with serving(base, api_key=API_KEY) as url:
        memory = PodMemory()
        found = sync_pod("p1", url, {"a": adapters["a"]}, memory)
        assert (
            not found.served
            and not found.refused
            and found.unreachable
            == (
                f"{url}/v1/models answered 401: the pods demand an API key, so name its Secret in "
                "runtime.apiKeySecretRef"
            )
        )
        found = sync_pod("p1", url, {"a": adapters["a"]}, memory, api_key="stale")
        assert found.unreachable.endswith("restart them after changing the Secret") and not memory.refused
        found = sync_pod("p1", url, {"a": adapters["a"]}, memory, api_key=API_KEY)
        assert found.served == {"a"} and found.unreachable is None
        assert served_adapters(url, API_KEY) == {"a": adapters["a"]}
        found = sync_pod("p1", url, {}, memory, api_key=API_KEY)
        assert found.served == frozenset() and served_adapters(url, API_KEY) == {}
