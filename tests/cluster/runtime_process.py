"""The runtime container of a rendered pod, run as a real local process on loopback.

The arguments are the ones the operator renders for the pod; only where it listens (and where a
fatal start-up error is written) is moved onto this machine. The container's environment is left
out: it points caches at the pod's volumes, which do not exist here.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from child_process import ChildProcess
from loopback_client import free_port, metric


class RuntimeProcess(ChildProcess):
    def __init__(self, container: dict, log_dir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        loopback = ["--host", "127.0.0.1", "--port", str(self.port)]
        loopback += ["--termination-log", str(log_dir / "termination-log")]
        # argparse keeps the last occurrence of a flag, so these override the pod's own values.
        command = [sys.executable, "-m", "pagoda_runtime.cli", *container["args"], *loopback]
        # One core for the model, one left for the control plane and Prometheus to keep answering.
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        super().__init__(command, log_dir / f"runtime-{self.port}.log", env)

    def wait_ready(self, timeout: float = 240.0) -> None:
        self.wait_http_ok(self.url + "/health/ready", timeout)

    def metric(self, name: str) -> float:
        return metric(self.url, name)
