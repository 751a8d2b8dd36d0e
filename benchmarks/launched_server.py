"""A `pagoda-runtime serve` child started by a benchmark, so that a serving sweep is one command.

It listens on a free loopback port, counts as up once /health/ready answers 200 (the readiness
canary has generated), and is stopped with SIGTERM, the graceful drain a pod gets; a non-zero exit
fails the benchmark, since a server that lost work makes its figures suspect. Its log is kept
beside the results.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx

from pagoda_runtime.contract.names import READY_PATH

# SIGTERM drains for up to --drain-timeout (30 s by default); beyond this the server is killed.
_STOP_TIMEOUT_S = 120.0


class ServerFailed(RuntimeError):
    pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(log_path: Path) -> str:
    return "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])


def _wait_ready(process: subprocess.Popen, url: str, timeout: float, log_path: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServerFailed(
                f"the server exited with status {process.returncode} before it was ready "
                f"(log: {log_path}):\n{_tail(log_path)}"
            )
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + READY_PATH, timeout=5).status_code == 200:
                return
        time.sleep(0.5)
    raise ServerFailed(f"the server was not ready after {timeout:g}s (log: {log_path}):\n{_tail(log_path)}")


def _exit_on_sigterm(signum, frame) -> None:
    # A benchmark ended by SIGTERM (a time limit) still stops its server, which holds the GPU.
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def launched_server(flags: Sequence[str], log_path: Path, ready_timeout: float) -> Iterator[str]:
    """`pagoda-runtime serve FLAGS` on 127.0.0.1 and a free port; yields its base URL once ready.
    Raises ServerFailed when it does not get ready or does not exit 0 after SIGTERM."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "pagoda_runtime.cli", "serve", *flags]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    print(f"starting: pagoda-runtime serve {' '.join(flags)} (log: {log_path})", flush=True)
    with log_path.open("w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
        try:
            _wait_ready(process, url, ready_timeout, log_path)
            yield url
        except BaseException:
            process.kill()
            process.wait()
            raise
        finally:
            signal.signal(signal.SIGTERM, previous)
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise ServerFailed(
                f"the server did not exit within {_STOP_TIMEOUT_S:g}s of SIGTERM (log: {log_path})"
            ) from None
    if code != 0:
        raise ServerFailed(
            f"the server exited with status {code} after SIGTERM (log: {log_path}):\n{_tail(log_path)}"
        )
    print(f"the server drained and exited 0 (log: {log_path})", flush=True)
