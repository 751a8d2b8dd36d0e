"""A real MinIO server on loopback (built from the Go module proxy by e2e/controlplane/build.sh)."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

from minio import Minio

from tests.repo_modules import controlplane

ACCESS_KEY = "pagoda-test"
SECRET_KEY = "pagoda-test-secret"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MinioServer:
    """host: the address it listens on; loopback, or the host side of a node's link for its pods."""

    def __init__(self, data: Path, host: str = "127.0.0.1", env: dict[str, str] | None = None):
        self.binary = controlplane.ensure_binaries(("minio",))["minio"]
        self.data = data
        self.host = host
        self.env = env or {}  # more MINIO_* settings, e.g. an OpenID provider for its STS
        self.port = _free_port()
        self.process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def client(self, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY) -> Minio:
        return Minio(f"{self.host}:{self.port}", access_key=access_key, secret_key=secret_key, secure=False)

    def __enter__(self) -> MinioServer:
        env = {
            **os.environ,
            "MINIO_ROOT_USER": ACCESS_KEY,
            "MINIO_ROOT_PASSWORD": SECRET_KEY,
            "MINIO_BROWSER": "off",
            "MINIO_UPDATE": "off",
            **self.env,
        }
        self.process = subprocess.Popen(
            [str(self.binary), "server", str(self.data), "--address", f"{self.host}:{self.port}", "--quiet"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"minio exited: {self.process.stderr.read().decode()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.endpoint}/minio/health/ready", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.3)
        raise RuntimeError("minio did not become ready in 60 s")

    def __exit__(self, *exc) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
