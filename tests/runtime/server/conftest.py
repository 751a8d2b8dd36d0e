"""Fixtures for the server tests: an app over the fake engine (fast), a real server process (slow)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from loopback_client import free_port
from pagoda_runtime.contract.serve_settings import ServerSettings
from pagoda_runtime.server.app import build_app

from .fake_engine import FakeEngine

MODEL = "fake-model"


def fake_app(engine: FakeEngine | None = None, **settings):
    engine = engine or FakeEngine()

    async def load():
        await engine.start()
        return engine

    settings = {"served_model_names": (MODEL,), "canary_interval": 0.05, **settings}
    return build_app(ServerSettings(**settings), load), engine


def wait_ready(client: TestClient, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.get("/health/ready").status_code == 200:
            return
        time.sleep(0.02)
    raise AssertionError(f"not ready after {timeout}s: {client.get('/health/ready').json()}")


@pytest.fixture
def fake():
    """(client, engine) for an app over the fake engine, ready to serve."""
    app, engine = fake_app()
    with TestClient(app) as client:
        wait_ready(client)
        yield client, engine


class ServerProcess:
    """A serving process on loopback, as a real child: `pagoda-runtime serve` with the bundled model,
    or (fake=True) the same process code over the fake engine."""

    def __init__(
        self, *flags: str, log_dir: Path, fake: bool = False, env: dict[str, str] | None = None
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"server-{self.port}.log"
        if fake:
            command = [sys.executable, str(Path(__file__).parent / "fake_server.py"), str(self.port), *flags]
        else:
            command = [sys.executable, "-m", "pagoda_runtime.cli", "serve", "--model", "smollm2-135m"]
            command += [
                "--device",
                "cpu",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--max-model-len",
                "1024",
            ]
            command += ["--kv-cache-memory", str(200 * 2**20), "--canary-interval", "1", *flags]
        self._log = self.log_path.open("w")
        self.process = subprocess.Popen(
            command,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=None if env is None else {**os.environ, **env},
        )

    def log(self) -> str:
        return self.log_path.read_text()

    def wait_ready(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"server exited with {self.process.returncode}:\n{self.log()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/health/ready", timeout=5).status_code == 200:
                    return
            time.sleep(0.1)
        raise AssertionError(f"server not ready after {timeout}s:\n{self.log()[-3000:]}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)
        self._log.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One real server per test module, shared by its tests."""
    process = ServerProcess(log_dir=tmp_path_factory.mktemp("server"))
    try:
        process.wait_ready()
        yield process
    finally:
        process.stop()
